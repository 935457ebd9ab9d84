"""``@memory.cached``: a function's results kept in a store, so they survive restarts.

What makes a key (a digest of all of it):

* the function's module, qualified name and code: its bytecode, the names it uses and its constants, nested
  functions included (a changed body misses; moving it in its file, comments and line numbers do not);
* its arguments as bound to its signature, defaults filled in (``f(1)`` and ``f(x=1)`` are one call; ``**kwargs``
  in any order are one call), each by name and value: arrays by their dtype, shape and bytes
  (``hashing.array_digest``), PyTorch tensors by dtype, shape, device type and bytes (``hashing.tensor_digest``),
  everything else by its pickle (sets sorted); the first argument of each type is checked to hash by value (an
  equal copy, its pickle read back, gives the same digest), else a ``CacheKeyWarning`` names it;
* for an ``os.PathLike`` argument (``pathlib.Path``), and for the parameters named in
  ``@memory.cached(files=("path",))`` (plain ``str`` paths), the path *and the identity of the file behind it*:
  device, inode, size and modification time in nanoseconds (``hashing.file_digest``, one ``stat``; the content is
  not read). An edited, replaced or truncated file misses; a missing file is keyed as missing, so the call runs
  (and fails or not) as it would uncached.

What is not part of the key: the source of the functions it calls (a changed helper does not miss), what it
reads from globals or closures, the environment, and paths inside containers (a list of paths is hashed as its
strings). As with joblib.Memory, a result that depends on those should get them as arguments. Decorating warns
(``CacheKeyWarning``, naming them) about what can change under an unchanged key while the program runs: a closure's
variables (``make(2)`` and ``make(3)`` would share results) and mutable globals (a list, a dict, an array, an
object); modules, classes, functions and constants (numbers, strings, tuples of them) are read silently. Exceptions
are not cached; a result that cannot be kept (a full disk) is returned with a ``NotCachedWarning``.

Every key starts with a digest of the function's module and qualified name, so ``f.clear()`` removes that
function's entries only (those of every version of its code), and ``f.stats()`` counts its hits, misses and
evictions (``CacheStats``, in this process).

A hit returns what a miss did, the caller's own value: an array comes back writable (copy-on-write for a big
one, see ``Store.get``), and writing to it never changes what the cache holds.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import inspect
import logging
import os
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, CacheKeyWarning, DiskFullError, NotCachedWarning
from . import DEFAULT_DISK_GB, DEFAULT_RAM_MB, CacheStats, Store, byte_limits, path_text
from . import store as open_store
from .hashing import file_digest, function_digest, hashes_by_value, value_digest
from .stats import Counts

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "cached"
_MISSING = object()


@overload
def cached(func: F) -> F: ...


@overload
def cached(*, store: Store | str = DEFAULT_STORE, ram_mb: float | str = DEFAULT_RAM_MB,
           disk_gb: float | str = DEFAULT_DISK_GB, files: Sequence[str] = ()) -> Callable[[F], F]: ...


def cached(func: Callable[..., Any] | None = None, *, store: Store | str = DEFAULT_STORE,
           ram_mb: float | str = DEFAULT_RAM_MB, disk_gb: float | str = DEFAULT_DISK_GB, files: Sequence[str] = ()) -> Any:
    """``@cached`` or ``@cached(store="features", ram_mb=..., disk_gb=..., files=("path",))``; ``store`` may also
    be a ``Store``. A call's key is a digest of the function's code and of its arguments by value (arrays and
    tensors by dtype, shape and bytes, anything else by its pickle), not of what it reads from globals or of the
    functions it calls. ``files`` names parameters that take a path as ``str``: they are keyed by the path and the
    file's identity (device, inode, size, modification time; not its content), as ``os.PathLike`` arguments always
    are, so an edited or replaced file misses.

    The store opens on the first call, so decorating costs nothing at import. The wrapper's ``.store`` is that
    store (``None`` before the first call); ``.stats()`` counts this function's hits, misses and evictions in this
    process (``CacheStats``); ``.clear()`` removes this function's entries only and returns how many went."""
    if not isinstance(store, Store) and not path_text(store, "@cached: store", "a Store or a name or path"):
        raise ArgumentError("@cached: store name '' is empty; use e.g. store='features'")
    byte_limits(ram_mb, disk_gb)  # checked at the decorating line, not at the first call
    if func is None:
        return lambda f: _Cached(f, store, ram_mb, disk_gb, files).wrapper()
    return _Cached(func, store, ram_mb, disk_gb, files).wrapper()


