"""The ``Machine``: what the library reads from and keeps about the machine it runs on. ``machines`` holds the
``Machine`` class, ``machine()`` (the process's, or the one ``with m.use():`` chose for this thread or task) and
the module-level readings (``memory.limits()``, ``budget()``, ``pressure()``, ``current_level()``, ``cores()``,
``siblings()``); ``reading`` takes one reading of the kernel's files and gives ``Limits``, ``Pressure``,
``Budget`` and ``SiblingReading``; ``tracker`` re-measures the level at most twice a second and tells the
components of a change; ``held`` is the running total of RAM our arrays hold; ``reservations`` is the ledger the
processes of one memory group share, ``ledgers`` its files as the command line lists and cleans them;
``watcher`` is ``on_pressure`` and ``relieve``.

May import: decide, system, adapters.
"""

from .machines import (
    BUDGET_ENV,
    Machine,
    budget,
    cores,
    cores_from,
    current_level,
    limits,
    machine,
    pressure,
    siblings,
)
from .reading import Budget, Limits, Pressure, SiblingReading
from .watcher import Watcher, on_pressure, relieve

__all__ = ["BUDGET_ENV", "Budget", "Limits", "Machine", "Pressure", "SiblingReading", "Watcher", "budget", "cores",
           "cores_from", "current_level", "limits", "machine", "on_pressure", "pressure", "relieve", "siblings"]
