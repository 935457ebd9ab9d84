"""The Machine object (issue 11, item 5): what the library keeps about a machine lives in one object, the
module-level functions use the installed one, and a sim machine is the same class on a fake clock."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
import sim
from apsi_memory import Machine
from apsi_memory.adapters.clock import SystemClock
from apsi_memory.decide import Level
from apsi_memory.machinery.tracker import RECHECK_SECONDS
from sim.clock import FakeClock
from sim.components import Heard
from sim.pressure import PressureMachine
from sim.tree import GiB, MiB, docker_v1, host


def test_the_module_functions_read_the_installed_machine_and_the_previous_one_comes_back(tmp_path: Path) -> None:
    before = memory.machine()
    assert memory.machine() is before  # made once, on first use
    small, big = sim.machine(docker_v1(tmp_path / "a", limit=1 * GiB)), sim.machine(host(tmp_path / "b"))
    with small.use():
        assert memory.machine() is small and memory.limits().usable_bytes == 1 * GiB
        with big.use():
            assert memory.limits().usable_bytes == 8 * GiB
        assert memory.limits().usable_bytes == 1 * GiB
    assert memory.machine() is before


def test_each_machine_keeps_its_own_budget(tmp_path: Path) -> None:
    one, two = sim.machine(host(tmp_path / "a")), sim.machine(host(tmp_path / "b"))
    with one.use():
        memory.budget("1GB")
    assert one.budget().source == "set by budget()" and one.budget().bytes == 1 * GiB
    assert two.budget().source == "70 % of free"


def test_the_default_machine_reads_apsi_fs_root_when_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = docker_v1(tmp_path / "root", limit=2 * GiB)
    monkeypatch.setenv("APSI_FS_ROOT", str(tree))
    assert Machine().root == str(tree) and Machine().limits().usable_bytes == 2 * GiB
    assert Machine(root="/").root == "/"


def test_a_sim_machine_is_a_machine_on_a_fake_clock(tmp_path: Path) -> None:
    m = sim.machine(host(tmp_path))
    assert type(m) is Machine and isinstance(m.clock, FakeClock)
    clock = FakeClock()
    assert sim.machine(host(tmp_path / "b"), clock).clock is clock


def test_components_hear_only_their_own_machines_levels(tmp_path: Path) -> None:
    watched, other = PressureMachine(tmp_path / "a"), PressureMachine(tmp_path / "b")
    heard, elsewhere = Heard(), Heard()
    watched.machine.components.register(heard)
    other.machine.components.register(elsewhere)
    watched.at(Level.HIGH)
    assert watched.machine.pressure().level is Level.HIGH
    assert heard.levels == [Level.HIGH] and elsewhere.levels == []


def test_the_level_is_re_measured_on_the_machines_clock(tmp_path: Path) -> None:
    pm = PressureMachine(tmp_path)
    assert pm.machine.current_level() is Level.OK
    pm.at(Level.CRITICAL)
    pm.clock.advance(RECHECK_SECONDS - 0.01)
    assert pm.machine.current_level() is Level.OK  # not yet due
    pm.clock.advance(0.01)
    assert pm.machine.current_level() is Level.CRITICAL


def test_a_ram_array_gives_its_bytes_back_to_the_ledger_it_was_counted_in(pressure_machine: PressureMachine,
                                                                          tmp_path: Path) -> None:
    made_in = pressure_machine.machine
    memory.budget("128MB")
    x = memory.array((4 * MiB,), np.uint8)
    assert not memory.on_disk(x) and made_in.ledger.held() == 4 * MiB
    elsewhere = sim.machine(host(tmp_path / "other"))
    with elsewhere.use():
        memory.free(x)
    assert made_in.ledger.held() == 0 and elsewhere.ledger.held() == 0


def test_the_fake_clock_wakes_a_waiting_thread_only_when_advanced_past_its_deadline() -> None:
    clock, woke = FakeClock(), threading.Event()

    def sleeper() -> None:
        clock.wait(10)
        woke.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    clock.wait_idle()
    clock.advance(9.5)
    clock.wait_idle()
    assert not woke.is_set()
    clock.advance(0.5)
    thread.join(10)
    assert woke.is_set() and clock.now() == 1010.0


def test_a_stopped_wait_returns_true_and_wait_idle_names_what_it_waited_for() -> None:
    clock, stop = FakeClock(), threading.Event()
    stop.set()
    assert clock.wait(60, stop) is True and clock.now() == 1000.0
    with pytest.raises(TimeoutError, match="0 threads wait on the clock, not 1 idle"):
        clock.wait_idle(timeout=0.01)


def test_the_system_clock_waits_in_real_time_and_a_set_stop_ends_it_at_once() -> None:
    clock, stop = SystemClock(), threading.Event()
    start = clock.now()
    assert clock.wait(0.001) is False and clock.now() > start
    stop.set()
    assert clock.wait(3600, stop) is True


def test_autojump_moves_the_clock_to_the_deadline_at_once() -> None:
    clock = FakeClock(autojump=True)
    assert clock.wait(30) is False and clock.now() == 1030.0


def test_a_machine_pointed_at_another_root_reads_there_from_the_next_reading(tmp_path: Path) -> None:
    """What dask's workers do in test_dask: the process's machine re-pointed at a sim tree. Its kept-open kernel
    files (adapters.files) must follow the new root, not keep reading the old one."""
    small, big = docker_v1(tmp_path / "small", limit=1 * GiB), docker_v1(tmp_path / "big", limit=3 * GiB)
    m = Machine(str(small))
    assert m.limits().usable_bytes == 1 * GiB
    m.root = str(big)
    assert m.root == str(big) and m.limits().usable_bytes == 3 * GiB and m.memory().usable == 3 * GiB
    assert m.current_level() is Level.OK