class _Cached:
    def __init__(self, func: Callable[..., Any], store: Store | str, ram_mb: float | str, disk_gb: float | str,
                 files: Sequence[str] = ()) -> None:
        if not callable(func):
            raise ArgumentTypeError(f"@cached decorates a function, not {type(func).__name__}")
        self.func = func
        self.signature = inspect.signature(func)
        self.files = _file_parameters(self.signature, files, func)
        self.code = function_digest(func)
        inner = getattr(func, "__wrapped__", func)
        self.counts = Counts(hashlib.sha256(f"apsi-cached-fn\0{inner.__module__}\0{inner.__qualname__}".encode())
                             .digest()[:16])  # every key starts with it: the function's entries, for ``clear``
        _warn_hidden_inputs(inner)
        self.store: Store | None = None
        if isinstance(store, Store):
            self.store = store
            store.count_keys(self.counts)
        else:
            self.opener = functools.partial(open_store, store, ram_mb=ram_mb, disk_gb=disk_gb)
        self.lock = threading.Lock()
        self.checked_types: set[type] = set()  # argument types already checked by ``hashes_by_value``

    def wrapper(self) -> Callable[..., Any]:
        @functools.wraps(self.func)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(args, kwargs)

        call.store = self.store  # type: ignore[attr-defined]
        call.stats = self.stats  # type: ignore[attr-defined]
        call.clear = self.clear  # type: ignore[attr-defined]
        # A weak reference: the wrapper holds this object, and a strong one back would make a cycle that only the
        # garbage collector frees, at a moment (inside some other lock) nobody chose.
        self.wrapped = weakref.ref(call)
        return call

    def open(self) -> Store:
        with self.lock:
            if self.store is None:
                self.store = self.opener()
                self.store.count_keys(self.counts)
                wrapped = self.wrapped()
                if wrapped is not None:
                    wrapped.store = self.store  # type: ignore[attr-defined]
            return self.store

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A full disk never costs the caller the result: it is computed (or returned) and a warning says it was
        not kept."""
        key = self.key(args, kwargs)
        try:
            store = self.store or self.open()
        except DiskFullError as err:  # the store could not even be made: run uncached
            return self.uncached(args, kwargs, err)
        hit = store.get(key, _MISSING)
        self.count(hit is not _MISSING)
        if hit is not _MISSING:
            return hit
        result = self.func(*args, **kwargs)
        try:
            store.set(key, result)
        except DiskFullError as err:  # the work is done: return it; only keeping it failed
            self.not_kept(err)
        return result

    def count(self, hit: bool) -> None:
        with self.lock:
            if hit:
                self.counts.hits += 1
            else:
                self.counts.misses += 1

    def stats(self) -> CacheStats:
        return self.counts.snapshot()

    def clear(self) -> int:
        """Remove this function's entries (every version of its code) from its store, for every process."""
        store = self.store or self.open()
        prefix = self.counts.prefix
        return sum(store.delete(key) for key in store if isinstance(key, bytes) and key.startswith(prefix))

    def uncached(self, args: tuple[Any, ...], kwargs: dict[str, Any], err: DiskFullError) -> Any:
        self.count(False)
        result = self.func(*args, **kwargs)
        self.not_kept(err)
        return result

    def not_kept(self, err: DiskFullError) -> None:
        warnings.warn(NotCachedWarning(f"{self.func.__qualname__}: result returned but not cached: {err}"),
                      stacklevel=4)

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        h = hashlib.sha256(b"apsi-cached-1\0" + self.code)
        for name, value in bound.arguments.items():
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                value = dict(sorted(value.items()))  # f(a=1, b=2) and f(b=2, a=1) are one call
            h.update(name.encode() + b"\0")
            try:
                digest = (file_digest(value) if name in self.files or isinstance(value, os.PathLike)
                          else self.value_digest(name, value))
            except TypeError as err:
                raise ArgumentTypeError(f"{self.func.__qualname__}: argument {name!r} cannot be part of a cache key "
                                f"({err})") from err
            h.update(digest)
        return self.counts.prefix + h.digest()

    def value_digest(self, name: str, value: Any) -> bytes:
        """``value``'s digest; the first time a type comes by, a ``CacheKeyWarning`` where an equal copy of it
        gives another digest (calls with it would never hit)."""
        digest = value_digest(value)
        kind = type(value)
        if kind not in self.checked_types:
            self.checked_types.add(kind)
            if not hashes_by_value(value, digest):
                warnings.warn(CacheKeyWarning(
                    f"@cached {self.func.__qualname__}: argument {name!r} ({kind.__module__}.{kind.__qualname__}) is "
                    "not hashed by value: an equal one gives another key, so calls with it never hit; pass what it "
                    "holds (numbers, strings, arrays, tensors) instead"), stacklevel=5)
        return digest


