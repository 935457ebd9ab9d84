"""RAM arrays that move to a spill file, in place, when memory runs short.

Theory of operation
-------------------
A big RAM ``memory.array`` is anonymous memory, and a container has no swap: when something else in the group grows,
the kernel can only kill. So when the level reaches ``decide.MOVE_AT`` (``high``), after pools and stores have given
back what they hold (``decide.in_relief_order``), the arrays that ``decide.arrays_to_move`` picks for what is still
missing (``decide.bytes_to_free``) move, each in pieces of ``PIECE_BYTES``: the piece is copied into a new spill
file (``spill.reserve``, data page-aligned), the file is mapped over the piece's addresses (``MAP_SHARED |
MAP_FIXED``, which hands the RAM back), its pages are written back and dropped from the page cache. The array
object, its address, every view and every byte stay; from then on it is an SSD array (``on_disk`` true,
``report()`` says ``SSD … — moved at pressure high``, ``free`` deletes the file).

Writers never lose a write: while a piece moves it is write-protected (``system.uffd``), so a thread that writes to it
waits in the kernel and continues on the file once it is mapped. Where write protection is not available, an
array moves only when no other OS thread of the process can write (``/proc/self/task``, less the library's own
threads while they wait: ``uffd.other_writers``); otherwise it stays, and ``report()`` says why.

Where moves run: with write protection on the mover thread (``_MoverThread``: the allocating or watching thread
that read the level goes on), stopped between two pieces at exit; without it on the thread that read the level.
A failed move leaves what moved on the file (``entry.moved`` bytes, ``on_disk`` true, "partly moved" in
``report()``) and the rest in RAM; a later move finishes it, ``free`` gives both back.

Nothing moves back at ``ok``: the RAM came back because the array left it, and moving back would take it again
and move out at the next rise (flapping, each time a full copy). A program that wants RAM speed again copies:
``y = memory.array(x.shape, x.dtype); y[...] = x; memory.free(x)``.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..decide import MOVE_AT, Level, Place, Relief, arrays_to_move, bytes_to_free
from ..errors import SystemCallError
from ..logs import logger
from ..system import libc, uffd
from ..system.once import fork_hooks, once
from . import spill

if TYPE_CHECKING:
    from ..machinery.held import Ledger
    from ..machinery.machines import Machine

log = logger("apsi_memory.reactions")
PIECE_BYTES = 64 << 20  # moved under write protection at a time: writers elsewhere in the array never wait
lock = threading.RLock()  # one move at a time; free() waits for it


class Movable(Protocol):
    """What a move reads and updates of an array's entry (``arrays._Tracked``); calling it gives the owner of the
    memory, or ``None`` once collected."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    address: int
    length: int
    place: Place
    path: str | None
    why: str
    note: str
    freed: bool
    ledger: Ledger | None
    moved: int

    @property
    def nbytes(self) -> int: ...

    def __call__(self) -> Any: ...


Entries = Callable[["Ledger"], Sequence[Movable]]  # a machine's live big RAM arrays (arrays.ram_entries)


