"""apsi_memory: decide where data lives — RAM while it fits, the SSD when it does not, the GPU with the most free
memory when there is one — from the memory this process really has (its cgroup, not the host), and react when
memory gets tight.

    import apsi_memory as memory
    print(memory.status())

Theory of operation
-------------------
* ``decide`` and ``units`` are the rules, as data tables and pure functions: the pressure level (free share of
  usable memory and PSI stalls, with hysteresis), the default budget, RAM-or-SSD placement, the 90 % eviction
  target, batch halving, size strings. They do no I/O, so every documented decision is testable with integers.
* ``adapters`` read kernel files (``/proc``, cgroup v1/v2, PSI, disk) under an injectable root — a pure
  ``parse_x(text)`` and a one-line reader each — and tell the time (``adapters.clock``). ``sim/`` writes fake
  machines under a temporary root for them, and has a clock the tests move.
* ``machinery.Machine`` holds what the library keeps about the machine: its root and clock, the budget, the
  RAM ``ledger``, the ``levels`` tracker (re-measured at most twice a second on allocation paths) and the
  components (``levels.Components``) that hear of a level change: shrink at ``high``, empty at ``critical``,
  grow back at ``ok``, give RAM back on ``relieve``. ``machine()`` is the process's; ``with m.use():`` installs
  another (``sim.machine(tree)`` in tests). ``measure`` + ``readings`` make its readings. ``siblings`` is the
  reservation ledger the processes of one memory cgroup share: what each placed in RAM and has not written yet,
  taken off free memory by every placement (``docs/guides/several-processes.md``).
* ``arrays`` + ``spill`` (RAM or memory-mapped spill file), ``pool`` (reused temporaries), ``watch``
  (``on_pressure``, ``relieve``), ``chunks`` + ``mapping`` (streaming larger than RAM, on ``blocks``, ``pages``,
  ``sources``, ``progress``), the ``store`` package (``store/__init__.py``, ``store/store.py``, ``journal``,
  ``records``, ``tiers``, ``codec``, ...) + ``cached`` + ``signing`` + ``hashing`` (the two-tier cache),
  ``devices`` + ``batch`` (GPUs and ``fit_batch``) build on the machine; ``_libc`` holds the C library calls,
  ``fileio`` the way new files are written. Importing does no work: fork hooks, ``atexit`` and reclaiming dead
  spill files come with first use. ``api`` and ``status`` are the readings of ``machine()``; ``cli`` prints them.
  Every public name is re-exported here, imported on first use (``import apsi_memory`` loads no submodule).
  The docs' "Internals" page draws the layers.
"""

from __future__ import annotations

import importlib
import sys
import types
import typing

if typing.TYPE_CHECKING:  # the names as type checkers see them; at run time ``__getattr__`` imports each on first use
    from ._version import __version__ as __version__
    from .api import budget, cores, current_level, limits, pressure, siblings
    from .arrays import ArrayRecord, array, free, on_disk, report
    from .batch import fit_batch
    from .cached import cached
    from .chunks import chunks
    from .decide import Level, Place
    from .devices import Cpu, Devices, Gpu, best_device, devices
    from .errors import (
        ApsiMemoryError,
        ArgumentError,
        ArgumentTypeError,
        BatchTooSmallError,
        BlockError,
        BudgetWarning,
        CacheKeyWarning,
        ChunkError,
        CorruptFileError,
        DiskFullError,
        MissingExtraError,
        MissingFileError,
        MissingKeyError,
        NotCachedWarning,
        NotFreedWarning,
        OldEntryWarning,
        PoolError,
        SizeError,
        StoreClosedError,
        SystemCallError,
        TamperWarning,
        UnloadableWarning,
        UnsafePathError,
    )
    from .machinery import Machine, machine
    from .mapping import map, to_dask
    from .pool import Pool, pool
    from .readings import Budget, Limits, Pressure, SiblingReading
    from .status import Status, status
    from .store import CacheStats, Store, allow_write
    from .store import store  # type: ignore[no-redef]  # mypy binds the subpackage here first; the function wins
    from .units import parse_size
    from .watch import Watcher, on_pressure, relieve

