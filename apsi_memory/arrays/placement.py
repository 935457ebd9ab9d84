"""``memory.array``: a NumPy array in RAM while it fits the budget, memory-mapped from a spill file when it does not.

What a user gets
----------------
* Always a real ``numpy.ndarray``, zero-filled like ``numpy.zeros``: a plain ``ndarray`` in RAM, a
  ``numpy.memmap`` (a subclass) on the SSD. NumPy code cannot tell them apart; ``on_disk(x)`` can.
* Where it goes is ``decide.place(nbytes, budget_left, level)``, with ``budget_left`` the budget less the RAM our
  arrays already hold, capped at the memory free now less the pages of our arrays not written yet (see
  ``budget_left``), and the level from ``current_level()`` (re-measured at most twice a second). Arrays under
  ``SMALL_ARRAY_BYTES`` always stay in RAM, so for them neither is read: a small ``memory.array`` costs a
  ``numpy.zeros`` plus the bookkeeping that lets ``report()`` list it.
* Big RAM arrays get their own anonymous mapping (not ``malloc``) so ``free`` can hand the pages back while views
  still point at them (see below).

Under pressure
--------------
A big RAM array may later move to a spill file in place, same object and address (``moving.py``, and
docs/guides/what-moves.md): its entry then says SSD, ``moved at pressure high``, and ``free`` deletes the file.

After ``free(x)``
-----------------
The RAM or the file's blocks are given back at once, even while views exist, and nothing is unmapped, so nothing
that still points at them can crash the interpreter: a RAM array's pages are replaced in place by fresh anonymous
zero pages (``spill.detach``); a spilled array's file has its blocks punched out and is deleted (``spill.release``:
this asks for no memory, whatever the size). ``x`` (and the array ``memory.array`` returned) become read-only:
writing raises NumPy's ``ValueError: assignment destination is read-only``; reading gives zeros. Views made before
``free`` read zeros and can still be written (into RAM, or into the deleted file, that is then the view's and goes
when the view goes). Arrays under
``SMALL_ARRAY_BYTES`` live in NumPy's own allocation, which cannot be split from ``x``: ``free`` makes them
read-only and drops them from ``report()``; their few bytes go back when the last reference goes. Freeing twice,
or freeing a view after its array, does nothing.

Pickling
--------
An array on a spill file, and any view of it, is sent by ``multiprocessing`` as a reference to the file
(``sending``): a spawn worker gets a read-only view of the same file, not a copy (``pickle.dumps`` keeps the
bytes). Once sent so, it is kept until ``free`` or exit (``_kept``).

Kept files
----------
``array(..., path=)`` maps a new ``.npy`` at ``path`` (``npyfiles``), and ``keeping.keep`` may turn a spill file into
one: the entry's ``path`` is then that file, which ``free``, the collector and the exit leave alone (``spill``
deletes only files it made under their spill name).
"""

from __future__ import annotations

import mmap
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..decide import SMALL_ARRAY_BYTES, Level, Place, place, place_reason
from ..errors import ArgumentTypeError, NotFreedWarning
from ..logs import logger
from ..machinery.held import Ledger
from ..machinery.machines import Room, machine
from ..units import fmt_size
from . import moving, npyfiles, sending, spill
from .inputs import nbytes_of, normalize_dtype, normalize_shape

log = logger("apsi_memory.arrays")  # the documented logger name (docs: "What it logs")
_HUGE_PAGE_FROM = 4 << 20  # NumPy asks for transparent huge pages from 4 MiB on; so do we


