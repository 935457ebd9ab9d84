"""Store keys and entry names, pure.

A key is a ``str``, an ``int`` or ``bytes``; it is kept as a type tag and its bytes, so ``1``, ``"1"`` and
``b"1"`` are three keys, and it is never used as a file name. An entry's name is a random 16-hex-digit stem (new
on every ``set``), plus ``.pkl`` or ``.npy`` for a value with a file of its own under ``data/``; a name read back
from disk is used only after ``is_stem``/``is_data_name`` accepted it.

The key rule, version 1 (the tag byte names the rule, so a later rule takes new tags and journals written under
this one keep reading): ``s`` + the UTF-8 of the string (lone surrogates kept, ``surrogatepass``), ``b`` + the
bytes, ``i`` + the canonical decimal of the integer (``-`` for negatives, no leading zeros). A subclass of one of
the three is encoded by its value, through the built-in type's own methods, never its own ``__str__``: a key is
what it equals, as in a dict (``IntEnum.RED`` is ``1``, on every Python), and reads back as the built-in type.
``bool`` is refused (``True`` would silently be ``1``), and so is an int longer than Python converts to decimal.
"""

from __future__ import annotations

import os
import re
import sys

from ..errors import ArgumentError, ArgumentTypeError

Key = str | int | bytes

KIND_PICKLE, KIND_NPY_READ, KIND_NPY_MAP = 0, 1, 2
EXT = {KIND_PICKLE: ".pkl", KIND_NPY_READ: ".npy", KIND_NPY_MAP: ".npy"}
NAME_BYTES = 16
_HEX = b"0123456789abcdef"
_DECIMAL = re.compile(rb"0|-?[1-9][0-9]*")


class OldKey(ValueError):
    """A key an older version wrote from an int subclass's own ``str()``: no key encodes to it any more."""


def encode_key(key: Key) -> bytes:
    """Key rule 1 (module docstring). Never used as a file name."""
    kind = type(key)
    if kind is str:  # the three exact types first: this runs on every get and set
        return b"s" + key.encode("utf-8", "surrogatepass")  # type: ignore[union-attr]
    if kind is bytes:
        return b"b" + key  # type: ignore[operator]
    if kind is int:
        return b"i" + _decimal(key)  # type: ignore[arg-type]
    return _encode_subclass(key)


def _encode_subclass(key: object) -> bytes:
    if isinstance(key, str):
        return b"s" + str.encode(key, "utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return bytes.__add__(b"b", key)  # not ``+``: a subclass's ``__radd__`` would run first
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + _decimal(key)
    raise ArgumentTypeError(f"store keys are str, int or bytes, not {type(key).__name__}")


def _decimal(key: int) -> bytes:
    try:
        return int.__repr__(key).encode("ascii")  # int's own: a subclass's __str__/__repr__ never runs
    except ValueError as err:  # Python's limit on int to str conversion (sys.set_int_max_str_digits)
        raise ArgumentError(f"an int key of more than {sys.get_int_max_str_digits()} digits cannot be encoded; "
                            "use bytes (key.to_bytes(...)) or a str") from err


def decode_key(encoded: bytes) -> Key:
    """The key ``encode_key`` made ``encoded`` from; ``OldKey`` for an int key no rule-1 key encodes to."""
    tag, body = encoded[:1], encoded[1:]
    if tag == b"s":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"b":
        return body
    if not _DECIMAL.fullmatch(body):
        raise OldKey(f"key {encoded!r} was written by an older apsi_memory from an int subclass's own str()")
    return int(body)


def shown_key(encoded: bytes) -> Key:
    """The key as a message shows it: decoded, or its stored bytes when no key encodes to them."""
    try:
        return decode_key(encoded)
    except OldKey:
        return encoded


def new_stem() -> str:
    """A fresh entry name: random, so a file is never overwritten and every version signs differently."""
    return os.urandom(NAME_BYTES // 2).hex()


def is_stem(stem: bytes) -> bool:
    """The form ``new_stem`` makes (read back from the journal)."""
    return len(stem) == NAME_BYTES and not stem.translate(None, _HEX)  # nothing left once the digits are gone


def is_data_name(name: str) -> bool:
    """A file name under ``data/`` that a writer makes."""
    return len(name) == NAME_BYTES + 4 and name[NAME_BYTES:] in (".pkl", ".npy") and is_stem(
        name[:NAME_BYTES].encode("ascii", "replace"))
