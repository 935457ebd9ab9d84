"""A reading of the memory this process really has: the host's view narrowed by its cgroup (``MemoryReading``,
taken by a ``MemoryReader`` through the adapters), and the pressure level it gives (``level_from``, of its
``Stalls``). ``reading`` makes the public readings (``Limits``, ``Pressure``, ...) from one; they are dataclasses,
which take a while to define, and a first store needs only the level: so this module is apart (issue 29 item 4).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from ..adapters.cgroup import CgroupMemory, Layout, read_cgroup_memory, read_layout
from ..adapters.clock import Clock, SystemClock
from ..adapters.files import KernelFiles
from ..adapters.procfs import MemInfo, read_meminfo
from ..adapters.psi import Psi, read_psi
from ..adapters.root import resolve
from ..decide import (
    Level,
    free_memory,
    high_events_rose,
    host_stalls_count,
    pressure_level,
    throttle_level,
    throttled,
    usable_memory,
)
from ..errors import CorruptFileError


class MemoryReading(NamedTuple):
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
            return self._throttling(_reading(self.files, layout))

    def _throttling(self, reading: MemoryReading) -> MemoryReading:
        """``reading`` with how long ago its ``high`` count last rose, as this reader has seen it: a count
        already there at the first reading tells nothing of now."""
        count = reading.cgroup.high_events if reading.cgroup is not None else None
        before, rose_at = self._high
        now = self.clock.now()
        rose_at = now if high_events_rose(before, count) else rose_at
        self._high = count, rose_at if count is not None else None
        if count is None or rose_at is None:
            return reading
        return reading._replace(throttled_s=now - rose_at)

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


def _reading(files: KernelFiles, layout: Layout) -> MemoryReading:
    host = read_meminfo(files) or _host_from_psutil()
    group = read_cgroup_memory(host.total, files, layout)
    try:
        psi, psi_problem = read_psi(files, layout), None
    except CorruptFileError as exc:  # a stall reading we cannot parse must never hide the memory limit
        psi, psi_problem = None, str(exc)
    if isinstance(group, str):
        return MemoryReading(host, None, psi, group, psi_problem)
    return MemoryReading(host, group, psi, None, psi_problem)


class Stalls(NamedTuple):
    """What a reading's level is made of (``pressure_from`` shows each): ``fraction`` free of usable; ``some`` and
    ``full``, the PSI shares counted toward the level (None: not available, or ``ignored``, which says why);
    ``signals``, the level of those alone; ``held``, throttled at ``memory.high`` within the window; ``level``."""

    fraction: float
    some: float | None
    full: float | None
    ignored: str | None
    signals: Level
    held: bool
    level: Level


def stalls_of(reading: MemoryReading, previous: Level) -> Stalls:
    fraction = reading.free / reading.usable if reading.usable else 0.0
    ignored = _stalls_ignored(reading, previous)
    psi = None if ignored else reading.psi
    some, full = (None, None) if psi is None else (psi.some, psi.full)
    signals = pressure_level(fraction, some, full, previous)
    held = throttled(reading.throttled_s)
    return Stalls(fraction, some, full, ignored, signals, held, throttle_level(signals, held))


def level_from(reading: MemoryReading, previous: Level) -> Level:
    """The pressure level of ``reading``: ``pressure_from(reading, previous).level``, without the ``Pressure``."""
    return stalls_of(reading, previous).level


def _stalls_ignored(reading: MemoryReading, previous: Level) -> str | None:
    if reading.psi is None:
        return None
    host = reading.host
    host_free = host.available / host.total if host.total else 0.0
    if host_stalls_count(reading.psi.host_wide, host_free, previous=previous):
        return None
    return f"host-wide, not counted: the host has {host_free:.0%} free"
