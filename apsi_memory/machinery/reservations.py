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

The file has ``SLOTS`` fixed-size slots, one per process, each held with a record lock for the process's life;
a reader takes the whole file with one ``pread`` and waits on no lock (``slots`` says how, and who leaves when).

Nothing stale can lie
---------------------
* A dead process (SIGKILL, OOM kill) stops counting at once: the kernel drops its lock when it dies, and a reader
  asks about the lock of each used slot (``F_OFD_GETLK``, one system call), and clears the slot. Off Linux, the
  record's pid and start time are checked instead (``processes.owner_alive``). A lock that outlived its owner (in
  a child forked without Python's hooks) is seen through the owner's ``statm``: a process is ``(pid, start)``
  everywhere, so a recycled pid is never taken for the process that published.
* A reservation shrinks as its owner's pages are charged: the reader takes away the owner's growth in anonymous
  RSS since it published (``/proc/<pid>/statm``, kept open). Chosen over the owner updating as it writes because
  NumPy writes never pass through the library: only the kernel knows, and it says so at once. Any page the owner
  touched is charged to the group, so free memory fell by as much as the figure shrank. A claim above the group's
  usable memory is nonsense: counted as that much, and said once (WARNING).
* A used slot that does not check (a torn write, a foreign file, a flipped byte) is read once more, then ignored
  with its reason (``SiblingReading.ignored``), never trusted; while its lock is held, a WARNING names the slot.
* Any error of the ledger's file (a full disk, EACCES, EROFS, EIO, a file that cannot be made whole): one WARNING
  on ``apsi_memory.siblings`` naming the file and the errno, and the process goes on as with no siblings.

Credit
------
A full step (publish, then read) costs three system calls; a small placement costs little more. So a process with
room takes, at a full step of a placement no bigger than it, a credit of ``C`` bytes (``Machine``: 16 MiB, at most a
256th of usable memory) on top: it publishes ``reserved = outstanding + more + C``. Its next placements of at most
what is left of ``C`` draw on it (``draw``) with no system call, and take the siblings as that step read them.
Why no sibling can be overrun by them: every sibling whose reading came after our publish counted ``C`` as ours;
one whose reading came before it published before that reading, so before ours, which saw it. Each sibling's
placement therefore either counted all of ``C`` or was counted by us when ``C`` was checked to fit (the full step
takes it only where, with the siblings as last read, the room after the placement holds ``CREDIT_ROOM`` credits,
and gives it up (``revoke``) where the fresh reading says otherwise). What a draw places is inside ``C``: the memory
left for it is already set aside in every count that matters, even counts we have not read. The stale sibling
reading only shapes our own room: their reservations as they were, against free memory now, which their charged
pages have already lowered, so it errs on the side of too little room.

* Our RSS growth. Readers take our RSS growth since the publish off ``reserved``; so ``C`` is published inside
  ``reserved``, and pages of a drawn array that we write shrink the figure by as much as free memory falls: what a
  reader sees left (free less claim) stays what it was at the publish, and never counts ``C`` twice. Growth that no
  placement reserved (NumPy temporaries) shrinks it too, as it always did: that memory is charged, and the ledger
  covers the library's placements, not all of a process's memory (at most ``C`` more of ours is exposed so, for at
  most ``CHECK_EVERY``).
* The next full step publishes ``outstanding`` of our reservation less the credit not drawn and the frees not
  published (``_real``), then a fresh ``C``: an unspent credit is never carried into the next.
* A free does not give bytes back to the credit: a freed array written before the publish lowers our RSS below
  what we published with, which readers do not count (growth is at least 0), so bytes given back there would be
  placed twice. It publishes nothing while the bytes it would take off (``_unsaid``) stay within ``C``: the
  published figure then stands over ours by at most ``C``, which errs on the safe side; beyond, it publishes.
  The record's ``held`` may be as old as the full step (``tell`` keeps the newest).
* A fork: the child's entry starts afresh (``ForkMark``), with no slot and no credit; a draw is refused where the
  mark changed, before any state is read. Exit and death free the slot, credit and all, as before.
* Tight memory, a level other than OK, a placement bigger than ``C``: no credit taken, and every placement takes
  the full step as before; a placement that finds the room after it under ``CREDIT_ROOM`` credits gives up what
  is left (``revoke``: it stays published, as ``_unsaid``, until the next publish). A level other than OK, a check
  of the file due (``CHECK_EVERY``), another group, no slot: no draw.
