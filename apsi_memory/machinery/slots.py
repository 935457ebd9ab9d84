"""The ledger file's slots (see ``reservations``): the record format, the slot locks, and a sibling's RSS and
liveness, read from ``/proc/<pid>/statm`` kept open per ``(pid, start)``.

The file has ``SLOTS`` fixed-size slots, one per process. A process claims a free or dead slot with an
open-file-description record lock on the slot's bytes (``F_OFD_SETLK``; POSIX ``lockf`` off Linux), held for its
life, and rewrites its record there with one ``pwrite``: pid, start time, bytes reserved, bytes of RAM arrays held,
its anonymous RSS then, and a CRC-32. A reader takes the whole file with one ``pread``: no lock it
waits on, so a stopped or dead writer cannot hold it up. A forked child closes the descriptors it inherited (a
fork hook; without one, as after a libc ``fork``, at its first use: ``ForkMark``, a page the kernel zeroed) and
never writes the parent's slot. With every slot taken, a process reads its siblings but does not publish (one
WARNING). The last user of a file removes it when it leaves (``close``, at exit): under a lock of every slot, and
only a file the library made. A process whose file was removed or replaced under it opens the new one and
publishes there (within ``ledger_file.CHECK_EVERY`` where it holds a slot; at once where it does not).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import sys
import zlib
from typing import NamedTuple

from ..adapters.processes import owner_alive, process_start
from ..adapters.procfs import read_start_time

MAGIC = b"APR1"  # the format's version is in it: a record of another version is ignored, never misread
_FORMAT = struct.Struct("<4sIQQQQ")  # magic, pid, start, reserved, held, rss at publishing
_CRC = struct.Struct("<I")
SLOT_BYTES = 48  # the record, its CRC, and room to spare
SLOTS = 128  # 6 KiB a group: read with one pread
FILE_BYTES = SLOT_BYTES * SLOTS
FREE = bytes(SLOT_BYTES)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_FLOCK = struct.Struct("=hh4xqqi4x")  # Linux's struct flock on 64-bit: type, whence, start, len, pid
_OFD = sys.platform.startswith("linux") and _FLOCK.size == 32 and struct.calcsize("P") == 8
_OFD_GETLK, _OFD_SETLK = getattr(fcntl, "F_OFD_GETLK", 36), getattr(fcntl, "F_OFD_SETLK", 37)


class Record(NamedTuple):
    pid: int
    start: int  # clock ticks since boot (``/proc/<pid>/stat``); 0 where unknown: then the slot's lock alone decides
    reserved: int  # bytes placed in RAM and not written yet (at most)
    held: int  # bytes of RAM arrays the process holds
    rss: int  # its anonymous RSS when it published


_TAIL = struct.Struct(f"<I{SLOT_BYTES - _FORMAT.size - _CRC.size}x")  # the CRC and the slot's spare bytes


def pack_record(record: Record) -> bytes:
    body = _FORMAT.pack(MAGIC, *record)
    return body + _TAIL.pack(zlib.crc32(body))


def parse_record(data: bytes, offset: int = 0) -> Record | str:
    """The record at ``offset``, or why it is not one (the reason a reader logs)."""
    if len(data) < offset + _FORMAT.size + _CRC.size:
        return "cut short"
    body = data[offset:offset + _FORMAT.size]
    (crc,) = _CRC.unpack_from(data, offset + _FORMAT.size)
    if body[:4] != MAGIC:
        return "not a record of this version"
    if zlib.crc32(body) != crc:
        return "checksum does not match (torn or foreign)"
    return Record(*_FORMAT.unpack(body)[1:])


def outstanding(reserved: int, rss_then: int, rss_now: int | None) -> int:
    """What is still uncharged of ``reserved``: less the owner's RSS growth since it published (all of it when the
    RSS cannot be read)."""
    if rss_now is None:
        return reserved
    return max(0, reserved - max(0, rss_now - rss_then))


class Parsed:
    """Records by their bytes: a record seen before was checked then, and most readings change none."""

    def __init__(self) -> None:
        self.known: dict[bytes, Record] = {}

    def check(self, fd: int, raw: bytes, at: int) -> Record | str:
        """The record in ``raw`` (the slot at ``at`` of file ``fd``), or why it is not one."""
        known = self.known.get(raw)
        if known is not None:
            return known
        record = parse_record(raw)
        if isinstance(record, str):  # perhaps caught mid-write: read that slot once more
            return parse_record(os.pread(fd, SLOT_BYTES, at))
        if len(self.known) >= 4 * SLOTS:
            self.known.clear()
        self.known[raw] = record
        return record


class Statm:
    """``<root>/proc/<pid>/statm`` kept open per process seen, keyed by ``(pid, start)`` and re-read with
    ``pread``: the descriptor stays with that process, so a recycled pid is never read in its stead, and once that
    process is gone its descriptor says so (``dead``)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.fds: dict[tuple[int, int], int] = {}
        self.dead: set[tuple[int, int]] = set()  # known gone: not the process that published, or exited since

    def anon_rss(self, pid: int, start: int = 0) -> int | None:
        fd = self.fds.get((pid, start))
        if fd is None:
            fd = self._open(pid, start)
            if fd is None:
                return None
        try:
            words = os.pread(fd, 128, 0).split(None, 3)
            return (int(words[1]) - int(words[2])) * _PAGE  # resident less file-backed and shared pages
        except OSError as exc:
            if exc.errno == errno.ESRCH and start:
                self.dead.add((pid, start))
            return None
        except (IndexError, ValueError):
            return None

    def _open(self, pid: int, start: int) -> int | None:
        try:
            fd = os.open(os.path.join(self.root, f"proc/{pid}/statm"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENOENT and start:
                self.dead.add((pid, start))
            return None
        # Opened first, checked after: if the start matches now, the descriptor is that process's.
        if start and read_start_time(pid, self.root) != str(start):
            os.close(fd)
            self.dead.add((pid, start))
            return None
        self.fds[(pid, start)] = fd
        return fd

    def keep_only(self, owners: set[tuple[int, int]]) -> None:
        for owner in [o for o in self.fds if o not in owners]:
            os.close(self.fds.pop(owner))
        self.dead &= owners

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _range(kind: int, start: int, length: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, start, length, 0)


def lock(fd: int, slot: int, count: int = 1) -> bool:
    """Take the lock of ``count`` slots from ``slot`` for this open file; False when another holds one."""
    try:
        if _OFD:
            fcntl.fcntl(fd, _OFD_SETLK, _range(fcntl.F_WRLCK, slot * SLOT_BYTES, count * SLOT_BYTES))
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, count * SLOT_BYTES, slot * SLOT_BYTES)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def unlock(fd: int, slot: int, count: int = 1) -> None:
    if _OFD:
        fcntl.fcntl(fd, _OFD_SETLK, _range(fcntl.F_UNLCK, slot * SLOT_BYTES, count * SLOT_BYTES))
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, count * SLOT_BYTES, slot * SLOT_BYTES)


