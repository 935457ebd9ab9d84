"""Batch store calls (issue 28 item 6) in one run: ``set_many`` of 1,000 small values against 1,000 ``set`` calls
and against lmdb putting the same 1,000 in one write transaction; ``get_many`` of 1,000 keys from the SSD tier
against 1,000 ``get`` calls and one lmdb read transaction.

    .venv/bin/python -m pytest benchmarks/bench_store_batches.py --benchmark-only -s

Every round writes 1,000 new keys (small dicts, as in ``bench_store_peers``) into a store already holding
10,000; lmdb runs with ``sync=False, metasync=False`` (no fsync, as the store) and pickles each value. The table
at the end gives milliseconds per 1,000 and each figure over ``set_many``'s (or ``get_many``'s): ``x`` > 1, the
batch call is faster.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from benchmarks import private_home_then

lmdb = pytest.importorskip("lmdb", reason="the peers are in the bench extra: pip install '.[bench]'")

BATCH = 1_000
FILLED = 10_000
ROUNDS = 25


def small_dict(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"document {i}", "tags": ["a", "b"], "score": i / 7}


class Ours:
    def __init__(self, folder: str) -> None:
        memory.allow_write(folder)
        self.store = memory.store(folder, ram_mb=256, disk_gb=20)
        self.store.set_many({f"k{i}": small_dict(i) for i in range(FILLED)})

    def batch_set(self, pairs: dict[str, Any]) -> None:
        self.store.set_many(pairs)

    def each_set(self, pairs: dict[str, Any]) -> None:
        for key, value in pairs.items():
            self.store.set(key, value)

    def to_ssd(self) -> None:
        self.store.relieve()  # gets from the SSD tier: there the batch call has something to save

    def batch_get(self, keys: list[str]) -> None:
        assert None not in self.store.get_many(keys)

    def each_get(self, keys: list[str]) -> None:
        assert all(self.store.get(key) is not None for key in keys)


class Lmdb:
    def __init__(self, folder: str) -> None:
        self.env = lmdb.open(folder, map_size=8 << 30, sync=False, metasync=False)
        self.batch_set({f"k{i}": small_dict(i) for i in range(FILLED)})

    def to_ssd(self) -> None:
        pass  # no RAM tier

    def batch_set(self, pairs: dict[str, Any]) -> None:
        with self.env.begin(write=True) as txn:
            for key, value in pairs.items():
                txn.put(key.encode(), pickle.dumps(value, protocol=5))

    def batch_get(self, keys: list[str]) -> None:
        with self.env.begin() as txn:
            assert all(pickle.loads(txn.get(key.encode())) is not None for key in keys)


# (operation, contender, its maker, what it runs); the first row of each operation is the baseline of its ratios
ROWS: list[tuple[str, str, str, Callable[[Any], Callable[[Any], None]]]] = [
    ("set 1,000", "memory.store set_many", "ours", lambda o: o.batch_set),
    ("set 1,000", "memory.store, 1,000 set calls", "ours", lambda o: o.each_set),
    ("set 1,000", "lmdb, one write transaction", "lmdb", lambda o: o.batch_set),
    ("get 1,000 (SSD tier)", "memory.store get_many", "ours", lambda o: o.batch_get),
    ("get 1,000 (SSD tier)", "memory.store, 1,000 get calls", "ours", lambda o: o.each_get),
    ("get 1,000 (SSD tier)", "lmdb, one read transaction", "lmdb", lambda o: o.batch_get),
]
results: dict[tuple[str, str], float] = {}


environment = private_home_then(lambda: print_table())


@pytest.fixture(scope="module")
def contenders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    made = {"ours": Ours(str(tmp_path_factory.mktemp("ours"))), "lmdb": Lmdb(str(tmp_path_factory.mktemp("lmdb")))}
    yield made
    made["ours"].store.close()
    made["lmdb"].env.close()


@pytest.mark.parametrize("row", range(len(ROWS)), ids=[f"{r[0]}-{r[1]}" for r in ROWS])
def test_batch(benchmark: Any, row: int, contenders: dict[str, Any]) -> None:
    operation, contender, maker, pick = ROWS[row]
    impl = contenders[maker]
    fresh, rng = count(), np.random.default_rng(row)

    def args() -> tuple[tuple[Any], dict[str, Any]]:
        if operation.startswith("set"):  # new keys every round, for every contender
            start = FILLED + row * 10**6 + next(fresh) * BATCH
            return ({f"k{i}": small_dict(i) for i in range(start, start + BATCH)},), {}
        impl.to_ssd()
        return ([f"k{i}" for i in rng.choice(FILLED, BATCH, replace=False)],), {}

    benchmark.pedantic(pick(impl), setup=args, rounds=ROUNDS, iterations=1)
    if benchmark.stats is not None:
        results[(operation, contender)] = benchmark.stats.stats.median


def print_table() -> None:
    if not results:
        return
    lines = [f"\n{'operation':24}{'contender':34}{'ms per 1,000':>14}   vs the batch call"]
    for operation, contender, _, _ in ROWS:
        seconds = results.get((operation, contender))
        base = next((results.get((operation, c)) for o, c, _, _ in ROWS if o == operation), None)
        if seconds is None:
            continue
        ratio = f"{seconds / base:.2f}x" if base else "—"
        lines.append(f"{operation:24}{contender:34}{seconds * 1e3:14.2f}   {ratio}")
    print("\n".join(lines))
