"""``memory.pool``: big temporaries that are already mapped.

Fresh memory costs a page fault and the kernel's zeroing for every page the first time it is touched, and the
unmapping when it is freed; a pool hands back buffers whose pages are already there.

``zero=True`` without paying for it
-----------------------------------
Clearing a reused 256 MiB buffer with ``memset`` when it is taken puts a full pass over the buffer on the
caller's thread for every take, next to the kernel's own zeroing of fresh pages (fast, with huge pages): on the
issue's machine that was slower than fresh memory, here it kept only about half of what a pool gains
(``benchmarks/bench_pool.py`` measures both). Instead a buffer given back is cleared by one background thread
while the caller works on its next buffer, and ``take(zero=True)`` only hands out buffers already cleared; when
none is ready it maps fresh memory, which the kernel hands out zeroed. The caller's thread never clears memory; the
clearing runs on another core (with one core, or all cores busy, it costs what memset-on-take costs). Buffers are
only cleared in the background while the pool's last ``take`` asked for ``zero=True``.

Bounds and pressure
-------------------
Spare buffers (given back, not handed out) are bounded by ``max_bytes``; the oldest are dropped first. At ``high``
pressure and above the pool drops every spare and keeps none (``on_level``), and ``relieve()`` drops them now;
back at ``ok`` it keeps spares again. Dropping a spare gives its pages back at once (``MADV_DONTNEED``), even if a
stale reference to a given-back array still exists (it then reads zeros).

Handed-out arrays are plain ``numpy.ndarray``s over the pool's buffer. ``give(a)`` makes ``a`` read-only, so a
write through it after giving it back raises NumPy's ``ValueError`` instead of corrupting the next user's data.
A view of ``a`` made before ``give`` cannot be made read-only (NumPy has no way to reach it; ``mprotect`` would
turn a stale write into a crash): ``give`` sees that such a view still holds the buffer and does not reuse it, so
the view keeps its values and a write through it reaches no later ``take``'s data; the buffer is freed with the
view. Keeping a slice of a temporary as a result is therefore safe. An array that is never given back is simply
freed when it is no longer used.
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..decide import Level, Relief
from ..errors import PoolError
from ..machinery.machines import machine
from ..system.once import each, fork_hooks
from ..units import byte_count, flag, fmt_size, parse_size
from .inputs import nbytes_of, normalize_dtype, normalize_shape
from .placement import anonymous_memory

PAGE = mmap.PAGESIZE
DEFAULT_SHARE_OF_BUDGET = 10  # spares may hold a tenth of the budget


# -- pure rules --------------------------------------------------------------------------------------------------

def capacity_for(nbytes: int) -> int:
    """Buffers are whole pages (an mmap cannot be empty)."""
    return max(PAGE, -(-nbytes // PAGE) * PAGE)


def fits(capacity: int, nbytes: int) -> bool:
    """A spare serves a request it is big enough for, wasting at most half of itself."""
    return nbytes <= capacity <= max(2 * nbytes, PAGE)


def choose_spare(spares: Sequence[tuple[int, bool, bool]], nbytes: int, zero: bool) -> int | None:
    """Which spare ``(capacity, clean, busy)`` to hand out for ``nbytes``, or ``None`` (allocate fresh).

    Never one being cleared (busy); only a clean one when ``zero``; the smallest that fits; for ``zero=False`` a
    dirty one before a clean one (clean ones are kept for ``zero=True``); among equals the oldest (first)."""
    best: int | None = None
    best_key: tuple[int, bool] | None = None
    for index, (capacity, clean, busy) in enumerate(spares):
        if busy or (zero and not clean) or not fits(capacity, nbytes):
            continue
        key = (capacity, clean)
        if best_key is None or key < best_key:
            best, best_key = index, key
    return best


def oldest_to_drop(capacities_oldest_first: Sequence[int], max_bytes: int) -> int:
    """How many of the oldest spares to drop so the rest fit in ``max_bytes``."""
    total = sum(capacities_oldest_first)
    dropped = 0
    for capacity in capacities_oldest_first:
        if total <= max_bytes:
            break
        total -= capacity
        dropped += 1
    return dropped


def keeps_spares(level: Level) -> bool:
    return level < Level.HIGH


# -- buffers -----------------------------------------------------------------------------------------------------

class _Buffer:
    __slots__ = ("address", "busy", "capacity", "clean", "memory")

    def __init__(self, nbytes: int) -> None:
        self.capacity = capacity_for(nbytes)
        self.memory = anonymous_memory(self.capacity)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))
        self.clean = True
        self.busy = False  # being cleared by the background thread

    def clear(self) -> None:
        ctypes.memset(self.address, 0, self.capacity)  # a foreign call: the GIL is released meanwhile

    def release(self) -> None:
        """Give the pages back now; the mapping (and anything still pointing into it) stays valid."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self.memory.madvise(mmap.MADV_DONTNEED)


