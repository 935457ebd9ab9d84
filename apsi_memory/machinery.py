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
from .decide import Level, default_budget
from .errors import BudgetWarning, SizeError
from .ledger import Ledger
from .levels import Components, LevelTracker
from .measure import MemoryReader, MemoryReading
from .readings import Budget, Limits, Pressure, limits_from, pressure_from
from .units import fmt_size, parse_size

BUDGET_ENV = "APSI_RAM_BUDGET"


class Machine:
    """One machine as the library sees it (see the module docstring)."""

    def __init__(self, root: str | None = None, clock: Clock | None = None) -> None:
        self.clock: Clock = SystemClock() if clock is None else checked_clock(clock, "Machine: clock")
        self.reader = MemoryReader(root)  # its kernel files stay open until the machine is collected
        self.ledger = Ledger()
        self.components = Components()
        # The tracker holds the reader, not the machine: no cycle, so a dropped machine closes its files at once.
        self.tracker = LevelTracker(partial(_measure_level, self.reader), self.clock, self.components.notify,
                                    self.components.hear)
        self.budget_set: int | None = None  # set by budget(); None: the default

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
        return limits_from(reading, self.budget_from(reading))

    def level_and_limits(self) -> tuple[Level, Limits]:
        """``current_level()`` and ``limits()`` from one reading, for an allocation path that needs both."""
        due = self.tracker.due()
        reading = self.memory()
        if due is None:
            level = self.tracker.level
        else:  # published (and told to the components) before the budget is read, as current_level() then limits()
            level = self.tracker.publish(due[0], pressure_from(reading, due[1]).level)
        return level, limits_from(reading, self.budget_from(reading))

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

    def budget_from(self, reading: MemoryReading) -> Budget:
        if self.budget_set is not None:
            return Budget(self.budget_set, "set by budget()")
        from_env = os.environ.get(BUDGET_ENV)
        if from_env:
            try:
                return Budget(parse_size(from_env), BUDGET_ENV)
            except SizeError as exc:
                raise SizeError(f"{BUDGET_ENV}: {exc}") from None
        return Budget(default_budget(reading.free, self.ledger.held()), "70 % of free")


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
