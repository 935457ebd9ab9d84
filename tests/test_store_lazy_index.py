"""The index opened from a checkpoint is lazy (issue 14): the checkpoint's rows are looked up in place and the
changes since are kept beside them. Against a plain dict model, every operation the store uses gives the same
answers, the same running totals and the same recency order; and a checkpoint of the earlier (``marshal``)
layout is simply ignored."""

from __future__ import annotations

import marshal
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.store import checkpoint, rows, signing
from apsi_memory.store.keys import EXT
from apsi_memory.store.records import Entry
from apsi_memory.store.tiers import _Index

KEYS = [b"", b"a", b"b", b"sk1", b"sk2", b"i10", b"x" * 40, b"\x00\xff"]


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    stem, kind = f"{draw(st.integers(0, 2**64 - 1)):016x}", draw(st.sampled_from(sorted(EXT)))
    size = draw(st.integers(0, 1 << 40))
    if draw(st.booleans()):
        return Entry(stem, kind, size, draw(st.integers(0, 1 << 40)))
    return Entry(stem + EXT[kind], kind, size)


ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), entries()),
    st.tuples(st.sampled_from(["remove", "touch"]), st.sampled_from(KEYS)),
    st.tuples(st.just("evict"), st.integers(0, 1 << 42), st.sampled_from(KEYS)),
    st.tuples(st.sampled_from(["whole", "clear"])))


def lazy(base: dict[bytes, Entry]) -> _Index:
    n, body = rows.pack(base)
    index = _Index()
    total = sum(e.size for e in base.values())
    index.restore(checkpoint.Loaded(64, rows.Rows(n, memoryview(body)), total,
                                    sum(e.size for e in base.values() if e.inline)))
    return index


def model_step(model: dict[bytes, Entry], op: tuple) -> object:
    """What a plain dict in recency order does (the index before issue 14)."""
    if op[0] == "put":
        old = model.pop(op[1], None)
        model[op[1]] = op[2]
        return old
    if op[0] == "remove":
        return model.pop(op[1], None)
    if op[0] == "touch":
        if op[1] in model:
            model[op[1]] = model.pop(op[1])
        return None
    if op[0] == "evict":
        victims, total, target = [], sum(e.size for e in model.values()), op[1] * 9 // 10
        if total > op[1]:
            for key in [k for k in model if k != op[2]]:
                if total <= target:
                    break
                victims.append((key, model.pop(key)))
                total -= victims[-1][1].size
        return victims
    if op[0] == "clear":
        model.clear()
        return None
    return list(model.items())


def index_step(index: _Index, op: tuple) -> object:
    if op[0] == "put":
        return index.put(op[1], op[2])
    if op[0] == "remove":
        return index.remove(op[1])
    if op[0] == "touch":
        return index.touch([op[1]])
    if op[0] == "evict":
        return index.evict_to(op[1], op[2])
    if op[0] == "clear":
        return index.clear()
    return list(index.entries.items())  # "whole": built, in order; later steps work on the dict


def same(index: _Index, model: dict[bytes, Entry]) -> None:
    """The lookups, length and totals the store uses between steps (these never build the whole dict)."""
    for key in KEYS:
        assert index.get(key) == model.get(key) and (key in index) == (key in model)
    assert len(index) == len(model)
    assert index.total == sum(e.size for e in model.values())
    assert index.inline_total == sum(e.size for e in model.values() if e.inline)


@pytest.fixture(params=["hash", "colliding"])
def hashing(request, monkeypatch):  # the same patch for every example: nothing to reset
    if request.param == "colliding":  # every key of a length in one run of equal hashes: the run is walked
        monkeypatch.setattr(rows, "_HALVES", (len, lambda key: min(len(key), 3)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.dictionaries(st.sampled_from(KEYS), entries()), steps=st.lists(ops, max_size=30))
def test_the_lazy_index_behaves_as_a_dict_in_recency_order(hashing, base, steps):
    index, model = lazy(base), dict(base)
    same(index, model)
    for op in steps:
        assert index_step(index, op) == model_step(model, op)
        same(index, model)
    assert list(index.entries.items()) == list(model.items()), "recency order differs from the model"
    n, body = rows.pack(index.entries)  # the next checkpoint: the same rows, in the same order
    assert list(rows.Rows(n, memoryview(body)).items()) == list(model.items())


def test_an_opened_store_answers_from_the_checkpoint_without_building_the_whole_index(home, monkeypatch):
    monkeypatch.setattr(checkpoint, "MIN_RECORDS", 64)
    s = memory.store("t")
    for i in range(300):
        s.set(f"k{i}", {"i": i})
    s.close()
    reopened = memory.store("t")
    assert reopened._index._base is not None and reopened["k7"] == {"i": 7} and len(reopened) == 300
    assert reopened._index._base is not None, "a get, a hit and len built the whole index"
    assert list(reopened)[-1] == "k7"  # the read moved it to the end of recency order


def test_a_checkpoint_of_the_earlier_marshal_layout_is_ignored_and_the_journal_replayed(home, monkeypatch):
    monkeypatch.setattr(checkpoint, "MIN_RECORDS", 64)
    s = memory.store("t")
    for i in range(300):
        s.set(f"k{i}", {"i": i})
    path, key = Path(s.folder) / "checkpoint", s._seal.store_key
    body = marshal.dumps((0, 64, b"\0" * 32, 0, 0, [b"sk0"], ["0" * 16], [0], [1], [-1]), 2)
    s.close()
    path.write_bytes(b"APSICKPT1\n" + signing.mac(key, b"K", body) + body)  # signed right, the old layout
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not tampered: no warning, and no error
        reopened = memory.store("t")
    assert len(reopened) == 300 and reopened["k299"] == {"i": 299} and list(reopened)[:2] == ["k0", "k1"]
    assert path.read_bytes().startswith(checkpoint.MAGIC), "the whole replay saves a checkpoint of today's layout"


def test_a_checkpoint_signed_the_earlier_way_is_ignored_silently_and_replaced(home, monkeypatch):
    """APSICKPT2 had these columns, signed with BLAKE2b: after an upgrade it is replayed past once, without a
    warning (it is ours, not tampered), and a checkpoint of today's kind takes its place."""
    monkeypatch.setattr(checkpoint, "MIN_RECORDS", 64)
    s = memory.store("t")
    for i in range(300):
        s.set(f"k{i}", {"i": i})
    s.close()
    path, key = Path(s.folder) / "checkpoint", s._seal.store_key
    body = path.read_bytes()[len(checkpoint.MAGIC) + signing.SIGNATURE_BYTES:]
    path.write_bytes(b"APSICKPT2\n" + signing.mac(key, b"K", body) + body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reopened = memory.store("t")
    assert reopened._index._base is None, "the old checkpoint was used"
    assert len(reopened) == 300 and reopened["k299"] == {"i": 299}
    assert path.read_bytes().startswith(checkpoint.MAGIC)


def test_columns_whose_lengths_disagree_are_no_rows():
    n, body = rows.pack({b"sk1": Entry("0" * 16, 0, 5, 10), b"sk22": Entry("1" * 16 + ".pkl", 0, 7)})
    assert rows.fits(n, memoryview(body)) and rows.fits(0, memoryview(b""))
    assert not rows.fits(n, memoryview(body)[:-1]) and not rows.fits(n, memoryview(body + b"x"))
    assert not rows.fits(n + 1, memoryview(body)) and not rows.fits(-1, memoryview(body))
