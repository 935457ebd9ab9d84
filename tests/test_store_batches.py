"""``Store.set_many`` and ``Store.get_many`` (issue 28 item 6): each key as ``set``/``get`` would treat it, one
journal append per batch, all or nothing under a fault, never seen in part by another reader."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.errors import ArgumentTypeError, DiskFullError, SizeError
from apsi_memory.store import batches, checkpoint
from apsi_memory.units import GiB, KiB, MiB

FORK = multiprocessing.get_context("fork")
pytestmark = pytest.mark.usefixtures("calm_host")  # the real host's pressure must not decide what stays in RAM


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and np.array_equal(a, b)
    return a == b


def files(s: memory.Store) -> set[str]:
    return set(os.listdir(Path(s.folder) / "data"))


# -- semantics: a batch is what the loop of per-key calls would have done ------------------------------------------

keys = st.one_of(st.sampled_from(["a", "b", "c", 1, 2, b"a", b"\x00" * 300]), st.text(max_size=3))
values = st.one_of(
    st.none(), st.integers(), st.text(max_size=20),
    st.integers(0, 3000).map(lambda n: np.arange(n, dtype=np.float64)),  # inline, or a file read whole
    st.integers(0, 3).map(lambda n: np.full(20_000, n, dtype=np.int64)),  # 160 KB: a mapped file
    st.integers(17_000, 20_000).map(lambda n: b"p" * n),  # a pickle file of its own
)
operations = st.one_of(
    # Keys unique within a batch: a key given twice is tested apart (the per-key loop's RAM tier would have held
    # its first value for a while, which may push out another).
    st.tuples(st.just("set_many"), st.lists(st.tuples(keys, values), max_size=6, unique_by=lambda kv: repr(kv[0]))),
    st.tuples(st.just("get_many"), st.lists(keys, max_size=6)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("reopen")),
)


class Pair:
    """One store given batches, one given the same calls key by key, and a dict: all three must agree."""

    def __init__(self, root: Path) -> None:
        self.folders = [str(root / "batched"), str(root / "per-key")]
        for folder in self.folders:
            memory.allow_write(folder)
        self.open()
        self.model: dict[object, object] = {}

    def open(self) -> None:
        # A RAM tier smaller than some values, so both tiers answer; a disk far above what is stored (a loop of
        # sets may evict a batch's own first keys, which set_many never does: tested apart).
        self.batched, self.per_key = (memory.store(f, ram_mb=0.25, disk_gb=1) for f in self.folders)

    def close(self) -> None:
        self.batched.close()
        self.per_key.close()

    def step(self, op: tuple) -> None:
        if op[0] == "set_many":
            self.batched.set_many(op[1])
            for key, value in op[1]:
                self.per_key.set(key, value)
                self.model[key] = value
        elif op[0] == "get_many":
            got = self.batched.get_many(op[1], default="missing")
            one_by_one = [self.per_key.get(key, "missing") for key in op[1]]
            expected = [self.model.get(key, "missing") for key in op[1]]
            assert len(got) == len(expected)
            assert all(same(a, b) and same(a, c) for a, b, c in zip(got, one_by_one, expected))
        elif op[0] == "delete":
            present = op[1] in self.model
            self.model.pop(op[1], None)
            assert self.batched.delete(op[1]) == self.per_key.delete(op[1]) == present
        else:
            self.close()
            self.open()
        self.check()

    def check(self) -> None:
        a, b = self.batched, self.per_key
        assert list(a) == list(b), "recency order"
        assert (a.disk_bytes, a.ram_bytes, a.stats()) == (b.disk_bytes, b.ram_bytes, b.stats())
        assert sorted(map(repr, a)) == sorted(map(repr, self.model))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(operations, max_size=10))
def test_batches_leave_what_the_per_key_calls_leave(tmp_path_factory, ops):
    pair = Pair(tmp_path_factory.mktemp("pair"))
    try:
        for op in ops:
            pair.step(op)
    finally:
        pair.close()


def test_a_key_given_twice_keeps_its_last_value_in_its_last_place(home):
    s = memory.store("t")
    s.set_many([("a", 1), ("b", 2), ("a", 3)])
    assert list(s) == ["b", "a"] and s.get_many(["a", "b"]) == [3, 2]


def test_get_many_answers_in_the_order_asked_with_the_default_for_misses(home):
    s = memory.store("t")
    s.set_many({"a": np.arange(3.0), 2: "two"})
    got = s.get_many(["a", "nope", 2, "a"], default=-1)
    assert same(got[0], np.arange(3.0)) and got[1:3] == [-1, "two"] and same(got[3], got[0])
    got[0][0] = 99  # each value the caller's own, as get's
    assert s.get("a")[0] == 0 and got[3][0] == 0
    assert s.get_many([]) == [] and s.get_many(iter(["a"]), writable=False)[0].flags.writeable is False


def test_a_reopened_store_sees_the_batch(home):
    """Replayed from the journal (a small batch) and from the checkpoint a big batch leaves (over 4,096 records):
    every inline value is found where the batch's one append put it."""
    small = {f"s{i}": {"i": i} for i in range(10)} | {"big": np.arange(40_000.0), "file": b"x" * 20_000}
    many = {f"m{i}": np.full(3, i) for i in range(5_000)}
    with memory.store("t") as s:
        s.set_many(small)
        s.set_many(many)
    assert (Path(s.folder) / checkpoint.NAME).exists()
    s = memory.store("t")
    got = s.get_many([*small, *many])
    assert all(same(a, b) for a, b in zip(got, [*small.values(), *many.values()], strict=True))
    assert len(s) == len(small) + len(many)


