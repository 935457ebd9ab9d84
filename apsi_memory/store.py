"""``memory.store``: a key-value cache with a RAM tier and an SSD tier, safe to share between processes.

Theory of operation
-------------------
A store is a folder::

    index             append-only journal: what the store holds, and small values themselves
    lock              ``flock`` target; never replaced, so every process locks the same inode
    data/<token>.npy  an array of more than 16 KiB as a standard .npy file + HMAC trailer (np.load reads it)
    data/<token>.pkl  a pickled value of more than 16 KiB + HMAC-SHA256 trailer

Values up to 16 KiB (pickled, or a small array in .npy form) are written *inside* their journal record: creating
a file costs 25-500 us on this machine's busy ext4, an append about 1 us, and that is what keeps ``set`` well
under the 0.07 ms target. Every value, inline or not, is signed with this user's key (``signing.py``).

*Visibility is atomic*: a bigger value goes to a fresh file under a random name (``O_EXCL``, never overwritten)
and only then does one journal record name it; a small one is part of its record. Records carry their length and
a CRC, so one a killed writer left half-written is recognised and cut off by the next writer, and a file no record
names is an orphan nobody reads (swept later). An entry reads back whole or not at all.

*Sizes are running totals*: the journal replays into an in-memory LRU index (``_Index``) holding each entry's
size, so ``set`` never lists the folder and costs the same at 100 or 100,000 entries. Replaying on open also
restores recency without unpickling anything: reads are remembered and written as one ``T`` record with the next
write (or every 512 reads, or at exit), so a read costs no disk write.

*Compaction*: replaced and deleted inline values stay in the journal as dead bytes until they outweigh the live
ones (or the store is over its limit on disk); then the journal is rewritten with the live entries only, and a
counter in the lock file (the epoch) sends every process still reading the old file to the new one.

*Several processes*: writers hold an exclusive ``flock`` on ``lock`` while they read the records others appended
since their last look and append their own, then bump a counter kept in the (memory-mapped) lock file.
``fcntl.flock`` is used rather than the ``filelock`` package: it is stdlib, costs ~1 us a lock/unlock pair here,
and the kernel drops it when a holder dies (a SIGKILLed writer never leaves a stale lock file behind, which
lock-file schemes must detect by timeouts). A flock belongs to an open file, so a child forked with an open store
reopens the lock file (``os.register_at_fork``). Readers take no lock: they compare the shared counter (a memory
read, not a syscall) and parse only complete records; a value file is never changed once named, so nothing
half-written is ever read. A file another process removed (evicted, replaced) reads as a miss.

*Tampering*: pickles are loaded only after their signature (over the key and the bytes) checks out; a mismatch
means the file was changed outside the library, truncated, swapped with another entry's, or signed with another
user's key: it reads as a miss, is removed and a ``TamperWarning`` names it. Arrays are never unpickled. Small
arrays (read whole) are signed over their bytes; big ones come back memory-mapped, so hashing them on every read
would defeat the mapping: their signature covers the key, the .npy header and the length (a swapped or
truncated file is caught; an in-place edit of the numbers in a big array is not, and cannot run code).

Durability: files are not fsynced (a crashed *process* loses nothing, the page cache survives it; a power loss may
lose recent entries, and the CRC'd journal then drops whatever it cannot read back whole).
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
import pickle
import shutil
import struct
import threading
import time
import warnings
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from itertools import accumulate
from typing import Any, NamedTuple

import numpy as np
import numpy.lib.format as npformat

from . import reactions
from .api import current_level
from .decide import Level, eviction_target, ram_tier_limit
from .errors import CorruptFileError, DiskFullError, SizeError, TamperWarning
from .paths import display, private_dir, store_dir
from .signing import SIGNATURE_BYTES, sign, user_key, verify
from .units import GiB, MiB, fmt_mb

Key = str | int | bytes

DEFAULT_RAM_MB = 256.0
DEFAULT_DISK_GB = 10.0
# Arrays at least this big come back memory-mapped; below it reading the file whole is cheaper than a mapping.
MMAP_MIN_BYTES = 128 * 1024
# Reads are remembered in memory and written to the journal in batches (with the next write, or at this many).
TOUCH_BATCH = 512
# Values up to this size live inside the journal itself: one append instead of a new file per entry (creating a
# file costs 25-500 us on a busy ext4, an append ~1 us). Bigger ones get a file of their own.
INLINE_MAX_BYTES = 16 * 1024
# The journal is rewritten without its dead bytes once they exceed the live inline values and this much.
COMPACT_MIN_BYTES = 4 * MiB
READ_CHUNK = 64 * MiB
# Files no record points to (a writer killed mid-set) are removed at compaction once this old; younger ones may
# belong to a set in progress in another process.
ORPHAN_AGE_S = 60.0

_MAGIC = b"APSISTORE1\n"


# -- keys (pure) ---------------------------------------------------------------------------------------------------

def encode_key(key: Key) -> bytes:
    """A type tag and the key's bytes: ``1``, ``"1"`` and ``b"1"`` are three keys. Never used as a file name."""
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + str(key).encode("ascii")
    raise TypeError(f"store keys are str, int or bytes, not {type(key).__name__}")


def decode_key(encoded: bytes) -> Key:
    tag, body = encoded[:1], encoded[1:]
    if tag == b"s":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"b":
        return body
    return int(body)


