"""Stores across ``os.fork``: a child must never start with a store's lock copied taken by a thread that does
not exist there (it would hang on its first use). The hooks are registered when the first store is made."""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from ..system.once import each, fork_hooks

# A fork waits this long for a store another thread is using (so the child gets it in a consistent state).
FORK_WAIT_S = 10.0


class _Locked(Protocol):
    _lock: threading.RLock
    _fork_held: bool


_open_stores: weakref.WeakSet[_Locked] = weakref.WeakSet()


def track(store: _Locked) -> None:
    """Take part in the fork hooks from now on (until ``store`` is garbage-collected)."""
    _register()
    _open_stores.add(store)


def _hold(s: _Locked) -> None:
    s._fork_held = s._lock.acquire(timeout=FORK_WAIT_S)


def _release(s: _Locked) -> None:
    if s._fork_held:
        s._fork_held = False
        s._lock.release()


def _fresh_lock(s: _Locked) -> None:
    s._fork_held = False
    s._lock = threading.RLock()


def _before_fork() -> None:
    """Take every store's lock. Bounded: a store busy past ``FORK_WAIT_S`` gets a fresh lock in the child."""
    each(sorted(_open_stores, key=id), _hold)


def _after_fork_in_parent() -> None:
    each(_open_stores, _release)


def _after_fork_in_child() -> None:
    each(_open_stores, _fresh_lock)


_register = fork_hooks(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
