"""``once``: a function that runs the first time it is called, in a thread-safe way, and never again; and
``fork_hooks``, fork hooks registered that way, with ``each`` to run one on every object whatever one of them meets.

What the library sets up for itself (fork hooks, the at-exit cleanup, reclaiming dead owners' spill files) is
done on first use through this, never at import.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def once(function: Callable[[], None]) -> Callable[[], None]:
    done = False
    lock = threading.Lock()

    def run_once() -> None:
        nonlocal done
        if done:  # the common case: no lock taken
            return
        with lock:
            if not done:
                function()
                done = True

    run_once.__doc__ = function.__doc__
    return run_once


def fork_hooks(before: Callable[[], None] | None = None, after_in_parent: Callable[[], None] | None = None,
               after_in_child: Callable[[], None] | None = None) -> Callable[[], None]:
    """A function that registers these ``os.register_at_fork`` hooks the first time it is called."""
    hooks = {name: hook for name, hook in (("before", before), ("after_in_parent", after_in_parent),
                                           ("after_in_child", after_in_child)) if hook is not None}
    return once(lambda: os.register_at_fork(**hooks))


def each(items: Iterable[T], action: Callable[[T], None]) -> None:
    """``action`` on every item, even when it fails on some: a fork hook that stopped at its first failure would
    leave the objects after it in the parent's state (sharing the parent's locks). The first failure is raised
    once all ran (the fork machinery prints it)."""
    failure: Exception | None = None
    for item in list(items):
        try:
            action(item)
        except Exception as err:  # noqa: BLE001 - every item must get its turn; the first failure is raised after
            failure = failure or err
    if failure is not None:
        raise failure