class ArrayRecord(NamedTuple):
    """One live ``memory.array``: what ``report()`` lists. ``str()`` is the SPEC's line and why it went there:
    ``[200000000, 8] float32 5.960 GB SSD /home/me/.apsi/spill/apsi-….npy — 6.0 GB is more than the 1.2 GB left
    of the budget``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    place: Place
    path: str | None  # the spill file; None in RAM
    why: str = ""  # decide.place_reason when it was made: "fits the budget (1.2 of 4.0 GB left)", "pressure high"

    @property
    def reason(self) -> str:
        """The place and why: ``RAM: fits the budget (1.2 of 4.0 GB left)``, ``SSD: pressure high``."""
        return f"{self.place}: {self.why}"

    def __str__(self) -> str:
        where = f"{self.place} {self.path}" if self.path else str(self.place)
        return f"{list(self.shape)} {self.dtype} {fmt_size(self.nbytes, 3)} {where} — {self.why}"


class Reason(NamedTuple):
    """``place_reason``'s arguments, whose ``str()`` is its words: made only when ``report()`` (or the debug log)
    asks, since most arrays are never reported and the words cost more than the rest of the decision."""

    nbytes: int
    left: int
    budget: int
    level: Level

    def __str__(self) -> str:
        return place_reason(*self)


Why = str | Reason
_T = TypeVar("_T", bound="_Tracked")


class _Tracked(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to the object that holds an array's memory (the mmap, or a small array itself), carrying
    what ``report`` and ``free`` need. One object per array, its record made only when asked for: this is most of
    what a small ``memory.array`` costs over ``numpy.zeros``."""

    __slots__ = ("_why", "address", "array", "dtype", "freed", "key", "ledger", "length", "moved", "note", "path",
                 "place", "shape")

    def __new__(cls: type[_T], owner: Any, *_: Any) -> _T:  # noqa: PYI019 - typing.Self needs Python 3.11
        return super().__new__(cls, owner, _forget)  # the weakref's callback; the other arguments go to __init__

    def __init__(self, owner: Any, x: np.ndarray, place: Place, why: Why, path: str | None = None, address: int = 0,
                 length: int = 0, ledger: Ledger | None = None) -> None:
        self.key = id(owner)  # (weakref.ref.__init__ only checks the arguments __new__ already took)
        self.shape: tuple[int, ...] = x.shape
        self.dtype = x.dtype
        self.place = place
        self._why = why
        self.path = path
        # Holding the returned array strongly would keep the memory alive; a small array is its own owner.
        self.array: Any = self if x is owner else weakref.ref(x)
        self.address = address  # the pages to give back on free (0, 0 for a small array: NumPy's allocation)
        self.length = length
        self.ledger = ledger  # where a big RAM array is counted: its bytes go back there, whichever machine is in use
        self.freed = False
        self.note = ""  # why it stayed in RAM when it could not move, or that it moved only in part (moving.py)
        self.moved = 0  # bytes from the start moved to the spill file: 0 < moved < length while partly moved

    @property
    def why(self) -> str:
        return str(self._why)  # a placement's words are made here, when asked for (``Reason``)

    @why.setter
    def why(self, why: str) -> None:
        self._why = why

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.shape, self.dtype)

    def record(self) -> ArrayRecord:
        why = f"{self.why}; {self.note}" if self.note else self.why
        return ArrayRecord(self.shape, self.dtype, self.nbytes, self.place, self.path, why)


_tracked: dict[int, _Tracked] = {}  # by id(owner); entries leave when the owner is garbage-collected
_lock = threading.Lock()
# Owners of arrays pickled by reference, by id: held until free (or exit), so a receiver can still load the pickle
# once the sender has dropped the array (a Pool worker's return value: see ``sending``).
_kept: dict[int, Any] = {}
KEPT = "pickled by path: its file stays until free() or exit"  # report()'s note


# -- array -------------------------------------------------------------------------------------------------------

