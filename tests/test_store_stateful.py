"""A hypothesis state machine drives two handles on one store (as two processes would hold) against a dict model.

``check_valid`` holds after every step: the running totals equal the real sizes (files measured on disk), both
tiers are within their bounds, the RAM tier mirrors the SSD, the store's recency order is the model's, and
whatever the SSD tier evicted was the least recently used."""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from apsi_memory.decide import Level, ram_tier_limit
from apsi_memory.store import Store, encode_key

RAM = 64 * 1024
DISK = 400 * 1024

keys = st.one_of(st.sampled_from(["a", "b", "c", 1, 2, -3, b"a", b"\x00" * 300]), st.text(max_size=4))
arrays = st.one_of(
    st.integers(0, 3000).map(lambda n: np.arange(n, dtype=np.float64)),  # inline or a file read whole
    st.integers(0, 5).map(lambda n: np.full((20_000,), n, dtype=np.int64)),  # 160 KB: memory-mapped
)
plain = st.one_of(st.none(), st.integers(), st.text(max_size=30),
                  st.dictionaries(st.text(max_size=5), st.integers(), max_size=5),
                  # a pickle file of its own; built from a few drawn bytes, since drawing 17 KB of them
                  # exceeds what hypothesis may draw for one example
                  st.tuples(st.binary(min_size=1, max_size=8), st.integers(17_000, 20_000)).map(
                      lambda pattern_size: (pattern_size[0] * pattern_size[1])[:pattern_size[1]]))
values = st.one_of(plain, arrays)


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and np.array_equal(a, b)
    return a == b


class StoreMachine(RuleBasedStateMachine):
    folder_root: str = ""

    @initialize()
    def open_two_handles(self) -> None:
        StoreMachine.runs += 1
        self.folder = os.path.join(self.folder_root, f"run{StoreMachine.runs}")
        self.level = Level.OK
        self.handles = [self._open(), self._open()]
        self.model: OrderedDict[bytes, object] = OrderedDict()  # least recently used first

    runs = 0

    def _open(self) -> Store:
        return Store(self.folder, "m", RAM, DISK, level=lambda: self.level)

    def _drop_evicted(self, handle: Store) -> None:
        """Keys the store no longer has must be the least recently used ones: a prefix of the model's order."""
        present = set(handle._index.entries)
        order = list(self.model)
        missing = [k for k in order if k not in present]
        assert order[:len(missing)] == missing, "the SSD tier evicted something more recent than what it kept"
        for key in missing:
            del self.model[key]

    @rule(which=st.integers(0, 1), key=keys, value=values)
    def set(self, which: int, key, value) -> None:
        handle = self.handles[which]
        handle.set(key, value)
        self.model[encode_key(key)] = value
        self.model.move_to_end(encode_key(key))
        handle._catch_up()
        self._drop_evicted(handle)

    @rule(which=st.integers(0, 1), items=st.lists(st.tuples(keys, values), min_size=2, max_size=6))
    def set_several(self, which: int, items: list) -> None:
        for key, value in items:
            self.set(which, key, value)

    @rule(which=st.integers(0, 1), key=keys)
    def get(self, which: int, key) -> None:
        handle = self.handles[which]
        got = handle.get(key, "<missing>")
        encoded = encode_key(key)
        if encoded in self.model:
            assert same(got, self.model[encoded])
            self.model.move_to_end(encoded)
            if isinstance(got, np.ndarray) and got.size:
                got.reshape(-1).view(np.uint8)[:] = 0xA5  # the caller's own: the store must never see it
        else:
            assert got == "<missing>"
        handle.flush()  # reads reach the journal in batches; make this one visible to the other handle now

    @rule(which=st.integers(0, 1), key=keys)
    def delete(self, which: int, key) -> None:
        encoded = encode_key(key)
        assert self.handles[which].delete(key) == (encoded in self.model)
        self.model.pop(encoded, None)

    @rule(which=st.integers(0, 1))
    def clear(self, which: int) -> None:
        self.handles[which].clear()
        self.model.clear()

    @rule(which=st.integers(0, 1))
    def reopen(self, which: int) -> None:
        """Opening evicts, least recently used first, if the store is over its bound: the reads since the last
        write journaled their recency, and those records count toward ``disk_bytes`` (hypothesis found a store
        1 byte over after many reads, so opening evicted; the model had not expected that)."""
        self.handles[which].close()
        self.handles[which] = self._open()
        self._drop_evicted(self.handles[which])

    @rule(which=st.integers(0, 1))
    def compact(self, which: int) -> None:
        """The journal rewritten now (it may evict first to make room for the rewrite); the other handle meets
        the new journal on its next look."""
        handle = self.handles[which]
        with handle._lock, handle._journal:
            handle._catch_up()
            handle._compact_if_due(force=True)
        self._drop_evicted(handle)

    @rule(level=st.sampled_from(list(Level)))
    def pressure(self, level: Level) -> None:
        self.level = level
        for handle in self.handles:
            handle.on_level(level)

    @rule(which=st.integers(0, 1))
    def relieve(self, which: int) -> None:
        self.handles[which].relieve()
        assert self.handles[which].ram_bytes == 0

    @precondition(lambda self: self.model)
    @rule(which=st.integers(0, 1))
    def read_everything(self, which: int) -> None:
        from apsi_memory.store import decode_key

        for encoded in list(self.model):
            assert same(self.handles[which].get(decode_key(encoded)), self.model[encoded])
            self.model.move_to_end(encoded)
        self.handles[which].flush()

    @invariant()
    def check_valid(self) -> None:
        if not hasattr(self, "handles"):
            return
        for handle in self.handles:
            handle._catch_up()
            index = handle._index
            real = sum(entry.size if entry.inline else os.path.getsize(os.path.join(handle._data, entry.name))
                       for entry in index.entries.values())
            assert index.total == real <= DISK
            assert index.inline_total == sum(e.size for e in index.entries.values() if e.inline)
            ram = handle._ram
            assert ram.total == sum(held.nbytes for held in ram.values.values())
            assert ram.total <= ram.limit <= ram_tier_limit(RAM, Level.OK)
            assert ram.limit == ram_tier_limit(RAM, self.level)
            for key, held in ram.values.items():
                assert index.entries[key].name == held.name, "the RAM tier holds a value the SSD replaced"
            assert list(index.entries) == list(self.model), "recency order differs from the model"


@pytest.fixture
def store_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("APSI_ALLOW_WRITE", str(tmp_path))  # stores made directly are checked as memory.store's
    StoreMachine.folder_root = str(tmp_path)
    return StoreMachine


def test_store_against_a_dict_model(store_machine):
    run_state_machine_as_test(store_machine, settings=settings(
        max_examples=80, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]))
