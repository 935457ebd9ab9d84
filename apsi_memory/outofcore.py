"""What ``chunks`` and ``map`` share: turning a source into an array of rows, splitting it into row blocks, and
asking the kernel to read the next block ahead and to let go of finished ones.

Theory of operation
-------------------
A file-backed array (a ``.npy`` path, an ``np.memmap``, a ``memory.array`` on the SSD) is found in
``/proc/self/maps`` by its address, which says, from the kernel itself, whether the memory is a shared mapping of
a file, which file, and at which offset. Nothing here relies on how NumPy or ``memory.array`` built the mapping.

For such a region, ``Pages`` does this per block:

* before a block is read: ``mincore`` records which of its pages were already in the page cache (well ahead, as
  the kernel's own read-ahead runs ahead of us), then a background thread reads the pages that were not through
  a file descriptor into a small scratch buffer, so they are in the page cache when the block is used; a warm
  block costs nothing;
* once a block is finished (and every block before it, so out-of-order finishes in ``map`` are safe):
  ``madvise(MADV_DONTNEED)`` drops it from this process at once (only for *shared* mappings: there the data
  lives in the file and comes back on the next touch; in a private or anonymous mapping it would be lost), then,
  in the background, ``posix_fadvise(POSIX_FADV_DONTNEED)`` drops from the page cache the pages this process
  brought in. Pages that were cached before stay cached, so a warm file stays warm for the next reader. Written
  pages are dropped once they are on the disk (``WriteBehind``), so dirty memory stays bounded too.

In-RAM arrays need none of this: their blocks are plain views.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import mmap
import numbers
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.lib.format as npy_format

from .errors import ChunkError, CorruptFileError
from .units import MiB

PAGE = mmap.PAGESIZE
# A block of about this many bytes when the caller gives no ``rows``: large enough that the per-block system calls
# cost nothing next to the reading, small enough that a few blocks in flight per core stay far below any budget.
DEFAULT_BLOCK_BYTES = 32 * MiB
# How far past the requested read-ahead the page-cache state is noted: beyond the kernel's largest read-ahead
# window, so pages that read-ahead brings in are known to be ours (a byte per 4 KiB page: 16 KiB of state).
RESIDENCY_AHEAD_BYTES = 64 * MiB
# The largest page-cache folio (a PMD: 2 MiB on x86-64 and arm64 with 4 KiB pages), in pages.
FOLIO_PAGES = 2 * MiB // PAGE
# Written pages released but perhaps not yet on the disk may add up to this before we wait for the disk.
WRITE_BEHIND_BYTES = 16 * MiB
# Read-ahead reads this much per call, into one reused scratch buffer (what matters is the page cache it fills).
READ_PIECE_BYTES = 1 * MiB
# Reads still in flight when a stream ends have landed well within this; then their pages can be dropped.
SETTLE_SECONDS = 0.25


# -- pure: rows and blocks -----------------------------------------------------------------------------------------

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


def block_spans(n_rows: int, rows: int) -> list[tuple[int, int]]:
    """``[(0, rows), (rows, 2*rows), …, (k*rows, n_rows)]``: consecutive blocks, the last one shorter."""
    return [(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows)]


def page_floor(address: int) -> int:
    return address - address % PAGE


def page_ceil(address: int) -> int:
    return page_floor(address + PAGE - 1)


@dataclass
class ReleaseFront:
    """Which bytes may be released as blocks finish, in any order: everything before the first unfinished block.

    Addresses are those of the rows (``first_row`` + row index × ``stride``). Only whole pages before the front
    are handed out, so a page shared with a block still in use is released together with that block.
    """

    spans: Sequence[tuple[int, int]]
    first_row: int
    stride: int

    def __post_init__(self) -> None:
        self._finished: set[int] = set()
        self._next = 0  # index of the first unfinished block
        self._released_to = page_floor(self.first_row)

    def finish(self, index: int) -> tuple[int, int] | None:
        """Block ``index`` is done; the address range that can be released now, if any."""
        self._finished.add(index)
        while self._next in self._finished:
            self._finished.remove(self._next)
            self._next += 1
        if self._next == 0:
            return None
        return self._advance(page_floor(self.row_address(self.spans[self._next - 1][1])))

    def rest(self) -> tuple[int, int] | None:
        """Everything not yet released, up to the page holding the last row (at the end, or on an early exit)."""
        n_rows = self.spans[-1][1] if self.spans else 0
        return self._advance(page_ceil(self.row_address(n_rows)))

    def row_address(self, row: int) -> int:
        return self.first_row + row * self.stride

    def _advance(self, to: int) -> tuple[int, int] | None:
        if to <= self._released_to:
            return None
        released = (self._released_to, to)
        self._released_to = to
        return released


class Residency:
    """Which pages were in the page cache before this process read them, for the pages between the release front
    and the read-ahead frontier only (so it stays small however large the file is)."""

    def __init__(self, first_page: int) -> None:
        self._first = first_page  # page of _was_cached[0]
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

        The last ``FOLIO_PAGES`` pages handed out are handed out once more with the next call: the kernel drops a
        large page-cache folio only when one request covers all of it, and one that straddles the boundary between
        two releases would otherwise stay. Pages never recorded count as cached: this process did not ask for
        them, so it does not drop them."""
        count = max(0, min(end_page, self.known_to) - self._first)
        runs = false_runs(self._was_cached[:count], self._first)
        keep_from = max(0, count - FOLIO_PAGES)
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


