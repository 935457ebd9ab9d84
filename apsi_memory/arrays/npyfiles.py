"""``.npy`` files at a path the user names, made so a reader sees no file or a whole one (``keeping``).

Every file starts under a temporary name in the target folder, named like a spill file (``apsi-<pid>-…npy``: a
forked child then copies its mapping on write, as it does a spill file's, ``forking``) and created ``O_EXCL``,
0600, without following a link (``fileio``). Only once it is a whole ``.npy`` (written and ``fsync``-ed, or
reserved and headed for a new array) does it get its name: ``link`` (which fails if the name exists: the check and
the creation are one step) or, with ``overwrite``, ``rename`` over the old file. Neither follows a symbolic link
at the path; one there is refused, and so is a folder. The temporary name is removed and the folder ``fsync``-ed.
The folder must exist (nothing is created for the user) and pass ``trust.check_above`` (it and every folder
above it root's or this user's, writable by nobody else unless sticky, like ``/tmp``): someone who could rename
entries there could swap the result. All of it runs relative to one descriptor of the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..adapters.disk import disk_free
from ..errors import ArgumentError, ArgumentTypeError, DiskFullError, MissingFileError
from ..system import libc, trust
from ..system.fileio import new_file, npy_header, unlink_quietly, write_all
from ..units import fmt_size
from . import spill

_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 64 << 20  # a view that is not contiguous is written in row blocks of about this size (one copy each)


def target(path: str | os.PathLike[str]) -> str:
    """The absolute path asked for; ``ArgumentError`` for one that names a folder (``out/``), ``ArgumentTypeError``
    for one that is no path."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ArgumentTypeError(f"path {path!r} must be a str or os.PathLike of one, not {type(path).__name__}")
    if not text or text.endswith(os.sep):
        raise ArgumentError(f"path {text!r} names a folder; give the .npy file's path, e.g. 'out/result.npy'")
    return os.path.abspath(text)


@contextlib.contextmanager
def folder_of(path: str) -> Iterator[int]:
    """A descriptor of ``path``'s folder, checked (see the module docstring), closed after the block."""
    folder = os.path.dirname(path)
    trust.check_above(path)
    try:
        fd = os.open(folder, _FOLDER)
    except (FileNotFoundError, NotADirectoryError):
        raise MissingFileError(errno.ENOENT, f"cannot keep an array at {path}: its folder {folder} does not exist "
                                             "(apsi_memory creates no folder for an output; make it first)",
                               folder) from None
    try:
        yield fd
    finally:
        os.close(fd)


def refuse_taken(folder_fd: int, path: str, overwrite: bool) -> None:
    """An error unless ``path`` is free, or (with ``overwrite``) a regular file; never follows a link there."""
    try:
        st = os.lstat(os.path.basename(path), dir_fd=folder_fd)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise trust.untrusted(path, "is a symbolic link (apsi_memory never writes through one)")
    if not stat.S_ISREG(st.st_mode):
        raise ArgumentError(f"cannot keep an array at {path}: a folder or other non-file is there")
    if not overwrite:
        raise _exists(path)


def _exists(path: str) -> ArgumentError:
    return ArgumentError(f"cannot keep an array at {path}: a file is there already (pass overwrite=True to "
                         "replace it)")


def temp_name() -> str:
    return spill.new_file_name()