def _file_parameters(signature: inspect.Signature, files: Sequence[str], func: Callable[..., Any]) -> frozenset[str]:
    """``files`` checked against the signature: a name that is no parameter is a mistake caught at decoration."""
    if isinstance(files, str):
        files = (files,)  # files="path" means the one parameter, not its letters
    if not isinstance(files, Iterable) or isinstance(files, bytes):
        raise ArgumentTypeError(f"@cached(files=...) takes parameter names (str or a sequence of str), not "
                                f"{type(files).__name__} ({files!r})")
    files = tuple(files)
    for name in files:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"@cached(files=...) takes parameter names (str or a sequence of str), not "
                                    f"{type(name).__name__} ({name!r})")
    unknown = [name for name in files if name not in signature.parameters]
    if unknown:
        raise ArgumentError(f"@cached(files=...): {func.__qualname__} has no parameter {unknown[0]!r}; its parameters "
                         f"are {', '.join(signature.parameters) or 'none'}")
    return frozenset(files)


# Values a @cached function may read from its globals without a warning: they cannot change while it runs (a
# constant edited in the source is as stale as a changed helper function: see the module docstring).
_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, range, np.generic, np.dtype, type(Ellipsis))
_CODE_LIKE = (types.ModuleType, type, functools.partial, logging.Logger)


def _warn_hidden_inputs(func: Callable[..., Any]) -> None:
    """A ``CacheKeyWarning`` naming the closure variables and mutable globals ``func`` reads, if any (see the
    module docstring); at the decorating line."""
    code = getattr(func, "__code__", None)
    if code is None:
        return
    cells = dict(zip(code.co_freevars, getattr(func, "__closure__", None) or ()))
    hidden = [f"closure variable {name!r}" for name, cell in cells.items() if _filled_with_data(cell)]
    namespace = getattr(func, "__globals__", {})
    hidden += [f"global {name!r} ({type(namespace[name]).__name__})" for name in sorted(_global_reads(code))
               if name in namespace and _mutable_data(namespace[name])]
    if hidden:
        warnings.warn(CacheKeyWarning(
            f"@cached {func.__qualname__} reads {', '.join(hidden)}, which {'is' if len(hidden) == 1 else 'are'} not "
            "part of its key: a result cached while they held one value is returned after they change; pass them "
            "as arguments"), stacklevel=4)


def _filled_with_data(cell: types.CellType) -> bool:
    try:
        value = cell.cell_contents
    except ValueError:  # not assigned yet: the function's own name, for a recursive one
        return False
    return not isinstance(value, (types.ModuleType, type))


def _global_reads(code: types.CodeType) -> set[str]:
    """The global names ``code``, and the code nested in it (comprehensions, inner functions), loads."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_reads(const)
    return names


def _mutable_data(value: Any) -> bool:
    if isinstance(value, _CODE_LIKE) or inspect.isroutine(value):
        return False
    return not _constant(value)


def _constant(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_constant(member) for member in value)
    return isinstance(value, _CONSTANTS)
