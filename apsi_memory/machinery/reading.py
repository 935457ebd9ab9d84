"""A reading of the memory this process really has: the host's view narrowed by its cgroup (``MemoryReading``,
taken by a ``MemoryReader`` through the adapters), and what a ``Machine`` gives from one: ``Budget``, ``Limits``,
``Pressure`` and ``SiblingReading`` (``status.Status`` adds the GPUs).

Each given reading is a frozen dataclass of plain numbers (bytes, fractions, percent) whose ``str()`` is the SPEC's
one-line text and whose ``to_dict()`` is the JSON form the command line prints. The ``*_from`` functions build them
from one ``MemoryReading`` and do no I/O.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..adapters.cgroup import CgroupMemory, Layout, read_cgroup_memory, read_layout
from ..adapters.clock import Clock, SystemClock
from ..adapters.files import KernelFiles
from ..adapters.procfs import MemInfo, read_meminfo
from ..adapters.psi import Psi, read_psi
from ..adapters.root import resolve
from ..decide import (
    Level,
    alike_holders,
    free_memory,
    high_events_rose,
    host_stalls_count,
    oom_group_note,
    pressure_cause,
    pressure_level,
    throttle_cause,
    throttle_level,
    throttled,
    usable_memory,
)
from ..errors import CorruptFileError
from ..units import GiB, fmt_size


@dataclass(frozen=True)
class MemoryReading:
    host: MemInfo
    cgroup: CgroupMemory | None
    psi: Psi | None
    cgroup_problem: str | None = None  # why a group that exists was not read (the reading is the host's)
    psi_problem: str | None = None  # why stalls are not available although a PSI file is there
    throttled_s: float | None = None  # seconds since the group's memory.events ``high`` count last rose; None: not seen

    @property
    def limited(self) -> bool:
        return self.cgroup is not None and self.cgroup.limit is not None and self.cgroup.limit < self.host.total

    @property
    def usable(self) -> int:
        return usable_memory(self.host.total, self.cgroup.limit if self.limited and self.cgroup else None)

    @property
    def free(self) -> int:
        group_free = self.cgroup.free if self.limited and self.cgroup else None
        return free_memory(self.host.available, group_free, self.usable)

    @property
    def source(self) -> str:
        if self.limited:
            assert self.cgroup is not None
            return f"container (cgroup v{self.cgroup.version})"
        return "host"


def _host_from_psutil() -> MemInfo:
    """Where there is no /proc/meminfo (macOS, Windows), psutil knows the host; there are no cgroups."""
    import psutil  # only here: on Linux its import (and subprocess's, socket's) was a third of the first reading

    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    return MemInfo(int(vm.total), int(vm.available), int(swap.total), int(swap.free))


class MemoryReader:
    """Takes ``MemoryReading``s of one root, keeping its kernel files open (``adapters.files``) and where the group
    is while ``/proc/self/cgroup`` and ``mountinfo`` read the same. Limits, usage and PSI are read afresh every
    time (a pod is resized in place). One reading at a time: readings from several threads wait for each other."""

    def __init__(self, root: str | None = None, clock: Clock | None = None) -> None:
        self.root = resolve(root)
        self.clock: Clock = SystemClock() if clock is None else clock  # the machine's: how long throttling lasts
        self.files = KernelFiles(self.root)
        self._layout: Layout | None = None
        self._lock = threading.Lock()
        self._high: tuple[int | None, float | None] = (None, None)  # the last ``high`` count, when it last rose

    def read(self) -> MemoryReading:
        if self.files.forked():  # a lock held by a thread of the parent at fork would never be released here
            self._lock = threading.Lock()
        with self._lock:
            self._layout = layout = read_layout(self.files, self._layout)
            return _reading(self.files, layout, self._throttled)

    def _throttled(self, cgroup: CgroupMemory | None) -> float | None:
        """Seconds since the group's ``high`` count last rose, as this reader has seen it (None: not seen rising):
        a count already there at the first reading tells nothing of now."""
        count = cgroup.high_events if cgroup is not None else None
        before, rose_at = self._high
        now = self.clock.now()
        rose_at = now if high_events_rose(before, count) else rose_at
        self._high = count, rose_at if count is not None else None
        return None if count is None or rose_at is None else now - rose_at

    def close(self) -> None:
        with self._lock:  # not under a reading another thread is taking
            self.files.close()


def read_memory(root: str | None = None) -> MemoryReading:
    """One reading, opening and closing its files (a ``Machine`` keeps a ``MemoryReader`` instead)."""
    reader = MemoryReader(root)
    try:
        return reader.read()
    finally:
        reader.close()


def _reading(files: KernelFiles, layout: Layout,
             throttled: Callable[[CgroupMemory | None], float | None]) -> MemoryReading:
    host = read_meminfo(files) or _host_from_psutil()
    group = read_cgroup_memory(host.total, files, layout)
    try:
        psi, psi_problem = read_psi(files, layout), None
    except CorruptFileError as exc:  # a stall reading we cannot parse must never hide the memory limit
        psi, psi_problem = None, str(exc)
    if isinstance(group, str):
        return MemoryReading(host, None, psi, group, psi_problem, throttled(None))
    return MemoryReading(host, group, psi, None, psi_problem, throttled(group))


class Reading:
    def to_dict(self) -> dict[str, Any]:
        return {key: _plain(value) for key, value in dataclasses.asdict(self).items()}  # type: ignore[call-overload]


def _plain(value: Any) -> Any:
    if isinstance(value, Level):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Budget(Reading):
    """The RAM budget for big arrays: ``bytes``, and ``source``, where it came from. ``float(b)`` and ``b.gb`` are
    it in GB (2^30)."""

    bytes: int
    source: str  # "70 % of free", "set by budget()", or "APSI_RAM_BUDGET"
    siblings_reserved_bytes: int = 0  # what other processes of the group placed in RAM and have not written yet

    @property
    def gb(self) -> float:
        return self.bytes / GiB

    def __float__(self) -> float:
        return self.gb

    def __str__(self) -> str:
        return f"{fmt_size(self.bytes)} ({self.source})"


@dataclass(frozen=True)
class Limits(Reading):
    """Usable memory and where it comes from; ``to_dict()`` gives the same fields as ``limits --json``.

    ``usable_bytes``: the smaller of the host's RAM and the smallest cgroup limit up the hierarchy.
    ``free_bytes``: the smaller of the host's available memory and the cgroup's least headroom.
    ``budget_bytes``: the RAM budget for big arrays (``budget()``).
    ``source``: ``host`` or ``container (cgroup v1|v2)``.
    ``cgroup``: the group as ``/proc/self/cgroup`` names it; ``cgroup_version``: 1 or 2 (both None without one).
    ``limit_bytes``, ``limit_file``: the limit and the file (in the machine's view, so it names the group's folder
    too) that set it: ``memory.max``, ``memory.high``, ``memory.limit_in_bytes``, or ``memory.stat`` for v1's
    ``hierarchical_memory_limit``.
    ``working_set_bytes``: the group's usage less inactive page cache.
    ``host_total_bytes``, ``host_available_bytes``: ``/proc/meminfo``'s MemTotal and MemAvailable.
    ``group_guessed``: the group is not below any cgroup mount's root, so the mount point was read in its stead.
    ``cgroup_problem``: why a group that exists was not read (the reading is then the host's).
    ``siblings_reserved_bytes``: what the other processes of this user in this group placed in RAM and the kernel
    has not charged yet (not yet out of ``free_bytes``; placement takes it away); ``siblings``: how many of them
    use the library (``siblings()``).
    ``oom_group``: cgroup v2, the group one OOM kill takes whole (its ``memory.oom.group`` is 1), else None.
    """

    usable_bytes: int
    free_bytes: int
    budget_bytes: int
    source: str  # "host", "container (cgroup v1)", "container (cgroup v2)"
    cgroup: str | None  # the group as /proc/self/cgroup names it
    cgroup_version: int | None
    limit_bytes: int | None  # the smallest cgroup limit up the hierarchy, None when unlimited
    limit_file: str | None  # the file that set it
    working_set_bytes: int | None
    host_total_bytes: int
    host_available_bytes: int
    group_guessed: bool = False
    cgroup_problem: str | None = None
    siblings_reserved_bytes: int = 0
    siblings: int = 0
    oom_group: str | None = None

    def __str__(self) -> str:
        note = ", group not visible: read at the mount point" if self.group_guessed else ""
        if self.cgroup_problem:
            note = f"; {self.cgroup_problem}"
        others = f" ({fmt_size(self.siblings_reserved_bytes)} reserved by siblings)" if self.siblings_reserved_bytes else ""
        return (f"{fmt_size(self.usable_bytes)} usable ({self.source}{note}), {fmt_size(self.free_bytes)} free{others}, "
                f"budget {fmt_size(self.budget_bytes)}")


def _cgroup_fields(cg: CgroupMemory | None) -> dict[str, Any]:
    if cg is None:
        return dict.fromkeys(("cgroup", "cgroup_version", "limit_bytes", "limit_file", "working_set_bytes"))
    return {"cgroup": cg.path, "cgroup_version": cg.version, "limit_bytes": cg.limit, "limit_file": cg.limit_file,
            "working_set_bytes": cg.working_set, "group_guessed": cg.guessed, "oom_group": cg.oom_group}


class Sibling(NamedTuple):
    """One other process in the group's ledger: its pid, the bytes of RAM arrays it holds, what it placed in RAM
    and the kernel has not charged yet, and its anonymous RSS (now, or when it last published)."""

    pid: int
    held_bytes: int
    reserved_bytes: int
    rss_bytes: int


@dataclass(frozen=True)
class SiblingReading(Reading):
    """The other processes of this user in this memory group that use the library (``siblings()``).

    ``processes``: live processes with a slot; ``active``: those holding RAM arrays or reservations (the budget is
    shared among them and this one); ``reserved_bytes``: what they placed in RAM and the kernel has not charged yet;
    ``held_bytes``: the RAM arrays they hold; ``ledger``: the file (None where no safe folder was found);
    ``ignored``: records not counted, each with its reason; ``each``: one ``Sibling`` per process counted
    (pid, held, reserved, RSS); ``alike``: those that hold about the same (see below)."""

    processes: int = 0
    active: int = 0
    reserved_bytes: int = 0
    held_bytes: int = 0
    ledger: str | None = None
    ignored: tuple[str, ...] = ()
    each: tuple[Sibling, ...] = ()

    @classmethod
    def of(cls, each: list[Sibling], ledger: str | None, ignored: list[str]) -> SiblingReading:
        return cls(len(each), sum(bool(s.held_bytes or s.reserved_bytes) for s in each),
                   sum(s.reserved_bytes for s in each), sum(s.held_bytes for s in each), ledger, tuple(ignored),
                   tuple(each))

    @property
    def alike(self) -> tuple[Sibling, ...]:
        """The siblings that each hold about the same bytes of RAM arrays, 64 MB or more (``decide.alike_holders``):
        likely one dataset loaded once per process, which one file that every process maps would hold once."""
        return tuple(self.each[i] for i in alike_holders([s.held_bytes for s in self.each]))


def limits_from(reading: MemoryReading, budget: Budget, siblings: SiblingReading | None = None) -> Limits:
    return Limits(
        usable_bytes=reading.usable, free_bytes=reading.free, budget_bytes=budget.bytes,
        source=reading.source, host_total_bytes=reading.host.total, host_available_bytes=reading.host.available,
        cgroup_problem=reading.cgroup_problem, **_cgroup_fields(reading.cgroup),
        siblings_reserved_bytes=siblings.reserved_bytes if siblings is not None else 0,
        siblings=siblings.processes if siblings is not None else 0,
    )


@dataclass(frozen=True)
class Pressure(Reading):
    """One pressure reading (``pressure()``).

    * ``level``: ``ok``, ``moderate``, ``high`` or ``critical``, the worst of the three signals below: free at or
      below 30 / 20 / 5 % of usable, ``some`` at or above 5 / 15 / 40 %, ``full`` at or above 2 / 10 / 30 % enter
      moderate / high / critical; a level is left only once every signal is past its mark for leaving (5 points
      more free, half the stall share), so a reading that hovers at a threshold does not flap;
    * ``free_bytes``, ``usable_bytes``, ``free_fraction``: free memory, usable memory, and the first over the second;
    * ``some``: PSI ``some`` avg10, the percent of the last 10 s in which at least one task waited for memory;
    * ``full``: PSI ``full`` avg10, the percent in which every non-idle task waited at once (no work was done);
    * ``psi_source``: the file they came from (the cgroup's ``memory.pressure`` or ``/proc/pressure/memory``).
      ``some``/``full``/``psi_source`` are ``None`` where the kernel has no PSI, never 0;
    * ``cause``: the signal(s) past the level's thresholds, e.g. ``some ≥ 5 %`` (``None`` at ``ok``);
    * ``psi_problem``: why stalls are not available although a PSI file is there (it could not be parsed);
    * ``stalls_ignored``: why ``some``/``full`` did not count toward the level: they are the host's
      (``/proc/pressure/memory`` or the root group's file: every group's stalls) and the host is not short of
      memory, limit or not (more than 30 % of its RAM free; 35 % once the level is above ``ok``); None when they
      counted;
    * ``throttled_s``: cgroup v2, seconds since the kernel last throttled the group at ``memory.high`` (its
      ``memory.events`` ``high`` count rose), for 10 s after each rise: the level is then at least ``high`` and
      the cause says ``throttled at memory.high``; None otherwise;
    * ``oom_group``: cgroup v2, the group one OOM kill takes whole (``memory.oom.group`` 1), named in the text.
    """

    level: Level
    free_bytes: int
    usable_bytes: int
    free_fraction: float
    some: float | None  # PSI avg10 percent; None = not available (never reported as 0)
    full: float | None
    psi_source: str | None
    cause: str | None = None  # the signal(s) that set the level, e.g. "some ≥ 5 %"; None at ok
    psi_problem: str | None = None  # why stalls are not available although a PSI file is there
    stalls_ignored: str | None = None  # why the stalls did not count toward the level
    throttled_s: float | None = None  # seconds since memory.high last throttled the group, within the window
    oom_group: str | None = None  # the group one OOM kill takes whole

    def __str__(self) -> str:
        if self.some is None:
            stalls = "stalls not available" + (f" ({self.psi_problem})" if self.psi_problem else "")
        else:
            full = "n/a" if self.full is None else f"{self.full:.1f} %"
            stalls = f"stalls {self.some:.1f} % (some) / {full} (full)"
            stalls += f" ({self.stalls_ignored})" if self.stalls_ignored and (self.some or self.full) else ""
        cause = f" — {self.cause}" if self.cause else ""
        whole = f"; {oom_group_note(self.oom_group)}" if self.oom_group else ""
        return (f"{self.level}: {fmt_size(self.free_bytes)} free ({self.free_fraction * 100:.0f} %), "
                f"{stalls}{cause}{whole}")


def pressure_from(reading: MemoryReading, previous: Level) -> Pressure:
    fraction = reading.free / reading.usable if reading.usable else 0.0
    psi = reading.psi
    some, full, source = (None, None, None) if psi is None else (psi.some, psi.full, psi.source)
    ignored = _stalls_ignored(reading, previous)
    counted_some, counted_full = (None, None) if ignored else (some, full)
    signals = pressure_level(fraction, counted_some, counted_full, previous)
    held = throttled(reading.throttled_s)
    level = throttle_level(signals, held)
    cause = pressure_cause(signals, fraction, counted_some, counted_full) if signals == level else None
    return Pressure(level, reading.free, reading.usable, fraction, some, full, source, throttle_cause(cause, held),
                    reading.psi_problem, ignored, reading.throttled_s if held else None,
                    reading.cgroup.oom_group if reading.cgroup else None)


def _stalls_ignored(reading: MemoryReading, previous: Level) -> str | None:
    if reading.psi is None:
        return None
    host = reading.host
    host_free = host.available / host.total if host.total else 0.0
    if host_stalls_count(reading.psi.host_wide, host_free, previous=previous):
        return None
    return f"host-wide, not counted: the host has {host_free:.0%} free"
