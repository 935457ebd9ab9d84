"""This process's ledger entries (``reservations.Siblings``) at a fork and at exit: a child closes its copies of the
parent's descriptors at once, and every entry leaves its ledgers at exit, so the last user of a file removes it.
Both hooks are registered on first use (``Siblings._file``), never at import."""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

from ..system.once import each, fork_hooks, once

# Every ledger entry (``reservations.Siblings``) of this process; Any, as reservations imports this module.
instances: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The child's copies of the parent's descriptors share the parent's locks: closed at once, so the parent's
    slot is freed when the parent dies even while the child runs on."""
    for siblings in list(instances):
        siblings._lock = threading.RLock()  # a parent's thread may have held it at the fork
        siblings._forget()


close_in_children = fork_hooks(after_in_child=_after_fork_in_child)


@once
def leave_at_exit() -> None:
    """At exit every entry leaves its ledgers, so the last user of a file removes it (registered on first use)."""
    atexit.register(lambda: each(list(instances), _close_unless_busy))


def _close_unless_busy(siblings: Any) -> None:
    if siblings._lock.acquire(blocking=False):  # a thread stuck inside it must not hold up the exit
        try:
            siblings.close()
        finally:
            siblings._lock.release()
