"""The public readings: ``status()``, ``limits()``, ``pressure()``, ``budget()``.

Each returns a frozen dataclass of plain numbers (bytes, fractions, percent) whose ``str()`` is the SPEC's one-line
text and whose ``to_dict()`` is the JSON form the command line prints. Every call reads the kernel afresh.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from . import ledger, paths
from .adapters.cgroup import CgroupMemory
from .adapters.disk import disk_free
from .adapters.procfs import ProcStatus, read_loadavg, read_proc_status
from .adapters.root import resolve
from .decide import Level, default_budget, pressure_cause, pressure_level
from .errors import BudgetWarning, SizeError
from .measure import MemoryReading, read_memory
from .reactions import LevelTracker
from .units import GiB, fmt_gb, parse_size

if TYPE_CHECKING:
    from .devices import Gpu  # devices builds on this module: see status()

BUDGET_ENV = "APSI_RAM_BUDGET"


class _Reading:
    def to_dict(self) -> dict[str, Any]:
        return {key: _plain(value) for key, value in dataclasses.asdict(self).items()}  # type: ignore[call-overload]


def _plain(value: Any) -> Any:
    if isinstance(value, Level):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# -- budget --------------------------------------------------------------------------------------------------------

_budget_set: int | None = None


@dataclass(frozen=True)
class Budget(_Reading):
    """The RAM budget for big arrays: ``bytes``, and ``source``, where it came from. ``float(b)`` and ``b.gb`` are
    it in GB (2^30)."""

    bytes: int
    source: str  # "70 % of free", "set by budget()", or "APSI_RAM_BUDGET"

    @property
    def gb(self) -> float:
        return self.bytes / GiB

    def __float__(self) -> float:
        return self.gb

    def __str__(self) -> str:
        return f"{fmt_gb(self.bytes)} ({self.source})"


def budget(gb: float | str | None = None) -> Budget:
    """Read the RAM budget for big arrays, or set it: ``budget(16)`` (GB), ``budget("512MB")``; ``budget("auto")``
    goes back to the default (``APSI_RAM_BUDGET``, else 70 % of what is free)."""
    global _budget_set
    if isinstance(gb, str) and gb.strip().lower() == "auto":
        _budget_set = None
    elif gb is not None:
        _budget_set = parse_size(gb)
    reading = read_memory()
    if gb is not None and _budget_set is not None and _budget_set > reading.usable:
        _warn_above_usable(_budget_set, reading.usable)
    return _budget_from(reading)


def _warn_above_usable(budget_bytes: int, usable: int) -> None:
    # A warning, not a log line: it is a mistake in the caller's code, shown at the caller's line, once per line
    # under Python's default filter, and tests or -W error can turn it into an error.
    warnings.warn(BudgetWarning(f"budget {fmt_gb(budget_bytes)} is more than the {fmt_gb(usable)} usable here; "
                                "arrays are still placed by what is free"), stacklevel=3)


def _budget_from(reading: MemoryReading) -> Budget:
    if _budget_set is not None:
        return Budget(_budget_set, "set by budget()")
    from_env = os.environ.get(BUDGET_ENV)
    if from_env:
        try:
            return Budget(parse_size(from_env), BUDGET_ENV)
        except SizeError as exc:
            raise SizeError(f"{BUDGET_ENV}: {exc}") from None
    return Budget(default_budget(reading.free, ledger.held()), "70 % of free")


# -- limits --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Limits(_Reading):
    """Usable memory and where it comes from; ``to_dict()`` gives the same fields as ``limits --json``.

    ``usable_bytes``: the smaller of the host's RAM and the smallest cgroup limit up the hierarchy.
    ``free_bytes``: the smaller of the host's available memory and the cgroup's least headroom.
    ``budget_bytes``: the RAM budget for big arrays (``budget()``).
    ``source``: ``host`` or ``container (cgroup v1|v2)``.
    ``cgroup``: the group as ``/proc/self/cgroup`` names it; ``cgroup_version``: 1 or 2 (both None without one).
    ``limit_bytes``, ``limit_file``: the limit and the file (in the machine's view, so it names the group's folder
    too) that set it: ``memory.max``, ``memory.high``, ``memory.limit_in_bytes``, or ``memory.stat`` for v1's
    ``hierarchical_memory_limit``.
    ``working_set_bytes``: the group's usage less inactive page cache.
    ``host_total_bytes``, ``host_available_bytes``: ``/proc/meminfo``'s MemTotal and MemAvailable.
    ``group_guessed``: the group is not below any cgroup mount's root, so the mount point was read in its stead.
    ``cgroup_problem``: why a group that exists was not read (the reading is then the host's).
    """

    usable_bytes: int
    free_bytes: int
    budget_bytes: int
    source: str  # "host", "container (cgroup v1)", "container (cgroup v2)"
    cgroup: str | None  # the group as /proc/self/cgroup names it
    cgroup_version: int | None
    limit_bytes: int | None  # the smallest cgroup limit up the hierarchy, None when unlimited
    limit_file: str | None  # the file that set it
    working_set_bytes: int | None
    host_total_bytes: int
    host_available_bytes: int
    group_guessed: bool = False
    cgroup_problem: str | None = None

    def __str__(self) -> str:
        note = ", group not visible: read at the mount point" if self.group_guessed else ""
        if self.cgroup_problem:
            note = f"; {self.cgroup_problem}"
        return (f"{fmt_gb(self.usable_bytes)} usable ({self.source}{note}), {fmt_gb(self.free_bytes)} free, "
                f"budget {fmt_gb(self.budget_bytes)}")


def _cgroup_fields(cg: CgroupMemory | None) -> dict[str, Any]:
    if cg is None:
        return dict.fromkeys(("cgroup", "cgroup_version", "limit_bytes", "limit_file", "working_set_bytes"))
    return {"cgroup": cg.path, "cgroup_version": cg.version, "limit_bytes": cg.limit, "limit_file": cg.limit_file,
            "working_set_bytes": cg.working_set, "group_guessed": cg.guessed}


def limits() -> Limits:
    """Usable memory, free memory and the budget, from the cgroup (limits re-read on every call) and the host.
    ``str()``: ``1.0 GB usable (container (cgroup v1)), 1.0 GB free, budget 0.7 GB``."""
    reading = read_memory()
    return Limits(
        usable_bytes=reading.usable, free_bytes=reading.free, budget_bytes=_budget_from(reading).bytes,
        source=reading.source, host_total_bytes=reading.host.total, host_available_bytes=reading.host.available,
        cgroup_problem=reading.cgroup_problem, **_cgroup_fields(reading.cgroup),
    )


# -- pressure ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pressure(_Reading):
    """One pressure reading (``pressure()``).

    * ``level``: ``ok``, ``moderate``, ``high`` or ``critical``, the worst of the three signals below
      (``decide.LEVEL_TABLE``);
    * ``free_bytes``, ``usable_bytes``, ``free_fraction``: free memory, usable memory, and the first over the second;
    * ``some``: PSI ``some`` avg10, the percent of the last 10 s in which at least one task waited for memory;
    * ``full``: PSI ``full`` avg10, the percent in which every non-idle task waited at once (no work was done);
    * ``psi_source``: the file they came from (the cgroup's ``memory.pressure`` or ``/proc/pressure/memory``).
      ``some``/``full``/``psi_source`` are ``None`` where the kernel has no PSI, never 0;
    * ``cause``: the signal(s) past the level's thresholds, e.g. ``some ≥ 5 %`` (``None`` at ``ok``);
    * ``psi_problem``: why stalls are not available although a PSI file is there (it could not be parsed).
    """

    level: Level
    free_bytes: int
    usable_bytes: int
    free_fraction: float
    some: float | None  # PSI avg10 percent; None = not available (never reported as 0)
    full: float | None
    psi_source: str | None
    cause: str | None = None  # the signal(s) that set the level, e.g. "some ≥ 5 %"; None at ok
    psi_problem: str | None = None  # why stalls are not available although a PSI file is there

    def __str__(self) -> str:
        if self.some is None:
            stalls = "stalls not available" + (f" ({self.psi_problem})" if self.psi_problem else "")
        else:
            full = "n/a" if self.full is None else f"{self.full:.1f} %"
            stalls = f"stalls {self.some:.1f} % (some) / {full} (full)"
        cause = f" — {self.cause}" if self.cause else ""
        return f"{self.level}: {fmt_gb(self.free_bytes)} free ({self.free_fraction * 100:.0f} %), {stalls}{cause}"


def _pressure_from(reading: MemoryReading, previous: Level) -> Pressure:
    fraction = reading.free / reading.usable if reading.usable else 0.0
    psi = reading.psi
    some, full, source = (None, None, None) if psi is None else (psi.some, psi.full, psi.source)
    level = pressure_level(fraction, some, full, previous)
    return Pressure(level, reading.free, reading.usable, fraction, some, full, source,
                    pressure_cause(level, fraction, some, full), reading.psi_problem)


def _measure_level(previous: Level) -> Level:
    return _pressure_from(read_memory(), previous).level


# The allocation paths' view of the level: re-measured at most twice a second (reactions.RECHECK_SECONDS).
TRACKER = LevelTracker(_measure_level)


def pressure() -> Pressure:
    """Measure now; the level uses the last one for hysteresis and registered components hear of a change."""
    ticket, previous = TRACKER.begin()
    reading = _pressure_from(read_memory(), previous)
    TRACKER.publish(ticket, reading.level)
    return reading


def current_level() -> Level:
    """The level for an allocation path: cheap, re-measured at most twice a second."""
    return TRACKER.current()


# -- status --------------------------------------------------------------------------------------------------------

def cores(root: str | None = None) -> int:
    """CPUs this process may run on, as ``nproc`` counts them (its affinity mask)."""
    return _cores_from(read_proc_status(root))


def _cores_from(status: ProcStatus | None) -> int:
    if status is not None and status.cpus:
        return status.cpus
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _rss_from(status: ProcStatus | None) -> int:
    if status is not None and status.rss is not None:
        return status.rss
    return int(psutil.Process().memory_info().rss)


def _load(root: str | None) -> float:
    load = read_loadavg(root)
    return load if load is not None else psutil.getloadavg()[0]


@dataclass(frozen=True)
class Status(_Reading):
    """Everything at a glance (``status()``): RAM free and usable (as ``limits()``), where that came from, this
    program's resident set (``process_rss_bytes``), the budget, free swap, the spill folder and the space free there,
    the CPUs this process may run on (``cores``), the 1-minute load average, and each GPU."""

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

    def __str__(self) -> str:
        gpus = ", ".join(str(gpu) for gpu in self.gpus) or "no GPU"
        return (f"RAM {self.ram_free_bytes / GiB:.1f}/{fmt_gb(self.ram_usable_bytes)} free "
                f"(this program {self.process_rss_bytes / GiB:.2f} GB, budget {fmt_gb(self.budget_bytes)}) | "
                f"swap {fmt_gb(self.swap_free_bytes)} | "
                f"SSD {self.spill_free_bytes / GiB:.0f} GB free at {paths.display(self.spill_dir)} | "
                f"{self.cores} cores, load {self.load:.2f} | {gpus}")


def status() -> Status:
    """RAM, swap, SSD, cores and GPUs in one reading; ``str()`` is the one line ``apsi-memory status`` prints:
    ``RAM 3.0/4.0 GB free (this program 0.04 GB, budget 2.1 GB) | swap 0.0 GB | SSD 78 GB free at ~/.apsi/spill |
    2 cores, load 0.34 | no GPU``."""
    from .devices import gpus  # devices builds on this module (cores, limits): keep the import graph one-way

    root = resolve(None)
    reading, process = read_memory(root), read_proc_status(root)
    spill = paths.spill_dir()
    return Status(
        ram_free_bytes=reading.free, ram_usable_bytes=reading.usable, source=reading.source,
        process_rss_bytes=_rss_from(process), budget_bytes=_budget_from(reading).bytes,
        swap_free_bytes=reading.host.swap_free, spill_dir=spill, spill_free_bytes=disk_free(spill),
        cores=_cores_from(process), load=_load(root),
        gpus=gpus(),
    )
