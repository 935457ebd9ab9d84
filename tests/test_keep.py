"""``memory.keep`` and ``memory.array(..., path=)``: an output that stays, its bytes written once, never torn."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import moving, npyfiles, placement
from apsi_memory.decide import Level
from apsi_memory.errors import ArgumentError, DiskFullError, MissingFileError, UnsafePathError
from apsi_memory.units import MiB

pytestmark = pytest.mark.usefixtures("calm_host")  # the real host's pressure must not decide what stays in RAM
needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, moves")


def _written_by_this_thread() -> int:
    with open("/proc/thread-self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


def _as_numpy_saves(x: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, x)
    return out.getvalue()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The folder outputs are kept in (``tmp_path`` holds the simulated machine too)."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _spilled(rows: int) -> np.ndarray:
    x = memory.array([rows, 1024], "float32")
    assert memory.on_disk(x), "the test needs a spilled array"
    return x


@needs_linux
@pytest.mark.skipif(not os.path.exists("/proc/thread-self/io"), reason="needs /proc/thread-self/io")
def test_keeping_a_spilled_array_writes_no_data_and_the_array_goes_on_in_the_kept_file(on_ssd, out):
    x = _spilled(16 * 1024)  # 64 MiB
    x[:] = 3.0
    os.sync()  # the fill is on the disk: what follows is only what keeping writes
    before = _written_by_this_thread()
    path = memory.keep(x, out / "out.npy")
    written = _written_by_this_thread() - before
    assert written < MiB, f"keep wrote {written} bytes for a 64 MiB spilled array"
    assert path == str(out / "out.npy") and os.listdir(on_ssd) == []  # the spill file became it
    x[0, 0] = 7.0  # the array now lives in the kept file
    kept = np.load(path, mmap_mode="r")
    assert kept.shape == (16 * 1024, 1024) and kept[0, 0] == 7.0 and kept[1, 0] == 3.0
    assert memory.on_disk(x) and str(memory.report()[-1]).endswith("kept at its path: apsi_memory never deletes it")
    assert memory.keep(x, path, overwrite=True) == path  # kept there already: x stays on the file
    x[0, 0] = 8.0
    assert np.load(path, mmap_mode="r")[0, 0] == 8.0


def test_the_kept_file_outlives_free_the_collector_and_the_exit(on_ssd, out):
    code = f"""
        import gc, apsi_memory as memory
        memory.budget(0)
        x = memory.array([4096, 1024], "float32"); x[:] = 5.0
        y = memory.array([4096, 1024], "float32"); y[:] = 6.0
        memory.keep(x, {str(out / "x.npy")!r}); memory.keep(y, {str(out / "y.npy")!r})
        memory.free(x)
        del y; gc.collect()
        print(x[1, 1])
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "APSI_SPILL_DIR": str(on_ssd)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5.0"]  # free leaves a kept array's data readable
    assert np.all(np.load(out / "x.npy") == 5.0) and np.all(np.load(out / "y.npy") == 6.0)
    assert os.listdir(on_ssd) == []