def array(shape: int | Sequence[int], dtype: Any = "float64", path: str | os.PathLike[str] | None = None,
          overwrite: bool = False) -> np.ndarray:
    """A zero-filled array of ``shape`` and ``dtype``: in RAM if it fits what is left of the budget and memory is
    not under ``high`` pressure, otherwise memory-mapped from a spill file under ``~/.apsi/spill``
    (``APSI_SPILL_DIR``), whose space is reserved first (a full disk raises ``DiskFullError`` here, not a crash
    later) and which ``free``, the garbage collector or the exit deletes. What is left of the budget is
    ``budget()`` less the RAM this process's arrays hold, and at most the memory free now less what they have not
    written yet; arrays under 1 MiB always stay in RAM. Either way a real ``numpy.ndarray`` (a ``numpy.memmap`` on
    the SSD, which ``on_disk`` tells); ``report()`` lists it with the reason. Under pressure a big RAM array may
    later move to a spill file in place, the same object at the same address (docs/guides/what-moves.md). With
    ``path``, memory-mapped from a new ``.npy`` file there that the library never deletes (a path refused as
    ``keep`` refuses it)."""
    dims, kind = normalize_shape(shape), normalize_dtype(dtype)
    nbytes = nbytes_of(dims, kind)
    if path is not None:
        return _in_file(dims, kind, path, overwrite)
    if nbytes < SMALL_ARRAY_BYTES:  # place() ignores budget and level here: do not read them
        return _small(dims, kind)
    where, why = _where(nbytes)
    log.debug("%s %s %s: %s", list(dims), kind, where, why)
    if where is Place.SSD:
        return _spilled(dims, kind, why)
    return _big_in_ram(dims, kind, nbytes, why)


def budget_left(budget_bytes: int, held_bytes: int, free_bytes: int, unwritten_bytes: int) -> int:
    """What RAM a new array may still take: the budget less what our RAM arrays hold, and never more than is
    free once the pages of our arrays that nobody has written yet are counted as used too. (The kernel counts
    those as free, and the default budget counts all we hold back into free; without this, arrays made before
    they are filled could add up to more than the machine has.)"""
    return max(0, min(budget_bytes - held_bytes, free_bytes - unwritten_bytes))


def _where(nbytes: int) -> tuple[Place, Reason]:
    """``place`` with the budget left, and ``place_reason``. ``nbytes`` is published to the siblings first; their
    entries are read as an upper bound, and exactly only when that says SSD."""
    m = machine()
    level, room = m.level_and_room(reserving=nbytes)  # the level (when due), budget and free from one reading
    where, why = _decide(nbytes, level, room, m.ledger.held())
    if where is Place.SSD and room.siblings:
        where, why = _decide(nbytes, level, m.exact_room(), m.ledger.held())
    if where is Place.SSD:
        m.release(nbytes)
    return where, why


def _decide(nbytes: int, level: Level, room: Room, held: int) -> tuple[Place, Reason]:
    """How much of our arrays is still unwritten is only looked up (one ``mincore`` per RAM array) when the
    answer depends on it: between "all written" and "none written"."""

    def left(unwritten: int) -> int:
        return budget_left(room.budget_bytes, held, room.free_bytes, unwritten)

    found = left(0)  # every array of ours written: the most that can be left
    if held and place(nbytes, found, level) is Place.RAM:  # (holding nothing, none is unwritten: that is all)
        found = left(held)  # none written
        if place(nbytes, found, level) is Place.SSD:
            found = left(held - _resident_in_ram())
    return place(nbytes, found, level), Reason(nbytes, found, room.budget_bytes, level)


def ram_entries(ledger: Ledger | None = None) -> list[_Tracked]:
    """The live big RAM arrays (those that can move), oldest first; with ``ledger``, those of that machine."""
    return [e for e in list(_tracked.values())
            if moving.can_move(e) and not e.freed and (ledger is None or e.ledger is ledger)]


def _resident_in_ram() -> int:
    """Bytes of our live RAM arrays that are in memory (written at least once)."""
    return sum(spill.resident(e.address, e.length) for e in ram_entries())


_SMALL_WHY = place_reason(0, 0, 0, Level.OK)