# -- pure: /proc/self/maps -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """One mapping of this process, as ``/proc/self/maps`` lists it."""

    start: int
    end: int
    shared: bool
    writable: bool
    file_offset: int
    path: str  # "" for anonymous memory, "[heap]" and the like for the kernel's own

    @property
    def is_file(self) -> bool:
        """A file with its own pages on a disk; shared anonymous memory (``mmap(-1, n)``, memfd, System V) is RAM."""
        return self.path.startswith("/") and not self.path.startswith(_MEMORY_ONLY_FILES)


# How /proc/self/maps names shared mappings that are memory, not a file on a disk.
_MEMORY_ONLY_FILES = ("/dev/zero", "/memfd:", "/SYSV", "/dev/shm/")


def parse_maps_line(line: str) -> Region | None:
    """``7f..-7f.. r--s 00001000 fd:01 1234   /data/x.npy`` (the path may hold spaces, or be absent)."""
    fields = line.split(maxsplit=5)
    if len(fields) < 5:
        return None
    start, end = (int(part, 16) for part in fields[0].split("-"))
    perms = fields[1]
    path = fields[5] if len(fields) == 6 else ""
    return Region(start, end, perms[3:4] == "s", perms[1:2] == "w", int(fields[2], 16), path)


def region_in_maps(maps: str, start: int, end: int) -> Region | None:
    """The file mapping in ``/proc/self/maps`` text that holds ``[start, end)``, joining neighbours the kernel
    split (same file, consecutive offsets, same access); ``None`` if the range is not one file mapping.

    The lines are sorted by address: a binary search finds the first, so only a few lines are parsed."""
    lines = maps.splitlines()
    first = bisect.bisect_right(lines, start, key=_line_start) - 1
    joined = parse_maps_line(lines[first]) if first >= 0 else None
    if joined is None or not joined.start <= start < joined.end:
        return None
    for line in lines[first + 1:]:
        if joined.end >= end:
            break
        region = parse_maps_line(line)
        if region is None or not _continues(joined, region):
            break
        joined = Region(joined.start, region.end, joined.shared, joined.writable, joined.file_offset, joined.path)
    return joined if joined.is_file and end <= joined.end else None


def _line_start(line: str) -> int:
    return int(line[:line.find("-")] or "0", 16)


def _continues(left: Region, right: Region) -> bool:
    return (right.start == left.end and right.path == left.path and right.shared == left.shared
            and right.writable == left.writable and right.file_offset == left.file_offset + (left.end - left.start))


# -- the kernel: advice on one file mapping ------------------------------------------------------------------------

def _load_libc() -> ctypes.CDLL | None:
    if sys.platform != "linux" or not hasattr(mmap, "MADV_DONTNEED"):
        return None  # /proc/self/maps, mincore on file pages and cachestat are Linux's
    libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter already uses
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.syscall.restype = ctypes.c_long
    if hasattr(libc, "sync_file_range"):
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return libc