# -- journal records (pure) ----------------------------------------------------------------------------------------

KIND_PICKLE, KIND_NPY_READ, KIND_NPY_MAP = 0, 1, 2
_EXT = {KIND_PICKLE: ".pkl", KIND_NPY_READ: ".npy", KIND_NPY_MAP: ".npy"}
NAME_BYTES = 16
_COUNTERS = struct.Struct("<QQ")  # in the lock file: appends so far (generation), compactions so far (epoch)
_GENERATION_BYTES = 8
_FRAME = struct.Struct("<III")  # meta length, inline value length, crc32(meta)
_SET = struct.Struct("<BQ")  # kind, size
OP_SET, OP_DEL, OP_TOUCH, OP_CLEAR = b"S", b"D", b"T", b"C"
OP_RESET = b"R"  # never written: what a reader sees when the journal it held was compacted away
_OPS = (OP_SET, OP_DEL, OP_TOUCH, OP_CLEAR)


class Entry(NamedTuple):
    name: str  # identity of this value; for a file entry also its name under data/
    kind: int
    size: int  # bytes on disk: the file, or the value inside the journal
    offset: int = -1  # where an inline value starts in the journal; -1: it has its own file

    @property
    def inline(self) -> bool:
        return self.offset >= 0


class Record(NamedTuple):
    op: bytes
    key: bytes = b""
    entry: Entry | None = None
    value: bytes = b""  # an inline value being appended (signed bytes, signature last)


def pack_record(record: Record) -> bytes:
    if record.op == OP_SET:
        entry = record.entry
        assert entry is not None
        meta = OP_SET + _SET.pack(entry.kind, entry.size) + entry.name[:NAME_BYTES].encode("ascii") + record.key
    else:
        meta = record.op + record.key
    return _FRAME.pack(len(meta), len(record.value), zlib.crc32(meta)) + meta + record.value


_KEY_LENGTH = struct.Struct("<I")


def pack_keys(keys: list[bytes]) -> bytes:
    return b"".join(_KEY_LENGTH.pack(len(key)) + key for key in keys)


def unpack_keys(packed: bytes) -> Iterator[bytes]:
    pos = 0
    while pos + _KEY_LENGTH.size <= len(packed):
        (length,) = _KEY_LENGTH.unpack_from(packed, pos)
        pos += _KEY_LENGTH.size
        yield packed[pos:pos + length]
        pos += length


def record_length(buf: bytes, pos: int = 0) -> int | None:
    """Bytes the record at ``pos`` claims to take, or ``None`` if not even its frame is there."""
    if pos + _FRAME.size > len(buf):
        return None
    meta_len, value_len, _ = _FRAME.unpack_from(buf, pos)
    return int(_FRAME.size + meta_len + value_len)


def _record_at(buf: bytes, pos: int, base: int) -> Record | None:
    """The intact record at ``pos``, or ``None`` (incomplete or damaged)."""
    length = record_length(buf, pos)
    if length is None or pos + length > len(buf):
        return None
    meta_len, value_len, crc = _FRAME.unpack_from(buf, pos)
    meta = buf[pos + _FRAME.size:pos + _FRAME.size + meta_len]
    if meta_len == 0 or meta[:1] not in _OPS or zlib.crc32(meta) != crc:
        return None
    return _record_from(meta, value_len, base + pos + _FRAME.size + meta_len)


def parse_records(buf: bytes, base: int = 0, final: bool = False) -> tuple[list[Record], int,
                                                                          list[tuple[int, int]]]:
    """The intact records in ``buf`` (which starts at journal offset ``base``), the bytes they use, and damaged
    spans that were skipped. A bad record followed by good ones is damage (skipped, reported); one with nothing
    intact after it is the tail: being appended right now, or cut short by a crash, so parsing stops there.

    A record that runs past the end of ``buf`` is an incomplete tail too, unless ``final`` (the caller holds the
    lock and ``buf`` reaches the end of the file, so nobody is appending): then intact records after it mean its
    length field was damaged, and parsing resumes at them (a writer never appends after a torn record)."""
    records: list[Record] = []
    damaged: list[tuple[int, int]] = []
    pos = 0
    while pos < len(buf):
        length = record_length(buf, pos)
        if length is None or pos + length > len(buf):
            resync = _next_intact(buf, pos, None, base) if final else None
            if resync is None:
                break  # incomplete: the tail
            damaged.append((base + pos, base + resync))
            pos = resync
            continue
        record = _record_at(buf, pos, base)
        if record is None:
            resync = _next_intact(buf, pos, length, base)
            if resync is None:
                break
            damaged.append((base + pos, base + resync))
            pos = resync
            continue
        records.append(record)
        pos += length
    return records, pos, damaged


RESYNC_WINDOW = 1 * MiB  # past this much garbage, the rest is treated as a torn tail


def _next_intact(buf: bytes, bad: int, length: int | None, base: int) -> int | None:
    """Where intact records resume after the damaged one at ``bad``: where its own length says (damage in its
    content), else the first intact record within ``RESYNC_WINDOW`` (damage in its length field)."""
    if length is not None and bad + length < len(buf) and _record_at(buf, bad + length, base) is not None:
        return bad + length
    for pos in range(bad + 1, min(len(buf), bad + RESYNC_WINDOW) - _FRAME.size + 1):
        if _record_at(buf, pos, base) is not None:
            return pos
    return None


