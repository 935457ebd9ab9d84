"""Store values to signed bytes and back: arrays as ``.npy`` bytes, anything else as a pickle, signature last.

Every signature is a MAC (keyed BLAKE2b, ``signing.mac``), with a key derived from this user's key and the store's identity (random, made with
the store), over a tag, the entry's key, the entry's version (its random name, new on every ``set``) and the
value: a file copied from
another store, an older value of the same key put back (a rollback) or another entry's value swapped in does not
verify. Only a failed signature is tampering; a value that verifies but cannot be loaded here (a class renamed
since) is ``Unloadable``, and one signed the way versions before the identity did is ``OldFormat``.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import pickle
from functools import lru_cache
from hmac import compare_digest
from typing import Any, NamedTuple

import numpy as np
import numpy.lib.format as npformat

from ..errors import ArgumentTypeError
from ..system.fileio import npy_header
from .keys import KIND_NPY_MAP, KIND_NPY_READ, KIND_PICKLE, NAME_BYTES
from .records import Entry
from .signing import SIGNATURE_BYTES, keyed_state, mac_keyed, sign, verify

MMAP_MIN_BYTES = 128 * 1024  # arrays at least this big come back memory-mapped (a file read whole below it)


class Seal(NamedTuple):
    """What every signature of one store is made with: the user's key, and a key derived from it and the store's
    identity (made once at open, so binding the store costs nothing per value)."""

    secret: bytes
    store_key: bytes
    keyed: hashlib.blake2b  # the store key's MAC state (``signing.keyed_state``)


def seal_for(secret: bytes, ident: bytes) -> Seal:
    store_key = sign(secret, b"store", ident)
    return Seal(secret, store_key, keyed_state(store_key))


class _Held(NamedTuple):
    value: Any  # pickled bytes (unpickled on every get, so callers never share a mutable object) or a read-only array
    kind: int
    nbytes: int
    name: str  # the SSD file it mirrors: a different name in the index means another process replaced it
    file: tuple[int, int] | None = None  # a mapped array's file (device, inode): what a caller's private map must be


class _Blob(NamedTuple):
    kind: int
    parts: tuple[bytes | memoryview, ...]  # what goes on disk, signature last
    size: int
    ram_value: Any  # what the RAM tier keeps, or None when it would not fit there anyway
    ram_nbytes: int


class _Tampered(Exception):
    """A value that failed its checks; the store forgets it, removes its file and warns."""


class OldFormat(_Tampered):
    """A value signed by an older apsi_memory (without the store's identity and the version): a miss, not an attack."""


class Unloadable(Exception):
    """A value whose signature checked out but whose unpickling failed here; a miss that stays on disk."""


def _sign(seal: Seal, tag: bytes, key: bytes, stem: str, *parts: bytes | memoryview) -> bytes:
    return mac_keyed(seal.keyed, tag, key, stem[:NAME_BYTES].encode("ascii"), *parts)


def _check(seal: Seal, signature: bytes, tag: bytes, key: bytes, stem: str, *parts: bytes | memoryview) -> None:
    version = stem[:NAME_BYTES].encode("ascii")
    if compare_digest(signature, mac_keyed(seal.keyed, tag, key, version, *parts)):
        return
    # The two older ways, each still bound to this user's key: HMAC-SHA256 with the store and version, and
    # before that with the key and bytes only. Such an entry is a miss (never loaded), not an attack.
    if verify(seal.store_key, signature, tag, key, version, *parts) or verify(seal.secret, signature, tag, key,
                                                                              *parts):
        raise OldFormat("signed by an older apsi_memory")
    raise _Tampered("signature does not match")


@lru_cache(maxsize=1024)
def _parse_npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...]]:
    """Only ever called on a header whose signature checked out; still refuses object arrays (pickles)."""
    stream = io.BytesIO(header)
    version = npformat.read_magic(stream)
    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    shape, fortran, dtype = read(stream, max_header_size=len(header))  # signed by us: any size is ours
    if fortran or dtype.hasobject:
        raise _Tampered("not a C-order plain-data array")
    return dtype, shape


def to_blob(seal: Seal, key: bytes, stem: str, value: Any, ram_limit: int) -> _Blob:
    """``value`` signed, as the bytes to write; an array the RAM tier (``ram_limit`` bytes) can hold is copied."""
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return _array_blob(seal, key, stem, value, ram_limit)
    try:
        payload = pickle.dumps(value, protocol=5)
    except MemoryError:
        raise  # out of memory, not a property of the value
    except Exception as err:  # a __reduce__ may raise anything: one named error, whatever it was
        raise ArgumentTypeError(f"cannot store a value of type {type(value).__name__}: it cannot be pickled "
                                f"({type(err).__name__}: {err})") from err
    signature = _sign(seal, b"P", key, stem, payload)
    return _Blob(KIND_PICKLE, (payload, signature), len(payload) + SIGNATURE_BYTES, payload, len(payload))


