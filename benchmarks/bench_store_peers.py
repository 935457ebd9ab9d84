"""memory.store against lmdb, diskcache and cachetools in one run — the table of issue 14, with ratios.

    .venv/bin/python -m pytest benchmarks/bench_store_peers.py --benchmark-only -s

Contenders, each at the same durability (no fsync per operation):
* ``memory.store``: this library (RAM tier + journal on the SSD, values signed).
* ``lmdb``: py-lmdb with ``sync=False, metasync=False``, one write transaction per ``set``, values pickled.
* ``diskcache``: ``diskcache.Cache`` (SQLite, values under 32 KiB inline).
* ``cachetools``: an ``LRUCache`` in RAM only (the floor for a RAM hit; it has no SSD tier and no open).

"open" is a fresh process that opens a store of 100,000 small dicts and answers one get; the time is taken
inside that process around open + get (interpreter start-up and imports are not counted for anyone).
Every other figure is microseconds per operation, the median of ``ROUNDS`` batches. The table printed at the end
gives each peer's figure over ours (``x`` > 1: this store is faster).
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from benchmarks import private_home_then
from benchmarks.bench_store import Apsi, DiskCache

lmdb = pytest.importorskip("lmdb", reason="the peers are in the bench extra: pip install '.[bench]'")
diskcache = pytest.importorskip("diskcache", reason="the peers are in the bench extra: pip install '.[bench]'")
cachetools = pytest.importorskip("cachetools", reason="the peers are in the bench extra: pip install '.[bench]'")

ROUNDS = 7
OPEN_ENTRIES = 100_000


def small_dict(i: int) -> Any:
    return {"id": i, "name": f"document {i}", "tags": ["a", "b"], "score": i / 7}


def array_of(n: int) -> Callable[[int], np.ndarray]:
    return lambda i: np.full(n, i, dtype=np.float32)


# (row label, operation, value maker, entries already stored, operations per round)
ROWS: list[tuple[str, str, Callable[[int], Any], int, int]] = [
    ("set, small dict, 100,000 entries", "set", small_dict, 100_000, 500),
    ("get from the SSD tier, small dict, 100,000 entries", "get SSD", small_dict, 100_000, 500),
    ("get from the RAM tier, small dict", "get RAM", small_dict, 100_000, 500),
    ("set, 1 MiB array, 1,000 entries", "set", array_of(262_144), 1_000, 20),
    ("set, 1 KiB array, 10,000 entries", "set", array_of(256), 10_000, 500),
]
PEERS = ("memory.store", "lmdb", "diskcache", "cachetools")
results: dict[tuple[str, str], float] = {}


class Lmdb:
    def __init__(self, folder: str) -> None:
        self.env = lmdb.open(folder, map_size=64 << 30, sync=False, metasync=False)

    def set(self, key: str, value: Any) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key.encode(), pickle.dumps(value, protocol=5))

    def get(self, key: str) -> Any:
        with self.env.begin() as txn:
            raw = txn.get(key.encode())
        return None if raw is None else pickle.loads(raw)

    def to_ssd(self) -> None:
        pass

    def close(self) -> None:
        self.env.close()


class CacheTools:
    def __init__(self, folder: str) -> None:
        self.cache: Any = cachetools.LRUCache(maxsize=1 << 30)
        self.set, self.get = self.cache.__setitem__, self.cache.get

    def to_ssd(self) -> None:
        pass

    def close(self) -> None:
        self.cache.clear()


# What a peer does not have: lmdb and diskcache keep no RAM tier, cachetools has no SSD.
MISSING_TIER = {("lmdb", "get RAM"), ("diskcache", "get RAM"), ("cachetools", "get SSD")}
MAKERS: dict[str, Any] = {"memory.store": Apsi, "lmdb": Lmdb, "diskcache": DiskCache, "cachetools": CacheTools}


environment = private_home_then(lambda: print_table())


def fill(impl: Any, make: Callable[[int], Any], n: int) -> None:
    for i in range(n):
        impl.set(f"k{i}", make(i))
    os.sync()  # the fill's writeback must not land on whoever is measured next


# --- open: a fresh process ------------------------------------------------------------------------------------

OPEN_SCRIPT = {
    "memory.store": "import apsi_memory as m\nt=time.perf_counter()\ns=m.store(FOLDER)\nv=s.get('k7')",
    "lmdb": "import lmdb, pickle\nt=time.perf_counter()\ne=lmdb.open(FOLDER, map_size=64<<30, sync=False, "
            "metasync=False)\nwith e.begin() as x: v=pickle.loads(x.get(b'k7'))",
    "diskcache": "import diskcache\nt=time.perf_counter()\nc=diskcache.Cache(FOLDER)\nv=c.get('k7')",
}


@pytest.fixture(scope="module")
def filled_for_open(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folders = {}
    for peer in OPEN_SCRIPT:
        folder = str(tmp_path_factory.mktemp(f"open-{peer}"))
        impl = MAKERS[peer](folder)
        fill(impl, small_dict, OPEN_ENTRIES)
        impl.close()
        folders[peer] = folder
    yield folders
    for folder in folders.values():
        shutil.rmtree(folder, ignore_errors=True)


def open_once(peer: str, folder: str) -> float:
    script = (f"import time\nFOLDER={folder!r}\n{OPEN_SCRIPT[peer]}\n"
              "assert v['id'] == 7\nprint(time.perf_counter()-t)")
    env = dict(os.environ, APSI_ALLOW_WRITE=folder)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("peer", list(OPEN_SCRIPT))
def test_open_and_first_get(benchmark: Any, peer: str, filled_for_open: dict[str, str]) -> None:
    times: list[float] = []
    benchmark.pedantic(lambda: times.append(open_once(peer, filled_for_open[peer])), rounds=ROUNDS, iterations=1)
    results[("open a store of 100,000 dicts + first get (fresh process)", peer)] = float(np.median(times))


# --- set / get ----------------------------------------------------------------------------------------------

CASES = [(row, peer) for row in range(len(ROWS)) for peer in PEERS]


@pytest.mark.parametrize(("row", "peer"), CASES, ids=[f"{ROWS[r][0]}-{p}" for r, p in CASES])
def test_operation(benchmark: Any, row: int, peer: str, tmp_path: Any) -> None:
    label, op, make, n, per = ROWS[row]
    if (peer, op) in MISSING_TIER:
        pytest.skip(f"{peer} has no {op[4:]} tier")
    impl = MAKERS[peer](str(tmp_path / "store"))
    fill(impl, make, n)
    counter = iter(range(n, 10**9))
    rng = random.Random(1)
    values = [make(i) for i in range(per)]
    recent = [f"k{i}" for i in range(n - per, n)]
    for key in recent:  # the RAM tier holds these
        impl.get(key)

    def sets() -> None:
        for value in values:
            impl.set(f"n{next(counter)}", value)

    def gets(keys: list[str]) -> Callable[[], None]:
        def run() -> None:
            for key in keys:
                assert impl.get(key) is not None
        return run

    if op == "set":
        benchmark.pedantic(sets, rounds=ROUNDS, iterations=1)
    elif op == "get RAM":
        benchmark.pedantic(gets(recent), rounds=ROUNDS, iterations=1)
    else:
        keys = [f"k{i}" for i in rng.sample(range(n), per)]
        benchmark.pedantic(gets(keys), setup=impl.to_ssd, rounds=ROUNDS, iterations=1)
    if benchmark.stats is not None:
        results[(label, peer)] = benchmark.stats.stats.median / per
    impl.close()


def _cell(seconds: float | None, open_row: bool) -> str:
    if seconds is None:
        return f"{'—':>14}"
    return f"{seconds * 1e3:11.1f} ms" if open_row else f"{seconds * 1e6:11.1f} us"


def print_table() -> None:
    if not results:
        return
    labels = ["open a store of 100,000 dicts + first get (fresh process)"] + [row[0] for row in ROWS]
    lines = [f"\n{'operation':58}" + "".join(f"{p:>14}" for p in PEERS) + "   ours vs lmdb / diskcache"]
    for label in labels:
        row = [results.get((label, peer)) for peer in PEERS]
        if all(v is None for v in row):
            continue
        ours = row[0]
        ratios = " / ".join(f"{v / ours:.2f}x" if v and ours else "—" for v in row[1:3])
        lines.append(f"{label:58}" + "".join(_cell(v, label.startswith("open")) for v in row) + f"   {ratios}")
    print("\n".join(lines))
