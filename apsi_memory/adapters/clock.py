"""Time, as the library waits on it: the one seam through which tests move time by hand.

``Clock`` is the interface; ``SystemClock`` is the machine's monotonic clock. ``sim.clock.FakeClock`` implements
the same interface (the way ``trio.testing.MockClock`` implements trio's ``Clock``), so the level tracker, the
``on_pressure`` watcher and ``apsi-memory pressure --watch`` run on a fake clock in tests without real sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


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
