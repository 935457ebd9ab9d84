"""The ``Machine``: everything the library reads from or keeps about the machine it runs on, in one object.

Theory of operation
-------------------
A ``Machine`` holds the folder that stands for ``/`` (``root``, where the adapters read kernel files), the
``clock`` it waits on, the RAM ``budget`` set by ``budget()``, the ``ledger`` of RAM that ``memory.array`` holds,
the ``components`` (pools, stores) that hear of a level change, and the ``tracker`` that re-measures the level at
most twice a second. The module-level functions (``memory.limits()``, ``memory.array()``, ...) use
``machine()``: the process's own (made on first use from ``APSI_FS_ROOT`` and the system clock), or the one a
``with m.use():`` block installed. ``sim.machine(tree, clock=FakeClock())`` builds a ``Machine`` over a fake
``/proc`` and cgroup tree with a clock the test moves, so tests need no module globals patched or reset.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from .adapters.clock import Clock, SystemClock, checked_clock
from .adapters.procfs import ProcStatus, read_proc_status
from .decide import Level, shared_budget
from .errors import BudgetWarning, SizeError
from .ledger import Ledger
from .levels import Components, LevelTracker
from .measure import MemoryReader, MemoryReading
from .readings import Budget, Limits, Pressure, SiblingReading, limits_from, pressure_from
from .siblings import Siblings, group_key, shared
from .units import fmt_size, parse_size

BUDGET_ENV = "APSI_RAM_BUDGET"


class Machine:
    """One machine as the library sees it (see the module docstring)."""

    def __init__(self, root: str | None = None, clock: Clock | None = None,
                 siblings: Siblings | None | bool = True) -> None:
        self.clock: Clock = SystemClock() if clock is None else checked_clock(clock, "Machine: clock")
        self.reader = MemoryReader(root)  # its kernel files stay open until the machine is collected
        # The reservation ledger of the group: the process's own on the real machine (True), none over a fake tree
        # (its processes are not this machine's) or when None/False is given, or the one given.
        if siblings is True:
            siblings = shared() if os.path.realpath(self.reader.root) == "/" else None
        self.siblings: Siblings | None = siblings or None
        # The ledger tells the siblings of a change through them, not through the machine: no reference cycle.
        self.ledger = Ledger(None if self.siblings is None else partial(_publish_held, self.siblings))
        self.components = Components()
        # The tracker holds the reader, not the machine: no cycle, so a dropped machine closes its files at once.
        self.tracker = LevelTracker(partial(_measure_level, self.reader), self.clock, self.components.notify,
                                    self.components.hear)
        self.budget_set: int | None = None  # set by budget(); None: the default
        self._last: MemoryReading | None = None  # the reading level_and_limits took last

    @property
    def root(self) -> str:
        """The folder that stands for ``/``. Setting it points the machine elsewhere from the next reading on
        (its kept-open kernel files are closed, and those under the new root opened as they are read)."""
        return self.reader.root

    @root.setter
    def root(self, root: str) -> None:
        old, self.reader = self.reader, MemoryReader(root)
        self.tracker.measure = partial(_measure_level, self.reader)
        old.close()

    def __repr__(self) -> str:
        return f"<Machine root={self.root!r} level {self.tracker.level}>"

    @contextmanager
    def use(self) -> Iterator[Machine]:
        """Make this the machine the module-level functions use, until the block ends."""
        global _current
        previous, _current = _current, self
        try:
            yield self
        finally:
            _current = previous

    # -- readings --------------------------------------------------------------------------------------------------

    def memory(self) -> MemoryReading:
        return self.reader.read()

    def limits(self) -> Limits:
        reading = self.memory()
        others = self.sibling_reading(reading)
        return limits_from(reading, self.budget_from(reading, others), others)

    def level_and_limits(self, reserving: int = 0) -> tuple[Level, Limits]:
        """``current_level()`` and ``limits()`` from one reading, for an allocation path that needs both.
        ``reserving``: bytes about to be placed in RAM, published to the siblings before their entries are read,
        so of two processes placing at once at least one sees the other (``release`` takes it back); their
        entries are then read as an upper bound (``exact_limits`` reads them exactly, when the answer depends
        on it)."""
        due = self.tracker.due()
        reading = self.memory()
        if due is None:
            level = self.tracker.level
        else:  # published (and told to the components) before the budget is read, as current_level() then limits()
            level = self.tracker.publish(due[0], pressure_from(reading, due[1]).level)
        if reserving and self.siblings is not None:
            self.siblings.reserve(group_key(reading), reserving, self.ledger.held() + reserving)
        others = self.sibling_reading(reading, exact=not reserving)
        self._last = reading
        return level, limits_from(reading, self.budget_from(reading, others), others)

    def exact_limits(self) -> Limits:
        """``limits()`` of the reading ``level_and_limits`` last took, the siblings read exactly (only live
        processes, their reservations less what the kernel has charged since)."""
        reading = self._last or self.memory()
        others = self.sibling_reading(reading)
        return limits_from(reading, self.budget_from(reading, others), others)

    def release(self, reserved: int) -> None:
        """Take back a reservation ``level_and_limits(reserving=…)`` published for an array that went elsewhere."""
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
            return SiblingReading()
        return self.siblings.read(group_key(reading or self.memory()), exact)

    def pressure(self) -> Pressure:
        """Measure now; the level uses the last one for hysteresis and the components hear of a change."""
        ticket, previous = self.tracker.begin()
        reading = pressure_from(self.memory(), previous)
        self.tracker.publish(ticket, reading.level)
        return reading

    def current_level(self) -> Level:
        """The level for an allocation path: cheap, re-measured at most twice a second."""
        return self.tracker.current()

    def cores(self) -> int:
        return cores_from(read_proc_status(self.root))

    # -- the budget ------------------------------------------------------------------------------------------------

    def budget(self, gb: float | str | None = None) -> Budget:
        """Read the budget, or set it (see ``api.budget``)."""
        if isinstance(gb, str) and gb.strip().lower() == "auto":
            self.budget_set = None
        elif gb is not None:
            self.budget_set = parse_size(gb)
        reading = self.memory()
        if gb is not None and self.budget_set is not None and self.budget_set > reading.usable:
            _warn_above_usable(self.budget_set, reading.usable)
        return self.budget_from(reading)

    def budget_from(self, reading: MemoryReading, others: SiblingReading | None = None) -> Budget:
        if self.budget_set is not None:
            return Budget(self.budget_set, "set by budget()")
        from_env = os.environ.get(BUDGET_ENV)
        if from_env:
            try:
                return Budget(parse_size(from_env), BUDGET_ENV)
            except SizeError as exc:
                raise SizeError(f"{BUDGET_ENV}: {exc}") from None
        others = self.sibling_reading(reading) if others is None else others
        bytes_ = shared_budget(reading.free, self.ledger.held(), others.reserved_bytes, others.active + 1)
        if not (others.active or others.reserved_bytes):
            return Budget(bytes_, "70 % of free")
        return Budget(bytes_, f"70 % of free less {fmt_size(others.reserved_bytes)} reserved by siblings, shared by "
                              f"{others.active + 1} processes", others.reserved_bytes)


def _publish_held(siblings: Siblings, held: int) -> None:
    """Our RAM arrays' total changed: publish it, with what is unwritten (at most all of it)."""
    if siblings.key is not None and held != siblings.own().held:
        siblings.settle(siblings.key, held)


def _warn_above_usable(budget_bytes: int, usable: int) -> None:
    # A warning, not a log line: it is a mistake in the caller's code, shown at the caller's line (of
    # ``memory.budget``: this, Machine.budget, api.budget, the caller), once per line under Python's default
    # filter, and tests or -W error can turn it into an error.
    warnings.warn(BudgetWarning(f"budget {fmt_size(budget_bytes)} is more than the {fmt_size(usable)} usable here; "
                                "arrays are still placed by what is free"), stacklevel=4)


def _measure_level(reader: MemoryReader, previous: Level) -> Level:
    return pressure_from(reader.read(), previous).level


def cores_from(status: ProcStatus | None) -> int:
    """CPUs this process may run on, as ``nproc`` counts them (its affinity mask)."""
    if status is not None and status.cpus:
        return status.cpus
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_current: Machine | None = None  # installed by Machine.use(); None until the first machine() (no work at import)
_lock = threading.Lock()


def machine() -> Machine:
    """The machine the module-level functions use: the one installed by ``with m.use():``, else this process's
    own, made on first use (its root from ``APSI_FS_ROOT``, else ``/``)."""
    global _current
    found = _current
    if found is None:
        with _lock:
            if _current is None:
                _current = Machine()
            found = _current
    return found
