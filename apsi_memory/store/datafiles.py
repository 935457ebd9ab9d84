"""The store's ``data/`` folder: values with a file of their own, read, removed and swept by name, every
operation relative to the folder's descriptor (``data_fd``) and never through a symbolic link."""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DiskFullError
from ..system.fileio import new_file, unlink_quietly, writev_all
from .codec import Seal, _Held, _Tampered, decode, held_mapping, load_mapped, private_map
from .keys import KIND_NPY_MAP, is_data_name
from .records import Entry

# Files no record points to (a writer killed mid-set) are removed at compaction once this old; younger ones may
# belong to a set in progress in another process.
ORPHAN_AGE_S = 60.0


def load(seal: Seal, key: bytes, entry: Entry, data_fd: int) -> tuple[Any, _Held]:
    """The value of a file entry and what the RAM tier keeps; a big array comes back memory-mapped."""
    fd = _open(entry.name, data_fd)
    try:
        if entry.kind == KIND_NPY_MAP:
            held = load_mapped(seal, key, fd, entry)
            return held.value, held
        with os.fdopen(fd, "rb", closefd=False) as f:
            content = f.read()
    finally:
        os.close(fd)
    return decode(seal, key, content, entry)


def _open(name: str, data_fd: int) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=data_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _Tampered("a symbolic link in place of the file") from err
        raise


def covered(held: _Held) -> bool:
    """Whether the file under ``held``'s mapping (if it is one) still covers all of it. One cut short under it (the
    same inode truncated, by another process say) would make reading the mapping past the file's end a SIGBUS
    that kills the process, so every ``get`` checks first: an ``fstat`` of the descriptor the mapping keeps."""
    mapping = held.value.base if held.file is not None else None
    if not isinstance(mapping, mmap.mmap):
        return True
    try:
        return mapping.size() >= len(mapping)
    except (OSError, ValueError):  # closed or unreadable: not known to be safe
        return False


def writable(held: _Held, data_fd: int) -> np.ndarray:
    """A writable array of ``held``'s (a mapped or small array the RAM tier keeps) that the store's copy never
    sees written: a copy-on-write map of a mapped array's file (no copy until a page is written), else a copy. A
    file removed or replaced since (another process evicted it) gives a copy of the mapping still held."""
    if held.file is not None:
        try:
            fd = _open(held.name, data_fd)
        except (OSError, _Tampered):
            pass
        else:
            try:
                mapped = private_map(held, fd)
            except OSError:
                mapped = None
            finally:
                os.close(fd)
            if mapped is not None:
                return mapped
    copy: np.ndarray = held.value.copy()
    return copy


def write_mapped(name: str, data_fd: int, parts: tuple[bytes | memoryview, ...], size: int,
                 full: Callable[[], DiskFullError]) -> _Held | None:
    """Write a new ``.npy`` file of ``size`` bytes (header first, signature last) and return its array mapped from
    it, as the RAM tier keeps it: the page cache's copy, not a second one. ``None`` if it cannot be mapped (the
    file is written all the same); on a failed write nothing is left behind."""
    with new_file(name, full, data_fd, os.O_RDWR) as fd:
        writev_all(fd, parts)
    try:
        return held_mapping(fd, size, bytes(parts[0]), name)
    except OSError:
        return None
    finally:
        os.close(fd)


def unlink(entries: list[Entry], data_fd: int) -> None:
    """Remove the files of entries no record points to any more (inline ones go at the next compaction)."""
    for entry in entries:
        if not entry.inline:
            unlink_quietly(entry.name, data_fd)


def sweep_orphans(live: set[str], data_fd: int) -> None:
    """Files that no record names (not in ``live``), once old enough not to be a set in progress. Only names a
    writer makes are touched, and one another process removes meanwhile is simply gone."""
    old_before = time.time() - ORPHAN_AGE_S
    with os.scandir(data_fd) as files:
        for f in files:
            if f.name in live or not is_data_name(f.name):
                continue
            try:
                if f.stat(follow_symlinks=False).st_mtime < old_before:
                    unlink_quietly(f.name, data_fd)
            except FileNotFoundError:
                pass
