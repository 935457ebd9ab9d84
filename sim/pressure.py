"""A container whose memory use a test sets, read by the real ``api`` through the lead's sim tree.

The machine is ``sim.tree.docker_v1`` (a v1 memory cgroup with a limit); ``at(level)`` rewrites the group's usage
so that the kernel files show that pressure level, and the level tracker runs on a ``FakeClock`` so its
"at most twice a second" is under the test's control. Nothing of ours is mocked: ``api`` reads these files through
the adapters' root (``apsi_memory.adapters.root.ROOT``), the same injection point as ``APSI_FS_ROOT``.
"""

from __future__ import annotations

import os
from typing import Any

from apsi_memory import api
from apsi_memory.adapters import root as fs_root
from apsi_memory.decide import LEVEL_TABLE, Level
from apsi_memory.reactions import LevelTracker
from sim.clock import FakeClock
from sim.tree import MiB, docker_v1

GROUP = "/sys/fs/cgroup/memory"


def used_share(level: Level) -> float:
    """A share of the limit in use that shows ``level`` whatever the previous one: free 2.5 points under the
    level's entry threshold, which is also past the leave threshold of the level above (hysteresis)."""
    if level is Level.OK:
        return 0.0
    return 1.0 - LEVEL_TABLE[level].enter_free + 0.025


class PressureMachine:
    def __init__(self, root: str | os.PathLike[str], limit: int = 256 * MiB) -> None:
        self.limit = limit
        self.tree = docker_v1(root, limit=limit, usage=0, inactive_file=0)
        self.clock = FakeClock()
        self.tracker = LevelTracker(api._measure_level, self.clock)

    def install(self, monkeypatch: Any) -> PressureMachine:
        """Point the real api at this machine for one test (``monkeypatch`` undoes it)."""
        monkeypatch.setattr(fs_root, "ROOT", str(self.tree))
        monkeypatch.setattr(api, "TRACKER", self.tracker)
        monkeypatch.delenv(api.BUDGET_ENV, raising=False)
        return self

    def use(self, n_bytes: int) -> None:
        self.tree.v1_group(GROUP, self.limit, n_bytes, 0)

    def at(self, level: Level) -> None:
        """Show ``level`` in the files; the tracker sees it at its next measurement."""
        self.use(int(self.limit * used_share(level)))

    def next_measurement(self) -> None:
        """Move the clock to when the tracker measures again."""
        self.clock.advance(0.5)