_LIBC = _load_libc()


class Pages:
    """Read-ahead and release for the rows of one file mapping (see the module docstring).

    The decisions (which pages, which of them were cached) and dropping pages from the process are done in the
    caller's thread; what can wait for the disk (reading ahead, dropping and writing out page cache) runs in
    order on a ``Background`` thread, so the caller keeps computing meanwhile."""

    def __init__(self, region: Region, first_row: int) -> None:
        self.region = region
        self._residency = Residency(page_floor(max(first_row, region.start)) // PAGE)
        self._fd = _open_mapped_file(region)
        self._may_drop = self._fd is not None and _sees_page_cache(self._fd)
        self._write_behind = WriteBehind(WRITE_BEHIND_BYTES)  # used by the background thread only
        self._scratch = bytearray(READ_PIECE_BYTES)  # read-ahead lands here (and in the page cache)
        self._kernel = Background()
        self._last_runs: list[tuple[int, int]] = []
        self._read_to = region.start  # read-ahead has been asked for everything before this address

    def note(self, end: int) -> None:
        """Note which pages up to ``end`` (and well beyond) are in the page cache before we touch them: the
        kernel's own read-ahead, triggered by our reads, runs ahead of what we ask for."""
        end = min(page_ceil(end) + RESIDENCY_AHEAD_BYTES, self.region.end)
        start = self._residency.known_to * PAGE
        if end > start:
            self._residency.record(self._page_states(start, end))

    def _page_states(self, start: int, end: int) -> np.ndarray:
        """Which pages of ``[start, end)`` are cached: from one ``cachestat`` count when the range is all cached
        or all not (streaming's usual case, 100x cheaper), else page by page from ``mincore``."""
        n_pages = (end - start) // PAGE
        cached = None if self._fd is None else _cached_pages(self._fd, *self._file_range(start, end - start))
        if cached in (0, n_pages):
            return np.full(n_pages, cached == n_pages, dtype=bool)
        return _mincore(start, end - start)

    def read_ahead(self, start: int, end: int) -> None:
        """Have the pages of ``[start, end)`` that were not cached read now, in the background (each page once)."""
        self.note(end)
        start, end = self._clip(max(page_floor(start), self._read_to), page_ceil(end))
        self._read_to = max(self._read_to, end)
        runs = self._residency.uncached(start // PAGE, end // PAGE)
        if runs and self._fd is not None:
            self._kernel.submit(self._read_in, runs)

    def release(self, span: tuple[int, int] | None, last: bool = False) -> None:
        """Let go of ``span``. The ``last`` release may cover pages read ahead but never used, and a page whose
        read is still in flight cannot be dropped yet: ``close`` drops those once more a moment later."""
        if span is None:
            return
        start, end = self._clip(*span)
        if end <= start:
            return
        if self.region.shared:  # in a private mapping the pages may be the only copy of what was written
            _madvise(start, end - start, mmap.MADV_DONTNEED)
        runs = self._residency.take_uncached(end // PAGE)
        if runs:  # a warm file has none
            self._kernel.submit(self._drop_runs, runs)
        if last:
            self._last_runs = runs

    def close(self) -> None:
        """Wait for the calls asked for and start writing what is still dirty. A moment later, off this thread
        (reads in flight have landed by then), drop the last release's pages once more and close the file."""
        try:
            self._kernel.close()
        finally:
            self._finish_with_file()

    def _finish_with_file(self) -> None:
        if self._fd is None:
            return
        again = [self._file_range(first_page * PAGE, count * PAGE)
                 for first_page, count in (self._last_runs if self._may_drop else [])]
        for offset, length in self._write_behind.drain():
            _fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)
            again.append((offset, length))
        if again:
            timer = threading.Timer(SETTLE_SECONDS, _drop_and_close, (self._fd, again))
            timer.daemon = True
            timer.start()
        else:  # a warm file: nothing of ours to drop
            os.close(self._fd)
        self._fd = None

    def _clip(self, start: int, end: int) -> tuple[int, int]:
        return max(start, self.region.start), min(end, self.region.end)

    def _file_range(self, address: int, length: int) -> tuple[int, int]:
        return self.region.file_offset + (address - self.region.start), length

    def _read_in(self, runs: list[tuple[int, int]]) -> None:
        """Read the runs through the file descriptor into a scratch buffer: the kernel's streaming read-ahead
        (large pages, many reads in flight) fills the page cache, and nothing is mapped into this process.
        Measured here, this beat ``MADV_WILLNEED``, which the kernel serves one small read-ahead window at a
        time in the calling thread."""
        assert self._fd is not None
        scratch = memoryview(self._scratch)
        for first_page, count in runs:
            offset, length = self._file_range(first_page * PAGE, count * PAGE)
            for piece in range(offset, offset + length, READ_PIECE_BYTES):
                if os.preadv(self._fd, [scratch[:offset + length - piece]], piece) == 0:
                    return  # the file ends here

    def _drop_runs(self, uncached_runs: list[tuple[int, int]]) -> None:
        for first_page, count in uncached_runs:
            self._drop_from_cache(first_page * PAGE, count * PAGE)

    def _drop_from_cache(self, address: int, length: int) -> None:
        if self._fd is None or not self._may_drop:
            return
        offset, length = self._file_range(address, length)
        _fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)  # dirty pages: starts writing them
        if self.region.writable:
            for due in self._write_behind.add(offset, length):
                _write_out(self._fd, *due)
                _fadvise(self._fd, *due, os.POSIX_FADV_DONTNEED)


def _drop_and_close(fd: int, ranges: list[tuple[int, int]]) -> None:
    for offset, length in ranges:
        _fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    os.close(fd)


class Background:
    """One thread, started on the first call, that makes slow system calls in the order they were asked for. At
    most ``depth`` wait, so a slow disk slows the caller down instead of piling up calls. An exception in a call
    (a bug: the calls themselves ignore the kernel's refusals) is raised again by ``close``."""

    def __init__(self, depth: int = 4) -> None:
        self._calls: queue.Queue[tuple[Callable[..., None], tuple[object, ...]] | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[..., None], *args: object) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="apsi-pages", daemon=True)
            self._thread.start()
        self._calls.put((call, args))

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            call, args = item
            try:
                call(*args)
            except BaseException as exc:  # noqa: BLE001 -- keep serving: the caller may be waiting to put a call
                self._error = self._error or exc


