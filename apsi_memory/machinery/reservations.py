"""The reservation ledger: what the other processes of this user in this memory cgroup have decided to take and the
kernel has not charged yet.

Why
---
Memory is charged when pages are touched, not when an array is placed. Processes of one container that place big
arrays at the same moment all see the same free memory and would all choose RAM. So each process publishes what
it has placed in RAM and not written yet; every placement subtracts the siblings' figures from free memory first.

Where
-----
One file per memory cgroup (its version and folder, which name the mount and the path; ``host`` where no limit
applies), named ``reservations-<hash>``, in ``APSI_LEDGER_DIR`` where set, else the first of ``/dev/shm/apsi-<uid>``, ``$XDG_RUNTIME_DIR/apsi`` and
``~/.apsi/run`` that is (or can be made) a folder of this user that nobody else may write (``trust``). Each user
has their own: several users in one container see each other only through the kernel's numbers.

The file has ``SLOTS`` fixed-size slots, one per process. A process claims a free or dead slot with an
open-file-description record lock on the slot's bytes (``F_OFD_SETLK``; POSIX ``lockf`` off Linux), held for its
life, and rewrites its record there with one ``pwrite``: pid, start time, bytes reserved, bytes of RAM arrays held,
its anonymous RSS then, and a CRC-32. A reader takes the whole file with one ``pread``: no lock it waits on, so a
stopped or dead writer cannot hold it up. A forked child closes the descriptors it inherited (a fork hook), so
the parent's slot dies with the parent.

Nothing stale can lie
---------------------
* A dead process (SIGKILL, OOM kill) stops counting at once: the kernel drops its lock when it dies, and a reader
  asks about the lock of each used slot (``F_OFD_GETLK``, one system call). Off Linux, the record's pid and start
  time are checked instead (``processes.owner_alive``).
* A reservation shrinks as its owner's pages are charged: the reader takes away the owner's growth in anonymous
  RSS since it published (``/proc/<pid>/statm``, kept open). Chosen over the owner updating as it writes because
  NumPy writes never pass through the library: only the kernel knows, and it says so at once. Any page the owner
  touched is charged to the group, so free memory fell by as much as the figure shrank.
* A record that does not check (a torn write, a foreign file) is read once more, then ignored with its reason
  (``SiblingReading.ignored``), never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import struct
import sys
import threading
import weakref
import zlib
from collections.abc import Callable
from typing import NamedTuple

from ..adapters.processes import owner_alive, process_start
from ..errors import UnsafePathError
from ..system import paths, trust
from ..system.once import fork_hooks
from .reading import MemoryReading, SiblingReading

log = logging.getLogger("apsi_memory.siblings")  # the documented logger name (docs: "What it logs")

MAGIC = b"APR1"  # the format's version is in it: a record of another version is ignored, never misread
_FORMAT = struct.Struct("<4sIQQQQ")  # magic, pid, start, reserved, held, rss at publishing
_CRC = struct.Struct("<I")
SLOT_BYTES = 48  # the record, its CRC, and room to spare
SLOTS = 128  # 6 KiB a group: read with one pread
FILE_BYTES = SLOT_BYTES * SLOTS
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_FLOCK = struct.Struct("=hh4xqqi4x")  # Linux's struct flock on 64-bit: type, whence, start, len, pid
_OFD = sys.platform.startswith("linux") and _FLOCK.size == 32 and struct.calcsize("P") == 8
_OFD_GETLK, _OFD_SETLK = getattr(fcntl, "F_OFD_GETLK", 36), getattr(fcntl, "F_OFD_SETLK", 37)


class Record(NamedTuple):
    pid: int
    start: int  # clock ticks since boot (``/proc/<pid>/stat``); 0 where unknown
    reserved: int  # bytes placed in RAM and not written yet (at most)
    held: int  # bytes of RAM arrays the process holds
    rss: int  # its anonymous RSS when it published


# -- records (pure) ----------------------------------------------------------------------------------------------

def pack_record(record: Record) -> bytes:
    body = _FORMAT.pack(MAGIC, *record)
    return (body + _CRC.pack(zlib.crc32(body))).ljust(SLOT_BYTES, b"\0")


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


def group_key(reading: MemoryReading) -> str:
    """The file name for the group ``reading`` is limited by (``host`` without a limit)."""
    if not reading.limited or reading.cgroup is None:
        return "reservations-host"
    name = f"v{reading.cgroup.version}:{reading.cgroup.directory}"
    return "reservations-" + hashlib.sha256(name.encode()).hexdigest()[:24]


# -- where ---------------------------------------------------------------------------------------------------------

_shared: Siblings | None = None


def shared() -> Siblings:
    """This process's entry in the ledgers (one, so that its locks and records are never its own rivals)."""
    global _shared
    if _shared is None:
        _shared = Siblings()
    return _shared


