"""Writing the files the library makes (store values, journals, spill files), the one way.

A new file is created with ``O_EXCL`` (never overwriting anything), mode 0600, without following a symbolic link;
if filling it fails, it is removed, and a full disk (ENOSPC, EDQUOT) becomes the caller's ``DiskFullError``,
which names the folder and the fix. ``.npy`` headers for spill files and store values come from ``npy_header``.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.lib.format as npformat

from ..errors import DiskFullError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NEW = os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in _NO_SPACE


def open_new(name: str, dir_fd: int | None = None, flags: int = os.O_WRONLY) -> int:
    """Create ``name`` (relative to ``dir_fd``), which must not exist yet: 0600, never through a link."""
    return os.open(name, flags | _NEW, 0o600, dir_fd=dir_fd)


@contextmanager
def new_file(name: str, full: Callable[[], DiskFullError], dir_fd: int | None = None,
             flags: int = os.O_WRONLY) -> Iterator[int]:
    """The descriptor of a new file (``open_new``) to fill in the ``with`` block, which the caller closes. If the
    block raises, the file is closed and removed, and a full disk raises ``full()`` instead."""
    fd = open_new(name, dir_fd, flags)
    try:
        yield fd
    except BaseException as err:
        os.close(fd)
        unlink_quietly(name, dir_fd)
        if is_disk_full(err):
            raise full() from err
        raise


def write_new(name: str, dir_fd: int, parts: tuple[bytes | memoryview, ...],
              full: Callable[[], DiskFullError]) -> None:
    """Write a file that must not exist yet, its parts with one ``writev`` (no joined copy); on any failure
    nothing is left behind."""
    with new_file(name, full, dir_fd) as fd:
        writev_all(fd, parts)
    os.close(fd)


def writev_all(fd: int, parts: tuple[bytes | memoryview, ...]) -> None:
    """All of ``parts`` in order, as few ``writev`` calls as the kernel allows (one, unless a write is short)."""
    views = [memoryview(part) for part in parts if len(part)]
    while views:
        written = os.writev(fd, views)
        while views and written >= views[0].nbytes:
            written -= views.pop(0).nbytes
        if views:
            views[0] = views[0][written:]


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pwrite_all(fd: int, data: bytes, at: int, full: Callable[[], DiskFullError]) -> None:
    """``data`` at offset ``at``, whole; a full disk (or a short write, which is one) raises ``full()``."""
    try:
        written = os.pwrite(fd, data, at)
    except OSError as err:
        if is_disk_full(err):
            raise full() from err
        raise
    if written != len(data):
        raise full()


def unlink_quietly(name: str, dir_fd: int | None = None) -> None:
    """Remove ``name``; one that is gone already (removed by another process) is fine."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header (C order) of an array: format 1.0, or 2.0 for a header over 64 KiB (a dtype with very
    many fields), as ``numpy.save`` writes it."""
    # Plain ints: a NumPy integer is equal to one (the same cache entry) but would be written as ``np.int64(4)``.
    return _npy_header(dtype, tuple(map(int, shape)))


@lru_cache(maxsize=1024)
def _npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """Cached on the dtype: ``descr`` is a list for structured ones."""
    info = {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    out = io.BytesIO()
    try:
        npformat.write_array_header_1_0(out, info)
    except ValueError:
        out = io.BytesIO()
        npformat.write_array_header_2_0(out, info)
    return out.getvalue()