def clear(fd: int, slot: int, raw: bytes, take_lock: bool = True) -> None:
    """Zero a dead process's slot, so that readings which do not ask about locks stop counting it: only if it
    still holds that record, and while holding its lock (a process claiming it meanwhile takes another). Without
    ``take_lock``: a slot whose lock outlived its owner in a child it forked without Python's fork hooks (the child
    never writes it)."""
    with contextlib.suppress(OSError):
        if not take_lock:
            _zero_if(fd, slot, raw)
        elif lock(fd, slot):
            try:
                _zero_if(fd, slot, raw)
            finally:
                unlock(fd, slot)


def _zero_if(fd: int, slot: int, raw: bytes) -> None:
    if os.pread(fd, SLOT_BYTES, slot * SLOT_BYTES) == raw:
        os.pwrite(fd, FREE, slot * SLOT_BYTES)


_QUERIES = [_range(fcntl.F_WRLCK, slot * SLOT_BYTES, SLOT_BYTES) for slot in range(SLOTS)]
_UNLOCKED = struct.pack("=h", fcntl.F_UNLCK)


def held(fd: int, slot: int, record: Record) -> bool:
    """Whether slot ``slot`` is held: its lock (Linux), else its record's process still runs."""
    if _OFD:
        return bool(fcntl.fcntl(fd, _OFD_GETLK, _QUERIES[slot])[:2] != _UNLOCKED)
    return owner_alive(record.pid, str(record.start) if record.start else "0")


def names(folder_fd: int, name: str, opened: tuple[int, int]) -> bool:
    """Whether ``name`` in the folder still names the file opened as ``(device, inode)`` (one ``fstatat``)."""
    try:
        found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == opened


def remove_if_unused(folder_fd: int, name: str, fd: int, opened: tuple[int, int]) -> bool:
    """Remove the ledger file when no live process holds a slot in it: under a lock of every slot (so none is
    claimed meanwhile), and only a file the library made that its name still names; whether it was."""
    if not lock(fd, 0, SLOTS):
        return False
    try:
        if not (made_here(fd) and names(folder_fd, name, opened)):
            return False
        os.unlink(name, dir_fd=folder_fd)
        return True
    finally:
        unlock(fd, 0, SLOTS)


def made_here(fd: int) -> bool:
    """Whether the open file is one the library made: a regular file of ours, 0600, ``FILE_BYTES`` long."""
    found = os.fstat(fd)
    return (stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) == 0o600
            and found.st_size == FILE_BYTES)


def start_ticks() -> int:
    """This process's start time in clock ticks since boot (0 where unknown)."""
    start = process_start(os.getpid())
    return int(start) if start and start.isdigit() else 0
