"""``memory.map(fn, x, out=path)``: the output is a ``.npy`` that stays, written once, named only when whole, and
nothing at the path when the run fails (issue 28 item 2: a 6 GB job wrote 18 GB for its output: map, then np.save).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import ArgumentError, BlockError, MissingFileError, UnsafePathError
from apsi_memory.units import MiB

pytestmark = pytest.mark.usefixtures("calm_host")


def _process_write_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _double(block: np.ndarray) -> np.ndarray:
    return block * 2.0 + 1.0


def test_the_output_is_the_same_as_maps_a_npy_that_stays_and_report_names_it(out):
    x = np.arange(40_000, dtype=np.float32).reshape(10_000, 4)
    y = memory.map(_double, x, rows=1_000, workers=2, out=out / "y.npy")
    assert np.array_equal(y, memory.map(_double, x, rows=1_000))
    assert memory.on_disk(y) and y.filename == str(out / "y.npy")
    assert [r.path for r in memory.report() if r.nbytes == y.nbytes] == [str(out / "y.npy")]
    memory.free(y)
    assert np.array_equal(np.load(out / "y.npy"), x * 2.0 + 1.0) and os.listdir(out) == ["y.npy"]


def test_a_reader_finds_no_file_at_the_path_until_every_block_is_written(out):
    """Before: the file had its name (zeros) from the first block on; a reader took zeros for the result."""
    path = out / "y.npy"
    seen = []

    def looking(block: np.ndarray) -> np.ndarray:
        seen.append(path.exists())
        return block + 1

    memory.map(looking, np.zeros((8_000, 16)), rows=1_000, workers=2, out=path)
    assert len(seen) == 8 and not any(seen) and np.all(np.load(path) == 1)


@pytest.mark.parametrize("failure", [ValueError("bad block"), KeyboardInterrupt()])
def test_a_failing_block_or_ctrl_c_leaves_nothing_at_the_path_and_an_old_file_as_it_was(out, failure):
    path = out / "y.npy"
    np.save(path, np.arange(3))

    def failing(block: np.ndarray) -> np.ndarray:
        if block[0, 0] >= 4_000:
            raise failure
        return block

    x = np.repeat(np.arange(8_000, dtype=np.float64)[:, None], 8, axis=1)
    raised = BlockError if isinstance(failure, ValueError) else KeyboardInterrupt
    with pytest.raises(raised):
        memory.map(failing, x, rows=1_000, workers=2, out=path, overwrite=True)
    assert os.listdir(out) == ["y.npy"] and np.array_equal(np.load(path), np.arange(3))  # no temporary file left
    os.unlink(path)
    with pytest.raises(raised):
        memory.map(failing, x, rows=1_000, workers=2, out=path)
    assert os.listdir(out) == []


def test_a_taken_path_is_refused_before_any_block_runs_and_overwrite_replaces_it(out):
    path = out / "y.npy"
    np.save(path, np.arange(3))
    calls = []

    def counted(block: np.ndarray) -> np.ndarray:
        calls.append(len(block))
        return block

    with pytest.raises(ArgumentError, match=r"y\.npy: a file is there already \(pass overwrite=True"):
        memory.map(counted, np.ones((4_000, 2)), rows=1_000, out=path)
    assert calls == [] and np.array_equal(np.load(path), np.arange(3))
    memory.map(counted, np.ones((4_000, 2)), rows=1_000, out=path, overwrite=True)
    assert np.load(path).shape == (4_000, 2) and os.listdir(out) == ["y.npy"]


def test_a_link_at_the_path_or_a_missing_folder_is_refused_before_any_block(out, tmp_path):
    (tmp_path / "elsewhere.npy").write_bytes(b"theirs")
    (out / "y.npy").symlink_to(tmp_path / "elsewhere.npy")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        memory.map(lambda b: b, np.ones((10, 2)), out=out / "y.npy", overwrite=True)
    with pytest.raises(MissingFileError, match="does not exist"):
        memory.map(lambda b: b, np.ones((10, 2)), out=out / "no" / "y.npy")
    assert (tmp_path / "elsewhere.npy").read_bytes() == b"theirs"


def test_an_empty_input_gives_an_empty_npy(out):
    y = memory.map(_double, np.zeros((0, 3)), out=out / "y.npy")
    assert y.shape == (0, 3) and np.load(out / "y.npy").shape == (0, 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc/self/io")
def test_the_output_is_written_once_where_map_then_numpy_save_writes_it_twice(out):
    x = np.ones((16 * 1024, 1024), np.float32)  # 64 MiB
    os.sync()
    before = _process_write_bytes()
    y = memory.map(_double, x, rows=2048, workers=2, out=out / "kept.npy")
    memory.free(y)
    os.sync()
    kept = _process_write_bytes() - before
    before = _process_write_bytes()
    np.save(out / "saved.npy", memory.map(_double, x, rows=2048, workers=2))
    os.sync()
    saved = _process_write_bytes() - before
    assert 64 * MiB <= kept < 1.1 * 64 * MiB, kept
    assert saved >= 64 * MiB, saved  # the control: np.save writes the whole output again