def test_a_batch_is_one_append(home, monkeypatch):
    s = memory.store("t")
    s.set("warm", 0)
    fd, real_write, writes = s._journal.fd, os.write, []

    def counted(target: int, data: bytes) -> int:
        writes.append(target)
        return real_write(target, data)

    monkeypatch.setattr(os, "write", counted)
    s.set_many({f"k{i}": i for i in range(1_000)})
    assert writes.count(fd) == 1


def test_a_batch_the_kernel_writes_in_several_steps_is_stored_whole(home, monkeypatch):
    """A write returns less than asked past 2 GiB (Linux's cap per call): the rest follows, and it is not
    mistaken for a full disk. Here every write stops at 4 KiB."""
    s = memory.store("t")
    fd, real_write = s._journal.fd, os.write
    monkeypatch.setattr(os, "write", lambda target, data: real_write(target, data[:4096] if target == fd else data))
    batch = {f"k{i}": b"v" * 10_000 for i in range(50)}
    s.set_many(batch)
    monkeypatch.setattr(os, "write", real_write)
    assert memory.store("t").get_many(list(batch)) == list(batch.values())


# -- all or nothing ----------------------------------------------------------------------------------------------

class Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling this")


def before(s: memory.Store) -> tuple:
    return list(s), s.get_many(list(s)), files(s), s.disk_bytes


def unchanged(s: memory.Store, was: tuple) -> bool:
    now = before(s)
    return now[0] == was[0] and all(map(same, now[1], was[1])) and now[2:] == was[2:]


@pytest.fixture
def stocked(home) -> memory.Store:
    s = memory.store("t", ram_mb=0)  # every read from the SSD: what is there is what counts
    s.set_many({"kept": 1, "replaced": b"old" * 10_000, "arr": np.arange(50_000.0)})
    return s


def test_an_unpicklable_value_in_the_middle_stores_nothing(stocked):
    was = before(stocked)
    batch = [("new", b"n" * 30_000), ("replaced", np.ones(40_000)), ("bad", Unpicklable()), ("late", 1)]
    with pytest.raises(ArgumentTypeError, match=r"Unpicklable: it cannot be pickled .*key 'bad'.*nothing was stored"):
        stocked.set_many(batch)
    assert unchanged(stocked, was) and unchanged(memory.store("t", ram_mb=0), was)


def test_a_full_disk_mid_batch_stores_nothing_and_leaves_no_file(stocked, monkeypatch):
    """The second value file cannot be written: the first one, already written, is removed."""
    was, real_write_new, calls = before(stocked), batches.write_new, []

    def second_fails(name, dir_fd, parts, full):
        calls.append(name)
        if len(calls) == 2:
            raise full()
        real_write_new(name, dir_fd, parts, full)

    monkeypatch.setattr(batches, "write_new", second_fails)
    with pytest.raises(DiskFullError, match="the store is unchanged"):
        stocked.set_many({"a": b"a" * 20_000, "b": b"b" * 20_000, "replaced": 3})
    assert len(calls) == 2 and unchanged(stocked, was)


def test_a_full_disk_at_the_append_stores_nothing_and_leaves_no_file(stocked, monkeypatch):
    was, fd, real_write = before(stocked), stocked._journal.fd, os.write

    def journal_full(target: int, data: bytes) -> int:
        if target == fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(target, data)

    monkeypatch.setattr(os, "write", journal_full)
    with pytest.raises(DiskFullError):
        stocked.set_many({"a": b"a" * 20_000, "big": np.zeros(40_000), "replaced": 3})
    monkeypatch.setattr(os, "write", real_write)
    assert unchanged(stocked, was)
    stocked.set_many({"after": 1})  # and the store goes on
    assert stocked.get("after") == 1


def test_a_batch_bigger_than_the_ssd_tier_is_refused_before_anything_is_written(home):
    s = memory.store("t", disk_gb=300 * KiB / GiB)
    s.set("kept", 1)
    was = before(s)
    with pytest.raises(SizeError, match=r"the 4 values take .* more than this store's SSD tier"):
        s.set_many({i: np.zeros(10_000) for i in range(4)})  # 80 KB each: each fits, the four do not
    assert unchanged(s, was)


