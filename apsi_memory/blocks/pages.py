"""Read-ahead and release of the pages of one file mapping, for the row blocks that ``chunks`` and ``map`` stream.

Theory of operation
-------------------
A file-backed array (a ``.npy`` path, an ``np.memmap``, a ``memory.array`` on the SSD) is found in
``/proc/self/maps`` by its address (``adapters.maps``), which says, from the kernel itself, whether the memory is
a shared mapping of a file, which file, and at which offset. Nothing here relies on how NumPy or
``memory.array`` built the mapping.

For such a region, ``Pages`` does this per block (the decisions are ``rules``'s pure rules, the calls
``system.libc``'s):

* before a block is read: ``mincore`` (or one ``cachestat`` count) records which of its pages were already in the
  page cache (well ahead, as the kernel's own read-ahead runs ahead of us), then a background thread reads the
  pages that were not through a file descriptor into a small scratch buffer, so they are in the page cache when
  the block is used; a warm block costs nothing;
* once a block is finished (and every block before it, so out-of-order finishes in ``map`` are safe):
  ``madvise(MADV_DONTNEED)`` drops it from this process at once (only for *shared* mappings: there the data
  lives in the file and comes back on the next touch; in a private or anonymous mapping it would be lost), then,
  in the background, ``posix_fadvise(POSIX_FADV_DONTNEED)`` drops from the page cache the pages this process
  brought in. Pages that were cached before stay cached, so a warm file stays warm for the next reader. Written
  pages are dropped once they are on the disk (``WriteBehind``), so dirty memory stays bounded too.

In-RAM arrays need none of this: their blocks are plain views.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..adapters import maps
from ..adapters.maps import Region
from ..system import libc
from ..units import MiB
from .rules import FOLIO_BYTES, ReleaseFront, Residency, WriteBehind, page_ceil, page_floor

PAGE = mmap.PAGESIZE
# How far past the requested read-ahead the page-cache state is noted: beyond the kernel's largest read-ahead
# window, so pages that read-ahead brings in are known to be ours (a byte per 4 KiB page: 16 KiB of state).
RESIDENCY_AHEAD_BYTES = 64 * MiB
# Written pages released but perhaps not yet on the disk may add up to this before we wait for the disk.
WRITE_BEHIND_BYTES = 16 * MiB
# Read-ahead reads this much per call, into one reused scratch buffer (what matters is the page cache it fills).
READ_PIECE_BYTES = 1 * MiB
# Reads still in flight when a stream ends have landed well within this; then their pages can be dropped.
SETTLE_SECONDS = 0.25


class Pages:
    """Read-ahead and release for the rows of one file mapping (see the module docstring).

    The decisions (which pages, which of them were cached) and dropping pages from the process are done in the
    caller's thread; what can wait for the disk (reading ahead, dropping and writing out page cache) runs in
    order on a ``Background`` thread, so the caller keeps computing meanwhile."""

    def __init__(self, region: Region, first_row: int) -> None:
        self.region = region
        self._residency = Residency(page_floor(max(first_row, region.start), PAGE) // PAGE, FOLIO_BYTES // PAGE)
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
        end = min(page_ceil(end, PAGE) + RESIDENCY_AHEAD_BYTES, self.region.end)
        start = self._residency.known_to * PAGE
        if end > start:
            self._residency.record(self._page_states(start, end))

    def _page_states(self, start: int, end: int) -> np.ndarray:
        """Which pages of ``[start, end)`` are cached: from one ``cachestat`` count when the range is all cached
        or all not (streaming's usual case: one answer instead of a byte per page), else page by page from
        ``mincore``."""
        n_pages = (end - start) // PAGE
        cached = None if self._fd is None else libc.cachestat(self._fd, *self._file_range(start, end - start))
        if cached in (0, n_pages):
            return np.full(n_pages, cached == n_pages, dtype=bool)
        return _mincore(start, end - start)

    def read_ahead(self, start: int, end: int) -> None:
        """Have the pages of ``[start, end)`` that were not cached read now, in the background (each page once)."""
        self.note(end)
        start, end = self._clip(max(page_floor(start, PAGE), self._read_to), page_ceil(end, PAGE))
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
            libc.madvise(start, end - start, mmap.MADV_DONTNEED)
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
            libc.fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)
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
        (Not ``MADV_WILLNEED``: the kernel serves that one small read-ahead window at a time in the calling
        thread.)"""
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
        libc.fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)  # dirty pages: starts writing them
        if self.region.writable:
            for due in self._write_behind.add(offset, length):
                libc.sync_file_range(self._fd, *due)
                libc.fadvise(self._fd, *due, os.POSIX_FADV_DONTNEED)


def _drop_and_close(fd: int, ranges: list[tuple[int, int]]) -> None:
    for offset, length in ranges:
        libc.fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
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


def _mincore(address: int, length: int) -> np.ndarray:
    """Which pages of ``[address, address + length)`` are resident; all of them if the kernel will not say (so
    nothing is dropped that this process may not have brought in)."""
    states = libc.mincore(address, length)
    return np.ones(-(-length // PAGE), dtype=bool) if states is None else states


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
    if array.size == 0 or _numpy_owned(array) or not libc.page_calls_available():
        return None
    return maps.file_region(*row_extent(array))


def _numpy_owned(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is NumPy's own allocation (heap or anonymous memory, never a file), so that
    ``/proc/self/maps`` (hundreds of lines, read twice a ``map`` call) need not be read for it."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base is None and array.flags.owndata


def row_extent(array: np.ndarray) -> tuple[int, int]:
    """Addresses of the first byte of row 0 and of where row ``len(array)`` would start."""
    first = array.__array_interface__["data"][0]
    return first, first + len(array) * array.strides[0]


class BlockPages:
    """Read-ahead and release for the row blocks of one array; does nothing for an array in RAM (``in_ram``: the
    caller knows it is, so ``/proc/self/maps`` is not read to find out)."""

    def __init__(self, array: np.ndarray, spans: Sequence[tuple[int, int]], in_ram: bool = False) -> None:
        first_row = row_extent(array)[0]
        self._front = ReleaseFront(spans, first_row, array.strides[0], PAGE)
        region = None if in_ram else file_region(array)
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


