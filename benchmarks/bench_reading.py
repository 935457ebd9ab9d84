"""What one reading of the machine's memory costs (issue 14, item 5), as ratios against baselines measured in the
same run: reading ``/proc/meminfo`` with a plain ``open().read()`` (one file, no parsing) and
``psutil.virtual_memory()`` (that file, parsed: what a program that ignores cgroups pays).

    .venv/bin/python -m pytest benchmarks/bench_reading.py --benchmark-only -s

* ``Machine.memory()``: what ``memory.array``, ``pool.take`` and ``store.set`` pay when a reading is due —
  ``/proc/meminfo``, ``/proc/self/cgroup``, every level of the memory group and PSI, through descriptors the
  machine keeps open (``/proc/self/mountinfo`` only when the kernel says the mounts changed);
* ``read_memory()``: the same reading from nothing: it opens and closes every file.

Each round takes 1,000 readings, so the median of a round in ms is the time of one reading in µs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
import pytest

from apsi_memory import Machine
from apsi_memory.machinery.reading import read_memory
from benchmarks.bench_pool import Ratios

READINGS = 1000
ROUNDS = 30

ratios = Ratios("psutil.virtual_memory()")


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    print(f"\none reading (µs; the column says ms per round of {READINGS:,}):")
    ratios.report()


def repeated(read: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(READINGS):
            read()
    return run


def plain_meminfo() -> str:
    with open("/proc/meminfo") as f:
        return f.read()


CASES: list[tuple[str, Callable[[], object]]] = [
    ("psutil.virtual_memory()", psutil.virtual_memory),
    ("open('/proc/meminfo').read()", plain_meminfo),
    ("Machine.memory()", Machine().memory),
    ("read_memory()", read_memory),
]


@pytest.mark.parametrize("name,read", CASES, ids=[name for name, _ in CASES])
def test_one_reading(benchmark: Any, name: str, read: Callable[[], object]) -> None:
    benchmark.group = "one reading"
    ratios.measure(benchmark, name, repeated(read), ROUNDS, warmup_rounds=2)
