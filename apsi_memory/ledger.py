"""The running total of RAM that ``memory.array`` currently holds (arrays placed in RAM, not spill files).

``budget()`` counts it back into "free" (see ``decide.default_budget``) and placement subtracts it from the budget,
so the two stay consistent as arrays come and go. A running total, not a scan, so ``array()`` stays O(1). Each
``Machine`` keeps one; an array gives its bytes back to the ledger it was counted in."""

from __future__ import annotations

import threading


class Ledger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self._held += n_bytes

    def remove(self, n_bytes: int) -> None:
        with self._lock:
            self._held = max(0, self._held - n_bytes)

    def held(self) -> int:
        return self._held
