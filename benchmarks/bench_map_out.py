"""What ``map(out=path)`` writes (``apsi_memory/outofcore/mapping.py``): bytes and time against ``map`` then
``numpy.save`` (what a night job did before: its 6 GB result written twice, 18 GB in all with the spill), in the
same run:

    .venv/bin/python -m pytest benchmarks/bench_map_out.py --benchmark-only -s

A 512 MiB ``.npy`` input (in the page cache: the rounds measure the output) goes through ``b * 2 + 1`` on two
threads; the result ends as a ``.npy`` file, ``fsync``-ed by both. Bytes written are the process's
``write_bytes`` (``/proc/self/io``: ``map``'s threads too) over the round and the ``os.sync`` after it, printed and
in each benchmark's ``extra_info``. With the budget at 0, as on a full machine, ``map``'s own output is a spill
file: that is the second copy ``out=`` saves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from benchmarks import private_home
from benchmarks.bench_pool import Ratios

SIZE = 512 << 20
ROUNDS = 3
SAVE, OUT = "map + np.save + fsync", "map(out=)"

ratios = Ratios(SAVE)
written: dict[str, list[int]] = {SAVE: [], OUT: []}


def process_wrote() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


@pytest.fixture(scope="module", autouse=True)
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not os.path.exists("/proc/self/io"):
        pytest.skip("needs /proc/self/io (Linux)")
    with private_home(tmp_path_factory) as home:
        memory.budget(0)  # map's own output is a spill file, as on a machine whose RAM is taken
        np.save(home / "x.npy", np.ones(SIZE // 4, np.float32))
        yield home
    for kind, volumes in written.items():
        if volumes:
            print(f"\n{kind} of a {SIZE >> 20} MiB result wrote {max(volumes)} bytes at most "
                  f"({max(volumes) / SIZE:.2f} of its size) over {len(volumes)} rounds")
    ratios.report()


def _twice_plus_one(block: np.ndarray) -> np.ndarray:
    return block * 2.0 + 1.0


def _saved(source: Path, path: Path) -> None:
    y = memory.map(_twice_plus_one, source, workers=2)
    np.save(path, y)
    memory.free(y)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kept(source: Path, path: Path) -> None:
    memory.free(memory.map(_twice_plus_one, source, workers=2, out=path))


@pytest.mark.parametrize("kind", [SAVE, OUT])
def test_map_into_a_npy(benchmark: Any, folder: Path, kind: str) -> None:
    path = folder / "result.npy"
    write = _saved if kind == SAVE else _kept

    def setup() -> tuple[tuple[()], dict[str, Any]]:
        path.unlink(missing_ok=True)
        os.sync()
        return (), {}

    def run() -> None:
        before = process_wrote()
        write(folder / "x.npy", path)
        os.sync()  # what the round leaves to the kernel's writeback counts too
        written[kind].append(process_wrote() - before)

    benchmark.group = f"map a {SIZE >> 20} MiB .npy into a .npy"
    ratios.measure(benchmark, kind, run, ROUNDS, setup=setup)
    benchmark.extra_info["write_bytes_max"] = max(written[kind])
    assert np.load(path, mmap_mode="r")[-1] == 3.0
