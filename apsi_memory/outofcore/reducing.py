"""``reduce``: a function of every row block of an array on all cores, the results combined into one value
(column sums, a Gram matrix, counts) rather than stacked into rows as ``map`` does.

    gram = reduce(lambda b: b.T @ b, "features.npy")                       # combine=np.add by default
    lo = reduce(lambda b: b.min(axis=0), x, combine=np.minimum)

How it runs
-----------
* ``fn`` runs on blocks on ``workers`` threads (default: the cores this process may use), as in ``map``; NumPy
  releases the GIL in its loops, so a NumPy-heavy ``fn`` uses every core.
* The results are combined in row order, ``combine(combine(fn(b0), fn(b1)), fn(b2)) ...``, by the thread whose
  block is next in that order; a thread that finished a later block leaves its result and goes on (a thread that
  waited for its turn held 11-ms blocks to 1.41-1.63x on 2 cores). So a run gives the same bits as any other run
  with the same blocks, whatever the threads' timing. The blocks are set by ``rows`` and the input's length; with
  ``rows=None`` their size also depends on ``workers`` (blocks in flight hold about 32 MB), so a floating-point
  result may differ in its last bits between different ``rows`` or ``workers``, never between runs of the same.
* ``combine`` must be associative for the result not to depend on where blocks start (``np.add``,
  ``np.minimum``, ``np.maximum``, ``np.logical_or``); it gets the running total and a block's result and returns
  the new total, and should not change either in place (a block's result may be a view of the input).
* Memory: at most two block results per worker thread (one left to be combined, one held by a thread more than
  ``workers`` blocks ahead of the total) plus the running total (two totals for the moment ``combine`` makes the
  new one); inputs stream as in ``map`` (at most two blocks per worker read, each block's pages released once it
  and the blocks before it are done).
* An exception in ``fn`` or ``combine`` raises ``BlockError`` naming the block's rows, with the original as its
  cause; a result whose shape or dtype differs from the first block's raises ``ChunkError`` naming the block.
  Either way the error of the first failing block in row order is raised and no later block starts. A
  ``memory.array`` input freed before the call or while blocks run raises ``ChunkError``. Ctrl-C stops the run.
* An empty input calls ``fn`` once on the empty block and returns its result.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from ..arrays import placement
from ..blocks.pages import BlockPages
from ..blocks.progress import Progress
from ..blocks.runner import BLOCKS_PER_WORKER, Spans, Stop, rows_label, run_in_order
from ..blocks.sources import freed_source
from ..errors import ArgumentTypeError, BlockError, ChunkError
from ..units import flag
from .mapping import streamed, wait_threads

T = TypeVar("T")
_ADD: Callable[[Any, Any], Any] = np.add  # typed loosely: a ufunc's overloads match no single Callable[[T, T], T]


def reduce(fn: Callable[[np.ndarray], T], x: str | os.PathLike[str] | np.ndarray, rows: int | None = None,
           workers: int | None = None, *, combine: Callable[[T, T], T] = _ADD, progress: bool = False) -> T:
    """``fn`` of each block of ``rows`` rows of ``x`` (an array, a memory-mapped array or a ``.npy`` path), the
    results combined in row order with ``combine`` (default ``np.add``), on ``workers`` threads. ``rows=None``
    sizes blocks so that all those in flight hold about 32 MB of input. See the module docstring for the rules."""
    for name, given in (("fn", fn), ("combine", combine)):
        if not callable(given):  # else every block would fail with the same TypeError, reported as the block's
            raise ArgumentTypeError(f"reduce needs a function for {name}, not {type(given).__name__}")
    progress = flag(progress, "reduce: progress")
    with streamed(x, rows, workers, progress, "reduce") as blocks:
        return _run(fn, combine, blocks.array, blocks.spans, blocks.inputs, blocks.workers, blocks.bar)


class _Total:
    """The running total, which block ``index`` joins once blocks ``0..index-1`` have. A finished block's result is
    left here and its thread goes on to the next block; the thread whose block is next in row order combines it
    and every block waiting after it, so the order never depends on timing. A result more than ``window`` blocks
    ahead of the total waits with its thread: at most ``window`` results wait here, and one per thread beside."""

    def __init__(self, combine: Callable[[Any, Any], Any], spans: Spans, stop: Stop, window: int) -> None:
        self.combine, self.spans, self.stop, self.window = combine, spans, stop, window
        self.value: Any = None
        self.first: Any = None  # block 0's result as an array, the shape and dtype every block must match
        self._turn = 0
        self._waiting: dict[int, Any] = {}
        self._combining = False  # a thread is combining: it takes every waiting result whose turn comes
        self._changed = threading.Condition()

    def join(self, index: int, result: Any) -> None:
        with self._changed:
            # A later block than a failed one (or any, after Ctrl-C) gives up: its turn would never come.
            self._changed.wait_for(lambda: index - self._turn < self.window or index > self.stop.first)
            if index > self.stop.first:
                return
            self._waiting[index] = result
            if self._combining or index != self._turn:
                return
            self._combining = True
        self._combine_waiting()

    def _combine_waiting(self) -> None:
        try:
            while True:
                with self._changed:
                    index = self._turn
                    if index not in self._waiting or index > self.stop.first:
                        self._combining = False  # in the same hold as the look: a result left now is seen
                        return
                    result = self._waiting.pop(index)
                self._add(index, result)  # outside the lock: the other threads leave theirs meanwhile
                with self._changed:
                    self._turn += 1
                    self._changed.notify_all()
        except BaseException:
            with self._changed:
                self._combining = False
            raise

    def _add(self, index: int, result: Any) -> None:
        if index == 0:
            self.value, self.first = result, np.asarray(result)
            return
        _check_like(result, self.first, self.spans, index)
        try:
            self.value = self.combine(self.value, result)
        except Exception as exc:
            raise BlockError(f"combine failed adding rows {rows_label(self.spans, index)}: "
                             f"{type(exc).__name__}: {exc}") from exc

    def stopped(self) -> None:
        """The run stops (``Stop`` moved): wake the blocks waiting for a turn that may not come."""
        with self._changed:
            self._changed.notify_all()


def _check_like(result: Any, first: np.ndarray, spans: Spans, index: int) -> None:
    """An array result must match block 0's: ``np.add`` would otherwise broadcast a wrong shape silently."""
    if not isinstance(result, (np.ndarray, np.generic)):
        return  # any other value (a tuple, a Python number) is for ``combine`` to judge
    if result.shape != first.shape or result.dtype != first.dtype:
        raise ChunkError(f"fn returned shape {result.shape} and dtype {result.dtype} for rows "
                         f"{rows_label(spans, index)}, but shape {first.shape} and dtype {first.dtype} for the "
                         "first block; every block must give the same shape and dtype")