class Moves:
    """What moved in this process: ``count`` arrays, ``bytes``, ``seconds`` spent moving."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.seconds = 0.0

    def __repr__(self) -> str:
        return f"<moves: {self.count} arrays, {self.bytes} bytes, {self.seconds:.3f} s>"


moves = Moves()


class Mover:
    """The component that moves arrays when its machine's level reaches ``MOVE_AT`` (told last: see
    ``levels.Components.notify``)."""

    relief = Relief.ARRAYS

    def __init__(self, machine: Machine, entries: Entries) -> None:
        self._machine = weakref.ref(machine)
        self._entries = entries

    def on_level(self, level: Level) -> None:
        """Nothing: ``on_reading`` hears every reading, this change included, after the pools and stores acted."""

    def on_reading(self, level: Level) -> None:
        """At ``MOVE_AT`` or above: with write protection the mover thread moves and the caller goes on; without
        it only the caller can know that no other thread writes, so it moves itself (when it may)."""
        machine = self._machine()
        if level >= MOVE_AT and machine is not None:
            if uffd.available() is None:
                mover.ask(machine, level, self._entries)
            else:
                relieve(machine, level, self._entries)

    def relieve(self) -> None:
        """``memory.relieve()`` gives caches back; an array is not a cache, so nothing moves for it."""


class _MoverThread:
    """One daemon thread per process that moves what the latest reading at ``MOVE_AT`` asked for, heard on an
    allocating or watching thread, which goes on meanwhile. It ends after ``IDLE_SECONDS`` without work (and starts
    again on the next), so a program that forks later forks without it. At exit it is stopped between two pieces
    (``stop``): what moved stays on the file, the rest in RAM, nothing is lost, and the program ends."""

    IDLE_SECONDS = 2.0

    def __init__(self) -> None:
        self.start_over()

    def start_over(self) -> None:
        self._changed = threading.Condition()
        self._job: tuple[weakref.ref[Machine], Level, Entries] | None = None
        self._thread: threading.Thread | None = None
        self._busy = False
        self.stopping = False

    def ask(self, machine: Machine, level: Level, entries: Entries) -> None:
        with self._changed:
            if self.stopping:
                return
            self._job = (weakref.ref(machine), level, entries)  # the latest reading replaces one not begun
            if self._thread is None:
                _stop_at_exit()
                self._thread = threading.Thread(target=self._run, name="apsi-mover", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until no move is asked for or under way (or ``timeout``): for tests, instead of sleeping."""
        with self._changed:
            return self._changed.wait_for(lambda: self._job is None and not self._busy, timeout)

    def _run(self) -> None:
        with uffd.quiet():  # moving, it writes to no array (only the chain it runs, which is the move)
            while (job := self._next()) is not None:
                try:
                    machine = job[0]()
                    if machine is not None:
                        relieve(machine, job[1], job[2])
                    del machine
                except Exception:  # the thread must outlive a failed move; the error is still logged
                    log.exception("moving arrays failed")
                finally:
                    with self._changed:
                        self._busy = False
                        self._changed.notify_all()

    def _next(self) -> tuple[weakref.ref[Machine], Level, Entries] | None:
        with self._changed:
            self._changed.wait_for(lambda: self._job is not None or self.stopping, self.IDLE_SECONDS)
            job, self._job = self._job, None
            if job is None or self.stopping:
                self._thread, self._job = None, None
                self._changed.notify_all()
                return None
            self._busy = True
            return job

    def stop(self, timeout: float = 30.0) -> None:
        """No new move; the one under way ends after its current piece."""
        with self._changed:
            self.stopping = True
            thread = self._thread
            self._changed.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


mover = _MoverThread()


@once
def _stop_at_exit() -> None:
    atexit.register(mover.stop)  # runs before the interpreter freezes daemon threads


_movers: weakref.WeakKeyDictionary[Any, Mover] = weakref.WeakKeyDictionary()


def watch(machine: Machine, entries: Entries) -> None:
    """Make sure ``machine``'s components include a mover (the first big RAM array on a machine calls this)."""
    if machine not in _movers:
        set_up_fork()
        mover = _movers.setdefault(machine, Mover(machine, entries))
        machine.components.register(mover)


def relieve(machine: Machine, level: Level, ram_entries: Entries) -> int:
    """Move as many of ``ram_entries(machine.ledger)`` as the reading says are needed; returns how many moved. A
    move already under way in another thread is not waited for."""
    if not lock.acquire(blocking=False):
        return 0
    try:
        reading = machine.memory()
        entries = ram_entries(machine.ledger)
        chosen = arrays_to_move([(i, e.nbytes) for i, e in enumerate(entries)],
                                bytes_to_free(reading.free, reading.usable))
        return sum(move(entries[i], level) for i in chosen)
    finally:
        lock.release()


def why_not_safe() -> str | None:
    """Why an array cannot move now, or ``None``. Without write protection only while no other OS thread can write
    (``uffd.other_writers``: ``_thread`` and native threads count, the library's waiting watchers do not)."""
    why = uffd.available()
    if why is None:
        return None
    others = uffd.other_writers()
    if others == 0:
        return None
    counted = "threads that cannot be counted" if others is None else f"{others} other threads"
    return f"{why}, and {counted} run (without it an array moves only while no other thread can write to it)"


def can_move(entry: Movable) -> bool:
    """A big RAM array, or one partly moved (a failed move's rest: a later move finishes it)."""
    return bool(entry.length) and (entry.place is Place.RAM or 0 < entry.moved < entry.length)


