"""The pressure level over time: who hears of a change (``Components``) and when it is re-measured
(``LevelTracker``). Each ``Machine`` owns one of each (``machine().components`` is the default machine's).

A component implements ``on_level(level)`` (called when the level changes: shrink at ``high``, empty at
``critical``, grow back at ``ok``) and ``relieve()`` (give cached RAM back now). It registers once; the registry
holds it weakly, so registering never keeps a pool or store alive.

The level itself is re-measured lazily, at most twice a second, on allocation paths (``current_level()``), and by
the ``on_pressure`` watcher thread; both publish here, and a change is told to each component once.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from ..adapters.clock import Clock
from ..decide import Level, Relief, in_relief_order, ram_tier_limit
from ..logs import logger
from ..system.once import each, fork_hooks

# Documented logger names (README, "What it logs"): level changes, and what each component did about one; each
# logger is made where it logs (``logs.logger``), so that a store or reading that logs nothing never imports logging.
LEVEL_LOG = "apsi_memory.pressure"
REACTION_LOG = "apsi_memory.reactions"


class Component(Protocol):
    def on_level(self, level: Level) -> None: ...

    def relieve(self) -> None: ...


class _Locked(Protocol):
    _lock: threading.Lock


_with_locks: weakref.WeakSet[_Locked] = weakref.WeakSet()  # every Components and LevelTracker, for the fork hook


def _fresh_lock(holder: _Locked) -> None:
    holder._lock = threading.Lock()


def _fresh_locks_in_child() -> None:
    """A fork while another thread held one of these locks (registering a component, publishing a level) copies it
    taken, and no thread of the child would ever release it: the child's first big array would wait forever. The
    child gets free ones (nothing was half changed under them: each guards a few assignments)."""
    each(list(_with_locks), _fresh_lock)


_set_up_fork = fork_hooks(after_in_child=_fresh_locks_in_child)


def _fork_safe(holder: _Locked) -> None:
    _set_up_fork()
    _with_locks.add(holder)


class Components:
    """The components of one machine, held weakly."""

    def __init__(self) -> None:
        self._members: weakref.WeakSet[Component] = weakref.WeakSet()
        self._lock = threading.Lock()
        _fork_safe(self)

    def register(self, component: Component) -> None:
        with self._lock:
            self._members.add(component)

    def unregister(self, component: Component) -> None:
        with self._lock:
            self._members.discard(component)

    def all(self) -> list[Component]:
        with self._lock:
            return list(self._members)

    def notify(self, level: Level, previous: Level = Level.OK) -> None:
        """Tell every component the new level; at ``critical`` also collect garbage (the SPEC's last resort). What a
        component does differently from the previous level is logged (INFO, ``apsi_memory.reactions``). Pools hear
        first, then stores, then the arrays' mover (``decide.in_relief_order``), so arrays move only for what the
        others could not give back."""
        for component in in_relief_order(self.all(), relief_stage):
            component.on_level(level)
            taken = reaction(component, level)
            if taken is not None and taken != reaction(component, previous):
                logger(REACTION_LOG).info("%s at %s", taken, level)
        if level >= Level.CRITICAL:
            gc.collect()

    def relieve(self) -> None:
        for component in self.all():
            component.relieve()

    def hear(self, level: Level) -> None:
        """Every published reading, changed or not, for the components that act while a level lasts (the arrays'
        mover: memory may keep running out at ``high`` without the level changing)."""
        for component in self.all():
            each = getattr(component, "on_reading", None)
            if each is not None:
                each(level)


def relief_stage(component: Component) -> Relief:
    """A component's ``relief`` stage; one that names none (a store) gives back a RAM tier."""
    stage = getattr(component, "relief", Relief.RAM_TIER)
    return stage if isinstance(stage, Relief) else Relief.RAM_TIER


_RAM_TIER = {2: "RAM tier back to its full size", 1: "RAM tier halved", 0: "RAM tier emptied"}


def reaction(component: Component, level: Level) -> str | None:
    """What ``component`` does at ``level``, in words: ``store embeddings: RAM tier halved``. Stores are known by
    their ``label`` and pools by their type name (this module imports neither); anything else: ``None``."""
    label = getattr(component, "label", None)
    if isinstance(label, str):
        return f"store {label}: {_RAM_TIER[ram_tier_limit(2, level)]}"  # the same rule the store applies
    if type(component).__name__ == "Pool":
        return "pool: spare buffers dropped" if level >= Level.HIGH else "pool: keeps spare buffers"
    return None


RECHECK_SECONDS = 0.5  # "at most twice a second"


class LevelTracker:
    """The last measured level, re-measured at most every ``RECHECK_SECONDS`` of the injected clock.

    ``measure(previous)`` returns the level for a fresh reading (the previous level is passed in for the table's
    hysteresis). Readings are taken outside the lock (they read files), so two may overlap: each takes a ticket
    when it starts and only a reading newer than the last published one is published, so a slow older reading
    never overwrites a newer one. A change is logged and told to ``announce(level, previous)`` (a machine's
    ``Components.notify``).
    """

    def __init__(self, measure: Callable[[Level], Level], clock: Clock,
                 announce: Callable[[Level, Level], None], hear: Callable[[Level], None] | None = None) -> None:
        self.measure = measure
        self.clock = clock
        self.announce = announce
        self.hear = hear  # told every published reading's level, after any announcement
        self.level = Level.OK
        self.measured_at: float | None = None
        self.measurements = 0
        self._issued = 0  # tickets handed to readings, in the order they started
        self._published = 0  # the ticket of the reading ``level`` comes from
        self._lock = threading.Lock()
        _fork_safe(self)

    def current(self) -> Level:
        due = self.due()
        return self.level if due is None else self.publish(due[0], self.measure(due[1]))

    def due(self) -> tuple[int, Level] | None:
        """None while the last reading is fresh; else the reading is due, and whoever asked takes it: its ticket
        for ``publish`` and the previous level (``Machine.level_and_room`` takes it with the budget's)."""
        now = self.clock.now()
        with self._lock:
            if self.measured_at is not None and now - self.measured_at < RECHECK_SECONDS:
                return None
            self.measured_at = now
            return self._start()

    def begin(self) -> tuple[int, Level]:
        """Start a reading taken elsewhere: its ticket for ``publish``, and the level to use as the previous one."""
        with self._lock:
            return self._start()

    def _start(self) -> tuple[int, Level]:
        self._issued += 1
        return self._issued, self.level

    def publish(self, ticket: int, level: Level) -> Level:
        """Record the level read under ``ticket`` unless a newer reading was published; returns the level now."""
        with self._lock:
            self.measurements += 1
            previous = self.level
            fresh = ticket > self._published
            changed = fresh and level != previous
            if fresh:
                self._published, self.level = ticket, level
        if changed:
            self._announce(level, previous)
        if fresh and self.hear is not None:
            self.hear(level)
        return self.level

    def _announce(self, level: Level, previous: Level) -> None:
        # Announcements run outside the lock (components take their own locks), so two may cross: whoever
        # announced last checks that what it said is still the newest level and says the newest one otherwise.
        while True:
            logger(LEVEL_LOG).info("pressure level %s -> %s", previous, level)
            self.announce(level, previous)
            with self._lock:
                if self.level == level:
                    return
                previous, level = level, self.level
