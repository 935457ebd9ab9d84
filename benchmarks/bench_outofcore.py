"""chunks and map against their baselines, measured in the same run (pytest-benchmark prints each row's ratio to
the best of its group in parentheses).

    .venv/bin/python -m pytest benchmarks/bench_outofcore.py --benchmark-only \
        --benchmark-columns=min,median,mean,rounds --benchmark-group-by=group

* ``stream-warm`` / ``stream-cold``: summing a 256 MiB .npy file in 1,000,000-row blocks with plain
  ``np.load(mmap_mode="r")`` and with ``memory.chunks`` (target: chunks >= 0.95x plain warm, faster cold). The
  cold rounds drop this file (only) from the page cache before each round. Peak RSS is measured separately, in
  a process of its own, by ``benchmarks/rss_stream.py``.
* ``map``: a NumPy-heavy elementwise function over 128 MiB in RAM, one thread (a plain loop over the blocks, and
  ``memory.map(workers=1)``) against ``memory.map`` on every core (target on 2 cores: >= 1.7x the loop).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from sim.pagecache import drop_cache

ROWS, COLS, BLOCK = 8_000_000, 8, 1_000_000


@pytest.fixture(scope="module")
def npy_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("outofcore") / "features.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(ROWS, COLS))
    x[:] = (np.arange(ROWS) % 1000)[:, None]
    del x
    yield path
    drop_cache(path)
    os.unlink(path)


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def plain_mmap_sum(path: str) -> float:
    x = np.load(path, mmap_mode="r")
    return sum(float(x[i:i + BLOCK].sum(dtype=np.float64)) for i in range(0, len(x), BLOCK))


def chunks_sum(path: str) -> float:
    return sum(float(b.sum(dtype=np.float64)) for b in memory.chunks(path, rows=BLOCK))


EXPECTED = float((np.arange(ROWS) % 1000).sum()) * COLS
STREAMERS = {"plain mmap": plain_mmap_sum, "memory.chunks": chunks_sum}


@pytest.mark.parametrize("way", sorted(STREAMERS))
def test_stream_warm(benchmark: Any, npy_file: str, way: str) -> None:
    benchmark.group = "stream-warm"
    warm(npy_file)
    assert benchmark.pedantic(STREAMERS[way], args=(npy_file,), setup=lambda: warm(npy_file), rounds=7) == EXPECTED


@pytest.mark.parametrize("way", sorted(STREAMERS))
def test_stream_cold(benchmark: Any, npy_file: str, way: str) -> None:
    benchmark.group = "stream-cold"
    assert benchmark.pedantic(STREAMERS[way], args=(npy_file,), setup=lambda: drop_cache(npy_file),
                              rounds=5) == EXPECTED


def heavy(b: np.ndarray) -> np.ndarray:
    """Several passes of transcendental math per element: NumPy's loops, which release the GIL."""
    return np.sqrt(b) * np.exp(-b) + np.log1p(b) * np.cos(b)


MAP_INPUT = np.random.default_rng(0).random((2_000_000, COLS))  # 128 MiB of float64, in RAM
MAP_BLOCK = 125_000  # 8 MiB blocks: 16 of them


def one_thread_loop(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for start in range(0, len(x), MAP_BLOCK):
        out[start:start + MAP_BLOCK] = heavy(x[start:start + MAP_BLOCK])
    return out


MAPPERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "1 thread, plain loop": one_thread_loop,
    "memory.map workers=1": lambda x: memory.map(heavy, x, rows=MAP_BLOCK, workers=1),
    "memory.map all cores": lambda x: memory.map(heavy, x, rows=MAP_BLOCK),
}


@pytest.mark.parametrize("way", list(MAPPERS))
def test_map(benchmark: Any, way: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    benchmark.group = f"map ({memory.cores()} cores)"
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path))
    result = benchmark.pedantic(MAPPERS[way], args=(MAP_INPUT,), rounds=5)
    np.testing.assert_array_equal(result[:1000], heavy(MAP_INPUT[:1000]))
