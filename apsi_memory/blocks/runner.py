"""Running row blocks in row order, and checking what each block returned: shared by ``map``'s threads
(``mapping``), ``reduce``'s and ``map``'s dask engine (``dask.tasks``), which differ in how a block reaches a
worker.

* ``run_in_order`` hands out blocks in row order, at most ``in_flight`` at once, over any futures (threads or a
  cluster's) and stops at the first failing block in row order (``Stop``), whichever finished first.
* ``run_pulled`` (``map``'s threads) has no thread handing out: each thread takes the next block in row order
  itself as it finishes one (``Pulled``), with the same stop and the same first error.
* ``result_of`` runs ``fn`` on one block and checks that it gave one row per input row; ``check_storable`` and
  ``check_like`` hold every block to what a ``memory.array`` output can store and to block 0's row shape and dtype;
  ``piece_results`` does both for the pieces of a block, cheaply where the result is already right.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Executor, wait
from typing import Any, Protocol, TypeVar

import numpy as np

from ..errors import BlockError, ChunkError
from ..system.interrupts import interrupts_kept

Span = tuple[int, int]  # rows start:stop
Spans = Sequence[Span]  # a list, or the dask engine's EvenSpans (two numbers, for any count)
BLOCKS_PER_WORKER = 2  # one being computed, one being read ahead


class BlockFuture(Protocol):
    """What ``run_in_order`` needs of a future: a ``concurrent.futures.Future`` or a ``distributed.Future``."""

    def exception(self) -> BaseException | None: ...

    def result(self) -> Any: ...


F = TypeVar("F", bound=BlockFuture)
WaitFor = Callable[[set[F], str], tuple[set[F], set[F]]]


class Stop:
    """Blocks from ``first`` on do not start. Set to the first failed block, so the blocks before it still run:
    the error raised is always that of the first failing block in row order, whichever thread noticed first."""

    def __init__(self, count: int) -> None:
        self.count = self.first = count

    def at(self, index: int) -> None:
        self.first = min(self.first, index)

    @property
    def stopping(self) -> bool:
        return self.first < self.count


def run_in_order(count: int, in_flight: int, submit: Callable[[int], F], wait_for: WaitFor[F],
                 done: Callable[[int], None], stop: Stop, on_stop: Callable[[], None], start: int = 0) -> None:
    """Blocks ``start..count-1`` submitted in row order, at most ``in_flight`` at once, ``done(index)`` called as
    each finishes (in row order among those finishing together). When blocks fail, no block is submitted any
    more, those running finish (an earlier one may fail too), and the error of the first failing block in row
    order is raised. ``on_stop`` is called once the run stops early (a failure, or an interrupt). A Ctrl-C stops
    the run even when it arrived inside a finalizer, which Python would have swallowed (``interrupts_kept``)."""
    running: set[F] = set()
    index_of: dict[F, int] = {}
    upcoming = iter(range(start, count))
    try:
        with interrupts_kept() as interrupted:
            while True:
                for index in upcoming:
                    future = submit(index)
                    running.add(future)
                    index_of[future] = index
                    if len(running) >= in_flight:
                        break
                if not running:
                    return
                finished, running = wait_for(running, FIRST_COMPLETED)
                interrupted()
                failed = [future for future in finished if future.exception() is not None]
                if failed:
                    stop.at(min(index_of[future] for future in failed))
                    on_stop()
                    rest, _ = wait_for(running, ALL_COMPLETED)  # earlier blocks still run, and may fail first
                    failed += [future for future in rest if future.exception() is not None]
                    first = min(failed, key=index_of.__getitem__).exception()
                    assert first is not None
                    raise first
                for future in sorted(finished, key=index_of.__getitem__):
                    del index_of[future]  # a finished future is not kept: on a cluster it would hold its result
                    done(future.result())
                    interrupted()  # dropping a future runs its finalizer, where a Ctrl-C is swallowed
    except BaseException:
        stop.at(0)
        on_stop()
        raise


def result_of(fn: Callable[[np.ndarray], np.ndarray], array: np.ndarray, spans: Spans, index: int,
              piece: Span | None = None) -> np.ndarray:
    """``fn`` on block ``index`` of ``array`` (or on the rows ``piece`` of it), which must give one row per input
    row."""
    start, stop = piece or spans[index]
    return _one_per_row(np.asarray(_called(fn, array[start:stop], spans, index, piece)), spans, index, piece)


def piece_results(fn: Callable[[np.ndarray], np.ndarray], array: np.ndarray, spans: Spans, index: int,
                  pieces: Spans, out: np.ndarray) -> Iterator[tuple[Span, np.ndarray]]:
    """``fn`` on each of ``pieces`` of block ``index``, each result held to ``result_of``'s and ``check_like``'s
    rules. A result that is already an array of the output's row shape and dtype is taken as it is, in one
    comparison: ``map`` calls this for every cache-sized piece, and with two threads every Python step a piece
    takes holds the GIL the other thread waits for between its NumPy loops. A result is let go before ``fn`` runs
    on the next piece (the caller drops its own reference too): a result kept alive meanwhile made ``malloc`` put
    the next piece's temporaries at the top of its heap, which it gives back to the kernel and faults in again
    (5,400 page faults a 512 MiB ``map`` of ``b * 2.0 + 1.0``, against 44), where a loop that drops it reuses
    the same cached memory for every piece."""
    row_shape, dtype = out.shape[1:], out.dtype
    for piece in pieces:
        start, stop = piece
        try:
            result = fn(array[start:stop])
        except Exception as exc:
            raise _failed(exc, spans, index, piece) from exc
        if type(result) is not np.ndarray or result.shape != (stop - start,) + row_shape or result.dtype != dtype:
            result = _one_per_row(np.asarray(result), spans, index, piece)
            check_like(result, out, spans, index, piece)
        yield piece, result
        del result


def _called(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, spans: Spans, index: int,
            piece: Span | None) -> Any:
    try:
        return fn(rows)
    except Exception as exc:
        raise _failed(exc, spans, index, piece) from exc


def _failed(exc: Exception, spans: Spans, index: int, piece: Span | None) -> BlockError:
    return BlockError(f"fn failed on rows {rows_label(spans, index, piece)}: {type(exc).__name__}: {exc}")


def _one_per_row(result: np.ndarray, spans: Spans, index: int, piece: Span | None) -> np.ndarray:
    start, stop = piece or spans[index]
    if result.ndim == 0 or len(result) != stop - start:
        shape = "a single value" if result.ndim == 0 else f"{len(result)} rows"
        raise ChunkError(f"fn returned {shape} for rows {rows_label(spans, index, piece)} ({stop - start} rows); "
                         "map needs one result row per input row")
    return result


def check_storable(first: np.ndarray, spans: Spans) -> None:
    """The output is a ``memory.array``: block 0's result must be something it can hold."""
    if first.dtype.hasobject:
        raise ChunkError(f"fn returned Python objects (dtype {first.dtype}) for rows {rows_label(spans, 0)}; "
                         "the output is a memory.array, which holds numbers and fixed-size records only")