* ``siblings()`` of another process counts our credit in ``reserved_bytes`` (and us as active).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..system import paths
from ..system.once import ForkMark
from .ledger_file import LedgerFile
from .ledger_life import instances
from .reader import MemoryReading
from .slots import (
    FILE_BYTES,
    MAGIC,  # noqa: F401  (re-exported, as parse_record: the ledger's names before ``slots`` was split off)
    SLOT_BYTES,
    Parsed,
    Record,
    Statm,
    clear,
    outstanding,
    pack_record,
    parse_record,  # noqa: F401
    start_ticks,
)
from .slots import held as slot_held

if TYPE_CHECKING:  # imported where the siblings are read: a dataclass, slow to define, that a store never needs
    from .reading import SiblingReading

_USED = re.compile(rb"[^\x00]")  # a used slot has a byte that is not zero


def group_key(reading: MemoryReading) -> str:
    """The file name for the group whose limit binds ``reading``'s process (``CgroupMemory.binding``: processes
    in child groups of one limited parent share the parent's memory, so its ledger); ``host`` without a limit."""
    if not reading.limited or reading.cgroup is None or reading.cgroup.binding is None:
        return "reservations-host"
    return paths.ledger_name(reading.cgroup.version, reading.cgroup.binding)


# -- where ---------------------------------------------------------------------------------------------------------

_shared: Siblings | None = None


def shared() -> Siblings:
    """This process's entry in the ledgers (one, so that its locks and records are never its own rivals)."""
    global _shared
    if _shared is None:
        _shared = Siblings()
    return _shared


# -- the ledger ----------------------------------------------------------------------------------------------------

