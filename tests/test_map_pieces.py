"""What ``fn`` sees in ``memory.map``: with ``rows`` given, exactly the blocks of ``rows`` rows; without (or with
``rowwise=True``), pieces of each block sized from the core's own cache (sysfs), so its temporaries stay there."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
import sim
from apsi_memory.adapters import maps
from apsi_memory.adapters.cpus import core_cache_bytes, parse_cache_size
from apsi_memory.arrays import placement
from apsi_memory.blocks.rules import block_spans, default_rows
from apsi_memory.decide import Place
from apsi_memory.errors import ArgumentTypeError, BlockError, ChunkError
from apsi_memory.machinery.machines import CORE_CACHE_BYTES, Machine
from sim.tree import SimTree

ROWS = 1_500_000
X = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)  # 12-byte rows, 18 MB
BLOCK = default_rows(12, 4)  # rows=None on 2 workers: 4 blocks in flight share 32 MB (699,050 rows)
PIECE = 16 * 1024 // 12  # a 16 KiB level-2 cache of 12-byte rows: 1,365 rows, which do not divide a block


def with_cache(tree: SimTree, size: str) -> None:
    """A core with a 32 KiB level-1 data cache, a level-2 cache of ``size`` and a shared 32 MiB level 3."""
    for index, (level, kind, text) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                                  ("2", "Unified", size), ("3", "Unified", "32768K")]):
        for field, value in (("level", level), ("type", kind), ("size", text)):
            tree.write(f"/sys/devices/system/cpu/cpu0/cache/index{index}/{field}", value + "\n")


@pytest.fixture
def cache_16k(sim_machine: Callable[..., SimTree], spill_dir: Path) -> SimTree:
    tree = sim_machine(sim.tree.docker_v1)
    with_cache(tree, "16K")
    return tree


def spans_seen(fn: Callable[[np.ndarray], np.ndarray], **kwargs: object) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``map(fn, X, workers=2, **kwargs)`` and the row spans ``fn`` was called on, in row order."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def recording(b: np.ndarray) -> np.ndarray:
        start = (b.ctypes.data - X.ctypes.data) // X.strides[0]
        with lock:
            seen.append((start, start + len(b)))
        return fn(b)

    y = memory.map(recording, X, workers=2, **kwargs)  # type: ignore[arg-type]
    return y, sorted(seen)


def pieces(blocks: list[tuple[int, int]], rows: int) -> list[tuple[int, int]]:
    return [piece for start, stop in blocks for piece in block_spans(stop, rows, start)]


def test_without_rows_fn_sees_cache_sized_pieces_of_each_block(cache_16k: SimTree) -> None:
    y, seen = spans_seen(lambda b: b * 2.0 + 1.0)
    assert seen == pieces(block_spans(ROWS, BLOCK), PIECE)  # the last piece of each block is shorter
    assert y.tobytes() == (X * 2.0 + 1.0).tobytes()


def test_with_rows_fn_sees_exactly_the_blocks_of_rows_rows(cache_16k: SimTree) -> None:
    def centred(b: np.ndarray) -> np.ndarray:  # needs its whole block: pieces would change every value
        return b - b.mean(axis=0)

    y, seen = spans_seen(centred, rows=100_000)
    assert seen == block_spans(ROWS, 100_000)
    expected = np.concatenate([centred(X[start:stop]) for start, stop in block_spans(ROWS, 100_000)])
    assert y.tobytes() == expected.tobytes()


def test_rowwise_true_splits_the_given_blocks_into_pieces(cache_16k: SimTree) -> None:
    y, seen = spans_seen(lambda b: np.sqrt(b) * np.log1p(b), rows=100_000, rowwise=True)
    assert seen == pieces(block_spans(ROWS, 100_000), PIECE)
    assert y.tobytes() == (np.sqrt(X) * np.log1p(X)).tobytes()


def test_rowwise_false_without_rows_gives_fn_the_whole_blocks(cache_16k: SimTree) -> None:
    _, seen = spans_seen(lambda b: b, rowwise=False)
    assert seen == block_spans(ROWS, BLOCK)


def test_the_pieces_grow_with_the_cache(sim_machine: Callable[..., SimTree], spill_dir: Path) -> None:
    with_cache(sim_machine(sim.tree.docker_v1), "1024K")
    _, seen = spans_seen(lambda b: b)
    assert seen == pieces(block_spans(ROWS, BLOCK), 1024 * 1024 // 12)


def test_a_failing_piece_is_named_by_its_rows_and_block(cache_16k: SimTree) -> None:
    def fails_on_row_2000(b: np.ndarray) -> np.ndarray:
        if b[0, 0] <= 2000 * 3 < b[-1, 0]:
            raise ValueError("bad row")
        return b

    with pytest.raises(BlockError, match=r"rows 1365:2730 \(block 1 of 3\): ValueError: bad row"):
        memory.map(fails_on_row_2000, X, workers=2)


def test_rowwise_must_be_true_or_false(spill_dir: Path) -> None:
    with pytest.raises(ArgumentTypeError, match="map: rowwise must be True or False, not str"):
        memory.map(lambda b: b, X, rowwise="no")  # type: ignore[arg-type]


def test_the_core_cache_is_level_2_from_sysfs(tmp_path: Path) -> None:
    tree = SimTree(tmp_path)
    with_cache(tree, "512K")
    assert core_cache_bytes(str(tmp_path)) == 512 * 1024
    assert Machine(root=str(tmp_path), siblings=False).cache_bytes() == 512 * 1024


def test_the_core_cache_is_read_once_per_machine_root(tmp_path: Path) -> None:
    """Every ``map`` call asks for the cache; sysfs is read for the first only, and again under a new root."""
    first, other = SimTree(tmp_path / "a"), SimTree(tmp_path / "b")
    with_cache(first, "512K")
    m = Machine(root=str(tmp_path / "a"), siblings=False)
    assert m.cache_bytes() == 512 * 1024
    with_cache(first, "2048K")  # not read again: a core's cache does not change while the process runs
    assert m.cache_bytes() == 512 * 1024
    with_cache(other, "256K")
    m.root = str(tmp_path / "b")
    assert m.cache_bytes() == 256 * 1024


def test_without_sysfs_the_core_cache_is_taken_as_1_mib(tmp_path: Path) -> None:
    assert core_cache_bytes(str(tmp_path)) is None
    assert Machine(root=str(tmp_path), siblings=False).cache_bytes() == CORE_CACHE_BYTES == 1024 * 1024


@pytest.mark.parametrize("text, size", [("1024K\n", 1 << 20), ("2M", 2 << 20), ("48", 48), ("big", None), ("", None)])
def test_cache_sizes_read_as_sysfs_writes_them(text: str, size: int | None) -> None:
    assert parse_cache_size(text) == size


def test_a_later_piece_that_disagrees_with_the_first_is_refused(cache_16k: SimTree) -> None:
    def short_after_row_2000(b: np.ndarray) -> np.ndarray:
        return b[:-1] if b[0, 0] >= 2000 * 3 else b

    with pytest.raises(ChunkError, match=r"1364 rows for rows 2730:4095 \(block 1 of 3\) \(1365 rows\)"):
        memory.map(short_after_row_2000, X, workers=2)
    with pytest.raises(ChunkError, match=r"dtype float64 for rows 2730:4095 \(block 1 of 3\).*dtype float32"):
        memory.map(lambda b: b.astype(np.float64) if b[0, 0] >= 2000 * 3 else b, X, workers=2)


def test_a_piece_may_return_rows_that_numpy_turns_into_the_output_s_rows(cache_16k: SimTree) -> None:
    def doubled(b: np.ndarray) -> object:
        y = (b * 2.0).astype(np.float64)
        return y.tolist() if b[0, 0] >= 2000 * 3 else y  # Python floats: float64 once NumPy has them

    y = memory.map(doubled, X, workers=2)  # type: ignore[arg-type]
    assert y.tobytes() == (X * 2.0).astype(np.float64).tobytes()


def test_an_input_in_numpy_s_memory_is_not_looked_up_in_proc_maps(cache_16k: SimTree,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An array NumPy allocated cannot be a file mapping: reading /proc/self/maps for it cost ~0.3 ms a call."""
    looked_up: list[int] = []
    real = maps.file_region
    monkeypatch.setattr(maps, "file_region", lambda start, end, root=None: looked_up.append(start) or real(start,
                                                                                                         end, root))
    y = memory.map(lambda b: b * 2.0, X[10:], workers=2)
    assert X[10:].ctypes.data not in looked_up
    assert y.tobytes() == (X[10:] * 2.0).tobytes()