def _run(fn: Callable[[np.ndarray], T], combine: Callable[[T, T], T], array: np.ndarray, spans: Spans,
         inputs: BlockPages, workers: int, bar: Progress) -> T:
    stop = Stop(len(spans))
    total = _Total(combine, spans, stop, workers)

    def work(index: int) -> int:
        if index >= stop.first:  # at or after a failed block: do not start
            return index
        start, end = spans[index]
        try:
            result = fn(array[start:end])
        except Exception as exc:
            raise BlockError(f"fn failed on rows {rows_label(spans, index)}: {type(exc).__name__}: {exc}") from exc
        if placement.is_freed(array):  # freed while fn read its block: the result may come from zeros
            raise freed_source(f"while reduce ran (found after rows {rows_label(spans, index)})")
        total.join(index, result)
        return index

    def submit(index: int) -> Future[int]:
        inputs.read_ahead(*spans[index])
        return pool.submit(contextvars.copy_context().run, work, index)  # ``fn`` sees the caller's machine()

    def done(index: int) -> None:
        inputs.finished(index)
        bar.update(spans[index][1] - spans[index][0])

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="apsi-reduce") as pool:
        run_in_order(len(spans), workers * BLOCKS_PER_WORKER, submit, wait_threads, done, stop, total.stopped)
    result: T = total.value
    return result
