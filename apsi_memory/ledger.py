"""The running total of RAM that ``memory.array`` currently holds (arrays placed in RAM, not spill files).

``budget()`` counts it back into "free" (see ``decide.default_budget``) and placement subtracts it from the budget,
so the two stay consistent as arrays come and go. A running total, not a scan, so ``array()`` stays O(1)."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_held = 0


def add(n_bytes: int) -> None:
    global _held
    with _lock:
        _held += n_bytes


def remove(n_bytes: int) -> None:
    global _held
    with _lock:
        _held = max(0, _held - n_bytes)


def held() -> int:
    return _held
