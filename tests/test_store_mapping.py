"""memory.store as a ``collections.abc.MutableMapping``: every method a dict has works on a store as on a dict,
except equality (a store equals only itself, and hashes by identity)."""

from __future__ import annotations

import collections.abc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.errors import MissingKeyError, StoreClosedError

# As in test_store.py: a simulated container at ``ok``, so this host's pressure cannot shrink the RAM tier, and
# ``home`` puts the key and the stores under the test's tmp_path.
pytestmark = pytest.mark.usefixtures("pressure_machine", "home")

UNPICKLED = [0]


class Counted:
    """A value that counts how often it is unpickled: a read of the value, as opposed to a look at the index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __setstate__(self, state: dict[str, int]) -> None:
        UNPICKLED[0] += 1
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counted) and other.n == self.n


@pytest.fixture
def s(home: Path) -> Iterator[memory.Store]:
    with memory.store("m") as opened:
        assert Path(opened.folder).is_relative_to(home), "the store lives in the test's tmp_path"
        yield opened


def test_a_store_is_a_mutable_mapping(s: memory.Store) -> None:
    assert isinstance(s, collections.abc.MutableMapping)
    assert isinstance(s, collections.abc.Mapping)
    assert issubclass(memory.Store, collections.abc.MutableMapping)
    assert isinstance(s, collections.abc.Hashable)


def test_update_from_a_dict_pairs_kwargs_and_another_store(s: memory.Store) -> None:
    s.update({"a": 1, 2: "two", b"x": [3]})
    assert len(s) == 3 and dict(s.items()) == {"a": 1, 2: "two", b"x": [3]}
    s.update([("b", 4), ("a", 10)])
    assert len(s) == 4 and s["a"] == 10 and s["b"] == 4
    s.update(c=5, a=11)
    assert len(s) == 5 and s["c"] == 5 and s["a"] == 11
    s.update({"d": 6}, e=7)
    assert len(s) == 7 and (s["d"], s["e"]) == (6, 7)
    with memory.store("other") as other:
        other.update(s)
        assert dict(other.items()) == dict(s.items()) == {"a": 11, 2: "two", b"x": [3], "b": 4, "c": 5, "d": 6,
                                                          "e": 7}


def test_pop_returns_and_removes_or_gives_the_default_or_raises_a_key_error(s: memory.Store) -> None:
    s.update({"a": {"v": 1}, "b": 2})
    assert s.pop("a") == {"v": 1}
    assert "a" not in s and len(s) == 1 and s.get("a") is None
    assert s.pop("a", "gone") == "gone" and s.pop("a", None) is None and len(s) == 1
    with pytest.raises(MissingKeyError):
        s.pop("a")
    with pytest.raises(KeyError):  # what ``except KeyError`` around a dict's pop expects
        s.pop("never")
    assert s.pop("b", "unused") == 2 and len(s) == 0
    with memory.store("m") as again:
        assert "a" not in again and "b" not in again, "popped for every handle, not only this one"


def test_pop_of_a_big_array_returns_it_whole_though_its_file_is_removed(s: memory.Store) -> None:
    big = np.arange(1_000_000, dtype=np.float64)  # 8 MB: a file of its own, read back memory-mapped
    s["big"] = big
    popped = s.pop("big")
    assert "big" not in s and len(s) == 0
    np.testing.assert_array_equal(popped, big)
    popped[0] = -1.0  # the caller's own, as a dict's value would be


def test_popitem_takes_the_least_recently_used_entry_and_raises_a_key_error_when_empty(s: memory.Store) -> None:
    s.update({"a": 1, "b": 2, "c": 3})
    assert s["a"] == 1  # read: now the most recently used
    assert s.popitem() == ("b", 2) and len(s) == 2 and "b" not in s
    assert s.popitem() == ("c", 3)
    assert s.popitem() == ("a", 1) and len(s) == 0
    with pytest.raises(MissingKeyError):
        s.popitem()
    with pytest.raises(KeyError):
        s.popitem()


def test_setdefault_stores_only_what_is_missing(s: memory.Store) -> None:
    assert s.setdefault("a", [1]) == [1] and s["a"] == [1] and len(s) == 1
    assert s.setdefault("a", [2]) == [1] and s["a"] == [1] and len(s) == 1, "kept, not overwritten"
    assert s.setdefault("n") is None and "n" in s and s["n"] is None and len(s) == 2  # as a dict stores None


def test_keys_items_and_values_are_views_as_on_a_dict(s: memory.Store) -> None:
    expected: dict[str | int | bytes, object] = {"a": 1, 7: "seven", b"k": (1, 2)}
    s.update(expected)
    keys, items, values = s.keys(), s.items(), s.values()
    assert isinstance(keys, collections.abc.KeysView) and isinstance(items, collections.abc.ItemsView)
    assert isinstance(values, collections.abc.ValuesView)
    assert list(keys) == list(s) == ["a", 7, b"k"], "the store's order: least recently used first"
    assert keys == expected.keys() and keys == {"a", 7, b"k"}
    assert keys & {"a", "z"} == {"a"} and keys - {"a"} == {7, b"k"}  # set-like, as dict.keys()
    assert "a" in keys and "z" not in keys and len(keys) == 3
    assert items == expected.items() and dict(items) == expected and len(items) == 3
    assert ("a", 1) in items and ("a", 2) not in items and ("z", 1) not in items
    order = list(s)  # reading values changes the order (a read is a use): items come in the order as listed
    assert [key for key, _ in items] == order and list(values) == [expected[key] for key in order]
    assert sorted(map(repr, values)) == sorted(map(repr, expected.values())) and len(values) == 3
    s["b"] = 2  # views are live, as a dict's are
    assert len(keys) == len(items) == len(values) == 4 and "b" in keys and ("b", 2) in items
    del s["a"]
    assert "a" not in keys and dict(items) == {7: "seven", b"k": (1, 2), "b": 2} and 1 not in list(values)


def test_get_and_in_as_on_a_dict(s: memory.Store) -> None:
    s["a"] = 0
    assert s.get("a") == 0 and s.get("z") is None and s.get("z", "dflt") == "dflt"
    assert "a" in s and "z" not in s and 0 not in s and b"a" not in s  # ``1``, ``"1"``, ``b"1"`` are three keys
    with pytest.raises(MissingKeyError):
        s["z"]


def test_clear_empties_it(s: memory.Store) -> None:
    s.update({"a": 1, "b": np.zeros(100_000)})
    s.clear()
    assert len(s) == 0 and s.keys() == set() and list(s.items()) == [] and "a" not in s


def test_keys_in_len_and_equality_never_read_a_value(s: memory.Store) -> None:
    s.update({i: Counted(i) for i in range(5)})
    s.relieve()  # nothing in the RAM tier either: a read would have to go to the SSD
    before, stats = UNPICKLED[0], s.stats()
    assert 3 in s and 9 not in s and len(s) == 5
    keys = s.keys()
    assert list(keys) == [0, 1, 2, 3, 4] and keys == set(range(5)) and 4 in keys and 9 not in keys
    with memory.store("m") as again:
        itself = s
        assert s != again and s == itself
    assert UNPICKLED[0] == before and s.stats() == stats, "a look at the index only"
    assert list(s.values()) == [Counted(i) for i in range(5)]
    assert UNPICKLED[0] == before + 5, "values() reads each value (and so counts as reads)"


def test_a_store_equals_only_itself_and_hashes_by_identity(s: memory.Store) -> None:
    s.update({"a": 1})
    with memory.store("m") as same_folder, memory.store("copy") as copy:
        copy.update({"a": 1})
        itself = s
        assert s == itself and (s != itself) is False
        assert s != same_folder and s != copy, "not compared entry by entry, which would read every value"
        assert s != {"a": 1} and {"a": 1} != s
        assert dict(s) == {"a": 1} == dict(copy), "the contents compare as a dict's, once asked for"
        assert hash(s) == hash(s) and len({s, same_folder, copy, s}) == 3
        tracked: weakref.WeakSet[memory.Store] = weakref.WeakSet([s, copy])  # as the library tracks stores
        assert s in tracked and same_folder not in tracked


def test_items_skip_a_key_another_handle_removed_while_iterating(s: memory.Store) -> None:
    s.update({"a": 1, "b": 2, "c": 3})
    with memory.store("m") as other:  # another process's handle would do the same
        pairs = iter(s.items())
        assert next(pairs) == ("a", 1)
        del other["b"]
        assert list(pairs) == [("c", 3)]
        values = iter(s.values())
        assert next(values) == 1
        other.pop("c")
        assert list(values) == []
        assert other.popitem() == ("a", 1)
    with pytest.raises(KeyError):
        s.popitem()


def test_mapping_methods_of_a_closed_store_raise(s: memory.Store) -> None:
    s["a"] = 1
    s.close()
    for call in (lambda: s.update(b=2), lambda: s.pop("a"), lambda: s.popitem(), lambda: s.setdefault("a"),
                 lambda: list(s.items()), lambda: list(s.keys()), lambda: "a" in s):
        with pytest.raises(StoreClosedError):
            call()


OPS = st.lists(st.one_of(
    st.tuples(st.just("update"), st.dictionaries(st.sampled_from(["a", "b", 1, b"a"]), st.integers(), max_size=3)),
    st.tuples(st.just("pop"), st.sampled_from(["a", "b", 1, b"a"])),
    st.tuples(st.just("setdefault"), st.sampled_from(["a", "b", 1, b"a"]), st.integers()),
    st.tuples(st.just("popitem")),
), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_a_store_behaves_as_a_dict_under_any_sequence_of_mixin_calls(
        s: memory.Store, ops: list[tuple[Any, ...]]) -> None:
    s.clear()
    model: dict[object, int] = {}
    for op, *args in ops:
        if op == "popitem":
            if not model:
                with pytest.raises(KeyError):
                    s.popitem()
                continue
            key, value = s.popitem()
            assert model.pop(key) == value
        elif op == "pop":
            assert s.pop(args[0], "none") == model.pop(args[0], "none")
        else:
            assert getattr(s, op)(*args) == getattr(model, op)(*args)
        assert len(s) == len(model) and s.keys() == model.keys() and dict(s.items()) == model
