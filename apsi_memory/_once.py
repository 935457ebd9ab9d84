"""``once``: a function that runs the first time it is called, in a thread-safe way, and never again.

What the library sets up for itself (fork hooks, the at-exit cleanup, reclaiming dead owners' spill files) is
done on first use through this, never at import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


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
