"""The level tracker: overlapping readings publish in the order they started (issue 9, item 15)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from apsi_memory.decide import Level
from apsi_memory.machinery.tracker import RECHECK_SECONDS, Components, LevelTracker
from sim.clock import FakeClock
from sim.components import Heard


def tracker_telling(heard: Heard, measure: Callable[[Level], Level]) -> tuple[LevelTracker, FakeClock]:
    """A tracker on a fake clock whose changes reach ``heard`` only."""
    components, clock = Components(), FakeClock()
    components.register(heard)
    return LevelTracker(measure, clock, components.notify), clock


def test_a_slow_older_reading_does_not_overwrite_a_newer_one():
    """The first reading (``high``) blocks until a second, newer one (``ok``) has been published; when it then
    finishes it must be dropped: the level stays ``ok`` and no component is told ``high``."""
    started, release = threading.Event(), threading.Event()
    readings = iter([Level.HIGH, Level.OK])

    def measure(previous: Level) -> Level:
        level = next(readings)
        if level is Level.HIGH:  # the older reading: slow
            started.set()
            assert release.wait(10), "the test never released the older reading"
        return level

    heard = Heard()
    tracker, clock = tracker_telling(heard, measure)
    older = threading.Thread(target=tracker.current)
    older.start()
    assert started.wait(10)
    clock.advance(RECHECK_SECONDS)
    assert tracker.current() is Level.OK  # the newer reading, published first
    release.set()
    older.join(10)
    assert not older.is_alive()
    assert tracker.level is Level.OK
    assert heard.levels == []
    assert tracker.measurements == 2


def test_readings_taken_elsewhere_publish_in_ticket_order():
    """``pressure()`` reads outside the tracker: its ticket, taken before the reading, orders it the same way."""
    heard = Heard()
    tracker, _ = tracker_telling(heard, lambda previous: Level.OK)
    old_ticket, _ = tracker.begin()
    new_ticket, _ = tracker.begin()
    assert tracker.publish(new_ticket, Level.CRITICAL) is Level.CRITICAL
    assert tracker.publish(old_ticket, Level.OK) is Level.CRITICAL
    assert heard.levels == [Level.CRITICAL]


def test_crossing_announcements_end_with_the_newest_level():
    """A component still being told ``high`` (slow) when a newer ``ok`` is announced hears ``ok`` last."""
    telling, release = threading.Event(), threading.Event()

    class Slow(Heard):
        def on_level(self, level: Level) -> None:
            if level is Level.HIGH and not telling.is_set():
                telling.set()
                assert release.wait(10), "the test never released the first announcement"
            super().on_level(level)

    heard = Slow()
    tracker, _ = tracker_telling(heard, lambda previous: Level.OK)
    first, _ = tracker.begin()
    announcing = threading.Thread(target=tracker.publish, args=(first, Level.HIGH))
    announcing.start()
    assert telling.wait(10)
    second, _ = tracker.begin()
    tracker.publish(second, Level.OK)
    release.set()
    announcing.join(10)
    assert not announcing.is_alive()
    assert heard.levels[-1] is Level.OK
    assert tracker.level is Level.OK
