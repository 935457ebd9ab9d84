"""What moving a RAM array to a spill file costs (``apsi_memory/arrays/moving.py``), as ratios in the same run:

    /work/venv/bin/python -m pytest benchmarks/bench_moving.py --benchmark-only -s

* a move of 256 MiB (filled, in RAM) against ``cp`` of a 256 MiB file to a new file in the same folder followed by
  ``fdatasync`` (a move writes its file back too), both reported per GiB;
* afterwards: reading (``sum``) and writing (``x[:] = 1``) the moved array against a plain ``numpy.memmap`` of a
  file of the same size in the same folder (both are shared file mappings, so the ratio should be about 1).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import moving, placement
from apsi_memory.decide import Level
from apsi_memory.system import paths
from benchmarks.bench_pool import Ratios

SIZE = 256 << 20
ROUNDS = 5
GiB = 1 << 30

by_group = {"move": Ratios("cp + fdatasync"), "read": Ratios("numpy.memmap"), "write": Ratios("numpy.memmap")}


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Iterator[None]:
    yield
    for group, ratios in by_group.items():
        print(f"\n{group} ({SIZE >> 20} MiB; a move's seconds per GiB = median x {GiB // SIZE}):")
        ratios.report()


@pytest.fixture(scope="module")
def folder() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir=paths.private_dir(paths.spill_dir())) as name:
        yield name


def _filled_ram_array() -> tuple[tuple[Any, ...], dict[str, Any]]:
    x = memory.array(SIZE, "uint8")
    x[:] = 7
    assert not memory.on_disk(x), "the benchmark needs the array in RAM"
    return (x,), {}


def _move(x: np.ndarray) -> None:
    entry = placement._find(x)
    assert entry is not None and moving.move(entry, Level.HIGH)


def _copy(folder: str) -> Any:
    source = os.path.join(folder, "source")
    np.full(SIZE, 7, np.uint8).tofile(source)

    def copy() -> None:
        target = os.path.join(folder, "target")
        subprocess.run(["cp", source, target], check=True)
        fd = os.open(target, os.O_RDONLY)
        os.fdatasync(fd)
        os.close(fd)
        os.unlink(target)
    return copy


def test_move(benchmark: Any, folder: str) -> None:
    benchmark.group = "move"
    by_group["move"].measure(benchmark, "memory.array moved", _move, ROUNDS, setup=_filled_ram_array)


def test_cp(benchmark: Any, folder: str) -> None:
    benchmark.group = "move"
    by_group["move"].measure(benchmark, "cp + fdatasync", _copy(folder), ROUNDS)


def _moved() -> np.ndarray:
    (x,), _ = _filled_ram_array()
    _move(x)
    return x


def _memmap(folder: str) -> np.ndarray:
    return np.memmap(os.path.join(folder, "plain"), np.uint8, "w+", shape=(SIZE,))


@pytest.mark.parametrize("kind", ["numpy.memmap", "moved memory.array"])
@pytest.mark.parametrize("group", ["read", "write"])
def test_after_the_move(benchmark: Any, folder: str, kind: str, group: str) -> None:
    benchmark.group = group
    x = _memmap(folder) if kind == "numpy.memmap" else _moved()
    x[:] = 1  # both in the page cache before the rounds: steady state, not first touch
    run = (lambda: int(x.sum(dtype=np.uint64))) if group == "read" else (lambda: x.fill(3))
    by_group[group].measure(benchmark, kind, run, ROUNDS * 2, warmup_rounds=1)
