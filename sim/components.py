"""A component that records what it is told: register one on a machine (``machine.components.register``) or a
``Components`` of its own to see the levels announced, in order."""

from __future__ import annotations

from apsi_memory.decide import Level


class Heard:
    """A component that records every level it is told, and has nothing to relieve."""

    def __init__(self) -> None:
        self.levels: list[Level] = []

    def on_level(self, level: Level) -> None:
        self.levels.append(level)

    def relieve(self) -> None:
        pass
