"""apsi_memory: decide where data lives — RAM while it fits, the SSD when it does not, the GPU with the most free
memory when there is one — from the memory this process really has (its cgroup, not the host), and react when
memory gets tight.

    import apsi_memory as memory
    print(memory.status())

The package is in parts, one folder each, each importing only the parts below it (``docs/internals.md`` has a
paragraph a part; ``tests/test_layers.py`` checks the imports against what each part's docstring declares):
``decide`` (the rules, pure), ``system`` (libc, userfaultfd, files, folders, trust), ``adapters`` (kernel files
under an injectable root), ``machinery`` (the ``Machine``: readings, the level tracker, our held RAM, the siblings'
reservations, the watcher), ``arrays``, ``blocks`` (the pieces of streaming), ``store``, ``devices``, ``dask``,
``outofcore`` (``chunks``, ``map``, ``reduce``) and ``cli``. At the top: ``errors``, ``units``, ``logs``, ``status`` and
this module.

Importing does no work and loads no submodule: each public name below is imported from its module on first use.
A module named like the public function it holds (``store``, ``status``, ``devices``) is callable as that
function, so ``memory.store(...)`` and ``import apsi_memory.store as s; s.Store`` both work.
"""

from __future__ import annotations

import importlib
import sys
import types
import typing
import warnings

