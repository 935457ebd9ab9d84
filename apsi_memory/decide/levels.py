"""Pressure levels: the level from the free share of usable memory and the kernel's stall figures, with hysteresis.

Theory of operation
-------------------
The adapters (``apsi_memory.adapters``) read the kernel's files and hand plain numbers to these functions; the
public API glues the two. Keeping the rules here, as data tables, makes every documented behaviour testable with
integers and lets property tests check monotonicity without a machine.

Pressure levels
~~~~~~~~~~~~~~~
A level is the worst of three signals, each compared against a row of ``LEVEL_TABLE``:

* the free fraction of *usable* memory (the smaller of the host and the cgroup limit). The thresholds follow
  dask's worker: it spills at 70 % used, pauses at 80 % and is about to be killed at 95 %, so free at or below
  30 % / 20 % / 5 % enters moderate / high / critical;
* PSI ``some`` avg10 (share of the last 10 s in which at least one task waited for memory), at libmempressure's
  5 / 15 / 40 %;
* PSI ``full`` avg10 (all non-idle tasks stalled at once, i.e. the machine does no work). systemd-oomd kills a
  cgroup whose ``full`` avg10 stays above 60 %; we want to have shed memory long before, so critical is half of
  that (30 %), high 10 % and moderate 2 %.

Hysteresis: a level is entered at the ``enter_*`` numbers and left only once every signal is past the
``leave_*`` numbers (5 points more free memory, half the stall share), so a reading that hovers around a
threshold does not flap between two levels on every allocation.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ..errors import ArgumentError


class _StrChoices(enum.EnumMeta):
    """The type of our str enums: ``dir()``, and so ``help()``, leaves out the ~45 methods every ``str`` has (they
    still work), which otherwise fill most of ``help(apsi_memory)``."""

    def __dir__(cls) -> list[str]:
        return sorted(name for name in {*super().__dir__(), *vars(cls)} if name in vars(cls) or not hasattr(str, name))


class _Choice(str, enum.Enum, metaclass=_StrChoices):
    """A ``str`` enum of ours: ``str()`` is its value, and a value that is none of its members is an
    ``ArgumentError`` naming them (``Level``, ``Place``)."""

    @classmethod
    def _missing_(cls, value: object) -> None:
        names = ", ".join(str(member.value) for member in cls)
        raise ArgumentError(f"unknown {cls.__name__} {value!r}; use one of {names}")

    def __str__(self) -> str:
        return str.__str__(self)  # the member's own text: its value


class Level(_Choice):
    """A pressure level: ``ok`` < ``moderate`` < ``high`` < ``critical`` (``LEVEL_TABLE`` says when each is
    entered and left). A ``str``: compares with the plain strings too (``level == "high"``, ``level >= "high"``)."""

    OK = "ok"
    MODERATE = "moderate"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def parse(cls, value: Level | str) -> Level:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(level.value for level in cls)
            raise ArgumentError(f"unknown pressure level {value!r}; use one of {names}") from None

    def __lt__(self, other: object) -> bool:
        return _RANK[self] < _rank_of(other)

    def __le__(self, other: object) -> bool:
        return _RANK[self] <= _rank_of(other)

    def __gt__(self, other: object) -> bool:
        return _RANK[self] > _rank_of(other)

    def __ge__(self, other: object) -> bool:
        return _RANK[self] >= _rank_of(other)

    __hash__ = str.__hash__


_RANK = {Level.OK: 0, Level.MODERATE: 1, Level.HIGH: 2, Level.CRITICAL: 3}

LEVELS = (Level.OK, Level.MODERATE, Level.HIGH, Level.CRITICAL)


def _rank_of(other: object) -> int:
    """A level's rank at once (every placement compares levels; ``Level(value)`` goes through the enum machinery),
    a plain string's once it is parsed (an unknown one is an ``ArgumentError``)."""
    return _RANK[other] if isinstance(other, Level) else Level.parse(other).rank  # type: ignore[arg-type]


class Thresholds(NamedTuple):
    """One row of the level table. Fractions are 0..1; PSI shares are percent, as the kernel prints them."""

    enter_free: float  # free fraction at or below this enters the level
    leave_free: float  # ... and it is left only above this
    enter_some: float  # PSI some avg10 at or above this enters
    leave_some: float
    enter_full: float  # PSI full avg10 at or above this enters
    leave_full: float


