"""``apsi_memory.blocks.pages``: the background thread that makes the slow calls, and which arrays get read-ahead and
release at all (the effect on RSS and the page cache is measured in test_chunks_release)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from apsi_memory.blocks.pages import Background, file_region
from sim.tree import SimTree, host


def test_background_runs_calls_in_order_and_raises_a_failed_one_at_close() -> None:
    done: list[int] = []
    kernel = Background(depth=1)

    def fail() -> None:
        raise RuntimeError("bug in a background call")

    kernel.submit(done.append, 1)
    kernel.submit(fail)
    kernel.submit(done.append, 2)  # the thread keeps serving after a failure, so the caller never blocks
    with pytest.raises(RuntimeError, match="bug in a background call"):
        kernel.close()
    assert done == [1, 2]


def test_background_without_calls_starts_no_thread() -> None:
    before = threading.active_count()
    kernel = Background()
    assert threading.active_count() == before
    kernel.close()


def test_a_memmap_is_a_file_region_and_an_array_in_ram_or_empty_is_not(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((1000, 8), dtype=np.float32))
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    region = file_region(mapped)
    assert region is not None and region.path == str(tmp_path / "x.npy")
    assert region.file_offset + (mapped.ctypes.data - region.start) == 128  # just past the .npy header
    assert file_region(np.ones((1000, 8))) is None
    assert file_region(mapped[:0]) is None


def test_on_a_fake_machine_maps_comes_from_its_tree(tmp_path: Path, sim_machine: Callable[..., SimTree]) -> None:
    """/proc/self/maps is read under the injectable root like every kernel file: a tree without it has no file
    mappings, so streaming there leaves the pages to the kernel."""
    np.save(tmp_path / "x.npy", np.ones((1000, 8), dtype=np.float32))
    sim_machine(host)
    assert file_region(np.load(tmp_path / "x.npy", mmap_mode="r")) is None
