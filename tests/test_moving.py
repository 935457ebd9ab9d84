"""RAM arrays that move to a spill file in place under pressure (apsi_memory/arrays/moving.py): the pure rules, the move
itself, why an array stays, and the fault tests (writers during moves, a fork during a move, SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.arrays import moving, placement, spill
from apsi_memory.decide import Level, Relief, arrays_to_move, bytes_to_free, in_relief_order
from apsi_memory.errors import BudgetWarning
from apsi_memory.machinery.tracker import Components
from apsi_memory.system import uffd

MiB = 1 << 20
needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="moving arrays needs Linux's mmap")

# -- the pure rules ------------------------------------------------------------------------------------------------

sizes = st.lists(st.integers(0, 10 << 30), max_size=12)


@given(sizes, st.integers(-(1 << 30), 40 << 30))
def test_arrays_to_move_covers_the_need_when_it_can_and_stops_once_covered(nbytes: list[int], need: int) -> None:
    chosen = arrays_to_move(list(enumerate(nbytes)), need)
    assert len(set(chosen)) == len(chosen)
    moved = sum(nbytes[i] for i in chosen)
    if need <= 0:
        assert chosen == []
    elif moved < need:
        assert sorted(chosen) == list(range(len(nbytes)))  # everything moved and still short
    else:
        assert moved - nbytes[chosen[-1]] < need  # the last one was needed


@given(sizes, st.integers(1, 40 << 30))
def test_arrays_to_move_moves_one_array_when_one_is_enough(nbytes: list[int], need: int) -> None:
    chosen = arrays_to_move(list(enumerate(nbytes)), need)
    enough = [n for n in nbytes if n >= need]
    if enough:
        assert [nbytes[i] for i in chosen] == [min(enough)]


@given(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(0, 1 << 30))
def test_bytes_to_free_is_what_leaves_high_and_falls_as_free_rises(free: int, usable: int, more: int) -> None:
    need = bytes_to_free(free, usable)
    assert need >= 0
    assert bytes_to_free(free + more, usable) <= need
    if need:
        assert free + need > 0.25 * usable  # free afterwards is past high's leave threshold


@given(st.lists(st.sampled_from(list(Relief))))
def test_relief_order_puts_spares_then_ram_tiers_then_arrays(stages: list[Relief]) -> None:
    ordered = in_relief_order(list(enumerate(stages)), lambda item: item[1])
    assert sorted(ordered) == sorted(enumerate(stages))
    assert [stage for _, stage in ordered] == sorted(stages)


def test_components_hear_pools_then_stores_then_the_mover() -> None:
    heard: list[str] = []

    class Part:
        def __init__(self, name: str, stage: Relief | None) -> None:
            self.name = name
            if stage is not None:
                self.relief = stage

        def on_level(self, level: Level) -> None:
            heard.append(self.name)

        def relieve(self) -> None:
            pass

    parts = [Part("mover", Relief.ARRAYS), Part("store", None), Part("pool", Relief.SPARES)]
    components = Components()
    for part in parts:
        components.register(part)
    components.notify(Level.HIGH)
    assert heard == ["pool", "store", "mover"]


# -- one move --------------------------------------------------------------------------------------------------------

def _ram_array(nbytes: int) -> np.ndarray:
    x = memory.array(nbytes // 8, "int64")
    assert not memory.on_disk(x), "the test needs a RAM array"
    return x


def _entry(x: np.ndarray) -> Any:
    entry = placement._find(x)
    assert entry is not None
    return entry


@needs_linux
def test_a_moved_array_keeps_its_object_address_and_bytes_and_becomes_an_ssd_array(spill_dir: Path) -> None:
    x = _ram_array(3 * MiB + 8)  # not a whole number of pages
    x[:] = np.arange(x.size)
    view, address = x[10:20], x.ctypes.data
    assert moving.move(_entry(x), Level.HIGH)
    assert memory.on_disk(x) and memory.on_disk(view)
    assert x.ctypes.data == address and np.array_equal(x, np.arange(x.size))
    line = str(memory.report()[-1])
    assert " SSD " in line and line.endswith("— moved at pressure high")
    view[0] = -1  # writes go to the file
    path = _entry(x).path
    assert np.load(path, mmap_mode="r")[10] == -1
    memory.free(x)
    assert not os.path.exists(path)


@needs_linux
def test_moving_gives_the_ram_back(spill_dir: Path) -> None:
    x = _ram_array(64 * MiB)
    x[:] = 7
    entry = _entry(x)
    assert spill.resident(entry.address, entry.length) >= 60 * MiB
    before = placement.machine().ledger.held()
    moving.move(entry, Level.HIGH)
    assert spill.resident(entry.address, entry.length) < 8 * MiB  # written back and dropped
    assert placement.machine().ledger.held() == before - x.nbytes
    assert int(x[123]) == 7


class _Reading(SimpleNamespace):
    free: int
    usable: int


@needs_linux
def test_relieve_moves_only_as_many_arrays_as_the_reading_needs(spill_dir: Path) -> None:
    small, big = _ram_array(2 * MiB), _ram_array(16 * MiB)
    ledger = placement.machine().ledger
    fake = SimpleNamespace(memory=lambda: _Reading(free=100 * MiB - 4 * MiB, usable=400 * MiB),  # 4 MiB short
                           ledger=ledger)
    assert moving.relieve(fake, Level.HIGH, placement.ram_entries) == 1  # type: ignore[arg-type]
    assert not memory.on_disk(small) and memory.on_disk(big)  # the smallest that covers it: 16 MiB
    calm = SimpleNamespace(memory=lambda: _Reading(free=300 * MiB, usable=400 * MiB), ledger=ledger)
    assert moving.relieve(calm, Level.HIGH, placement.ram_entries) == 0  # type: ignore[arg-type]
    assert not memory.on_disk(small)


@needs_linux
def test_without_write_protection_an_array_stays_while_other_threads_run_and_says_why(
        spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uffd, "available", lambda: "userfaultfd write protection is not available here (test)")
    x = _ram_array(2 * MiB)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not moving.move(_entry(x), Level.HIGH)
    finally:
        stop.set()
        other.join()
    line = str(memory.report()[-1])
    assert " RAM " in line and "stayed in RAM at pressure high: userfaultfd" in line and "Python threads run" in line



_ALONE = """
import apsi_memory as memory
from apsi_memory.arrays import placement, moving
from apsi_memory.system import uffd
from apsi_memory.decide import Level
uffd.available = lambda: "not available (test)"
x = memory.array(1 << 18, "int64")
x[:] = 5
print(moving.move(placement._find(x), Level.HIGH), memory.on_disk(x), int(x.sum()))
"""


@needs_linux
def test_without_write_protection_a_lone_thread_moves(spill_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _ALONE], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.split() == ["True", "True", str(5 << 18)], done.stderr


# -- faults ----------------------------------------------------------------------------------------------------------

class _Round:
    """What the 8 writers share: this round's array, the last value each wrote, and when to stop and start."""

    def __init__(self) -> None:
        self.x: np.ndarray | None = None
        self.last = [0] * 8
        self.expected = np.zeros((8, 1), np.int64)
        self.stop = threading.Event()
        self.gate = threading.Barrier(9)


