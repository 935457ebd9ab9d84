"""What only cgroup v2 has (issue 27, item 3): ``memory.high`` throttling and ``memory.oom.group``, on sim trees read
by the real adapters. The same rules on the real kernel: tests/vm/test_v2_headline.py and tests/vm/test_v2_edges.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import apsi_memory as memory
from apsi_memory import decide
from apsi_memory.decide import Level
from apsi_memory.machinery.machines import machine
from sim import tree as machines
from sim.clock import FakeClock
from sim.tree import GiB, MiB, SimTree

BuildMachine = Callable[..., SimTree]
JOB = "/sys/fs/cgroup/app.slice/job.service"


# -- memory.high below memory.max: the kernel throttles rather than kills ------------------------------------------

def test_limits_under_memory_high_are_the_throttle_point(sim_machine: BuildMachine) -> None:
    # Kept on purpose: above memory.high the kernel stalls the job (46 s for 64 MiB over, in the VM), so planning
    # with memory.max would plan a stall.
    sim_machine(machines.memory_high_below_max, high=512 * MiB, limit=1 * GiB, current=300 * MiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.limit_bytes) == (512 * MiB, 512 * MiB)
    assert limits.limit_file == f"{JOB}/memory.high" and limits.free_bytes == 212 * MiB


def test_rising_high_events_raise_the_level_to_high(sim_machine: BuildMachine) -> None:
    # 41 % free and PSI at 0 (its avg10 lags ten seconds behind): by free memory and stalls alone, ok. The kernel
    # has just throttled the group 25 times: the job is at its wall, so new arrays must go to the SSD.
    tree = sim_machine(machines.memory_high_below_max, high=512 * MiB, current=300 * MiB, high_events=0)
    first = memory.pressure()
    tree.v2_events(JOB, high=25)
    throttled = memory.pressure()
    print(f"before: {first}; after 25 high events: {throttled}")
    assert (first.level, throttled.level) == (Level.OK, Level.HIGH), f"throttled, yet {throttled}"
    assert first.throttled_s is None
    assert throttled.throttled_s is not None and throttled.cause == "throttled at memory.high"
    assert str(throttled).endswith("— throttled at memory.high")
    assert throttled.to_dict()["throttled_s"] == throttled.throttled_s


def test_throttling_ends_after_its_window_on_the_machines_clock(sim_machine: BuildMachine) -> None:
    # The machine's clock is the one seam time goes through: on a FakeClock, 10 s without a new high event end the
    # throttled state without a real second passing (it once read time.monotonic(), and stayed throttled).
    tree = sim_machine(machines.memory_high_below_max, high=512 * MiB, current=300 * MiB, high_events=0)
    clock = machine().clock
    assert isinstance(clock, FakeClock)
    memory.pressure()
    tree.v2_events(JOB, high=25)
    assert memory.pressure().throttled_s == 0
    clock.advance(decide.THROTTLE_WINDOW_S - 1)
    still = memory.pressure()
    clock.advance(2)
    after = memory.pressure()
    assert (still.level, still.throttled_s) == (Level.HIGH, decide.THROTTLE_WINDOW_S - 1), still
    assert (after.level, after.throttled_s, after.cause) == (Level.OK, None, None), after


def test_control_high_events_that_do_not_rise_leave_the_level_alone(sim_machine: BuildMachine) -> None:
    # The control: 25 events from long ago (the first reading sees them already there) are no throttling now.
    sim_machine(machines.memory_high_below_max, current=300 * MiB, high_events=25)
    readings = [memory.pressure(), memory.pressure()]
    assert [r.level for r in readings] == [Level.OK, Level.OK] and readings[1].throttled_s is None


def test_throttling_adds_its_cause_to_a_level_already_high(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.memory_high_below_max, high=512 * MiB, current=500 * MiB)
    memory.pressure()
    tree.v2_events(JOB, high=3)
    reading = memory.pressure()
    assert reading.level == Level.CRITICAL and reading.cause == "free ≤ 5 % and throttled at memory.high"


def test_throttle_rule_is_pure_and_monotone() -> None:
    assert decide.high_events_rose(3, 4) and not decide.high_events_rose(4, 4)
    assert not decide.high_events_rose(None, 4) and not decide.high_events_rose(4, None)
    assert decide.throttled(0.0) and decide.throttled(decide.THROTTLE_WINDOW_S) and not decide.throttled(None)
    assert not decide.throttled(decide.THROTTLE_WINDOW_S + 0.1)
    for level in decide.LEVELS:
        assert decide.throttle_level(level, True) == max(level, Level.HIGH, key=lambda lv: lv.rank)
        assert decide.throttle_level(level, False) == level


# -- memory.oom.group: one kill takes the whole group ---------------------------------------------------------------

def test_oom_group_is_said_in_pressure_and_limits(sim_machine: BuildMachine) -> None:
    sim_machine(machines.memory_high_below_max, oom_group=True)
    pressure, limits = memory.pressure(), memory.limits()
    print(pressure, "|", limits)
    assert pressure.oom_group == JOB and limits.oom_group == JOB
    assert f"one OOM kill takes the whole group (memory.oom.group in {JOB})" in str(pressure)
    assert pressure.to_dict()["oom_group"] == JOB and limits.to_dict()["oom_group"] == JOB


@pytest.mark.parametrize("oom_group", [False, None])
def test_control_without_oom_group_nothing_is_said(sim_machine: BuildMachine, oom_group: bool | None) -> None:
    sim_machine(machines.memory_high_below_max, oom_group=oom_group)
    pressure = memory.pressure()
    assert pressure.oom_group is None and memory.limits().oom_group is None and "OOM" not in str(pressure)


def test_oom_group_on_the_binding_parent_is_named(sim_machine: BuildMachine) -> None:
    # A pod's limit and oom.group on the pod, the container below it: a kill at the pod's limit takes the pod.
    tree = sim_machine(machines.kubernetes_v2)
    pod = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"
    tree.write(f"{pod}/memory.oom.group", "1\n")
    assert memory.pressure().oom_group == pod


def test_oom_group_above_the_binding_level_is_not_the_kill() -> None:
    # The kernel walks up from the victim's group no further than the group whose limit was hit.
    assert decide.oom_group_at([False, True, True], binding=1) == 1
    assert decide.oom_group_at([True, False, True], binding=0) == 0
    assert decide.oom_group_at([False, False, True], binding=1) is None
    assert decide.oom_group_at([False, True, True], binding=None) == 2  # no limit: a host-wide OOM climbs to the top