def _array_blob(seal: Seal, key: bytes, stem: str, value: np.ndarray, ram_limit: int) -> _Blob:
    # The RAM tier keeps its own read-only copy, so changing the caller's array later cannot change the cache. A
    # mapped one is not copied here: the store maps the file it writes instead (``datafiles.write_mapped``), which
    # shares the page cache's copy rather than making a second one.
    mapped = value.nbytes >= MMAP_MIN_BYTES
    kept = value.nbytes <= ram_limit and not mapped
    array = np.array(value, order="C", copy=True) if kept else np.ascontiguousarray(value)
    header = npy_header(array.dtype, array.shape)
    data = array.reshape(-1).view(np.uint8).data
    size = len(header) + array.nbytes + SIGNATURE_BYTES
    if mapped:
        kind, signature = KIND_NPY_MAP, _sign(seal, b"M", key, stem, header, str(size).encode())
    else:
        kind, signature = KIND_NPY_READ, _sign(seal, b"N", key, stem, header, data)
    if kept:
        array.flags.writeable = False
    return _Blob(kind, (header, data, signature), size, array if kept else None, array.nbytes)


def decode(seal: Seal, key: bytes, content: bytes, entry: Entry) -> tuple[Any, _Held]:
    """The value in ``content`` (a whole file or inline value, signature last) and what the RAM tier keeps."""
    if len(content) != entry.size or len(content) < SIGNATURE_BYTES:
        raise _Tampered(f"{len(content)} bytes, expected {entry.size}")
    signature = content[-SIGNATURE_BYTES:]
    if entry.kind == KIND_PICKLE:
        payload = content[:-SIGNATURE_BYTES]
        if not compare_digest(signature, _sign(seal, b"P", key, entry.name, payload)):
            _check(seal, signature, b"P", key, entry.name, payload)  # raises: tells an old entry from tampering
        try:
            value = pickle.loads(payload)
        except Exception as err:  # signed by us, so not an attack: a class renamed or a module gone since
            raise Unloadable(f"{type(err).__name__}: {err}") from err
        return value, _Held(payload, entry.kind, len(payload), entry.name)
    body = memoryview(content)[:-SIGNATURE_BYTES]
    if entry.kind != KIND_NPY_READ:
        raise _Tampered(f"unknown kind {entry.kind}")
    header_len = _header_length(content)
    header, data = content[:header_len], body[header_len:]
    _check(seal, signature, b"N", key, entry.name, header, data)
    dtype, shape = _parse_npy_header(header)
    array = np.frombuffer(data, dtype=dtype).reshape(shape)  # a view of the bytes read: read-only
    return array, _Held(array, entry.kind, array.nbytes, entry.name)


def _header_length(prefix: bytes | memoryview) -> int:
    """The length of the ``.npy`` header that ``prefix`` starts with: format 1.0 counts it in two bytes, 2.0 in
    four (``fileio.npy_header`` writes 2.0 only for a header over 64 KiB)."""
    if len(prefix) < 12 or bytes(prefix[:6]) != b"\x93NUMPY":
        raise _Tampered("not a .npy file")
    if prefix[6] == 1:
        return 10 + int.from_bytes(prefix[8:10], "little")
    return 12 + int.from_bytes(prefix[8:12], "little")


def load_mapped(seal: Seal, key: bytes, fd: int, entry: Entry) -> _Held:
    """The memory-mapped array in the open file ``fd``, as the RAM tier keeps it (the caller closes ``fd``)."""
    size = os.fstat(fd).st_size
    if size != entry.size or size < SIGNATURE_BYTES:
        raise _Tampered(f"{size} bytes, expected {entry.size}")
    prefix = os.pread(fd, 4096, 0)
    header_len = _header_length(prefix)
    header = prefix[:header_len] if header_len <= len(prefix) else os.pread(fd, header_len, 0)
    signature = os.pread(fd, SIGNATURE_BYTES, size - SIGNATURE_BYTES)
    _check(seal, signature, b"M", key, entry.name, header, str(size).encode())
    dtype, shape = _parse_npy_header(header)
    if header_len + dtype.itemsize * int(np.prod(shape)) + SIGNATURE_BYTES != size:
        raise _Tampered("length does not match its header")
    return held_mapping(fd, size, header, entry.name)


def held_mapping(fd: int, size: int, header: bytes, name: str) -> _Held:
    """What the RAM tier keeps of the ``.npy`` file ``fd`` (``size`` bytes, starting with ``header``): its array
    mapped read-only (shared with the page cache), and the file's identity for the private maps handed out."""
    dtype, shape = _parse_npy_header(header)
    mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    array = np.ndarray(shape, dtype=dtype, buffer=mapping, offset=len(header))  # read-only: the mapping is
    stat = os.fstat(fd)
    return _Held(array, KIND_NPY_MAP, array.nbytes, name, (stat.st_dev, stat.st_ino))


def private_map(held: _Held, fd: int) -> np.ndarray | None:
    """``held``'s mapped array again, mapped copy-on-write from ``fd``, its file: writable, and what the caller
    writes stays in its own pages (the file, and every other reader's array, never change). ``None`` when ``fd``
    is not the file ``held`` maps (replaced or truncated since)."""
    stat = os.fstat(fd)
    array: np.ndarray = held.value
    offset = stat.st_size - SIGNATURE_BYTES - array.nbytes  # the header's length: the data follows it
    if (stat.st_dev, stat.st_ino) != held.file or offset < 0:
        return None
    mapping = mmap.mmap(fd, stat.st_size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return np.ndarray(array.shape, dtype=array.dtype, buffer=mapping, offset=offset)
