"""Content digests for ``@cached`` keys: arguments and function code, stable across restarts.

Every digest is XXH3-128 (the ``xxhash`` package): a cache key must tell different arguments apart, which a
128-bit hash does for values that were not crafted to collide, and it runs at memory speed — hashing, not the
store, was the whole cost of a hit with a big array argument. It is not a MAC and need not be: a key only
decides which stored entry to look at, and every stored entry is signed on its own (``signing``), so a crafted
collision can at worst return another cached result of the same function, never run foreign code. NumPy arrays
are hashed by dtype, shape and their bytes in C order in one pass (it runs at the memory's
speed, so threads would not add up), and so are PyTorch tensors (with their device type; a GPU tensor is copied to
the CPU to be hashed). Everything else is pickled into the hash, with arrays inside containers hashed
the same way out of band (no copy into the pickle) and sets sorted, so the same value gives the same digest in
every process.
"""

from __future__ import annotations

import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from xxhash import xxh3_128

from ..errors import ArgumentTypeError


def array_digest(array: np.ndarray) -> bytes:
    """XXH3-128 of dtype, shape and bytes (C order; a non-contiguous array is copied once to get there)."""
    contiguous = np.ascontiguousarray(array)
    h = xxh3_128(f"{contiguous.dtype.str}{contiguous.shape}|".encode())
    h.update(contiguous.reshape(-1).view(np.uint8).data)
    return h.digest()


def tensor_digest(value: Any) -> bytes | None:
    """XXH3-128 of a PyTorch tensor's dtype, shape, device type and bytes, as ``array_digest`` does for NumPy (its
    pickle holds the storage's identity: equal tensors gave different keys); None for anything else, sparse and
    nested tensors included (their pickle, as for any value). A tensor exists only where torch is imported: it is
    looked up, never imported here."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    flat = value.detach().to("cpu").contiguous().reshape(-1)
    h = xxh3_128(f"tensor|{value.dtype}|{tuple(value.shape)}|{value.device.type}|".encode())
    h.update(flat.view(torch.uint8).numpy().data)
    return h.digest()


class _Sink:
    """A file-like ``write`` that feeds a hash, so pickling never builds the whole byte string."""

    def __init__(self) -> None:
        self.hash = xxh3_128()

    def write(self, data: bytes | memoryview) -> int:
        self.hash.update(data)
        return len(data)


class _DigestPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
            return ("ndarray", array_digest(obj))
        tensor = tensor_digest(obj)
        if tensor is not None:
            return ("tensor", tensor)
        if isinstance(obj, (set, frozenset)):
            # Set order follows string hashes, which change between processes: sort the members' digests.
            return (type(obj).__name__, tuple(sorted(value_digest(member) for member in obj)))
        if isinstance(obj, types.CodeType):
            return ("code", code_digest(obj))
        return None


def value_digest(value: Any) -> bytes:
    """A digest of any picklable value; ``TypeError`` (naming the type) for one that cannot be pickled."""
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return array_digest(value)
    tensor = tensor_digest(value)
    if tensor is not None:
        return tensor
    sink = _Sink()
    try:
        _DigestPickler(sink, protocol=5).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise ArgumentTypeError(f"cannot hash a value of type {type(value).__name__} for a cache key: {err}") from err
    return sink.hash.digest()


_PLAIN = (np.ndarray, np.generic, str, bytes, int, float, complex, type(None))  # hashed by value by construction


def hashes_by_value(value: Any, digest: bytes) -> bool:
    """Whether an equal copy of ``value`` (its own pickle, read back) gives the same ``digest``: False for a type
    whose pickle holds an identity (a storage id, a counter), so equal arguments never meet in the cache. The pickle
    read back is the one made here, in memory, from the caller's own argument."""
    torch = sys.modules.get("torch")
    if isinstance(value, _PLAIN) or (torch is not None and isinstance(value, torch.Tensor)):
        return True
    try:
        copy = pickle.loads(pickle.dumps(value, protocol=5))
        return value_digest(copy) == digest
    except Exception:  # noqa: BLE001 -- a value that does not come back from its pickle is not ours to judge
        return True


def code_digest(code: types.CodeType) -> bytes:
    """What the function does: its bytecode, the names it uses and its constants (nested functions included).
    Line numbers are left out, so moving a function in its file keeps its cache."""
    h = xxh3_128(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    for const in code.co_consts:
        h.update(code_digest(const) if isinstance(const, types.CodeType) else value_digest(const))
    return h.digest()


def function_digest(func: Callable[..., Any]) -> bytes:
    """Module, qualified name and code of ``func`` (the function under any decorators ``functools.wraps`` made)."""
    inner = getattr(func, "__wrapped__", func)
    code = getattr(inner, "__code__", None)
    h = xxh3_128(f"{inner.__module__}\0{inner.__qualname__}\0".encode())
    h.update(code_digest(code) if code is not None else repr(inner).encode())
    return h.digest()


def file_digest(path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> bytes:
    """A digest of the path and the identity of the file behind it: device, inode, size and ``mtime_ns`` (``stat``
    follows a symlink to the file it names). An edited, replaced or truncated file gives another digest; a missing
    one gives the digest of "missing" for that path. The content is not read, so a key costs one ``stat``."""
    name = os.fsencode(path)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return xxh3_128(b"file\0" + name + b"\0missing").digest()
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    return xxh3_128(b"file\0" + name + b"\0" + repr(identity).encode()).digest()
