"""memory.chunks as a user sees it: which blocks come out, of what, and what bad input says."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import ChunkError, CorruptFileError


@pytest.fixture(autouse=True)
def _spill_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path / "spill"))


def saved(tmp_path: Path, array: np.ndarray, name: str = "x.npy") -> str:
    path = str(tmp_path / name)
    np.save(path, array)
    return path


def test_blocks_are_views_of_consecutive_rows_and_the_last_is_shorter() -> None:
    x = np.arange(30.0).reshape(10, 3)
    blocks = list(memory.chunks(x, rows=4))
    assert [b.shape for b in blocks] == [(4, 3), (4, 3), (2, 3)]
    assert all(np.shares_memory(b, x) for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), x)


def test_a_npy_file_streams_its_rows_read_only(tmp_path: Path) -> None:
    x = np.arange(8000, dtype=np.float32).reshape(1000, 8)
    blocks = list(memory.chunks(saved(tmp_path, x), rows=300))
    assert [len(b) for b in blocks] == [300, 300, 300, 100]
    np.testing.assert_array_equal(np.concatenate(blocks), x)
    with pytest.raises(ValueError, match="read-only"):
        blocks[0][0, 0] = 1.0


def test_pathlib_paths_work(tmp_path: Path) -> None:
    x = np.arange(10, dtype=np.int16)
    assert sum(int(b.sum()) for b in memory.chunks(Path(saved(tmp_path, x)), rows=3)) == 45


def test_writes_through_blocks_of_a_writable_memmap_reach_the_file(tmp_path: Path) -> None:
    path = saved(tmp_path, np.zeros((2000, 4), np.float64))
    x = np.load(path, mmap_mode="r+")
    for block in memory.chunks(x, rows=512):
        block[:] = 7.0
    x.flush()
    del x
    assert (np.load(path) == 7.0).all()


def test_changes_to_a_copy_on_write_memmap_survive_streaming(tmp_path: Path) -> None:
    # Its changed pages exist only in this process: releasing them would silently undo the changes.
    path = saved(tmp_path, np.zeros((100_000, 8), np.float32))  # 3.2 MB: many pages per block
    x = np.load(path, mmap_mode="c")
    for block in memory.chunks(x, rows=10_000):
        block += 1.0
    assert (x == 1.0).all()
    assert (np.load(path) == 0.0).all()  # and the file is untouched


def test_a_memory_array_on_the_ssd_streams(on_ssd: Path) -> None:
    x = memory.array((300_000, 4), "float32")  # 4.6 MB: over the (empty) budget, so on the SSD
    assert memory.on_disk(x)
    x[:] = np.arange(4, dtype=np.float32)
    total = sum(float(b.sum(dtype=np.float64)) for b in memory.chunks(x, rows=100_000))
    assert total == 300_000 * 6.0
    memory.free(x)


def test_a_block_kept_after_the_loop_moved_on_still_holds_its_data(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((50_000, 8)).astype(np.float32)  # 1.6 MB: several pages per block
    kept = [b for b in memory.chunks(saved(tmp_path, x), rows=5_000)]  # each block was released after its turn
    np.testing.assert_array_equal(kept[0], x[:5_000])
    np.testing.assert_array_equal(kept[-1], x[-5_000:])


def test_a_1d_array_streams_its_elements(tmp_path: Path) -> None:
    x = np.arange(10, dtype=np.int64)
    assert [b.tolist() for b in memory.chunks(saved(tmp_path, x), rows=4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("shape", [(0,), (0, 8), (5, 0)])
def test_an_array_without_data_gives_its_rows_or_nothing(tmp_path: Path, shape: tuple[int, ...]) -> None:
    x = np.zeros(shape, np.float32)
    from_file = list(memory.chunks(saved(tmp_path, x), rows=2))
    from_ram = list(memory.chunks(x, rows=2))
    assert [b.shape for b in from_file] == [b.shape for b in from_ram] == [
        (min(2, shape[0] - start),) + shape[1:] for start in range(0, shape[0], 2)]


def test_without_rows_a_small_file_is_one_block(tmp_path: Path) -> None:
    x = np.ones((1000, 8), np.float32)
    assert [b.shape for b in memory.chunks(saved(tmp_path, x))] == [(1000, 8)]


def test_without_rows_blocks_are_about_32_mb() -> None:
    x = np.zeros((3_000_000, 8), np.float32)  # 96 MB
    assert [len(b) for b in memory.chunks(x)] == [1_048_576, 1_048_576, 902_848]


def test_in_ram_arrays_of_any_layout_and_dtype_give_views() -> None:
    fortran = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    np.testing.assert_array_equal(np.concatenate(list(memory.chunks(fortran, rows=3))), fortran)
    objects = np.array([{"a": 1}, None, "text"], dtype=object)
    assert [b.tolist() for b in memory.chunks(objects, rows=2)] == [[{"a": 1}, None], ["text"]]


def test_structured_dtypes_stream(tmp_path: Path) -> None:
    x = np.zeros(100, dtype=[("id", "<i8"), ("score", "<f4")])
    x["id"] = np.arange(100)
    ids = np.concatenate([b["id"] for b in memory.chunks(saved(tmp_path, x), rows=30)])
    np.testing.assert_array_equal(ids, np.arange(100))


def test_a_format_2_file_streams(tmp_path: Path) -> None:
    path = str(tmp_path / "v2.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(100, 3), version=(2, 0))
    x[:] = 1.5
    del x
    assert sum(float(b.sum()) for b in memory.chunks(path, rows=40)) == 450.0


# -- bad input: clear errors at the call, nothing touched ----------------------------------------------------------

@pytest.mark.parametrize("rows", [0, -5, 2.5, "100"])
def test_bad_rows_fail_at_the_call(tmp_path: Path, rows: object) -> None:
    with pytest.raises(ChunkError, match="rows must be"):
        memory.chunks(np.zeros((10, 2)), rows=rows)  # type: ignore[arg-type]


def test_a_0d_array_has_no_rows() -> None:
    with pytest.raises(ChunkError, match="0-d"):
        memory.chunks(np.array(3.0), rows=1)


def test_a_fortran_order_file_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = saved(tmp_path, np.asfortranarray(np.zeros((100, 4))))
    with pytest.raises(ChunkError, match="Fortran order") as info:
        memory.chunks(path, rows=10)
    assert path in str(info.value) and "ascontiguousarray" in str(info.value)


def test_a_fortran_order_file_with_one_column_streams(tmp_path: Path) -> None:
    path = saved(tmp_path, np.asfortranarray(np.arange(10.0).reshape(10, 1)))
    assert len(list(memory.chunks(path, rows=3))) == 4


def test_a_reversed_memmap_is_refused(tmp_path: Path) -> None:
    x = np.load(saved(tmp_path, np.zeros((100, 4))), mmap_mode="r")
    with pytest.raises(ChunkError, match="one after another"):
        memory.chunks(x[::-1], rows=10)


class _WritesAFile:
    """Unpickling this creates ``marker``: proof that a file was (or was not) unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_an_object_dtype_file_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = np.empty(2, dtype=object)
    payload[0] = _WritesAFile(str(marker))
    path = str(tmp_path / "objects.npy")
    np.save(path, payload, allow_pickle=True)
    with pytest.raises(ChunkError, match="Python objects") as info:
        memory.chunks(path, rows=1)
    assert "never unpickles" in str(info.value)
    assert not marker.exists()
    for opened in np.load(path, allow_pickle=True)[:1]:  # the payload is live: unpickling it creates the marker
        opened.close()
    assert marker.exists()


