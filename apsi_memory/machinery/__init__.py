"""The ``Machine``: what the library reads from and keeps about the machine it runs on. ``machines`` holds the
``Machine`` class, ``machine()`` (the process's, or the one ``with m.use():`` chose for this thread or task) and the
module-level readings (``memory.limits()``, ``budget()``, ``pressure()``, ``current_level()``, ``cores()``,
``siblings()``); ``reader`` takes one reading of the kernel's files and its pressure level, ``reading`` gives
``Limits``, ``Pressure``, ``Budget`` and ``SiblingReading`` from it; ``tracker`` re-measures the level at most twice
a second and tells the components of a change; ``held`` is the running total of RAM our arrays hold; ``reservations``
is the ledger the processes of one memory group share, ``ledgers`` its files as the command line lists and cleans
them; ``watcher`` is ``on_pressure`` and ``relieve``.

May import: decide, system, adapters.
"""

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .reading import Budget, Limits, Pressure, SiblingReading
    from .watcher import Watcher, on_pressure, relieve

# Imported on first use: the readings are dataclasses, slow to define, and the watcher brings userfaultfd's and
# libc's tools; a store needs neither (issue 29 item 4).
_LATER = dict.fromkeys(("Budget", "Limits", "Pressure", "SiblingReading"), "reading") | dict.fromkeys(
    ("Watcher", "on_pressure", "relieve"), "watcher")


def __getattr__(name: str) -> Any:
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)

__all__ = ["BUDGET_ENV", "Budget", "Limits", "Machine", "Pressure", "SiblingReading", "Watcher", "budget", "cores",
           "cores_from", "current_level", "limits", "machine", "on_pressure", "pressure", "relieve", "siblings"]
