"""The cost of issue 30's chunk check (``apsi_memory.dask.chunks``) on each graph a ``cluster()``'s client sends:
the check alone on the graph of ``client.submit`` and of a three-array ``(x + 1).sum()``, against the time of a
``client.submit`` itself (its submission, not its result), in interleaved rounds on one thread-worker cluster.

    .venv/bin/python -m pytest benchmarks/bench_dask_chunk_check.py --benchmark-only -s

Printed: each part's median per call over 7 rounds, and the submit graph's check as a fraction of a submit.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("distributed", reason="needs the dask extra")
ROUNDS = 7


def per_call(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def sent_graphs(client: Any, work: Callable[[], object]) -> list[Any]:
    """The graphs ``work`` sends through the client's submission point, as the check receives them."""
    graphs: list[Any] = []
    send = client._graph_to_futures

    def grab(*args: Any, **kwargs: Any) -> Any:
        graphs.append(args[0] if args else kwargs.get("expr", kwargs.get("dsk")))
        return send(*args, **kwargs)

    client._graph_to_futures = grab
    try:
        work()
    finally:
        del client._graph_to_futures
    return graphs


def test_chunk_check_cost(benchmark: Any) -> None:
    import dask.array as da

    from apsi_memory import dask as amd

    with amd.cluster(n_workers=1, processes=False, dashboard_address=":0") as made, made.get_client() as client:
        x = da.zeros((4096, 4096), chunks=(1024, 4096))
        [array_graph] = sent_graphs(client, lambda: (x + 1).sum().compute())
        [submit_graph] = sent_graphs(client, lambda: client.submit(sum, [1, 2], pure=False).result())
        rounds: dict[str, list[float]] = {"check, (x + 1).sum() graph": [], "check, submit graph": [],
                                          "client.submit": []}
        for _ in range(ROUNDS):
            rounds["check, (x + 1).sum() graph"].append(per_call(lambda: amd._check_chunks(client, array_graph), 2000))
            rounds["check, submit graph"].append(per_call(lambda: amd._check_chunks(client, submit_graph), 2000))
            rounds["client.submit"].append(per_call(lambda: client.submit(sum, [1, 2], pure=False), 200))
        benchmark.pedantic(amd._check_chunks, args=(client, submit_graph), rounds=1, iterations=100)
    medians = {part: statistics.median(times) for part, times in rounds.items()}
    print(f"\nload {os.getloadavg()[0]:.1f}")
    for part, median in medians.items():
        print(f"{part}: median {median * 1e6:.1f} us")
    print(f"submit graph's check / client.submit: {medians['check, submit graph'] / medians['client.submit']:.3f}")