def _write_out(fd: int, offset: int, length: int) -> None:
    """Wait until ``[offset, offset + length)`` of the file is on the disk (Linux ``sync_file_range``)."""
    if _LIBC is not None and hasattr(_LIBC, "sync_file_range"):
        _LIBC.sync_file_range(fd, offset, length, _SYNC_WAIT_BEFORE | _SYNC_WRITE | _SYNC_WAIT_AFTER)


_SYNC_WAIT_BEFORE, _SYNC_WRITE, _SYNC_WAIT_AFTER = 1, 2, 4  # <fcntl.h> SYNC_FILE_RANGE_*


# Advice is a hint: a kernel that refuses it costs memory, never correctness, so a refusal is not an error.
def _madvise(address: int, length: int, advice: int) -> None:
    assert _LIBC is not None
    _LIBC.madvise(address, length, advice)


def _fadvise(fd: int, offset: int, length: int, advice: int) -> None:
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, advice)


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_SYS_CACHESTAT = 451  # the same number on every architecture that has it (Linux 6.5)
_cachestat_works = True


def _cached_pages(fd: int, offset: int, length: int) -> int | None:
    """How many pages of the file range are in the page cache (``cachestat``), or ``None`` where the kernel (or
    a seccomp filter) does not offer it; then it is not asked again."""
    global _cachestat_works
    if not _cachestat_works or _LIBC is None:
        return None
    stat = _CacheStat()
    asked = _CacheStatRange(offset, length)
    if _LIBC.syscall(ctypes.c_long(_SYS_CACHESTAT), ctypes.c_long(fd), ctypes.byref(asked), ctypes.byref(stat),
                     ctypes.c_long(0)):
        _cachestat_works = False
        return None
    return int(stat.nr_cache)