class _Clearer:
    """One daemon thread per process that clears given-back buffers for the pools that asked for zeroed ones. It
    ends after ``IDLE_SECONDS`` without work (and starts again on the next), so a program that used a pool once
    and then forks does not fork with our thread running."""

    IDLE_SECONDS = 2.0

    def __init__(self) -> None:
        self._start_over()

    def _start_over(self) -> None:
        self._work: queue.SimpleQueue[tuple[weakref.ref[Pool], _Buffer]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not cleared yet
        self._idle = threading.Condition(self._lock)

    def wait_idle(self, timeout: float) -> bool:
        """Block until every buffer submitted so far has been cleared (or ``timeout``): a point to synchronise
        on, for tests, instead of sleeping."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def submit(self, pool: Pool, buffer: _Buffer) -> None:
        with self._lock:  # put under the lock: the thread decides to end under it, seeing the queue empty
            self._pending += 1
            self._work.put((weakref.ref(pool), buffer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="apsi-pool-clearer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                pool_ref, buffer = self._work.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._work.empty():
                        self._thread = None
                        return
                continue
            try:
                pool = pool_ref()
                if pool is not None:
                    pool._clear(buffer)
                del pool, buffer  # do not keep the last pool alive while waiting
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def after_fork_in_child(self) -> None:
        """The thread does not exist in a forked child, but ``_thread`` (and maybe the lock, taken, and a count of
        buffers it never cleared here) came along: start over, so the child's first give starts its own thread
        instead of never clearing again. Buffers queued in the parent stay unclean in the child, which only costs
        a fresh buffer instead of a spare."""
        self._start_over()


_clearer = _Clearer()
_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    each([_clearer.after_fork_in_child] + [pool_._after_fork_in_child for pool_ in _pools], lambda hook: hook())


_hook_forks = fork_hooks(after_in_child=_after_fork_in_child)  # called when the first pool is made, not at import


# -- the pool ----------------------------------------------------------------------------------------------------

class Pool:
    """Spare buffers for big temporaries: ``take`` one, use it, ``give`` it back."""

    relief = Relief.SPARES  # the first to give RAM back when the level rises (decide.in_relief_order)

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = byte_count(max_bytes, "Pool: max_bytes")
        self._spares: list[_Buffer] = []  # oldest first
        # by id(array handed out): the array, its buffer, and the references to the array under it when it was
        # handed out (more at give: a view of it is still alive)
        self._out: dict[int, tuple[weakref.ref[np.ndarray], _Buffer, int]] = {}
        self._given: dict[int, weakref.ref[np.ndarray]] = {}  # arrays given back, to name a second give
        self._machine = machine()  # the one whose levels this pool hears
        self._level = self._machine.current_level()
        self._wants_zero = False
        self._lock = threading.Lock()
        _pools.add(self)
        _hook_forks()
        self._machine.components.register(self)

    def _after_fork_in_child(self) -> None:
        """The clearing thread may have held this lock, or a buffer (``busy``), when another thread forked."""
        self._lock = threading.Lock()
        for buffer in self._spares:
            buffer.busy = False  # no thread clears it here; it stays unclean until cleared again

    # -- take and give -------------------------------------------------------------------------------------------

    def take(self, shape: int | Sequence[int], dtype: Any = "float64", zero: bool = True) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` on an already-mapped spare when one fits, else on fresh memory.

        ``zero=True`` gives zeros; ``zero=False`` whatever the buffer held (faster when you overwrite it all)."""
        zero = flag(zero, "take: zero")
        dims, kind = normalize_shape(shape), normalize_dtype(dtype)
        nbytes = nbytes_of(dims, kind)
        self._level = self._machine.current_level()  # an allocation path: may also tell us (on_level) to drop spares
        with self._lock:
            dirty = self._set_wants_zero(zero)
            index = choose_spare([(b.capacity, b.clean, b.busy) for b in self._spares], nbytes, zero)
            buffer = self._spares.pop(index) if index is not None else None
        for spare in dirty:
            _clearer.submit(self, spare)
        if buffer is None:
            buffer = _Buffer(nbytes)
        # Handed out as a view of an array only the pool makes: NumPy points every view of ``a`` (and of its views)
        # at that array, so its references count the views, whatever other names ``a`` itself has.
        return self._hand_out(np.ndarray(dims, kind, buffer=buffer.memory).view(), buffer)

    def _set_wants_zero(self, zero: bool) -> list[_Buffer]:
        """Record the mode; on a switch to ``zero=True`` the dirty spares need clearing (returned)."""
        switched = zero and not self._wants_zero
        self._wants_zero = zero
        return [b for b in self._spares if not b.clean and not b.busy] if switched else []

    def _hand_out(self, a: np.ndarray, buffer: _Buffer) -> np.ndarray:
        key, out = id(a), self._out
        # If the caller drops ``a`` without giving it back, forget it: the buffer is then freed with it.
        ref = weakref.ref(a, lambda _: out.pop(key, None))
        with self._lock:
            self._out[key] = (ref, buffer, sys.getrefcount(a.base))
        buffer.clean = False
        return a

    def give(self, a: np.ndarray) -> None:
        """Return an array ``take`` handed out. Do not use ``a`` afterwards: it becomes read-only. While a view of
        ``a`` made before lives, its buffer is not reused (a write through the view reaches no one else's data)."""
        buffer, refs = self._take_back(a)
        a.flags.writeable = False
        viewed = sys.getrefcount(a.base) > refs  # a view made since the take holds the array under ``a``
        self._level = self._machine.current_level()
        with self._lock:
            key, given = id(a), self._given
            given[key] = weakref.ref(a, lambda _: given.pop(key, None))
            dropped = [] if viewed else self._keep(buffer)
            clear = self._wants_zero and buffer in self._spares
        self._drop(dropped)
        if clear:
            _clearer.submit(self, buffer)

    def _take_back(self, a: Any) -> tuple[_Buffer, int]:
        if not isinstance(a, np.ndarray):
            raise PoolError(f"pool.give takes an array from pool.take, not {type(a).__name__}")
        with self._lock:
            out = self._out.get(id(a))
            if out is not None and out[0]() is a:
                del self._out[id(a)]
                return out[1], out[2]
            given = self._given.get(id(a))
        if given is not None and given() is a:
            raise PoolError("this array was already given back to the pool (a buffer can be given back once)")
        raise PoolError("this array was not handed out by this pool (give back the very array take() returned, "
                        "not a view or a copy of it)")

    def _keep(self, buffer: _Buffer) -> list[_Buffer]:
        """Add ``buffer`` to the spares if the level allows, then trim to ``max_bytes``; returns what to drop."""
        if not keeps_spares(self._level):
            return [buffer, *self._take_all_spares()]
        self._spares.append(buffer)
        count = oldest_to_drop([b.capacity for b in self._spares], self.max_bytes)
        dropped, self._spares = self._spares[:count], self._spares[count:]
        return dropped

    def _take_all_spares(self) -> list[_Buffer]:
        dropped, self._spares = self._spares, []
        return dropped

    @staticmethod
    def _drop(buffers: list[_Buffer]) -> None:
        for buffer in buffers:
            if not buffer.busy:  # one being cleared is released by _clear when it is done
                buffer.release()

    def _clear(self, buffer: _Buffer) -> None:
        """Run by the background thread."""
        with self._lock:
            if buffer.clean or buffer.busy or buffer not in self._spares:
                return
            buffer.busy = True
        buffer.clear()
        with self._lock:
            buffer.busy = False
            buffer.clean = True
            dropped = buffer not in self._spares
        if dropped:
            buffer.release()

    # -- pressure ------------------------------------------------------------------------------------------------

    def on_level(self, level: Level) -> None:
        """``high`` and above: drop every spare and keep none; below: keep spares again."""
        self._level = level
        if not keeps_spares(level):
            self.relieve()

    def relieve(self) -> None:
        """Drop every spare buffer now."""
        with self._lock:
            dropped = self._take_all_spares()
        self._drop(dropped)

    # -- what it holds -------------------------------------------------------------------------------------------

    @property
    def spare_bytes(self) -> int:
        with self._lock:
            return sum(b.capacity for b in self._spares)

    @property
    def spares(self) -> int:
        return len(self._spares)

    @property
    def cleared(self) -> int:
        """Spares already cleared, ready for ``take(zero=True)``."""
        return sum(1 for b in self._spares if b.clean and not b.busy)

    @property
    def out(self) -> int:
        """Arrays handed out and neither given back nor collected."""
        return len(self._out)

    def __repr__(self) -> str:
        return (f"<pool: {self.spares} spare buffers ({self.cleared} cleared, {fmt_size(self.spare_bytes)} of "
                f"{fmt_size(self.max_bytes)} allowed), {self.out} out>")


def pool(max_gb: float | str | None = None) -> Pool:
    """A pool whose spare buffers hold at most ``max_gb`` (GB, or a size string such as ``"512MB"``); by default
    a tenth of the RAM budget at creation."""
    if max_gb is None:
        return Pool(machine().budget().bytes // DEFAULT_SHARE_OF_BUDGET)
    return Pool(parse_size(max_gb))
