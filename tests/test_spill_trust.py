"""Issue 9 item 2 and the spill folder's trust: ``free()`` works on the file it made, never through a path someone
swapped (a symbolic link or another file in its place), and a spill folder others can write is refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from apsi_memory import spill
from apsi_memory.errors import UnsafePathError
from apsi_memory.units import MiB

FLOAT64 = np.dtype("float64")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    spill_dir = tmp_path / "spill"
    monkeypatch.setenv("APSI_SPILL_DIR", str(spill_dir))
    return spill_dir


@pytest.mark.parametrize("swap", ["symlink", "another file"])
def test_free_never_truncates_or_unlinks_what_was_swapped_in(folder, tmp_path, swap):
    """Before the fix ``release`` called ``os.truncate(path, 0)``, which follows a symbolic link: the target of
    a link another user put in place of our spill file lost its contents."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"theirs" * 1000)
    x = spill.create((2, MiB // 8), FLOAT64)
    x[:] = 1.0
    path = Path(x.filename)
    path.unlink()
    if swap == "symlink":
        path.symlink_to(victim)
    else:
        path.write_bytes(b"a file someone else put here")
    spill.release(str(path), x.ctypes.data - x.offset, len(x._mmap))
    assert victim.read_bytes() == b"theirs" * 1000, "files touched outside: 0"
    assert os.path.lexists(path), "only what we created is unlinked"


def test_free_still_truncates_and_removes_our_own_file(folder):
    x = spill.create((2, MiB // 8), FLOAT64)
    path = x.filename
    handle = os.open(path, os.O_RDONLY)  # keeps the inode alive to look at after the unlink
    try:
        spill.release(path, x.ctypes.data - x.offset, len(x._mmap))
        assert os.fstat(handle).st_size == 0 and not os.path.exists(path)
    finally:
        os.close(handle)


def test_a_spill_folder_others_can_write_is_refused(folder):
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o777)
    with pytest.raises(UnsafePathError, match=f"{folder} is writable by others.*chmod go-w {folder}"):
        spill.create((4,), FLOAT64)
    assert os.listdir(folder) == []