@needs_linux
def test_a_moved_array_kept_in_place_is_a_npy_with_nothing_after_its_data(spill_dir, out):
    x = memory.array((3 * MiB + 8) // 8, "int64")  # not a whole number of pages: its spill file ends at one
    assert not memory.on_disk(x)
    x[:] = np.arange(x.size)
    entry = placement.entry_of(x)
    assert entry is not None and moving.move(entry, Level.HIGH)
    spill_file = entry.path
    memory.keep(x, out / "moved.npy")
    assert not os.path.exists(spill_file)  # kept in place, not copied
    with open(out / "moved.npy", "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        assert os.fstat(f.fileno()).st_size == f.tell() + x.nbytes  # the page padding after the data is cut
    assert np.array_equal(np.load(out / "moved.npy"), np.arange(x.size))


def test_an_array_in_ram_is_written_once_as_numpy_save_writes_it_and_stays_in_ram(out):
    x = memory.array([512, 1024], "float64")  # 4 MiB, within the budget
    x[:] = np.arange(1024)
    memory.keep(x, out / "ram.npy")
    assert (out / "ram.npy").read_bytes() == _as_numpy_saves(x)
    assert not memory.on_disk(x)
    x[0, 0] = -1.0  # written once: x is not backed by the file
    assert np.load(out / "ram.npy")[0, 0] == 0.0


def test_a_view_is_kept_as_numpy_save_would_write_that_view(on_ssd, out):
    x = _spilled(1024)
    x[:] = np.arange(1024, dtype="float32")
    for name, view in (("rows.npy", x[::3]), ("plain.npy", np.arange(10.0)[::2]), ("t.npy", x[:100].T)):
        memory.keep(view, out / name)
        assert np.array_equal(np.load(out / name), view)
    assert (out / "rows.npy").read_bytes() == _as_numpy_saves(x[::3])  # the transpose: C order, not Fortran
    assert os.path.exists(x.filename)  # x is still on its spill file


def test_a_file_at_the_path_is_refused_unless_overwrite_and_a_link_or_folder_always(on_ssd, out):
    x = _spilled(1024)
    x[:] = 1.0
    (out / "taken.npy").write_bytes(b"theirs")
    with pytest.raises(ArgumentError, match="a file is there already .pass overwrite=True"):
        memory.keep(x, out / "taken.npy")
    assert (out / "taken.npy").read_bytes() == b"theirs"
    (out / "victim").write_bytes(b"not ours to write")
    (out / "link.npy").symlink_to(out / "victim")
    (out / "folder.npy").mkdir()
    for where, error in (("link.npy", UnsafePathError), ("folder.npy", ArgumentError)):
        for value in (x, np.ones(3)):
            with pytest.raises(error):
                memory.keep(value, out / where, overwrite=True)
    assert (out / "victim").read_bytes() == b"not ours to write"
    memory.keep(x, out / "taken.npy", overwrite=True)
    assert np.all(np.load(out / "taken.npy") == 1.0)
    assert sorted(os.listdir(out)) == ["folder.npy", "link.npy", "taken.npy", "victim"]


def test_a_missing_or_foreign_writable_folder_a_freed_or_partly_moved_array_are_refused(out):
    x = memory.array([512, 1024], "float64")
    with pytest.raises(MissingFileError, match="does not exist .apsi_memory creates no folder"):
        memory.keep(x, out / "no" / "out.npy")
    open_to_all = out / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)  # another user could swap the result there
    with pytest.raises(UnsafePathError, match="writable by others"):
        memory.keep(x, open_to_all / "out.npy")
    entry = placement.entry_of(x)
    assert entry is not None
    entry.moved = MiB  # what a failed move leaves: the first MiB on a spill file, the rest in RAM
    with pytest.raises(ArgumentError, match="partly moved"):
        memory.keep(x, out / "out.npy")
    entry.moved = 0
    memory.free(x)
    with pytest.raises(ArgumentError, match="freed"):
        memory.keep(x, out / "out.npy")
    assert sorted(os.listdir(out)) == ["open"] and os.listdir(open_to_all) == []


def test_a_reader_sees_no_file_until_it_is_whole_and_a_failure_half_way_leaves_nothing(out, monkeypatch):
    seen_half_way = []

    def then_full(x: np.ndarray) -> Any:
        yield x.reshape(-1).view(np.uint8).data[:MiB]
        seen_half_way.append(os.path.exists(out / "out.npy"))  # what a reader would find now
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(npyfiles, "_blocks", then_full)
    with pytest.raises(DiskFullError, match=r"no room for .* at .*out\.npy"):
        memory.keep(np.ones((1024, 1024)), out / "out.npy")
    assert seen_half_way == [False] and os.listdir(out) == []


def test_an_array_made_at_a_path_is_a_whole_npy_from_the_start_and_stays(out):
    path = out / "features.npy"
    code = f"""
        import numpy as np, apsi_memory as memory
        x = memory.array([2048, 256], "float32", path={str(path)!r})
        print(np.load({str(path)!r}).shape, memory.on_disk(x))
        x[:] = 2.0
        memory.free(x)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "(2048, 256) True"  # zeros, but whole, before it was written
    assert np.all(np.load(path) == 2.0) and os.listdir(out) == ["features.npy"]
    with pytest.raises(ArgumentError, match="there already"):
        memory.array([4], path=path)
    assert memory.array([4], path=path, overwrite=True).shape == (4,) and np.load(path).shape == (4,)


@needs_linux
def test_a_forked_child_writes_its_own_copy_of_a_kept_array(on_ssd, out):
    made = memory.array([1024, 1024], "float32", path=out / "made.npy")
    kept = _spilled(1024)
    memory.keep(kept, out / "kept.npy")
    pid = os.fork()
    if pid == 0:  # the child: writes what must never reach the parent's files
        made[:] = 9.0
        kept[:] = 9.0
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert not made.any() and not kept.any()
    assert not np.load(out / "made.npy").any() and not np.load(out / "kept.npy").any()


def test_on_another_filesystem_a_spilled_array_is_written_once_and_stays_on_its_spill_file(on_ssd, out,
                                                                                          monkeypatch):
    x = _spilled(1024)
    x[:] = 4.0
    linked = os.link

    def across(source: str, *args: Any, **kwargs: Any) -> None:
        if source == x.filename:  # the spill file's link into the output folder: what another filesystem refuses
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        linked(source, *args, **kwargs)

    monkeypatch.setattr(os, "link", across)
    memory.keep(x, out / "copy.npy")
    assert (out / "copy.npy").read_bytes() == _as_numpy_saves(x)
    assert os.path.exists(x.filename) and os.listdir(out) == ["copy.npy"]  # no temporary left behind
    x[0, 0] = 1.0  # x is still the spill file's
    assert np.load(out / "copy.npy")[0, 0] == 4.0