def _record_from(meta: bytes, value_len: int, value_at: int) -> Record:
    op = meta[:1]
    if op != OP_SET:
        return Record(op, meta[1:])
    kind, size = _SET.unpack_from(meta, 1)
    name_at = 1 + _SET.size
    stem = meta[name_at:name_at + NAME_BYTES].decode("ascii", "replace")
    key = meta[name_at + NAME_BYTES:]
    if value_len:
        return Record(op, key, Entry(stem, kind, value_len, value_at))
    return Record(op, key, Entry(stem + _EXT.get(kind, ".bad"), kind, size))


# -- the SSD tier's index (pure) -----------------------------------------------------------------------------------

class _Index:
    """Every entry on the SSD in recency order (least recent first), with running totals of their sizes."""

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.total = 0
        self.inline_total = 0  # the part of ``total`` that lives inside the journal

    def _count(self, entry: Entry, sign_: int) -> None:
        self.total += sign_ * entry.size
        if entry.inline:
            self.inline_total += sign_ * entry.size

    def put(self, key: bytes, entry: Entry) -> Entry | None:
        old = self.remove(key)
        self.entries[key] = entry
        self._count(entry, 1)
        return old

    def remove(self, key: bytes) -> Entry | None:
        old = self.entries.pop(key, None)
        if old is not None:
            self._count(old, -1)
        return old

    def touch(self, key: bytes) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)

    def clear(self) -> None:
        self.entries.clear()
        self.total = self.inline_total = 0

    def apply(self, record: Record) -> None:
        if record.op == OP_SET and record.entry is not None:
            self.put(record.key, record.entry)
        elif record.op == OP_DEL:
            self.remove(record.key)
        elif record.op == OP_TOUCH:
            for key in unpack_keys(record.key):
                self.touch(key)
        elif record.op in (OP_CLEAR, OP_RESET):
            self.clear()

    def evict_to(self, limit: int, keep: bytes) -> list[tuple[bytes, Entry]]:
        """Over ``limit``: remove the least recently used entries (never ``keep``) down to 90 % of it."""
        if self.total <= limit:
            return []
        target = eviction_target(limit)
        victims: list[tuple[bytes, Entry]] = []
        for key, entry in list(self.entries.items()):
            if self.total <= target:
                break
            if key != keep:
                self.remove(key)
                victims.append((key, entry))
        return victims


# -- the RAM tier (pure) -------------------------------------------------------------------------------------------

class _Held(NamedTuple):
    value: Any  # pickled bytes (unpickled on every get, so callers never share a mutable object) or a read-only array
    kind: int
    nbytes: int
    name: str  # the SSD file it mirrors: a different name in the index means another process replaced it


class _RamTier:
    """Least recently used values first out, bounded by ``limit`` bytes of measured size, with a running total."""

    def __init__(self, limit: int) -> None:
        self.values: OrderedDict[bytes, _Held] = OrderedDict()
        self.total = 0
        self.limit = limit

    def get(self, key: bytes) -> _Held | None:
        held = self.values.get(key)
        if held is not None:
            self.values.move_to_end(key)
        return held

    def put(self, key: bytes, held: _Held) -> None:
        self.drop(key)
        if held.nbytes > self.limit:
            return
        self.values[key] = held
        self.total += held.nbytes
        self.shrink_to(self.limit)

    def drop(self, key: bytes) -> None:
        held = self.values.pop(key, None)
        if held is not None:
            self.total -= held.nbytes

    def shrink_to(self, limit: int) -> None:
        while self.total > limit:
            _, held = self.values.popitem(last=False)
            self.total -= held.nbytes

    def clear(self) -> None:
        self.values.clear()
        self.total = 0


# -- values to bytes and back --------------------------------------------------------------------------------------

class _Blob(NamedTuple):
    kind: int
    parts: tuple[bytes | memoryview, ...]  # what goes on disk, signature last
    size: int
    ram_value: Any  # what the RAM tier keeps, or None when it would not fit there anyway
    ram_nbytes: int


@lru_cache(maxsize=1024)
def _npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    descr = npformat.dtype_to_descr(dtype)  # a list for structured dtypes: hence the cache keys on the dtype
    npformat.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


@lru_cache(maxsize=1024)
def _parse_npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...]]:
    """Only ever called on a header whose signature checked out; still refuses object arrays (pickles)."""
    stream = io.BytesIO(header)
    npformat.read_magic(stream)
    shape, fortran, dtype = npformat.read_array_header_1_0(stream)
    if fortran or dtype.hasobject:
        raise _Tampered("not a C-order plain-data array")
    return dtype, shape


def _to_blob(secret: bytes, key: bytes, value: Any, keep_in_ram: Callable[[int], bool]) -> _Blob:
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return _array_blob(secret, key, value, keep_in_ram)
    try:
        payload = pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise TypeError(f"cannot store a value of type {type(value).__name__}: it cannot be pickled ({err})") from err
    signature = sign(secret, b"P", key, payload)
    return _Blob(KIND_PICKLE, (payload, signature), len(payload) + SIGNATURE_BYTES, payload, len(payload))


