"""The store's journal (``index``) and lock file: records, how they are parsed back, and the file operations.

See the package docstring for the theory of operation. Every name read back from the journal is checked against the exact
form the writer uses (16 hex digits and a known extension) before it touches a path, and every file operation
here is relative to the store folder's file descriptor (``dir_fd``), so neither a forged record nor a folder
swapped under a running store can make it read, write or unlink anything outside the store.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import stat
import struct
import sys
import warnings
import weakref
from collections.abc import Callable

from ..adapters.disk import disk_free
from ..errors import CorruptFileError, DiskFullError, TamperWarning
from ..system.fileio import is_disk_full, new_file, pwrite_all, unlink_quietly, write_all
from ..system.libc import posix_fallocate
from ..system.once import each, fork_hooks
from ..system.paths import display
from ..system.trust import open_file
from ..units import MiB, fmt_size
from . import checkpoint
from .records import (
    OP_LOST,
    OP_RESET,
    OP_SET,
    OP_TOUCH,
    Entry,
    Record,
    pack_keys,
    pack_record,
    parse_records,
    record_length,
)

READ_CHUNK = 64 * MiB
# Disk kept allocated past the journal's end, not counted in its size: what removals (deletes, evictions, the
# removal of a damaged entry) append into when the disk is full. An append that adds a value first makes sure at
# least half of it is there, or is refused with ``DiskFullError``; so about a thousand removals can always be
# recorded, whatever filled the disk.
RESERVE_BYTES = 64 * 1024
# In the lock file: appends so far (generation), compactions so far (epoch), and the journal's size after the last
# append (a journal found shorter was truncated, which no crash does); then the store's random identity.
_COUNTERS = struct.Struct("<QQQ")
_TWO, _END = struct.Struct("<QQ"), struct.Struct("<Q")  # the generation and epoch; the end, stored apart
_GENERATION_BYTES = 8
IDENT_BYTES = 16
_LOCK_BYTES = _COUNTERS.size + IDENT_BYTES
MAGIC = b"APSISTORE1\n"


_TEMP = re.compile(r"index\.[0-9a-f]{12}\.tmp")
Index = tuple[checkpoint.Index, int, int]  # entries and the two running totals (``_Index.snapshot``)
Saved = tuple[bytes, Callable[[], Index]]  # what a checkpoint is made of: the store's key and its index


def disk_full(folder: str, needed: int) -> DiskFullError:
    free = disk_free(folder)
    return DiskFullError(errno.ENOSPC, f"no space left in {display(folder)} for a {fmt_size(needed)} store entry "
                                       f"({fmt_size(free)} free); the store is unchanged")


class _Journal:
    """The ``index`` file: how far this process has read it (``offset``) and the lock that serialises writers.

    The lock file also holds counters, memory-mapped by every process: ``generation`` (appends so far), ``epoch``
    (compactions so far) and the journal's size after the last append. A reader compares the generation (a memory
    read) instead of asking the kernel for the journal's size (a syscall) on every get; a changed epoch means the
    journal was replaced: reopen it. After the counters the lock file keeps the store's random identity, which
    every signature names (an entry copied from another store does not verify)."""

    def __init__(self, folder: str, dir_fd: int) -> None:
        self.path = os.path.join(folder, "index")
        self.folder = folder
        self.dir_fd = dir_fd
        self.lock_fd = self._open_lock()
        self.holding = False  # this handle holds the lock: read everything, trust no shortcut
        self.closing = False  # ``close`` has begun (perhaps on another thread)
        self.fd = -1
        _register_fork_hook()
        _open_journals.add(self)  # with every attribute ``after_fork`` reads already set
        self.offset = 0
        self.end_seen = 0  # the journal's size at the last read_new
        self.epoch = -1
        self.seen = b""  # the generation counter at the last read_new
        self.lost_tail = False  # the journal was found truncated: its writer appends a CLEAR (see read_new)
        self.pending_touches: list[bytes] = []
        self.since_checkpoint = 0  # records read or appended since the checkpoint this handle loaded or wrote
        with self.locked():
            size = os.fstat(self.lock_fd).st_size
            self.known = size >= 16  # the lock held counters already: this folder is a store (maybe damaged)
            if size < _LOCK_BYTES:
                # Written, not ftruncated: the block is allocated now, so a later write through the mapping can
                # never meet a full disk (which would be a SIGBUS, not an error).
                filler = bytes(max(0, _COUNTERS.size - size)) + os.urandom(IDENT_BYTES)
                pwrite_all(self.lock_fd, filler, min(size, _COUNTERS.size), lambda: disk_full(folder, len(filler)))
            self.ident = os.pread(self.lock_fd, IDENT_BYTES, _COUNTERS.size)
            self.counters = mmap.mmap(self.lock_fd, _COUNTERS.size)
            self._open()
            self._remove_temps()  # left by writers killed mid-way: not counted in the store's size, so not kept

    def _open_lock(self) -> int:
        return open_file("lock", os.O_RDWR | os.O_CREAT, self.dir_fd, shown=os.path.join(self.folder, "lock"))

    def locked(self) -> _Journal:
        """``with journal.locked():`` holds the exclusive ``flock`` (the journal is its own context manager:
        a generator-based one costs a microsecond per ``set``)."""
        return self

    def __enter__(self) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.holding = True

    def __exit__(self, *exc: object) -> None:
        self.holding = False
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def changed(self) -> bool:
        """Whether anyone may have appended since this handle last read (always, while holding the lock)."""
        return self.holding or self.counters[:_GENERATION_BYTES] != self.seen

    def _bump(self, epoch_step: int = 0, end: int = -1) -> None:
        """After an append (or a step of a compaction), under the lock. The end is stored before the counters: a
        reader that sees the new generation then reads the new end too (``read_new`` reads them in that order)."""
        generation, epoch, _ = _COUNTERS.unpack_from(self.counters)
        if end >= 0:
            _END.pack_into(self.counters, _GENERATION_BYTES * 2, end)
        _TWO.pack_into(self.counters, 0, generation + 1, epoch + epoch_step)

    def _open(self) -> None:
        """Open and check the magic, writing it if the file is new. The epoch is read first: a compaction in between
        makes the next look reopen again, never miss the switch. In a store (its lock file has counters) a file with
        the wrong magic is moved aside by the lock holder (never deleted) and the store starts empty; in a folder
        that never was a store it is refused."""
        self.epoch = _COUNTERS.unpack_from(self.counters)[1]
        fd = open_file("index", os.O_RDWR | os.O_APPEND | os.O_CREAT, self.dir_fd, shown=self.path)
        head = os.pread(fd, len(MAGIC), 0)
        if head != MAGIC and (head or not self.holding):
            os.close(fd)
            if not self.holding:
                with self.locked():
                    return self._open()
            if head and not self.known:
                # The lock this open made would mark the folder as a store: the next open would move the foreign
                # file aside instead of refusing it. Take it back, so every open gives the same answer.
                os.unlink("lock", dir_fd=self.dir_fd)
                raise CorruptFileError(self.path, "not an apsi_memory store index (wrong magic)")
            if head:
                self._move_aside()
            return self._open()
        if not head:
            try:
                pwrite_all(fd, MAGIC, 0, lambda: disk_full(self.folder, len(MAGIC)))
            except BaseException:
                os.close(fd)
                raise
        self.fd, self.offset = fd, len(MAGIC)
        self.reserved_to = 0  # the room this handle reserved past the end reaches here (``_keep_room``)
        self.damaged = False  # damaged records were skipped: the next writer rewrites the journal without them

    def _move_aside(self) -> None:
        """Under the lock: a journal whose magic is gone cannot be read at all. A cache must still open: keep the
        damaged file for a person to look at, under a new name, and start empty."""
        aside = f"index.damaged.{os.urandom(6).hex()}"
        os.rename("index", aside, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        unlink_quietly(checkpoint.NAME, self.dir_fd)  # of the journal moved aside
        self._bump(epoch_step=2, end=0)
        warnings.warn(TamperWarning(f"{self.path}: not an apsi_memory store index (damaged or overwritten); moved "
                                    f"aside to {os.path.join(self.folder, aside)} and the store starts empty"),
                      stacklevel=6)

    def reopen(self) -> None:
        os.close(self.fd)
        self._open()

    def read_new(self) -> list[Record]:
        """Records appended since the last look; after a compaction, ``RESET`` and the whole new journal."""
        self.seen = self.counters[:_GENERATION_BYTES]  # before reading: a later bump makes the next look read
        _, epoch, last_end = _COUNTERS.unpack_from(self.counters)
        if epoch % 2 and self.holding:
            self._finish_compaction()
            epoch += 1
        if epoch != self.epoch:
            self.reopen()
            return [Record(OP_RESET)] + self.read_new()
        records: list[Record] = []
        size = self.end_seen = os.fstat(self.fd).st_size
        if not self.holding and not epoch % 2 and last_end >= len(MAGIC):
            # Where the last completed append ended: one under way (a batch, one write of many records) is read
            # only once it is whole. A lock file of a store older than that end (0) is read to the file's end.
            size = min(size, last_end)
        # Every append that ended by ``last_end`` was completed (its end is recorded after the write): a record
        # before it that does not parse is damage. Not known while a compaction is under way (an odd epoch).
        whole_to = 0 if epoch % 2 else min(last_end, size)
        if self.holding and size < last_end:
            self._truncated(size)
            self.offset = len(MAGIC)  # what this handle read may be gone: read it all again
            records.append(Record(OP_RESET))
        while self.offset < size:
            buf = os.pread(self.fd, min(size - self.offset, READ_CHUNK), self.offset)
            needed = record_length(buf)
            if needed is not None and needed > len(buf) and self.offset + needed <= size:
                buf = os.pread(self.fd, needed, self.offset)  # one record longer than a chunk (a huge key)
            final = self.holding and self.offset + len(buf) == size
            found, used, damaged = parse_records(buf, self.offset, final, whole_to - self.offset)
            for start, end in damaged:
                self.damaged = True
                warnings.warn(TamperWarning(f"{self.path}: bytes {start}-{end} are damaged and were skipped; "
                                            "every entry recorded before them reads as a miss"), stacklevel=5)
            self.offset += used
            self.since_checkpoint += len(found)
            records += found
            if not used:
                break  # the tail is being appended right now, or was cut short by a crash
        if self.lost_tail:
            records.append(Record(OP_LOST))
        return records

    def _truncated(self, size: int) -> None:
        """Under the lock, the journal is shorter than its last append left it: cut by someone, not by a crash
        (a crash leaves a torn tail *after* that size). What was cut may have replaced any entry: all read as
        misses, and the caller appends a CLEAR so that every process agrees."""
        self.lost_tail = True
        warnings.warn(TamperWarning(f"{self.path}: truncated to {size} bytes (its last write ended at "
                                    f"{_COUNTERS.unpack_from(self.counters)[2]}); every entry reads as a miss"),
                      stacklevel=5)

    def append(self, records: list[Record], adds: bool = False) -> int:
        """Append under the lock, after ``read_new``: cuts off a torn tail a killed writer left, then writes all
        records with one ``write`` (more only past 2 GiB). Records that ``add`` a value keep the room reserved for
        removals (``RESERVE_BYTES``) or raise ``DiskFullError``. Returns the journal's new end (the last record's
        inline value ends there). On failure the journal is as it was."""
        start = self.offset
        if self.end_seen > start:
            self._cut(start)
        data = b"".join([pack_record(record) for record in records])
        if adds and start + len(data) + RESERVE_BYTES // 2 > self.reserved_to:
            self._keep_room(start + len(data))
        written, view = 0, memoryview(data)
        try:
            # One write, unless the kernel writes less: at most 2 GiB per call (a big batch), or a disk that
            # filled up under it, whose next write fails (or writes nothing).
            while written < len(data):
                step = os.write(self.fd, view[written:])
                if not step:
                    break
                written += step
        except OSError as err:
            self._cut(start)
            if is_disk_full(err):
                raise disk_full(self.folder, len(data)) from err
            raise
        if written != len(data):
            self._cut(start)
            raise disk_full(self.folder, len(data))
        self.offset = self.end_seen = end = start + written
        self.since_checkpoint += len(records)
        self._bump(end=end)
        self.lost_tail = False
        self.seen = self.counters[:_GENERATION_BYTES]  # this handle was caught up before it appended
        return end

    def _keep_room(self, end: int) -> None:
        """``RESERVE_BYTES`` allocated past ``end``, where an append is about to end, or ``DiskFullError`` before
        anything is written. A filesystem that cannot reserve is not asked again (its appends go on as before)."""
        try:
            if not posix_fallocate(self.fd, end, RESERVE_BYTES, keep_size=True):
                self.reserved_to = sys.maxsize
                return
        except OSError as err:
            if is_disk_full(err):
                raise disk_full(self.folder, end - self.offset + RESERVE_BYTES) from err
            raise
        self.reserved_to = end + RESERVE_BYTES

    def _cut(self, size: int) -> None:
        """The journal cut back to ``size``, which also frees the room reserved past its end."""
        os.ftruncate(self.fd, size)
        self.reserved_to = min(self.reserved_to, size)

    def load_checkpoint(self, key: bytes) -> checkpoint.Loaded | None:
        """Under the lock, before the first ``read_new``: the index up to where the checkpoint covers this journal,
        and this handle's offset moved there (``read_new`` then reads only the tail), or ``None``."""
        if self.epoch % 2 or self.offset != len(MAGIC):
            return None  # a compaction was cut short (the next read finishes it), or this handle read already
        loaded = checkpoint.load(self.dir_fd, key, self.epoch, self.fd, os.fstat(self.fd).st_size,
                                 os.path.join(self.folder, checkpoint.NAME))
        if loaded is not None:
            self.offset = loaded.upto
            self.since_checkpoint = 0
        return loaded

    def checkpoint_room(self) -> int:
        """Disk the index checkpoint may take: the file there now and, while the next one is written beside it
        (temp + rename), its replacement of about the same size. Any process may have written it: looked up."""
        try:
            return 2 * os.stat(checkpoint.NAME, dir_fd=self.dir_fd, follow_symlinks=False).st_size
        except OSError:
            return 0

    def checkpoint_if_due(self, key: bytes, snapshot: Callable[[], Index],
                          share: int = checkpoint.TAIL_SHARE) -> None:
        """Under the lock, with the index (``snapshot()``, taken only when one is written) replayed up to
        ``offset``: write a checkpoint once enough was appended since the last one (``checkpoint.due``). Never
        raises for the disk: it only makes the next open faster."""
        if self.since_checkpoint < checkpoint.MIN_RECORDS:
            return  # the only test on almost every call
        index = snapshot()
        if not checkpoint.due(self.since_checkpoint, len(index[0]), share):
            return
        try:
            self._remove_temps()  # of checkpoint writes killed mid-way (nobody else writes one: we hold the lock)
            checkpoint.write(self.dir_fd, key, self.epoch, self.fd, self.offset, index,
                             lambda: disk_full(self.folder, 0))
        except OSError:
            return  # a full disk: the next write tries again
        self.since_checkpoint = 0

    def take_touches(self) -> list[Record]:
        """The reads remembered since the last write, as one record (recency for the other processes)."""
        keys, self.pending_touches = self.pending_touches, []
        return [Record(OP_TOUCH, pack_keys(keys))] if keys else []

    def replace(self, entries: list[tuple[bytes, Entry]]) -> None:
        """Compaction, under the lock: one SET per live entry (inline values copied) goes to a temp file that
        replaces ``index``; the epoch then sends every reader, this one included, to the new file. Temp files of
        writers killed mid-way are removed first."""
        self._remove_temps()
        temp = f"index.{os.urandom(6).hex()}.tmp"
        batch: list[bytes] = [MAGIC]
        size = 0
        with new_file(temp, lambda: disk_full(self.folder, 0), self.dir_fd) as fd:
            for key, entry in entries:
                value = os.pread(self.fd, entry.size, entry.offset) if entry.inline else b""
                batch.append(pack_record(Record(OP_SET, key, entry, value)))
                if len(batch) >= 4096:
                    size += _write_batch(fd, batch)
                    batch = []
            size += _write_batch(fd, batch)
        os.close(fd)
        # The epoch is odd while the switch is under way, so a writer killed between the two steps is noticed by
        # the next lock holder (``_finish_compaction``), whichever file ``index`` then is.
        self._bump(epoch_step=1)
        os.replace(temp, "index", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        unlink_quietly(checkpoint.NAME, self.dir_fd)  # of the old journal: stale now (see _finish_compaction)
        self._bump(epoch_step=1, end=size)

    def empty(self) -> None:
        """Under the lock: the journal back to its magic alone, in place, so ``clear`` needs no free space. The
        epoch is odd meanwhile, as in ``replace``, and its change sends every reader back to the start."""
        self._bump(epoch_step=1)
        self._cut(len(MAGIC))
        unlink_quietly(checkpoint.NAME, self.dir_fd)
        self._bump(epoch_step=1, end=len(MAGIC))
        self.lost_tail = False

    def _finish_compaction(self) -> None:
        """Under the lock, an odd epoch: a compacting writer died mid-way. Whichever file is ``index`` now is
        whole (``os.replace`` is atomic), so make the epoch even again, with that file's size as the last end. The
        checkpoint goes too, before the epoch is even (it may be of the old journal): so no checkpoint outlives the
        journal it was made for, which the disk accounting relies on (``checkpoint.room_bound``)."""
        unlink_quietly(checkpoint.NAME, self.dir_fd)
        self._bump(epoch_step=1, end=os.stat("index", dir_fd=self.dir_fd, follow_symlinks=False).st_size)
        self._remove_temps()

    def _remove_temps(self) -> None:
        """Under the lock (so nobody is writing one): the temp files of compactions and checkpoint writes killed
        mid-way. Only regular files of ours in the form we name them; the store folder itself was checked."""
        for name in os.listdir(self.dir_fd):
            if _TEMP.fullmatch(name):
                try:
                    st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    unlink_quietly(name, self.dir_fd)

    def after_fork(self) -> None:
        """``flock`` belongs to an open file, which a forked child shares with its parent: without a file of its
        own the child's lock would not exclude the parent's. A journal another thread was closing at the fork is
        closed in the child too, without touching its descriptors (they may be closed, or their numbers reused)."""
        if self.closing:
            self.fd = -1
        if self.fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = self._open_lock()
            self.holding = False

    def close(self, wait: bool = True, save: Saved | None = None) -> None:
        """Write remembered reads (so recency survives a restart), then close. Safe to call twice. As a finalizer
        (``wait=False``) it never waits for the lock: the garbage collector may run it on a thread that holds the
        same folder's lock through another handle, and a blocking ``flock`` there would never return. With
        ``save`` (the store's key and index, on an explicit close) a writer that appended at least
        ``checkpoint.MIN_RECORDS`` records since the last checkpoint saves one, so the next open replays nothing."""
        if self.fd < 0:
            return
        self.closing = True  # from here on a fork's child must not use its descriptors (``after_fork``)
        try:
            save = save if save is not None and self.since_checkpoint >= checkpoint.MIN_RECORDS else None
            if (self.pending_touches or save) and self._try_lock(wait):
                try:
                    self.holding = True
                    others = self.read_new()
                    if self.pending_touches:
                        self.append(self.take_touches())
                    if save and not others:  # nobody else appended meanwhile: the index is the journal's
                        self.checkpoint_if_due(*save, share=0)
                finally:
                    self.holding = False
                    fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        except OSError:
            pass  # recency is a hint: a full disk or a store folder removed meanwhile loses no value
        finally:
            os.close(self.fd)
            os.close(self.lock_fd)
            self.counters.close()
            self.fd = -1

    def _try_lock(self, wait: bool) -> bool:
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def close_files(journal: _Journal, fds: tuple[int, ...], wait: bool, save: Saved | None = None) -> None:
    """What a store's ``close`` and finalizer run (the finalizer with ``wait=False``: it must never block)."""
    try:
        journal.close(wait, save)
    finally:
        for fd in fds:
            os.close(fd)


def _write_batch(fd: int, batch: list[bytes]) -> int:
    data = b"".join(batch)
    write_all(fd, data)
    return len(data)


_open_journals: weakref.WeakSet[_Journal] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    each(_open_journals, _Journal.after_fork)


_register_fork_hook = fork_hooks(after_in_child=_after_fork_in_child)
