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
array moves only when this is the only Python thread (no other thread can write); otherwise it stays, and
``report()`` says why.

Nothing moves back at ``ok``: the RAM came back because the array left it, and moving back would take it again
and move out at the next rise (flapping, each time a full copy). A program that wants RAM speed again copies:
``y = memory.array(x.shape, x.dtype); y[...] = x; memory.free(x)``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..decide import MOVE_AT, Level, Place, Relief, arrays_to_move, bytes_to_free
from ..system import libc, uffd
from ..system.once import fork_hooks
from . import spill

if TYPE_CHECKING:
    from ..machinery.held import Ledger
    from ..machinery.machines import Machine

log = logging.getLogger("apsi_memory.reactions")
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
        machine = self._machine()
        if level >= MOVE_AT and machine is not None:
            relieve(machine, level, self._entries)

    def relieve(self) -> None:
        """``memory.relieve()`` gives caches back; an array is not a cache, so nothing moves for it."""


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
    """Why an array cannot move now, or ``None``."""
    why = uffd.available()
    if why is None or threading.active_count() == 1:
        return None
    return f"{why}, and {threading.active_count()} Python threads run (without it only a lone thread moves safely)"


def move(entry: Movable, level: Level) -> bool:
    """Move one RAM array to a new spill file in place; whether it moved. Why it could not is kept for
    ``report()``; a full disk or failed call is logged (WARNING) and the array stays."""
    with lock:
        owner = entry()  # held: the memory cannot go away during the move
        if owner is None or entry.freed or entry.place is not Place.RAM or not entry.length:
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
        return True


def _move_pieces(entry: Movable) -> tuple[str, int]:
    """The spill file's path and how many bytes moved. A failure after the first piece leaves the array partly
    on the file (it is then an SSD array: its file must stay) and says so in ``entry.note``."""
    path, fd, offset = spill.reserve(entry.shape, entry.dtype, page_aligned=True)
    guard = None
    moved = 0
    try:
        guard = uffd.Guard(entry.address, entry.length) if uffd.available() is None else None
        for start in range(0, entry.length, PIECE_BYTES):
            n = min(PIECE_BYTES, entry.length - start)
            _move_piece(guard, entry.address + start, n, fd, offset + start)
            moved += n
    except OSError as exc:
        if moved == 0:
            spill.delete(path)
            raise
        entry.note = f"partly moved ({moved} of {entry.length} bytes): {exc}"
    finally:
        if guard is not None:
            guard.close()
        os.close(fd)  # the mapping keeps the file
    return path, moved


def _move_piece(guard: uffd.Guard | None, address: int, n: int, fd: int, offset: int) -> None:
    # A first copy with the GIL released puts the piece in the page cache, so the copy inside the protected chain
    # only overwrites pages already there and cannot fail on the way to a full disk.
    os.pwrite(fd, memoryview((ctypes.c_char * n).from_address(address)).cast("B"), offset)
    if guard is not None:
        guard.move(address, n, fd, offset)
    else:
        uffd.copy_and_map(address, n, fd, offset)
    # Written back, then dropped: clean pages the kernel may take at once (the array reads them back on use).
    if not libc.sync_file_range(fd, offset, n):
        os.fdatasync(fd)
    libc.fadvise(fd, offset, n, getattr(os, "POSIX_FADV_DONTNEED", 4))


def _now_on_disk(entry: Movable, path: str, level: Level, moved: int) -> None:
    if entry.ledger is not None:
        entry.ledger.remove(entry.nbytes)
        entry.ledger = None
    entry.place, entry.path, entry.why = Place.SSD, path, f"moved at pressure {level}"
    if moved == entry.length:
        entry.note = ""


def _fresh_lock_in_child() -> None:
    """A fork during a move copies the lock taken: the child gets a free one (its arrays are its own copies)."""
    global lock
    lock = threading.RLock()


set_up_fork = fork_hooks(after_in_child=_fresh_lock_in_child)

