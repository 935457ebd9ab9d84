"""A container whose memory use and stalls a test sets, read by the real library through ``sim.machine``.

The machine is ``sim.tree.docker_v1`` (a v1 memory cgroup with a limit) on a ``FakeClock``; ``at(level)`` rewrites
the group's usage so that the kernel files show that pressure level, and ``stalls(some, full)`` rewrites PSI
(``/proc/pressure/memory``), so a level can come from either signal. Nothing of ours is mocked: the ``Machine``
reads these files through the adapters, as it reads ``/``.
"""

from __future__ import annotations

import os

from apsi_memory.decide import LEVEL_TABLE, Level
from sim import machine
from sim.clock import FakeClock
from sim.tree import GiB, MiB, docker_v1

GROUP = "/sys/fs/cgroup/memory"
HOST_TOTAL, HOST_AVAILABLE = 64 * GiB, 60 * GiB  # docker_v1's host


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
        self.machine = machine(self.tree, self.clock)

    def set_usage(self, n_bytes: int) -> None:
        self.tree.v1_group(GROUP, self.limit, n_bytes, 0)

    def at(self, level: Level) -> None:
        """Show ``level`` in the files; the tracker sees it at its next measurement."""
        self.set_usage(int(self.limit * used_share(level)))

    def stalls(self, some: float, full: float | None = 0.0, host_short: bool = True) -> None:
        """Show PSI ``some``/``full`` avg10 (percent) in ``/proc/pressure/memory``. Host-wide stalls count toward the
        level, limit or not, only while the host is short of memory (``decide.host_stalls_count``), so by default
        the host's available memory drops to 10 % with them; ``host_short=False`` leaves it at 60 of 64 GiB (a
        thrashing group elsewhere on a calm host)."""
        self.tree.meminfo(HOST_TOTAL, HOST_TOTAL // 10 if host_short and some else HOST_AVAILABLE)
        self.tree.psi(some, full)

    def next_measurement(self) -> None:
        """Move the clock to when the tracker measures again."""
        self.clock.advance(0.5)
