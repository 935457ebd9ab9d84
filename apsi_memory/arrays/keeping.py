"""``memory.keep(x, path)``: an array's result as a ``.npy`` file that stays, written at most once.

A spilled (or moved) array already is a ``.npy`` on the SSD: a spill file is a header and the raw data (``spill``).
So keeping one, whole, on the filesystem of its spill file writes no data: the file is ``fsync``-ed, linked in
at ``path`` and its spill name removed. It is then the kept file, the same inode the array maps: ``x`` keeps
working on it (later writes reach the file, which the kernel writes back in its own time), and neither ``free``,
the garbage collector nor the exit deletes it. A moved array's file ends at a page boundary; it is cut to the
header (padded to a page with spaces, which ``numpy.load`` skips) and data first.

Everything else is written once, as ``numpy.save`` would write ``x`` as it is now, then ``fsync``-ed and
published: an array in RAM, a spilled one on another filesystem, a view that is not the whole array (a slice, a
transpose: C order), a NumPy array of the caller's. ``x`` itself is left where it was; later writes to it do not
reach the file.

Either way a reader of ``path`` sees no file or a whole ``.npy``, never a torn one (``npyfiles``). Refused: a
freed array (it reads zeros), a partly moved one (half RAM, half file: keep it once the move has finished), a
file at ``path`` unless ``overwrite=True`` (never a symbolic link or a folder there), a folder that does not
exist or that others could write to.
"""

from __future__ import annotations

import os

import numpy as np

from ..decide import Place
from ..errors import ArgumentError, ArgumentTypeError
from ..units import fmt_size
from . import moving, npyfiles, placement, spill

KEPT = "kept at its path: apsi_memory never deletes it"  # report()'s note


def keep(x: np.ndarray, path: str | os.PathLike[str], overwrite: bool = False) -> str:
    """Keep ``x`` as a ``.npy`` file at ``path`` that outlives the process; returns the file's absolute path.

    A whole spilled array on the same filesystem becomes that file without a byte written (``x`` is then backed by
    it, and later writes to ``x`` reach the file); anything else is written once, as ``numpy.save`` would write
    ``x`` as it is now (``x`` stays where it was). Either way a reader of ``path`` sees no file or a whole
    ``.npy``, never a torn one, and ``free``, the garbage collector and the exit leave the file alone.

    Refused (``ArgumentError`` unless said): a freed array, a partly moved one (keep it once the move has finished),
    a file already at ``path`` unless ``overwrite=True``, a symbolic link (``UnsafePathError``) or a folder there,
    a folder that does not exist (``MissingFileError``) or that other users could write to (``UnsafePathError``)."""
    if not isinstance(x, np.ndarray):
        raise ArgumentTypeError(f"memory.keep takes a NumPy array, not {type(x).__name__}")
    where = npyfiles.target(path)
    with npyfiles.folder_of(where) as folder_fd:
        with moving.lock:  # no move or free of x half way through
            entry = placement.entry_of(x)
            if entry is not None:
                _refuse(entry, where)
                if entry.path == where and _whole(x, entry.array()):
                    return where  # kept there already: writing it again would leave x on the old file
            linked = entry is not None and _in_place(entry, x, folder_fd, where, overwrite)
        if not linked:  # outside the lock: a move under pressure must not wait for gigabytes to be written
            npyfiles.write_once(x, folder_fd, where, overwrite)
    return where


def _refuse(entry: placement.Entry, where: str) -> None:
    if entry.freed:
        raise ArgumentError(f"cannot keep a freed memory.array at {where}: it reads zeros since memory.free; "
                            "keep it before freeing it")
    if 0 < entry.moved < entry.length:
        raise ArgumentError(f"cannot keep a partly moved memory.array at {where}: {fmt_size(entry.moved)} of "
                            f"{fmt_size(entry.length)} are on a spill file, the rest in RAM; keep it once a later "
                            "move has finished, or keep a copy (np.array(x))")


def _in_place(entry: placement.Entry, x: np.ndarray, folder_fd: int, where: str, overwrite: bool) -> bool:
    """Make ``entry``'s spill file the kept file, if ``x`` is all of it and the link can be made; whether it was."""
    owner = entry.array()
    if entry.place is not Place.SSD or entry.path is None or not _whole(x, owner):
        return False
    found = spill.identity(entry.path)  # None: kept already, or a fork child's view of its parent's file
    if found is None:
        return False
    device, inode, size, offset = found
    fd = os.open(entry.path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (device, inode):
            return False
        npyfiles.refuse_taken(folder_fd, where, overwrite)  # before the fsync, which may write gigabytes
        if size > offset + entry.nbytes:  # a moved array's file ends at a page
            os.ftruncate(fd, offset + entry.nbytes)
        os.fsync(fd)  # the bytes are on the disk before the file has its name
    finally:
        os.close(fd)
    if not npyfiles.link_in(entry.path, folder_fd, where, overwrite):
        return False
    spill.delete(entry.path)
    entry.path, entry.note = where, KEPT
    return True


def _whole(x: np.ndarray, owner: object) -> bool:
    """``x`` is the array ``memory.array`` returned, or a view of all of it in the same layout."""
    return (isinstance(owner, np.ndarray) and x.ctypes.data == owner.ctypes.data and x.shape == owner.shape
            and x.dtype == owner.dtype and x.flags.c_contiguous)
