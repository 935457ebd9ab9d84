"""Budget, placement, eviction, batches, memory limits and relief: what to do with the memory there is."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from ..units import fmt_size, in_one_unit
from .levels import LEVEL_TABLE, Level, _Choice

# -- budget ------------------------------------------------------------------------------------------------------

DEFAULT_BUDGET_SHARE = 0.70


def default_budget(free_bytes: int, held_bytes: int = 0) -> int:
    """70 % of what is free. ``held_bytes`` is RAM our own arrays already hold: it was free before we took it,
    so counting it back keeps the budget steady while our arrays fill memory (otherwise every RAM array would
    shrink the budget it is checked against twice)."""
    return max(0, int(DEFAULT_BUDGET_SHARE * (max(0, free_bytes) + max(0, held_bytes))))


def shared_budget(free_bytes: int, held_bytes: int, siblings_reserved_bytes: int, processes: int) -> int:
    """The default budget of one of ``processes`` processes of a memory group that hold RAM arrays or reservations
    (this one included): an equal share of ``default_budget`` of what is free once the siblings' reservations
    (placed, not yet charged by the kernel) are taken away. Alone and with nothing reserved, ``default_budget``."""
    left = max(0, free_bytes - max(0, siblings_reserved_bytes))
    return default_budget(left, held_bytes) // max(1, processes)


# -- placement ---------------------------------------------------------------------------------------------------

class Place(_Choice):
    """Where ``memory.array`` put an array: ``RAM`` or ``SSD`` (a memory-mapped spill file). A ``str``."""

    RAM = "RAM"
    SSD = "SSD"


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
        return f"under {fmt_size(SMALL_ARRAY_BYTES, 0)}, always in RAM"
    if level >= Level.HIGH:
        return f"pressure {level}"
    if nbytes > budget_left:
        size, left, unit = in_one_unit(nbytes, budget_left)
        return f"{size} {unit} is more than the {left} {unit} left of the budget"
    left, total, unit = in_one_unit(budget_left, budget)
    return f"fits the budget ({left} of {total} {unit} left)"


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


# -- memory limits -----------------------------------------------------------------------------------------------
#
# What caps a group's memory, per cgroup version. ``memory.high`` counts: above it the kernel throttles and
# reclaims hard, which for planning is a wall. v1's ``hierarchical_memory_limit`` (a ``memory.stat`` line) brings
# in parents a container cannot see above its mount root.
#
# What is NOT a limit, and so is never read as one (dask's worker counts both; we do not): v1's
# ``memory.soft_limit_in_bytes`` is a reclaim target under global pressure — a group may run far past it and is
# not killed for it; v2's ``memory.low`` and ``memory.min`` are protections (memory the kernel tries not to, or
# will not, reclaim from the group) — a floor, not a cap. Counting them would shrink usable memory on a machine
# with room to spare.
V1_LIMIT_FILES = ("memory.limit_in_bytes",)
V1_STAT_LIMIT = "hierarchical_memory_limit"
V2_LIMIT_FILES = ("memory.max", "memory.high")
NOT_LIMITS = ("memory.soft_limit_in_bytes", "memory.low", "memory.min")


class GroupLevel(NamedTuple):
    """One level of a memory cgroup, the numbers as its files say them; None where a file is missing."""

    limits: tuple[tuple[int | None, str], ...]  # (raw value, file) of each limit file; v2's ``max`` is None
    usage: int | None  # memory.current / memory.usage_in_bytes: None where the controller is not on this level
    inactive_file: int  # from memory.stat; 0 where it is missing


class GroupMemory(NamedTuple):
    """What a hierarchy of levels allows: the smallest limit and the least headroom up it."""

    limit: int | None  # None when unlimited
    limit_file: str | None  # the file that set it
    working_set: int  # of the nearest level with a usage file, clamped to [0, limit]
    free: int | None  # None when unlimited


def effective_limit(value: int | None, physical: int) -> int | None:
    """A limit file's value as a limit, or None for none. A negative value is unlimited (v1 prints -1 in some files
    and kernels; there is no negative memory). v1 has no "unlimited" keyword either: it prints a huge page-aligned
    number that depends on the page size (0x7FFFFFFFFFFFF000 with 4 KiB pages, ...FF0000 with 64 KiB). Any limit at
    or above the RAM there is is none."""
    return None if value is None or value < 0 or value >= physical else value


def smallest_limit(candidates: Sequence[tuple[int | None, str]], physical: int) -> tuple[int | None, str | None]:
    """The smallest real limit among (value, file) pairs and its file; (None, None) when none limits."""
    limit, limit_file = None, None
    for raw, path in candidates:
        value = effective_limit(raw, physical)
        if value is not None and (limit is None or value < limit):
            limit, limit_file = value, path
    return limit, limit_file


def working_set(usage: int, inactive_file: int, limit: int | None) -> int:
    """Usage without the page cache the kernel would drop first, so a big cache does not read as pressure."""
    ws = max(0, usage - max(0, inactive_file))
    return ws if limit is None else min(ws, limit)


def combine_levels(levels: Sequence[GroupLevel], physical: int) -> GroupMemory | None:
    """Levels from the group up to the top visible one. The smallest limit wins, and the least headroom (a level's
    limit minus its own working set). A level without a usage file (v2: its parent's ``cgroup.subtree_control``
    does not hand ``memory`` down; the kernel charges the nearest ancestor that has it) still limits; the working
    set is the nearest level's that has one. None only when no level has a usage file: no memory controller."""
    used = [level for level in levels if level.usage is not None]
    if not used:
        return None
    limit, limit_file, free = None, None, None
    for level in levels:
        level_limit, level_file = smallest_limit(level.limits, physical)
        if level_limit is None:
            continue
        if limit is None or level_limit < limit:
            limit, limit_file = level_limit, level_file
        if level.usage is not None:  # a level whose usage cannot be read limits, but its headroom is unknown
            headroom = level_limit - working_set(level.usage, level.inactive_file, level_limit)
            free = headroom if free is None else min(free, headroom)
    nearest = working_set(used[0].usage or 0, used[0].inactive_file, limit)
    if limit is not None:  # the smallest limit may sit on a level without usage: bound it by the nearest charge
        free = limit - nearest if free is None else min(free, limit - nearest)
    return GroupMemory(limit, limit_file, nearest, free)


