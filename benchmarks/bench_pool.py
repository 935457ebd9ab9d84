"""The SPEC's pool figure: twenty 4096×8192 float64 temporaries (256 MiB each), each written once ("touched"),
taken from a pool versus freshly allocated — as ratios against the fresh baseline measured in the same run.

    .venv/bin/python -m pytest benchmarks/bench_pool.py --benchmark-only -s

One round is the twenty temporaries. ``memset on take`` is the rejected way to serve ``zero=True`` (clear the
buffer when it is taken), measured for comparison with what the pool does (clear it in the background after
``give``, see ``apsi_memory/arrays/pools.py``). After the module's benchmarks the ratios are printed (``-s``) and stored
in each benchmark's ``extra_info``. Run it alone on the machine: other work on the second core slows the background clearing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory

SHAPE = (4096, 8192)  # 256 MiB of float64
STEPS = 20
ROUNDS = 5


class Ratios:
    """Medians of named benchmarks of one module, and their ratios against a baseline measured in the same run."""

    def __init__(self, baseline: str) -> None:
        self.baseline = baseline
        self.medians: dict[str, float] = {}
        self.extra: dict[str, dict[str, Any]] = {}

    def measure(self, benchmark: Any, name: str, run: Callable[[], object], rounds: int, **pedantic: Any) -> None:
        benchmark.pedantic(run, rounds=rounds, iterations=1, **pedantic)
        if benchmark.stats is not None:  # None under --benchmark-disable
            self.medians[name] = benchmark.stats.stats.median
            self.extra[name] = benchmark.extra_info

    def report(self) -> list[str]:
        """Print the ratios (once the module's benchmarks ran) and store them in each ``extra_info``."""
        if self.baseline not in self.medians or len(self.medians) < 2:
            return []
        base = self.medians[self.baseline]
        lines = []
        for name, median in self.medians.items():
            ratio = base / median
            self.extra[name]["times_faster_than_" + self.baseline.replace(" ", "_")] = round(ratio, 2)
            lines.append(f"{name:>28}: {median * 1000:8.1f} ms  {ratio:5.2f}x")
        print(f"\n{'median of a round':>28}  {'':8}     speed against {self.baseline}\n" + "\n".join(lines))
        return lines


ratios = Ratios("fresh")


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    ratios.report()


def touch(a: np.ndarray) -> None:
    a[...] = 1.0


def fresh_temporaries() -> None:
    for _ in range(STEPS):
        a = np.zeros(SHAPE)  # calloc: fresh pages, zeroed by the kernel on first touch
        touch(a)
        del a


def pooled(p: memory.Pool, zero: bool) -> Callable[[], None]:
    def run() -> None:
        for _ in range(STEPS):
            a = p.take(SHAPE, zero=zero)
            touch(a)
            p.give(a)
    return run


def memset_on_take(p: memory.Pool) -> Callable[[], None]:
    def run() -> None:
        for _ in range(STEPS):
            a = p.take(SHAPE, zero=False)
            a[...] = 0.0
            touch(a)
            p.give(a)
    return run


def test_fresh(benchmark):
    ratios.measure(benchmark, "fresh", fresh_temporaries, ROUNDS, warmup_rounds=1)


def test_pool_zero_true(benchmark):
    ratios.measure(benchmark, "pool take(zero=True)", pooled(memory.pool(1), zero=True), ROUNDS, warmup_rounds=1)


def test_pool_zero_false(benchmark):
    ratios.measure(benchmark, "pool take(zero=False)", pooled(memory.pool(1), zero=False), ROUNDS,
                   warmup_rounds=1)


def test_pool_memset_on_take(benchmark):
    ratios.measure(benchmark, "memset on take (rejected)", memset_on_take(memory.pool(1)), ROUNDS,
                   warmup_rounds=1)

