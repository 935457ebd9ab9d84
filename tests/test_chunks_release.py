"""What the kernel sees while chunks/map stream a file: the process's RSS stays flat, the page cache is left as it
was found, the next block is read before it is needed, and an early exit lets go of everything.

Measured with instruments independent of the library: psutil for RSS and mincore(2) on a fresh mapping for the
page cache. Each test also measures plain ``np.load(mmap_mode="r")`` where that shows the measurement can fail."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

import apsi_memory as memory
from sim.pagecache import drop_cache

# real: these measure the real kernel's page cache, and poll it (``eventually``, ``make_cold``) because the kernel
# completes reads and writeback on its own schedule; no thread of ours is awaited by sleeping.
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(sys.platform != "linux", reason="page-cache and madvise behaviour is Linux's")]

MiB = 1 << 20
ROWS, COLS = 2 * MiB, 8  # float32: a 64 MiB file
BLOCK = 128 * 1024  # 4 MiB blocks
HEADER_PAGES_SLACK = 64 * 1024  # reading the .npy header brings its first pages in; they are not worth a syscall

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_bytes(path: str, start: int = 0, end: int | None = None) -> int:
    """Bytes of ``path[start:end]`` in the page cache (mincore on a mapping of our own, which touches nothing)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = np.frombuffer(mm, np.uint8)
        address, length = view.ctypes.data, len(mm)
        page = mmap.PAGESIZE
        vec = np.zeros((length + page - 1) // page, np.uint8)
        assert _libc.mincore(address, length, vec.ctypes.data) == 0, os.strerror(ctypes.get_errno())
        del view
    end = length if end is None else end
    return int((vec[start // page:(end + page - 1) // page] & 1).sum()) * page


def make_cold(path: str) -> None:
    """Drop the file from the page cache (retrying while reads in flight finish: their pages cannot be dropped)."""
    for _ in range(25):
        drop_cache(path)
        if cached_bytes(path) == 0:
            return
        time.sleep(0.02)
    # Only the file system can cause this (tmpfs keeps files in memory): no page cache to measure here.
    pytest.skip(f"{os.path.dirname(path)} keeps files in memory (tmpfs?): the page cache cannot be measured")


def eventually(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """mincore counts a page only once its read has completed: give reads in flight time to land."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def make_warm(path: str) -> None:
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
    assert cached_bytes(path) == in_pages(os.path.getsize(path))


def in_pages(n_bytes: int) -> int:
    return -(-n_bytes // mmap.PAGESIZE) * mmap.PAGESIZE


@pytest.fixture
def big_file(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "big.npy")
    np.save(path, np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS))
    yield path
    drop_cache(path)  # leave no page cache behind for the other engineers


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def peak_rss_growth(blocks: Iterator[np.ndarray]) -> tuple[int, float]:
    before, peak, total = rss(), 0, 0.0
    for block in blocks:
        total += float(block.sum(dtype=np.float64))
        peak = max(peak, rss() - before)
    return peak, total


def plain_mmap_blocks(path: str) -> Iterator[np.ndarray]:
    x = np.load(path, mmap_mode="r")
    for start in range(0, len(x), BLOCK):
        yield x[start:start + BLOCK]


EXPECTED_SUM = float(np.arange(ROWS * COLS, dtype=np.float64).sum())


def test_streaming_keeps_rss_flat_where_plain_mmap_holds_the_whole_file(big_file: str) -> None:
    make_cold(big_file)
    plain_peak, plain_total = peak_rss_growth(plain_mmap_blocks(big_file))
    make_cold(big_file)
    peak, total = peak_rss_growth(memory.chunks(big_file, rows=BLOCK))
    assert total == plain_total == EXPECTED_SUM
    assert plain_peak >= 48 * MiB  # the measurement works: touched pages stay with plain mmap
    assert peak <= 16 * MiB  # a few 4 MiB blocks at most


def test_a_cold_file_is_left_cold_where_plain_mmap_fills_the_page_cache(big_file: str) -> None:
    make_cold(big_file)
    peak_rss_growth(plain_mmap_blocks(big_file))
    assert cached_bytes(big_file) >= 60 * MiB
    make_cold(big_file)
    peak_rss_growth(memory.chunks(big_file, rows=BLOCK))
    assert cached_bytes(big_file) <= HEADER_PAGES_SLACK


def test_a_warm_file_stays_warm_for_the_next_reader(big_file: str) -> None:
    make_warm(big_file)
    peak_rss_growth(memory.chunks(big_file, rows=BLOCK))
    assert cached_bytes(big_file) == in_pages(os.path.getsize(big_file))


def test_the_next_block_is_read_before_it_is_needed(big_file: str) -> None:
    rows = 1 * MiB  # 32 MiB blocks: far more than the kernel reads ahead by itself
    make_cold(big_file)
    blocks = memory.chunks(big_file, rows=rows)
    next(blocks)  # hands out block 0 without touching it: only our read-ahead can bring block 1 in
    header = os.path.getsize(big_file) - ROWS * COLS * 4
    block_bytes = rows * COLS * 4
    assert eventually(lambda: cached_bytes(big_file, header + block_bytes, header + 2 * block_bytes) >= block_bytes)
    blocks.close()  # type: ignore[attr-defined]
    assert eventually(lambda: cached_bytes(big_file) <= HEADER_PAGES_SLACK)


def test_breaking_out_of_the_loop_releases_everything(big_file: str) -> None:
    make_cold(big_file)
    before = rss()
    for index, block in enumerate(memory.chunks(big_file, rows=BLOCK)):
        block.sum()
        if index == 3:
            break
    del block
    assert rss() - before <= 4 * MiB
    # Reads still in flight at the exit (ours and the kernel's own read-ahead) are dropped once they land.
    assert eventually(lambda: cached_bytes(big_file) <= HEADER_PAGES_SLACK)


def test_map_releases_input_and_output_as_it_goes(big_file: str, on_ssd: Path) -> None:
    make_cold(big_file)
    before = rss()
    y = memory.map(lambda b: b + 1.0, big_file, rows=BLOCK, workers=2)
    assert memory.on_disk(y)
    assert rss() - before <= 24 * MiB  # neither the 64 MiB input nor the 64 MiB output stays in the process
    assert cached_bytes(big_file) <= HEADER_PAGES_SLACK
    assert isinstance(y, np.memmap)
    # The last written pages leave the page cache once the disk has them, a moment after map returns.
    assert eventually(lambda: cached_bytes(str(y.filename)) <= HEADER_PAGES_SLACK)
    total = sum(float(b.sum(dtype=np.float64)) for b in memory.chunks(y, rows=BLOCK))
    assert total == EXPECTED_SUM + ROWS * COLS
    memory.free(y)