class Siblings(LedgerFile):
    """This process's view of, and entry in, the reservation ledger of its memory group (see the module
    docstring). ``directories``: where to look for a safe folder (default ``candidate_dirs()``). A process has
    one (``shared()``); tests make several, each standing for a process: ``pid`` (and ``start``, else 0: then the
    slot's lock alone says it lives) is then written in its record, ``anon_rss(pid)`` stands for
    ``/proc/<pid>/statm``, and ``root`` for the folder ``proc/`` is read under.

    ``on_step``: called with ``"published"`` after ``reserve`` and ``"read"`` after ``read``, so that a test can
    run another placement between the two steps of one (None: nothing called)."""

    def __init__(self, directories: list[str] | None = None, pid: int | None = None,
                 anon_rss: Callable[[int], int | None] | None = None, start: int | None = None,
                 root: str = "/") -> None:
        super().__init__(directories)
        self._given = (pid, start if start is not None else (0 if pid else None), anon_rss)
        self._root = root
        self.on_step: Callable[[str], None] | None = None
        self._lock = threading.RLock()  # reentrant: a garbage-collected array may publish from inside a publish
        self._reset()
        instances.add(self)

    def _reset(self) -> None:
        self._mark = ForkMark()  # a forked child has no slot and no record of its own: it starts afresh
        pid, self._start, rss = self._given
        self._pid = pid or os.getpid()
        self._reset_file()
        self._mine = Record(self._pid, 0, 0, 0, 0)
        self._credit = 0  # of the published reservation, bytes not placed yet that a placement may draw (see Credit)
        self._size = 0  # the credit taken at the last full step (0: none)
        self._unsaid = 0  # bytes the published reservation stands over what it would be, unpublished frees
        self._held = 0  # the RAM arrays' bytes last told (published, or not where the credit covers it)
        self._last: SiblingReading | None = None  # the siblings as the full step that took the credit read them
        self._statm = Statm(self._root)
        self._parsed = Parsed()
        self._rough: tuple[object, bytes, bytes, SiblingReading] | None = None  # (key, cap, slot), before, after, bound
        self._buffer = bytearray(FILE_BYTES)  # ``_whole_file``'s
        self._rss: Callable[[int, int], int | None] = (
            self._statm.anon_rss if rss is None else lambda pid, start: rss(pid))

    def _check_fork(self) -> None:
        if not self._mark.same():  # the kernel's mark: a fork without Python's hooks is seen too
            self._forget()

    def _forget(self) -> None:
        """Close this entry's descriptors without writing or unlocking: a forked child's copies share the
        parent's locks and slot, which stay the parent's."""
        for fd, _ in self._files.values():
            os.close(fd)
        self._statm.close()
        if isinstance(self._folder, tuple):
            os.close(self._folder[0])
        self._reset()

    def close(self) -> None:
        """Leave the ledgers: this entry's slot is zeroed and free for another, and a file no live process
        uses any more is removed (in a forked child: only its copies of the descriptors are closed)."""
        with self._lock:
            if self._mark.same():
                with contextlib.suppress(OSError):
                    self._leave()
                for key in list(self._files):
                    self._drop(key, remove=True)
            self._forget()

    # -- reading -------------------------------------------------------------------------------------------------

    def read(self, key: str, exact: bool = True, cap: int | None = None) -> SiblingReading:
        """The other live processes' entries in group ``key``'s ledger: one pread, one ``F_OFD_GETLK`` and one
        ``statm`` pread per used slot. Not ``exact``: only the pread, every intact record counted in full, alive
        or not — an upper bound, enough when the answer is RAM even so. ``cap``: the group's usable memory; a
        claim above it is nonsense, counted as ``cap`` (and said once)."""
        found = self._reading(key, exact, cap)
        if self.on_step is not None:
            self.on_step("read")
        return found

    def _reading(self, key: str, exact: bool, cap: int | None) -> SiblingReading:
        from .reading import SiblingReading
        with self._lock:
            try:
                self._check_fork()
                return self._read(key, exact, cap) or SiblingReading()  # None: no ledger file
            except OSError as exc:
                self._give_up(key, exc)
                return SiblingReading()

    def _read(self, key: str, exact: bool, cap: int | None) -> SiblingReading | None:
        fd = self._file(key)
        if fd is None:
            return None
        data = os.pread(fd, FILE_BYTES, 0)
        own = self._slot if key == self._key else None  # never our own: its lock is ours, so it would seem dead
        if exact:
            return self._tally(fd, data, own, self.path(key), exact, cap)
        return self._upper_bound(key, cap, fd, data, own)

    def _upper_bound(self, key: str, cap: int | None, fd: int, data: bytes | bytearray,
                     own: int | None) -> SiblingReading:
        # It depends on the others' records only: while their bytes stay the same (compared in place), so does it.
        rough = self._rough
        if rough is None or rough[0] != (key, cap, own) or not (data.startswith(rough[1]) and data.endswith(rough[2])):
            data = bytes(data)  # kept in part and parsed: not ``_whole_file``'s buffer, which the next read refills
            cut = FILE_BYTES if own is None else own * SLOT_BYTES
            rough = self._rough = ((key, cap, own), data[:cut], data[cut + SLOT_BYTES:],
                                   self._tally(fd, data, own, self.path(key), False, cap))
        return rough[3]

    def _tally(self, fd: int, data: bytes, own: int | None, ledger: str | None, exact: bool,
               cap: int | None) -> SiblingReading:
        from .reading import Sibling, SiblingReading
        each: list[Sibling] = []
        ignored: list[str] = []
        seen = {(self._pid, self._mine.start)}
        used = _USED.search(data)
        while used:
            slot = used.start() // SLOT_BYTES
            entry = None if slot == own else self._entry(fd, data, slot, ignored, exact)
            if entry is not None:
                record, rss = entry
                seen.add((record.pid, record.start))
                each.append(Sibling(record.pid, record.held, self._claim(record, rss, slot, ledger, cap),
                                    record.rss if rss is None else rss))
            used = _USED.search(data, (slot + 1) * SLOT_BYTES)
        if exact:
            self._statm.keep_only(seen)
        return SiblingReading.of(each, ledger, ignored)

    def _entry(self, fd: int, data: bytes, slot: int, ignored: list[str],
               exact: bool) -> tuple[Record, int | None] | None:
        """The live record in ``slot`` and its owner's RSS now (exact only), or None with the reason in
        ``ignored``: a slot nobody holds is cleared, a live one that does not check is said (WARNING, once)."""
        raw = data[slot * SLOT_BYTES:(slot + 1) * SLOT_BYTES]
        record = self._parsed.check(fd, raw, slot * SLOT_BYTES)
        if isinstance(record, str):
            if exact and not slot_held(fd, slot, Record(0, 0, 0, 0, 0)):
                clear(fd, slot, raw)
                return None
            ignored.append(f"slot {slot}: {record}")
            if exact:  # known to be held: a live process's record lost, said once
                self._say((slot, raw), "reservation ledger: slot %d is held but holds no record (%s): not "
                          "counted", slot, record)
            return None
        if not exact:
            return record, None
        if not slot_held(fd, slot, record):
            ignored.append(f"slot {slot}: pid {record.pid} is gone")
            clear(fd, slot, raw)
            return None
        rss = self._rss(record.pid, record.start)
        if (record.pid, record.start) in self._statm.dead:  # its lock outlived it, in a child forked without hooks
            ignored.append(f"slot {slot}: pid {record.pid} is gone (a process it forked still holds the slot)")
            clear(fd, slot, raw, take_lock=False)
            return None
        return record, rss

    def _claim(self, record: Record, rss: int | None, slot: int, ledger: str | None, cap: int | None) -> int:
        claim = outstanding(record.reserved, record.rss, rss) if record.reserved else 0
        if cap is None or claim <= cap:
            return claim
        self._say(("claim", record.pid, record.start), "reservation ledger %s: slot %d (pid %d) claims %d bytes, "
                  "more than the group's usable memory (%d): nonsense, counted as that", ledger, slot,
                  record.pid, record.reserved, cap)
        return cap

    # -- publishing ----------------------------------------------------------------------------------------------

    def publish(self, key: str, reserved: int, held: int) -> None:
        """Make this process's entry in group ``key``'s ledger say ``reserved`` and ``held`` (as of now's RSS)."""
        with self._lock:
            try:
                self._check_fork()
                self._publish(key, reserved, held, self._own_rss())
            except OSError as exc:
                self._give_up(key, exc)

    def _own_rss(self) -> int | None:
        return self._rss(self._pid, self._mine.start)

    def _publish(self, key: str, reserved: int, held: int, rss: int | None, credit: int = 0) -> None:
        """Publish ``reserved`` plus ``credit``; ``rss`` None: read it now."""
        if key != self._key:
            with contextlib.suppress(OSError):
                self._leave()
            self._key, self._size = key, 0  # a credit is of one group's ledger
        if self._start is None:
            self._start = start_ticks()
        rss = (self._own_rss() if rss is None else rss) or 0
        self._mine = Record(self._pid, self._start, reserved + credit, held, rss)
        self._credit, self._unsaid, self._held = credit, 0, held
        self._write(key, self._file(key))

    def reserve(self, key: str, more: int, held: int, credit: int = 0) -> None:
        """Publish ``more`` bytes reserved on top of what is still outstanding, and ``held``; one RSS reading.
        ``credit``: bytes reserved on top for later placements to draw (``draw``)."""
        with self._lock:
            try:
                self._check_fork()
                rss = self._own_rss()
                self._publish(key, outstanding(self._real(), self._mine.rss, rss) + more, held, rss, credit)
                self._size = credit
            except OSError as exc:
                self._give_up(key, exc)
        if self.on_step is not None:
            self.on_step("published")

    def reserve_and_read(self, key: str, more: int, held: int, cap: int | None, credit: int = 0) -> SiblingReading:
        """A placement's two steps, in this order: ``reserve(key, more, held, credit)``, then ``read(key,
        exact=False, cap=cap)``; published before read, so of two placements at once at least one sees the other.
        Where this process's slot in ``key``'s file is held and not due for its check (every placement but the
        first of each second), flat: one ``statm`` read, one ``pwrite``, one ``preadv`` (``_whole_file``), and no
        ``getpid`` (issue 29). The reading is kept for the placements that draw on ``credit`` (``draw``)."""
        with self._lock:
            self._last = self._reserve_and_read(key, more, held, cap, credit)
            found = self._last
        if self.on_step is not None:
            self.on_step("read")
        return found

    def _reserve_and_read(self, key: str, more: int, held: int, cap: int | None, credit: int) -> SiblingReading:
        at, mine = self._held_slot(key), self._mine
        rss = None if at is None else self._rss(self._pid, mine.start)
        if at is None or rss is None:  # the first placement, a check due, another group, a fork, no statm
            self.reserve(key, more, held, credit)
            return self._reading(key, False, cap)
        fd, slot = at
        try:
            self._put(at, outstanding(self._real(), mine.rss, rss) + more, held, rss, credit)
            self._size = credit
            if self.on_step is not None:
                self.on_step("published")
            return self._upper_bound(key, cap, fd, self._whole_file(fd), slot)
        except OSError as exc:
            from .reading import SiblingReading

            self._give_up(key, exc)
            return SiblingReading()

    def _whole_file(self, fd: int) -> bytes | bytearray:
        """The ledger file as one ``pread`` of it reads it, into a buffer kept for the purpose: a full step reads it
        every time, and a fresh 6 KiB bytes object costs several times the read (a short read is copied out)."""
        buffer = self._buffer
        if not hasattr(os, "preadv"):  # not on every system (macOS before 11)
            return os.pread(fd, FILE_BYTES, 0)
        done = os.preadv(fd, [buffer], 0)
        return buffer if done == FILE_BYTES else bytes(buffer[:done])

    def draw(self, key: str, more: int) -> SiblingReading | None:
        """Take ``more`` bytes of this process's credit in ``key``'s ledger, without a system call, and the siblings
        as the full step that published the credit read them; None where the credit is short, or where the full
        step is due (``_held_slot``: a check of the file, a fork, another group): then the placement takes it."""
        with self._lock:
            if more > self._credit or self._last is None or self._held_slot(key) is None:
                return None
            self._credit -= more
            self._held += more  # told ahead, as a full step publishes it: the array's arrival asks nothing more
            return self._last

    @property
    def credit_size(self) -> int:
        """The credit the last full step of a placement took (0: none, or given up since)."""
        return self._size

    @property
    def last(self) -> SiblingReading | None:
        """The siblings as the last full step of a placement read them (None before one)."""
        return self._last

    def revoke(self) -> None:
        """Draw no more on the credit (memory is tight): what is left of it stays published until the next
        publish, counted as ``_unsaid``."""
        with self._lock:
            self._unsaid += self._credit
            self._credit = self._size = 0  # and the next free publishes what it leaves

    def _real(self) -> int:
        """Our published reservation less the credit not drawn and the frees not published: what it would be
        without the credit."""
        return max(0, self._mine.reserved - self._credit - self._unsaid)

    def _put(self, at: tuple[int, int], reserved: int, held: int, rss: int, credit: int) -> None:
        """Our record, with ``reserved`` plus ``credit``, ``held`` and ``rss``, straight to our slot (``_held_slot``'s)."""
        mine = self._mine
        self._mine = Record(mine.pid, mine.start, reserved + credit, held, rss)
        self._credit, self._unsaid, self._held = credit, 0, held
        os.pwrite(at[0], pack_record(self._mine), at[1] * SLOT_BYTES)

    def settle(self, key: str, held: int, less: int = 0) -> None:
        """Publish ``held``, with the reservation less ``less`` and never more than ``held`` (unwritten pages
        are pages held). Kept against the RSS it was published with, which readers still take away: no RSS
        reading, and still never less than what is unwritten. While a credit was taken and what this takes off
        stays within its size, nothing is written (``_unsaid``: the module's Credit)."""
        with self._lock:
            try:
                self._check_fork()  # first: a forked child's record is not its parent's
                real = self._real()
                reserved = min(held, max(0, real - less))
                if self._size and key == self._key and self._unsaid + real - reserved <= self._size:
                    # Within the credit's size: published later (see Credit). Nothing is written, so our slot need
                    # not be looked at: a check of the file due or a slot lost waits for the next full step.
                    self._unsaid += real - reserved
                    self._held = held
                    return
                mine, at = self._mine, self._held_slot(key)
                credit = self._credit if key == self._key else 0
                if at is not None and mine.reserved:  # a freed array's bytes, straight to our slot (one pwrite)
                    self._put(at, reserved, held, mine.rss, credit)
                    return
                self._publish(key, reserved, held, mine.rss if mine.reserved else None, credit)
            except OSError as exc:
                self._give_up(key, exc)

    def own_outstanding(self) -> int:
        """What this process's published reservation still stands for (less its RSS growth since)."""
        with self._lock:
            self._check_fork()
            return outstanding(self._mine.reserved, self._mine.rss, self._own_rss())

    def own(self) -> Record:
        return self._mine

    def tell(self, held: int) -> None:
        """Our RAM arrays' total is now ``held`` (the machine's ``Ledger`` says so after each change): published
        (``settle``) unless it is the total told last, by a publish, a ``settle`` or a draw (which tells its array's
        bytes ahead), or this process has published nothing yet. (The record's ``held`` may be older than the total
        told: a credit's placements and frees are not published one by one.)"""
        key = self._key
        if key is not None and held != self._held:
            self.settle(key, held)
