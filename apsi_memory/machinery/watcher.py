"""``memory.on_pressure`` (a background watcher) and ``memory.relieve`` (give cached RAM back now).

The library itself needs no thread: allocation paths re-measure the level at most twice a second. A watcher is for
programs that want to act themselves (shrink a batch, pause a producer): a daemon thread reads the pressure every
``every`` seconds of the machine's clock (a test's ``FakeClock`` drives it without real sleeps), feeds the level
to the registered components like an allocation path would, and calls ``fn`` with the reading when the level
reaches ``level`` — again every ``repeat`` seconds while it lasts, and afresh once it has dropped below and comes
back.

Where the kernel offers PSI triggers (Linux 5.2; the group's ``memory.pressure``, else ``/proc/pressure/memory``)
and the watcher reads the machine's own clock, it also wakes as soon as tasks have stalled for memory 15 % of the
last second (``adapters.psi.open_trigger``), so a reaction — an array moving before the kernel kills — is not up to
``every`` seconds late; ``triggered`` counts those wake-ups.

An exception raised by ``fn`` (or by a reading) goes to ``threading.excepthook`` — printed to stderr by default —
and the watcher keeps watching.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import os
import select
import sys
import threading
from collections.abc import Callable

from ..adapters.clock import Clock, SystemClock, checked_clock
from ..adapters.psi import open_trigger
from ..adapters.root import under
from ..decide import Level
from ..errors import ArgumentTypeError
from ..system import libc, uffd
from ..units import seconds
from .machines import machine
from .reading import Pressure


def next_call(level_now: Level, threshold: Level, last_call: float | None, now: float,
              repeat: float) -> tuple[bool, float | None]:
    """For one reading: whether ``fn`` is called, and when it was last called during this stretch afterwards.

    Called when the level is reached and ``fn`` was not called yet in this stretch (``last_call`` is ``None``) or
    ``repeat`` seconds ago or more; a reading below the threshold ends the stretch."""
    if level_now < threshold:
        return False, None
    if last_call is None or now - last_call >= repeat:
        return True, now
    return False, last_call


class Watcher:
    """Calls ``fn(reading)`` from a daemon thread while the pressure level is at ``level`` or above.

    It reads and waits on the machine installed when it was made (``machine()``) unless given ``read``/``clock``."""

    def __init__(self, fn: Callable[[Pressure], object], level: Level | str = Level.HIGH, every: float = 1.0,
                 repeat: float = 10.0, read: Callable[[], Pressure] | None = None,
                 clock: Clock | None = None) -> None:
        if not callable(fn):
            raise ArgumentTypeError(f"on_pressure needs a function to call, not {type(fn).__name__}")
        self.fn = fn
        self.level = Level.parse(level)
        self.every = seconds(every, "on_pressure: every")
        self.repeat = seconds(repeat, "on_pressure: repeat")
        watched = machine()
        if read is not None and not callable(read):
            raise ArgumentTypeError(f"on_pressure: read must be a function returning a Pressure, not "
                                    f"{type(read).__name__}")
        self.read = read or watched.pressure  # a reading also tells the components of a new level
        self.clock = watched.clock if clock is None else checked_clock(clock, "on_pressure: clock")
        # Triggers wake on the real clock only, for the machine's own readings (a test's fake clock drives them).
        self._trigger_on = watched if read is None and clock is None and isinstance(self.clock, SystemClock) else None
        self._wake: tuple[int, int, int] | None = None  # the trigger, and a pipe stop() writes to, while polled
        self._wake_lock = threading.Lock()
        self.triggered = 0  # wake-ups by a PSI trigger
        self.checks = 0  # readings taken
        self.calls = 0  # calls of fn
        self._last_call: float | None = None
        self._stopped = threading.Event()
        # In the context it was made in: ``fn`` calling ``memory.*`` uses the machine its ``with m.use():`` chose.
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,),
                                        name=f"apsi-on-pressure-{self.level}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def check(self) -> bool:
        """One reading: call ``fn`` if it is due. Returns whether it was called."""
        reading = self.read()
        self.checks += 1
        call, self._last_call = next_call(reading.level, self.level, self._last_call, self.clock.now(), self.repeat)
        if call:
            self.calls += 1
            with uffd.quiet(False):  # the user's function may write to arrays
                self.fn(reading)
        return call

    def _run(self) -> None:
        self._open_trigger()
        # Waiting and reading, it writes to no array: an array may move without write protection meanwhile.
        with uffd.quiet():
            try:
                while not self._stopped.is_set():
                    self._check_and_report()
                    if self._wait():
                        return
            finally:
                self._close_trigger()

    def _open_trigger(self) -> None:
        """A PSI trigger on the file the machine reads stalls from, and the pipe that ends a poll of it."""
        watched = self._trigger_on
        psi = watched.memory().psi if watched is not None else None
        if watched is not None and psi is not None:
            trigger = open_trigger(under(watched.root, psi.source))
            if trigger is not None:
                with self._wake_lock:
                    self._wake = (trigger, *os.pipe())

    def _close_trigger(self) -> None:
        with self._wake_lock:  # stop() writes to the pipe under the lock: never to a number reused since
            for fd in self._wake or ():
                os.close(fd)
            self._wake = None

    def _wait(self) -> bool:
        """Wait ``every`` seconds, or less when the trigger fires; whether the watcher was stopped. A trigger that
        reports an error (its file went away) is closed, and the watcher waits on the clock from then on."""
        if self._wake is None:
            return self.clock.wait(self.every, self._stopped)
        trigger, woken, _ = self._wake
        poller = select.poll()
        poller.register(trigger, select.POLLPRI)
        poller.register(woken, select.POLLIN)
        events = dict(poller.poll(self.every * 1000)).get(trigger, 0)
        if events & (select.POLLERR | select.POLLNVAL):
            self._close_trigger()
        elif events & select.POLLPRI:
            self.triggered += 1
        return self._stopped.is_set()

    def _check_and_report(self) -> None:
        try:
            self.check()
        except Exception:  # noqa: BLE001 - the watcher must outlive a failing callback; the error is still shown
            threading.excepthook(threading.ExceptHookArgs((*sys.exc_info(), self._thread)))

    def stop(self, timeout: float = 5.0) -> None:
        """End the watcher; returns once its thread has finished (at once, unless ``fn`` is running: then at most
        ``timeout`` seconds)."""
        self._stopped.set()
        with self._wake_lock, contextlib.suppress(OSError):
            if self._wake is not None:
                os.write(self._wake[2], b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (f"<on_pressure {state}: level {self.level}, every {self.every:g} s, repeat {self.repeat:g} s, "
                f"{self.calls} calls>")


def on_pressure(fn: Callable[[Pressure], object], level: Level | str = "high", every: float = 1,
                repeat: float = 10) -> Watcher:
    """Start a background watcher that calls ``fn(pressure)`` when the level reaches ``level`` (checked every
    ``every`` seconds), again every ``repeat`` seconds while it lasts. ``.stop()`` ends it."""
    return Watcher(fn, level, every, repeat).start()


# -- relieve -----------------------------------------------------------------------------------------------------

def relieve() -> None:
    """Give cached RAM back now: pools' spare buffers (and stores' RAM tiers), then a garbage collection, then
    glibc's ``malloc_trim(0)``, which returns freed heap pages to the kernel (where the C library is glibc)."""
    machine().components.relieve()
    gc.collect()
    libc.malloc_trim(0)
