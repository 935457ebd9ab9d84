"""The ``Machine``: everything the library reads from or keeps about the machine it runs on, in one object.

Theory of operation
-------------------
A ``Machine`` holds the folder that stands for ``/`` (``root``, where the adapters read kernel files), the
``clock`` it waits on, the RAM ``budget`` set by ``budget()``, the ``ledger`` of RAM that ``memory.array`` holds,
the ``components`` (pools, stores) that hear of a level change, and the ``tracker`` that re-measures the level at
most twice a second. The module-level functions (``memory.limits()``, ``memory.array()``, ...) use
``machine()``: the process's own (made on first use from ``APSI_FS_ROOT`` and the system clock), or the one a
``with m.use():`` block installed in this thread or task. ``sim.machine(tree, clock=FakeClock())`` builds a
``Machine`` over a fake ``/proc`` and cgroup tree with a clock the test moves, so tests need no module globals
patched or reset.
"""

from __future__ import annotations

import contextvars
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial
from typing import TYPE_CHECKING, NamedTuple

from ..adapters.clock import Clock, SystemClock, checked_clock
from ..adapters.cpus import core_cache_bytes
from ..adapters.procfs import ProcStatus, read_proc_status
from ..adapters.root import resolve
from ..decide import Level, shared_budget
from ..errors import BudgetWarning, SizeError
from ..units import fmt_size, parse_size
from .held import Ledger
from .reader import MemoryReader, MemoryReading, level_from
from .reservations import Siblings, group_key, shared
from .tracker import Components, LevelTracker

# The public readings are imported by the methods that give one: they are dataclasses, slow to define, and a store
# needs only the level (issue 29 item 4).
if TYPE_CHECKING:
    from .reading import Budget, Limits, Pressure, SiblingReading

BUDGET_ENV = "APSI_RAM_BUDGET"
CORE_CACHE_BYTES = 1 << 20  # a core's own cache where sysfs does not say: the level 2 of current x86 server cores
CREDIT_MAX = 16 << 20  # a placement credit (``Siblings.draw``): at most this, and a 256th of usable memory
CREDIT_ROOM = 4  # taken only while the room after the placement is at least this many credits


class Room(NamedTuple):
    """What a placement reads (``Machine.level_and_room``): the RAM budget, the memory free less what the siblings
    reserved (placed in RAM, not yet charged), and how many siblings were counted."""

    budget_bytes: int
    free_bytes: int
    siblings: int


@cache
def _no_siblings() -> SiblingReading:
    """The reading of a machine without a ledger, made once (a placement asks for it each time)."""
    from .reading import SiblingReading

    return SiblingReading()


