"""The C library calls apsi makes beyond plain file I/O, each in one place (``posix_fadvise`` and
``posix_fallocate`` through ``os``, the rest through ``ctypes``).

Theory of operation
-------------------
The C library the interpreter already runs on (``ctypes.CDLL(None)``) is loaded on the first call that needs it,
never at import, and each function is looked up and given its prototype once. Every call has a "not available
here" answer instead of an exception, because each is an optimisation or a safety net the caller can do without:

* ``madvise``, ``fadvise``, ``sync_file_range``: ``False`` where not available or refused (advice is a hint: a
  refusal costs memory, never correctness);
* ``mincore``: ``None`` where not available or the kernel will not say;
* ``cachestat``: ``None`` where not available or refused (a kernel before 6.5, a seccomp filter), and then it is
  not asked again;
* ``malloc_trim``: ``None`` where the C library has none (musl, macOS);
* ``posix_fallocate`` (also past the end, ``keep_size``): ``False`` where the platform or filesystem cannot
  (EINVAL, EOPNOTSUPP); any other failure, such as a full disk, raises its ``OSError``;
* ``punch_hole``: ``False`` where not available or the filesystem cannot;
* ``map_anonymous_fixed``: ``False`` where not available; a failure raises ``SystemCallError`` (an ``OSError``)
  naming the range.

The flags and structures used (``MAP_FIXED``, ``SYNC_FILE_RANGE_*``, ``cachestat``'s syscall number) are
Linux's, so those calls are offered on Linux only; ``malloc_trim`` wherever the C library has it (glibc).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import sys
from typing import Any

import numpy as np

from ..errors import SystemCallError

_MAP_FIXED = 0x10  # the same value on every Linux architecture
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2  # <linux/falloc.h>
_SYNC_WAIT_BEFORE, _SYNC_WRITE, _SYNC_WAIT_AFTER = 1, 2, 4  # <fcntl.h> SYNC_FILE_RANGE_*
_SYS_CACHESTAT = 451  # the same number on every architecture that has it (Linux 6.5)
_LINUX = sys.platform.startswith("linux")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The C library this interpreter uses, or ``None`` where there is none to load (Windows)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError):
        return None


@functools.cache
def _function(name: str, restype: Any, *argtypes: Any) -> Any:
    """``name`` from the C library with its prototype (a fresh function object: no one else's prototype
    changes; no ``argtypes`` means variadic), or ``None`` where the library lacks it."""
    library = _library()
    try:
        function = library[name] if library is not None else None
    except AttributeError:
        return None
    if function is not None:
        function.restype = restype
        if argtypes:
            function.argtypes = list(argtypes)
    return function


def _linux(name: str, restype: Any, *argtypes: Any) -> Any:
    """A function whose flags and meaning are Linux's: ``None`` elsewhere."""
    return _function(name, restype, *argtypes) if _LINUX else None


def page_calls_available() -> bool:
    """Whether ``madvise`` and ``mincore`` on file mappings can be asked here (Linux)."""
    return hasattr(mmap, "MADV_DONTNEED") and _madvise() is not None and _mincore() is not None


# -- advice: a kernel that refuses it costs memory, never correctness, so a refusal is not an error ------------

def _madvise() -> Any:
    return _linux("madvise", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def madvise(address: int, length: int, advice: int) -> bool:
    """``madvise(address, length, advice)``; whether the kernel took the advice."""
    function = _madvise()
    return function is not None and function(address, length, advice) == 0


def fadvise(fd: int, offset: int, length: int, advice: int) -> bool:
    """``posix_fadvise`` on a file range; whether the kernel took the advice."""
    if not hasattr(os, "posix_fadvise"):
        return False
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, advice)
        return True
    return False


def sync_file_range(fd: int, offset: int, length: int) -> bool:
    """Wait until ``[offset, offset + length)`` of the file is on the disk (written out, and earlier writes of
    the range finished); ``False`` where that cannot be asked or the kernel refused."""
    function = _linux("sync_file_range", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_uint)
    return function is not None and function(fd, offset, length,
                                             _SYNC_WAIT_BEFORE | _SYNC_WRITE | _SYNC_WAIT_AFTER) == 0


