"""A clock the tests move by hand. It implements ``apsi_memory.adapters.clock.Clock`` (the way
``trio.testing.MockClock`` implements trio's ``Clock``), so the library's threads wait on it as on the real one.

A thread in ``wait`` sleeps until the test ``advance``s the clock past its deadline. ``wait_idle`` is how a test
waits for such a thread without sleeping: it returns once the given number of threads are back in ``wait`` with
deadlines still ahead, i.e. every one that was due has woken, done its work and gone back to sleep. With
``autojump=True`` a ``wait`` moves the clock to its own deadline at once (trio's autojump): for code on the test's
own thread, such as ``apsi-memory pressure --watch`` run in-process.
"""

from __future__ import annotations

import itertools
import threading
import time

STOP_POLL_SECONDS = 0.01  # a threading.Event cannot wake a condition: a set ``stop`` is seen within this (real) time


class FakeClock:
    def __init__(self, start: float = 1000.0, autojump: bool = False) -> None:
        self._now = start
        self.autojump = autojump
        self._changed = threading.Condition()
        self._deadlines: dict[int, float] = {}  # the threads in wait(), by ticket
        self._tickets = itertools.count()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self._now += seconds
            self._changed.notify_all()

    def wait(self, seconds: float, stop: threading.Event | None = None) -> bool:
        if self.autojump and stop is None:
            self.advance(seconds)
            return False
        with self._changed:
            ticket, deadline = next(self._tickets), self._now + seconds
            self._deadlines[ticket] = deadline
            self._changed.notify_all()  # a wait_idle may be waiting for this thread to be back asleep
            try:
                while self._now < deadline:
                    if stop is not None and stop.is_set():
                        return True
                    self._changed.wait(STOP_POLL_SECONDS if stop is not None else None)
            finally:
                del self._deadlines[ticket]
                self._changed.notify_all()
        return False

    def wait_idle(self, sleepers: int = 1, timeout: float = 10.0) -> None:
        """Block until ``sleepers`` threads wait on this clock and none of them is due. ``TimeoutError`` after
        ``timeout`` real seconds (a thread that died or never waits), so a broken test fails instead of hanging."""
        give_up = time.monotonic() + timeout
        with self._changed:
            while not self._idle(sleepers):
                left = give_up - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._deadlines)} threads wait on the clock, not {sleepers} idle")
                self._changed.wait(left)

    def _idle(self, sleepers: int) -> bool:
        return len(self._deadlines) == sleepers and all(d > self._now for d in self._deadlines.values())
