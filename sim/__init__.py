"""Fake machines for tests: ``sim.machine(tree)`` is a real ``apsi_memory.Machine`` that reads a ``sim.tree``
written under a temporary folder and waits on a ``sim.clock.FakeClock``."""

from __future__ import annotations

import os

from apsi_memory.adapters.clock import Clock
from apsi_memory.machinery.machines import Machine
from sim.clock import FakeClock
from sim.tree import SimTree


def machine(tree: SimTree | str | os.PathLike[str], clock: Clock | None = None) -> Machine:
    """A ``Machine`` over ``tree``'s files, on ``clock`` (a fresh ``FakeClock`` by default)."""
    return Machine(root=str(tree), clock=FakeClock() if clock is None else clock)