def _writer(shared: _Round, k: int) -> None:
    """Writes its row in slots, round after round, and keeps what it wrote in ``expected``: 8 KiB at a time (NumPy
    copies that with the GIL released) and 64 elements at a time (holding the GIL). A write lost during a move
    leaves a slot unlike ``expected``; a torn one leaves part of a slot."""
    while True:
        shared.gate.wait()  # a round starts
        x, value = shared.x, 0
        if x is None:
            return
        expected = shared.expected[k]
        while not shared.stop.is_set():
            value += 1
            big = slice(value * 1024 % x.shape[1], None)
            small = slice(value * 64 % x.shape[1], None)
            x[k, big][:1024] = value
            expected[big][:1024] = value
            x[k, small][:64] = -value
            expected[small][:64] = -value
        shared.last[k] = value
        shared.gate.wait()  # the round ends


@needs_linux
@pytest.mark.faults
def test_eight_writers_lose_and_tear_nothing_over_200_moves(spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if uffd.available() is not None:
        pytest.skip(f"write protection is what this proves: {uffd.available()}")
    monkeypatch.setattr(moving, "PIECE_BYTES", 256 << 10)  # several protected pieces per move
    before = (moving.moves.count, moving.moves.bytes, moving.moves.seconds)
    shared, losses, writes = _Round(), 0, 0
    writers = [threading.Thread(target=_writer, args=(shared, k)) for k in range(8)]
    for t in writers:
        t.start()
    try:
        for _ in range(200):
            shared.x = x = _ram_array(1 * MiB).reshape(8, -1)
            shared.stop.clear()
            shared.expected = np.zeros_like(x)
            shared.gate.wait()
            time.sleep(0.001)
            assert moving.move(_entry(x), Level.HIGH)
            shared.stop.set()  # at once: a write lost during the move is not written again afterwards
            shared.gate.wait()
            writes += sum(shared.last)
            wrong = x != shared.expected
            losses += int(wrong.sum())
            memory.free(x)
    finally:
        shared.x = None
        shared.gate.wait(timeout=10)
        for t in writers:
            t.join()
    moved = (moving.moves.count - before[0], moving.moves.bytes - before[1], moving.moves.seconds - before[2])
    print(f"\n8 writers, {moved[0]} moves ({moved[1] >> 20} MiB in {moved[2]:.1f} s), {writes} writes: "
          f"{losses} elements"
          " lost or torn")
    assert moved[0] == 200
    assert losses == 0


@needs_linux
@pytest.mark.faults
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_fork_during_a_move_gives_a_working_child(spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moving, "PIECE_BYTES", 1 * MiB)
    x = _ram_array(32 * MiB)
    x[:] = 5
    statuses: list[int] = []

    def fork_now() -> None:
        pid = os.fork()
        if pid == 0:  # the child: its copy is whole, it can free it and exit
            ok = int(x[0]) == 5 and int(x[-1]) == 5
            memory.free(x)
            os._exit(0 if ok else 1)
        statuses.append(os.waitpid(pid, 0)[1])

    forker = threading.Timer(0.001, fork_now)
    forker.start()
    assert moving.move(_entry(x), Level.HIGH)
    forker.join(30)
    assert statuses == [0]
    assert np.all(x == 5) and memory.on_disk(x)


_KILLED = """
import os, sys, numpy as np
import apsi_memory as memory
from apsi_memory.arrays import placement, moving
from apsi_memory.decide import Level
x = memory.array(256 << 17, "int64")
x[:] = 1
print(os.getpid(), flush=True)
moving.move(placement._find(x), Level.HIGH)
print("moved", flush=True)
"""


@needs_linux
@pytest.mark.faults
def test_sigkill_during_a_move_leaves_no_file_after_the_next_reclaim(spill_dir: Path) -> None:
    kills = 0
    for delay in (0.0, 0.02, 0.05):
        child = subprocess.Popen([sys.executable, "-c", _KILLED], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert child.stdout is not None
        child.stdout.readline()
        deadline = time.monotonic() + 20
        while not (spill_dir.exists() and any(spill_dir.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.001)  # until the move has made its file
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        # killed with its file there (the next child's first spill reclaims it, the last one's is left)
        kills += int(child.wait(30) == -signal.SIGKILL and any(spill_dir.iterdir()))
    left = list(spill_dir.iterdir()) if spill_dir.exists() else []
    removed = spill.reclaim(str(spill_dir))
    print(f"\n{kills} SIGKILLs during moves: {len(left)} files left, {len(removed)} reclaimed")
    assert kills == 3 and len(left) == 1, "every kill landed during a move"
    assert sorted(map(str, left)) == sorted(removed)
    assert not any(spill_dir.iterdir())


@needs_linux
def test_an_allocation_at_high_moves_what_is_needed_and_again_while_the_level_lasts(pressure_machine: Any) -> None:
    with pytest.warns(BudgetWarning):
        memory.budget("1GB")  # only the level counts here
    big, small = memory.array(32 * MiB, "uint8"), memory.array(16 * MiB, "uint8")
    big[:], small[:] = 3, 4
    pressure_machine.set_usage(210 * MiB)  # 46 of 256 MiB free: high, 18 MiB short of leaving it
    pressure_machine.next_measurement()
    assert memory.on_disk(memory.array(2 * MiB, "uint8"))  # the allocation path read high ...
    assert memory.on_disk(big) and not memory.on_disk(small)  # ... and moved the one array that covers 18 MiB
    assert int(big[-1]) == 3 and _entry(big).record().reason == "SSD: moved at pressure high"
    pressure_machine.next_measurement()  # still high, no change of level, still 18 MiB short (the sim's usage)
    memory.array(2 * MiB, "uint8")
    assert memory.on_disk(small) and int(small[-1]) == 4
    assert placement.ram_entries(pressure_machine.machine.ledger) == []
