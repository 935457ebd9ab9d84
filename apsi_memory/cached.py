"""``@memory.cached``: a function's results kept in a store, so they survive restarts.

The key is a SHA-256 over the function's module, qualified name and code (a changed body misses; moving it in its
file does not) and its arguments as bound to its signature (defaults filled in, so ``f(1)`` and ``f(x=1)`` are one
call). Arrays are hashed by content (``hashing.array_digest``). What the function reads from globals or closures
is not part of the key, as with joblib.Memory: a function whose result depends on them should take them as
arguments. Exceptions are not cached; a result that cannot be kept (a full disk) is returned with a
``NotCachedWarning``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, overload

from .errors import ArgumentTypeError, DiskFullError, NotCachedWarning
from .hashing import function_digest, value_digest
from .store import DEFAULT_DISK_GB, DEFAULT_RAM_MB, Store
from .store import store as open_store

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "cached"
_MISSING = object()


@overload
def cached(func: F) -> F: ...


@overload
def cached(*, store: Store | str = DEFAULT_STORE, ram_mb: float = DEFAULT_RAM_MB,
           disk_gb: float = DEFAULT_DISK_GB) -> Callable[[F], F]: ...


def cached(func: Callable[..., Any] | None = None, *, store: Store | str = DEFAULT_STORE,
           ram_mb: float = DEFAULT_RAM_MB, disk_gb: float = DEFAULT_DISK_GB) -> Any:
    """``@cached`` or ``@cached(store="features", ram_mb=..., disk_gb=...)``; ``store`` may also be a ``Store``.

    The store opens on the first call, so decorating costs nothing at import. The wrapper's ``.store`` is that
    store (``None`` before the first call)."""
    if func is None:
        return lambda f: _Cached(f, store, ram_mb, disk_gb).wrapper()
    return _Cached(func, store, ram_mb, disk_gb).wrapper()


class _Cached:
    def __init__(self, func: Callable[..., Any], store: Store | str, ram_mb: float, disk_gb: float) -> None:
        if not callable(func):
            raise ArgumentTypeError(f"@cached decorates a function, not {type(func).__name__}")
        self.func = func
        self.signature = inspect.signature(func)
        self.code = function_digest(func)
        self.store: Store | None = None
        if isinstance(store, Store):
            self.store = store
        else:
            self.opener = functools.partial(open_store, store, ram_mb=ram_mb, disk_gb=disk_gb)
        self.lock = threading.Lock()

    def wrapper(self) -> Callable[..., Any]:
        @functools.wraps(self.func)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(args, kwargs)

        call.store = self.store  # type: ignore[attr-defined]
        # A weak reference: the wrapper holds this object, and a strong one back would make a cycle that only the
        # garbage collector frees, at a moment (inside some other lock) nobody chose.
        self.wrapped = weakref.ref(call)
        return call

    def open(self) -> Store:
        with self.lock:
            if self.store is None:
                self.store = self.opener()
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
        if hit is not _MISSING:
            return hit
        result = self.func(*args, **kwargs)
        try:
            store.set(key, result)
        except DiskFullError as err:  # the work is done: return it; only keeping it failed
            self.not_kept(err)
        return result

    def uncached(self, args: tuple[Any, ...], kwargs: dict[str, Any], err: DiskFullError) -> Any:
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
                h.update(value_digest(value))
            except TypeError as err:
                raise ArgumentTypeError(f"{self.func.__qualname__}: argument {name!r} cannot be part of a cache key "
                                f"({err})") from err
        return h.digest()
