"""Decisions that explain themselves: ``report()`` says why each array is where it is, and placements, level
changes, reactions and ``fit_batch`` halvings are logged under the documented logger names (README, "Logging")."""

from __future__ import annotations

import logging

import pytest

import apsi_memory as memory
from apsi_memory.arrays import moving
from apsi_memory.decide import Level, Place, place, place_reason
from apsi_memory.units import GiB, MiB
from sim.pressure import PressureMachine


@pytest.mark.parametrize(("nbytes", "left", "budget", "level", "why"), [
    (GiB, int(1.2 * GiB), 4 * GiB, Level.OK, "fits the budget (1.2 of 4.0 GB left)"),
    (6 * GiB, int(1.2 * GiB), 4 * GiB, Level.OK, "6.0 GB is more than the 1.2 GB left of the budget"),
    (64 * MiB, 32 * MiB, 48 * MiB, Level.MODERATE, "64.0 MB is more than the 32.0 MB left of the budget"),
    (2 * MiB, 4 * GiB, 4 * GiB, Level.HIGH, "pressure high"),
    (1000, 0, 0, Level.CRITICAL, "under 1 MB, always in RAM"),
])
def test_the_reason_matches_the_decision(nbytes: int, left: int, budget: int, level: Level, why: str) -> None:
    assert place_reason(nbytes, left, budget, level) == why
    expected = Place.SSD if why.startswith(("pressure", f"{nbytes / (GiB if nbytes >= GiB else MiB):.1f}")) \
        else Place.RAM
    assert place(nbytes, left, level) is expected


def new(before: list[memory.ArrayRecord]) -> list[memory.ArrayRecord]:
    return [r for r in memory.report() if r not in before]


def test_report_says_why_each_array_is_where_it_is(pressure_machine: PressureMachine) -> None:
    memory.budget("64MB")
    before = memory.report()
    in_ram = memory.array((4, MiB), "uint8")  # 4 MiB of the 64
    too_big = memory.array((80, MiB), "uint8")
    pressure_machine.at(Level.HIGH)
    pressure_machine.next_measurement()
    small_but_high = memory.array((2, MiB), "uint8")
    assert moving.mover.wait_idle(30)  # the move runs on the mover thread
    reasons = [r.reason for r in new(before)]
    assert reasons == ["SSD: moved at pressure high",  # made in RAM (fits the budget); high moved it (moving.py)
                       "SSD: 80.0 MB is more than the 60.0 MB left of the budget",
                       "SSD: pressure high"]
    assert str(new(before)[1]) == (f"[80, 1048576] uint8 80.000 MB SSD {too_big.filename} "
                                   "— 80.0 MB is more than the 60.0 MB left of the budget")
    for x in (in_ram, too_big, small_but_high):
        memory.free(x)


def test_placements_are_logged_at_debug(pressure_machine: PressureMachine, caplog: pytest.LogCaptureFixture) -> None:
    memory.budget("64MB")
    with caplog.at_level(logging.DEBUG, logger="apsi_memory.arrays"):
        x = memory.array((2, MiB), "float32")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("apsi_memory.arrays", "DEBUG", "[2, 1048576] float32 RAM: fits the budget (64.0 of 64.0 MB left)")]
    memory.free(x)


def test_level_changes_and_the_reactions_they_cause_are_logged(pressure_machine: PressureMachine,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    cache = memory.store("embeddings", ram_mb=16)
    spares = memory.pool(max_gb=0.1)
    caplog.set_level(logging.INFO, logger="apsi_memory")
    for level in (Level.MODERATE, Level.HIGH, Level.CRITICAL, Level.OK):
        pressure_machine.at(level)
        pressure_machine.next_measurement()
        memory.current_level()
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert ("apsi_memory.pressure", "pressure level ok -> moderate") in lines
    assert ("apsi_memory.pressure", "pressure level critical -> ok") in lines
    reactions = [message for name, message in lines if name == "apsi_memory.reactions"]
    assert sorted(reactions) == sorted([  # components hear in no set order
        "store embeddings: RAM tier halved at high", "pool: spare buffers dropped at high",
        "store embeddings: RAM tier emptied at critical",  # (the pool: still dropped, nothing new to log)
        "store embeddings: RAM tier back to its full size at ok", "pool: keeps spare buffers at ok"])
    del cache, spares


def test_fit_batch_halvings_are_warnings(caplog: pytest.LogCaptureFixture) -> None:
    def step(batch: int) -> int:
        if batch > 200:
            raise MemoryError(f"cannot allocate a batch of {batch}")
        return batch

    with caplog.at_level(logging.WARNING, logger="apsi_memory.batch"):
        assert memory.fit_batch(step, 256) == (128, 128)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("apsi_memory.batch", "WARNING", ("out of memory at batch 256 (MemoryError: cannot allocate a batch of 256); "
                                         "trying 128"))]
