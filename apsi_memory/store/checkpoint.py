"""The index checkpoint: the SSD tier's index as it stood at one point of the journal, signed, so that opening a
store replays only the records written after it instead of the whole journal.

``checkpoint`` holds the index in recency order (keys, names, kinds, sizes, inline offsets, as the fixed-width
columns of ``rows.py``, looked up in place: an open builds no dict of every entry) with the journal's epoch and the
offset it covers, the journal file's identity (device and inode) and the 32 bytes of the journal just before that
offset (the anchor). So it is bound to the exact bytes it summarises: within one epoch the journal is one file that
is only appended to (a compaction or a clear makes a new epoch), so that file up to the offset is the content the
checkpoint was made from; another copy of the store, however alike its bytes, is another file. It is signed with the
store's key (keyed BLAKE3, ``signing.bulk_mac``: every open verifies it whole), and it is only ever an accelerator:
one that is missing, of another epoch (the journal was compacted or cleared since), of another journal file (copied
from another copy of the store), past the journal's end, anchored to other bytes, or not verifying is ignored (the
last with a ``TamperWarning``) and the journal is replayed whole, as before; so is one of an earlier layout (another
magic). Nothing in it is read before its signature checks out, and nothing in it is unpickled.

It is written under the journal lock to a fresh temp file (the compaction's ``index.<hex>.tmp`` form, so a writer
killed mid-way leaves a temp that the next open, checkpoint or compaction removes) and renamed over the old one: a
reader sees the old checkpoint or the new one, never a torn one.
"""

from __future__ import annotations

import os
import stat
import sys
import warnings
from collections.abc import Callable
from struct import Struct
from typing import NamedTuple, Protocol

from ..errors import DiskFullError, TamperWarning
from ..system.fileio import new_file, write_all
from . import rows
from .records import Entry
from .signing import SIGNATURE_BYTES, bulk_mac, bulk_mac_verify

NAME = "checkpoint"
# Earlier layouts have other magics and are ignored, the journal replayed whole (once: that writes a new one):
# APSICKPT1 (marshal columns), APSICKPT2 (these columns, signed with BLAKE2b: 6 ms of a 10 ms open at 100,000),
# APSICKPT3 (not bound to the journal file: one copied from another copy of the store was accepted).
MAGIC = b"APSICKPT4\n"
ANCHOR_BYTES = 32
# A checkpoint is written once this many records were appended since the last one, and at least 1/8 of the
# entries: opening replays at most that tail, and the rewrite costs O(1) per record appended (a checkpoint of
# n entries costs about as much as n/10 sets, spread over n/8 of them).
MIN_RECORDS = 4096
TAIL_SHARE = 8
_TAG = b"K"
_HEADER = Struct(f"<qqQQ{ANCHOR_BYTES}sqqq")  # epoch, upto, journal device and inode, anchor, totals, rows


def room_bound(journal_records: int) -> int:
    """At most the disk a checkpoint and its replacement (written beside it) take, for a journal whose records
    (its size less the live inline values) take ``journal_records`` bytes: every entry a checkpoint holds has a
    SET record in the journal of its epoch of at least 38 bytes plus its key, and a row takes 53 plus its key, so
    the file is under 1.5 times those records, plus its header (a stale checkpoint of an older epoch never
    outlives the compaction that made it stale: ``_Journal.replace``)."""
    return 2 * (len(MAGIC) + SIGNATURE_BYTES + _HEADER.size + 3 * journal_records // 2)


def due(records_since: int, entries: int, share: int = TAIL_SHARE) -> bool:
    """Whether a checkpoint is due: ``share`` 0 asks only for ``MIN_RECORDS`` (at close)."""
    return records_since >= max(MIN_RECORDS, entries // share if share else 0)


class Index(Protocol):
    """What a checkpoint is written from (``_Index``): how many entries, and all of them in recency order."""

    def __len__(self) -> int: ...

    @property
    def entries(self) -> dict[bytes, Entry]: ...


class Loaded(NamedTuple):
    upto: int  # the journal offset the index is replayed to
    rows: rows.Rows
    total: int
    inline_total: int


def _identity(journal_fd: int) -> tuple[int, int]:
    st = os.fstat(journal_fd)
    return st.st_dev, st.st_ino


def write(dir_fd: int, key: bytes, epoch: int, journal_fd: int, upto: int, index: tuple[Index, int, int],
          full: Callable[[], DiskFullError]) -> None:
    """Under the journal lock: ``index`` (entries and the two running totals) as replayed up to ``upto`` of the
    journal ``journal_fd``."""
    whole, total, inline_total = index
    n, columns = rows.pack(whole.entries)
    anchor = os.pread(journal_fd, ANCHOR_BYTES, upto - ANCHOR_BYTES)
    body = _HEADER.pack(epoch, upto, *_identity(journal_fd), anchor, total, inline_total, n) + columns
    temp = f"index.{os.urandom(6).hex()}.tmp"
    with new_file(temp, full, dir_fd) as fd:
        write_all(fd, MAGIC + bulk_mac(key, _TAG, body) + body)
    os.close(fd)
    os.replace(temp, NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def load(dir_fd: int, key: bytes, epoch: int, journal_fd: int, size: int, shown: str) -> Loaded | None:
    """The offset the checkpoint covers and the index up to there, or ``None`` when it cannot serve this journal."""
    content = _read(dir_fd)
    if content is None or content[:len(MAGIC)] != MAGIC or sys.byteorder != "little":
        return None  # rows are read in place as native numbers: little-endian only (elsewhere: replayed whole)
    signature = content[len(MAGIC):len(MAGIC) + SIGNATURE_BYTES]
    body = memoryview(content)[len(MAGIC) + SIGNATURE_BYTES:]  # not copied: a read in place, once verified
    if not bulk_mac_verify(key, signature, _TAG, body):
        warnings.warn(TamperWarning(f"{shown}: does not verify (changed outside apsi_memory, or from another store); "
                                    "ignored, the journal is replayed whole"), stacklevel=5)
        return None
    if len(body) < _HEADER.size:
        return None
    got_epoch, upto, device, inode, anchor, total, inline_total, n = _HEADER.unpack_from(body)
    if got_epoch != epoch or not ANCHOR_BYTES <= upto <= size or (device, inode) != _identity(journal_fd):
        return None  # compacted, cleared or cut since, or made from another file (another copy): stale
    if os.pread(journal_fd, ANCHOR_BYTES, upto - ANCHOR_BYTES) != anchor:
        return None
    columns = body[_HEADER.size:]
    if not rows.fits(n, columns):
        return None  # signed by us, so our columns; lengths that disagree are no checkpoint
    return Loaded(upto, rows.Rows(n, columns), total, inline_total)


def _read(dir_fd: int) -> bytes | None:
    """The checkpoint's bytes: a regular file, never through a link; anything else is no checkpoint."""
    try:
        fd = os.open(NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)