LEDGER_DIR_ENV = "APSI_LEDGER_DIR"


def candidate_dirs() -> list[str]:
    """``APSI_LEDGER_DIR`` alone where set; else ``/dev/shm/apsi-<uid>``, ``$XDG_RUNTIME_DIR/apsi``, ``~/.apsi/run``."""
    chosen = paths.env_folder(LEDGER_DIR_ENV, "")  # the rules of the other folders: empty unset, relative refused
    if chosen:
        return [chosen]
    uid = os.geteuid()
    found = [f"/dev/shm/apsi-{uid}"] if os.path.isdir("/dev/shm") else []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        found.append(os.path.join(runtime, "apsi"))
    return [*found, os.path.join(paths.apsi_home(), "run")]


def _open_folder(candidates: list[str]) -> tuple[int, str] | None:
    """The first candidate that is (or can be made) a folder of ours nobody else may write; None if none is."""
    for folder in candidates:
        try:
            return trust.open_folder(folder), folder
        except (UnsafePathError, OSError) as exc:
            log.warning("reservation ledger: not in %s (%s): %s", folder,
                        LEDGER_DIR_ENV if os.environ.get(LEDGER_DIR_ENV) else "default", exc)
    return None


class _Statm:
    """``/proc/<pid>/statm`` kept open per process seen (re-read with ``pread``): the descriptor stays with that
    process, so a recycled pid is never read in its stead."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}

    def anon_rss(self, pid: int) -> int | None:
        fd = self.fds.get(pid)
        if fd is None:
            try:
                fd = self.fds[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            words = os.pread(fd, 128, 0).split(None, 3)
            return (int(words[1]) - int(words[2])) * _PAGE  # resident less file-backed and shared pages
        except (OSError, IndexError, ValueError):
            return None

    def keep_only(self, pids: set[int]) -> None:
        for pid in [p for p in self.fds if p not in pids]:
            os.close(self.fds.pop(pid))


def _lock(fd: int, slot: int) -> bool:
    """Take slot ``slot``'s lock for this open file; False when another holds it."""
    try:
        if _OFD:
            fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot * SLOT_BYTES, SLOT_BYTES, 0))
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SLOT_BYTES, slot * SLOT_BYTES)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _clear(fd: int, slot: int, raw: bytes) -> None:
    """Zero a dead process's slot, so that readings which do not ask about locks stop counting it: only while
    holding its lock (a process claiming it meanwhile takes another), and only if it still holds that record."""
    with contextlib.suppress(OSError):
        if _lock(fd, slot):
            try:
                if os.pread(fd, SLOT_BYTES, slot * SLOT_BYTES) == raw:
                    os.pwrite(fd, bytes(SLOT_BYTES), slot * SLOT_BYTES)
            finally:
                _unlock(fd, slot)


def _unlock(fd: int, slot: int) -> None:
    if _OFD:
        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, slot * SLOT_BYTES, SLOT_BYTES, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, SLOT_BYTES, slot * SLOT_BYTES)


_QUERIES = [_FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot * SLOT_BYTES, SLOT_BYTES, 0) for slot in range(SLOTS)]
_UNLOCKED = struct.pack("=h", fcntl.F_UNLCK)


