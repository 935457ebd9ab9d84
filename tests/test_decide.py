"""The pure rules: pressure levels (table, hysteresis, monotonicity), budget, placement, eviction, batches."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apsi_memory import decide
from apsi_memory.decide import LEVEL_TABLE, LEVELS, Level, Place, pressure_level

PURE_MODULES = ["decide.py", "units.py", "errors.py"]
IO_MODULES = {"os", "psutil", "pathlib", "io", "shutil", "subprocess", "socket", "time", "mmap", "ctypes"}


@pytest.mark.parametrize("name", PURE_MODULES)
def test_decision_modules_import_no_io(name: str) -> None:
    tree = ast.parse((Path(decide.__file__).parent / name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add((node.module or "").split(".")[0])
    assert not imported & IO_MODULES, f"{name} imports {imported & IO_MODULES}"


@pytest.mark.parametrize(("free", "some", "full", "level"), [
    (0.99, 0.0, 0.0, "ok"),
    (0.31, None, None, "ok"),
    (0.30, None, None, "moderate"),  # dask spills at 70 % used
    (0.20, None, None, "high"),  # dask pauses at 80 %
    (0.05, None, None, "critical"),  # dask is about to be killed at 95 %
    (0.9, 5.0, 0.0, "moderate"),  # libmempressure: some avg10 5 / 15 / 40 %
    (0.9, 15.0, 0.0, "high"),
    (0.9, 40.0, 0.0, "critical"),
    (0.9, 0.0, 30.0, "critical"),  # half of systemd-oomd's 60 % full
    (0.9, 0.0, 10.0, "high"),
    (0.9, 0.0, 2.0, "moderate"),
])
def test_level_table(free: float, some: float | None, full: float | None, level: str) -> None:
    assert pressure_level(free, some, full) == level


def test_hysteresis_holds_a_level_until_past_the_leave_threshold() -> None:
    assert pressure_level(0.22, previous=Level.OK) == Level.MODERATE
    assert pressure_level(0.22, previous=Level.HIGH) == Level.HIGH  # 22 % free: not yet past 25 %
    assert pressure_level(0.26, previous=Level.HIGH) == Level.MODERATE
    assert pressure_level(0.36, previous=Level.HIGH) == Level.OK
    assert pressure_level(0.9, some=10.0, previous=Level.HIGH) == Level.HIGH  # 10 % some: above 7.5 %
    assert pressure_level(0.9, some=7.0, previous=Level.HIGH) == Level.MODERATE


def test_a_hovering_reading_does_not_flap() -> None:
    level = Level.OK
    seen = []
    for free in [0.21, 0.19, 0.21, 0.19, 0.22, 0.18, 0.24]:
        level = pressure_level(free, previous=level)
        seen.append(level)
    assert seen[1:] == [Level.HIGH] * 6


def test_table_rows_are_ordered_and_leave_is_beyond_enter() -> None:
    rows = [LEVEL_TABLE[level] for level in LEVELS[1:]]
    for lower, higher in itertools.pairwise(rows):
        assert higher.enter_free < lower.enter_free and higher.enter_some > lower.enter_some
        assert higher.enter_full > lower.enter_full
    for row in rows:
        assert row.leave_free > row.enter_free and row.leave_some < row.enter_some
        assert row.leave_full < row.enter_full


fractions = st.floats(0, 1)
shares = st.one_of(st.none(), st.floats(0, 100))
levels = st.sampled_from(LEVELS)


@given(fractions, fractions, shares, shares, levels)
def test_level_is_monotone_in_free_fraction(a: float, b: float, some: float | None, full: float | None,
                                            previous: Level) -> None:
    low, high = sorted((a, b))
    assert pressure_level(low, some, full, previous) >= pressure_level(high, some, full, previous)


@given(fractions, st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), levels)
def test_level_is_monotone_in_stalls(free: float, a: float, b: float, other: float, previous: Level) -> None:
    low, high = sorted((a, b))
    assert pressure_level(free, high, other, previous) >= pressure_level(free, low, other, previous)
    assert pressure_level(free, other, high, previous) >= pressure_level(free, other, low, previous)


@given(fractions, shares, shares, levels)
def test_hysteresis_never_lowers_a_level(free: float, some: float | None, full: float | None,
                                         previous: Level) -> None:
    assert pressure_level(free, some, full, previous) >= pressure_level(free, some, full)


def test_levels_compare_with_strings_and_print_plainly() -> None:
    assert Level.HIGH == "high" and Level.HIGH > "moderate" and Level.OK < Level.CRITICAL
    assert f"{Level.CRITICAL}" == "critical" and str(Level.OK) == "ok"
    with pytest.raises(ValueError, match="unknown pressure level 'hihg'"):
        Level.parse("hihg")


def test_default_budget_is_70_percent_of_free_counting_back_our_own_arrays() -> None:
    assert decide.default_budget(10_000) == 7_000
    assert decide.default_budget(6_000, held_bytes=4_000) == 7_000
    assert decide.default_budget(-5) == 0


@pytest.mark.parametrize(("nbytes", "left", "level", "where"), [
    (decide.SMALL_ARRAY_BYTES - 1, 0, Level.CRITICAL, Place.RAM),  # small arrays never spill
    (100 << 20, 100 << 20, Level.OK, Place.RAM),  # exactly at the budget fits
    (100 << 20, (100 << 20) - 1, Level.OK, Place.SSD),
    (100 << 20, 0, Level.OK, Place.SSD),
    (100 << 20, 1 << 40, Level.MODERATE, Place.RAM),
    (100 << 20, 1 << 40, Level.HIGH, Place.SSD),
    (100 << 20, 1 << 40, Level.CRITICAL, Place.SSD),
])
def test_placement(nbytes: int, left: int, level: Level, where: Place) -> None:
    assert decide.place(nbytes, left, level) == where


def test_eviction_target_and_ram_tier_by_level() -> None:
    assert decide.eviction_target(1000) == 900
    assert [decide.ram_tier_limit(512, level) for level in LEVELS] == [512, 512, 256, 0]


@pytest.mark.parametrize(("batch", "half"), [(512, 256), (511, 255), (3, 1), (1, 0)])
def test_halving(batch: int, half: int) -> None:
    assert decide.halve_batch(batch) == half
