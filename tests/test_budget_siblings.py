"""The siblings' reservations count under every budget (issue 26: two mutants survived the suite).

* A budget set with ``budget()`` or ``APSI_RAM_BUDGET`` is used as set, and the siblings' reservations still come
  off free memory (docs/guides/several-processes.md, "Fairness"): an explicit budget must not make a process blind
  to what its siblings placed and have not written.
* ``decide.shared_budget``: an equal share, among the processes holding RAM arrays or reservations, of 70 % of what
  is free once the siblings' reservations are taken away (plus what our own arrays hold: it was free before)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
import sim.tree
from apsi_memory import Machine
from apsi_memory.decide import shared_budget
from apsi_memory.machinery.reservations import Siblings, group_key
from sim.clock import FakeClock

GiB, MiB = 1 << 30, 1 << 20


# -- an explicit budget with a sibling present ---------------------------------------------------------------------

def placed(tmp_path: Path, name: str, nbytes: int, reserved: int = 0, held: int = 0,
           before: Callable[[], None] | None = None) -> tuple[bool, str]:
    """(on the SSD, why) of an ``nbytes`` array in a 4 GiB container with 1 GiB used, beside a sibling whose record
    says ``reserved`` and ``held`` (both 0: no sibling); ``before`` runs first on the machine (a budget to set)."""
    tree = sim.tree.docker_v1(tmp_path / f"root-{name}", limit=4 * GiB, usage=1 * GiB)
    ledger = str(tmp_path / f"ledger-{name}")
    ours = Siblings([ledger])
    m = Machine(root=str(tree.root), clock=FakeClock(), siblings=ours)
    sibling = Siblings([ledger], pid=4242)
    if reserved or held:
        sibling.publish(group_key(m.memory()), reserved, held)
    try:
        with m.use():
            if before is not None:
                before()
            x = memory.array(nbytes, "uint8")
            return memory.on_disk(x), memory.report()[-1].why
    finally:
        sibling.close()
        ours.close()


def place_1gib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, sibling_reserved: int) -> tuple[bool, str]:
    """(on the SSD, why) of a 1 GiB array in a 4 GiB container with 3.25 GiB free, under a 3 GB budget set ``how``,
    while a sibling holds ``sibling_reserved`` bytes placed and not written (0: no sibling)."""
    def set_budget() -> None:
        if how == "budget()":
            memory.budget("3GB")
        else:
            monkeypatch.setenv("APSI_RAM_BUDGET", "3GB")
        assert memory.budget().source in ("set by budget()", "APSI_RAM_BUDGET")
    try:
        return placed(tmp_path, f"{how}-{sibling_reserved}", GiB, sibling_reserved, sibling_reserved, set_budget)
    finally:
        monkeypatch.delenv("APSI_RAM_BUDGET", raising=False)


@pytest.mark.parametrize("how", ["budget()", "APSI_RAM_BUDGET"])
def test_an_explicit_budget_still_leaves_what_a_sibling_reserved(tmp_path, monkeypatch, how):
    """The sibling reserved 2.5 GiB of the 3.25 GiB free: 0.75 GiB is left, so the 1 GiB array goes to the SSD,
    though it fits the 3 GB budget. Control: without the sibling the same array goes to RAM."""
    beside, why = place_1gib(tmp_path, monkeypatch, how, 2560 * MiB)
    alone, why_alone = place_1gib(tmp_path, monkeypatch, how, 0)
    print(f"\n{how} = 3 GB, 1 GiB array: beside a 2.5 GiB reservation {'SSD' if beside else 'RAM'} ({why}); "
          f"alone {'SSD' if alone else 'RAM'} ({why_alone})")
    assert (beside, alone) == (True, False)


# -- the default budget a placement uses, shared with an active sibling --------------------------------------------

def test_a_placement_shares_the_default_budget_with_an_active_sibling(tmp_path):
    """Issue 29 item 2 (a placement reads the budget's number, not its words): beside a sibling that holds RAM
    arrays, 70 % of the 3 GiB free is shared by two (1.05 GiB), so a 1.2 GiB array goes to the SSD although free
    memory holds it; alone it gets all 2.1 GiB and goes to RAM."""
    beside, why = placed(tmp_path, "active", 1229 * MiB, held=GiB)  # all written: nothing reserved
    alone, why_alone = placed(tmp_path, "alone", 1229 * MiB)
    print(f"\ndefault budget, 1.2 GiB array: beside an active sibling {'SSD' if beside else 'RAM'} ({why}); "
          f"alone {'SSD' if alone else 'RAM'} ({why_alone})")
    assert (beside, alone) == (True, False)


# -- shared_budget: exact figures, and the documented rule as a property -------------------------------------------

@pytest.mark.parametrize("free,held,reserved,processes,expected", [
    (10 * GiB, 0, 0, 1, 7 * GiB),  # alone: 70 % of free
    (10 * GiB, 0, 4 * GiB, 1, int(0.7 * 6 * GiB)),  # a sibling's reservation comes off free
    (10 * GiB, 0, 4 * GiB, 2, int(0.7 * 6 * GiB) // 2),  # ... and the rest is shared
    (10 * GiB, 2 * GiB, 4 * GiB, 3, int(0.7 * 8 * GiB) // 3),  # our own arrays' RAM counts back in
    (3 * GiB, 0, 5 * GiB, 2, 0),  # more reserved than free: nothing, never negative
    (3 * GiB, 1 * GiB, 5 * GiB, 2, int(0.7 * GiB) // 2),
])
def test_shared_budget_exact_figures(free, held, reserved, processes, expected):
    assert shared_budget(free, held, reserved, processes) == expected


sizes = st.integers(0, 1 << 40)


@given(sizes, sizes, sizes, st.integers(1, 256))
def test_shared_budget_is_the_documented_rule(free, held, reserved, processes):
    assert shared_budget(free, held, reserved, processes) == int(0.7 * (max(0, free - reserved) + held)) // processes


@given(sizes, sizes, sizes, st.integers(1, 1 << 30), st.integers(1, 256))
def test_a_sibling_reservation_lowers_the_shared_budget(free, held, reserved, more, processes):
    """More reserved by the siblings never raises the budget, and lowers it while free memory is left to lose."""
    before = shared_budget(free, held, reserved, processes)
    after = shared_budget(free, held, reserved + more, processes)
    assert after <= before
    if free - reserved >= more and more * 7 // 10 >= 2 * processes:
        assert after < before
