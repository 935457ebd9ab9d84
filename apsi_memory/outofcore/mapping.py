"""``memory.map``: apply a function to every row block of an array on all cores, into an output that may be larger
than RAM.

    y = memory.map(lambda b: b * 2.0 + 1.0, x, rows=500_000)

How it runs
-----------
* Blocks run on ``workers`` threads (default: the cores this process may use). NumPy releases the GIL in its
  loops, so a NumPy-heavy ``fn`` uses every core; a pure-Python ``fn`` does not get faster. Each thread takes the
  next block in row order itself as it finishes one (``runner.run_pulled``): the calling thread only waits, so no
  block waits for it to be handed out.
* What ``fn`` sees: with ``rows`` given, exactly the blocks of ``rows`` rows (the last one shorter), so a
  function of the whole block (a normalisation by the block's mean) gets what it asked for. Without ``rows``, or
  with ``rowwise=True``, ``fn`` is called on consecutive pieces of each block, each the size of a core's own
  cache (``rules.piece_rows``: its level-2 cache from sysfs, 1 MiB where sysfs does not say; 32,768 rows of 32
  bytes on a 1 MiB cache), one after another by the block's thread, and each piece's result is written into the
  output at once (and let go before the next piece, so ``malloc`` reuses the same memory for every piece's
  temporaries): the piece, its temporaries and its result stay in the chip's caches, so a light function reads
  the input and writes the output once each instead of streaming every temporary through memory, and a piece
  costs little enough Python for two threads (measured in ``benchmarks/bench_map_speed.py``). Whether ``fn``
  needs its whole block cannot be told from outside, so it is the caller who says: ``rows`` (or
  ``rowwise=False``) for a function of the block, ``rowwise=True`` with ``rows`` for a row-by-row function whose
  blocks should stay ``rows`` for reading and progress. The block stays the unit of reading ahead, releasing and
  the progress bar either way.
* The first block's result fixes the output: one row per input row, with the row shape and dtype of that result.
  The output is a ``memory.array`` (RAM while it fits the budget, a spill file otherwise). The blocks that started
  beside the first keep their (first piece's) results until the output exists, so no core waits for the first
  block.
* At most two blocks per worker are in flight: each is read ahead when it is handed out, and once it and every
  block before it are written, its input and output pages are released (see ``pages``), so memory stays flat
  however large the input and output are.
* A block (or piece) whose result disagrees with the first (row count, row shape or dtype) raises
  ``ChunkError``; an exception in ``fn`` raises ``BlockError`` naming the rows it was called on and their block,
  with the original as its cause. Either way no block after the failing one starts, the blocks before it and
  those already running finish, the error of the first failing block in row order is raised (whichever thread
  noticed first), and the output is freed (its spill file deleted).
* A ``memory.array`` input freed (``memory.free``: it reads as zeros since) before the call or while blocks run
  raises ``ChunkError``, as a failing block does: each block checks each time ``fn`` returned, so nothing is
  written from zeros.
* ``out=path``: the output is a new ``.npy`` there that the library never deletes (as ``memory.array(path=)``),
  made under a temporary name in that folder once block 0's result fixes its shape (its space reserved then: a
  full disk fails early), filled in place, and named only once every block is written and ``fsync``-ed: a reader
  sees no file or the whole result, and its bytes are written once. A file at the path is refused before any
  block runs unless ``overwrite=True``; on an error or Ctrl-C nothing is left at the path and an old file stays.
* An empty input calls ``fn`` once on the empty block (to learn the output's dtype) and returns an empty output.
* ``engine=client`` (a ``distributed.Client``) runs the blocks on a dask cluster instead, by the same rules and
  with byte-identical results (``fn`` sees whole blocks there, ``rowwise`` or not): see ``apsi_memory.dask``
  (the ``apsi-memory[dask]`` extra).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ..arrays import npyfiles, placement
from ..blocks.pages import BlockPages
from ..blocks.progress import Progress, progress_bar
from ..blocks.rules import block_spans, piece_rows, positive_count, rows_per_block
from ..blocks.runner import (
    BLOCKS_PER_WORKER,
    Pulled,
    Span,
    Spans,
    Stop,
    check_like,
    check_storable,
    piece_results,
    result_of,
    rows_label,
    run_pulled,
)
from ..blocks.sources import freed_source, resolve_source
from ..errors import ArgumentTypeError
from ..machinery.machines import machine
from ..units import flag


def map(fn: Callable[[np.ndarray], np.ndarray], x: str | os.PathLike[str] | np.ndarray,
        rows: int | None = None, workers: int | None = None, *, progress: bool = False,
        engine: Any = None, out: str | os.PathLike[str] | None = None, overwrite: bool = False,
        rowwise: bool | None = None) -> np.ndarray:
    """``fn`` applied to each block of ``rows`` rows of ``x`` (an array, a memory-mapped array or a ``.npy``
    path), the results stacked into a new ``memory.array``. ``rows=None`` sizes blocks so that all those in flight
    hold about 32 MB of input. ``rowwise``: ``fn`` computes each result row from its input row alone, so ``map``
    may call it on cache-sized pieces of a block (the block stays the unit of reading, releasing and progress);
    by default true when ``rows`` is ``None`` and false when ``rows`` is given, so that ``fn`` sees exactly the
    blocks of ``rows`` rows. ``engine``: a ``distributed.Client`` to run the blocks on its cluster (``workers``
    then defaults to the cluster's threads; ``fn`` sees whole blocks there). ``out``: the output is a ``.npy``
    file there that stays (written once, named only when whole; ``overwrite`` as for ``memory.keep``). See the
    module docstring for the rules."""
    if not callable(fn):  # else every block would fail with the same TypeError, reported as the block's
        raise ArgumentTypeError(f"map needs a function of a block, not {type(fn).__name__}")
    progress = flag(progress, "map: progress")
    in_pieces = rows is None if rowwise is None else flag(rowwise, "map: rowwise")
    pending = None if out is None else npyfiles.Pending(out, flag(overwrite, "map: overwrite"))
    try:
        if engine is not None:
            from ..dask import map_on_cluster  # the dask extra, imported only when asked for

            return map_on_cluster(engine, fn, x, rows, workers, progress=progress, out=pending)
        with streamed(x, rows, workers, progress, "map") as blocks:
            piece = _piece(blocks.array) if in_pieces else max(1, len(blocks.array))
            return _run(fn, blocks.array, blocks.spans, blocks.inputs, blocks.workers, blocks.bar, pending, piece)
    except BaseException:
        if pending is not None:
            pending.abandon()
        raise


def _piece(array: np.ndarray) -> int:
    """Rows per piece for ``array``'s rows: a core's cache of them (``rules.piece_rows``)."""
    row_bytes = int(np.prod(array.shape[1:], dtype=np.int64)) * array.itemsize
    return piece_rows(row_bytes, machine().cache_bytes())


class Streamed(NamedTuple):
    """The row blocks ``map`` or ``reduce`` runs over, on ``workers`` threads."""

    workers: int
    array: np.ndarray
    spans: Spans
    inputs: BlockPages  # the blocks' pages, read ahead and released
    bar: Progress


@contextmanager
def streamed(x: str | os.PathLike[str] | np.ndarray, rows: int | None, workers: int | None, progress: bool,
             what: str) -> Iterator[Streamed]:
    """``x``'s row blocks for ``what`` (``map``, ``reduce``): ``rows`` a block, else sized so that the blocks in
    flight (``BLOCKS_PER_WORKER`` per thread) hold about 32 MB; ``workers`` threads, else the cores. Its pages and
    progress bar are closed on leaving."""
    source = resolve_source(x)
    if source.given is not None and placement.is_freed(source.given):
        raise freed_source(f"before {what} was called")
    n_workers = machine().cores() if workers is None else positive_count(workers, "workers", "a number of threads")
    block_rows = rows_per_block(source.row_bytes(), rows, n_workers * BLOCKS_PER_WORKER)
    array = source.open()
    spans = block_spans(len(array), block_rows) or [(0, 0)]
    inputs = BlockPages(array, spans)
    bar = progress_bar(progress, len(array), what)
    try:
        yield Streamed(n_workers, array, spans, inputs, bar)
    finally:
        inputs.close()
        bar.close()


class _Output:
    """The output array, made from block 0's result by the thread that computed it. Blocks that started beside
    block 0 keep their results until it exists (``wait``), so no core idles while the first block runs."""

    def __init__(self, rows: int, spans: Spans, pending: npyfiles.Pending | None) -> None:
        self.rows, self.spans, self.pending = rows, spans, pending
        self.array: np.ndarray | None = None
        self.pages: BlockPages | None = None
        self._unnoted: list[int] = []  # blocks handed out before the output existed
        self._lock = threading.Lock()
        self._settled = threading.Event()  # made, or never will be

    def make(self, first: np.ndarray) -> None:
        check_storable(first, self.spans)
        shape = (self.rows,) + first.shape[1:]
        array = (placement.array(shape, first.dtype) if self.pending is None
                 else placement.in_pending(self.pending, shape, first.dtype))
        in_ram = not isinstance(array, np.memmap)  # a file: placement.array on the SSD, in_pending (unless empty)
        with self._lock:  # in RAM: no /proc/self/maps read (half of make's 0.9 ms, which the other blocks wait for)
            self.array, self.pages = array, BlockPages(array, self.spans, in_ram)
            for index in self._unnoted:
                self.pages.note(self.spans[index][1])
            self._unnoted.clear()
        self._settled.set()

    def note(self, index: int) -> None:
        """Block ``index`` is about to be written (see ``BlockPages.note``)."""
        with self._lock:
            if self.pages is None:
                self._unnoted.append(index)
            else:
                self.pages.note(self.spans[index][1])

    def wait(self) -> np.ndarray | None:
        self._settled.wait()
        return self.array

    def give_up(self) -> None:
        """No output will come (block 0 failed, or the run stopped): wake the blocks waiting for it."""
        self._settled.set()

    def finished(self, index: int) -> None:
        if self.pages is not None:
            self.pages.finished(index)

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()

    def discard(self) -> None:
        """The caller will never see the output: its RAM or spill file goes now."""
        self.close()
        if self.array is not None:
            placement.free(self.array)


def _run(fn: Callable[[np.ndarray], np.ndarray], array: np.ndarray, spans: Spans, inputs: BlockPages,
         workers: int, bar: Progress, pending: npyfiles.Pending | None, piece: int) -> np.ndarray:
    output = _Output(len(array), spans, pending)
    try:
        _run_blocks(fn, array, spans, inputs, output, workers, bar, piece)
    except BaseException:
        output.discard()
        raise
    output.close()
    assert output.array is not None
    if pending is not None:
        placement.publish(pending, output.array)
    return output.array


def _run_blocks(fn: Callable[[np.ndarray], np.ndarray], array: np.ndarray, spans: Spans, inputs: BlockPages,
                output: _Output, workers: int, bar: Progress, piece: int) -> None:
    """Every block on ``workers`` threads, each taking the next block in row order itself, at most
    ``BLOCKS_PER_WORKER`` per thread read ahead and not finished, ``fn`` called on pieces of ``piece`` rows of each
    in turn, by the block's thread, each result written into the output at once."""
    stop = Stop(len(spans))
    freed = _freed_test(array)

    def computed(index: int, span: Span) -> np.ndarray:
        result = result_of(fn, array, spans, index, span)
        not_freed(index, span)
        return result

    def not_freed(index: int, span: Span) -> None:
        if freed():  # freed while fn read its rows: the result may come from zeros
            raise freed_source(f"while map ran (found after rows {rows_label(spans, index, span)})")

    def work(index: int) -> None:
        first, *rest = block_spans(spans[index][1], piece, spans[index][0]) or [spans[index]]
        try:
            head = computed(index, first)
            if index == 0:
                output.make(head)
        finally:
            if index == 0:
                output.give_up()  # made, or failed: either way nobody may wait longer
        out = output.wait()
        if out is None:
            return
        check_like(head, out, spans, index, first)  # even when stopping: an earlier block's error wins
        write(index, first, head, out)
        del head
        for span, result in piece_results(fn, array, spans, index, rest, out):
            write(index, span, result, out)
            del result  # freed before fn runs on the next piece: see piece_results

    def write(index: int, span: Span, result: np.ndarray, out: np.ndarray) -> None:
        not_freed(index, span)
        if not stop.stopping:
            out[span[0]:span[1]] = result  # written while the piece is still in the cache

    def prepare(index: int) -> None:
        inputs.read_ahead(*spans[index])
        output.note(index)

    def finish(index: int) -> None:
        _finished(index, spans, inputs, output, bar)

    blocks = Pulled(len(spans), workers * (BLOCKS_PER_WORKER - 1), prepare, finish, stop)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="apsi-map") as pool:
        run_pulled(pool, workers, work, blocks, output.give_up)


