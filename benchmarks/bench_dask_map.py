"""``memory.map(engine=client)`` against the local ``map`` as the block count grows: 100, 1,000 and 10,000 blocks
of one 32-byte row each (the input is tiny on purpose: what is measured is the cost per block). Issue 22: each
task carried the list of all the blocks and every future was kept, so 1,000 blocks took 33 s (0.3 s locally)
and 10,000 did not finish in 10 minutes; the cost must now grow with the block count, not its square.

    .venv/bin/python -m pytest benchmarks/bench_dask_map.py --benchmark-only -s

One cluster (``apsi_memory.dask.cluster(2)``, processes) serves every round. Printed after the module: the median
per count and engine, the cluster's time per block, and its ratio to the local map's at the same count. Cost
linear in blocks shows as a time per block that stays flat from 100 to 10,000.
"""

from __future__ import annotations

from collections.abc import Iterator
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
