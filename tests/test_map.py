"""memory.map as a user sees it: results, where the output lives, threads, and what a failing block says."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import BlockError, ChunkError


def spill_files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_map_applies_fn_block_by_block(spill_dir: Path) -> None:
    x = np.arange(30.0).reshape(10, 3)
    y = memory.map(lambda b: b * 2.0 + 1.0, x, rows=3)
    np.testing.assert_array_equal(y, x * 2.0 + 1.0)


def test_the_output_shape_and_dtype_come_from_the_first_result(spill_dir: Path) -> None:
    x = np.arange(40, dtype=np.int32).reshape(10, 4)
    y = memory.map(lambda b: b[:, :2].astype(np.float64) / 2, x, rows=4)
    assert y.shape == (10, 2) and y.dtype == np.float64
    np.testing.assert_array_equal(y, x[:, :2] / 2)


def test_a_big_output_is_a_memory_array_on_the_ssd(on_ssd: Path) -> None:
    x = np.ones((400_000, 4), np.float32)  # 6.4 MB of float32, 12.8 MB out as float64
    y = memory.map(lambda b: b.astype(np.float64) * 3, x, rows=50_000, workers=2)
    assert memory.on_disk(y)
    assert len(spill_files(on_ssd)) == 1
    assert float(y.sum()) == 400_000 * 4 * 3.0
    memory.free(y)
    assert spill_files(on_ssd) == []


def test_a_big_output_that_fits_the_budget_stays_in_ram_and_keeps_its_values(spill_dir: Path, pressure_machine) -> None:
    # on a sim container at "ok": the real machine's pressure during a test run must not move the output
    with pytest.warns(memory.BudgetWarning, match="usable here"):  # above the sim container's memory, on purpose
        memory.budget("1GB")
    try:
        x = np.arange(1_000_000, dtype=np.float64).reshape(-1, 4)  # 8 MB out: over the small-array size
        y = memory.map(lambda b: b + 0.5, x, rows=50_000)
        assert not memory.on_disk(y)
        np.testing.assert_array_equal(y, x + 0.5)
    finally:
        memory.budget("auto")


def test_a_npy_path_and_a_memmap_are_inputs_too(tmp_path: Path, spill_dir: Path) -> None:
    path = str(tmp_path / "x.npy")
    np.save(path, np.arange(1000, dtype=np.float32).reshape(250, 4))
    expected = np.arange(1000, dtype=np.float32).reshape(250, 4) - 1
    np.testing.assert_array_equal(memory.map(lambda b: b - 1, path, rows=64), expected)
    np.testing.assert_array_equal(memory.map(lambda b: b - 1, np.load(path, mmap_mode="r"), rows=64), expected)


def test_a_1d_input_maps_its_elements(spill_dir: Path) -> None:
    y = memory.map(np.sqrt, np.array([0.0, 1.0, 4.0, 9.0, 16.0]), rows=2)
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4])


def test_an_empty_input_calls_fn_once_for_the_dtype(spill_dir: Path) -> None:
    seen: list[tuple[int, ...]] = []

    def fn(b: np.ndarray) -> np.ndarray:
        seen.append(b.shape)
        return b.astype(np.int8)

    y = memory.map(fn, np.zeros((0, 3)), rows=10)
    assert seen == [(0, 3)]
    assert y.shape == (0, 3) and y.dtype == np.int8


def test_workers_run_blocks_at_the_same_time(spill_dir: Path) -> None:
    # Blocks 1 and 2 wait for each other: this finishes only if two threads run them at once.
    meet = threading.Barrier(2, timeout=10)

    def fn(b: np.ndarray) -> np.ndarray:
        if b[0, 0] > 0:
            meet.wait()
        return b + 1

    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(memory.map(fn, x, rows=1, workers=2), x + 1)


def test_one_worker_runs_every_block_on_one_thread_besides_the_caller(spill_dir: Path) -> None:
    threads: set[str] = set()

    def fn(b: np.ndarray) -> np.ndarray:
        threads.add(threading.current_thread().name)
        return b

    memory.map(fn, np.zeros((10, 1)), rows=1, workers=1)
    assert len(threads - {threading.current_thread().name}) == 1


def test_the_blocks_go_on_while_the_calling_thread_is_held(spill_dir: Path) -> None:
    """No thread hands the blocks out: with the caller held (here in a signal handler; on a loaded machine, off
    its core while holding the GIL) the workers still take every block, not only those handed out before."""
    n_blocks, seen, all_ran = 20, [], threading.Event()
    lock = threading.Lock()

    def fn(b: np.ndarray) -> np.ndarray:
        if b[0, 0] == 0:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        with lock:
            seen.append(int(b[0, 0]))
            if len(seen) == n_blocks:
                all_ran.set()
        return b + 1

    held: list[bool] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: held.append(all_ran.wait(10)))
    try:
        x = np.arange(n_blocks, dtype=float)[:, None]
        np.testing.assert_array_equal(memory.map(fn, x, rows=1, workers=2), x + 1)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert held == [True]  # every block ran while the caller was in the handler


def test_by_default_there_is_a_worker_per_core(spill_dir: Path) -> None:
    threads: set[str] = set()
    meet = threading.Barrier(memory.cores(), timeout=10)

    def fn(b: np.ndarray) -> np.ndarray:
        if b[0] > 0:
            threads.add(threading.current_thread().name)
            meet.wait()
        return b

    memory.map(fn, np.arange(memory.cores() + 1.0), rows=1)
    assert len(threads) == memory.cores()


@pytest.mark.parametrize("workers", [0, -1, 1.5])
def test_bad_workers_fail_at_the_call(spill_dir: Path, workers: object) -> None:
    with pytest.raises(ChunkError, match="workers must be"):
        memory.map(lambda b: b, np.zeros(10), rows=2, workers=workers)  # type: ignore[arg-type]


def test_without_rows_the_blocks_in_flight_hold_about_32_mb_together(spill_dir: Path) -> None:
    # rowwise=False: fn sees the blocks themselves (by default it sees pieces of them: test_map_pieces.py)
    sizes: list[int] = []
    lock = threading.Lock()

    def fn(b: np.ndarray) -> np.ndarray:
        with lock:
            sizes.append(len(b))
        return b

    memory.map(fn, np.zeros((1_000_000, 8), np.float32), workers=2, rowwise=False)  # 32 MB; 4 blocks in flight
    assert max(sizes) == 8 * 1024 * 1024 // 32 and sum(sizes) == 1_000_000


def test_bad_rows_fail_before_fn_runs(spill_dir: Path) -> None:
    calls: list[np.ndarray] = []

    def fn(b: np.ndarray) -> np.ndarray:
        calls.append(b)
        return b

    with pytest.raises(ChunkError, match="rows must be"):
        memory.map(fn, np.zeros(10), rows=0)
    assert calls == []


# -- failures ------------------------------------------------------------------------------------------------------

def test_an_exception_in_fn_names_the_rows_and_stops_the_other_workers(on_ssd: Path) -> None:
    calls = []
    lock = threading.Lock()

    def fn(b: np.ndarray) -> np.ndarray:
        with lock:
            calls.append(int(b[0, 0]))
        if b[0, 0] == 5 * 1000:
            raise KeyError("no such feature")
        if b[0, 0] > 5 * 1000:
            # A real fn lets go of the GIL in its NumPy loops. One that never does (a few µs of Python a block)
            # kept the failing thread waiting for the GIL for Python's 5 ms switch interval, before it could
            # record the failure, while the other thread started 54 more blocks (CI, py313).
            time.sleep(0.001)
        return b

    x = np.repeat(np.arange(100_000.0)[:, None], 4, axis=1)  # 3.2 MB: the output goes to the SSD
    with pytest.raises(BlockError, match=r"rows 5000:6000 \(block 6 of 100\)") as info:
        memory.map(fn, x, rows=1000, workers=2)
    assert isinstance(info.value.__cause__, KeyError)
    assert "no such feature" in str(info.value)
    assert len(calls) < 20  # the other 94 blocks never started
    assert spill_files(on_ssd) == []  # the output nobody will see is gone


def test_an_exception_in_the_first_block_leaves_nothing_behind(on_ssd: Path) -> None:
    def fn(b: np.ndarray) -> np.ndarray:
        raise ValueError("bad block")

    with pytest.raises(BlockError, match=r"rows 0:10 \(block 1 of 2\): ValueError: bad block"):
        memory.map(fn, np.zeros((20, 100_000)), rows=10)
    assert spill_files(on_ssd) == []


def test_a_later_block_with_another_dtype_is_named(on_ssd: Path) -> None:
    def fn(b: np.ndarray) -> np.ndarray:
        return b.astype(np.float32) if b[0, 0] >= 30 else b

    x = np.repeat(np.arange(40.0)[:, None], 40_000, axis=1)  # 12.8 MB: the output goes to the SSD
    with pytest.raises(ChunkError, match=r"rows 30:40 \(block 4 of 4\)") as info:
        memory.map(fn, x, rows=10, workers=1)
    assert "float32" in str(info.value) and "float64" in str(info.value)
    assert spill_files(on_ssd) == []


def test_of_two_failing_blocks_the_first_in_row_order_is_raised(spill_dir: Path) -> None:
    # block 3 fails at once, block 2 only once block 3 has: the error names block 2 all the same
    block_3_failed = threading.Event()

    def fn(b: np.ndarray) -> np.ndarray:
        if b[0, 0] == 2:
            assert block_3_failed.wait(10), "block 3 never ran"
            raise ValueError("slow")
        if b[0, 0] == 4:
            block_3_failed.set()
            raise ValueError("fast")
        return b

    with pytest.raises(BlockError, match=r"rows 1:2 \(block 2 of 3\): ValueError: slow"):
        memory.map(fn, np.arange(6.0).reshape(3, 2), rows=1, workers=2)


def test_a_later_block_with_another_row_shape_is_named(spill_dir: Path) -> None:
    def fn(b: np.ndarray) -> np.ndarray:
        return b[:, :1] if b[0, 0] >= 2 else b

    with pytest.raises(ChunkError, match=r"shape \(1,\).*rows 1:2 \(block 2 of 3\).*shape \(2,\)"):
        memory.map(fn, np.arange(6.0).reshape(3, 2), rows=1)


@pytest.mark.parametrize("result,what", [(lambda b: b[:-1], "1 rows"), (lambda b: b.sum(), "a single value")])
def test_fn_must_give_one_row_per_input_row(spill_dir: Path, result: object, what: str) -> None:
    with pytest.raises(ChunkError, match=f"fn returned {what} for rows 0:2 .*one result row per input row"):
        memory.map(result, np.ones((4, 3)), rows=2)  # type: ignore[arg-type]


def test_fn_returning_python_objects_is_refused(spill_dir: Path) -> None:
    with pytest.raises(ChunkError, match="Python objects"):
        memory.map(lambda b: np.array([str(v) for v in b], dtype=object), np.arange(4), rows=2)


def test_progress_shows_rows_done(spill_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory.map(lambda b: b, np.zeros((3000, 2)), rows=1000, progress=True)
    err = capsys.readouterr().err
    assert "3.00k/3.00k" in err and "rows" in err


def test_map_does_not_import_tqdm_unless_asked(spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    np.testing.assert_array_equal(memory.map(lambda b: -b, np.ones(4), rows=2), -np.ones(4))
