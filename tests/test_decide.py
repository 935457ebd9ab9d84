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
from apsi_memory.errors import ArgumentError

PURE_MODULES = ["decide/__init__.py", "decide/levels.py", "decide/memory.py", "decide/workers.py", "decide/v2.py",
                "decide/batchcap.py", "units.py", "errors.py",
                "blocks/rules.py"]
IO_MODULES = {"os", "psutil", "pathlib", "io", "shutil", "subprocess", "socket", "time", "mmap", "ctypes"}


@pytest.mark.parametrize("name", PURE_MODULES)
def test_decision_modules_import_no_io(name: str) -> None:
    tree = ast.parse((Path(decide.__file__).parent.parent / name).read_text())
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
    with pytest.raises(ValueError, match="unknown pressure level 'hihg'"):  # a level is looked up, a string parsed
        assert Level.HIGH >= "hihg"


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


# -- memory limits (the rules adapters/cgroup.py used to hold) -----------------------------------------------------

LIMIT_RULES = ["effective_limit", "smallest_limit", "working_set", "combine_levels", "usable_memory", "free_memory",
               "pressure_cause"]


def test_limit_rules_live_in_decide_and_not_in_the_adapters() -> None:
    adapters = Path(decide.__file__).parent.parent / "adapters"
    for module in ("cgroup.py", "psi.py"):
        tree = ast.parse((adapters / module).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert not defined & set(LIMIT_RULES), f"adapters/{module} defines {defined & set(LIMIT_RULES)}"
        literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
        assert "memory.high" not in literals, "which files are limits is decide's rule"
    assert all(getattr(decide, name).__module__.startswith("apsi_memory.decide.") for name in LIMIT_RULES)


PHYSICAL = 64 << 30


def test_negative_and_v1_unlimited_and_at_or_above_ram_are_no_limit() -> None:
    assert decide.effective_limit(-1, PHYSICAL) is None  # v1's -1
    assert decide.effective_limit(0x7FFFFFFFFFFFF000, PHYSICAL) is None
    assert decide.effective_limit(PHYSICAL, PHYSICAL) is None
    assert decide.effective_limit(None, PHYSICAL) is None
    assert decide.effective_limit(4 << 30, PHYSICAL) == 4 << 30


def test_memory_high_counts_as_a_limit_and_reclaim_targets_do_not() -> None:
    assert "memory.high" in decide.V2_LIMIT_FILES and "memory.max" in decide.V2_LIMIT_FILES
    limit_files = set(decide.V1_LIMIT_FILES) | set(decide.V2_LIMIT_FILES) | {decide.V1_STAT_LIMIT}
    assert not limit_files & set(decide.NOT_LIMITS)
    assert decide.smallest_limit([(None, "memory.max"), (2 << 30, "memory.high")], PHYSICAL) == (
        2 << 30, "memory.high")


def test_working_set_subtracts_inactive_cache_and_is_clamped() -> None:
    assert decide.working_set(3000, 1000, limit=None) == 2000
    assert decide.working_set(1000, 3000, limit=None) == 0  # never below zero
    assert decide.working_set(9000, 0, limit=4000) == 4000  # never above the limit
    assert decide.working_set(1000, -5, limit=None) == 1000  # a negative cache count adds nothing


@given(st.integers(-2**62, 2**62), st.integers(-2**62, 2**62), st.one_of(st.none(), st.integers(0, 2**62)))
def test_working_set_is_within_bounds(usage: int, inactive: int, limit: int | None) -> None:
    ws = decide.working_set(usage, inactive, limit)
    assert 0 <= ws <= max(0, usage) and (limit is None or ws <= limit)


raw_limits = st.one_of(st.none(), st.just(-1), st.integers(0, 2 * PHYSICAL))
group_levels = st.builds(
    decide.GroupLevel,
    limits=st.lists(raw_limits, min_size=0, max_size=3).map(
        lambda values: tuple((value, f"file{i}") for i, value in enumerate(values))),
    usage=st.one_of(st.none(), st.integers(0, 2 * PHYSICAL)),
    inactive_file=st.integers(0, PHYSICAL),
)


def _real_limits(levels: list[decide.GroupLevel]) -> list[int]:
    return [value for level in levels for value, _ in level.limits
            if value is not None and 0 <= value < PHYSICAL]


@given(st.lists(group_levels, min_size=1, max_size=6))
def test_the_smallest_limit_up_the_hierarchy_always_wins(levels: list[decide.GroupLevel]) -> None:
    group = decide.combine_levels(levels, PHYSICAL)
    if all(level.usage is None for level in levels):
        assert group is None  # no memory controller on any level: nothing to read
        return
    assert group is not None
    real = _real_limits(levels)
    assert group.limit == (min(real) if real else None)
    if group.limit is None:
        assert group.free is None and group.limit_file is None
    else:
        assert group.free is not None and 0 <= group.free <= group.limit
        assert 0 <= group.working_set <= group.limit and group.limit_file is not None


@given(group_levels, st.lists(group_levels, min_size=1, max_size=5), st.integers(0, PHYSICAL))
def test_a_missing_leaf_usage_never_loses_a_parents_limit(leaf: decide.GroupLevel, parents: list[decide.GroupLevel],
                                                          usage: int) -> None:
    parents = [*parents[:-1], parents[-1]._replace(usage=usage)]  # some level has the controller
    without = decide.combine_levels([leaf._replace(usage=None), *parents], PHYSICAL)
    with_usage = decide.combine_levels([leaf._replace(usage=usage), *parents], PHYSICAL)
    assert without is not None and with_usage is not None
    assert without.limit == with_usage.limit
    parent_limits = _real_limits(parents)
    assert parent_limits == [] or (without.limit is not None and without.limit <= min(parent_limits))


def test_a_leaf_without_usage_is_charged_to_the_nearest_level_with_one() -> None:
    leaf = decide.GroupLevel(limits=(), usage=None, inactive_file=0)
    parent = decide.GroupLevel(limits=((1 << 30, "slice/memory.max"),), usage=256 << 20, inactive_file=0)
    assert decide.combine_levels([leaf, parent], PHYSICAL) == decide.GroupMemory(
        1 << 30, "slice/memory.max", 256 << 20, (1 << 30) - (256 << 20))


@given(st.integers(1, PHYSICAL), st.integers(0, PHYSICAL), st.one_of(st.none(), st.integers(-PHYSICAL, PHYSICAL)),
       st.one_of(st.none(), st.integers(1, 2 * PHYSICAL)))
def test_usable_is_the_smaller_and_free_is_within_it(total: int, available: int, group_free: int | None,
                                                     limit: int | None) -> None:
    usable = decide.usable_memory(total, limit)
    assert usable == min(total, limit if limit is not None else total)
    assert 0 <= decide.free_memory(available, group_free, usable) <= min(usable, available)


# -- why a level --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("free", "some", "full", "previous", "cause"), [
    (0.95, 6.3, 0.0, Level.OK, "some ≥ 5 %"),  # the example
    (0.22, None, None, Level.OK, "free ≤ 30 %"),
    (0.15, 16.0, 12.0, Level.OK, "free ≤ 20 % and some ≥ 15 % and full ≥ 10 %"),
    (0.9, 0.0, 31.0, Level.OK, "full ≥ 30 %"),
    (0.22, None, None, Level.HIGH, "free ≤ 25 % (held)"),  # hysteresis keeps high until 25 % free
    (0.9, 10.0, None, Level.HIGH, "some ≥ 7.5 % (held)"),
    (0.99, 0.0, 0.0, Level.OK, None),
])
def test_pressure_names_the_signal_that_set_its_level(free: float, some: float | None, full: float | None,
                                                      previous: Level, cause: str | None) -> None:
    level = pressure_level(free, some, full, previous)
    assert decide.pressure_cause(level, free, some, full) == cause


