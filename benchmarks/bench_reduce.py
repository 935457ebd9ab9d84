"""``reduce`` on 2 threads against a one-thread ``memory.chunks`` loop and hand-written parallel baselines, over a
1 GiB ``.npy`` file read warm from the page cache, in one run (issue 28 item 3, target: >= 1.6x the loop).

    .venv/bin/python -m pytest benchmarks/bench_reduce.py --benchmark-only \
        --benchmark-columns=min,median,rounds --benchmark-group-by=group

* ``column-sums``: ``b.sum(axis=0)`` over 4,194,304 x 64 float32. Baselines: the ``chunks`` loop, a
  ``ThreadPoolExecutor`` over the same blocks, and numexpr's ``sum(b, axis=0)`` on 2 threads.
* ``gram``: ``b.T @ b`` (64 x 64) over the same file. OpenBLAS is held to one thread for the whole module, so the
  loop is truly one thread and the threads compared are ``reduce``'s (otherwise BLAS would parallelise the loop
  too, and the figure would compare two ways of using the same cores).

Each test prints its median; the ratio is ``chunks loop`` median over the others' (printed at the end).
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory

ROWS, COLS, BLOCK, WORKERS = 4_194_304, 64, 131_072, 2
MEDIANS: dict[tuple[str, str], float] = {}


def _openblas() -> Any:
    found = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so"))
    return ctypes.CDLL(found[0]) if found else None


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread() -> Iterator[None]:
    lib = _openblas()
    if lib is None:
        pytest.skip("needs NumPy's bundled OpenBLAS, to hold BLAS to one thread")
    before = lib.scipy_openblas_get_num_threads64_()
    lib.scipy_openblas_set_num_threads64_(1)
    yield
    lib.scipy_openblas_set_num_threads64_(before)


@pytest.fixture(scope="module")
def npy_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("reduce") / "features.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(ROWS, COLS))
    for start in range(0, ROWS, BLOCK):
        x[start:start + BLOCK] = np.random.default_rng(start).random((BLOCK, COLS), dtype=np.float32)
    del x
    yield path
    os.unlink(path)


def column_sums(b: np.ndarray) -> np.ndarray:
    return b.sum(axis=0, dtype=np.float64)


def gram(b: np.ndarray) -> np.ndarray:
    return b.T @ b


def chunks_loop(fn: Callable[[np.ndarray], np.ndarray], path: str) -> np.ndarray:
    total: np.ndarray | None = None
    for b in memory.chunks(path, rows=BLOCK):
        total = fn(b) if total is None else total + fn(b)
    assert total is not None
    return total


def thread_pool(fn: Callable[[np.ndarray], np.ndarray], path: str) -> np.ndarray:
    x = np.load(path, mmap_mode="r")
    with ThreadPoolExecutor(WORKERS) as pool:
        parts = pool.map(lambda start: fn(x[start:start + BLOCK]), range(0, ROWS, BLOCK))
        total = next(parts)
        for part in parts:
            total = total + part
    return total


def numexpr_sums(path: str) -> np.ndarray:
    import numexpr as ne

    ne.set_num_threads(WORKERS)
    total = np.zeros(COLS)
    for b in memory.chunks(path, rows=BLOCK):
        total += ne.evaluate("sum(b, axis=0)", local_dict={"b": b.astype(np.float64)})
    return total


WAYS: dict[str, dict[str, Callable[[str], np.ndarray]]] = {
    "column-sums": {
        "chunks loop": lambda p: chunks_loop(column_sums, p),
        "reduce 2 threads": lambda p: memory.reduce(column_sums, p, rows=BLOCK, workers=WORKERS),
        "ThreadPoolExecutor": lambda p: thread_pool(column_sums, p),
        "numexpr": numexpr_sums,
    },
    "gram": {
        "chunks loop": lambda p: chunks_loop(gram, p),
        "reduce 2 threads": lambda p: memory.reduce(gram, p, rows=BLOCK, workers=WORKERS),
        "ThreadPoolExecutor": lambda p: thread_pool(gram, p),
    },
}
CASES = [(group, way) for group, ways in WAYS.items() for way in ways]


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


@pytest.mark.parametrize(("group", "way"), CASES, ids=[f"{g}-{w}" for g, w in CASES])
def test_reduction(benchmark: Any, npy_file: str, group: str, way: str) -> None:
    benchmark.group = group
    result = benchmark.pedantic(WAYS[group][way], args=(npy_file,), setup=lambda: warm(npy_file), rounds=5)
    reference = WAYS[group]["chunks loop"](npy_file)
    np.testing.assert_allclose(result, reference, rtol=1e-4)
    MEDIANS[(group, way)] = statistics.median(benchmark.stats.stats.data)
    if (group, way) == CASES[-1]:
        for (g, w), median in MEDIANS.items():
            print(f"\n{g}: {w} {median:.3f} s, {MEDIANS[(g, 'chunks loop')] / median:.2f}x the chunks loop")