def _array_blob(secret: bytes, key: bytes, value: np.ndarray, keep_in_ram: Callable[[int], bool]) -> _Blob:
    # The RAM tier keeps its own read-only copy, so changing the caller's array later cannot change the cache.
    kept = keep_in_ram(value.nbytes)
    array = np.array(value, order="C", copy=True) if kept else np.ascontiguousarray(value)
    header = _npy_header(array.dtype, array.shape)
    data = array.reshape(-1).view(np.uint8).data
    size = len(header) + array.nbytes + SIGNATURE_BYTES
    if array.nbytes >= MMAP_MIN_BYTES:
        kind, signature = KIND_NPY_MAP, sign(secret, b"M", key, header, str(size).encode())
    else:
        kind, signature = KIND_NPY_READ, sign(secret, b"N", key, header, data)
    if kept:
        array.flags.writeable = False
    return _Blob(kind, (header, data, signature), size, array if kept else None, array.nbytes)


class _Tampered(Exception):
    """A value that failed its checks; the store forgets it, removes its file and warns."""


def _decode(secret: bytes, key: bytes, content: bytes, entry: Entry) -> tuple[Any, _Held]:
    """The value in ``content`` (a whole file or inline value, signature last) and what the RAM tier keeps."""
    if len(content) != entry.size or len(content) < SIGNATURE_BYTES:
        raise _Tampered(f"{len(content)} bytes, expected {entry.size}")
    signature = content[-SIGNATURE_BYTES:]
    if entry.kind == KIND_PICKLE:
        payload = content[:-SIGNATURE_BYTES]
        if not verify(secret, signature, b"P", key, payload):
            raise _Tampered("signature does not match")
        return pickle.loads(payload), _Held(payload, entry.kind, len(payload), entry.name)
    body = memoryview(content)[:-SIGNATURE_BYTES]
    if entry.kind != KIND_NPY_READ:
        raise _Tampered(f"unknown kind {entry.kind}")
    header_len = _header_length(content)
    header, data = content[:header_len], body[header_len:]
    if not verify(secret, signature, b"N", key, header, data):
        raise _Tampered("signature does not match")
    dtype, shape = _parse_npy_header(header)
    array = np.frombuffer(data, dtype=dtype).reshape(shape)  # a view of the bytes read: read-only
    return array, _Held(array, entry.kind, array.nbytes, entry.name)


def _header_length(prefix: bytes | memoryview) -> int:
    if len(prefix) < 10 or bytes(prefix[:6]) != b"\x93NUMPY":
        raise _Tampered("not a .npy file")
    return 10 + int.from_bytes(prefix[8:10], "little")


def _load_mapped(secret: bytes, key: bytes, path: str, entry: Entry) -> tuple[np.ndarray, _Held]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != entry.size:
            raise _Tampered(f"{size} bytes, expected {entry.size}")
        prefix = os.pread(fd, 4096, 0)
        header_len = _header_length(prefix)
        header = prefix[:header_len] if header_len <= len(prefix) else os.pread(fd, header_len, 0)
        signature = os.pread(fd, SIGNATURE_BYTES, size - SIGNATURE_BYTES)
        if not verify(secret, signature, b"M", key, header, str(size).encode()):
            raise _Tampered("signature does not match")
        dtype, shape = _parse_npy_header(header)
        if header_len + dtype.itemsize * int(np.prod(shape)) + SIGNATURE_BYTES != size:
            raise _Tampered("length does not match its header")
        mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    array = np.ndarray(shape, dtype=dtype, buffer=mapping, offset=header_len)  # read-only: the mapping is
    return array, _Held(array, entry.kind, array.nbytes, entry.name)


