"""A clock the tests move by hand: the same callable shape as ``time.monotonic``."""

from __future__ import annotations

import threading


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._changed = threading.Condition()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds
            self._changed.notify_all()

    def sleep(self, seconds: float) -> None:
        """For code that sleeps on an injected clock: returns once another thread advanced it by ``seconds``."""
        with self._changed:
            until = self.now + seconds
            self._changed.wait_for(lambda: self.now >= until, timeout=5.0)