def test_a_batch_that_fits_evicts_older_entries_never_its_own(home):
    """Near the limit, the eviction that makes room keeps every key of the batch (a loop of sets would have
    evicted the batch's first keys to make room for its last)."""
    s = memory.store("t", disk_gb=1 * MiB / GiB)
    s.set_many({f"old{i}": np.zeros(5_000) for i in range(10)})
    batch = {f"new{i}": np.full(20_000, i) for i in range(6)}  # 6 x 160 KB: 94 % of the limit
    s.set_many(batch)
    assert all(same(a, b) for a, b in zip(s.get_many(list(batch)), batch.values(), strict=True))
    assert not any(key.startswith("old") for key in s)


@pytest.mark.parametrize("items, message", [
    ("ab", "mapping or an iterable of .key, value. pairs, not a str"),
    (7, "not a int"),
    ([("a", 1), "xy"], "item 1 is a str, not a .key, value. pair"),
    ([("a", 1, 2)], "item 0 is a tuple of length 3"),
    ([(1.5, "x")], "set_many: key 0: store keys are str, int or bytes, not float"),
    ({True: 1}, "set_many: key 0: store keys .* not bool"),
])
def test_set_many_names_bad_input_and_stores_nothing(home, items, message):
    s = memory.store("t")
    with pytest.raises(ArgumentTypeError, match=message):
        s.set_many(items)
    assert len(s) == 0


@pytest.mark.parametrize("keys, message", [
    ("abc", "iterable of keys .a list, say., not a str; for one key use get.key."),
    (b"ab", "not a bytes"),
    (5, "not a int"),
    (["a", 2.5], "get_many: key 1: store keys are str, int or bytes, not float"),
])
def test_get_many_names_bad_input(home, keys, message):
    with pytest.raises(ArgumentTypeError, match=message):
        memory.store("t").get_many(keys)


# -- another reader: the batch whole or not at all -----------------------------------------------------------------

KEYS = [f"k{i}" for i in range(200)]


def versions(s: memory.Store) -> list[int | None]:
    return [None if v is None else v["version"] for v in s.get_many(KEYS)]


def read_when_asked(conn, other_end) -> None:
    other_end.close()  # the test's end, inherited: closed here, so the test closing its own is an end of file
    s = memory.store("shared", ram_mb=0)
    conn.send(versions(s))  # opened (which takes the lock the writer will hold mid-batch), and read once
    with contextlib.suppress(EOFError):  # the test closed its end: done
        while conn.recv():
            conn.send(versions(s))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_another_process_reading_mid_batch_sees_the_old_store(home, monkeypatch):
    """The batch's one write is stopped half-way (its first records whole in the file, the rest not yet) while
    another process reads, which has not looked since an earlier write (so it reads the journal now): it sees
    every key as before, then, once the write ends, every key new."""
    s = memory.store("shared")
    s.set_many({key: {"version": 0} for key in KEYS})
    ours, theirs = FORK.Pipe()
    reader = FORK.Process(target=read_when_asked, args=(theirs, ours))
    reader.start()
    try:
        assert ours.recv() == [0] * len(KEYS)
        fd, real_write, seen = s._journal.fd, os.write, []

        def halted_half_way(target: int, data: bytes) -> int:
            if target != fd or len(data) < 10_000:
                return real_write(target, data)
            half = real_write(target, data[:len(data) // 2])
            ours.send(True)
            seen.append(ours.recv())
            return half + real_write(target, data[half:])

        s.set("unseen", 1)  # a completed write the reader has not looked at yet
        monkeypatch.setattr(os, "write", halted_half_way)
        s.set_many({key: {"version": 1, "pad": "p" * 100} for key in KEYS})
        monkeypatch.setattr(os, "write", real_write)
        ours.send(True)
        seen.append(ours.recv())
    finally:
        ours.close()  # ends the reader, whatever happened here
        reader.join(timeout=30)
        if reader.is_alive():
            reader.kill()
    assert seen == [[0] * len(KEYS), [1] * len(KEYS)]


def test_one_get_many_reads_the_journal_once(home, monkeypatch):
    """A batch another handle (as another process would) completes while a ``get_many`` is half-way through its
    keys is not seen by it at all: one look at the journal, not one per key."""
    reader, writer = memory.store("shared", ram_mb=0), memory.store("shared")
    writer.set_many({key: {"version": 0} for key in KEYS})
    assert versions(reader) == [0] * len(KEYS)
    real_loads, calls = pickle.loads, []

    def writes_meanwhile(data: bytes, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == len(KEYS) // 2:
            writer.set_many({key: {"version": 1} for key in KEYS})
        return real_loads(data, **kwargs)

    monkeypatch.setattr(pickle, "loads", writes_meanwhile)
    assert versions(reader) == [0] * len(KEYS)
    assert versions(reader) == [1] * len(KEYS)