def check_like(result: np.ndarray, out: np.ndarray, spans: Spans, index: int, piece: Span | None = None) -> None:
    """Block ``index``'s result (or that of its rows ``piece``) has the row shape and dtype of the output (made
    from block 0's)."""
    if result.shape[1:] != out.shape[1:] or result.dtype != out.dtype:
        raise ChunkError(f"fn returned rows of shape {result.shape[1:]} and dtype {result.dtype} for rows "
                         f"{rows_label(spans, index, piece)}, but rows of shape {out.shape[1:]} and dtype {out.dtype} for "
                         "the first block; every block must give the same row shape and dtype")


def rows_label(spans: Spans, index: int, piece: Span | None = None) -> str:
    """``1000:2000 (block 2 of 10)``: block ``index``'s rows, or those of ``piece`` of it."""
    start, stop = piece or spans[index]
    return f"{start}:{stop} (block {index + 1} of {len(spans)})"


class Pulled:
    """Blocks handed out in row order to threads that each take their next block themselves (``run_pulled``):
    no thread hands blocks out, so no block waits for a hand-off, and under a loaded machine no hand-off thread
    holds the GIL while the scheduler keeps it off a core. One lock covers the hand-out and the hooks, which
    touch the blocks' shared pages and progress."""

    def __init__(self, count: int, ahead: int, prepare: Callable[[int], None], finish: Callable[[int], None],
                 stop: Stop) -> None:
        self.count, self.ahead, self.prepare, self.finish, self.stop = count, ahead, prepare, finish, stop
        self.next = self.prepared = 0
        self.failed: dict[int, BaseException] = {}
        self.lock = threading.Lock()

    def claim(self, done: int | None) -> int | None:
        """Block ``done`` (if any) is finished; the next block to run, or ``None`` when none is left or the run
        stops. Blocks up to ``ahead`` past the one handed out are prepared (read ahead) in row order."""
        with self.lock:
            if done is not None:
                self.finish(done)
            if self.next >= min(self.count, self.stop.first):
                return None
            index, self.next = self.next, self.next + 1
            for upcoming in range(self.prepared, min(self.count, self.stop.first, index + 1 + self.ahead)):
                self.prepare(upcoming)
            self.prepared = max(self.prepared, index + 1 + self.ahead)
            return index

    def fail(self, index: int, error: BaseException) -> None:
        with self.lock:
            self.failed[index] = error
            self.stop.at(index)


def run_pulled(pool: Executor, workers: int, work: Callable[[int], None], blocks: Pulled,
               on_stop: Callable[[], None]) -> None:
    """Every block of ``blocks`` through ``work`` on ``workers`` threads of ``pool``, each taking the next block
    in row order as it finishes one, at most ``ahead`` blocks prepared beyond the last handed out. When blocks
    fail, no block starts any more, those running finish (an earlier one may fail too), ``on_stop`` is called
    and the error of the first failing block in row order is raised. A Ctrl-C (or any error) on the waiting
    thread stops the run the same way: the blocks running finish first."""
    caller = contextvars.copy_context()  # ``fn`` sees the caller's context (its machine()), a fresh copy a block

    def thread() -> None:
        on = -1  # the block this thread is on; a failure to hand out its first counts before every block
        try:
            index = blocks.claim(None)
            while index is not None:
                on = index
                caller.copy().run(work, index)
                index = blocks.claim(index)  # finishing the block (its pages, progress) fails as the block
        except BaseException as exc:  # noqa: BLE001 -- raised by the waiting thread, the first in row order
            blocks.fail(on, exc)
            on_stop()

    try:
        wait([pool.submit(thread) for _ in range(min(workers, blocks.count))])
    except BaseException:
        blocks.stop.at(0)
        on_stop()
        raise
    if blocks.failed:
        raise blocks.failed[min(blocks.failed)]
