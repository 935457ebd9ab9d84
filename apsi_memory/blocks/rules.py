"""The pure rules under ``chunks`` and ``map``: which rows form a block, which bytes may be released when, which
pages were ours to drop, and how much written data may wait for the disk.

Theory of operation
-------------------
A stream splits ``n_rows`` rows into consecutive blocks (``block_spans``). Blocks finish in any order (``map``
runs several at once), but memory is released front to back: ``ReleaseFront`` hands out the whole pages before
the first unfinished block, each byte once, so a page shared with a block still in use waits for that block.

Pages the stream brought into the page cache are dropped again, pages that were cached before are not (a warm
file stays warm for the next reader): ``Residency`` remembers, for the pages between the release front and the
read-ahead frontier only, which were cached before this process touched them, and hands out the runs that were
not. Dropping written pages only starts writing them, so ``WriteBehind`` queues written ranges and says when the
oldest must be written out for good, which keeps dirty memory bounded.

Everything here is arithmetic on integers (addresses, page numbers, the page size passed in) and boolean arrays:
no system call, so every rule is tested with made-up numbers.
"""

from __future__ import annotations

import collections
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ChunkError
from ..units import MiB

# A block of about this many bytes when the caller gives no ``rows``: large enough that the per-block system calls
# cost nothing next to the reading, small enough that a few blocks in flight per core stay far below any budget.
DEFAULT_BLOCK_BYTES = 32 * MiB
# ``map`` calls its function on pieces of a block the size of a core's (level-2) cache each. Its temporaries and
# result spill into the level-3 cache but not to memory, and the Python, ufunc calls and GIL hand-offs a piece
# costs are paid over as many bytes as that allows: on 2 threads, 512 MiB float32, 1 MiB pieces ran b * 2.0 + 1.0
# 1.25-1.4x as fast as quarter-cache (256 KiB) ones, 2 MiB about as fast, 4 MiB half as fast
# (benchmarks/bench_map_speed.py -k piece_sizes).
PIECES_PER_CACHE = 1
# The largest page-cache folio (a PMD: 2 MiB on x86-64 and arm64 with 4 KiB pages).
FOLIO_BYTES = 2 * MiB


# -- rows and blocks -----------------------------------------------------------------------------------------------

def rows_per_block(row_bytes: int, rows: object, blocks_in_flight: int = 1) -> int:
    """``rows`` checked, or (when it is ``None``) the default for rows of ``row_bytes`` bytes."""
    return default_rows(row_bytes, blocks_in_flight) if rows is None else check_rows(rows)


def check_rows(rows: object) -> int:
    return positive_count(rows, "rows", "a whole number of rows per block")


