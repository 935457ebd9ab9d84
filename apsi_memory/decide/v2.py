"""What only cgroup v2 has: ``memory.high`` throttling and ``memory.oom.group``.

``memory.high`` below ``memory.max``: above ``high`` the kernel does not kill, it reclaims and puts every task that
charges memory to sleep (up to 2 s at a time, again and again; with no swap, for as long as the group stays above):
in the VM a job 64 MiB over a 128 MiB ``high`` was held 46 s, 304 ``high`` events, 0 kills, the group's PSI
``some`` at 55 %. So ``memory.high`` stays the limit ``limits()`` plans with (``V2_LIMIT_FILES``): past it is a
stall, not room. While the kernel throttles (the group's ``memory.events`` ``high`` count rose within the last
``THROTTLE_WINDOW_S``, the span of PSI's avg10) the level is at least ``THROTTLED_LEVEL``: the free share may
already look fine again (the reclaim dropped cache) and avg10 takes seconds to rise, yet the job is at its wall.
Critical still comes from the other signals (free ≤ 5 %: usage at ``high``).

``memory.oom.group`` = 1: an OOM kill in the group kills every process of it, not only the largest. The kernel
picks the outermost group with it set, walking up from the victim no further than the group whose limit was hit.
"""

from __future__ import annotations

from collections.abc import Sequence

from .levels import Level

THROTTLE_WINDOW_S = 10.0
THROTTLED_LEVEL = Level.HIGH
THROTTLE_CAUSE = "throttled at memory.high"


def high_events_rose(before: int | None, now: int | None) -> bool:
    """Whether the group's ``memory.events`` ``high`` count rose between two readings (None: not read)."""
    return before is not None and now is not None and now > before


def throttled(seconds_since_rise: float | None) -> bool:
    """Whether a ``high`` count that rose ``seconds_since_rise`` ago (None: never seen rising) is throttling now."""
    return seconds_since_rise is not None and 0.0 <= seconds_since_rise <= THROTTLE_WINDOW_S


def throttle_level(level: Level, is_throttled: bool) -> Level:
    """The level while throttled: at least ``THROTTLED_LEVEL``; ``level`` otherwise."""
    return max(level, THROTTLED_LEVEL, key=lambda lv: lv.rank) if is_throttled else level


def throttle_cause(cause: str | None, is_throttled: bool) -> str | None:
    """``cause`` with the throttling named after the other signals: ``free ≤ 5 % and throttled at memory.high``."""
    if not is_throttled:
        return cause
    return THROTTLE_CAUSE if cause is None else f"{cause} and {THROTTLE_CAUSE}"


def oom_group_at(flags: Sequence[bool], binding: int | None) -> int | None:
    """Which level, from the group up, one OOM kill takes whole: the outermost with ``memory.oom.group`` set
    (``flags``, from the group up) at or below ``binding``, the level whose limit is hit (None: no limit, a
    host-wide OOM, which climbs to the top). None where no such level has it."""
    top = len(flags) - 1 if binding is None else min(binding, len(flags) - 1)
    return max((at for at in range(top + 1) if flags[at]), default=None)


def oom_group_note(directory: str | None) -> str | None:
    """The words ``pressure()`` adds where a kill takes the whole group."""
    return None if directory is None else f"one OOM kill takes the whole group (memory.oom.group in {directory})"
