"""The public readings of the default machine: ``limits()``, ``pressure()``, ``budget()``, ``current_level()`` and
``cores()`` (``status()`` is in ``status``, above the devices it lists).

Each reads the kernel afresh through ``machine()`` (see ``machinery``); the readings' types are in ``readings``.
"""

from __future__ import annotations

from .adapters.procfs import read_proc_status
from .adapters.root import resolve
from .decide import Level
from .machinery import cores_from, machine
from .readings import Budget, Limits, Pressure, SiblingReading

__all__ = ["Budget", "Limits", "Pressure", "SiblingReading", "budget", "cores", "current_level", "limits", "pressure",
           "siblings"]


def budget(gb: float | str | None = None) -> Budget:
    """Read the RAM budget for big arrays, or set it: ``budget(16)`` (GB), ``budget("512MB")``; ``budget("auto")``
    goes back to the default (``APSI_RAM_BUDGET``, else 70 % of what is free)."""
    return machine().budget(gb)


def limits() -> Limits:
    """Usable memory, free memory and the budget, from the cgroup (limits re-read on every call) and the host.
    ``str()``: ``1.0 GB usable (container (cgroup v1)), 1.0 GB free, budget 0.7 GB``."""
    return machine().limits()


def pressure() -> Pressure:
    """Measure now; the level uses the last one for hysteresis and registered components hear of a change."""
    return machine().pressure()


def current_level() -> Level:
    """The level for an allocation path: cheap, re-measured at most twice a second."""
    return machine().current_level()


def cores(root: str | None = None) -> int:
    """CPUs this process may run on, as ``nproc`` counts them (its affinity mask); ``root`` reads another
    ``/proc`` than the machine's."""
    if root is None:
        return machine().cores()
    return cores_from(read_proc_status(resolve(root)))


def siblings() -> SiblingReading:
    """The other processes of this user in this memory group that use the library: how many (``processes``),
    how many hold RAM arrays (``active``), and what they placed in RAM and the kernel has not charged yet
    (``reserved_bytes``). Calling it enters this process in the group's ledger, so its siblings count it too."""
    return machine().join()
