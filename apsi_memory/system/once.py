"""``once``: a function that runs the first time it is called, in a thread-safe way, and never again; and
``fork_hooks``, fork hooks registered that way, with ``each`` to run one on every object whatever one of them meets;
``ForkMark``, whether a fork happened since, asked without a system call.

What the library sets up for itself (fork hooks, the at-exit cleanup, reclaiming dead owners' spill files) is
done on first use through this, never at import.
"""

from __future__ import annotations

import mmap
import os
import sys
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


# Linux's MADV_WIPEONFORK (18 in its generic and x86 headers), which Python's mmap module does not name
_WIPEONFORK = getattr(mmap, "MADV_WIPEONFORK", 18) if sys.platform.startswith("linux") else None


class ForkMark:
    """Whether this is still the process that made the mark, with no system call: a private page the kernel zeroes
    in a child at fork (``MADV_WIPEONFORK``, Linux 4.14+), which sees any fork, Python's or a C library's, as
    ``getpid`` does; ``getpid`` itself (a system call on every use) where the kernel has no such page."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._page = _wiped_at_fork()

    def same(self) -> bool:
        page = self._page
        return page[0] == 1 if page is not None else self._pid == os.getpid()


def _wiped_at_fork() -> mmap.mmap | None:
    if _WIPEONFORK is None:
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        page.madvise(_WIPEONFORK)  # EINVAL before Linux 4.14
    except (OSError, ValueError):
        return None
    page[0] = 1
    return page
