"""``memory.store``: a key-value cache with a RAM tier and an SSD tier, safe to share between processes.

The package, by what each module knows: ``keys`` (keys <-> bytes, entry names), ``records`` (the journal's record
format, pure), ``journal`` (the journal file, its lock, compaction, forks), ``checkpoint`` (the index saved, so an
open replays only the journal's tail), ``tiers`` (the RAM tier and the SSD tier's index, pure), ``codec`` (values
<-> signed ``.npy`` or pickle bytes), ``signing`` (this user's key and the MACs), ``folders`` (where stores may
live), ``upkeep`` (one handle's index and RAM tier kept in step with the journal and within the disk limit:
catching up, batched reads, eviction, the journal's rewrite), ``batches`` (what a ``set`` or ``set_many`` writes
before its one append: values signed, their files written, where inline values will lie) and ``core`` (the
``Store`` class joining them into a ``MutableMapping``); ``cached`` and ``hashing`` (``@memory.cached`` and its
keys) build on the store. Imports go one way: keys <- records <- codec, checkpoint <- tiers, journal <- upkeep,
batches <- core <- this module <- cached.
``apsi_memory.store`` is callable as ``store()``.

May import: decide, system, adapters, machinery.

Theory of operation
-------------------
A store is a folder::

    index             append-only journal: what the store holds, and small values themselves
    lock              ``flock`` target; never replaced, so every process locks the same inode
    checkpoint        the index as of one journal offset, signed: an open replays only the journal after it
    data/<token>.npy  an array of more than 16 KiB as a standard .npy file + MAC trailer (np.load reads it)
    data/<token>.pkl  a pickled value of more than 16 KiB + keyed-BLAKE2b MAC trailer

Values up to 16 KiB (pickled, or a small array in .npy form) are written *inside* their journal record: creating
a file costs far more than appending to one, and that is what keeps ``set`` cheap. Every value, inline or not, is
signed with this user's key (``apsi_memory.store.signing``).

*Visibility is atomic*: a bigger value goes to a fresh file under a random name (``O_EXCL``, never overwritten)
and only then does one journal record name it; a small one is part of its record. Records carry their length and
a CRC, so one a killed writer left half-written is recognised and cut off by the next writer, and a file no record
names is an orphan nobody reads (swept later). An entry reads back whole or not at all. The lock file records where
the last completed append ended: a record before that end that does not parse was written whole and damaged since,
so it is reported and skipped (every entry recorded before it reads as a miss), never cut off as a torn tail.

*Batches*: ``set_many`` signs every value and writes the files first (nothing on disk if one cannot be stored),
then appends all its records with one ``write`` under one lock. A reader that takes no lock reads the journal
only up to where the last completed append ended (the lock file records it, before the generation counter it
bumps), so a batch being written is read whole once its write has ended, never in part.

*Sizes are running totals*: the journal replays into an in-memory LRU index (``tiers._Index``) holding each entry's
size, so ``set`` never lists the folder and costs the same at 100 or 100,000 entries. Replaying on open also
restores recency without unpickling anything: reads are remembered and written as one ``T`` record with the next
write (or every 512 reads, or at exit), so a read costs no disk write; they reach this process's own index in the
same batches, before anything that needs its order (iteration, eviction, compaction, a checkpoint).

*RAM tier*: values last used, least recently used out first, within ``ram_mb``: a pickle's bytes (unpickled on
every get, so callers never share a mutable object), a small array's read-only copy, and a big array as the
read-only mapping of its file (the page cache's copy, not a second one: a ``set`` writes the file, then maps it).
What a ``get`` hands out is the caller's own, as ``np.load``'s result is: a pickle unpickled afresh, a small array
copied, a big one mapped again from its file copy-on-write (``MAP_PRIVATE``: no copy until the caller writes a page,
and what it writes never reaches the file or another reader). ``get(key, writable=False)`` hands out the tier's own
read-only array instead, for many readers of one big array.

*Checkpoint*: once 4096 records (and 1/8 of the entries) were appended since the last one, or at ``close`` after
4096, a writer saves the index (``checkpoint.py``: signed with keyed BLAKE3, bound to the journal file, its epoch
and the bytes before the offset it covers, written to a temp file and renamed); an open verifies it, looks keys up
in its fixed-width rows in place (``rows.py``: no dict of every entry is built until whole-index order is wanted)
and replays the tail only. One that is stale, changed, of an earlier layout or missing is ignored and the journal
replayed whole: it is a shortcut, never the truth.

*Room for removals*: the journal keeps 64 KiB allocated past its end (``fallocate``, size unchanged) that only
appends without a new value use; a ``set`` that would eat into it is refused with ``DiskFullError``. So deletes,
evictions and the removal of a damaged entry are recorded even on a disk something else filled.

*Compaction*: replaced and deleted inline values stay in the journal as dead bytes until they outweigh the live
ones (or the store is over its limit on disk); then the journal is rewritten with the live entries only, and a
counter in the lock file (the epoch) sends every process still reading the old file to the new one.

*Several processes*: writers hold an exclusive ``flock`` on ``lock`` while they read the records others appended
since their last look and append their own, then bump a counter kept in the (memory-mapped) lock file.
``fcntl.flock`` is used rather than the ``filelock`` package: it is stdlib, one syscall to lock and one to unlock,
and the kernel drops it when a holder dies (a SIGKILLed writer never leaves a stale lock file behind, which
lock-file schemes must detect by timeouts). A flock belongs to an open file, so a child forked with an open store
reopens the lock file (``os.register_at_fork``). Readers take no lock: they compare the shared counter (a memory
read, not a syscall) and parse only complete records; a value file is never changed once named, so nothing
half-written is ever read. A file another process removed (evicted, replaced) reads as a miss.

*Tampering*: pickles are loaded only after their signature (over the store's identity, the key, the entry's
version and the bytes: ``codec.py``) checks out; a mismatch means the file was changed outside the library,
truncated, swapped with another entry's or an older one, copied from another store, or signed with another user's
key: it reads as a miss, is removed and a ``TamperWarning`` names it. The key, the folders and ``lock``/``index``
are checked once, at open (``apsi_memory.system.trust``); names read from the journal are checked before any use, and every file
operation is relative to the store's folder descriptors (``journal.py``). Arrays are never unpickled. Small
arrays (read whole) are signed over their bytes; big ones come back memory-mapped, so hashing them on every read
would defeat the mapping: their signature covers the key, the .npy header and the length (a swapped or
truncated file is caught; an in-place edit of the numbers in a big array is not, and cannot run code).

Durability: files are not fsynced (a crashed *process* loses nothing, the page cache survives it; a power loss may
lose recent entries, and the CRC'd journal then drops whatever it cannot read back whole).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from typing import Any

from ..errors import SizeError
from ..system.paths import display, private_dir, store_dir
from ..units import GiB, MiB, parse_size
from .core import Store
from .folders import allow_write, path_text, resolve_folder
from .keys import Key, decode_key, encode_key
from .stats import CacheStats

__all__ = [
    "DEFAULT_DISK_GB",
    "DEFAULT_RAM_MB",
    "CacheStats",
    "Key",
    "Store",
    "allow_write",
    "byte_limits",
    "decode_key",
    "encode_key",
    "path_text",
    "resolve_folder",
    "store",
]

DEFAULT_RAM_MB = 256.0
DEFAULT_DISK_GB = 10.0


def byte_limits(ram_mb: float | str, disk_gb: float | str) -> tuple[int, int]:
    """``ram_mb`` and ``disk_gb`` as bytes, each checked (``SizeError`` naming it): what ``store`` and ``@cached``
    take. A number is MB (``ram_mb``) or GB (``disk_gb``); a string names its unit, as ``budget`` takes it:
    ``ram_mb="1GB"``, ``disk_gb="500MB"``."""
    return _size_bytes(ram_mb, MiB, "ram_mb"), _size_bytes(disk_gb, GiB, "disk_gb")


def _size_bytes(value: float | str, unit: int, what: str) -> int:
    if isinstance(value, str):
        return _size_text(value, what)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
        raise SizeError(f"{what} must be a finite number of at least 0 or a size such as '1GB', not {value!r}")
    if value * unit >= 2**63:  # would pass here and fail, unnamed, deep in the tiers' arithmetic
        raise SizeError(f"{what}={value!r} is larger than any machine's memory")
    return int(value * unit)


def _size_text(text: str, what: str) -> int:
    # A bare number in a string would be GB to parse_size: "512" for ram_mb must not mean 512 GB.
    if not text.strip().rstrip("0123456789.eE+-").strip():
        shown = text.strip()
        raise SizeError(f"{what}={text!r} has no unit; write {what}={shown + 'MB'!r} or {shown + 'GB'!r}, or a "
                        f"number ({what} as a number is {'MB' if what == 'ram_mb' else 'GB'})")
    try:
        return parse_size(text)
    except SizeError as exc:
        raise SizeError(f"{what}: {exc}") from None


def store(name_or_path: str | os.PathLike[str], ram_mb: float | str = DEFAULT_RAM_MB,
          disk_gb: float | str = DEFAULT_DISK_GB) -> Store:
    """Open (or create) a store: ``memory.store("embeddings", ram_mb=512, disk_gb=50)`` (or ``ram_mb="1GB"``). Keys are ``str``,
    ``int`` or ``bytes`` (``1``, ``"1"`` and ``b"1"`` are three keys; a subclass is its value: ``IntEnum.RED`` is
    ``1``).

    A plain name lives under ``~/.apsi/store`` (``APSI_STORE_DIR``); an absolute path must be allowed first with
    ``memory.allow_write(path)`` or ``APSI_ALLOW_WRITE``, otherwise a ``UnsafePathError`` (a ``PermissionError``)
    says how; a relative path (``"a/b"``) is refused (``ArgumentError``), as it would depend on the working folder.
    ``with memory.store(...) as s:`` closes it at the end; ``s.stats()`` counts hits, misses and evictions. Every folder on the way that the store creates is 0700; a store folder, or its key, that another
    user could write is refused with an ``UnsafePathError`` naming the fix.
    """
    ram_bytes, disk_bytes = byte_limits(ram_mb, disk_gb)
    folder = resolve_folder(name_or_path)
    if os.path.dirname(folder) == store_dir():
        private_dir(store_dir())  # the folder of named stores: ours, and writable by nobody else
    text = os.fspath(name_or_path)
    label = text if folder == os.path.join(store_dir(), text) else display(folder)
    return Store(folder, label, ram_bytes, disk_bytes)


def __getattr__(name: str) -> Any:
    if name == "limits":  # its name until 0.1.0, beside the unrelated ``memory.limits()``
        warnings.warn("apsi_memory.store.limits is now apsi_memory.store.byte_limits; the old name goes in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return byte_limits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
