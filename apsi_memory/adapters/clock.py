"""Time, as the library waits on it: the one seam through which tests move time by hand.

``Clock`` is the interface; ``SystemClock`` is the machine's monotonic clock. ``sim.clock.FakeClock`` implements
the same interface (the way ``trio.testing.MockClock`` implements trio's ``Clock``), so the level tracker, the
``on_pressure`` watcher and ``apsi-memory pressure --watch`` run on a fake clock in tests without real sleeps.
"""

from __future__ import annotations

import numbers
import threading
import time
from typing import Any, Protocol

from ..errors import ArgumentTypeError


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    def wait(self, seconds: float, stop: threading.Event | None = None) -> bool:
        """Block until ``seconds`` have passed on this clock or ``stop`` is set; whether ``stop`` ended it."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float, stop: threading.Event | None = None) -> bool:
        if stop is None:
            time.sleep(seconds)
            return False
        return stop.wait(seconds)


def checked_clock(clock: Any, name: str) -> Clock:
    """``clock`` if it can be waited on: one without ``now()`` and ``wait()``, or whose ``now()`` is not a number,
    is an ``ArgumentTypeError`` naming ``name`` now, not a thread that dies on its first wait."""
    if not (callable(getattr(clock, "now", None)) and callable(getattr(clock, "wait", None))):
        raise ArgumentTypeError(f"{name} must have now() and wait(seconds, stop), as "
                                f"apsi_memory.adapters.clock.SystemClock does; {type(clock).__name__} has not")
    now = clock.now()
    if isinstance(now, bool) or not isinstance(now, numbers.Real):
        raise ArgumentTypeError(f"{name}.now() must return a number of seconds, not {type(now).__name__} ({now!r})")
    checked: Clock = clock
    return checked
