"""What ``memory.array`` costs over NumPy's own allocation, as ratios against ``numpy.empty`` in the same run.

    .venv/bin/python -m pytest benchmarks/bench_array.py --benchmark-only -s

* small (10×10 float64): the placement decision is skipped below ``SMALL_ARRAY_BYTES`` (no reading of budget or
  level); what remains is the input checks, ``numpy.zeros`` and the bookkeeping that lets ``report()`` list it;
* 512 KiB (still small);
* big in RAM (64 MiB, not touched): one reading of the budget and the level (files under /proc and the cgroup)
  plus an anonymous mapping, against ``numpy.empty`` of the same size.

Each round makes and drops 1,000 arrays (100 for the big ones), so the time per array is the median / 1,000.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from benchmarks.bench_pool import Ratios

SMALL = (10, 10)
MEDIUM = (256, 256)  # 512 KiB of float64
BIG = (8192, 1024)  # 64 MiB of float64
ROUNDS = 50


def making(make: Callable[[tuple[int, ...]], np.ndarray], shape: tuple[int, ...], count: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(count):
            make(shape)
    return run


def numpy_empty(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape)


def numpy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shape)


def apsi_array(shape: tuple[int, ...]) -> np.ndarray:
    return memory.array(shape)


by_size = {name: Ratios("numpy.empty") for name in ("small", "512 KiB", "big")}


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    for size, ratios in by_size.items():
        print(f"\n{size}:")
        ratios.report()


CASES = [(size, shape, count, name, make)
         for size, shape, count in (("small", SMALL, 1000), ("512 KiB", MEDIUM, 1000), ("big", BIG, 100))
         for name, make in (("numpy.empty", numpy_empty), ("numpy.zeros", numpy_zeros),
                            ("memory.array", apsi_array))]


@pytest.mark.parametrize("size,shape,count,name,make", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_make_and_drop(benchmark, size, shape, count, name, make):
    benchmark.group = size
    by_size[size].measure(benchmark, name, making(make, shape, count), ROUNDS, warmup_rounds=2)
