"""``memory.chunks``: stream the rows of a file (or any array) in blocks with flat memory.

    for block in memory.chunks("features.npy", rows=1_000_000):
        total += block.sum()

Each block is a view (no copy) of consecutive rows; the last one is shorter. For a file, the next block is read
(on a background thread) while this one is used, and each finished block is released from the process and from
the page cache it brought in (see ``pages``), so a file much larger than RAM streams in a few blocks' worth of
memory, and a file that was cached before stays cached.

Documented behaviour at the edges:

* a 1-d array streams its elements (``rows`` elements per block); an array with no rows yields no block;
* blocks from a ``.npy`` path are read-only; pass your own ``np.memmap(mode="r+")`` to write through them;
* a block kept after the loop moved on stays valid (its pages are read back from the file when touched);
* breaking out of the loop (or ``close()`` on the iterator) releases everything at once; pages whose reads were
  still in flight are dropped from the page cache a moment later;
* a copy-on-write memmap (``mode="c"``) is not released from the process (its changed pages exist only there);
  a file this user neither owns nor may write is not dropped from the page cache (the kernel does not say which
  of its pages were cached before);
* in-RAM arrays of any layout and dtype (object too) give views; files and memory-mapped arrays must store their
  rows one after another (C order): Fortran-order files, 0-d arrays, object-dtype files (never unpickled),
  truncated or non-``.npy`` files and ``rows <= 0`` raise ``ChunkError`` / ``CorruptFileError`` at the call;
* a ``memory.array`` freed (``memory.free``) reads as zeros: freed before the call it raises ``ChunkError`` there,
  freed while a block is in use it raises ``ChunkError`` when the loop asks for the next block.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ..arrays import placement
from ..blocks.pages import BlockPages
from ..blocks.progress import progress_bar
from ..blocks.rules import block_spans, rows_per_block
from ..blocks.sources import Source, freed_source, resolve_source
from ..units import flag


def chunks(source: str | os.PathLike[str] | np.ndarray, rows: int | None = None, *,
           progress: bool = False) -> Iterator[np.ndarray]:
    """Views of consecutive blocks of ``rows`` rows of ``source`` (a ``.npy`` path, an ``np.memmap``, a
    ``memory.array`` or any NumPy array). ``rows=None`` picks blocks of about 32 MB.

    ``progress=True`` shows a bar with rows done, throughput and time left (needs tqdm).
    Bad input raises here, not at the first block.
    """
    show = flag(progress, "chunks: progress")
    resolved = resolve_source(source)
    if resolved.given is not None and placement.is_freed(resolved.given):
        raise freed_source("before chunks was called")
    block_rows = rows_per_block(resolved.row_bytes(), rows)
    return _stream(resolved, block_rows, show)


def _stream(source: Source, rows: int, progress: bool) -> Iterator[np.ndarray]:
    array = source.open()
    spans = block_spans(len(array), rows)
    blocks = BlockPages(array, spans)
    bar = progress_bar(progress, len(array), "chunks")
    try:
        for index, (start, stop) in enumerate(spans):
            # This block was asked for one block earlier (except the first); ask for the next one now.
            following = spans[min(index + 1, len(spans) - 1)][1]
            blocks.read_ahead(start if index == 0 else stop, following)
            yield array[start:stop]
            if source.given is not None and placement.is_freed(array):  # the block just used may have read zeros
                raise freed_source(f"while block {index + 1} of {len(spans)} was in use")
            blocks.finished(index)
            bar.update(stop - start)
    finally:
        blocks.close()
        bar.close()
