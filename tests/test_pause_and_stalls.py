"""Issue 22, items 1 and 2: a dask worker's pause rule that a paused cluster can leave, and host-wide stalls that
do not raise the level of a group with its own limit while the host has memory to spare (both pure rules in
``decide``, then on the sim machines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.decide import (
    DASK_PAUSE_FRACTION,
    DASK_RESUME_GAP,
    LEVELS,
    Level,
    worker_pause_cause,
)
from sim import tree as machines
from sim.tree import GiB, SimTree

levels = st.sampled_from(LEVELS)
fractions = st.floats(0.0, 1.0)
LIMIT = 1 << 30


# -- the pause rule -------------------------------------------------------------------------------------------------

@given(levels, fractions, st.booleans())
def test_a_paused_worker_resumes_under_the_pause_level_and_gap_whatever_the_level_was(level: Level, share: float,
                                                                                     paused: bool) -> None:
    rss = int(share * LIMIT)
    cause = worker_pause_cause(level, rss, LIMIT, paused)
    if level < Level.HIGH and rss / LIMIT < DASK_PAUSE_FRACTION - DASK_RESUME_GAP:
        assert cause is None  # moderate (memory held elsewhere) never keeps a worker paused
    if level >= Level.HIGH or rss / LIMIT >= DASK_PAUSE_FRACTION:
        assert cause is not None


@given(levels, levels, fractions, fractions, st.booleans())
def test_pausing_is_monotone_in_level_and_memory(a: Level, b: Level, s: float, t: float, paused: bool) -> None:
    low, high = sorted((a, b), key=lambda level: level.rank)
    small, big = sorted((s, t))
    if worker_pause_cause(low, int(small * LIMIT), LIMIT, paused):
        assert worker_pause_cause(high, int(big * LIMIT), LIMIT, paused)


@given(levels, fractions)
def test_a_paused_worker_stays_paused_whenever_a_running_one_would_pause(level: Level, share: float) -> None:
    if worker_pause_cause(level, int(share * LIMIT), LIMIT, paused=False):
        assert worker_pause_cause(level, int(share * LIMIT), LIMIT, paused=True)


def test_the_cause_names_the_signal() -> None:
    assert worker_pause_cause(Level.HIGH, 0, LIMIT, False) == "pressure high"
    assert worker_pause_cause(Level.OK, int(0.85 * LIMIT), LIMIT, False) == \
        "worker memory 85% of its limit (pauses at 80%)"
    assert worker_pause_cause(Level.OK, int(0.75 * LIMIT), LIMIT, True) == \
        "worker memory 75% of its limit (resumes under 70%)"
    assert worker_pause_cause(Level.MODERATE, int(0.75 * LIMIT), LIMIT, False) is None
    assert worker_pause_cause(Level.OK, 10**12, 0, False) is None  # no limit: only the level pauses


# -- host-wide stalls -----------------------------------------------------------------------------------------------

# The rule itself (limit or not, since issue 26 item 15) is tested in tests/test_host_stalls.py.

def test_a_thrasher_elsewhere_does_not_raise_a_v1_groups_level(sim_machine: Callable[..., Any]) -> None:
    """v1 host, 2 GiB group using 292 MiB: an unrelated group thrashes (host PSI some 45 %) while the host has 60 of
    64 GiB free. The group's level stays ok, and the reading says why the stalls did not count."""
    tree = sim_machine(machines.docker_v1, limit=2 * GiB, usage=292 << 20, inactive_file=0)
    tree.psi(45.0, 12.0)
    reading = memory.pressure()
    assert reading.level == Level.OK and reading.some == 45.0
    assert reading.stalls_ignored is not None and "host-wide, not counted" in str(reading)


def test_host_stalls_count_when_the_host_itself_is_short(sim_machine: Callable[..., Any]) -> None:
    tree = sim_machine(machines.docker_v1, limit=2 * GiB, usage=292 << 20, inactive_file=0)
    tree.meminfo(64 * GiB, 4 * GiB).psi(45.0, 12.0)
    reading = memory.pressure()
    assert reading.level == Level.CRITICAL and reading.stalls_ignored is None


def test_the_groups_own_stalls_always_count(sim_machine: Callable[..., Any]) -> None:
    """A hybrid host has the group's own memory.pressure in the v2 tree; without a limit, host-wide stalls count on
    a host short of memory (25 % free: moderate by free memory, high by the stalls)."""
    sim_machine(machines.hybrid, limit=5 * GiB, usage=1 * GiB, unified_psi=(16.0, 0.0))
    assert memory.pressure().level == Level.HIGH
    sim_machine(machines.host, available=2 * GiB).psi(16.0, 0.0)
    assert memory.pressure().level == Level.HIGH


def test_the_v2_root_groups_stalls_on_a_hybrid_host_are_the_hosts(sim_machine: Callable[..., Any]) -> None:
    """systemd's hybrid layout with the process in the v2 root group (``0::/``): the unified root's
    memory.pressure is every group's stalls, as /proc/pressure/memory is (this build machine is so)."""
    group = "/system.slice/app.service"
    tree = sim_machine(lambda root: SimTree(root).meminfo(64 * GiB, 60 * GiB).process().psi())
    tree.mount("/sys/fs/cgroup/memory", "cgroup", "memory").member(f"4:memory:{group}")
    tree.mount("/sys/fs/cgroup/unified", "cgroup2", "nsdelegate").member("0::/")
    tree.v1_group("/sys/fs/cgroup/memory")
    tree.v1_group(f"/sys/fs/cgroup/memory{group}", 2 * GiB, 292 << 20)
    tree.psi(45.0, 12.0, path="/sys/fs/cgroup/unified/memory.pressure")
    reading = memory.pressure()
    assert reading.psi_source == "/sys/fs/cgroup/unified/memory.pressure"
    assert reading.level == Level.OK and reading.stalls_ignored is not None
