"""What sending a spilled array to another process costs (``apsi_memory/arrays/sending.py``), as ratios in the same
run:

    .venv/bin/python -m pytest benchmarks/bench_pickle_spilled.py --benchmark-only -s

A 256 MiB spilled ``memory.array`` (pickled by path) against a ``numpy.memmap`` of a file of the same size in the
same folder (NumPy pickles it by value: what a spilled array cost before), both filled and in the page cache:

* ``ForkingPickler.dumps`` (what ``multiprocessing`` sends), and the size of the pickle (printed, and in each
  benchmark's ``extra_info``);
* ``ForkingPickler.dumps`` then ``pickle.loads``;
* a round trip through a ``multiprocessing`` spawn ``Pool`` (started once, outside the timing): the worker gets the
  array as an argument and returns its last element.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.system import paths
from benchmarks import private_home
from benchmarks.bench_pool import Ratios

SIZE = 256 << 20
ROUNDS = 5
BY_VALUE, BY_PATH = "numpy.memmap (by value)", "memory.array (by path)"

by_group = {group: Ratios(BY_VALUE) for group in ("dumps", "dumps + loads", "spawn Pool round trip")}
sizes: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def print_ratios(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with private_home(tmp_path_factory):
        yield
    for kind, size in sizes.items():
        print(f"\npickle of {SIZE >> 20} MiB, {kind}: {size} bytes")
    for group, ratios in by_group.items():
        print(f"\n{group} ({SIZE >> 20} MiB):")
        ratios.report()


@pytest.fixture(scope="module")
def arrays(print_ratios: None) -> Iterator[dict[str, np.ndarray]]:
    memory.budget(0)
    spilled = memory.array(SIZE, "uint8")
    plain = np.memmap(os.path.join(paths.private_dir(paths.spill_dir()), "plain.bin"), np.uint8, "w+",
                      shape=(SIZE,))
    for x in (spilled, plain):
        x[:] = 7  # in the page cache, as an array just computed would be
    assert memory.on_disk(spilled)
    yield {BY_PATH: spilled, BY_VALUE: plain}
    memory.free(spilled)
    del plain


@pytest.fixture(scope="module")
def pool(arrays: dict[str, np.ndarray]) -> Iterator[Any]:
    with multiprocessing.get_context("spawn").Pool(1) as started:
        started.apply(int, (0,))  # the worker is up and has imported what it needs
        yield started


def last(y: np.ndarray) -> int:
    """In the worker."""
    return int(y[-1])


def _rounds(group: str, kind: str, x: np.ndarray, pool: Any) -> Callable[[], object]:
    if group == "dumps":
        return lambda: ForkingPickler.dumps(x)
    if group == "dumps + loads":
        return lambda: pickle.loads(ForkingPickler.dumps(x))
    return lambda: pool.apply(last, (x,))


@pytest.mark.parametrize("kind", [BY_VALUE, BY_PATH])
@pytest.mark.parametrize("group", list(by_group))
def test_send(benchmark: Any, arrays: dict[str, np.ndarray], pool: Any, group: str, kind: str) -> None:
    benchmark.group = group
    x = arrays[kind]
    sizes[kind] = len(ForkingPickler.dumps(x))
    benchmark.extra_info["pickle_bytes"] = sizes[kind]
    by_group[group].measure(benchmark, kind, _rounds(group, kind, x, pool), ROUNDS, warmup_rounds=1)