# -- thin OS layer -------------------------------------------------------------------------------------------------

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _write_new(path: str, parts: tuple[bytes | memoryview, ...]) -> None:
    """Write a file that must not exist yet; on any failure nothing is left behind. A full disk is a DiskFullError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for part in parts:
            _write_all(fd, part)
    except BaseException as err:
        os.close(fd)
        _unlink_quietly(path)
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            raise _disk_full(os.path.dirname(path), sum(len(p) for p in parts)) from err
        raise
    os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pwrite_all(fd: int, data: bytes, folder: str) -> None:
    try:
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.ENOSPC, "short write")
    except OSError as err:
        if err.errno in _NO_SPACE:
            raise _disk_full(folder, len(data)) from err
        raise


def _disk_full(folder: str, needed: int) -> DiskFullError:
    free = shutil.disk_usage(folder).free
    return DiskFullError(errno.ENOSPC, f"no space left in {display(folder)} for a {fmt_mb(needed)} store entry "
                                       f"({fmt_mb(free)} free); the store is unchanged")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Journal:
    """The ``index`` file: how far this process has read it (``offset``) and the lock that serialises writers.

    The lock file also holds two counters, memory-mapped by every process: ``generation`` (appends so far) and
    ``epoch`` (compactions so far). A reader compares them (a memory read) instead of asking the kernel for the
    journal's size (a syscall) on every get; a changed epoch means the journal was replaced: reopen it."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "index")
        self.lock_path = os.path.join(folder, "lock")
        self.lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        _open_journals.add(self)
        self.holding = False  # this handle holds the lock: read everything, trust no shortcut
        self.fd = -1
        self.offset = 0
        self.end_seen = 0  # the journal's size at the last read_new
        self.epoch = -1
        self.seen = b""  # the generation counter at the last read_new
        self.pending_touches: list[bytes] = []
        with self.locked():
            if os.fstat(self.lock_fd).st_size < _COUNTERS.size:
                # Written, not ftruncated: the block is allocated now, so a later write through the mapping can
                # never meet a full disk (which would be a SIGBUS, not an error).
                _pwrite_all(self.lock_fd, bytes(_COUNTERS.size), os.path.dirname(self.path))
            self.counters = mmap.mmap(self.lock_fd, _COUNTERS.size)
            self._open()

    @contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def changed(self) -> bool:
        """Whether anyone may have appended since this handle last read (always, while holding the lock)."""
        return self.holding or self.counters[:_GENERATION_BYTES] != self.seen

    def _bump(self, epoch_step: int = 0) -> None:
        """After an append (or a step of a compaction), under the lock."""
        generation, epoch = _COUNTERS.unpack_from(self.counters)
        _COUNTERS.pack_into(self.counters, 0, generation + 1, epoch + epoch_step)

    def _open(self) -> None:
        """Open and check the magic, writing it if the file is new (callers hold the lock then). The epoch is read
        first: a compaction in between makes the next look reopen again, never miss the switch."""
        self.epoch = _COUNTERS.unpack_from(self.counters)[1]
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        head = os.pread(fd, len(_MAGIC), 0)
        if not head:
            os.write(fd, _MAGIC)
        elif head != _MAGIC:
            os.close(fd)
            raise CorruptFileError(self.path, "not an apsi_memory store index (wrong magic)")
        self.fd, self.offset = fd, len(_MAGIC)
        self.damaged = False  # damaged records were skipped: the next writer rewrites the journal without them

    def reopen(self) -> None:
        os.close(self.fd)
        self._open()

    def read_new(self) -> list[Record]:
        """Records appended since the last look; after a compaction, ``RESET`` and the whole new journal."""
        self.seen = self.counters[:_GENERATION_BYTES]  # before reading: a later bump makes the next look read
        epoch = _COUNTERS.unpack_from(self.counters)[1]
        if epoch % 2 and self.holding:
            self._finish_compaction()
            epoch += 1
        if epoch != self.epoch:
            self.reopen()
            return [Record(OP_RESET)] + self.read_new()
        records: list[Record] = []
        size = self.end_seen = os.fstat(self.fd).st_size
        while self.offset < size:
            buf = os.pread(self.fd, min(size - self.offset, READ_CHUNK), self.offset)
            needed = record_length(buf)
            if needed is not None and needed > len(buf) and self.offset + needed <= size:
                buf = os.pread(self.fd, needed, self.offset)  # one record longer than a chunk (a huge key)
            final = self.holding and self.offset + len(buf) == size
            found, used, damaged = parse_records(buf, self.offset, final)
            for start, end in damaged:
                self.damaged = True
                warnings.warn(TamperWarning(f"{self.path}: bytes {start}-{end} are damaged and were skipped; "
                                            "entries recorded there read as misses"), stacklevel=5)
            self.offset += used
            records += found
            if not used:
                break  # the tail is being appended right now, or was cut short by a crash
        return records

    def append(self, records: list[Record]) -> list[int]:
        """Append under the lock, after ``read_new``: cuts off a torn tail a killed writer left, then writes all
        records with one ``write``. Returns where each record's inline value starts. On failure the journal is as
        it was."""
        if self.end_seen > self.offset:
            os.ftruncate(self.fd, self.offset)
        packed = [pack_record(r) for r in records]
        ends = list(accumulate(len(p) for p in packed))
        data = b"".join(packed)
        try:
            written = os.write(self.fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as err:
            os.ftruncate(self.fd, self.offset)
            if err.errno in _NO_SPACE:
                raise _disk_full(os.path.dirname(self.path), len(data)) from err
            raise
        starts = [self.offset + end - len(r.value) for end, r in zip(ends, records)]
        self.offset = self.end_seen = self.offset + len(data)
        self._bump()
        self.seen = self.counters[:_GENERATION_BYTES]  # this handle was caught up before it appended
        return starts

    def take_touches(self) -> list[Record]:
        """The reads remembered since the last write, as one record (recency for the other processes)."""
        keys, self.pending_touches = self.pending_touches, []
        return [Record(OP_TOUCH, pack_keys(keys))] if keys else []

    def replace(self, entries: list[tuple[bytes, Entry]]) -> None:
        """Compaction, under the lock: one SET per live entry (inline values copied) goes to a temp file that
        replaces ``index``; the epoch then sends every reader, this one included, to the new file."""
        temp = f"{self.path}.{os.urandom(6).hex()}.tmp"
        batch: list[bytes] = [_MAGIC]
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for key, entry in entries:
                value = os.pread(self.fd, entry.size, entry.offset) if entry.inline else b""
                batch.append(pack_record(Record(OP_SET, key, entry, value)))
                if len(batch) >= 4096:
                    _write_all(fd, b"".join(batch))
                    batch = []
            _write_all(fd, b"".join(batch))
        except BaseException as err:
            os.close(fd)
            _unlink_quietly(temp)
            if isinstance(err, OSError) and err.errno in _NO_SPACE:
                raise _disk_full(os.path.dirname(self.path), 0) from err
            raise
        os.close(fd)
        # The epoch is odd while the switch is under way, so a writer killed between the two steps is noticed by
        # the next lock holder (``_finish_compaction``), whichever file ``index`` then is.
        self._bump(epoch_step=1)
        os.replace(temp, self.path)
        self._bump(epoch_step=1)

    def _finish_compaction(self) -> None:
        """Under the lock, an odd epoch: a compacting writer died mid-way. Whichever file is ``index`` now is
        whole (``os.replace`` is atomic), so make the epoch even again and drop the temp file it may have left."""
        self._bump(epoch_step=1)
        folder = os.path.dirname(self.path)
        for name in os.listdir(folder):
            if name.startswith("index.") and name.endswith(".tmp"):
                _unlink_quietly(os.path.join(folder, name))

    def after_fork(self) -> None:
        """``flock`` belongs to an open file, which a forked child shares with its parent: without a file of its
        own the child's lock would not exclude the parent's."""
        if self.fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)

    def close(self) -> None:
        """Write remembered reads (so recency survives a restart), then close. Safe to call twice; runs at exit."""
        if self.fd < 0:
            return
        try:
            if self.pending_touches:
                with self.locked():
                    self.read_new()
                    self.append(self.take_touches())
        except OSError:
            pass  # recency is a hint: a full disk or a store folder removed meanwhile loses no value
        finally:
            os.close(self.fd)
            os.close(self.lock_fd)
            self.counters.close()
            self.fd = -1