def _mincore(address: int, length: int) -> np.ndarray:
    """Which pages of ``[address, address + length)`` are resident; all of them if the kernel will not say (so
    nothing is dropped that this process may not have brought in)."""
    assert _LIBC is not None
    states = np.zeros((length + PAGE - 1) // PAGE, dtype=np.uint8)
    if _LIBC.mincore(address, length, states.ctypes.data) != 0:
        states[:] = 1
    return (states & 1).astype(bool)


def _open_mapped_file(region: Region) -> int | None:
    """A read-only descriptor of the mapped file (for read-ahead and ``posix_fadvise``), if it can be opened."""
    path = region.path
    if path.endswith(" (deleted)"):  # a spill file already unlinked: reach it through the mapping
        path = f"/proc/self/map_files/{region.start:x}-{region.end:x}"
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _sees_page_cache(fd: int) -> bool:
    """Whether ``mincore`` tells this process about the file's page cache: the kernel reports it only to the
    file's owner or someone who could write it. For any other file we cannot tell our pages from another
    reader's, so its cache is left alone."""
    if not hasattr(os, "posix_fadvise"):
        return False
    euid = os.geteuid()
    if euid == 0 or os.fstat(fd).st_uid == euid:
        return True
    return os.access(f"/proc/self/fd/{fd}", os.W_OK)


def file_region(array: np.ndarray) -> Region | None:
    """The file mapping that holds all rows of ``array``, or ``None`` (in RAM, or no such kernel interface)."""
    if _LIBC is None or array.size == 0:
        return None
    first, end = row_extent(array)
    try:
        with open("/proc/self/maps") as maps:
            return region_in_maps(maps.read(), first, end)
    except OSError:
        return None


def row_extent(array: np.ndarray) -> tuple[int, int]:
    """Addresses of the first byte of row 0 and of where row ``len(array)`` would start."""
    first = array.__array_interface__["data"][0]
    return first, first + len(array) * array.strides[0]


class BlockPages:
    """Read-ahead and release for the row blocks of one array; does nothing for an array in RAM."""

    def __init__(self, array: np.ndarray, spans: Sequence[tuple[int, int]]) -> None:
        first_row = row_extent(array)[0]
        self._front = ReleaseFront(spans, first_row, array.strides[0])
        region = file_region(array)
        self._pages = None if region is None else Pages(region, first_row)

    def read_ahead(self, start_row: int, stop_row: int) -> None:
        """Rows about to be read: have the kernel read them in the background."""
        if self._pages is not None:
            self._pages.read_ahead(self._front.row_address(start_row), self._front.row_address(stop_row))

    def note(self, stop_row: int) -> None:
        """Rows about to be written: note what is cached first, so that what the writes bring in is let go."""
        if self._pages is not None:
            self._pages.note(self._front.row_address(stop_row))

    def finished(self, index: int) -> None:
        if self._pages is not None:
            self._pages.release(self._front.finish(index))

    def close(self) -> None:
        """Release everything not released yet (the end of the array, or all of it after an early exit)."""
        if self._pages is not None:
            self._pages.release(self._front.rest(), last=True)
            self._pages.close()
            self._pages = None


# -- sources -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NpyHeader:
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int


_HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


def read_npy_header(path: str) -> NpyHeader:
    """The header of a ``.npy`` file, checked against the file's size. Never unpickles anything."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        try:
            version = npy_format.read_magic(f)
        except ValueError:
            raise CorruptFileError(path, "not a .npy file (it does not start with the \\x93NUMPY magic)") from None
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ChunkError(f"{path}: .npy format version {version[0]}.{version[1]} cannot be streamed; "
                             "open it with np.load(path, mmap_mode='r') and pass the array instead")
        try:
            shape, fortran_order, dtype = reader(f)
        except ValueError as exc:
            raise CorruptFileError(path, f"unreadable .npy header ({exc})") from None
        header = NpyHeader(path, shape, dtype, fortran_order, f.tell())
        _check_npy_size(header, os.fstat(f.fileno()).st_size)
    return header


def _check_npy_size(header: NpyHeader, file_size: int) -> None:
    if header.dtype.hasobject:
        raise ChunkError(f"{header.path}: holds Python objects (dtype {header.dtype}), which .npy stores pickled; "
                         "apsi never unpickles a file it did not write. If you trust the file, load it with "
                         "np.load(path, allow_pickle=True) and pass the array")
    needed = header.data_offset + int(np.prod(header.shape, dtype=np.int64)) * header.dtype.itemsize
    if file_size < needed:
        raise CorruptFileError(header.path, f"truncated: the header promises {header.shape} {header.dtype} "
                                            f"({needed} bytes with the header) but the file has {file_size} bytes")


def open_npy(header: NpyHeader) -> np.ndarray:
    """The file's array, memory-mapped read-only (no copy; an empty array needs no mapping)."""
    order: Literal["C", "F"] = "F" if header.fortran_order else "C"
    if int(np.prod(header.shape, dtype=np.int64)) * header.dtype.itemsize == 0:
        return np.empty(header.shape, dtype=header.dtype, order=order)
    return np.memmap(header.path, dtype=header.dtype, mode="r", offset=header.data_offset,
                     shape=header.shape, order=order)


@dataclass(frozen=True)
class Source:
    """What ``chunks``/``map`` stream: an array given directly, or a ``.npy`` file opened when streaming starts."""

    given: np.ndarray | None
    npy: NpyHeader | None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.given.shape if self.given is not None else self.npy.shape  # type: ignore[union-attr]

    @property
    def dtype(self) -> np.dtype:
        return self.given.dtype if self.given is not None else self.npy.dtype  # type: ignore[union-attr]

    def open(self) -> np.ndarray:
        return self.given if self.given is not None else open_npy(self.npy)  # type: ignore[arg-type]

    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def resolve_source(source: object) -> Source:
    """Check a source up front, so bad input fails at the call and not at the first block."""
    if isinstance(source, (str, os.PathLike)):
        header = read_npy_header(os.fspath(source))
        _check_has_rows(header.shape, header.path)
        _check_rows_in_order(header.shape, _file_strides(header), header.dtype.itemsize, header.path)
        return Source(None, header)
    if isinstance(source, np.ndarray):
        _check_has_rows(source.shape, "the array")
        if file_region(source) is not None:  # in RAM any layout is fine: blocks are views either way
            _check_rows_in_order(source.shape, source.strides, source.itemsize, "the memory-mapped array")
        return Source(source, None)
    raise ChunkError(f"cannot split a {type(source).__name__} into row blocks; pass a .npy path, an np.memmap, "
                     "a memory.array or another NumPy array")


def _check_has_rows(shape: tuple[int, ...], what: str) -> None:
    if len(shape) == 0:
        raise ChunkError(f"{what} is 0-d (a single value), so it has no rows to split into blocks")


def _check_rows_in_order(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, what: str) -> None:
    if not rows_follow_each_other(shape, strides, itemsize):
        raise ChunkError(f"{what} does not store its rows one after another (Fortran order, or a transposed or "
                         "reversed view), so a block of rows is scattered over the whole file and cannot be "
                         "streamed; save it in C order (np.save(path, np.ascontiguousarray(a))) or load it into RAM")


def rows_follow_each_other(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Each row lies wholly before the next, as in a C-order file or a column slice of one."""
    if shape[0] <= 1 or int(np.prod(shape[1:])) == 0:
        return True
    if any(stride < 0 for stride in strides):
        return False
    row_span = sum((n - 1) * stride for n, stride in zip(shape[1:], strides[1:])) + itemsize
    return strides[0] >= row_span


def _file_strides(header: NpyHeader) -> tuple[int, ...]:
    """The strides the file's array has: C order unless the header says Fortran order."""
    dims = header.shape[::-1] if not header.fortran_order else header.shape
    strides, step = [], header.dtype.itemsize
    for n in dims:
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides[::-1]) if not header.fortran_order else tuple(strides)


# -- progress ------------------------------------------------------------------------------------------------------

class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(show: bool, total_rows: int, what: str) -> Progress:
    """A tqdm bar counting rows (throughput and time left included) when asked for; tqdm is imported only then."""
    if not show:
        return _NoProgress()
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:
        raise ImportError("progress=True needs tqdm: pip install 'apsi-memory[progress]', or pip install "
                          "'.[progress]' in a checkout of apsi_memory") from None
    bar: Progress = tqdm(total=total_rows, unit=" rows", unit_scale=True, desc=what)
    return bar
