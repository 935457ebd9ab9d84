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
  Every public name is re-exported here explicitly. README "Layout" draws the layers.
"""

from __future__ import annotations

from .decide import Level, Place
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
from .units import parse_size
from ._version import __version__ as __version__

# -- the machine and its readings: limits, pressure, budget (machinery.py, readings.py, api.py), status (status.py) --
from .api import budget, cores, current_level, limits, pressure, siblings  # (``siblings`` shadows the submodule)
from .machinery import Machine, machine
from .readings import Budget, Limits, Pressure, SiblingReading
from .status import Status, status  # (the function shadows the submodule: ``from apsi_memory.status import Status``)

# -- array, free, on_disk, report (arrays.py); pool (pool.py); on_pressure, relieve (watch.py) --
# (the function ``pool`` shadows the submodule attribute: use ``from apsi_memory.pool import Pool``)
from .arrays import ArrayRecord, array, free, on_disk, report
from .pool import Pool, pool
from .watch import Watcher, on_pressure, relieve

# -- chunks (chunks.py) and map (mapping.py), over blocks.py, pages.py, sources.py --
# (``map`` shadows the builtin inside this namespace only: ``memory.map``)
from .chunks import chunks
from .mapping import map, to_dask

# -- store and cached (store/__init__.py, store/folders.py, cached.py) --
# (the functions ``store`` and ``cached`` shadow their submodules: use ``from apsi_memory.store import Store``)
from .cached import cached
from .store import CacheStats, Store, allow_write, store

# -- devices, best_device (devices.py) and fit_batch (batch.py) --
# (the function ``devices`` shadows the submodule attribute: use ``from apsi_memory.devices import gpus``)
from .batch import fit_batch
from .devices import Cpu, Devices, Gpu, best_device, devices

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
