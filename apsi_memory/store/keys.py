"""Store keys and entry names, pure.

A key is a ``str``, an ``int`` or ``bytes``; it is kept as a type tag and its bytes, so ``1``, ``"1"`` and
``b"1"`` are three keys, and it is never used as a file name. An entry's name is a random 16-hex-digit stem (new
on every ``set``), plus ``.pkl`` or ``.npy`` for a value with a file of its own under ``data/``; a name read back
from disk is used only after ``is_stem``/``is_data_name`` accepted it.
"""

from __future__ import annotations

import os

from ..errors import ArgumentTypeError

Key = str | int | bytes

KIND_PICKLE, KIND_NPY_READ, KIND_NPY_MAP = 0, 1, 2
EXT = {KIND_PICKLE: ".pkl", KIND_NPY_READ: ".npy", KIND_NPY_MAP: ".npy"}
NAME_BYTES = 16
_HEX = b"0123456789abcdef"


def encode_key(key: Key) -> bytes:
    """A type tag and the key's bytes: ``1``, ``"1"`` and ``b"1"`` are three keys. Never used as a file name."""
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + str(key).encode("ascii")
    raise ArgumentTypeError(f"store keys are str, int or bytes, not {type(key).__name__}")


def decode_key(encoded: bytes) -> Key:
    tag, body = encoded[:1], encoded[1:]
    if tag == b"s":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"b":
        return body
    return int(body)


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
