"""Damage done to files on disk by the store's tamper and fault tests, in one place."""

from __future__ import annotations


def flip_byte(path: str, at: int, mask: int = 0x01) -> None:
    """XOR the byte at ``at`` of ``path`` with ``mask`` (one bit by default; 0xFF flips all eight)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ mask]))
