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
  ``parse_x(text)`` and a one-line reader each. ``sim/`` writes fake machines under a temporary root for them.
* ``measure`` and ``api`` join the two into the public readings: ``status``, ``limits``, ``pressure``, ``budget``,
  and ``current_level`` — the level re-measured at most twice a second on allocation paths.
* ``reactions`` is the one mechanism by which pools and stores hear of a level change (shrink at ``high``, empty
  at ``critical``, grow back at ``ok``) and give RAM back on ``relieve``.
* ``arrays`` + ``spill`` (RAM or memory-mapped spill file), ``pool`` (reused temporaries), ``watch``
  (``on_pressure``, ``relieve``), ``chunks`` + ``mapping`` (streaming larger than RAM, on ``blocks``, ``pages``,
  ``sources``, ``progress``), the ``store`` package (``store/__init__.py``, ``store/store.py``, ``journal``,
  ``records``, ``tiers``, ``codec``, ...) + ``cached`` + ``signing`` + ``hashing`` (the two-tier cache),
  ``devices`` + ``batch`` (GPUs and ``fit_batch``) build on them; ``_libc`` holds the C library calls,
  ``fileio`` the way new files are written. Importing does no work: fork hooks, ``atexit`` and reclaiming dead
  spill files come with first use. Every public name is re-exported here explicitly.
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
    ChunkError,
    CorruptFileError,
    DiskFullError,
    MissingExtraError,
    MissingKeyError,
    NotCachedWarning,
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

# -- foundation: status, limits, pressure, budget (api.py) --
from .api import Budget, Limits, Pressure, Status, budget, cores, current_level, limits, pressure, status

# -- arrays, pool, on_pressure, relieve (arrays.py, pool.py, watch.py) --
# (the function ``pool`` shadows the submodule attribute: use ``from apsi_memory.pool import Pool``)
from .arrays import ArrayRecord, array, free, on_disk, report
from .pool import Pool, pool
from .watch import Watcher, on_pressure, relieve

# -- chunks and map (chunks.py, mapping.py) --
# (``map`` shadows the builtin inside this namespace only: ``memory.map``)
from .chunks import chunks
from .mapping import map, to_dask

# -- store and cached (store/__init__.py, store/folders.py, cached.py) --
# (the functions ``store`` and ``cached`` shadow their submodules: use ``from apsi_memory.store import Store``)
from .cached import cached
from .store import Store, allow_write, store

# -- devices and fit_batch (devices.py, batch.py) --
# (the function ``devices`` shadows the submodule attribute: use ``from apsi_memory.devices import gpus``)
from .batch import fit_batch
from .devices import Cpu, Devices, Gpu, best_device, devices

__all__ = [
    "Budget",
    "Limits",
    "Pressure",
    "Status",
    "budget",
    "cores",
    "current_level",
    "limits",
    "pressure",
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
    "SystemCallError",
    "UnsafePathError",
    "StoreClosedError",
    "UnloadableWarning",
    "OldEntryWarning",
    "NotCachedWarning",
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
