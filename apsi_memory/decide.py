"""Pure decisions: no I/O, no clock, no globals. Everything here takes numbers and returns a decision.

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
from dataclasses import dataclass


class _StrChoices(enum.EnumMeta):
    """The type of our str enums: ``dir()``, and so ``help()``, leaves out the ~45 methods every ``str`` has (they
    still work), which otherwise fill most of ``help(apsi_memory)``."""

    def __dir__(cls) -> list[str]:
        return sorted(name for name in {*super().__dir__(), *vars(cls)} if name in vars(cls) or not hasattr(str, name))


class Level(str, enum.Enum, metaclass=_StrChoices):
    """A pressure level: ``ok`` < ``moderate`` < ``high`` < ``critical`` (``LEVEL_TABLE`` says when each is
    entered and left). A ``str``: compares with the plain strings too (``level == "high"``, ``level >= "high"``)."""

    OK = "ok"
    MODERATE = "moderate"
    HIGH = "high"
    CRITICAL = "critical"

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def parse(cls, value: Level | str) -> Level:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(level.value for level in cls)
            raise ValueError(f"unknown pressure level {value!r}; use one of {names}") from None

    def __lt__(self, other: object) -> bool:
        return self.rank < Level.parse(other).rank  # type: ignore[arg-type]

    def __le__(self, other: object) -> bool:
        return self.rank <= Level.parse(other).rank  # type: ignore[arg-type]

    def __gt__(self, other: object) -> bool:
        return self.rank > Level.parse(other).rank  # type: ignore[arg-type]

    def __ge__(self, other: object) -> bool:
        return self.rank >= Level.parse(other).rank  # type: ignore[arg-type]

    __hash__ = str.__hash__


_RANK = {Level.OK: 0, Level.MODERATE: 1, Level.HIGH: 2, Level.CRITICAL: 3}
LEVELS = (Level.OK, Level.MODERATE, Level.HIGH, Level.CRITICAL)


@dataclass(frozen=True)
class Thresholds:
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


def _enters(t: Thresholds, free: float, some: float, full: float) -> bool:
    return free <= t.enter_free or some >= t.enter_some or full >= t.enter_full


def _stays(t: Thresholds, free: float, some: float, full: float) -> bool:
    return free <= t.leave_free or some >= t.leave_some or full >= t.leave_full


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


# -- budget ------------------------------------------------------------------------------------------------------

DEFAULT_BUDGET_SHARE = 0.70


def default_budget(free_bytes: int, held_bytes: int = 0) -> int:
    """70 % of what is free. ``held_bytes`` is RAM our own arrays already hold: it was free before we took it,
    so counting it back keeps the budget steady while our arrays fill memory (otherwise every RAM array would
    shrink the budget it is checked against twice)."""
    return max(0, int(DEFAULT_BUDGET_SHARE * (max(0, free_bytes) + max(0, held_bytes))))


# -- placement ---------------------------------------------------------------------------------------------------

class Place(str, enum.Enum, metaclass=_StrChoices):
    """Where ``memory.array`` put an array: ``RAM`` or ``SSD`` (a memory-mapped spill file). A ``str``."""

    RAM = "RAM"
    SSD = "SSD"

    def __str__(self) -> str:
        return self.value


# Below this an array stays in RAM whatever the pressure: a spill file per small array would cost more (a file,
# a mapping, page-granular I/O) than the memory it saves.
SMALL_ARRAY_BYTES = 1 * (1 << 20)


def place(nbytes: int, budget_left: int, level: Level) -> Place:
    """RAM when the array fits what is left of the budget and memory is not under ``high`` pressure."""
    if nbytes < SMALL_ARRAY_BYTES:
        return Place.RAM
    if level >= Level.HIGH or nbytes > budget_left:
        return Place.SSD
    return Place.RAM


def place_reason(nbytes: int, budget_left: int, budget: int, level: Level) -> str:
    """Why ``place`` decided as it did, in the words ``report()`` shows after the place: ``fits the budget (1.2 of
    4.0 GB left)``, ``6.0 GB is more than the 1.2 GB left of the budget``, ``pressure high``."""
    if nbytes < SMALL_ARRAY_BYTES:
        return "under 1 MiB, always in RAM"
    if level >= Level.HIGH:
        return f"pressure {level}"
    if nbytes > budget_left:
        size, left, unit = _one_unit(nbytes, budget_left)
        return f"{size} {unit} is more than the {left} {unit} left of the budget"
    left, total, unit = _one_unit(budget_left, budget)
    return f"fits the budget ({left} of {total} {unit} left)"


def _one_unit(*sizes: int) -> tuple[str, ...]:
    """The sizes with one decimal in one unit: GB (2^30) when the largest is at least 1 GB, else MB (2^20)."""
    unit, name = (1 << 30, "GB") if max(sizes) >= 1 << 30 else (1 << 20, "MB")
    return (*(f"{size / unit:.1f}" for size in sizes), name)


# -- eviction ----------------------------------------------------------------------------------------------------

EVICT_TO_SHARE = 0.90


def eviction_target(limit_bytes: int) -> int:
    """Where a bounded tier evicts down to once over its limit: 90 %, so one eviction buys room for many sets."""
    return int(limit_bytes * EVICT_TO_SHARE)


def ram_tier_limit(asked_bytes: int, level: Level) -> int:
    """What a store's RAM tier may hold at a level: all of it at ok/moderate, half at high, nothing at critical."""
    if level >= Level.CRITICAL:
        return 0
    if level >= Level.HIGH:
        return asked_bytes // 2
    return asked_bytes


# -- batches -----------------------------------------------------------------------------------------------------

def halve_batch(batch: int) -> int:
    """The next batch to try after an out-of-memory error: 512 -> 256, 511 -> 255, 1 -> 0."""
    return batch // 2
