"""What keeping a spilled result costs (``apsi_memory/arrays/keeping.py``): bytes written and time, against
``numpy.save`` of the same array in the same run:

    .venv/bin/python -m pytest benchmarks/bench_keep.py --benchmark-only -s

A 1 GiB spilled ``memory.array``, filled and written back to the disk (``os.sync``) before each round, is kept as
a ``.npy`` in a folder on the spill folder's filesystem, by ``memory.keep`` (the spill file becomes the ``.npy``)
and by ``numpy.save`` (what a program did before: a second copy). Bytes written are this thread's ``write_bytes``
(``/proc/thread-self/io``) over the call, printed and in each benchmark's ``extra_info``; ``numpy.save`` writes
the whole GiB again, ``keep`` about nothing. The file is ``fsync``-ed by both (``keep`` does so itself), so the
times compare like for like.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from benchmarks import private_home
from benchmarks.bench_pool import Ratios

SIZE = 1 << 30
ROUNDS = 3
SAVE, KEEP = "np.save + fsync", "memory.keep"

ratios = Ratios(SAVE)
written: dict[str, list[int]] = {SAVE: [], KEEP: []}


def this_thread_wrote() -> int:
    with open("/proc/thread-self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


@pytest.fixture(scope="module", autouse=True)
def print_ratios(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not os.path.exists("/proc/thread-self/io"):
        pytest.skip("needs /proc/thread-self/io (Linux)")
    with private_home(tmp_path_factory) as home:
        memory.budget(0)  # every array a spill file
        out = home / "out"  # the spill folder's filesystem: ~/.apsi/spill is under the same home
        out.mkdir()
        yield out
    for kind, volumes in written.items():
        if volumes:
            print(f"\n{kind} of a {SIZE >> 30} GiB spilled array wrote {max(volumes)} bytes at most "
                  f"({max(volumes) / SIZE:.4f} of its size) over {len(volumes)} rounds")
    ratios.report()


def _saved(x: np.ndarray, path: Path) -> None:
    np.save(path, x)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kept(x: np.ndarray, path: Path) -> None:
    memory.keep(x, path)


@pytest.mark.parametrize("kind", [SAVE, KEEP])
def test_keep_a_spilled_gib(benchmark: Any, print_ratios: Path, kind: str) -> None:
    out = print_ratios
    write: Callable[[np.ndarray, Path], None] = _saved if kind == SAVE else _kept
    path = out / "result.npy"
    held: list[np.ndarray] = []

    def setup() -> tuple[tuple[np.ndarray], dict[str, Any]]:
        for x in held:
            memory.free(x)
        held.clear()
        path.unlink(missing_ok=True)
        x = memory.array(SIZE // 4, "float32")
        assert memory.on_disk(x)
        x[:] = 1.0  # the result, computed into the array
        os.sync()  # on the disk: what the round measures is only the keeping
        held.append(x)
        return (x,), {}

    def run(x: np.ndarray) -> None:
        before = this_thread_wrote()
        write(x, path)
        written[kind].append(this_thread_wrote() - before)

    benchmark.group = f"keep a {SIZE >> 30} GiB spilled array"
    ratios.measure(benchmark, kind, run, ROUNDS, setup=setup)
    benchmark.extra_info["write_bytes_max"] = max(written[kind])
    assert np.load(path, mmap_mode="r")[-1] == 1.0
    for x in held:
        memory.free(x)
    path.unlink()
