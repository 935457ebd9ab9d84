"""memory.store side by side with diskcache and a zict Buffer, in one run: ``set``, ``get`` from RAM and ``get``
from the SSD, per operation, for small dicts, 1 KiB and 1 MiB float32 arrays, at 1,000 / 8,000 / 100,000 entries
(1 MiB arrays at 1,000 only: 100,000 of them would be 98 GiB, more than this machine's disk has free).

    .venv/bin/python -m pytest benchmarks/bench_store.py --benchmark-only -s

Each round is a batch of operations on a store already holding N entries; ``set`` adds new keys. After the run a
table prints microseconds per operation and each figure's speed against diskcache's (``x`` > 1: faster).

What the peers do differently: diskcache keeps values under 32 KiB inside SQLite and bigger ones in files, and has
no RAM tier (a "RAM hit" is its ordinary get). A zict Buffer writes a value to its slow (file) mapping only when
it leaves the fast one, so its ``set`` is a dict insert and a crash loses what is in RAM; memory.store writes
every value through to the SSD, signed.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import sys
from collections.abc import Callable
from typing import Any

import diskcache
import numpy as np
import pytest
import zict

import apsi_memory as memory
from benchmarks import private_home

RAM_MB = 256
KINDS: dict[str, Callable[[int], Any]] = {
    "dict": lambda i: {"id": i, "name": f"document {i}", "tags": ["a", "b"], "score": i / 7},
    "1 KiB array": lambda i: np.full(256, i, dtype=np.float32),
    "1 MiB array": lambda i: np.full(262_144, i, dtype=np.float32),
}
SIZES = {"dict": (1_000, 8_000, 100_000), "1 KiB array": (1_000, 8_000, 100_000), "1 MiB array": (1_000,)}
BATCH = {"dict": 500, "1 KiB array": 500, "1 MiB array": 20}
ROUNDS = 7
IMPLS = ("memory.store", "diskcache", "zict.Buffer")


class Apsi:
    def __init__(self, folder: str) -> None:
        memory.allow_write(folder)
        self.store = memory.store(folder, ram_mb=RAM_MB, disk_gb=20)
        self.set, self.get = self.store.set, self.store.get

    def to_ssd(self) -> None:
        self.store.relieve()

    def close(self) -> None:
        self.store.close()


class DiskCache:
    def __init__(self, folder: str) -> None:
        self.cache = diskcache.Cache(folder, size_limit=20 << 30)
        self.set, self.get = self.cache.set, self.cache.get

    def to_ssd(self) -> None:
        pass  # no RAM tier

    def close(self) -> None:
        self.cache.close()


def _weight(key: str, value: Any) -> float:
    return value.nbytes if isinstance(value, np.ndarray) else sys.getsizeof(value)


class ZictBuffer:
    def __init__(self, folder: str) -> None:
        slow = zict.Func(lambda v: pickle.dumps(v, protocol=5), pickle.loads, zict.File(folder))
        self.buffer = zict.Buffer({}, slow, n=RAM_MB << 20, weight=_weight)
        self.set = self.buffer.__setitem__
        self.get = self.buffer.get

    def to_ssd(self) -> None:
        self.buffer.evict_until_below_target(0)

    def close(self) -> None:
        self.buffer.close()


MAKERS = {"memory.store": Apsi, "diskcache": DiskCache, "zict.Buffer": ZictBuffer}
CASES = [(kind, n, impl) for kind in KINDS for n in SIZES[kind] for impl in IMPLS]
results: dict[tuple[str, int, str, str], float] = {}


@pytest.fixture(scope="module", autouse=True)
def environment(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with private_home(tmp_path_factory):
        yield
    print_table()


class Filled:
    def __init__(self, impl: str, kind: str, n: int, folder: str) -> None:
        self.store = MAKERS[impl](folder)
        self.kind, self.n, self.impl = kind, n, impl
        self.make = KINDS[kind]
        for i in range(n):
            self.store.set(f"k{i}", self.make(i))
        # Write the fill out before measuring: otherwise the kernel's writeback throttling of the fill's dirty
        # pages (a GiB for the 1 MiB arrays) lands on whichever store happens to be measured next.
        os.sync()
        self.next = n
        self.recent: list[str] = []
        self.rng = random.Random(1)


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{n}-{i}" for k, n, i in CASES])
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    kind, n, impl = request.param
    folder = str(tmp_path_factory.mktemp("store"))
    f = Filled(impl, kind, n, folder)
    yield f
    f.store.close()
    shutil.rmtree(folder, ignore_errors=True)


def _record(benchmark: Any, f: Filled, op: str) -> None:
    if benchmark.stats is not None:
        per_op = benchmark.stats.stats.median / BATCH[f.kind]
        results[(f.kind, f.n, op, f.impl)] = per_op
        benchmark.extra_info["us_per_op"] = round(per_op * 1e6, 2)


def test_set(benchmark: Any, filled: Filled) -> None:
    f = filled
    values = [f.make(i) for i in range(BATCH[f.kind])]

    def batch() -> None:
        keys = [f"n{f.next + i}" for i in range(len(values))]
        for key, value in zip(keys, values):
            f.store.set(key, value)
        f.next += len(values)
        f.recent = keys

    benchmark.pedantic(batch, rounds=ROUNDS, iterations=1)
    _record(benchmark, f, "set")


def test_get_ram_hit(benchmark: Any, filled: Filled) -> None:
    f = filled
    if not f.recent:  # run alone (-k): make some recent keys
        f.recent = [f"k{i}" for i in range(f.n - BATCH[f.kind], f.n)]
        for key in f.recent:
            f.store.get(key)
    keys = f.recent  # just set: in the RAM tier where there is one

    def batch() -> None:
        for key in keys:
            assert f.store.get(key) is not None

    benchmark.pedantic(batch, rounds=ROUNDS, iterations=1)
    _record(benchmark, f, "get RAM")


def test_get_ssd_hit(benchmark: Any, filled: Filled) -> None:
    f = filled
    keys = [f"k{i}" for i in f.rng.sample(range(f.n), BATCH[f.kind])]

    def batch() -> None:
        for key in keys:
            value = f.store.get(key)
            assert value is not None
            if isinstance(value, np.ndarray):
                float(value[-1])  # touch it: a mapped array reads its last page

    benchmark.pedantic(batch, setup=f.store.to_ssd, rounds=ROUNDS, iterations=1)
    _record(benchmark, f, "get SSD")


def print_table() -> None:
    if not results:
        return
    lines = [f"\n{'':28}{'':10}" + "".join(f"{impl:>16}" for impl in IMPLS) + "   memory.store vs diskcache"]
    for kind in KINDS:
        for n in SIZES[kind]:
            for op in ("set", "get RAM", "get SSD"):
                row = [results.get((kind, n, op, impl)) for impl in IMPLS]
                if row[0] is None:
                    continue
                cells = "".join(f"{v * 1e6:13.1f} us" if v is not None else f"{'-':>16}" for v in row)
                ratio = f"{row[1] / row[0]:6.2f}x" if row[1] else ""
                lines.append(f"{kind + ' @ ' + format(n, ','):28}{op:10}{cells}   {ratio}")
    print("\n".join(lines))
