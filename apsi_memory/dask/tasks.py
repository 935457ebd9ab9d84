"""``memory.map(fn, x, rows, engine=client)`` on a dask cluster, and ``memory.to_dask(x, rows)``.

The blocks are the local ``map``'s (``block_spans``), driven by ``runner.run_in_order`` (as ``reduce``'s threads
are), checked by the same ``result_of``/``check_like``, with the same errors. What differs is how data reaches the workers: by path.

* Input: a ``.npy`` path, or an array whose rows lie one after another in a file (``np.load(mmap_mode="r")``, an
  ``np.memmap``, a spilled ``memory.array``), is found in ``/proc/self/maps`` and opened on the worker by path and
  file offset, one block at a time (the header is read on the client, never unpickled). Any other array (in RAM,
  or a scattered view of a file) is first streamed into a spill file the workers can open, deleted afterwards.
  Nothing ever sends an ``np.memmap`` itself: one pickles as the full array (numpy #2049).
* Output: block 0 runs on a worker and comes back to fix the row shape and dtype (and to be written here); the
  output is a ``memory.array`` spill file (RAM when there is one block only), which each later task maps for its
  own rows and writes, flushes and releases (``pages.BlockPages``). ``da.store`` into an ``open_memmap``
  target would pickle the target too: under a process cluster the writes went to copies and the file stayed wrong.
* Tasks: block 0, timed, sizes the batches of the blocks after it (``decide.cluster_blocks_per_task``: ~100 ms a
  task); a task runs its batch's blocks one after another, each checked on its own, so errors name the block.

A cluster without a worker fails instead of waiting forever: ``map`` waits at most the dask setting
``apsi-memory.no-worker-timeout`` (``waits.NO_WORKER_TIMEOUT_S`` by default) for one to appear, at the start and
whenever it waits for blocks, then raises ``BlockError``. A ``memory.array`` input freed (``memory.free``) before
the call or while blocks run raises ``ChunkError``, as locally.

Workers must see the caller's files (one machine, or a shared filesystem). Otherwise use ``to_dask(x, rows,
client=client)``: the blocks are read here and scattered one at a time; write results with ``to_zarr``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ALL_COMPLETED
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..arrays import npyfiles, placement, spill
from ..blocks.pages import BlockPages, file_region, row_extent
from ..blocks.progress import progress_bar
from ..blocks.rules import DEFAULT_BLOCK_BYTES, block_spans, rows_per_block
from ..blocks.runner import (
    BLOCKS_PER_WORKER,
    Spans,
    Stop,
    check_like,
    check_storable,
    result_of,
    rows_label,
    run_in_order,
)
from ..blocks.sources import freed_source, resolve_source
from ..decide import cluster_blocks_in_flight, cluster_blocks_per_task
from ..errors import BlockError, ChunkError
from .waits import Workers

Fn = Callable[[np.ndarray], np.ndarray]



@dataclass(frozen=True)
class FileRows:
    """A C-order array stored in a file from ``offset``: what a task opens, by path, for the rows it needs."""

    path: str
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool = False  # the caller's array was F-ordered: fn gets its blocks in that layout too (see _compute)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def open(self, start: int = 0, stop: int | None = None, mode: str = "r") -> np.ndarray:
        """Rows ``start:stop`` (all by default), mapping only their pages (an empty block needs no mapping)."""
        stop = self.shape[0] if stop is None else stop
        shape = (stop - start, *self.shape[1:])
        if stop <= start or self.row_bytes == 0:
            return np.empty(shape, self.dtype)
        return np.memmap(self.path, self.dtype, mode, self.offset + start * self.row_bytes, shape)  # type: ignore[call-overload,no-any-return]


def rows_in_file(x: object) -> FileRows | None:
    """Where ``x``'s rows lie in a file, when they lie one after another in one; ``None`` otherwise."""
    source = resolve_source(x)
    if source.npy is not None:
        # Absolute: a worker resolves a relative path in its own folder, and read another file (or none).
        return FileRows(os.path.abspath(source.npy.path), source.npy.data_offset, source.npy.dtype, source.npy.shape)
    array = source.open()
    region = file_region(array)
    # A private mapping (np.memmap mode "c") may hold changes the file does not; a deleted file cannot be opened.
    if region is None or not region.shared or not array.flags.c_contiguous or not os.path.isfile(region.path):
        return None
    return FileRows(region.path, row_extent(array)[0] - region.start + region.file_offset, array.dtype, array.shape)