if typing.TYPE_CHECKING:  # the names as type checkers see them; at run time ``__getattr__`` imports each on first use
    from ._version import __version__ as __version__
    from .arrays.keeping import keep
    from .arrays.placement import ArrayRecord, array, free, on_disk, report
    from .arrays.pools import Pool, pool
    from .decide import Level, Place
    from .devices.batch import fit_batch
    from .devices.hardware import Cpu, Devices, Gpu, best_device
    from .devices.hardware import devices  # the function, as a call of the module does
    from .errors import (
        ApsiMemoryError,
        ApsiMemoryWarning,
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
    from .machinery.machines import (
        Machine,
        budget,
        cores,
        current_level,
        limits,
        machine,
        pressure,
        siblings,
    )
    from .machinery.reading import Budget, Limits, Pressure, SiblingReading
    from .machinery.watcher import Watcher, on_pressure, relieve
    from .outofcore.chunking import chunks
    from .outofcore.mapping import map, to_dask
    from .outofcore.reducing import reduce
    from .status import Status
    from .status import status  # the function, as a call of the module does
    from .store import CacheStats, Store, allow_write
    from .store import store  # the function, as a call of the module does
    from .store.cached import cached
    from .units import fmt_size, parse_size

# Where each public name lives. Importing them all costs ~45 ms after NumPy (psutil, hashlib, logging, ~60 modules
# of ours); a CLI call or a script that needs three of them should not pay for the rest.

_HOME: dict[str, str] = {name: module for module, names in (
    ("_version", "__version__"),
    ("arrays.keeping", "keep"),
    ("arrays.placement", "ArrayRecord array free on_disk report"),
    ("arrays.pools", "Pool pool"),
    ("decide", "Level Place"),
    ("devices", "Cpu Devices Gpu best_device fit_batch"),
    ("errors", ("ApsiMemoryError ApsiMemoryWarning ArgumentError ArgumentTypeError BatchTooSmallError BlockError "
                "BudgetWarning CacheKeyWarning ChunkError CorruptFileError DiskFullError MissingExtraError "
                "MissingFileError MissingKeyError NotCachedWarning NotFreedWarning OldEntryWarning PoolError SizeError "
                "StoreClosedError SystemCallError TamperWarning UnloadableWarning UnsafePathError")),
    ("machinery", "Machine budget cores current_level limits machine pressure siblings"),
    ("machinery.reading", "Budget Limits Pressure SiblingReading"),
    ("machinery.watcher", "Watcher on_pressure relieve"),
    ("outofcore.chunking", "chunks"),
    ("outofcore.mapping", "map to_dask"),
    ("outofcore.reducing", "reduce"),
    ("status", "Status"),
    ("store", "CacheStats Store allow_write"),
    ("store.cached", "cached"),
    ("units", "fmt_size parse_size"),
) for name in names.split()}

# Modules that are their namesake function too: ``memory.store`` is the module ``apsi_memory.store``, and calling it
# calls ``apsi_memory.store.store``.
_CALLABLE = ("devices", "status", "store")

# Old module paths (before the parts had folders, 0.1.0) -> where the module is now. Each still imports, with a
# DeprecationWarning, until the next release.
_MOVED: dict[str, str] = {
    "_libc": "system.libc", "_once": "system.once", "_uffd": "system.uffd", "api": "machinery.machines",
    "batch": "devices.batch", "cached": "store.cached", "chunks": "outofcore.chunking",
    "cli_files": "cli.leftovers", "dask.blocks": "dask.tasks", "decide.dask": "decide.workers",
    "fileio": "system.fileio", "hashing": "store.hashing", "inventory": "cli.inventory", "ledger": "machinery.held",
    "levels": "machinery.tracker", "mapping": "outofcore.mapping",
    "measure": "machinery.reading", "moving": "arrays.moving", "pages": "blocks.pages", "paths": "system.paths",
    "pool": "arrays.pools", "progress": "blocks.progress", "readings": "machinery.reading",
    "rowblocks": "blocks.runner", "siblings": "machinery.reservations", "signing": "store.signing",
    "sources": "blocks.sources", "spill": "arrays.spill", "store.store": "store.core", "trust": "system.trust",
    "watch": "machinery.watcher",
}


def __getattr__(name: str) -> typing.Any:
    """A public name, imported from its module on first use; or a submodule (``apsi_memory.arrays``)."""
    if name in _HOME or name in _CALLABLE:
        module = importlib.import_module(f".{_HOME.get(name, name)}", __name__)
        value = module if name in _CALLABLE else getattr(module, name)
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
    return sorted(set(globals()) | set(_HOME) | set(_CALLABLE))


class _Namespace(types.ModuleType):
    """A package of ours: the import system binds each submodule loaded as an attribute of its package; an old
    path's module (``apsi_memory.chunks``, now ``apsi_memory.outofcore.chunking``) is not bound under the old name, so
    it never hides the public function of that name. The modules of ``_CALLABLE`` become callable as they load."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ != f"{self.__name__}.{name}":
            return
        if self.__name__ == __name__ and name in _CALLABLE and isinstance(value, types.ModuleType):
            value.__class__ = _FunctionModule
        super().__setattr__(name, value)


class _FunctionModule(_Namespace):
    """A module called as the function it is named after (``memory.store("x")`` is ``store.store("x")``); it
    pickles as a reference to itself, as a function does."""

    def __call__(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any:
        return self._function()(*args, **kwargs)

    def _function(self) -> typing.Any:
        return self.__dict__[self.__name__.rpartition(".")[2]]

    @property
    def __signature__(self) -> typing.Any:  # what ``help`` and ``inspect.signature`` show for a call
        import inspect

        return inspect.signature(self._function())

    def __reduce__(self) -> tuple[typing.Any, tuple[str]]:
        return importlib.import_module, (self.__name__,)


class _OldPaths:
    """A meta path finder and loader for ``_MOVED``: ``import apsi_memory.spill`` gives ``apsi_memory.arrays.spill``
    (the same module object) and warns that the path moved."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> typing.Any:
        if fullname.partition(".")[0] != __name__ or fullname[len(__name__) + 1:] not in _MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, typing.cast(typing.Any, _OldPaths))

    @staticmethod
    def create_module(spec: typing.Any) -> types.ModuleType:
        new = f"{__name__}.{_MOVED[spec.name[len(__name__) + 1:]]}"
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system sets ``__spec__`` of what this returns
        return module

    @staticmethod
    def exec_module(module: types.ModuleType) -> None:
        module.__spec__ = typing.cast(typing.Any, module.__spec__).loader_state  # its own spec back: the new path's


sys.modules[__name__].__class__ = _Namespace
sys.meta_path.append(_OldPaths)  # a finder by protocol: find_spec

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
    "ApsiMemoryWarning",
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
    "reduce",
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
    "fmt_size",
    # devices and fit_batch
    "Cpu",
    "Devices",
    "Gpu",
    "best_device",
    "devices",
    "fit_batch",
    # keeping an output
    "keep",
]
