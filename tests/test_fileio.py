"""fileio: new files are removed when filling them fails, a full disk is the caller's DiskFullError, and the one
``.npy`` header writer writes what numpy reads."""

from __future__ import annotations

import errno
import io
import os
import stat

import numpy as np
import numpy.lib.format as npformat
import pytest

from apsi_memory.errors import DiskFullError
from apsi_memory.system import fileio


def full() -> DiskFullError:
    return DiskFullError(errno.ENOSPC, "no room here")


def test_a_new_file_is_private_and_never_replaces_one(tmp_path):
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        fileio.write_new("a", folder, (b"one", memoryview(b"two")), full)
        assert (tmp_path / "a").read_bytes() == b"onetwo"
        assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
        with pytest.raises(FileExistsError):
            fileio.write_new("a", folder, (b"three",), full)
    finally:
        os.close(folder)
    assert (tmp_path / "a").read_bytes() == b"onetwo"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_filling_leaves_no_file_and_raises_the_callers_error(tmp_path, code):
    with pytest.raises(DiskFullError, match="no room here") as caught, fileio.new_file(str(tmp_path / "b"), full):
        raise OSError(code, os.strerror(code))
    assert isinstance(caught.value.__cause__, OSError)
    assert list(tmp_path.iterdir()) == []


def test_any_other_failure_leaves_no_file_and_is_raised_as_it_was(tmp_path):
    with pytest.raises(KeyboardInterrupt), fileio.new_file(str(tmp_path / "c"), full):
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape", [(3, 4), (np.int64(12_347),), ()])
def test_npy_headers_read_back_with_numpy(shape):
    header = fileio.npy_header(np.dtype("<f8"), shape)
    stream = io.BytesIO(header)
    npformat.read_magic(stream)
    assert npformat.read_array_header_1_0(stream) == (tuple(map(int, shape)), False, np.dtype("<f8"))
    assert len(header) % 64 == 0  # aligned, as numpy.save writes it