def _spill_copy(array: np.ndarray, spans: Spans) -> FileRows:
    """``array`` streamed into a new spill file, block by block (its pages released as they are copied)."""
    copy = spill.create(array.shape, array.dtype)
    pages = BlockPages(array, spans)
    try:
        for index, (start, stop) in enumerate(spans):
            pages.read_ahead(start, stop)
            copy[start:stop] = array[start:stop]
            pages.finished(index)
        copy.flush()
    except BaseException:
        spill.delete(str(copy.filename))
        raise
    finally:
        pages.close()
    fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
    return FileRows(str(copy.filename), copy.offset, array.dtype, array.shape, fortran)


class EvenSpans(Sequence[tuple[int, int]]):
    """``block_spans(n_rows, rows)`` as two numbers: what every task carries (a list of all the spans made each
    task's arguments grow with the block count, and the whole run with its square)."""

    def __init__(self, n_rows: int, rows: int) -> None:
        self.n_rows, self.rows = n_rows, max(1, rows)
        self.starts = range(0, max(1, n_rows), self.rows)  # an empty input is one empty block, as locally

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[int, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        if isinstance(index, slice):
            return [(start, min(start + self.rows, self.n_rows)) for start in self.starts[index]]
        start = self.starts[index]  # range raises the IndexError that ends iteration
        return start, min(start + self.rows, self.n_rows)


# -- on the workers ------------------------------------------------------------------------------------------------

def first_block(fn: Fn, rows: FileRows, spans: Spans) -> tuple[np.ndarray, float]:
    """Block 0's result, sent back to fix the output's row shape and dtype, and the seconds it took, which size
    the batches of the blocks after it: its wall time less the time this thread waited for a CPU, so that a busy
    machine does not cut the batches to one block, while a ``fn`` that sleeps or reads still counts its waits."""
    began, waited = time.perf_counter(), _waited_for_cpu()
    result = np.asarray(_compute(fn, rows, spans, 0))
    return result, max(0.0, time.perf_counter() - began - (_waited_for_cpu() - waited))


def _waited_for_cpu() -> float:
    """Seconds this thread has waited for a CPU (``/proc/thread-self/schedstat``); 0 where the kernel hides it."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def write_blocks(fn: Fn, rows: FileRows, out: FileRows, spans: Spans, first: int, stop: int) -> None:
    """Blocks ``first..stop-1`` into their rows of ``out``, one after another, each checked as it is written (the
    first failing one raises, naming its own rows), then flushed together: one task, one scheduler round trip and
    one flush (7 ms each on this machine's disk, more than a small block's work) for the whole batch."""
    begin = spans[first][0]
    target = out.open(begin, spans[stop - 1][1], mode="r+")
    own = [(start - begin, stop - begin) for start, stop in spans[first:stop]]  # the blocks' rows in target
    pages = _pages(target, own)
    try:
        for number, (start, end) in enumerate(own):
            pages.note(end)
            result = _compute(fn, rows, spans, first + number)
            check_like(result, target, spans, first + number)
            target[start:end] = result
            pages.finished(number)
        if isinstance(target, np.memmap):
            target.flush()  # on the disk before the caller reads it, whatever the filesystem
    finally:
        pages.close()


def _compute(fn: Fn, rows: FileRows, spans: Spans, index: int) -> np.ndarray:
    """``fn`` on block ``index``, as the local ``map`` runs it (the whole input is mapped, so the rows and the
    messages are the same; only the block's pages are read, then released)."""
    start, stop = spans[index]
    try:
        array = rows.open()
    except FileNotFoundError:
        raise ChunkError(f"map's input file {rows.path} is gone: the array was freed (memory.free) while map ran, "
                         "or its file deleted") from None
    pages = _pages(array[start:stop], [(0, stop - start)])
    # An F-ordered input was copied C-ordered; fn gets its block F-ordered again, as the local map passes it, so
    # that reductions add in the same order and the bytes are the same.
    layout: Fn = (lambda block: fn(np.asfortranarray(block))) if rows.fortran else fn
    try:
        pages.read_ahead(0, stop - start)
        return result_of(layout, array, spans, index)
    except BlockError as exc:
        exc.cause = exc.__cause__  # type: ignore[attr-defined]  # pickled with the error: see restore_cause
        raise
    finally:
        pages.finished(0)
        pages.close()


# Under this a block's pages are left to the kernel: finding its mapping (``/proc/self/maps``) cost 3 ms, twice
# per block, more than reading the block, and a task's mappings go when it ends.
PAGED_BLOCK_BYTES = 1 << 20


class _NoPages:
    def read_ahead(self, start_row: int, stop_row: int) -> None:
        pass

    def note(self, stop_row: int) -> None:
        pass

    def finished(self, index: int) -> None:
        pass

    def close(self) -> None:
        pass


def _pages(rows: np.ndarray, spans: Spans) -> BlockPages | _NoPages:
    return BlockPages(rows, spans) if rows.nbytes >= PAGED_BLOCK_BYTES else _NoPages()


def restore_cause(exc: BaseException) -> None:
    """A ``BlockError`` chains the original error; pickling drops ``__cause__``, so it travels as ``cause``."""
    if isinstance(exc, BlockError) and exc.__cause__ is None:
        exc.__cause__ = exc.__dict__.pop("cause", None)


# -- on the client -------------------------------------------------------------------------------------------------

def map_on_cluster(client: Any, fn: Fn, x: str | os.PathLike[str] | np.ndarray, rows: int | None = None,
                   workers: int | None = None, *, progress: bool = False,
                   out: npyfiles.Pending | None = None) -> np.ndarray:
    """``memory.map(fn, x, rows, workers, engine=client, out=path)``: see the module docstring. ``workers``
    (default: the cluster's threads) sets the default ``rows`` as locally, how many blocks a task runs
    (``decide.cluster_blocks_per_task``: at least two tasks a thread) and how many tasks are in flight: two
    each, more while they hold under 32 MiB of input together (``decide.cluster_blocks_in_flight``). ``out``: the
    file ``map(out=)`` checked, which the workers fill under its temporary name."""
    source = resolve_source(x)
    if source.given is not None and placement.is_freed(source.given):
        raise freed_source("before map was called")
    cluster = Workers(client)
    cluster.ready("before map started")
    threads = workers if workers is not None else sum(client.nthreads().values())
    block_rows = rows_per_block(source.row_bytes(), rows, max(1, threads) * BLOCKS_PER_WORKER)
    array = source.open()
    spans = EvenSpans(len(array), block_rows)
    found = rows_in_file(x) if len(array) else FileRows("", 0, array.dtype, array.shape)
    inputs = found if found is not None else _spill_copy(array, spans)
    try:
        return _run(cluster, fn, inputs, spans, max(1, threads), progress, source.given, out)
    finally:
        if found is None:
            spill.delete(inputs.path)


def _alive(given: np.ndarray | None) -> None:
    """A ``memory.array`` input freed while map ran: blocks read after it read zeros."""
    if given is not None and placement.is_freed(given):
        raise freed_source("while map ran")


def _run(cluster: Workers, fn: Fn, inputs: FileRows, spans: Spans, threads: int, progress: bool,
         given: np.ndarray | None, pending: npyfiles.Pending | None) -> np.ndarray:
    first, block_s = _first(cluster, fn, inputs, spans)
    _alive(given)
    check_storable(first, spans)
    shape = (inputs.shape[0], *first.shape[1:])
    out = _output(pending, shape, first.dtype, len(spans))
    bar = progress_bar(progress, inputs.shape[0], "map")
    live: dict[int, Any] = {}  # the batches handed out and not finished: only these futures are kept
    try:
        out[:spans[0][1]] = first
        bar.update(spans[0][1])
        if len(spans) > 1:
            target = FileRows(str(out.filename), out.offset, out.dtype, out.shape)  # type: ignore[attr-defined]
            batches = _Batches(cluster.client, spans, threads, block_s, inputs.row_bytes + target.row_bytes)

            def done_rows(rows: int) -> None:
                _alive(given)  # this batch may have read the input after it was freed
                bar.update(rows)

            _run_batches(cluster, fn, inputs, target, batches, threads, live, done_rows)
        if pending is not None:
            placement.publish(pending, out)
    except BaseException as exc:
        _abandon(cluster.client, live.values(), out)
        restore_cause(exc)
        raise
    finally:
        bar.close()
    return out


class _Batches:
    """Blocks 1.. (block 0 ran alone, and timed) in batches of ``decide.cluster_blocks_per_task`` blocks, one task
    each, its blocks held to the least memory a worker's thread has (``_thread_share``)."""

    def __init__(self, client: Any, spans: Spans, threads: int, block_s: float, row_bytes: int) -> None:
        self.spans, self.block_bytes = spans, (spans[0][1] - spans[0][0]) * row_bytes
        self.size = cluster_blocks_per_task(len(spans) - 1, threads, block_s, self.block_bytes, _thread_share(client))
        self.groups = EvenSpans(len(spans) - 1, self.size)

    def __len__(self) -> int:
        return len(self.groups)

    def blocks(self, batch: int) -> tuple[int, int]:
        """Batch ``batch``'s first block and the block after its last."""
        first, stop = self.groups[batch]
        return first + 1, stop + 1

    def rows(self, batch: int) -> int:
        first, stop = self.blocks(batch)
        return self.spans[stop - 1][1] - self.spans[first][0]


def _thread_share(client: Any) -> int:
    """The least memory a worker's thread has (its worker's limit over its threads); 0 when none has a limit."""
    workers = client.scheduler_info()["workers"].values()
    shares = [int(w.get("memory_limit") or 0) // max(1, int(w.get("nthreads") or 1)) for w in workers]
    return min((share for share in shares if share > 0), default=0)


def _run_batches(cluster: Workers, fn: Fn, inputs: FileRows, target: FileRows, batches: _Batches, threads: int,
                 live: dict[int, Any], done_rows: Callable[[int], None]) -> None:
    """The batches, in row order, through ``run_in_order``: ``live`` holds the futures not finished (for
    ``_abandon``), ``done_rows`` is told the rows of each batch as it finishes."""
    spans = batches.spans
    in_flight = cluster_blocks_in_flight(threads, batches.size * batches.block_bytes, DEFAULT_BLOCK_BYTES)

    def submit(batch: int) -> _Block:
        live[batch] = cluster.client.submit(write_blocks, fn, inputs, target, spans, *batches.blocks(batch),
                                            pure=False)
        return _Block(live[batch], batch)

    def wait_for(running: set[_Block], when: str) -> tuple[set[_Block], set[_Block]]:
        if not running:  # every batch already done: run_in_order still waits on what it has left
            return set(), set()
        first = batches.blocks(min(block.index for block in running))[0]
        cluster.wait([block.future for block in running], when, f"rows {rows_label(spans, first)}")
        finished = {block for block in running if block.future.done()}
        return finished, running - finished

    def done(batch: int) -> None:
        del live[batch]
        done_rows(batches.rows(batch))

    run_in_order(len(batches), in_flight, submit, wait_for, done, Stop(len(batches)), lambda: None)


def _output(pending: npyfiles.Pending | None, shape: tuple[int, ...], dtype: np.dtype[Any],
            blocks: int) -> np.ndarray:
    """``map(out=)``'s file; else a spill file the workers write by path (RAM when block 0 is the only one)."""
    if pending is not None:
        return placement.in_pending(pending, shape, dtype)
    if blocks == 1:
        return placement.array(shape, dtype)
    return placement._spilled(shape, dtype, "SSD: the output of map on a dask cluster (its workers write it by path)")


class _Block:
    """A batch's future for ``run_in_order`` (``index``: the batch), answering from what this process knows once done:
    ``exception()`` and ``result()`` of a ``distributed.Future`` each ask the event loop, two more round trips per
    block that tripled the time of a map of small blocks."""

    def __init__(self, future: Any, index: int) -> None:
        self.future, self.index = future, index

    def exception(self) -> BaseException | None:
        return None if self.future.status == "finished" else self.future.exception()

    def result(self) -> int:
        if self.future.status != "finished":
            self.future.result()  # raises the task's error
        return self.index


def _abandon(client: Any, futures: Iterable[Any], out: np.ndarray) -> None:
    """Free the output of a run that stopped (an error, Ctrl-C) while blocks may still run. Freeing truncates a
    spill file, and a task still writing to it then died of SIGBUS with its worker (Ctrl-C killed them all); a
    running task cannot be stopped. So the blocks not started are cancelled and the file is only unlinked first:
    a block still running writes to a file nobody can open, whose space the kernel frees when its task ends."""
    client.cancel(list(futures))
    path = getattr(out, "filename", None)
    if path is not None:
        spill.delete(str(path))  # the file is no longer ours to truncate: free() then only drops our mapping
    placement.free(out)


def _first(cluster: Workers, fn: Fn, inputs: FileRows, spans: Spans) -> tuple[np.ndarray, float]:
    """Block 0's result and its seconds (``first_block``)."""
    future = cluster.client.submit(first_block, fn, inputs, spans, pure=False)
    try:
        cluster.wait([future], ALL_COMPLETED, f"rows {rows_label(spans, 0)}")
        result: tuple[np.ndarray, float] = future.result()
    except BaseException as exc:
        cluster.client.cancel([future])
        restore_cause(exc)
        raise
    return result


def to_dask(x: str | os.PathLike[str] | np.ndarray, rows: int | None = None, *, client: Any = None) -> Any:
    """``x`` as a ``dask.array`` with one chunk per ``map`` block (``rows`` rows; the default as for ``map`` on
    one thread, or dask's ``array.chunk-size`` where smaller: ``cluster()`` sets it from its workers' limit,
    ``_rows_in_chunk``). A file-backed ``x`` is read by the tasks from its file by path, in one graph layer (the graph holds
    no data; unlike ``da.from_array``, which copies an ``np.memmap`` into RAM, dask #11850); the dask array holds
    ``x`` here, so a spilled ``memory.array`` made in a function lives as long as what it returned (after
    ``memory.free(x)`` a compute raises ``ChunkError``). An in-RAM one is chunked as it is. With ``client``, for
    clusters that do not share this machine's files, the blocks are read here one at a time and scattered to the
    workers; write results with ``to_zarr``."""
    import dask
    import dask.array as da

    source = resolve_source(x)
    array = source.open()
    block_rows = rows_per_block(source.row_bytes(), rows)
    if rows is None:
        block_rows = min(block_rows, _rows_in_chunk(source.row_bytes()))
    spans = block_spans(len(array), block_rows)
    found = rows_in_file(x) if len(array) else None
    chunks = (block_rows, *array.shape[1:])
    if not len(array) or (client is None and found is None):
        if file_region(array) is not None:
            raise ChunkError("to_dask needs a memory-mapped array whose rows lie one after another in its file "
                             "(a scattered view would be copied into RAM); pass np.ascontiguousarray of it, or save "
                             "it with np.save and pass the path")
        return da.from_array(array, chunks=chunks)
    if client is not None:
        blocks = _scattered(client, array, spans)
        return da.concatenate([da.from_delayed(block, (stop - start, *array.shape[1:]), array.dtype)
                               for block, (start, stop) in zip(blocks, spans)])
    assert found is not None
    reader = FileArray(found, keep=x)
    return da.from_array(reader, chunks=chunks, inline_array=True, meta=np.empty((0,) * reader.ndim, reader.dtype),
                         name=f"to_dask-{dask.base.tokenize(found, block_rows)}")


class FileArray:
    """The rows of a file as ``da.from_array`` reads them: each task opens the file by path and copies its chunk
    (a memmap would keep the file mapped, and pickles whole). ``keep`` (the caller's array) is held here and not
    pickled: the graph on the client keeps a spilled source alive; tasks get only the path."""

    def __init__(self, rows: FileRows, keep: object = None) -> None:
        self.rows, self.keep = rows, keep
        self.shape, self.dtype, self.ndim = rows.shape, rows.dtype, len(rows.shape)

    def __getitem__(self, index: Any) -> np.ndarray:
        try:
            return np.array(self.rows.open()[index])
        except FileNotFoundError:
            raise ChunkError(f"to_dask's source file {self.rows.path} is gone: the array was freed "
                             "(memory.free) or its file deleted before the dask array was computed") from None

    def __reduce__(self) -> tuple[Any, ...]:
        return FileArray, (self.rows,)

    def __dask_tokenize__(self) -> Any:
        return self.rows


def _scattered(client: Any, array: np.ndarray, spans: Spans) -> list[Any]:
    import dask

    pages = BlockPages(array, spans)
    futures = []
    try:
        for index, (start, stop) in enumerate(spans):
            pages.read_ahead(start, stop)
            futures.append(dask.delayed(client.scatter(np.array(array[start:stop]))))
            pages.finished(index)
    finally:
        pages.close()
    return futures


def _rows_in_chunk(row_bytes: int) -> int:
    """Rows in dask's ``array.chunk-size`` (at least one; no bound where it is not a size, such as ``"auto"``)."""
    import dask
    from dask.utils import parse_bytes

    try:
        size = int(parse_bytes(dask.config.get("array.chunk-size")))
    except (TypeError, ValueError, KeyError):
        return sys.maxsize
    return max(1, size // max(1, row_bytes))