_open_journals: weakref.WeakSet[_Journal] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for journal in list(_open_journals):
        journal.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- where stores may live -----------------------------------------------------------------------------------------

_allowed: set[str] = set()
_allowed_lock = threading.Lock()


def allow_write(path: str | os.PathLike[str]) -> None:
    """Allow stores (and other writes) at ``path`` and below it, as Apsi's ``--allow-write`` does."""
    with _allowed_lock:
        _allowed.add(os.path.realpath(os.path.expanduser(os.fspath(path))))


def _allowed_roots() -> list[str]:
    from_env = [p for p in os.environ.get("APSI_ALLOW_WRITE", "").split(os.pathsep) if p]
    with _allowed_lock:
        return list(_allowed) + [os.path.realpath(os.path.expanduser(p)) for p in from_env]


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_folder(name_or_path: str | os.PathLike[str]) -> str:
    """A plain name is a folder under ``store_dir()``; anything with a path separator (or ``~``, ``.``) is a
    path the caller chose, allowed only under ``allow_write``/``APSI_ALLOW_WRITE`` roots."""
    text = os.fspath(name_or_path)
    if not text or text in (".", ".."):
        raise ValueError(f"store name {text!r} is empty or not a name; use e.g. 'embeddings'")
    if os.sep not in text and not text.startswith(("~", ".")) and (os.altsep is None or os.altsep not in text):
        return os.path.join(store_dir(), text)
    folder = os.path.realpath(os.path.expanduser(text))
    roots = [os.path.realpath(store_dir())] + _allowed_roots()
    if not any(_is_within(folder, root) for root in roots):
        raise PermissionError(
            f"store path {folder} is outside {display(store_dir())} and not allowed for writing; allow it with "
            f"memory.allow_write({folder!r}) in Python, or APSI_ALLOW_WRITE={folder} in the environment")
    return folder


# -- the store -----------------------------------------------------------------------------------------------------

_MISSING = object()


