"""How components (pools, stores) reach the default machine's registry: ``register`` once, ``unregister`` when
closed. ``notify`` and ``relieve_components`` tell them all, as a level change or ``relieve()`` does.

The registry and the level tracker themselves are in ``levels`` (one per ``Machine``); a component made while a
``Machine`` is installed (``with m.use():``) hears that machine's levels.
"""

from __future__ import annotations

from .decide import Level
from .levels import Component
from .machinery import machine

__all__ = ["Component", "notify", "register", "relieve_components", "unregister"]


def register(component: Component) -> None:
    machine().components.register(component)


def unregister(component: Component) -> None:
    machine().components.unregister(component)


def notify(level: Level, previous: Level = Level.OK) -> None:
    """Tell every component of the default machine the new level (see ``levels.Components.notify``)."""
    machine().components.notify(level, previous)


def relieve_components() -> None:
    machine().components.relieve()
