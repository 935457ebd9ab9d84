"""The running total of RAM that ``memory.array`` currently holds (arrays placed in RAM, not spill files).

``budget()`` counts it back into "free" (see ``decide.default_budget``) and placement subtracts it from the budget,
so the two stay consistent as arrays come and go. A running total, not a scan, so ``array()`` stays O(1). Each
``Machine`` keeps one; an array gives its bytes back to the ledger it was counted in."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Ledger:
    """``changed(held)`` is told the new total after each change (the machine publishes it to the siblings)."""

    def __init__(self, changed: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._changed = changed

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self._held += n_bytes
        if self._changed is not None:
            self._changed(self._held)

    def remove(self, n_bytes: int) -> None:
        with self._lock:
            self._held = max(0, self._held - n_bytes)
        if self._changed is not None:
            self._changed(self._held)

    def held(self) -> int:
        return self._held
