"""A Ctrl-C that is not lost: Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal is
handled, and one raised inside a finalizer (``__del__``, a weakref callback) is printed as 'Exception ignored' and
dropped. A loop that drops objects with finalizers on the main thread (a dask ``Future`` per finished block) then
runs on after Ctrl-C. ``interrupts_kept`` remembers each SIGINT so the loop can raise it at its next check."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def interrupts_kept() -> Iterator[Callable[[], None]]:
    """Yields ``check()``, which raises ``KeyboardInterrupt`` once for the SIGINTs that came since the block began
    or since it last raised, swallowed or not; leaving the block normally checks once more. Where Python's own
    handler is not the one installed (the program chose its own) or this is not the main thread (which alone may
    set handlers), nothing changes."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield _nothing
        return
    seen: list[int] = []

    def remember(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        signal.default_int_handler(signum, frame)

    def check() -> None:
        if seen:
            seen.clear()  # raised once: the caller has it now
            signal.default_int_handler(signal.SIGINT, None)  # Python's own KeyboardInterrupt

    signal.signal(signal.SIGINT, remember)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    check()


def _nothing() -> None:
    """``check`` where interrupts are Python's to deliver."""