# -- what is resident --------------------------------------------------------------------------------------------

def _mincore() -> Any:
    return _linux("mincore", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def mincore(address: int, length: int) -> np.ndarray | None:
    """Which pages of ``[address, address + length)`` (``address`` page-aligned) are resident, one bool per page;
    ``None`` where the kernel cannot be asked or will not say (the caller picks its safe side)."""
    function = _mincore()
    if function is None:
        return None
    states = np.zeros(max(0, -(-length // mmap.PAGESIZE)), dtype=np.uint8)
    if length > 0 and function(address, length, states.ctypes.data) != 0:
        return None
    return (states & 1).astype(bool)


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_cachestat_works = True


def cachestat(fd: int, offset: int, length: int) -> int | None:
    """How many pages of the file range are in the page cache (``cachestat``), or ``None`` where the kernel (or
    a seccomp filter) does not offer it; then it is not asked again in this process."""
    global _cachestat_works
    function = _linux("syscall", ctypes.c_long) if _cachestat_works else None
    if function is None:
        return None
    stat, asked = _CacheStat(), _CacheStatRange(offset, length)
    if function(ctypes.c_long(_SYS_CACHESTAT), ctypes.c_long(fd), ctypes.byref(asked), ctypes.byref(stat),
                ctypes.c_long(0)):
        _cachestat_works = False
        return None
    return int(stat.nr_cache)


# -- memory and files --------------------------------------------------------------------------------------------

def malloc_trim(pad: int = 0) -> int | None:
    """glibc's ``malloc_trim(pad)``: freed heap pages go back to the kernel. Its result (1 if memory was
    released), or ``None`` where the C library has no such call (musl, macOS, Windows)."""
    function = _function("malloc_trim", ctypes.c_int, ctypes.c_size_t)
    return None if function is None else int(function(pad))


def posix_fallocate(fd: int, offset: int, length: int, keep_size: bool = False) -> bool:
    """Reserve the file's blocks for ``[offset, offset + length)``; with ``keep_size``, without changing the file's
    size (Linux's ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``: room kept past the end for later appends). ``False``
    where this platform or filesystem cannot (no such call, EINVAL, EOPNOTSUPP): the caller then only extends the
    file. Any other failure (a full disk: ENOSPC, EDQUOT) raises the ``OSError``."""
    try:
        if keep_size:
            return _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length, "reserve")
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, offset, length)
        else:
            return False
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return False
    return True


def _fallocate(fd: int, mode: int, offset: int, length: int, verb: str) -> bool:
    """Linux's ``fallocate(fd, mode, offset, length)``; ``False`` where there is no such call, ``SystemCallError``
    naming what could not be done (``verb``) when it fails."""
    function = _linux("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if function is None:
        return False
    if function(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise SystemCallError(code, f"could not {verb} {length} bytes at {offset}: {os.strerror(code)}")
    return True


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give the file's blocks of ``[offset, offset + length)`` back to the filesystem, keeping its size: the range
    reads zeros, its pages leave the page cache and every mapping of them, and no memory is asked for. ``False``
    where this platform or filesystem cannot (or the call failed: the blocks then go with the file)."""
    try:
        return _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length, "punch out")
    except OSError:
        return False


def map_anonymous_fixed(address: int, length: int) -> bool:
    """Replace the pages at ``[address, address + length)`` with fresh anonymous zero pages, atomically (``mmap``
    with ``MAP_FIXED``): what was there is released at once and pointers into the range stay valid. ``False``
    where this cannot be done (not Linux, or nothing to replace); ``SystemCallError`` (an ``OSError``) naming
    the range and errno if it failed."""
    function = _linux("mmap", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
    if function is None or length <= 0:
        return False
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED
    if function(address, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) != address:
        error = ctypes.get_errno()
        raise SystemCallError(error, f"could not release {length} bytes at {address:#x}: {os.strerror(error)}")
    return True