def _alive(fd: int, at: int, record: Record) -> bool:
    """Whether the slot at ``at`` is held: its lock (Linux), else its record's process still runs."""
    if _OFD:
        return fcntl.fcntl(fd, _OFD_GETLK, _QUERIES[at // SLOT_BYTES])[:2] != _UNLOCKED
    return owner_alive(record.pid, str(record.start) if record.start else "0")


# -- the ledger ----------------------------------------------------------------------------------------------------

class Siblings:
    """This process's view of, and entry in, the reservation ledger of its memory group (see the module
    docstring). ``directories``: where to look for a safe folder (default ``candidate_dirs()``). A process has
    one (``shared()``); tests make several, each standing for a process: ``pid`` is then written in its record,
    and ``anon_rss(pid)`` stands for ``/proc/<pid>/statm``."""

    def __init__(self, directories: list[str] | None = None, pid: int | None = None,
                 anon_rss: Callable[[int], int | None] | None = None) -> None:
        self._directories = directories
        self._given_pid = pid
        self._given_rss = anon_rss
        self._lock = threading.RLock()  # reentrant: a garbage-collected array may publish from inside a publish
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._real_pid = os.getpid()  # a forked child has no slot and no record of its own: it starts afresh
        self._pid = self._given_pid or self._real_pid
        self._folder: tuple[int, str] | None | bool = False  # False: not looked for yet; None: no safe folder
        self._files: dict[str, int] = {}
        self._slot: int | None = None
        self._key: str | None = None
        self._mine = Record(self._pid, 0, 0, 0, 0)
        self._statm = _Statm()
        self._parsed: dict[bytes, Record] = {}
        self._rough = ("", b"", SiblingReading())  # the group, the others' bytes, and the upper bound read from them
        self._rss = self._given_rss or self._statm.anon_rss

    def _check_fork(self) -> None:
        if self._real_pid != os.getpid():
            self.close()

    def close(self) -> None:
        """Close this entry's files: its slot is free for another (as when the process dies)."""
        with self._lock:
            for fd in [*self._files.values(), *self._statm.fds.values()]:
                os.close(fd)
            if isinstance(self._folder, tuple):
                os.close(self._folder[0])
            self._reset()

    def _file(self, key: str) -> int | None:
        if self._folder is False:
            _close_in_children()  # registered on first use, never at import
            self._folder = _open_folder(self._directories or candidate_dirs())
        if not isinstance(self._folder, tuple):
            return None
        fd = self._files.get(key)
        if fd is None:
            try:
                fd = trust.open_file(key, os.O_RDWR | os.O_CREAT, dir_fd=self._folder[0],
                                     shown=os.path.join(self._folder[1], key))
            except (UnsafePathError, OSError) as exc:
                log.info("reservation ledger: %s", exc)
                return None
            if os.fstat(fd).st_size < FILE_BYTES:
                os.ftruncate(fd, FILE_BYTES)  # racing creators truncate to the same size: nothing is lost
            self._files[key] = fd
        return fd

    @property
    def key(self) -> str | None:
        """The group this process last published to (None before it did)."""
        return self._key

    def path(self, key: str) -> str | None:
        folder = self._folder
        return os.path.join(folder[1], key) if isinstance(folder, tuple) else None

    # -- reading -------------------------------------------------------------------------------------------------

    def read(self, key: str, exact: bool = True) -> SiblingReading:
        """The other live processes' entries in group ``key``'s ledger: one pread, one ``F_OFD_GETLK`` per used
        slot, one ``statm`` pread per slot holding a reservation. Not ``exact``: only the pread, every intact
        record counted in full, alive or not — an upper bound, enough when the answer is RAM even so."""
        with self._lock:
            self._check_fork()
            fd = self._file(key)
            if fd is None:
                return SiblingReading()
            data = os.pread(fd, FILE_BYTES, 0)
            own = self._slot if key == self._key else None
            if exact:
                return self._tally(fd, data, own, self.path(key), exact)
            # The upper bound depends on the others' records only: while their bytes stay the same, so does it.
            others = data if own is None else data[:own * SLOT_BYTES] + data[(own + 1) * SLOT_BYTES:]
            if self._rough[:2] != (key, others):
                self._rough = (key, others, self._tally(fd, data, own, self.path(key), exact))
            return self._rough[2]

    def _tally(self, fd: int, data: bytes, own: int | None, ledger: str | None, exact: bool) -> SiblingReading:
        processes = active = reserved = held = 0
        ignored: list[str] = []
        seen: set[int] = set()
        at = data.find(MAGIC)
        while at >= 0:
            slot = at // SLOT_BYTES
            if at % SLOT_BYTES == 0 and slot != own:
                entry = self._entry(fd, data, at, slot, ignored, exact)
                if entry is not None:
                    seen.add(entry.pid)
                    processes += 1
                    active += bool(entry.held or entry.reserved)
                    held += entry.held
                    if entry.reserved:
                        rss = self._rss(entry.pid) if exact else None
                        reserved += outstanding(entry.reserved, entry.rss, rss)
            at = data.find(MAGIC, (slot + 1) * SLOT_BYTES)
        if exact:
            self._statm.keep_only(seen | {self._pid})
        return SiblingReading(processes, active, reserved, held, ledger, tuple(ignored))

    def _entry(self, fd: int, data: bytes, at: int, slot: int, ignored: list[str], exact: bool) -> Record | None:
        raw = data[at:at + SLOT_BYTES]
        record = self._checked(fd, raw, at)
        if isinstance(record, str):
            ignored.append(f"slot {slot}: {record}")
            return None
        if exact and not _alive(fd, at, record):
            ignored.append(f"slot {slot}: pid {record.pid} is gone")
            _clear(fd, slot, raw)
            return None
        return record

    def _checked(self, fd: int, raw: bytes, at: int) -> Record | str:
        """The record in ``raw``; a record seen before was checked then: most readings change none."""
        known = self._parsed.get(raw)
        if known is not None:
            return known
        record = parse_record(raw)
        if isinstance(record, str):  # perhaps caught mid-write: read that slot once more
            return parse_record(os.pread(fd, SLOT_BYTES, at))
        if len(self._parsed) >= 4 * SLOTS:
            self._parsed.clear()
        self._parsed[raw] = record
        return record

    # -- publishing ----------------------------------------------------------------------------------------------

    def publish(self, key: str, reserved: int, held: int) -> None:
        """Make this process's entry in group ``key``'s ledger say ``reserved`` and ``held`` (as of now's RSS)."""
        with self._lock:
            self._check_fork()
            self._publish(key, reserved, held, self._rss(self._pid))

    def _publish(self, key: str, reserved: int, held: int, rss: int | None) -> None:
        """``rss`` None: read it now."""
        with self._lock:
            if key != self._key:
                self._leave()
                self._key = key
            fd = self._file(key)
            if fd is None or not self._claimed(fd):
                return
            assert self._slot is not None
            rss = self._rss(self._pid) or 0
            self._mine = Record(self._pid, self._mine.start or _start_ticks(), reserved, held, rss)
            os.pwrite(fd, pack_record(self._mine), self._slot * SLOT_BYTES)

    def reserve(self, key: str, more: int, held: int) -> None:
        """Publish ``more`` bytes reserved on top of what is still outstanding, and ``held``; one RSS reading."""
        with self._lock:
            self._check_fork()
            rss = self._rss(self._pid)
            self._publish(key, outstanding(self._mine.reserved, self._mine.rss, rss) + more, held, rss)

    def settle(self, key: str, held: int, less: int = 0) -> None:
        """Publish ``held``, with the reservation less ``less`` and never more than ``held`` (unwritten pages
        are pages held). Kept against the RSS it was published with, which readers still take away: no RSS
        reading, and still never less than what is unwritten."""
        with self._lock:
            self._check_fork()
            mine = self._mine
            self._publish(key, min(held, max(0, mine.reserved - less)), held, mine.rss if mine.reserved else None)

    def own_outstanding(self) -> int:
        """What this process's published reservation still stands for (less its RSS growth since)."""
        with self._lock:
            self._check_fork()
            return outstanding(self._mine.reserved, self._mine.rss, self._rss(self._pid))

    def own(self) -> Record:
        return self._mine

    def _claimed(self, fd: int) -> bool:
        """Hold a slot: a free one, or one whose owner died (the kernel dropped its lock)."""
        if self._slot is not None:
            return True
        try:
            self._slot = next((slot for slot in range(SLOTS) if _lock(fd, slot)), None)
        except OSError as exc:
            log.info("reservation ledger: cannot lock a slot: %s", exc)
            return False
        if self._slot is not None:
            return True
        log.info("reservation ledger: all %d slots are taken; this process does not publish", SLOTS)
        return False

    def _leave(self) -> None:
        """Give up the slot in the previous group's ledger (the process moved, or its limit came or went)."""
        if self._key is None or self._slot is None:
            return
        fd = self._files.get(self._key)
        if fd is not None:
            os.pwrite(fd, bytes(SLOT_BYTES), self._slot * SLOT_BYTES)
            _unlock(fd, self._slot)
        self._slot = None


_instances: weakref.WeakSet[Siblings] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The child's copies of the parent's descriptors share the parent's locks: closed at once, so the parent's
    slot is freed when the parent dies even while the child runs on."""
    for siblings in list(_instances):
        siblings._lock = threading.RLock()  # a parent's thread may have held it at the fork
        siblings.close()


_close_in_children = fork_hooks(after_in_child=_after_fork_in_child)


def _start_ticks() -> int:
    start = process_start(os.getpid())
    return int(start) if start and start.isdigit() else 0