def publish(folder_fd: int, temp: str, path: str, overwrite: bool) -> None:
    """Give the whole file ``temp`` (in the folder) its name ``path``; ``temp`` is gone afterwards."""
    name = os.path.basename(path)
    try:
        refuse_taken(folder_fd, path, overwrite)
        if overwrite:
            os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        else:
            try:
                os.link(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
            except FileExistsError:
                raise _exists(path) from None
    finally:
        unlink_quietly(temp, folder_fd)
    os.fsync(folder_fd)


def link_in(source: str, folder_fd: int, path: str, overwrite: bool) -> bool:
    """Give the file at ``source`` (whole and ``fsync``-ed) the name ``path`` too, without copying it; ``False``
    where that cannot be done (another filesystem, one without hard links): nothing changed then."""
    temp = temp_name()
    try:
        os.link(source, temp, dst_dir_fd=folder_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP):
            return False
        raise
    publish(folder_fd, temp, path, overwrite)
    return True


def _full(path: str, needed: int) -> Callable[[], DiskFullError]:
    folder = os.path.dirname(path)
    return lambda: DiskFullError(errno.ENOSPC, f"no room for {fmt_size(needed)} at {path}: "
                                               f"{fmt_size(disk_free(folder))} free in {folder}")


def write_once(x: np.ndarray, folder_fd: int, path: str, overwrite: bool) -> None:
    """``x`` as a new ``.npy`` at ``path`` (C order, as ``numpy.save`` writes it), written once, then published."""
    refuse_taken(folder_fd, path, overwrite)  # before writing gigabytes for nothing
    header = npy_header(x.dtype, x.shape)
    temp = temp_name()
    with new_file(temp, _full(path, len(header) + x.nbytes), dir_fd=folder_fd) as fd:
        write_all(fd, header)
        for block in _blocks(x):
            write_all(fd, block)
        os.fsync(fd)
    os.close(fd)
    publish(folder_fd, temp, path, overwrite)


def _blocks(x: np.ndarray) -> Iterator[memoryview]:
    """``x``'s bytes in C order: itself when contiguous, else copies of row blocks."""
    if x.flags.c_contiguous:
        yield x.reshape(-1).view(np.uint8).data
        return
    rows = max(1, _CHUNK // max(1, x[0].nbytes))
    for start in range(0, len(x), rows):
        yield np.ascontiguousarray(x[start:start + rows]).reshape(-1).view(np.uint8).data


class Pending:
    """A new ``.npy`` at ``path``, checked now and named last: ``array`` makes it, zero-filled and its space reserved,
    under a temporary name in the folder (``map(out=)`` fills it block by block, its workers by that name);
    ``publish`` gives it its name once it is whole, ``abandon`` removes it. The folder is checked once and used
    through one descriptor until then."""

    def __init__(self, path: str | os.PathLike[str], overwrite: bool) -> None:
        self.path, self.overwrite = target(path), overwrite
        self._folder = contextlib.ExitStack()
        self.folder_fd = self._folder.enter_context(folder_of(self.path))
        self.temp: str | None = None
        self._fd: int | None = None
        try:
            refuse_taken(self.folder_fd, self.path, overwrite)  # now, not after hours of blocks
        except BaseException:
            self._folder.close()
            raise

    def array(self, shape: tuple[int, ...], dtype: np.dtype[Any], nbytes: int) -> np.ndarray:
        """The file's array: a ``numpy.memmap`` (a plain zero-size array for an empty one: nothing to map)."""
        spill.set_up()  # the fork hook: a child's writes must not reach this file (see the module docstring)
        header = npy_header(dtype, shape)
        self.temp = temp_name()
        with new_file(self.temp, _full(self.path, len(header) + nbytes), dir_fd=self.folder_fd,
                      flags=os.O_RDWR) as fd:
            if not libc.posix_fallocate(fd, 0, len(header) + nbytes):
                os.ftruncate(fd, len(header) + nbytes)
            write_all(fd, header)
        self._fd = fd
        if nbytes == 0:
            return np.zeros(shape, dtype)
        where = os.path.join(os.path.dirname(self.path), self.temp)
        with open(where, "r+b", opener=lambda _path, _flags: os.dup(fd)) as f:  # ours, not the path again
            return np.memmap(f, dtype=dtype, mode="r+", offset=len(header), shape=shape)

    def publish(self, x: np.ndarray) -> None:
        """``x`` (this file's array) written and ``fsync``-ed, then the file named ``path``; ``x.filename`` too."""
        try:
            if isinstance(x, np.memmap):
                x.flush()
            assert self._fd is not None and self.temp is not None, "publish before array"
            os.fsync(self._fd)
            publish(self.folder_fd, self.temp, self.path, self.overwrite)
            if isinstance(x, np.memmap):
                x.filename = self.path
        except BaseException:
            self.abandon()
            raise
        self._close()

    def abandon(self) -> None:
        """Nothing is published: the temporary file goes (``publish`` removes it itself if naming fails)."""
        if self.temp is not None:
            unlink_quietly(self.temp, self.folder_fd)
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._folder.close()
