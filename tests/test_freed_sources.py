"""Issue 26 item 17: ``chunks`` and ``map`` over a ``memory.array`` freed with ``memory.free``, before the call or
while it runs, raise ``ChunkError`` naming the free. A freed array reads as zeros (its RAM or file blocks went back),
so before the fix both returned zeros in place of the data, without an error.

Each case runs on a RAM array and on a spilled one, on a sim machine at ``ok`` (the host's pressure cannot move
them), and beside an unprotected control: the same blocks sliced by hand read zeros silently."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import ChunkError

ROWS, COLS = 250_000, 4  # 8 MB of float64: over the small-array size, so free gives its memory back
BLOCK = 50_000


@pytest.fixture(params=["ram", "ssd"])
def x(request: pytest.FixtureRequest, pressure_machine: object) -> Iterator[np.ndarray]:
    """An 8 MB ``memory.array`` of ones, in RAM or spilled (a budget of 0), freed at the end if still live."""
    memory.budget(0 if request.param == "ssd" else "auto")
    try:
        array = memory.array((ROWS, COLS), np.float64)
        assert memory.on_disk(array) == (request.param == "ssd")
        array[:] = 1.0
        yield array
        memory.free(array)
    finally:
        memory.budget("auto")


def test_control_a_freed_array_read_by_hand_gives_zeros_silently(x: np.ndarray) -> None:
    memory.free(x)
    total = sum(float(x[start:start + BLOCK].sum()) for start in range(0, ROWS, BLOCK))
    assert total == 0.0, "a freed array must read zeros: otherwise the tests below would prove nothing"


def test_chunks_of_an_array_freed_before_the_call_raise(x: np.ndarray) -> None:
    memory.free(x)
    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) before"):
        memory.chunks(x[10:], rows=BLOCK)  # a view of it too


def test_chunks_of_an_array_freed_between_blocks_raise_at_the_next_block(x: np.ndarray) -> None:
    seen = []
    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) while block 2 of 5"):
        for block in memory.chunks(x, rows=BLOCK):
            seen.append(float(block.sum()))
            if len(seen) == 2:
                memory.free(x)
    print(f"\nblocks read before the free {seen}")
    assert seen == [BLOCK * COLS * 1.0] * 2, "the blocks before the free are whole"


def test_map_of_an_array_freed_before_the_call_raises(x: np.ndarray) -> None:
    memory.free(x)
    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) before"):
        memory.map(lambda b: b * 2.0, x, rows=BLOCK)


@pytest.mark.parametrize("workers", [1, 3])
def test_map_of_an_array_freed_while_it_runs_raises(x: np.ndarray, workers: int) -> None:
    calls = []

    def fn(block: np.ndarray) -> np.ndarray:
        calls.append(len(block))
        if len(calls) == 3:
            memory.free(x)  # as another thread of the caller could
        return block * 2.0

    with pytest.raises(ChunkError, match=r"freed \(memory\.free\) while map"):
        memory.map(fn, x, rows=BLOCK, workers=workers)
    print(f"\nblocks run {len(calls)} of {ROWS // BLOCK}")