# Where each public name lives. Importing them all costs ~45 ms after NumPy (psutil, hashlib, logging, ~60 modules
# of ours); a CLI call or a script that needs three of them should not pay for the rest.
_HOME: dict[str, str] = {name: module for module, names in (
    ("_version", "__version__"),
    ("api", "budget cores current_level limits pressure siblings"),
    ("arrays", "ArrayRecord array free on_disk report"),
    ("batch", "fit_batch"),
    ("cached", "cached"),
    ("chunks", "chunks"),
    ("decide", "Level Place"),
    ("devices", "Cpu Devices Gpu best_device devices"),
    ("errors", ("ApsiMemoryError ArgumentError ArgumentTypeError BatchTooSmallError BlockError BudgetWarning "
                "CacheKeyWarning ChunkError CorruptFileError DiskFullError MissingExtraError MissingFileError "
                "MissingKeyError NotCachedWarning NotFreedWarning OldEntryWarning PoolError SizeError StoreClosedError SystemCallError TamperWarning UnloadableWarning "
                "UnsafePathError")),
    ("machinery", "Machine machine"),
    ("mapping", "map to_dask"),
    ("pool", "Pool pool"),
    ("readings", "Budget Limits Pressure SiblingReading"),
    ("status", "Status status"),
    ("store", "CacheStats Store allow_write store"),
    ("units", "parse_size"),
    ("watch", "Watcher on_pressure relieve"),
) for name in names.split()}


def __getattr__(name: str) -> typing.Any:
    """A public name, imported from its module on first use; or a submodule (``apsi_memory.spill``)."""
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):  # dunders are probed by tools (``__wrapped__``): never a submodule
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


class _Package(types.ModuleType):
    """The functions ``status``, ``pool``, ``chunks``, ``cached``, ``store``, ``devices`` and ``siblings`` share a
    module's name.
    Loading a submodule makes the import system set it as an attribute of this package; for those the function
    stays there instead (``memory.store(...)`` after ``import apsi_memory.store``), as the eager imports did."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and name in _HOME:  # a function named like a submodule stays
            if _HOME[name] != name:
                return  # ``siblings`` lives in ``api``: ``__getattr__`` imports it on first use (no import cycle)
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Machine",
    "machine",
    "Budget",
    "Limits",
    "Pressure",
    "SiblingReading",
    "Status",
    "budget",
    "cores",
    "current_level",
    "limits",
    "pressure",
    "siblings",
    "status",
    "ApsiMemoryError",
    "BatchTooSmallError",
    "BlockError",
    "BudgetWarning",
    "ChunkError",
    "CorruptFileError",
    "DiskFullError",
    "Level",
    "Place",
    "PoolError",
    "SizeError",
    "TamperWarning",
    "ArgumentError",
    "ArgumentTypeError",
    "MissingExtraError",
    "MissingKeyError",
    "MissingFileError",
    "SystemCallError",
    "UnsafePathError",
    "StoreClosedError",
    "UnloadableWarning",
    "OldEntryWarning",
    "NotCachedWarning",
    "CacheKeyWarning",
    "NotFreedWarning",
    # chunks and map
    "chunks",
    "map",
    "to_dask",
    # arrays, pool, on_pressure, relieve
    "ArrayRecord",
    "Pool",
    "Watcher",
    "array",
    "free",
    "on_disk",
    "on_pressure",
    "pool",
    "relieve",
    "report",
    # store and cached
    "Store",
    "CacheStats",
    "cached",
    "allow_write",
    "store",
    "parse_size",
    # devices and fit_batch
    "Cpu",
    "Devices",
    "Gpu",
    "best_device",
    "devices",
    "fit_batch",
]
