"""memory.array, free, on_disk, report — on a simulated 256 MiB container read by the real api."""

from __future__ import annotations

import gc
import os
import re
import warnings

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.decide import Level
from sim.tree import MiB


def new_records(before: list[memory.ArrayRecord]) -> list[memory.ArrayRecord]:
    """``report()`` less what earlier tests left alive."""
    return [r for r in memory.report() if r not in before]


def spill_files(tmp_path) -> list[str]:
    folder = tmp_path / "spill"
    return sorted(os.listdir(folder)) if folder.exists() else []


# -- what it is --------------------------------------------------------------------------------------------------

def test_a_ram_array_is_a_plain_zeroed_ndarray_that_numpy_code_accepts(pressure_machine):
    x = memory.array((1024, 512), "float32")  # 2 MiB: fits the ~180 MiB budget
    assert type(x) is np.ndarray and x.shape == (1024, 512) and x.dtype == np.float32
    assert not memory.on_disk(x) and not x.any()
    np.add(x, 2.0, out=x)
    assert float(x.sum()) == 2.0 * x.size


def test_an_array_over_the_budget_is_a_memmap_on_the_ssd_that_numpy_code_accepts(pressure_machine, tmp_path):
    x = memory.array((300, MiB // 8))  # 300 MiB: more than the container has
    assert isinstance(x, np.memmap) and isinstance(x, np.ndarray) and memory.on_disk(x)
    assert not x[::50].any()
    x[7] = 1.5
    assert float(np.asarray(x[5:9]).sum()) == 1.5 * (MiB // 8)
    assert spill_files(tmp_path) == [os.path.basename(x.filename)]


def test_spill_files_are_npy_files_named_after_their_owner(pressure_machine, tmp_path):
    memory.budget(0)
    x = memory.array((3, MiB), "int8")
    x[1, 2] = 7
    x.flush()
    name = os.path.basename(x.filename)
    assert name.startswith(f"apsi-{os.getpid()}-") and name.endswith(".npy")
    assert np.load(x.filename, mmap_mode="r")[1, 2] == 7


def test_small_arrays_stay_in_ram_whatever_the_pressure(pressure_machine):
    pressure_machine.at(Level.CRITICAL)
    pressure_machine.next_measurement()
    assert not memory.on_disk(memory.array(MiB // 8 - 1))  # one element under 1 MiB


@pytest.mark.parametrize("shape,dtype", [((0, 5), "float64"), (7, "int8"), ((2, 3, 4), "complex64"),
                                          ((4,), [("a", "i4"), ("b", "f8")])])
def test_shapes_and_dtypes(pressure_machine, shape, dtype):
    x = memory.array(shape, dtype)
    assert x.shape == (shape if isinstance(shape, tuple) else (shape,)) and x.dtype == np.dtype(dtype)


# -- placement: budget edges and every level ---------------------------------------------------------------------

def test_an_array_exactly_at_the_budget_goes_to_ram_one_byte_more_to_the_ssd(pressure_machine):
    memory.budget("8MB")
    at_budget = memory.array(8 * MiB, "uint8")
    assert not memory.on_disk(at_budget)
    memory.free(at_budget)
    assert memory.on_disk(memory.array(8 * MiB + 1, "uint8"))


def test_ram_arrays_use_up_the_budget(pressure_machine):
    memory.budget("8MB")
    first = memory.array(6 * MiB, "uint8")
    second = memory.array(3 * MiB, "uint8")  # 6 + 3 > 8
    assert not memory.on_disk(first) and memory.on_disk(second)
    memory.free(first)
    assert not memory.on_disk(memory.array(3 * MiB, "uint8"))  # freed RAM is budget again


def test_zero_budget_sends_every_big_array_to_the_ssd_and_keeps_small_ones_in_ram(pressure_machine):
    memory.budget(0)
    assert memory.on_disk(memory.array(MiB, "uint8"))
    assert not memory.on_disk(memory.array(MiB - 1, "uint8"))


def test_a_budget_larger_than_free_memory_does_not_put_an_array_in_ram_that_cannot_fit(pressure_machine):
    with pytest.warns(memory.BudgetWarning, match="usable here"):  # above the sim container's memory, on purpose
        memory.budget("1TB")
    pressure_machine.set_usage(128 * MiB)  # 128 MiB of 256 free: level still ok
    pressure_machine.next_measurement()
    assert memory.on_disk(memory.array(200 * MiB, "uint8"))
    assert not memory.on_disk(memory.array(100 * MiB, "uint8"))


def test_arrays_not_written_yet_still_count_against_free_memory(pressure_machine):
    # The default budget counts our RAM arrays back into "free" (70 % of free + held), but pages nobody has
    # written yet are still free in the kernel's eyes: counting them twice let RAM arrays add up to more than
    # the container has, and filling them would have been an OOM kill.
    pressure_machine.set_usage(56 * MiB)  # 200 MiB free of 256
    in_ram = []
    for _ in range(8):
        x = memory.array(48 * MiB, "uint8")  # made, not written
        if not memory.on_disk(x):
            in_ram.append(x)
    assert 0 < sum(x.nbytes for x in in_ram) <= 200 * MiB


def test_written_arrays_are_counted_once(pressure_machine):
    with pytest.warns(memory.BudgetWarning, match="usable here"):  # above the sim container's memory, on purpose
        memory.budget("1GB")  # only free memory limits here
    pressure_machine.set_usage(56 * MiB)
    written = memory.array(96 * MiB, "uint8")
    written[:] = 1
    pressure_machine.set_usage((56 + 96) * MiB)  # the kernel now counts its pages as used: 104 MiB free
    assert not memory.on_disk(written)
    assert not memory.on_disk(memory.array(48 * MiB, "uint8"))  # 104 free, nothing of ours unwritten
    assert memory.on_disk(memory.array(112 * MiB, "uint8"))


@pytest.mark.parametrize("level,on_ssd", [(Level.OK, False), (Level.MODERATE, False), (Level.HIGH, True),
                                          (Level.CRITICAL, True)])
def test_big_arrays_go_to_the_ssd_from_high_pressure_on(pressure_machine, level, on_ssd):
    with pytest.warns(memory.BudgetWarning, match="usable here"):  # above the sim container's memory, on purpose
        memory.budget("1GB")  # the budget is no reason to spill here: only the level is
    pressure_machine.at(level)
    pressure_machine.next_measurement()
    assert memory.on_disk(memory.array(2 * MiB, "uint8")) is on_ssd


def test_the_level_is_measured_at_most_twice_a_second_on_the_allocation_path(pressure_machine):
    memory.array(2 * MiB, "uint8")
    measured = pressure_machine.machine.tracker.measurements
    pressure_machine.at(Level.HIGH)
    pressure_machine.clock.advance(0.49)
    assert not memory.on_disk(memory.array(2 * MiB, "uint8"))  # the 0.49 s old "ok" still counts
    assert pressure_machine.machine.tracker.measurements == measured
    pressure_machine.clock.advance(0.01)
    assert memory.on_disk(memory.array(2 * MiB, "uint8"))
    assert pressure_machine.machine.tracker.measurements == measured + 1


# -- free ---------------------------------------------------------------------------------------------------------

def test_free_deletes_the_spill_file_now_and_views_keep_working(pressure_machine, tmp_path):
    memory.budget(0)
    x = memory.array((4, MiB), "uint8")
    view = x[1:3]
    x[2] = 9
    handle = os.open(x.filename, os.O_RDONLY)  # keeps the inode to look at after the unlink
    try:
        memory.free(x)
        assert spill_files(tmp_path) == []
        assert os.fstat(handle).st_blocks * 512 <= os.fstatvfs(handle).f_bsize  # at most the last, partial block
    finally:
        os.close(handle)
    assert int(view.sum()) == 0  # reads zeros, no crash
    view[0, 0] = 5  # a view made before free may still be written (into the deleted file)
    assert view[0, 0] == 5


def test_writing_a_freed_array_is_an_error_numpy_reports(pressure_machine):
    for x in (memory.array((4, MiB), "uint8"), memory.array(10)):
        memory.free(x)
        with pytest.raises(ValueError, match="read-only"):
            x[0] = 1


def test_free_gives_ram_back_now_even_while_a_view_exists(pressure_machine):
    psutil = pytest.importorskip("psutil")
    process = psutil.Process()
    x = memory.array(64 * MiB, "uint8")
    x[:] = 1
    view = x[::4096]
    held = memory.machine().ledger.held()
    before = process.memory_info().rss
    memory.free(x)
    assert before - process.memory_info().rss > 60 * MiB
    assert memory.machine().ledger.held() == held - 64 * MiB
    assert int(view.sum()) == 0


def test_freeing_twice_or_through_a_view_is_harmless(pressure_machine, tmp_path):
    memory.budget(0)
    x = memory.array((4, MiB), "uint8")
    memory.free(x[1:])
    memory.free(x)
    memory.free(x[2:])
    assert spill_files(tmp_path) == [] and str(x.shape) not in str(memory.report())


def test_free_refuses_what_is_not_an_array_and_warns_about_arrays_it_did_not_make(pressure_machine):
    """Freeing an array of someone else's did nothing, silently (test first failed: no warning)."""
    with pytest.raises(TypeError, match="list"):
        memory.free([1, 2, 3])  # type: ignore[arg-type]
    plain = np.ones(3)
    with pytest.warns(memory.NotFreedWarning, match=r"float64 array of shape \[3\] that memory.array did not make"):
        memory.free(plain)
    assert plain.flags.writeable and plain.sum() == 3
    ours = memory.array(3, "float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory.free(ours[1:])  # a view of ours, and ours twice: no warning
        memory.free(ours)


def test_a_collected_array_deletes_its_file_and_leaves_the_report(pressure_machine, tmp_path):
    memory.budget("2MB")
    before = memory.report()
    x = memory.array((4, MiB), "uint8")
    y = memory.array(MiB, "uint8")
    assert memory.on_disk(x) and not memory.on_disk(y)
    held = memory.machine().ledger.held()
    view = x[1:]
    del x
    gc.collect()
    assert len(spill_files(tmp_path)) == 1 and len(new_records(before)) == 2  # the view keeps it alive
    del view, y
    gc.collect()
    assert spill_files(tmp_path) == [] and new_records(before) == []
    assert memory.machine().ledger.held() == held - MiB


# -- on_disk, report ----------------------------------------------------------------------------------------------

def test_on_disk_follows_views_and_knows_any_memmap(pressure_machine, tmp_path):
    memory.budget(0)
    x = memory.array((4, MiB), "uint8")
    assert memory.on_disk(x[1:2]) and memory.on_disk(np.asarray(x)[::2])
    theirs = np.lib.format.open_memmap(str(tmp_path / "theirs.npy"), mode="w+", dtype="f4", shape=(3,))
    assert memory.on_disk(theirs) and not memory.on_disk(np.zeros(3))


def test_report_lists_each_live_array_as_the_spec_prints_it(pressure_machine):
    memory.budget("64MB")
    before = memory.report()
    in_ram = memory.array((1000, 8), "float32")
    on_ssd = memory.array((20_000_000, 1), "float32")
    lines = [str(r) for r in new_records(before)]
    assert lines == ["[1000, 8] float32 31.250 KB RAM — under 1 MB, always in RAM",  # (was "0.000 GB")
                     (f"[20000000, 1] float32 76.294 MB SSD {on_ssd.filename} "
                     "— 76.3 MB is more than the 64.0 MB left of the budget")]
    first = new_records(before)[0]
    assert (first.shape, first.dtype, first.nbytes, str(first.place), first.path) == \
        ((1000, 8), np.dtype("float32"), 32000, "RAM", None)
    memory.free(in_ram)
    assert [r.place for r in new_records(before)] == ["SSD"]


# -- bad input ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype,error,names", [
    ((3, -1), "float64", ValueError, "(3, -1)"),
    ("big", "float64", TypeError, "'big'"),
    ((2.5, 3), "float64", TypeError, "(2.5, 3)"),
    ((3,), "floaty", TypeError, "'floaty'"),
    ((3,), object, TypeError, "object"),
])
def test_bad_input_is_a_clear_error_and_keeps_what_exists(pressure_machine, shape, dtype, error, names):
    kept = memory.array(4, "int16")
    kept[:] = 3
    before = memory.report()
    with pytest.raises(error, match=re.escape(names)):
        memory.array(shape, dtype)
    assert memory.report() == before and kept.sum() == 12


def test_reaching_critical_on_the_allocation_path_collects_garbage_cycles(pressure_machine):
    gc.disable()  # only the reaction may collect here
    try:
        before = memory.report()
        cycle: list[object] = [memory.array(2 * MiB, "uint8")]
        cycle.append(cycle)
        del cycle
        assert len(new_records(before)) == 1  # unreachable, but a cycle: still held
        pressure_machine.at(Level.CRITICAL)
        pressure_machine.next_measurement()
        small = memory.array(MiB // 8 - 1)  # small: no measurement on this path
        assert len(new_records(before)) == 2
        big = memory.array(2 * MiB, "uint8")  # measures, sees critical, components hear it, garbage is collected
        assert [r.shape for r in new_records(before)] == [small.shape, big.shape]
        assert memory.on_disk(big)
    finally:
        gc.enable()
