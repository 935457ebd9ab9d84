"""Issue 26 item 15: host-wide stalls (``/proc/pressure/memory``, a hybrid host's v2 root group) are every group's
stalls at once, so they count toward the level only while the host itself is short of memory, limit or not; a
group's own ``memory.pressure`` counts as before. The pure rule, then ``pressure_from`` over any reading, then the
sim machines as ``memory.pressure()`` reads them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.adapters.cgroup import CgroupMemory
from apsi_memory.adapters.procfs import MemInfo
from apsi_memory.adapters.psi import SYSTEM_PSI, Psi
from apsi_memory.decide import HOST_SHORT_FREE, LEVEL_TABLE, LEVELS, Level, host_stalls_count, pressure_level
from apsi_memory.machinery.reading import MemoryReading, pressure_from
from sim import tree as machines
from sim.tree import GiB

levels = st.sampled_from(LEVELS)
fractions = st.floats(0.0, 1.0)
shares = st.floats(0.0, 100.0)
HOST_LEAVES_SHORT = LEVEL_TABLE[Level.MODERATE].leave_free  # the gate's own hysteresis
TOTAL = 64 * GiB


def _gate(previous: Level) -> float:
    return HOST_SHORT_FREE if previous == Level.OK else HOST_LEAVES_SHORT


# -- the rule -------------------------------------------------------------------------------------------------------

@given(st.booleans(), fractions, levels)
def test_host_wide_stalls_count_only_while_the_host_is_short(host_wide: bool, host_free: float,
                                                            previous: Level) -> None:
    counted = host_stalls_count(host_wide, host_free, previous=previous)
    assert counted == (not host_wide or host_free <= _gate(previous))


@given(st.booleans(), fractions, fractions, levels, levels)
def test_a_shorter_host_or_a_higher_level_never_counts_fewer_stalls(host_wide: bool, a: float, b: float,
                                                                   p: Level, q: Level) -> None:
    low, high = sorted((p, q), key=lambda level: level.rank)
    if host_stalls_count(host_wide, max(a, b), previous=low):
        assert host_stalls_count(host_wide, min(a, b), previous=high)


def test_the_gate_is_moderates_free_threshold() -> None:
    assert HOST_SHORT_FREE == LEVEL_TABLE[Level.MODERATE].enter_free


# -- pressure_from over any reading ---------------------------------------------------------------------------------

def _reading(host_free: float, some: float, full: float, limit: int | None, host_wide: bool = True) -> MemoryReading:
    host = MemInfo(TOTAL, int(TOTAL * host_free), 0, 0)
    group = None if limit is None else CgroupMemory(version=1, path="/job", directory="/sys/fs/cgroup/memory/job",
                                                    limit=limit, limit_file="memory.limit_in_bytes", working_set=0,
                                                    free=limit)
    return MemoryReading(host, group, Psi(some, full, SYSTEM_PSI, host_wide=host_wide))


limits = st.sampled_from([None, 2 * GiB])


@given(st.floats(HOST_LEAVES_SHORT + 0.001, 1.0), shares, shares, limits, levels)
def test_on_a_host_with_room_host_wide_stalls_never_raise_the_level(host_free: float, some: float, full: float,
                                                                    limit: int | None, previous: Level) -> None:
    reading = _reading(host_free, some, full, limit)
    got = pressure_from(reading, previous)
    fraction = reading.free / reading.usable
    assert got.level == pressure_level(fraction, None, None, previous), f"{got} (limit {limit})"
    assert got.some == some and got.stalls_ignored is not None


@given(st.floats(0.0, HOST_SHORT_FREE), shares, shares, limits, levels)
def test_on_a_short_host_host_wide_stalls_count(host_free: float, some: float, full: float, limit: int | None,
                                               previous: Level) -> None:
    reading = _reading(host_free, some, full, limit)
    got = pressure_from(reading, previous)
    assert got.level == pressure_level(reading.free / reading.usable, some, full, previous)
    assert got.stalls_ignored is None


@given(fractions, shares, shares, limits, levels)
def test_a_groups_own_stalls_always_count(host_free: float, some: float, full: float, limit: int | None,
                                          previous: Level) -> None:
    reading = _reading(host_free, some, full, limit, host_wide=False)
    got = pressure_from(reading, previous)
    assert got.level == pressure_level(reading.free / reading.usable, some, full, previous)


# -- the sim machines -----------------------------------------------------------------------------------------------

def test_a_busy_shared_host_with_89_percent_free_reads_ok_without_a_limit(sim_machine: Callable[..., Any]) -> None:
    """The issue's host: no cgroup limit, other tenants thrash at their own limits (host PSI some 80 %, full 40 %)
    while 89 % of RAM is free. Before: ``critical``, every big array to the SSD."""
    sim_machine(machines.host, total=TOTAL, available=int(TOTAL * 0.89)).psi(80.0, 40.0)
    reading = memory.pressure()
    print(f"89 % free, host PSI some 80 %: {reading}")
    assert reading.level == Level.OK, str(reading)
    assert reading.some == 80.0 and reading.stalls_ignored is not None
    assert "host-wide, not counted" in str(reading) and "89% free" in str(reading)


def test_the_same_stalls_on_a_short_host_raise_the_level(sim_machine: Callable[..., Any]) -> None:
    """Control: the same stalls with the host short do count (5 % free: critical; 25 % free, moderate by free memory
    alone, is raised to critical by the stalls)."""
    tree = sim_machine(machines.host, total=TOTAL, available=int(TOTAL * 0.05)).psi(80.0, 40.0)
    assert memory.pressure().level >= Level.HIGH
    tree.meminfo(TOTAL, int(TOTAL * 0.25))
    reading = memory.pressure()
    assert reading.level == Level.CRITICAL and reading.stalls_ignored is None, str(reading)
    assert reading.cause is not None and "some ≥ 40 %" in reading.cause


def test_the_gate_has_hysteresis_so_the_level_does_not_flap(sim_machine: Callable[..., Any]) -> None:
    """Host free hovering around 30 % under heavy host stalls: once they count, they go on counting until the host
    has more than 35 % free, as the free-memory signal itself leaves moderate."""
    tree = sim_machine(machines.host, total=TOTAL, available=int(TOTAL * 0.29)).psi(80.0, 40.0)
    seen = []
    for free in (0.29, 0.32, 0.29, 0.33, 0.36):
        tree.meminfo(TOTAL, int(TOTAL * free))
        seen.append(memory.pressure().level)
    assert seen == [Level.CRITICAL] * 4 + [Level.OK], seen


def test_a_pods_own_stalls_count_on_a_calm_host(sim_machine: Callable[..., Any]) -> None:
    """A v2 pod's own memory.pressure is its stalls, whatever the host has free."""
    sim_machine(machines.kubernetes_v2, limit=4 * GiB, current=1 * GiB, inactive_file=0, pod_psi=(45.0, 0.0))
    reading = memory.pressure()
    assert reading.level == Level.CRITICAL and reading.stalls_ignored is None, str(reading)
