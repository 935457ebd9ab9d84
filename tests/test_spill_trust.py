"""Issue 9 item 2 and the spill spill_dir's trust: ``free()`` works on the file it made, never through a path someone
swapped (a symbolic link or another file in its place), and a spill spill_dir others can write is refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from apsi_memory.arrays import spill
from apsi_memory.errors import UnsafePathError
from apsi_memory.units import MiB

FLOAT64 = np.dtype("float64")


@pytest.mark.parametrize("swap", ["symlink", "another file"])
def test_free_never_truncates_or_unlinks_what_was_swapped_in(spill_dir, tmp_path, swap):
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
    spill.release(str(path))
    assert victim.read_bytes() == b"theirs" * 1000, "files touched outside: 0"
    assert os.path.lexists(path), "only what we created is unlinked"


def test_free_still_empties_and_removes_our_own_file(spill_dir):
    x = spill.create((2, MiB // 8), FLOAT64)
    path = x.filename
    handle = os.open(path, os.O_RDONLY)  # keeps the inode alive to look at after the unlink
    try:
        spill.release(path)
        assert os.fstat(handle).st_blocks * 512 <= os.fstatvfs(handle).f_bsize and not os.path.exists(path)
    finally:
        os.close(handle)


def test_a_spill_folder_others_can_write_is_refused(spill_dir):
    spill_dir.mkdir(mode=0o700)
    os.chmod(spill_dir, 0o777)
    with pytest.raises(UnsafePathError, match=f"{spill_dir} is writable by others.*Fix: APSI_SPILL_DIR={spill_dir} points there"):
        spill.create((4,), FLOAT64)
    assert os.listdir(spill_dir) == []
