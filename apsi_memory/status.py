"""``status()``: RAM, swap, SSD, cores and GPUs in one reading. Above both the machine's readings and ``devices``
(which builds on them), so the import graph stays one-way. ``apsi_memory.status`` is callable as ``status()``.

May import: system, adapters, machinery, devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from .adapters.disk import disk_free
from .adapters.procfs import ProcStatus, read_loadavg, read_proc_status
from .devices.hardware import Gpu, gpus
from .machinery.machines import cores_from, machine
from .machinery.reading import Reading
from .system import paths
from .units import fmt_size, in_one_unit


@dataclass(frozen=True)
class Status(Reading):
    """Everything at a glance (``status()``): RAM free and usable (as ``limits()``), where that came from, this
    program's resident set (``process_rss_bytes``), the budget, free swap, the spill folder and the space free there,
    the CPUs this process may run on (``cores``), the 1-minute load average, each GPU, and what the other processes
    of this user in this memory group hold reserved (``siblings_reserved_bytes``, as ``limits()``)."""

    ram_free_bytes: int
    ram_usable_bytes: int
    source: str
    process_rss_bytes: int
    budget_bytes: int
    swap_free_bytes: int
    spill_dir: str
    spill_free_bytes: int
    cores: int
    load: float
    gpus: list[Gpu]
    siblings_reserved_bytes: int = 0  # placed in RAM by the other processes of this group, not yet charged
    siblings: int = 0  # the other processes of this user in this group that use the library

    def __str__(self) -> str:
        gpus = ", ".join(str(gpu) for gpu in self.gpus) or "no GPU"
        others = f", siblings reserve {fmt_size(self.siblings_reserved_bytes)}" if self.siblings_reserved_bytes else ""
        free, usable, unit = in_one_unit(self.ram_free_bytes, self.ram_usable_bytes)
        return (f"RAM {free}/{usable} {unit} free "
                f"(this program {fmt_size(self.process_rss_bytes)}, budget {fmt_size(self.budget_bytes)}{others}) | "
                f"swap {fmt_size(self.swap_free_bytes)} | "
                f"SSD {fmt_size(self.spill_free_bytes, 0)} free at {paths.display(self.spill_dir)} | "
                f"{self.cores} cores, load {self.load:.2f} | {gpus}")


def _rss_from(status: ProcStatus | None) -> int:
    if status is not None and status.rss is not None:
        return status.rss
    import psutil  # only without /proc (macOS): with subprocess and socket it was half a first status()

    return int(psutil.Process().memory_info().rss)


def _load(root: str) -> float:
    load = read_loadavg(root)
    if load is not None:
        return load
    import psutil  # only without /proc, as above

    return float(psutil.getloadavg()[0])


def status() -> Status:
    """RAM, swap, SSD, cores and GPUs in one reading; ``str()`` is the one line ``apsi-memory status`` prints:
    ``RAM 3.0/4.0 GB free (this program 41.2 MB, budget 2.1 GB) | swap 0 B | SSD 78 GB free at ~/.apsi/spill |
    2 cores, load 0.34 | no GPU`` (sizes as ``units`` says: binary, in the largest unit each reaches)."""
    m = machine()
    reading, process = m.memory(), read_proc_status(m.root)
    spill, others = paths.spill_dir(), m.sibling_reading(reading)
    return Status(
        ram_free_bytes=reading.free, ram_usable_bytes=reading.usable, source=reading.source,
        process_rss_bytes=_rss_from(process), budget_bytes=m.budget_from(reading, others).bytes,
        swap_free_bytes=reading.host.swap_free, spill_dir=spill, spill_free_bytes=disk_free(spill),
        cores=cores_from(process), load=_load(m.root),
        gpus=gpus(), siblings_reserved_bytes=others.reserved_bytes, siblings=others.processes,
    )
