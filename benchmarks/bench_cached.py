"""@memory.cached against joblib.Memory, in one run: the cost of a hit (small arguments; a 1 MiB and a 100 MiB
array argument; a 100 MiB array result, returned and then read whole) and hashing a 1 GiB array (memory.hashing.array_digest against joblib.hash, which is what joblib.Memory does to
an array argument on every call).

    .venv/bin/python -m pytest benchmarks/bench_cached.py --benchmark-only -s

A table of medians and each figure's speed against joblib's prints at the end (``x`` > 1: faster).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import joblib
import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.store.hashing import array_digest
from benchmarks import private_home

CALLS = 1000
results: dict[tuple[str, str], float] = {}


@pytest.fixture(scope="module", autouse=True)
def environment(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with private_home(tmp_path_factory) as home:
        yield home
    print_table()


def add(x: Any, y: int = 1) -> Any:
    return x + y


def wrap(peer: str, func: Callable[..., Any], home: Any) -> Callable[..., Any]:
    if peer == "memory.cached":
        return memory.cached(store=f"bench-{func.__name__}")(func)
    return joblib.Memory(str(home / f"joblib-{func.__name__}"), verbose=0).cache(func)


def _record(benchmark: Any, case: str, peer: str, per: int) -> None:
    if benchmark.stats is not None:
        results[(case, peer)] = benchmark.stats.stats.median / per


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hit_small_arguments(benchmark: Any, peer: str, environment: Any) -> None:
    f = wrap(peer, add, environment)
    for i in range(CALLS):
        f(i)

    def calls() -> None:
        for i in range(CALLS):
            f(i)

    benchmark.pedantic(calls, rounds=5, iterations=1)
    _record(benchmark, "hit, small arguments", peer, CALLS)


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hit_1mib_array_argument(benchmark: Any, peer: str, environment: Any) -> None:
    def scale(a: np.ndarray) -> np.ndarray:
        return a * 2

    arrays = [np.full(262_144, i, dtype=np.float32) for i in range(20)]
    f = wrap(peer, scale, environment)
    for a in arrays:
        f(a)

    def calls() -> None:
        for a in arrays:
            f(a)

    benchmark.pedantic(calls, rounds=5, iterations=1)
    _record(benchmark, "hit, 1 MiB array argument", peer, len(arrays))


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hit_100mib_array_argument(benchmark: Any, peer: str, environment: Any) -> None:
    def total(a: np.ndarray) -> float:
        return float(a.sum())

    big = np.random.default_rng(1).random(100 << 17)  # 100 MiB of float64
    f = wrap(peer, total, environment)
    f(big)
    benchmark.pedantic(f, args=(big,), rounds=7, iterations=1)
    _record(benchmark, "hit, 100 MiB array argument", peer, 1)


def ones(mib: int) -> np.ndarray:
    return np.ones(mib << 17)  # ``mib`` MiB of float64


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hit_100mib_array_result(benchmark: Any, peer: str, environment: Any) -> None:
    """What a hit costs the caller before it touches the result (ours: a writable copy-on-write mapping)."""
    f = wrap(peer, ones, environment)
    f(100)
    benchmark.pedantic(f, args=(100,), rounds=7, iterations=1)
    _record(benchmark, "hit, 100 MiB array result", peer, 1)


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hit_100mib_array_result_read(benchmark: Any, peer: str, environment: Any) -> None:
    """The same hit with the result read whole (``sum``): a fresh mapping pays its page faults here."""
    f = wrap(peer, ones, environment)
    f(100)
    benchmark.pedantic(lambda: float(f(100).sum()), rounds=7, iterations=1)
    _record(benchmark, "hit + read, 100 MiB result", peer, 1)


@pytest.fixture(scope="module")
def gib_array() -> np.ndarray:
    return np.random.default_rng(0).random(1 << 27)  # 1 GiB of float64


@pytest.mark.parametrize("peer", ["joblib.Memory", "memory.cached"])
def test_hash_1gib_array(benchmark: Any, peer: str, gib_array: np.ndarray) -> None:
    digest = joblib.hash if peer == "joblib.Memory" else array_digest
    benchmark.pedantic(digest, args=(gib_array,), rounds=3, iterations=1)
    _record(benchmark, "hash a 1 GiB array", peer, 1)


def print_table() -> None:
    cases = dict.fromkeys(case for case, _ in results)
    lines = [f"\n{'':30}{'joblib.Memory':>16}{'memory.cached':>16}   speed against joblib"]
    for case in cases:
        theirs, ours = results.get((case, "joblib.Memory")), results.get((case, "memory.cached"))
        if theirs is None or ours is None:
            continue
        lines.append(f"{case:30}{theirs * 1e6:13.1f} us{ours * 1e6:13.1f} us   {theirs / ours:6.2f}x")
    print("\n".join(lines))
