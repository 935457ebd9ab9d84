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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .errors import ArgumentError
from .units import fmt_size, in_one_unit


class _StrChoices(enum.EnumMeta):
    """The type of our str enums: ``dir()``, and so ``help()``, leaves out the ~45 methods every ``str`` has (they
    still work), which otherwise fill most of ``help(apsi_memory)``."""

    def __dir__(cls) -> list[str]:
        return sorted(name for name in {*super().__dir__(), *vars(cls)} if name in vars(cls) or not hasattr(str, name))


def _unknown_choice(cls: type[enum.Enum], value: object) -> None:
    """An enum's ``_missing_``: a value that is none of its members is an ``ArgumentError`` naming them."""
    names = ", ".join(str(member.value) for member in cls)
    raise ArgumentError(f"unknown {cls.__name__} {value!r}; use one of {names}")


class Level(str, enum.Enum, metaclass=_StrChoices):
    """A pressure level: ``ok`` < ``moderate`` < ``high`` < ``critical`` (``LEVEL_TABLE`` says when each is
    entered and left). A ``str``: compares with the plain strings too (``level == "high"``, ``level >= "high"``)."""

    OK = "ok"
    MODERATE = "moderate"
    HIGH = "high"
    CRITICAL = "critical"

    @classmethod
    def _missing_(cls, value: object) -> None:
        _unknown_choice(cls, value)

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
            raise ArgumentError(f"unknown pressure level {value!r}; use one of {names}") from None

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



# Stalls read host-wide (``/proc/pressure/memory``: v1 hosts, hybrid hosts without the group's own file) are every
# group's stalls at once: a thrashing group elsewhere shows there too. A group with its own limit and no stall file
# of its own counts them only when the host itself is short of memory (free at or below moderate's threshold):
# then the stalls may well be its own, and the whole host's memory is at stake.
HOST_SHORT_FREE = 0.30


def host_stalls_count(host_wide: bool, group_limited: bool, host_free_fraction: float) -> bool:
    """Whether PSI stalls count toward the level: always when they are the group's own (or there is no group
    limit: the host is what there is); host-wide stalls under a group limit only when the host's free fraction is
    at or below ``HOST_SHORT_FREE``."""
    return not (host_wide and group_limited) or host_free_fraction <= HOST_SHORT_FREE

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

class Place(str, enum.Enum, metaclass=_StrChoices):
    """Where ``memory.array`` put an array: ``RAM`` or ``SSD`` (a memory-mapped spill file). A ``str``."""

    RAM = "RAM"
    SSD = "SSD"

    @classmethod
    def _missing_(cls, value: object) -> None:
        _unknown_choice(cls, value)

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


@dataclass(frozen=True)
class GroupLevel:
    """One level of a memory cgroup, the numbers as its files say them; None where a file is missing."""

    limits: tuple[tuple[int | None, str], ...]  # (raw value, file) of each limit file; v2's ``max`` is None
    usage: int | None  # memory.current / memory.usage_in_bytes: None where the controller is not on this level
    inactive_file: int  # from memory.stat; 0 where it is missing


@dataclass(frozen=True)
class GroupMemory:
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


# -- dask workers (apsi_memory.dask) -------------------------------------------------------------------------------

# What a dask deployment holds outside its workers, in the same memory: the client's interpreter, the scheduler and
# the nannies (all in the process that starts a LocalCluster: 60 MiB measured idle with 2 workers; the scheduler's
# task state grows with the graph) and multiprocessing's resource tracker (12 MiB). Rounded up, with room to grow.
DASK_OUTSIDE_WORKERS_BYTES = 256 * (1 << 20)
# Where only workers run (``dask worker`` in a pod, no client, no scheduler): each ``dask worker`` process's own
# interpreter with its nannies (60 MiB measured with 2), rounded up.
DASK_WORKER_PROCESS_BYTES = 96 * (1 << 20)
# A worker process's own interpreter with numpy and distributed imported (62 MiB measured), rounded up: a limit
# below this leaves no room for any data.
DASK_WORKER_BASE_BYTES = 128 * (1 << 20)
# dask's defaults: a worker spills its stored results down to 60 % of its limit and pauses at 80 %, so what runs
# has the 20 % between the two.
DASK_SPILL_TARGET = 0.60
DASK_PAUSE_FRACTION = 0.80
# One running task holds about three chunks at once (its input, its result, one NumPy temporary).
CHUNKS_PER_TASK = 3
MIN_CHUNK_BYTES = 1 << 20