def test_an_output_placed_in_ram_is_not_looked_up_in_proc_maps(cache_16k: SimTree,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``map`` placed its output itself, so it knows an output in RAM is no file mapping: reading
    /proc/self/maps to find that out was half of the ~0.9 ms the blocks beside block 0 may wait for."""
    looked_up: list[int] = []
    real = maps.file_region
    monkeypatch.setattr(maps, "file_region", lambda start, end, root=None: looked_up.append(start) or real(start,
                                                                                                         end, root))
    y = memory.map(lambda b: b * 2.0, X, workers=2)
    assert placement.entry_of(y).place is Place.RAM  # type: ignore[union-attr]
    assert y.ctypes.data not in looked_up
    assert y.tobytes() == (X * 2.0).tobytes()


def test_the_input_is_checked_for_free_without_a_lookup_per_piece(cache_16k: SimTree,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``map`` asks after every piece whether its input was freed; finding the input's entry (a walk over its
    ``.base`` chain) is done once a call, not for each of its ~1,100 pieces."""
    lookups = [0]

    def counted(real: Callable[[np.ndarray], object]) -> Callable[[np.ndarray], object]:
        def lookup(x: np.ndarray) -> object:
            lookups[0] += 1
            return real(x)
        return lookup

    for name in ("is_freed", "entry_of"):
        monkeypatch.setattr(placement, name, counted(getattr(placement, name)))
    y, seen = spans_seen(lambda b: b * 2.0)
    assert len(seen) > 1000 and lookups[0] <= 2
    assert y.tobytes() == (X * 2.0).tobytes()


def test_each_piece_s_result_is_let_go_before_fn_runs_on_the_next(cache_16k: SimTree) -> None:
    """A result kept alive while ``fn`` makes the next one put that one's temporaries at the top of ``malloc``'s
    heap, given back to the kernel and faulted in again: 5,400 page faults a 512 MiB ``map`` of ``b * 2.0 + 1.0``
    against 44. One result at a time reuses the same cached memory for every piece."""
    results: list[weakref.ref[np.ndarray]] = []
    alive_at_call: list[int] = []

    def doubled(b: np.ndarray) -> np.ndarray:
        alive_at_call.append(sum(ref() is not None for ref in results))
        result = b * 2.0
        results.append(weakref.ref(result))
        return result

    y = memory.map(doubled, X, workers=1)
    assert len(alive_at_call) > 1000 and max(alive_at_call) == 0
    assert y.tobytes() == (X * 2.0).tobytes()