@given(fractions, shares, shares, levels)
def test_every_level_above_ok_has_a_cause(free: float, some: float | None, full: float | None,
                                          previous: Level) -> None:
    level = pressure_level(free, some, full, previous)
    cause = decide.pressure_cause(level, free, some, full)
    assert (cause is None) == (level == Level.OK)


# -- dask workers: the pure rules behind apsi_memory.dask (which itself needs the extra) ---------------------------

@given(usable=st.integers(0, 1 << 44), workers=st.integers(1, 256), threads=st.integers(1, 64))
def test_dask_workers_together_never_exceed_the_usable_memory(usable: int, workers: int, threads: int) -> None:
    try:
        share = decide.worker_memory_limit(usable, workers, threads)
    except ArgumentError as err:
        assert f"cannot hold {workers} dask workers" in str(err)
        return
    assert share * workers + decide.DASK_OUTSIDE_WORKERS_BYTES <= usable
    assert share >= decide.DASK_WORKER_BASE_BYTES


@given(limit=st.integers(0, 1 << 40), threads=st.integers(1, 64))
def test_dask_chunks_of_running_tasks_fit_between_spill_target_and_pause(limit: int, threads: int) -> None:
    size = decide.chunk_bytes(limit, threads)
    assert size >= decide.MIN_CHUNK_BYTES and size & (size - 1) == 0  # a power of two, never under 1 MiB
    assert size <= decide.MAX_CHUNK_BYTES  # dask's own default at most, however big the worker
    room = limit * (decide.DASK_PAUSE_FRACTION - decide.DASK_SPILL_TARGET)
    if decide.MIN_CHUNK_BYTES < size < decide.MAX_CHUNK_BYTES:
        assert threads * decide.CHUNKS_PER_TASK * size <= room < threads * decide.CHUNKS_PER_TASK * size * 2 + 1
