"""Issue 28 item 3: ``reduce`` runs a function of each row block on threads and combines the results into one value
(column sums, Gram matrices), equal to NumPy on the whole array, with the same bits on every run."""

from __future__ import annotations

import functools
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.errors import ArgumentTypeError, BlockError, ChunkError
from tests.load import stretched
from tests.strategies import SOURCES, arrays_of, as_source

INTS = st.sampled_from(["int8", "<i4", ">i8", "uint16"])


@settings(max_examples=100, deadline=None)
@given(x=arrays_of(INTS), rows=st.integers(1, 50), kind=SOURCES, workers=st.integers(1, 4))
def test_column_sums_equal_numpy_on_the_whole(x: np.ndarray, rows: int, kind: str, workers: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        got = memory.reduce(lambda b: b.sum(axis=0, dtype=np.int64), as_source(x, kind, folder), rows=rows,
                     workers=workers)
    np.testing.assert_array_equal(got, x.sum(axis=0, dtype=np.int64))


@settings(max_examples=60, deadline=None)
@given(x=arrays_of(INTS).filter(lambda a: a.ndim == 2), rows=st.integers(1, 50), workers=st.integers(1, 4))
def test_a_gram_matrix_equals_numpy_on_the_whole(x: np.ndarray, rows: int, workers: int) -> None:
    def gram(b: np.ndarray) -> np.ndarray:
        wide = b.astype(np.int64)
        return wide.T @ wide

    np.testing.assert_array_equal(memory.reduce(gram, x, rows=rows, workers=workers), gram(x))


@settings(max_examples=60, deadline=None)
@given(x=arrays_of(st.sampled_from(["float32", "<f8"])).filter(lambda a: len(a) > 0), rows=st.integers(1, 50),
       workers=st.integers(1, 4))
def test_another_combine_gives_column_minima(x: np.ndarray, rows: int, workers: int) -> None:
    got = memory.reduce(lambda b: b.min(axis=0), x, rows=rows, workers=workers, combine=np.minimum)
    np.testing.assert_array_equal(got, x.min(axis=0))


def scrambled(b: np.ndarray) -> np.ndarray:
    """Column sums whose blocks finish in a random order (each sleeps a random moment)."""
    time.sleep(random.random() * 0.004)
    return b.sum(axis=0)


def test_a_run_gives_the_bits_of_adding_the_blocks_in_row_order() -> None:
    """Float addition is not associative: combining in the order blocks finish would change the last bits."""
    x = np.random.default_rng(1).standard_normal((20_000, 16)) * 10.0 ** np.arange(-8, 8)
    rows = 250
    in_order = functools.reduce(np.add, (x[i:i + rows].sum(axis=0) for i in range(0, len(x), rows)))
    runs = [memory.reduce(scrambled, x, rows=rows, workers=4).tobytes() for _ in range(3)]
    assert runs == [in_order.tobytes()] * 3


def test_blocks_run_on_the_threads_at_the_same_time() -> None:
    seen: set[int] = set()
    both = threading.Barrier(2, timeout=10)

    def fn(b: np.ndarray) -> np.ndarray:
        seen.add(threading.get_ident())
        both.wait()  # only passes when two blocks run at once
        return b.sum(axis=0)

    assert memory.reduce(fn, np.ones((40, 2)), rows=10, workers=2).tolist() == [40.0, 40.0]
    assert threading.get_ident() not in seen and len(seen) == 2


def _block_0_waits_for(first_row: int, seconds: float) -> bool:
    """Whether the block starting at ``first_row`` started while block 0 (of six blocks of 10 rows, 2 workers)
    waited up to ``seconds`` for it; the result must still be that of adding the blocks in row order."""
    started = threading.Event()
    waited: list[bool] = []

    def fn(b: np.ndarray) -> np.ndarray:
        if b[0, 0] == first_row:
            started.set()
        if b[0, 0] == 0:
            waited.append(started.wait(seconds))
        return b.sum(axis=0)

    x = np.arange(60, dtype=np.float64).reshape(-1, 1)
    assert memory.reduce(fn, x, rows=10, workers=2).tolist() == [x.sum()]
    return waited == [True]


def test_a_thread_whose_block_finished_first_goes_on_to_the_next_block() -> None:
    """A thread that waited for the blocks before its own to be combined held short blocks (11 ms of column sums)
    to 1.41-1.63x the one-thread loop on 2 cores. Block 0 here returns only once block 2 has started, which only
    the thread that finished block 1 can start."""
    assert _block_0_waits_for(20, stretched(10))  # the old rule: False after 10 s, the other thread waiting


def test_a_thread_workers_blocks_ahead_of_the_total_waits_with_its_result() -> None:
    """The memory bound of going on: while block 0 runs, the other thread finishes blocks 1 and 2 and keeps the
    result of 2 (two blocks ahead, with 2 workers) instead of starting a fourth block."""
    assert not _block_0_waits_for(30, 2)  # without the bound every finished result would wait here, however many


def test_no_more_than_two_block_results_per_worker_wait_beside_the_total() -> None:
    lock = threading.Lock()
    returned = combined = most = 0

    def fn(b: np.ndarray) -> np.ndarray:
        nonlocal returned, most
        time.sleep(random.random() * 0.003)
        with lock:
            returned += 1
            most = max(most, returned - combined - 1)  # block 0's result is the total
        return b.sum(axis=0)

    def add(total: np.ndarray, part: np.ndarray) -> np.ndarray:
        nonlocal combined
        with lock:
            combined += 1
        return total + part

    memory.reduce(fn, np.ones((3_000, 4)), rows=10, workers=3, combine=add)
    assert 1 <= most <= 2 * 3


def test_a_npy_path_is_an_input(tmp_path: Path) -> None:
    x = np.arange(60_000, dtype=np.float64).reshape(-1, 3)
    np.save(tmp_path / "x.npy", x)
    assert memory.reduce(lambda b: b.T @ b, str(tmp_path / "x.npy"), rows=999, workers=2).tolist() == (x.T @ x).tolist()


def test_an_empty_input_gives_fn_of_the_empty_block() -> None:
    assert memory.reduce(lambda b: b.sum(axis=0), np.zeros((0, 3))).tolist() == [0.0, 0.0, 0.0]


def test_an_exception_in_fn_names_the_rows_and_later_blocks_do_not_start() -> None:
    started: list[int] = []

    def fn(b: np.ndarray) -> np.ndarray:
        started.append(int(b[0, 0]))
        if b[0, 0] == 300:
            raise ZeroDivisionError("boom")
        return b.sum(axis=0)

    x = np.arange(10_000, dtype=np.float64).reshape(-1, 1)
    with pytest.raises(BlockError, match=r"fn failed on rows 300:400 \(block 4 of 100\): ZeroDivisionError: boom") \
            as caught:
        memory.reduce(fn, x, rows=100, workers=2)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    assert max(started) < 300 + 2 * 2 * 100  # only the blocks already handed out ran


def test_a_failing_block_does_not_leave_later_blocks_waiting_for_their_turn() -> None:
    """Blocks after the failing one wait for a turn that never comes: the stop must wake them, or the call hangs."""
    def fn(b: np.ndarray) -> np.ndarray:
        if b[0, 0] == 0:
            time.sleep(0.2)  # the later blocks are waiting by then
            raise ZeroDivisionError("first")
        return b.sum(axis=0)

    outcome: list[BaseException] = []

    def call() -> None:
        try:
            memory.reduce(fn, np.arange(80, dtype=np.float64).reshape(-1, 1), rows=10, workers=4)
        except BlockError as exc:
            outcome.append(exc)

    runner = threading.Thread(target=call, daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "reduce hung after a failing block"
    assert "rows 0:10" in str(outcome[0])


def test_an_exception_in_combine_names_the_block() -> None:
    def add(total: np.ndarray, part: np.ndarray) -> np.ndarray:
        raise OverflowError("too big")

    with pytest.raises(BlockError, match=r"combine failed adding rows 10:20 \(block 2 of 3\): OverflowError"):
        memory.reduce(lambda b: b.sum(axis=0), np.ones((30, 2)), rows=10, combine=add)


@pytest.mark.parametrize(("fn", "what"), [
    (lambda b: b.sum(axis=0) if b[0, 0] == 0 else b.sum(axis=0)[None], r"shape \(1, 2\) and dtype float64"),
    (lambda b: b.sum(axis=0) if b[0, 0] == 0 else b.sum(axis=0).astype(np.float32), r"shape \(2,\) and dtype float32"),
])
def test_a_block_whose_result_differs_from_the_first_is_named(fn: object, what: str) -> None:
    x = np.arange(60, dtype=np.float64).reshape(-1, 2)
    with pytest.raises(ChunkError, match=rf"fn returned {what}.* for rows 5:10 \(block 2 of 6\).*first block"):
        memory.reduce(fn, x, rows=5, workers=2)  # type: ignore[arg-type]


def test_control_np_add_broadcasts_a_wrong_shape_silently() -> None:
    assert np.add(np.ones(2), np.ones((1, 2))).shape == (1, 2)  # why the check above is needed


@pytest.mark.parametrize("name", ["fn", "combine"])
def test_a_function_that_is_not_callable_is_refused_at_the_call(name: str) -> None:
    given_ = {"fn": lambda b: b.sum(), "combine": np.add, name: "add"}
    with pytest.raises(ArgumentTypeError, match=rf"reduce needs a function for {name}, not str"):
        memory.reduce(given_["fn"], np.ones((4, 2)), combine=given_["combine"])


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_workers_fail_at_the_call(workers: object) -> None:
    with pytest.raises(ChunkError, match="workers must be"):
        memory.reduce(lambda b: b.sum(), np.ones((4, 2)), workers=workers)  # type: ignore[arg-type]


def test_an_array_freed_before_the_call_raises(pressure_machine: object) -> None:
    x = memory.array((250_000, 4), np.float64)
    memory.free(x)
    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) before reduce"):
        memory.reduce(lambda b: b.sum(axis=0), x, rows=50_000)


@pytest.mark.parametrize("workers", [1, 3])
def test_an_array_freed_while_it_runs_raises(pressure_machine: object, workers: int) -> None:
    x = memory.array((250_000, 4), np.float64)
    x[:] = 1.0
    calls: list[int] = []

    def fn(b: np.ndarray) -> np.ndarray:
        calls.append(len(b))
        if len(calls) == 3:
            memory.free(x)  # as another thread of the caller could
        return b.sum(axis=0)

    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) while reduce ran"):
        memory.reduce(fn, x, rows=50_000, workers=workers)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_stops_the_run() -> None:
    calls: list[int] = []

    def fn(b: np.ndarray) -> np.ndarray:
        calls.append(len(b))
        time.sleep(0.01)
        return b.sum(axis=0)

    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        memory.reduce(fn, np.ones((10_000, 2)), rows=10, workers=2)
    timer.join()
    assert len(calls) < 1_000 and time.monotonic() - began < 5