def binding_level(own_limits: Sequence[int | None], limit: int | None) -> int | None:
    """Which level, from the group up, binds (whose siblings share one ledger): the outermost whose own limit is
    ``limit``, the smallest up the hierarchy, since the groups under it share its memory even where their own
    limits equal it; the top level seen where no level's own limit is it (v1's ``hierarchical_memory_limit``
    brings a limit from above a container's mount root); None without a limit. ``own_limits``: each level's own
    smallest effective limit (None for none), not the one it inherits."""
    if limit is None or not own_limits:
        return None
    return max((at for at, own in enumerate(own_limits) if own == limit), default=len(own_limits) - 1)


def charged_levels(use_hierarchy: Sequence[bool]) -> int:
    """cgroup v1: how many levels, from the group up, a charge reaches, and so whose limits and headroom count.
    ``use_hierarchy`` holds each level's ``memory.use_hierarchy`` from the group up. A parent with it at 0 (possible
    before Linux 5.11) does not charge its children: the climb stops below it, as the kernel's own
    ``hierarchical_memory_limit`` does. A level's own flag is about its children, so the group's is not looked at."""
    for level, hierarchical in enumerate(use_hierarchy[1:], start=1):
        if not hierarchical:
            return level
    return max(1, len(use_hierarchy))


def usable_memory(host_total: int, limit: int | None) -> int:
    """What the kernel lets this process use before it is killed: the smaller of RAM and the cgroup limit."""
    return host_total if limit is None else min(host_total, limit)


def free_memory(host_available: int, group_free: int | None, usable: int) -> int:
    """The smaller of the host's available memory and the cgroup's headroom, within [0, usable]."""
    free = host_available if group_free is None else min(host_available, group_free)
    return max(0, min(free, usable))


# -- relief: what gives RAM back, in which order, and which arrays move -------------------------------------------

class Relief(enum.IntEnum):
    """Who gives RAM back when the level rises, in order: what costs least to lose goes first. A pool's spare
    buffers are only a cache of empty memory; a store's RAM tier has its copy on the SSD; a RAM array moved to a
    spill file keeps every byte but is then read and written through the page cache."""

    SPARES = 0
    RAM_TIER = 1
    ARRAYS = 2


# Arrays move at ``high``, not ``critical``: at critical 5 % of usable memory is left (100 MB of 2 GB), less than a
# neighbour growing at NumPy's speed takes before a move of hundreds of MB is done; see docs/guides/what-moves.md.
MOVE_AT = Level.HIGH

_T = TypeVar("_T")


def in_relief_order(components: Sequence[_T], stage: Callable[[_T], Relief]) -> list[_T]:
    """``components`` in the order they are told of a level: pools, then stores, then arrays (stable within one
    stage), so arrays move only for what the others could not give back."""
    return sorted(components, key=stage)


def bytes_to_free(free_bytes: int, usable_bytes: int) -> int:
    """How much must move for the reading to leave ``high`` (free above its ``leave_free``, 25 % of usable);
    0 when that already holds: a level raised by stalls alone with memory free is not fixed by moving arrays."""
    target = int(LEVEL_TABLE[Level.HIGH].leave_free * max(0, usable_bytes)) + 1
    return max(0, target - max(0, free_bytes))


def arrays_to_move(sizes: Sequence[tuple[_T, int]], need_bytes: int) -> list[_T]:
    """Which arrays (``(key, nbytes)``, oldest first) to move so that at least ``need_bytes`` leave RAM, moving
    few bytes: the smallest array that alone covers what is still needed, else the largest, and again until the
    need is covered or nothing is left. (Least recently used cannot be known without scanning page tables; bytes
    moved is what a move costs.)"""
    left = list(sizes)
    chosen: list[_T] = []
    while need_bytes > 0 and left:
        covering = [item for item in left if item[1] >= need_bytes]
        pick = min(covering, key=lambda item: item[1]) if covering else max(left, key=lambda item: item[1])
        left.remove(pick)
        chosen.append(pick[0])
        need_bytes -= pick[1]
    return chosen


# -- siblings that hold the same data -----------------------------------------------------------------------------

ALIKE_MIN_BYTES = 64 << 20  # below this a copy per process costs too little to mention
ALIKE_WITHIN = 0.05  # "about the same": the largest holds at most 5 % more than the smallest


def alike_holders(held: Sequence[int]) -> list[int]:
    """Indices (ascending) of the largest set of at least two processes that each hold about the same bytes of RAM
    arrays (within ``ALIKE_WITHIN``), at least ``ALIKE_MIN_BYTES`` each: what DataLoader or Pool workers that each
    loaded one dataset for themselves look like. Empty when there is none; of two such sets, the bigger bytes."""
    order = sorted((b, i) for i, b in enumerate(held) if b >= ALIKE_MIN_BYTES)
    best: list[tuple[int, int]] = []
    start = 0
    for end in range(len(order)):
        while order[end][0] > order[start][0] * (1 + ALIKE_WITHIN):
            start += 1
        window = order[start:end + 1]
        if len(window) >= 2 and (len(window), window[0][0]) >= (len(best), best[0][0] if best else 0):
            best = window
    return sorted(i for _, i in best)