def move(entry: Movable, level: Level) -> bool:
    """Move one RAM array (or the rest of a partly moved one) to a spill file in place; whether it moved all of
    it. Why it could not is kept for ``report()``; a full disk or failed call is logged (WARNING): what had not
    moved stays in RAM, what had stays on the file (``on_disk`` true, ``report()`` says "partly moved")."""
    with lock:
        owner = entry()  # held: the memory cannot go away during the move
        if owner is None or entry.freed or not can_move(entry):
            return False
        why = why_not_safe()
        if why is not None:
            entry.note = f"stayed in RAM at pressure {level}: {why}"
            return False
        started = time.perf_counter()
        try:
            path, moved = _move_pieces(entry)
        except OSError as exc:
            entry.note = f"stayed in RAM at pressure {level}: {exc}"
            log.warning("an array of %d bytes could not move to a spill file: %s", entry.nbytes, exc)
            return False
        _now_on_disk(entry, path, level, moved)
        took = time.perf_counter() - started
        moves.count, moves.bytes, moves.seconds = moves.count + 1, moves.bytes + moved, moves.seconds + took
        log.info("array of %d bytes moved to %s at pressure %s in %.3f s", entry.nbytes, path, level, took)
        del owner
        return entry.moved == entry.length


def _spill_file(entry: Movable) -> tuple[str, int, int]:
    """A new spill file (path, descriptor, where the data starts), or that of a partly moved array again."""
    if not entry.moved or entry.path is None:
        return spill.reserve(entry.shape, entry.dtype, page_aligned=True)
    fd = os.open(entry.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    return entry.path, fd, os.fstat(fd).st_size - uffd.page_up(entry.length)  # it ends at a page (reserve)


def _move_pieces(entry: Movable) -> tuple[str, int]:
    """The spill file's path and how many bytes moved now (after ``entry.moved``). A piece counts as moved once
    it is mapped from the file, its write-back failing or not: a failure after that leaves the array partly on
    the file (it is then an SSD array: its file must stay) and says so in ``entry.note``."""
    path, fd, offset = _spill_file(entry)
    guard, done, moved = None, entry.moved, 0
    try:
        guard = uffd.Guard(entry.address + done, entry.length - done) if uffd.available() is None else None
        for start in range(done, entry.length, PIECE_BYTES):
            if mover.stopping:  # the program is ending: the rest stays in RAM
                raise SystemCallError(errno.EINTR, "the program is ending: the move stopped between two pieces")
            n = min(PIECE_BYTES, entry.length - start)
            _map_piece(guard, entry.address + start, n, fd, offset + start)
            moved += n
            _write_back(fd, offset + start, n)
    except OSError as exc:
        if done + moved == 0:
            spill.delete(path)
            raise
        entry.note = f"partly moved ({done + moved} of {entry.length} bytes): {exc}"
    finally:
        if guard is not None:
            guard.close()
        os.close(fd)  # the mapping keeps the file
    return path, moved


def _map_piece(guard: uffd.Guard | None, address: int, n: int, fd: int, offset: int) -> None:
    # A first copy with the GIL released puts the piece in the page cache, so the copy inside the protected chain
    # only overwrites pages already there and cannot fail on the way to a full disk.
    os.pwrite(fd, memoryview((ctypes.c_char * n).from_address(address)).cast("B"), offset)
    if guard is not None:
        guard.move(address, n, fd, offset)
    else:
        uffd.copy_and_map(address, n, fd, offset)


def _write_back(fd: int, offset: int, n: int) -> None:
    """Written back, then dropped: clean pages the kernel may take at once (the array reads them back on use)."""
    if not libc.sync_file_range(fd, offset, n):
        os.fdatasync(fd)
    libc.fadvise(fd, offset, n, getattr(os, "POSIX_FADV_DONTNEED", 4))


def _now_on_disk(entry: Movable, path: str, level: Level, moved: int) -> None:
    """The ledger gives back what left RAM; the entry says SSD (all of it, or ``entry.note`` says what part)."""
    before, entry.moved = entry.moved, entry.moved + moved
    if entry.ledger is not None:
        entry.ledger.remove(min(entry.nbytes, entry.moved) - min(entry.nbytes, before))
        if entry.moved >= entry.length:
            entry.ledger = None
    entry.place, entry.path, entry.why = Place.SSD, path, f"moved at pressure {level}"
    if entry.moved == entry.length:
        entry.note = ""


def _fresh_lock_in_child() -> None:
    """A fork during a move copies the lock taken: the child gets a free one (its arrays are its own copies), and
    no mover thread (threads do not survive a fork)."""
    global lock
    lock = threading.RLock()
    mover.start_over()


set_up_fork = fork_hooks(after_in_child=_fresh_lock_in_child)

