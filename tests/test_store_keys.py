"""Issue 20 item 5: store keys are encoded by an explicit rule (the tag byte names it), never by a key's own
``str()``: a key is what it equals, as in a dict, and one that cannot be encoded exactly is refused by name."""

from __future__ import annotations

import enum
import sys
import warnings

import pytest

import apsi_memory as memory
from apsi_memory.errors import ArgumentError, ArgumentTypeError, OldEntryWarning
from apsi_memory.store import decode_key, encode_key


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class Liar(int):
    """An int whose ``str()`` is another number."""

    def __str__(self) -> str:
        return "5"


class Words(int):
    """An int whose ``str()`` is not a number at all."""

    def __str__(self) -> str:
        return "not a number"


class Shouting(str):
    def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        return b"SHOUT"


class Backwards(bytes):
    def __radd__(self, other: object) -> bytes:
        return b"reversed"


def test_int_subclasses_are_their_value_whatever_their_str_says():
    s = memory.store("t")
    s[Liar(3)] = "three"
    s[5] = "five"
    s[Words(7)] = "seven"
    s[Color.BLUE] = "blue"
    assert (s[3], s[5], s[7], s[2]) == ("three", "five", "seven", "blue"), "distinct keys stay distinct"
    assert sorted(s) == [2, 3, 5, 7], "every key reads back (list(store) raised for Words before)"
    assert all(type(key) is int for key in s)


def test_an_int_enum_key_is_its_value_on_every_python_version():
    assert encode_key(Color.RED) == encode_key(1) == b"i1"


def test_str_and_bytes_subclasses_are_their_value():
    assert encode_key(Shouting("a")) == encode_key("a") == b"sa"
    assert encode_key(Backwards(b"a")) == encode_key(b"a") == b"ba"


@pytest.mark.parametrize("key", [True, 1.0, None, bytearray(b"a"), ("a",)])
def test_keys_of_other_types_are_refused_by_name(key):
    with pytest.raises(ArgumentTypeError, match=type(key).__name__):
        memory.store("t").set(key, 1)


def test_an_int_too_long_to_encode_exactly_is_refused_by_name():
    if not hasattr(sys, "get_int_max_str_digits"):
        pytest.skip("Python < 3.11 has no limit on int to str conversion")
    huge = 10 ** (sys.get_int_max_str_digits() + 1)
    with pytest.raises(ArgumentError, match="digits"):
        memory.store("t").set(huge, 1)


def test_rule_one_is_what_older_stores_wrote():
    """Stored keys of an older store still read: str, bytes and int encode as they always did."""
    assert [encode_key(k) for k in ("é", b"\x00", -12, 0)] == [b"s\xc3\xa9", b"b\x00", b"i-12", b"i0"]
    assert [decode_key(k) for k in (b"s\xc3\xa9", b"b\x00", b"i-12", b"i0")] == ["é", b"\x00", -12, 0]


def test_a_key_an_older_version_wrote_from_a_custom_str_is_skipped_with_a_warning(monkeypatch):
    """Older versions wrote ``str()`` of int subclasses: such a key can never be named again. Before the fix it
    made ``list(store)`` raise ``ValueError`` until it was deleted; now it is skipped, warned of and removed."""
    store_module = sys.modules["apsi_memory.store.core"]  # the module, not the function of that name
    s = memory.store("t")
    s["kept"] = 1
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "encode_key", lambda key: b"i" + str(key).encode())  # the old rule
        s[Words(7)] = "seven"
    with pytest.warns(OldEntryWarning, match="cannot be named"):
        assert list(memory.store("t")) == ["kept"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(memory.store("t")) == ["kept"], "removed for every process: warned once"