def test_a_truncated_file_names_the_sizes(tmp_path: Path) -> None:
    path = saved(tmp_path, np.zeros((1000, 8), np.float32))
    os.truncate(path, os.path.getsize(path) - 100)
    with pytest.raises(CorruptFileError, match="truncated") as info:
        memory.chunks(path, rows=10)
    assert info.value.path == path
    assert "32128 bytes" in str(info.value) and "32028 bytes" in str(info.value)


@pytest.mark.parametrize("content", [b"a,b,c\n1,2,3\n", b"", b"PK\x03\x04 a zip"])
def test_a_file_that_is_not_npy_says_so(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "data.npy"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError, match="not a .npy file") as info:
        memory.chunks(str(path), rows=10)
    assert info.value.path == str(path)


def test_a_damaged_header_says_so(tmp_path: Path) -> None:
    path = saved(tmp_path, np.zeros(10))
    data = bytearray(Path(path).read_bytes())
    data[10:20] = b"#" * 10
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="unreadable .npy header"):
        memory.chunks(path, rows=10)


def test_a_format_3_file_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = str(tmp_path / "v3.npy")
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(10,), version=(3, 0))
    del x
    with pytest.raises(ChunkError, match="version 3.0") as info:
        memory.chunks(path, rows=10)
    assert "mmap_mode='r'" in str(info.value)


def test_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.npy"):
        memory.chunks(str(tmp_path / "nowhere.npy"), rows=10)


def test_something_that_is_not_an_array_or_a_path_is_refused() -> None:
    with pytest.raises(ChunkError, match="cannot split a list"):
        memory.chunks([[1, 2], [3, 4]], rows=1)  # type: ignore[arg-type]


# -- progress ------------------------------------------------------------------------------------------------------

def test_progress_shows_rows_done(capsys: pytest.CaptureFixture[str]) -> None:
    for _ in memory.chunks(np.zeros((5000, 2)), rows=1000, progress=True):
        pass
    err = capsys.readouterr().err
    assert "5.00k/5.00k" in err and "rows" in err


def test_progress_without_tqdm_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError) as err:
        next(iter(memory.chunks(np.zeros((10, 2)), rows=5, progress=True)))
    # both forms: from an index, and from a checkout (the package is not on a public index)
    assert "pip install 'apsi-memory[progress]'" in str(err.value) and "pip install '.[progress]'" in str(err.value)


def test_tqdm_is_not_imported_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert len(list(memory.chunks(np.zeros((10, 2)), rows=5))) == 2