def positive_count(value: object, name: str, meaning: str) -> int:
    """``value`` as a positive int, or a ``ChunkError`` naming what was passed."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ChunkError(f"{name} must be {meaning}, not {value!r}")
    if value <= 0:
        raise ChunkError(f"{name} must be at least 1, not {value}")
    return int(value)


def default_rows(row_bytes: int, blocks_in_flight: int = 1) -> int:
    """Rows per block so that ``blocks_in_flight`` blocks together hold about ``DEFAULT_BLOCK_BYTES`` (``map``
    keeps two per worker in flight: many cores get smaller blocks, not more memory); at least one row."""
    return max(1, DEFAULT_BLOCK_BYTES // max(1, blocks_in_flight) // max(1, row_bytes))


def block_spans(n_rows: int, rows: int, first: int = 0) -> list[tuple[int, int]]:
    """``[(first, first+rows), …, (first+k*rows, n_rows)]``: consecutive blocks up to row ``n_rows``, the last
    one shorter (``first``: the pieces of a block that starts there)."""
    return [(start, min(start + rows, n_rows)) for start in range(first, n_rows, rows)]


def piece_rows(row_bytes: int, cache_bytes: int) -> int:
    """Rows per piece of a block, so that a piece of input takes ``1/PIECES_PER_CACHE`` of a core's cache: its
    result and the function's temporaries (about as large each) stay in the chip's caches, so a light function
    is not limited by memory bandwidth twice over (once for the temporaries, once for the output); at least one
    row."""
    return max(1, cache_bytes // PIECES_PER_CACHE // max(1, row_bytes))


def page_floor(address: int, page: int) -> int:
    return address - address % page


def page_ceil(address: int, page: int) -> int:
    return page_floor(address + page - 1, page)


# -- what may be released ------------------------------------------------------------------------------------------

@dataclass
class ReleaseFront:
    """Which bytes may be released as blocks finish, in any order: everything before the first unfinished block.

    Addresses are those of the rows (``first_row`` + row index × ``stride``). Only whole pages (of ``page``
    bytes) before the front are handed out, so a page shared with a block still in use is released together with
    that block.
    """

    spans: Sequence[tuple[int, int]]
    first_row: int
    stride: int
    page: int

    def __post_init__(self) -> None:
        self._finished: set[int] = set()
        self._next = 0  # index of the first unfinished block
        self._released_to = page_floor(self.first_row, self.page)

    def finish(self, index: int) -> tuple[int, int] | None:
        """Block ``index`` is done; the address range that can be released now, if any."""
        self._finished.add(index)
        while self._next in self._finished:
            self._finished.remove(self._next)
            self._next += 1
        if self._next == 0:
            return None
        return self._advance(page_floor(self.row_address(self.spans[self._next - 1][1]), self.page))

    def rest(self) -> tuple[int, int] | None:
        """Everything not yet released, up to the page holding the last row (at the end, or on an early exit)."""
        n_rows = self.spans[-1][1] if self.spans else 0
        return self._advance(page_ceil(self.row_address(n_rows), self.page))

    def row_address(self, row: int) -> int:
        return self.first_row + row * self.stride

    def _advance(self, to: int) -> tuple[int, int] | None:
        if to <= self._released_to:
            return None
        released = (self._released_to, to)
        self._released_to = to
        return released


# -- which pages were ours -----------------------------------------------------------------------------------------

class Residency:
    """Which pages were in the page cache before this process read them, for the pages between the release front
    and the read-ahead frontier only (so it stays small however large the file is)."""

    def __init__(self, first_page: int, folio_pages: int) -> None:
        self._first = first_page  # page of _was_cached[0]
        self._folio_pages = folio_pages
        self._was_cached = np.zeros(0, dtype=bool)

    @property
    def known_to(self) -> int:
        """The first page whose state has not been recorded yet."""
        return self._first + len(self._was_cached)

    def record(self, was_cached: np.ndarray) -> None:
        """The states of the pages from ``known_to`` on."""
        self._was_cached = np.concatenate([self._was_cached, was_cached.astype(bool)])

    def uncached(self, first_page: int, end_page: int) -> list[tuple[int, int]]:
        """Runs ``(first_page, count)`` in ``[first_page, end_page)`` that were not cached (nothing is forgotten)."""
        low, high = max(first_page, self._first), min(end_page, self.known_to)
        if high <= low:
            return []
        return false_runs(self._was_cached[low - self._first:high - self._first], low)

    def take_uncached(self, end_page: int) -> list[tuple[int, int]]:
        """Runs ``(first_page, count)`` before ``end_page`` that were not cached before.

        The last ``folio_pages`` pages handed out are handed out once more with the next call: the kernel drops a
        large page-cache folio only when one request covers all of it, and one that straddles the boundary between
        two releases would otherwise stay. Pages never recorded count as cached: this process did not ask for
        them, so it does not drop them."""
        count = max(0, min(end_page, self.known_to) - self._first)
        runs = false_runs(self._was_cached[:count], self._first)
        keep_from = max(0, count - self._folio_pages)
        self._was_cached = self._was_cached[keep_from:]
        self._first += keep_from
        return runs


def false_runs(flags: np.ndarray, offset: int) -> list[tuple[int, int]]:
    """``(offset + start, length)`` of each run of ``False`` in ``flags``."""
    if flags.all():  # a warm file: the common case, answered in one pass
        return []
    padded = np.concatenate([[True], flags, [True]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    return [(offset + int(s), int(e - s)) for s, e in zip(starts, ends)]


# -- how much written data may wait for the disk -------------------------------------------------------------------

class WriteBehind:
    """File ranges released while possibly dirty. ``posix_fadvise(DONTNEED)`` only starts writing dirty pages and
    drops the clean ones, so written ranges are queued and, once more than ``slack_bytes`` are queued, the oldest
    are written out and dropped for good: dirty memory stays bounded however much is written."""

    def __init__(self, slack_bytes: int) -> None:
        self._slack = slack_bytes
        self._queued: collections.deque[tuple[int, int]] = collections.deque()
        self._queued_bytes = 0

    def add(self, offset: int, length: int) -> list[tuple[int, int]]:
        """Queue ``(offset, length)``; the ranges now due to be written out and dropped, oldest first."""
        self._queued.append((offset, length))
        self._queued_bytes += length
        due = []
        while self._queued_bytes > self._slack:
            due.append(self._queued.popleft())
            self._queued_bytes -= due[-1][1]
        return due

    def drain(self) -> list[tuple[int, int]]:
        due, self._queued, self._queued_bytes = list(self._queued), collections.deque(), 0
        return due
