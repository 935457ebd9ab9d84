"""The fast paths of issue 14 keep the store's guarantees: the cheaper MAC still binds store, key and version,
and entries signed the previous way read as misses with one ``OldEntryWarning``."""

from __future__ import annotations

import warnings
from pathlib import Path

import apsi_memory as memory
from apsi_memory import signing
from apsi_memory.errors import OldEntryWarning
from apsi_memory.store import encode_key

BIG = {"payload": "x" * 40_000}  # over the inline limit: a file of its own


def data_path(s: memory.Store, key: str) -> Path:
    return Path(s.folder) / "data" / s._index.entries[encode_key(key)].name


def test_entries_signed_with_the_previous_hmac_are_misses_with_one_warning(home):
    s = memory.store("t")
    for key in ("x", "y"):
        s.set(key, BIG)
        path = data_path(s, key)
        payload = path.read_bytes()[:-32]
        version = path.name[:16].encode()
        path.write_bytes(payload + signing.sign(s._seal.store_key, b"P", encode_key(key), version, payload))
    reader = memory.store("t", ram_mb=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reader.get("x") is None and reader.get("y") is None
    assert [type(w.message) for w in caught] == [OldEntryWarning]
    assert "x" not in memory.store("t")


def test_the_mac_binds_every_part_and_the_key():
    key, parts = b"k" * 32, (b"P", b"skey", b"0123456789abcdef", b"value")
    signature = signing.mac(key, *parts)
    assert signing.mac_verify(key, signature, *parts)
    assert not signing.mac_verify(b"j" * 32, signature, *parts)
    assert not signing.mac_verify(key, signature, b"P", b"skey", b"0123456789abcdef", b"valuf")
    assert not signing.mac_verify(key, signature, b"P", b"ske", b"y0123456789abcdef", b"value")  # framed
    big = b"v" * (1 << 20)  # hashed in parts, not joined: the same framing
    assert signing.mac_verify(key, signing.mac(key, b"M", big), b"M", memoryview(big))