def _size_bytes(value: float, unit: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise SizeError(f"{what} must be a finite number of at least 0, not {value!r}")
    return int(value * unit)


class Store:
    """A two-tier cache in ``folder``. Use ``memory.store(name_or_path, ram_mb=..., disk_gb=...)``."""

    def __init__(self, folder: str, label: str, ram_bytes: int, disk_bytes: int,
                 level: Callable[[], Level] | None = None) -> None:
        self.folder = folder
        self.label = label
        self.ram_asked = ram_bytes
        self.disk_limit = disk_bytes
        self._level = level or current_level
        self._secret = user_key()
        self._data = private_dir(os.path.join(private_dir(folder), "data"))
        self._lock = threading.RLock()
        self._index = _Index()
        self._ram = _RamTier(ram_tier_limit(ram_bytes, self._level()))
        self._journal = _Journal(folder)
        self._closer = weakref.finalize(self, self._journal.close)
        with self._lock, self._journal.locked():
            self._catch_up()
            self._unlink(self._evict_over_limit(keep=b""))
            self._compact_if_due()
        reactions.register(self)

    # -- reading --

    def get(self, key: Key, default: Any = None) -> Any:
        encoded = encode_key(key)
        with self._lock:
            self._catch_up()
            held = self._ram.get(encoded)
            if held is not None:
                self._touch(encoded)
                return pickle.loads(held.value) if held.kind == KIND_PICKLE else held.value
            return self._get_from_disk(encoded, default)

    def _get_from_disk(self, key: bytes, default: Any) -> Any:
        for _ in range(2):  # a second look if another process replaced or evicted the file meanwhile
            entry = self._index.entries.get(key)
            if entry is None:
                return default
            try:
                value, held = self._load(key, entry)
            except FileNotFoundError:
                self._catch_up()
                if self._index.entries.get(key) == entry:
                    self._forget(key, entry, why=None)
                    return default
                continue
            except (_Tampered, ValueError, pickle.UnpicklingError) as err:
                self._forget(key, entry, why=str(err))
                return default
            self._ram.put(key, held)
            self._touch(key)
            return value
        return default

    def _load(self, key: bytes, entry: Entry) -> tuple[Any, _Held]:
        if entry.kind == KIND_NPY_MAP:
            return _load_mapped(self._secret, key, self._where(entry), entry)
        if entry.inline:
            content = os.pread(self._journal.fd, entry.size, entry.offset)
        else:
            with open(self._where(entry), "rb") as f:
                content = f.read()
        return _decode(self._secret, key, content, entry)

    def _where(self, entry: Entry) -> str:
        return self._journal.path if entry.inline else os.path.join(self._data, entry.name)

    def _forget(self, key: bytes, entry: Entry, why: str | None) -> None:
        """Drop an entry whose file is gone or failed its checks, for every process (a DEL record)."""
        if why is not None:
            warnings.warn(TamperWarning(
                f"{self._where(entry)}: entry {decode_key(key)!r}: {why} (changed outside apsi_memory, truncated, "
                "or written by another user); removed unread"), stacklevel=4)
        with self._journal.locked():
            self._catch_up()
            if self._index.entries.get(key) == entry:
                self._append([Record(OP_DEL, key)])
                self._index.remove(key)
        self._unlink([entry])

    def __getitem__(self, key: Key) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        encoded = encode_key(key)  # type: ignore[arg-type]
        with self._lock:
            self._catch_up()
            return encoded in self._index.entries

    def __len__(self) -> int:
        with self._lock:
            self._catch_up()
            return len(self._index.entries)

    def __iter__(self) -> Iterator[Key]:
        """Keys, least recently used first (a snapshot: changing the store while iterating is fine)."""
        with self._lock:
            self._catch_up()
            keys = list(self._index.entries)
        return (decode_key(k) for k in keys)

    def keys(self) -> list[Key]:
        return list(self)

    # -- writing --

    def set(self, key: Key, value: Any) -> None:
        encoded = encode_key(key)
        self._level()  # an allocation path: lets a pressure change reach on_level (cheap, rate-limited)
        blob = _to_blob(self._secret, encoded, value, lambda n: n <= self._ram.limit)
        if blob.size > self.disk_limit:
            raise SizeError(f"a {fmt_mb(blob.size)} value does not fit this store's SSD tier "
                            f"({fmt_mb(self.disk_limit)}); nothing was stored")
        stem = os.urandom(NAME_BYTES // 2).hex()
        inline = blob.kind != KIND_NPY_MAP and blob.size <= INLINE_MAX_BYTES
        entry = Entry(stem if inline else stem + _EXT[blob.kind], blob.kind, blob.size)
        if not inline:
            _write_new(self._where(entry), blob.parts)  # outside the lock: nobody sees it before its record
        try:
            with self._lock:
                garbage = self._record_set(encoded, entry, b"".join(blob.parts) if inline else b"")
                if blob.ram_value is not None:
                    self._ram.put(encoded, _Held(blob.ram_value, blob.kind, blob.ram_nbytes, entry.name))
        except BaseException:
            if not inline:
                _unlink_quietly(self._where(entry))
            raise
        self._unlink(garbage)

    def _record_set(self, key: bytes, entry: Entry, value: bytes) -> list[Entry]:
        """Index the new value for everyone; returns the entries it made garbage (the old value, evicted ones)."""
        with self._journal.locked():
            self._catch_up()
            records = self._journal.take_touches() + [Record(OP_SET, key, entry, value)]
            value_at = self._append(records)[-1]
            if value:
                entry = Entry(entry.name, entry.kind, entry.size, value_at)
            old = self._index.put(key, entry)
            self._ram.drop(key)
            garbage = self._evict_over_limit(keep=key) + ([old] if old is not None else [])
            self._compact_if_due()
        return garbage

    def _append(self, records: list[Record]) -> list[int]:
        try:
            return self._journal.append(records)
        except BaseException:
            self._reload()  # the in-memory index may be ahead of the journal; the journal is the truth
            raise

    def _evict_over_limit(self, keep: bytes) -> list[Entry]:
        victims = self._index.evict_to(self.disk_limit, keep)
        if victims:
            for key, _ in victims:
                self._ram.drop(key)
            self._append([Record(OP_DEL, key) for key, _ in victims])
        return [entry for _, entry in victims]

    def _unlink(self, entries: list[Entry]) -> None:
        """Remove the files of entries no record points to any more (inline ones go at the next compaction)."""
        for entry in entries:
            if not entry.inline:
                _unlink_quietly(os.path.join(self._data, entry.name))

    def __setitem__(self, key: Key, value: Any) -> None:
        self.set(key, value)

    def delete(self, key: Key) -> bool:
        """Remove ``key`` from both tiers; ``False`` if it was not there."""
        encoded = encode_key(key)
        with self._lock, self._journal.locked():
            self._catch_up()
            if encoded not in self._index.entries:
                return False
            self._append(self._journal.take_touches() + [Record(OP_DEL, encoded)])
            entry = self._index.remove(encoded)
            self._ram.drop(encoded)
        self._unlink([entry] if entry is not None else [])
        return True

    def __delitem__(self, key: Key) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def clear(self) -> None:
        """Remove every entry, from both tiers and the SSD."""
        with self._lock, self._journal.locked():
            self._catch_up()
            self._journal.take_touches()
            self._append([Record(OP_CLEAR)])
            gone = list(self._index.entries.values())
            self._index.clear()
            self._ram.clear()
            self._compact_if_due(force=True)
        self._unlink(gone)

    # -- keeping in step with the journal --

    def _catch_up(self) -> None:
        if not self._journal.changed():
            return
        reset = False
        for record in self._journal.read_new():
            self._index.apply(record)
            if record.op == OP_CLEAR:
                self._ram.clear()
            elif record.op == OP_RESET:
                reset = True
            elif record.op in (OP_SET, OP_DEL):
                held = self._ram.values.get(record.key)
                if held is not None and (record.entry is None or record.entry.name != held.name):
                    self._ram.drop(record.key)  # another process replaced or removed it
        if reset:  # compacted: keep the RAM values whose entry survived unchanged
            for key, held in list(self._ram.values.items()):
                entry = self._index.entries.get(key)
                if entry is None or entry.name != held.name:
                    self._ram.drop(key)

    def _reload(self) -> None:
        """Under the journal lock: rebuild both tiers' view from the journal alone."""
        self._journal.reopen()
        self._journal.pending_touches = []
        self._index.clear()
        self._ram.clear()
        self._catch_up()

    def _touch(self, key: bytes) -> None:
        self._index.touch(key)
        self._journal.pending_touches.append(key)
        if len(self._journal.pending_touches) >= TOUCH_BATCH:
            self.flush()

    def _compact_if_due(self, force: bool = False) -> None:
        """Under the journal lock. Dead bytes (replaced or deleted inline values, old records) are dropped by
        rewriting the journal once they outweigh the live inline values (so the journal is at most twice what it
        must be, and compaction costs O(1) per byte written), or once the store is over its limit on disk."""
        inline = self._index.inline_total
        dead = self._journal.offset - inline
        on_disk = self._index.total - inline + self._journal.offset
        over_limit = on_disk > self.disk_limit and dead > self.disk_limit // 10
        if dead <= max(inline, COMPACT_MIN_BYTES) and not over_limit and not self._journal.damaged and not force:
            return
        keys = sum(len(key) for key in self._index.entries)
        if shutil.disk_usage(self.folder).free < inline + keys + 64 * (len(self._index.entries) + 1024):
            return  # no room for the rewrite now; the journal stays valid and a later write tries again
        try:
            self._journal.replace(list(self._index.entries.items()))
        except OSError:
            return  # the same, had the disk filled up meanwhile
        self._catch_up()
        self._sweep_orphans()

    def _sweep_orphans(self) -> None:
        live = {entry.name for entry in self._index.entries.values()}
        old_before = time.time() - ORPHAN_AGE_S
        with os.scandir(self._data) as files:
            for f in files:
                if f.name not in live and f.stat().st_mtime < old_before:
                    _unlink_quietly(f.path)

    def flush(self) -> None:
        """Write remembered reads to the journal now (otherwise done with the next write or at exit)."""
        with self._lock:
            if self._journal.pending_touches:
                with self._journal.locked():
                    self._catch_up()
                    try:
                        self._journal.append(self._journal.take_touches())
                    except OSError:
                        pass  # a full disk: recency is a hint, and a read must not fail for it

    def close(self) -> None:
        reactions.unregister(self)
        with self._lock:
            self._closer()

    # -- pressure --

    def on_level(self, level: Level) -> None:
        """``high`` halves the RAM tier, ``critical`` empties it, back at ``ok`` it may grow to what was asked."""
        with self._lock:
            self._ram.limit = ram_tier_limit(self.ram_asked, level)
            self._ram.shrink_to(self._ram.limit)

    def relieve(self) -> None:
        """Give the RAM tier back now; every value stays on the SSD."""
        with self._lock:
            self._ram.clear()

    # -- reports --

    @property
    def ram_bytes(self) -> int:
        return self._ram.total

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            self._catch_up()
            return self._index.total

    def __str__(self) -> str:
        with self._lock:
            self._catch_up()
            return (f"<store {self.label}: {len(self._ram.values)} in RAM ({fmt_mb(self._ram.total)}), "
                    f"{len(self._index.entries)} on SSD ({fmt_mb(self._index.total)})>")

    __repr__ = __str__


def store(name_or_path: str | os.PathLike[str], ram_mb: float = DEFAULT_RAM_MB,
          disk_gb: float = DEFAULT_DISK_GB) -> Store:
    """Open (or create) a store: ``memory.store("embeddings", ram_mb=512, disk_gb=50)``.

    A plain name lives under ``~/.apsi/store`` (``APSI_STORE_DIR``); a path must be allowed first with
    ``allow_write(path)`` or ``APSI_ALLOW_WRITE``, otherwise a ``PermissionError`` says how.
    """
    ram_bytes = _size_bytes(ram_mb, MiB, "ram_mb")
    disk_bytes = _size_bytes(disk_gb, GiB, "disk_gb")
    folder = resolve_folder(name_or_path)
    text = os.fspath(name_or_path)
    label = text if folder == os.path.join(store_dir(), text) else display(folder)
    return Store(folder, label, ram_bytes, disk_bytes)