def worker_memory_limit(usable_bytes: int, n_workers: int, nthreads: int = 1,
                        outside_bytes: int = DASK_OUTSIDE_WORKERS_BYTES) -> int:
    """Bytes per dask worker: the usable memory (the smallest limit up the cgroup hierarchy, ``memory.high``
    included, or the host's) less ``outside_bytes`` (what runs there besides the workers:
    ``DASK_OUTSIDE_WORKERS_BYTES`` for client, scheduler and nannies), shared equally by ``n_workers``. Raises
    ``ArgumentError`` (a ``ValueError``) when that share cannot hold a worker's interpreter plus one 1 MiB chunk per thread."""
    if n_workers < 1 or nthreads < 1:
        raise ArgumentError(f"a dask deployment needs at least 1 worker and 1 thread, not {n_workers} and {nthreads}")
    share = (usable_bytes - outside_bytes) // n_workers
    needed = DASK_WORKER_BASE_BYTES + nthreads * CHUNKS_PER_TASK * MIN_CHUNK_BYTES
    if share < needed:
        raise ArgumentError(f"{fmt_size(usable_bytes)} usable cannot hold {n_workers} dask workers of {nthreads} "
                         f"thread(s): each would get {fmt_size(max(0, share))}, under the {fmt_size(needed)} a "
                         "worker needs; use fewer workers")
    return share


def chunk_bytes(limit_bytes: int, nthreads: int = 1) -> int:
    """The largest power-of-two chunk (at least 1 MiB) such that ``nthreads`` running tasks of
    ``CHUNKS_PER_TASK`` chunks each fit between the spill target and the pause fraction of a worker limit: stored
    results are spilled down to the target, so the tasks never push the worker past the pause fraction."""
    room = int(limit_bytes * (DASK_PAUSE_FRACTION - DASK_SPILL_TARGET)) // (CHUNKS_PER_TASK * max(1, nthreads))
    size = MIN_CHUNK_BYTES
    while size * 2 <= room:
        size *= 2
    return size


# A worker paused for its own memory (RSS at the pause fraction of its limit) resumes once RSS is this much under
# it: the 10 points are hysteresis, so a worker hovering at the fraction does not flip every check.
DASK_RESUME_GAP = 0.10


def worker_pause_cause(level: Level, rss: int, limit: int, paused: bool, pause_level: Level = Level.HIGH,
                       pause_fraction: float = DASK_PAUSE_FRACTION) -> str | None:
    """Why a dask worker should be paused (or stay paused), in words; None when it should run.

    Paused at ``pause_level`` or above, and while its RSS is at ``pause_fraction`` of its ``limit`` (0: no limit)
    or more; a paused worker runs again once the level is under ``pause_level`` (the level table's own hysteresis:
    ``high`` is left above 25 % free, which a cluster whose workers are all paused can reach once they have spilled)
    and its RSS is ``DASK_RESUME_GAP`` under the fraction. Never "back at ok": memory held outside the workers (a
    client's array at 70 % of the group) would keep them paused for good."""
    if level >= pause_level:
        return f"pressure {level}"
    share = rss / limit if limit else 0.0
    if share >= pause_fraction:
        return f"worker memory {share:.0%} of its limit (pauses at {pause_fraction:.0%})"
    if paused and share >= pause_fraction - DASK_RESUME_GAP:
        return f"worker memory {share:.0%} of its limit (resumes under {pause_fraction - DASK_RESUME_GAP:.0%})"
    return None


# p2p rechunks and shuffles hold, on each worker and outside its spillable data, up to ``distributed.p2p.comm.buffer``
# of outgoing shards (1 GiB by default: more than a whole 384 MiB worker) and ``distributed.p2p.storage.buffer``
# of incoming ones (100 MiB). Each gets this share of the worker's limit, so both fit beside the running tasks.
P2P_BUFFER_SHARE = 0.10
# Under this worker limit a rechunk goes through tasks: p2p's fixed cost (10 concurrent 2 MiB messages, its own
# threads, two buffers) leaves too little of a small worker; tasks of ``chunk_bytes`` chunks are spilled as usual.
P2P_MIN_WORKER_BYTES = 512 * (1 << 20)


def dask_settings(limit_bytes: int, nthreads: int = 1) -> dict[str, int | str]:
    """The ``dask.config`` values a worker limit implies: array chunk size (``chunk_bytes``), the two p2p buffers
    and the rechunk method."""
    buffer = max(MIN_CHUNK_BYTES, int(limit_bytes * P2P_BUFFER_SHARE))
    return {"array.chunk-size": chunk_bytes(limit_bytes, nthreads),
            "distributed.p2p.comm.buffer": buffer, "distributed.p2p.storage.buffer": buffer,
            "array.rechunk.method": "p2p" if limit_bytes >= P2P_MIN_WORKER_BYTES else "tasks"}


# A block on a cluster costs a round trip through the scheduler (tens of ms on a busy machine), not a thread switch:
# two per thread in flight left small blocks waiting on latency. More may be in flight while together they hold
# no more input than the default blocks would (``in_flight_bytes``), up to this many.
CLUSTER_MAX_IN_FLIGHT = 256


def cluster_blocks_in_flight(threads: int, block_bytes: int, in_flight_bytes: int) -> int:
    """Blocks of ``map(engine=client)`` in flight at once: two per thread, more for blocks small enough that
    ``in_flight_bytes`` holds more of them (never over ``CLUSTER_MAX_IN_FLIGHT``)."""
    fits = in_flight_bytes // max(1, block_bytes)
    return max(2 * max(1, threads), min(CLUSTER_MAX_IN_FLIGHT, fits))


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