LEVEL_TABLE: dict[Level, Thresholds] = {
    Level.MODERATE: Thresholds(enter_free=0.30, leave_free=0.35, enter_some=5.0, leave_some=2.5,
                               enter_full=2.0, leave_full=1.0),
    Level.HIGH: Thresholds(enter_free=0.20, leave_free=0.25, enter_some=15.0, leave_some=7.5,
                           enter_full=10.0, leave_full=5.0),
    Level.CRITICAL: Thresholds(enter_free=0.05, leave_free=0.10, enter_some=40.0, leave_some=20.0,
                               enter_full=30.0, leave_full=15.0),
}


def _past(free_at: float, some_at: float, full_at: float, free: float, some: float, full: float) -> list[str]:
    """The signals at or past these numbers, named as the text shows them: ``free ≤ 30 %``, ``some ≥ 5 %``."""
    signals = []
    if free <= free_at:
        signals.append(f"free ≤ {free_at * 100:g} %")
    if some >= some_at:
        signals.append(f"some ≥ {some_at:g} %")
    if full >= full_at:
        signals.append(f"full ≥ {full_at:g} %")
    return signals


def _enters(t: Thresholds, free: float, some: float, full: float) -> list[str]:
    return _past(t.enter_free, t.enter_some, t.enter_full, free, some, full)


def _stays(t: Thresholds, free: float, some: float, full: float) -> list[str]:
    return _past(t.leave_free, t.leave_some, t.leave_full, free, some, full)


def pressure_level(free_fraction: float, some: float | None = None, full: float | None = None,
                   previous: Level = Level.OK) -> Level:
    """The level for a reading; ``previous`` gives hysteresis. PSI ``None`` (not available) counts as no stall.

    Monotone: less free memory or more stall never gives a lower level (for the same ``previous``).
    """
    some_pct = some or 0.0
    full_pct = full or 0.0
    entered = Level.OK
    held = Level.OK
    for level in LEVELS[1:]:
        row = LEVEL_TABLE[level]
        if _enters(row, free_fraction, some_pct, full_pct):
            entered = level
        if level <= previous and _stays(row, free_fraction, some_pct, full_pct):
            held = level
    return max(entered, held, key=lambda level: level.rank)


def pressure_cause(level: Level, free_fraction: float, some: float | None = None,
                   full: float | None = None) -> str | None:
    """Which signal set ``level`` (as ``pressure_level`` gave it for this reading): ``some ≥ 5 %``, ``free ≤ 20 %
    and full ≥ 10 %``, or for a level held by hysteresis ``free ≤ 25 % (held)``. None at ``ok``: nothing did."""
    if level == Level.OK:
        return None
    row, some_pct, full_pct = LEVEL_TABLE[level], some or 0.0, full or 0.0
    entered = _enters(row, free_fraction, some_pct, full_pct)
    if entered:
        return " and ".join(entered)
    return " and ".join(_stays(row, free_fraction, some_pct, full_pct)) + " (held)"


# Stalls read host-wide (``/proc/pressure/memory``: v1 hosts, hybrid hosts without the group's own file, the v2 root
# group) are every group's stalls at once: tenants thrashing at their own limits show there on a host with most of
# its RAM free. They count, limit or not, only while the host itself is short of memory (moderate's free threshold):
# then the stalls may well be ours, and the whole host's memory is at stake. Once counted they go on counting until
# the host is past moderate's leave threshold, so a host hovering at the gate does not flap between levels.
HOST_SHORT_FREE = LEVEL_TABLE[Level.MODERATE].enter_free


def host_stalls_count(host_wide: bool, host_free_fraction: float, *, previous: Level = Level.OK) -> bool:
    """Whether PSI stalls count toward the level: always when they are the group's own; host-wide ones only while
    the host's free fraction is at or below ``HOST_SHORT_FREE`` (moderate's ``leave_free`` once ``previous`` is
    above ``ok``)."""
    gate = HOST_SHORT_FREE if previous == Level.OK else LEVEL_TABLE[Level.MODERATE].leave_free
    return not host_wide or host_free_fraction <= gate
