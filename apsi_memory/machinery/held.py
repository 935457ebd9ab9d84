"""The running total of RAM that ``memory.array`` currently holds (arrays placed in RAM, not spill files).

``budget()`` counts it back into "free" (see ``decide.default_budget``) and placement subtracts it from the budget,
so the two stay consistent as arrays come and go. A running total, not a scan, so ``array()`` stays O(1). Each
``Machine`` keeps one; an array gives its bytes back to the ledger it was counted in.

Each change is told to ``changed`` (the siblings' ledger), which must end up told the newest total: one thread
tells at a time, outside the lock, and goes on telling while the total changed meanwhile. A change made while
another thread tells (or from inside ``changed`` itself, as a garbage-collected array's ``free`` can) is left to
that teller. Telling each change's own total instead let a slower thread tell an older total last: two threads'
arrays, and the siblings read the first one's bytes only."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from ..system.once import each, fork_hooks


class Ledger:
    """``changed(held)`` is told the new total after each change (the machine publishes it to the siblings)."""

    def __init__(self, changed: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._changed = changed
        self._telling = False  # a thread is in changed(): others leave their changes to it
        self._stale = False  # the total changed since that thread read it
        _set_up_fork()
        _ledgers.add(self)

    def add(self, n_bytes: int) -> None:
        self._change(n_bytes)

    def remove(self, n_bytes: int) -> None:
        self._change(-n_bytes)

    def held(self) -> int:
        return self._held

    def _change(self, n_bytes: int) -> None:
        with self._lock:
            self._held = held = max(0, self._held + n_bytes)
            if self._changed is None:
                return
            if self._telling:
                self._stale = True
                return
            self._telling, self._stale = True, False
        self._tell(self._changed, held)

    def _tell(self, changed: Callable[[int], None], held: int) -> None:
        """Tell ``held`` (read under the lock that made this thread the teller), then each newer total."""
        try:
            while True:
                changed(held)
                with self._lock:
                    if not self._stale:
                        self._telling = False
                        return
                    held, self._stale = self._held, False
        except BaseException:
            with self._lock:
                self._telling = False
            raise

    def _fresh_in_child(self) -> None:
        # a thread of the parent telling at the fork left these taken; none of the child's would ever free them
        self._lock = threading.Lock()
        self._telling = self._stale = False


_ledgers: weakref.WeakSet[Ledger] = weakref.WeakSet()
_set_up_fork = fork_hooks(after_in_child=lambda: each(list(_ledgers), Ledger._fresh_in_child))
