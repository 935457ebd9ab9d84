"""``memory.map(engine=client)`` against the local ``map`` as the block count grows: 100, 1,000 and 10,000 blocks
of one 32-byte row each (the input is tiny on purpose: what is measured is the cost per block). Issue 22: each
task carried the list of all the blocks and every future was kept, so 1,000 blocks took 33 s (0.3 s locally)
and 10,000 did not finish in 10 minutes; the cost must now grow with the block count, not its square.

    .venv/bin/python -m pytest benchmarks/bench_dask_map.py --benchmark-only -s

One cluster (``apsi_memory.dask.cluster(2)``, processes) serves every round. Printed after the module: the median
per count and engine, the cluster's time per block, and its ratio to the local map's at the same count. Cost
linear in blocks shows as a time per block that stays flat from 100 to 10,000.

``test_against_dasks_own_graph`` (issue 29 item 3): on the same client, the same 1,000 blocks of 64 x 16 float64
through dask's own graph, ``da.from_array(x, chunks).map_blocks(fn)`` stored into an ``.npy`` file (a target
that opens it by path in each task: an ``open_memmap`` target pickles as its data, and under a process cluster
its writes went to copies), against ``memory.map(fn, x, rows=64, engine=client)``, in interleaved rounds (the
order alternating), each output checked byte for byte against ``fn(x)``. Printed: each round's two times and the
median of the ratio ours / dask's (the target: at most 1.25).

    .venv/bin/python -m pytest benchmarks/bench_dask_map.py --benchmark-only -s -k own_graph
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory

pytest.importorskip("distributed", reason="needs the dask extra")

COUNTS = (100, 1_000, 10_000)
medians: dict[tuple[str, int], float] = {}


def twice_plus_one(block: np.ndarray) -> np.ndarray:
    return block * 2 + 1


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from apsi_memory.dask import cluster

    with cluster(n_workers=2, dashboard_address=":0") as made, made.get_client() as c:
        yield c
    lines = []
    for count in COUNTS:
        local, remote = medians.get(("local", count)), medians.get(("cluster", count))
        if local and remote:
            lines.append(f"{count:>8} blocks: local {local:8.3f} s  cluster {remote:8.3f} s  "
                         f"{remote / count * 1000:6.2f} ms/block  cluster/local {remote / local:6.1f}x")
    print("\n" + "\n".join(lines))


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("engine", ["local", "cluster"])
def test_map_blocks(benchmark: Any, client: Any, engine: str, count: int) -> None:
    x = np.arange(count * 4, dtype=np.float64).reshape(count, 4)
    run_on = client if engine == "cluster" else None
    rounds = 1 if engine == "cluster" and count >= 10_000 else 3
    out = benchmark.pedantic(lambda: memory.map(twice_plus_one, x, rows=1, engine=run_on), rounds=rounds,
                             iterations=1)
    assert np.array_equal(out, x * 2 + 1)
    if benchmark.stats is not None:
        medians[(engine, count)] = benchmark.stats.stats.median


GRAPH_BLOCKS, GRAPH_ROWS, GRAPH_COLS, GRAPH_ROUNDS = 1_000, 64, 16, 3


class NpyRows:
    """A ``da.store`` target writing into an ``.npy`` file that each task opens by path (as ``map``'s tasks do)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        header = np.load(self.path, mmap_mode="r")
        self.shape, self.dtype = header.shape, header.dtype

    def __setitem__(self, index: Any, value: np.ndarray) -> None:
        np.load(self.path, mmap_mode="r+")[index] = value


def dasks_own_graph(x: np.ndarray, path: Path) -> np.ndarray:
    import dask.array as da

    np.lib.format.open_memmap(path, "w+", x.dtype, x.shape).flush()
    da.from_array(x, chunks=(GRAPH_ROWS, GRAPH_COLS)).map_blocks(twice_plus_one).store(NpyRows(path), lock=False)
    return np.load(path)


def test_against_dasks_own_graph(benchmark: Any, client: Any, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((GRAPH_BLOCKS * GRAPH_ROWS, GRAPH_COLS))
    expected = twice_plus_one(x).tobytes()
    ways = {"dask": lambda: dasks_own_graph(x, tmp_path / "dask.npy"),
            "ours": lambda: memory.map(twice_plus_one, x, rows=GRAPH_ROWS, engine=client)}
    times: dict[str, list[float]] = {"dask": [], "ours": []}

    def one_round() -> None:
        order = list(ways) if len(times["dask"]) % 2 == 0 else list(reversed(ways))
        for way in order:
            began = time.perf_counter()
            out = ways[way]()
            times[way].append(time.perf_counter() - began)
            assert out.tobytes() == expected, way
            if way == "ours":
                memory.free(out)

    benchmark.pedantic(one_round, rounds=GRAPH_ROUNDS, iterations=1)
    ratios = [ours / dask for ours, dask in zip(times["ours"], times["dask"])]
    for number, (dask, ours) in enumerate(zip(times["dask"], times["ours"])):
        print(f"\nround {number + 1}: dask's own graph {dask:6.2f} s  memory.map(engine=client) {ours:6.2f} s")
    print(f"{GRAPH_BLOCKS} blocks, {GRAPH_ROUNDS} rounds: ours / dask's median {statistics.median(ratios):.2f}x "
          f"(load {os.getloadavg()[0]:.1f})")
