"""on_pressure and relieve, on the simulated container with a fake clock: the watcher thread waits on the
machine's clock, and ``clock.wait_idle()`` returns once it has done what was due and waits again (no real sleeps)."""

from __future__ import annotations

import threading

import pytest

import apsi_memory as memory
from apsi_memory.arrays.pools import Pool
from apsi_memory.decide import Level
from apsi_memory.machinery.watcher import Watcher, next_call
from sim.tree import MiB

# -- the timing rule ------------------------------------------------------------------------------------------------

def test_next_call_calls_once_per_repeat_while_the_level_lasts_and_afresh_after_it_ends():
    high, threshold, repeat = Level.HIGH, Level.HIGH, 10.0
    assert next_call(Level.MODERATE, threshold, None, 0.0, repeat) == (False, None)
    assert next_call(high, threshold, None, 0.0, repeat) == (True, 0.0)
    assert next_call(Level.CRITICAL, threshold, 0.0, 9.9, repeat) == (False, 0.0)
    assert next_call(high, threshold, 0.0, 10.0, repeat) == (True, 10.0)
    assert next_call(Level.OK, threshold, 10.0, 11.0, repeat) == (False, None)  # the stretch ends
    assert next_call(high, threshold, None, 12.0, repeat) == (True, 12.0)  # a new one calls at once


# -- the watcher on the simulated container ------------------------------------------------------------------------

def test_fn_gets_the_reading_when_the_level_is_reached_then_every_repeat_seconds(pressure_machine):
    seen = []
    w = Watcher(seen.append, level="high", every=1, repeat=10)
    w.check()
    assert seen == []
    pressure_machine.at(Level.CRITICAL)  # "high" means high or worse
    w.check()
    assert [str(p.level) for p in seen] == ["critical"] and seen[0].free_bytes < 0.05 * 256 * MiB
    pressure_machine.clock.advance(9)
    w.check()
    assert len(seen) == 1
    pressure_machine.clock.advance(1)
    w.check()
    assert len(seen) == 2
    pressure_machine.at(Level.MODERATE)
    w.check()
    pressure_machine.at(Level.HIGH)
    w.check()
    assert len(seen) == 3  # back above after a pause: at once, not after repeat


def test_the_thread_reads_every_seconds_of_its_clock_and_stops_promptly(pressure_machine):
    calls = []
    clock = pressure_machine.clock
    pressure_machine.at(Level.HIGH)
    w = Watcher(calls.append, every=1, repeat=2).start()  # the installed machine's clock
    clock.wait_idle()
    assert (w.checks, len(calls)) == (1, 1)
    clock.advance(0.5)
    clock.wait_idle()
    assert w.checks == 1  # not due yet
    clock.advance(0.5)
    clock.wait_idle()
    assert (w.checks, len(calls)) == (2, 1)  # read, but the repeat (2 s) is not over
    clock.advance(1)
    clock.wait_idle()
    assert (w.checks, len(calls)) == (3, 2)
    w.stop()
    assert not w.running


def test_on_pressure_watches_the_real_readings_in_the_background(pressure_machine):
    seen = []
    w = memory.on_pressure(seen.append, level="high", every=5)
    try:
        pressure_machine.clock.wait_idle()
        assert seen == []
        pressure_machine.at(Level.HIGH)
        pressure_machine.clock.advance(5)
        pressure_machine.clock.wait_idle()
    finally:
        w.stop()
    assert [str(p.level) for p in seen] == ["high"]
    assert not w.running and "stopped" in repr(w)


def test_the_watcher_hears_stalls_end_to_end(pressure_machine):
    """PSI alone (memory use unchanged): ``some`` 45 % is critical, and back at 0 % the stretch ends."""
    seen = []
    w = memory.on_pressure(seen.append, level="critical", every=1, repeat=60)
    try:
        pressure_machine.clock.wait_idle()
        pressure_machine.stalls(some=45.0, full=2.0)
        pressure_machine.clock.advance(1)
        pressure_machine.clock.wait_idle()
        pressure_machine.stalls(some=0.0, full=0.0)
        pressure_machine.clock.advance(1)
        pressure_machine.clock.wait_idle()
    finally:
        w.stop()
    assert [(str(p.level), p.some, p.full, p.free_fraction) for p in seen] == [("critical", 45.0, 2.0, 1.0)]
    assert w.checks == 3 and memory.current_level() is Level.OK


def test_the_watcher_tells_the_components_without_any_allocation(pressure_machine):
    p = Pool(64 * MiB)
    p.give(p.take(MiB // 8, zero=False))
    pressure_machine.at(Level.HIGH)
    Watcher(lambda _: None, level="critical").check()  # fn not due; the level still counts
    assert p.spares == 0


def test_a_failing_fn_is_reported_and_the_watcher_keeps_watching(pressure_machine, monkeypatch):
    reported = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    attempts = []

    def fails(_reading: object) -> None:
        attempts.append(1)
        raise RuntimeError("shrinking the batch failed")

    pressure_machine.at(Level.HIGH)
    w = Watcher(fails, every=1, repeat=1).start()
    pressure_machine.clock.wait_idle()
    assert len(attempts) == 1
    pressure_machine.clock.advance(1)
    pressure_machine.clock.wait_idle()
    assert len(attempts) == 2
    w.stop()
    assert [str(r.exc_value) for r in reported] == ["shrinking the batch failed"] * 2


@pytest.mark.parametrize("kwargs,error,names", [
    ({"level": "severe"}, ValueError, "severe"),
    ({"every": 0}, ValueError, "every"),
    ({"repeat": -1}, ValueError, "repeat"),
])
def test_bad_settings_are_clear_errors(kwargs, error, names):
    with pytest.raises(error, match=names):
        memory.on_pressure(print, **kwargs)


def test_on_pressure_needs_a_function():
    with pytest.raises(TypeError, match="function"):
        memory.on_pressure("print")  # type: ignore[arg-type]


# -- relieve ----------------------------------------------------------------------------------------------------------

def test_relieve_asks_every_registered_component(pressure_machine):
    class Cache:
        relieved = 0

        def on_level(self, level: Level) -> None:
            pass

        def relieve(self) -> None:
            self.relieved += 1

    cache = Cache()
    memory.machine().components.register(cache)
    memory.relieve()
    assert cache.relieved == 1
