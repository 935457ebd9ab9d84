"""How close ``memory.store`` is to the cost of its own protocol: the floor of issue 14's small-value rows.

    .venv/bin/python -m pytest benchmarks/bench_store_floor.py --benchmark-only -s

``BareJournal`` does, in one Python function per operation, only what the store's crash safety and trust rules
require of a small ``set`` and of a ``get`` from the SSD, with the library's own MAC (``signing.mac_keyed``):

* set: a random version, pickle, MAC; ``flock`` the lock file, read the shared counters, ``fstat`` the journal (a
  writer killed between its append and its counter update must be seen), append one framed, CRC'd record, update
  the counters, unlock;
* get: a lock, the index lookup, one ``pread``, the MAC checked, unpickle, the value kept in a RAM dict and the
  read remembered.

It has no RAM-tier bound, no recency order, no eviction, compaction or checkpoint, no level checks: what the store
adds is the difference. lmdb (``sync=False, metasync=False``, one write transaction per set) is the peer, as in
``bench_store_peers.py``; the table printed at the end gives each contender's time over lmdb's.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pickle
import random
import struct
import threading
import zlib
from collections.abc import Callable
from hmac import compare_digest
from typing import Any

import pytest

from apsi_memory.store.signing import keyed_state, mac_keyed
from benchmarks import private_home_then
from benchmarks.bench_store import Apsi
from benchmarks.bench_store_peers import Lmdb, fill, small_dict

pytest.importorskip("lmdb", reason="the peer is in the bench extra: pip install '.[bench]'")

ENTRIES = 100_000
PER_ROUND = 500
ROUNDS = 9
_COUNTERS = struct.Struct("<QQQ")  # generation, epoch, end: as the store's lock file
_FRAME = struct.Struct("<III")
_SET = struct.Struct("<BQ")


class BareJournal:
    """The store's journal protocol for small pickled values and nothing else (see the module docstring)."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.fd = os.open(os.path.join(folder, "index"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.lock_fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self.lock_fd, bytes(_COUNTERS.size), 0)
        self.counters = mmap.mmap(self.lock_fd, _COUNTERS.size)
        self.keyed = keyed_state(os.urandom(32))
        self.lock = threading.RLock()
        self.index: dict[bytes, tuple[bytes, int, int]] = {}
        self.ram: dict[bytes, bytes] = {}
        self.reads: list[bytes] = []

    def set(self, key: str, value: Any) -> None:
        encoded = b"s" + key.encode()
        version = os.urandom(8).hex().encode()
        payload = pickle.dumps(value, protocol=5)
        signed = payload + mac_keyed(self.keyed, b"P", encoded, version, payload)
        meta = b"S" + _SET.pack(0, len(signed)) + version + encoded
        record = _FRAME.pack(len(meta), len(signed), zlib.crc32(meta)) + meta + signed
        with self.lock:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            try:
                generation, epoch, _ = _COUNTERS.unpack_from(self.counters)
                end = os.fstat(self.fd).st_size + os.write(self.fd, record)
                _COUNTERS.pack_into(self.counters, 0, generation + 1, epoch, end)
                self.index[encoded] = (version, end - len(signed), len(signed))
                self.ram[encoded] = payload
            finally:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def get(self, key: str) -> Any:
        encoded = b"s" + key.encode()
        with self.lock:
            held = self.ram.get(encoded)
            if held is not None:
                return pickle.loads(held)
            version, offset, size = self.index[encoded]
            signed = os.pread(self.fd, size, offset)
            payload = signed[:-32]
            if not compare_digest(signed[-32:], mac_keyed(self.keyed, b"P", encoded, version, payload)):
                raise ValueError(f"{key}: signature does not match")
            value = pickle.loads(payload)
            self.ram[encoded] = payload
            self.reads.append(encoded)
            return value

    def to_ssd(self) -> None:
        self.ram.clear()

    def close(self) -> None:
        self.counters.close()
        os.close(self.fd)
        os.close(self.lock_fd)


CONTENDERS: dict[str, Callable[[str], Any]] = {"memory.store": Apsi, "bare journal (floor)": BareJournal,
                                               "lmdb": Lmdb}
results: dict[tuple[str, str], float] = {}


environment = private_home_then(lambda: print_table())


@pytest.mark.parametrize("op", ["set", "get SSD"])
@pytest.mark.parametrize("name", list(CONTENDERS))
def test_small_values(benchmark: Any, name: str, op: str, tmp_path: Any) -> None:
    impl = CONTENDERS[name](str(tmp_path / "store"))
    fill(impl, small_dict, ENTRIES)
    values = [small_dict(i) for i in range(PER_ROUND)]
    counter = iter(range(ENTRIES, 10**9))
    keys = [f"k{i}" for i in random.Random(1).sample(range(ENTRIES), PER_ROUND)]

    def sets() -> None:
        for value in values:
            impl.set(f"n{next(counter)}", value)

    def gets() -> None:
        for key in keys:
            assert impl.get(key) is not None

    if op == "set":
        benchmark.pedantic(sets, rounds=ROUNDS, iterations=1)
    else:
        benchmark.pedantic(gets, setup=impl.to_ssd, rounds=ROUNDS, iterations=1)
    if benchmark.stats is not None:
        results[(op, name)] = benchmark.stats.stats.median / PER_ROUND
    impl.close()


def print_table() -> None:
    if not results:
        return
    lines = [f"\n{'small dict, 100,000 entries':30}" + "".join(f"{name:>22}" for name in CONTENDERS)]
    for op in ("set", "get SSD"):
        lmdb_time = results.get((op, "lmdb"))
        cells = []
        for name in CONTENDERS:
            t = results.get((op, name))
            ratio = f" ({t / lmdb_time:.1f}x)" if t and lmdb_time else ""
            cells.append(f"{'—' if t is None else f'{t * 1e6:.1f} us{ratio}':>22}")
        lines.append(f"{op:30}" + "".join(cells))
    print("\n".join(lines) + "\n(x: time over lmdb's)")