class Machine:
    """One machine as the library sees it: the folder that stands for ``/`` (``root``, where its kernel files are
    read), the clock it waits on, the RAM budget ``budget()`` set, the RAM its arrays (``memory.array``) hold, the
    level (re-measured at most twice a second) and the pools and stores that hear when it changes.

    The module-level functions (``memory.limits()``, ``memory.array()``, ...) use ``machine()``: this process's own,
    made on first use (its root from ``APSI_FS_ROOT``, else ``/``), or the one a ``with m.use():`` block installed
    in this thread or task. ``Machine(root=folder)`` reads ``proc`` and ``sys/fs/cgroup`` under ``folder`` instead
    (a test's fake tree: ``sim.machine(tree)``). ``siblings``: ``True`` shares the memory group's reservation
    ledger with the other processes of this user where the root is ``/`` (under another root there is none);
    ``False`` or ``None``: none."""

    def __init__(self, root: str | None = None, clock: Clock | None = None,
                 siblings: Siblings | None | bool = True) -> None:
        self.clock: Clock = SystemClock() if clock is None else checked_clock(clock, "Machine: clock")
        self.reader = MemoryReader(root, self.clock)  # its kernel files stay open until the machine is collected
        # The reservation ledger of the group: the process's own on the real machine (True), none over a fake tree
        # (its processes are not this machine's) or when None/False is given, or the one given.
        if siblings is True:
            siblings = shared() if os.path.realpath(self.reader.root) == "/" else None
        self.siblings: Siblings | None = siblings or None
        # The ledger tells the siblings of a change through them, not through the machine: no reference cycle.
        self.ledger = Ledger(None if self.siblings is None else self.siblings.tell)
        self.components = Components()
        # The tracker holds the reader, not the machine: no cycle, so a dropped machine closes its files at once.
        self.tracker = LevelTracker(partial(_measure_level, self.reader), self.clock, self.components.notify,
                                    self.components.hear)
        self.budget_set: int | None = None  # set by budget(); None: the default
        self._last: MemoryReading | None = None  # the reading level_and_room took last
        self._cache_bytes: int | None = None  # read from sysfs on first use: a core's cache does not change

    @property
    def root(self) -> str:
        """The folder that stands for ``/``. Setting it points the machine elsewhere from the next reading on
        (its kept-open kernel files are closed, and those under the new root opened as they are read)."""
        return self.reader.root

    @root.setter
    def root(self, root: str) -> None:
        old, self.reader = self.reader, MemoryReader(root, self.clock)
        self._cache_bytes = None  # another machine's cache
        self.tracker.measure = partial(_measure_level, self.reader)
        old.close()

    def __repr__(self) -> str:
        return f"<Machine root={self.root!r} level {self.tracker.level}>"

    @contextmanager
    def use(self) -> Iterator[Machine]:
        """Make this the machine the module-level functions use in this thread (or asyncio task), until the block
        ends; other threads keep theirs. The library's own threads (``map``'s workers, a watcher) are started
        with the context of the thread that started them, so they use the same machine."""
        token = _chosen.set(self)
        try:
            yield self
        finally:
            _chosen.reset(token)

    # -- readings --------------------------------------------------------------------------------------------------

    def memory(self) -> MemoryReading:
        return self.reader.read()

    def limits(self) -> Limits:
        reading = self.memory()
        return self._limits(reading, self.sibling_reading(reading))

    def level_and_room(self, reserving: int = 0) -> tuple[Level, Room]:
        """``current_level()`` and the ``Room`` for a placement, from one reading. ``reserving``: bytes about to be
        placed in RAM, published to the siblings before their entries are read, so of two processes placing at once
        at least one sees the other (``release`` takes it back); their entries are then read as an upper bound
        (``exact_room`` reads them exactly, when the answer depends on it). No ``Limits`` is built: a placement
        needs three of its numbers."""
        due = self.tracker.due()
        reading = self.memory()
        if due is None:
            level = self.tracker.level
        else:  # published (and told to the components) before the budget is read, as current_level() then limits()
            level = self.tracker.publish(due[0], level_from(reading, due[1]))
        self._last = reading
        if reserving and self.siblings is not None:
            return level, self._placing(self.siblings, reading, reserving, level)
        return level, self._room(reading, self.sibling_reading(reading))

    def _placing(self, siblings: Siblings, reading: MemoryReading, reserving: int, level: Level) -> Room:
        """The room for placing ``reserving`` bytes: published, then the siblings read as an upper bound. A placement
        that fits in this process's credit draws on it instead, and takes the siblings as the full step that
        published the credit read them (``Siblings.draw``: why that is safe). Where the room after the placement
        holds under ``CREDIT_ROOM`` credits, what is left of the credit is given up: memory is tight, and every
        placement takes the full step (with no credit taken, there is nothing to give up)."""
        key = group_key(reading)
        others = siblings.draw(key, reserving) if level is Level.OK else None
        if others is None:
            others, room = self._full_step(siblings, reading, key, reserving, level)
        else:
            room = self._room(reading, others)
        size = siblings.credit_size
        if size and not self._roomy(room, reserving, size):
            siblings.revoke()
        return room

    def _full_step(self, siblings: Siblings, reading: MemoryReading, key: str, reserving: int,
                   level: Level) -> tuple[SiblingReading, Room]:
        """Publish ``reserving``, with a credit on top where there is room for it, then read the siblings; what
        they hold, and the room."""
        usable, last = reading.usable, siblings.last or _no_siblings()
        size = min(CREDIT_MAX, usable // 256)  # the credit's size
        before = self._room(reading, last)
        # Only beside a placement no bigger than the credit (a bigger one costs far more than its ledger step, and
        # stays decided as before, with nothing reserved beside it), and only where it left room with the siblings
        # as last read (and after this reading: ``_placing`` takes it back where it does not).
        credit = size if level is Level.OK and reserving <= size and self._roomy(before, reserving, size) else 0
        others = siblings.reserve_and_read(key, reserving, self.ledger.held() + reserving, usable, credit)
        # The same reading object: their records are as they were (``Siblings._upper_bound``), so is the room.
        return others, before if others is last else self._room(reading, others)

    def _roomy(self, room: Room, reserving: int, size: int) -> bool:
        """Whether the room after placing ``reserving`` still holds ``CREDIT_ROOM`` credits, every RAM array we
        hold counted as unwritten (no ``mincore``)."""
        held = self.ledger.held()
        return min(room.budget_bytes - held, room.free_bytes - held) - reserving >= CREDIT_ROOM * size

    def exact_room(self) -> Room:
        """The ``Room`` of the reading ``level_and_room`` last took, the siblings read exactly (only live
        processes, their reservations less what the kernel has charged since)."""
        reading = self._last or self.memory()
        return self._room(reading, self.sibling_reading(reading))

    def _room(self, reading: MemoryReading, others: SiblingReading) -> Room:
        free = reading.free  # a property that reads five more: taken once
        return Room(self._budget_bytes(reading, others, free), free - others.reserved_bytes, others.processes)

    def _limits(self, reading: MemoryReading, others: SiblingReading) -> Limits:
        from .reading import limits_from

        return limits_from(reading, self.budget_from(reading, others), others)

    def release(self, reserved: int) -> None:
        """Take back a reservation ``level_and_room(reserving=…)`` published for an array that went elsewhere."""
        if self.siblings is not None and self.siblings.key is not None:
            self.siblings.settle(self.siblings.key, self.ledger.held(), reserved)

    def join(self) -> SiblingReading:
        """Enter this process in its group's ledger (as it stands: no reservation), then read its siblings."""
        reading = self.memory()
        if self.siblings is not None:
            self.siblings.settle(group_key(reading), self.ledger.held())
        return self.sibling_reading(reading)

    def sibling_reading(self, reading: MemoryReading | None = None, exact: bool = True) -> SiblingReading:
        """The other processes of this user in this memory group (``siblings()``)."""
        if self.siblings is None:
            return _no_siblings()
        reading = reading or self.memory()
        return self.siblings.read(group_key(reading), exact, cap=reading.usable)  # a claim above it is nonsense

    def pressure(self) -> Pressure:
        """Measure now; the level uses the last one for hysteresis and the components hear of a change."""
        from .reading import pressure_from

        ticket, previous = self.tracker.begin()
        reading = pressure_from(self.memory(), previous)
        self.tracker.publish(ticket, reading.level)
        return reading

    def current_level(self) -> Level:
        """The level for an allocation path: cheap, re-measured at most twice a second."""
        return self.tracker.current()

    def cores(self) -> int:
        return cores_from(read_proc_status(self.root))

    def cache_bytes(self) -> int:
        """The cache a core has to itself (its level-2 cache), or ``CORE_CACHE_BYTES`` where sysfs does not say;
        read once per root (every ``map`` call asks, and sysfs takes a dozen file reads to answer)."""
        if self._cache_bytes is None:
            self._cache_bytes = core_cache_bytes(self.root) or CORE_CACHE_BYTES
        return self._cache_bytes

    # -- the budget ------------------------------------------------------------------------------------------------

    def budget(self, gb: float | str | None = None) -> Budget:
        """Read this machine's budget, or set it, as ``memory.budget()`` does for the machine in use."""
        if isinstance(gb, str) and gb.strip().lower() == "auto":
            self.budget_set = None
        elif gb is not None:
            self.budget_set = parse_size(gb)
        reading = self.memory()
        if gb is not None and self.budget_set is not None and self.budget_set > reading.usable:
            _warn_above_usable(self.budget_set, reading.usable, gb)
        return self.budget_from(reading)

    def budget_from(self, reading: MemoryReading, others: SiblingReading | None = None) -> Budget:
        from .reading import Budget

        if self.budget_set is not None:
            return Budget(self.budget_set, "set by budget()")
        from_env = os.environ.get(BUDGET_ENV)
        if from_env:
            try:
                return Budget(parse_size(from_env), BUDGET_ENV)
            except SizeError as exc:
                raise SizeError(f"{BUDGET_ENV}: {exc}") from None
        others = self.sibling_reading(reading) if others is None else others
        bytes_ = self._shared_budget(reading.free, others)
        if not (others.active or others.reserved_bytes):
            return Budget(bytes_, "70 % of free")
        return Budget(bytes_, f"70 % of free less {fmt_size(others.reserved_bytes)} reserved by siblings, shared by "
                              f"{others.active + 1} processes", others.reserved_bytes)

    def _budget_bytes(self, reading: MemoryReading, others: SiblingReading, free: int) -> int:
        """``budget_from(reading, others).bytes``, without the words of its source where it is the default (a
        placement needs the number, and with siblings the words cost a formatted size); ``free``: ``reading``'s."""
        if self.budget_set is None and not os.environ.get(BUDGET_ENV):
            return self._shared_budget(free, others)
        return self.budget_from(reading, others).bytes

    def _shared_budget(self, free: int, others: SiblingReading) -> int:
        return shared_budget(free, self.ledger.held(), others.reserved_bytes, others.active + 1)


def _warn_above_usable(budget_bytes: int, usable: int, given: float | str) -> None:
    # A warning, not a log line: it is a mistake in the caller's code, shown at the caller's line (of
    # ``memory.budget``: this, Machine.budget, the module-level budget, the caller), once per line under Python's default
    # filter, and tests or -W error can turn it into an error.
    unit = "" if isinstance(given, str) else f" (budget({given!r}): a number is GB)"
    warnings.warn(BudgetWarning(f"budget {fmt_size(budget_bytes)}{unit} is more than the {fmt_size(usable)} usable "
                                "here; arrays are still placed by what is free"), stacklevel=4)


def _measure_level(reader: MemoryReader, previous: Level) -> Level:
    return level_from(reader.read(), previous)


def cores_from(status: ProcStatus | None) -> int:
    """CPUs this process may run on, as ``nproc`` counts them (its affinity mask)."""
    if status is not None and status.cpus:
        return status.cpus
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# A ContextVar, not a global: ``with m.use():`` in one thread (a test, a request handler) is not every thread's machine.
_chosen: contextvars.ContextVar[Machine | None] = contextvars.ContextVar("apsi_memory_machine", default=None)
_own: Machine | None = None  # this process's, made on the first machine() (no work at import)
_lock = threading.Lock()


def machine() -> Machine:
    """The machine the module-level functions use: the one ``with m.use():`` installed in this thread or task, else
    this process's own, made on first use (its root from ``APSI_FS_ROOT``, else ``/``)."""
    global _own
    found = _chosen.get() or _own
    if found is None:
        with _lock:
            if _own is None:
                _own = Machine()
            found = _own
    return found


# -- the default machine's readings: memory.budget(), limits(), pressure(), current_level(), cores(), siblings()

def budget(gb: float | str | None = None) -> Budget:
    """Read the RAM budget for big arrays, or set it: ``budget(16)`` (GB), ``budget("512MB")``; ``budget("auto")``
    goes back to the default (``APSI_RAM_BUDGET``, else 70 % of what is free)."""
    return machine().budget(gb)


def limits() -> Limits:
    """Usable memory, free memory and the budget, from the cgroup (limits re-read on every call) and the host.
    ``str()``: ``1.0 GB usable (container (cgroup v1)), 1.0 GB free, budget 0.7 GB``."""
    return machine().limits()


def pressure() -> Pressure:
    """Measure now; the level uses the last one for hysteresis and registered components hear of a change."""
    return machine().pressure()


def current_level() -> Level:
    """The level for an allocation path: cheap, re-measured at most twice a second."""
    return machine().current_level()


def cores(root: str | None = None) -> int:
    """CPUs this process may run on, as ``nproc`` counts them (its affinity mask); ``root`` reads another
    ``/proc`` than the machine's."""
    if root is None:
        return machine().cores()
    return cores_from(read_proc_status(resolve(root)))


def siblings() -> SiblingReading:
    """The other processes of this user in this memory group that use the library: how many (``processes``),
    how many hold RAM arrays (``active``), and what they placed in RAM and the kernel has not charged yet
    (``reserved_bytes``). Calling it enters this process in the group's ledger, so its siblings count it too."""
    return machine().join()