def _small(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """NumPy's own allocation, listed by ``report`` but not counted in the ledger: the budget is for big arrays,
    and the kernel already counts small ones as used like any other allocation."""
    x = np.zeros(shape, dtype)
    _remember(_Tracked(x, x, Place.RAM, _SMALL_WHY))
    return x


def anonymous_memory(nbytes: int) -> mmap.mmap:
    """Fresh zero pages of this process's own: private (Python's default, ``MAP_SHARED``, would be shared memory:
    copied into children by ``fork`` as shared, not given back by ``MADV_DONTNEED``, and without huge pages)."""
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= _HUGE_PAGE_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def _big_in_ram(shape: tuple[int, ...], dtype: np.dtype, nbytes: int, why: Why) -> np.ndarray:
    buffer = anonymous_memory(nbytes)
    x: np.ndarray = np.ndarray(shape, dtype, buffer=buffer)
    m = machine()
    ledger = m.ledger
    _remember(_Tracked(buffer, x, Place.RAM, why, None, x.ctypes.data, len(buffer), ledger))
    moving.watch(m, ram_entries)  # under pressure it may move to a spill file (moving.py)
    ledger.add(nbytes)
    return x


def _spilled(shape: tuple[int, ...], dtype: np.dtype, why: Why) -> np.memmap:
    return _track_file(spill.create(shape, dtype), why)


def _in_file(shape: tuple[int, ...], dtype: np.dtype, path: str | os.PathLike[str], overwrite: bool) -> np.ndarray:
    pending = npyfiles.Pending(path, overwrite)
    x = in_pending(pending, shape, dtype)
    publish(pending, x)
    return x


def in_pending(pending: npyfiles.Pending, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A tracked array in ``pending``'s file (``report`` names it by its path-to-be), for ``publish``."""
    x = pending.array(shape, dtype, nbytes_of(shape, dtype))
    if not isinstance(x, np.memmap):  # empty: nothing mapped, nothing to track but its record
        _remember(_Tracked(x, x, Place.SSD, _KEPT_WHY, pending.path))
        return x
    return _track_file(x, _KEPT_WHY, pending.path)


def publish(pending: npyfiles.Pending, x: np.ndarray) -> None:
    """``x``, made by ``in_pending``, whole: its file gets its name. If that fails, ``x`` is freed and the file
    removed."""
    try:
        pending.publish(x)
    except BaseException:
        free(x)
        raise


_KEPT_WHY = "asked for a file of its own (path=): apsi_memory never deletes it"


def _track_file(x: np.memmap, why: Why, path: str | None = None) -> np.memmap:
    mapping = x._mmap  # type: ignore[attr-defined]  # numpy.memmap's own mmap: the owner of the pages
    # The mapping starts at the file offset rounded down to the allocation granularity (numpy.memmap's rule).
    start = x.ctypes.data - x.offset % mmap.ALLOCATIONGRANULARITY
    _remember(_Tracked(mapping, x, Place.SSD, why, path or str(x.filename), start, len(mapping)))
    return x


def _remember(entry: _Tracked) -> None:
    _tracked[entry.key] = entry  # one dict store: atomic under the GIL, no lock needed


def _forget(entry: _Tracked) -> None:
    """The owner was garbage-collected: its memory is gone with it. (Its id cannot be reused before this runs,
    so the entry under that key is this one.)"""
    _tracked.pop(entry.key, None)
    if not entry.freed and entry.length:
        # Without the move lock: a move holds the owner, so none of this array is under way, and a collection
        # may run here inside the ledger's lock, which a move holding the move lock may be waiting for.
        _give_back_now(entry, release=False)


def _give_back(entry: _Tracked, release: bool) -> None:
    if entry.length == 0:
        return  # a small array: NumPy's allocation, not in the ledger (see _small)
    with moving.lock:  # not in the middle of a move: after it, the array is where the entry says
        _give_back_now(entry, release)


def _give_back_now(entry: _Tracked, release: bool) -> None:
    if entry.ledger is not None:  # what is still in RAM: all of it, or the rest of a partly moved array
        entry.ledger.remove(max(0, entry.nbytes - entry.moved))
        entry.ledger = None
    if release and entry.moved < entry.length and (entry.place is Place.RAM or entry.moved):
        spill.detach(entry.address + entry.moved, entry.length - entry.moved)
    if entry.place is Place.SSD and entry.path is not None:
        if release:
            spill.release(entry.path)
        else:
            spill.delete(entry.path)


# -- free, on_disk, report ---------------------------------------------------------------------------------------

def _find(x: Any) -> _Tracked | None:
    """The entry for the memory ``x`` (an array or any view of it) lives in, following ``.base``."""
    obj = x
    while obj is not None:
        entry = _tracked.get(id(obj))
        if entry is not None and entry() is obj:
            return entry
        obj = getattr(obj, "base", None)
    return None


Entry = _Tracked  # what ``keeping`` reads and updates of an array
entry_of = _find


def free(x: np.ndarray) -> None:
    """Give ``x``'s RAM back now, or delete its spill file now. ``x`` may be a view: its whole array is freed.

    Afterwards ``x`` (and the array ``memory.array`` returned) is read-only and reads zeros: writing raises NumPy's
    ``ValueError: assignment destination is read-only``. The memory goes back at once even while views exist, and
    nothing is unmapped, so nothing that still points at it can crash: views made before ``free`` read zeros and
    may still be written (into memory of their own). An array under 1 MiB is only made read-only and dropped from
    ``report()``; its bytes go back with its last reference. Freeing twice, or a view after its array, does
    nothing; an array ``memory.array`` did not make is left as it is, with a ``NotFreedWarning``."""
    if not isinstance(x, np.ndarray):
        raise ArgumentTypeError(f"memory.free takes an array made by memory.array, not {type(x).__name__}")
    entry = _find(x)
    if entry is None:  # a live array we did not make (ours stay tracked while any view of them lives)
        warnings.warn(NotFreedWarning(f"memory.free was given a {x.dtype} array of shape {list(x.shape)} that "
                                      "memory.array did not make: nothing was freed"), stacklevel=2)
        return
    with _lock:
        if entry.freed:
            return
        entry.freed = True
    _kept.pop(entry.key, None)
    _make_read_only(x, entry.array())
    _give_back(entry, release=True)


def _make_read_only(*arrays: np.ndarray | None) -> None:
    for a in arrays:
        while isinstance(a, np.ndarray):
            a.flags.writeable = False
            a = a.base


def on_disk(x: np.ndarray) -> bool:
    """Whether ``x`` lives in a file (a spill file, or any ``numpy.memmap`` mapping one) rather than RAM. A
    ``numpy.memmap`` that ``pickle`` rebuilt by value maps nothing: it is in RAM."""
    if not isinstance(x, np.ndarray):
        raise ArgumentTypeError(f"memory.on_disk takes a NumPy array, not {type(x).__name__}")
    entry = _find(x)
    if entry is not None:
        return entry.place is Place.SSD
    obj: Any = x
    while isinstance(obj, np.ndarray):
        if isinstance(obj, np.memmap) and obj._mmap is not None:  # type: ignore[attr-defined]  # (unpickled: RAM)
            return True
        obj = obj.base
    return False


def _reference_of(x: np.ndarray) -> tuple[Any, ...] | None:
    """The pickle of ``x`` as a reference to its spill file (``sending``), or ``None`` to pickle it by value: it is
    not on a whole spill file of this process (RAM, partly moved, freed, a fork child's copy)."""
    if x.base is None:  # it owns its memory, which NumPy allocated: the common case, answered first
        return None
    entry = _find(x)
    if entry is None or entry.place is not Place.SSD or entry.freed or entry.path is None:
        return None
    owner = entry()
    if owner is None or entry.moved not in (0, entry.length):
        return None
    reduced = sending.reference(x, entry.path, entry.address, entry.nbytes)
    if reduced is not None:
        _kept[entry.key] = owner
        entry.note = entry.note or KEPT
    return reduced


spill.on_first_file.append(lambda: sending.install(_reference_of))


def is_freed(x: np.ndarray) -> bool:
    """Whether ``x`` (or the array it is a view of) is a ``memory.array`` freed since: it reads zeros now."""
    entry = _find(x)
    return entry is not None and entry.freed


class Report(list[ArrayRecord]):
    """``report()``'s list, with what the other processes of this group hold reserved
    (``siblings_reserved_bytes``, as ``limits()``)."""

    siblings_reserved_bytes = 0


def report() -> Report:
    """One record per live ``memory.array`` (not freed, not collected), oldest first."""
    found = Report(entry.record() for entry in list(_tracked.values()) if not entry.freed)
    found.siblings_reserved_bytes = machine().sibling_reading().reserved_bytes
    return found