def _freed_test(array: np.ndarray) -> Callable[[], bool]:
    """Whether ``array`` has been freed, asked after every piece: its entry is looked up once, as an array that is
    not a ``memory.array`` (or a view of one) never becomes one."""
    entry = placement.entry_of(array)
    if entry is None:
        return lambda: False
    return lambda: entry.freed


def wait_threads(futures: set[Future[int]], when: str) -> tuple[set[Future[int]], set[Future[int]]]:
    """``run_in_order``'s wait, over the futures of a thread pool (``map``'s and ``reduce``'s)."""
    done, running = wait(futures, return_when=when)
    return done, running


def _finished(index: int, spans: Spans, inputs: BlockPages, output: _Output, bar: Progress) -> None:
    inputs.finished(index)
    output.finished(index)
    bar.update(spans[index][1] - spans[index][0])


def to_dask(x: str | os.PathLike[str] | np.ndarray, rows: int | None = None, *, client: Any = None) -> Any:
    """``x`` as a ``dask.array`` with one chunk per block of ``rows`` rows, for clusters that do not share this
    machine's files (``apsi-memory[dask]``; see ``apsi_memory.dask.tasks.to_dask``)."""
    from ..dask import to_dask as on_dask  # the dask extra, imported only when asked for

    return on_dask(x, rows, client=client)
