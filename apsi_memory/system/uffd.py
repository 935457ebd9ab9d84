"""Write-protecting a range of our own anonymous memory while it moves (Linux's userfaultfd, write-protect mode), and
the few C calls of a move made without ever letting go of the GIL.

Why the GIL matters
-------------------
A thread that writes to a protected page waits in the kernel until it is woken. A Python thread that writes while
holding the GIL (``x[i] = v``) would then wait holding it, and a move that needed the GIL again before waking it
would never finish. So the steps from protecting a range to waking its writers — protect, copy to the file, map the
file over the range, wake — run as one chain of C calls made from C (``map`` over ``functools.partial`` objects of
functions loaded with ``ctypes.PyDLL``, which keep the GIL): no Python bytecode runs in between, so no other Python
thread can take the GIL and fault. Threads that released the GIL (NumPy's large copies) fault, wait, and continue
on the file mapping once woken.

``available()`` says why write protection cannot be had here (not Linux, a kernel without it, a seccomp filter or
sysctl refusing ``userfaultfd``), or ``None``.

Pages never touched
-------------------
Before Linux 6.4 (``UFFD_FEATURE_WP_UNPOPULATED``) write protection marks only pages that are there: a write to a
page the array never touched would fault in a fresh page unseen, during the copy, and be lost under the file
mapping (Debian 12's 6.1 refused the feature, and nothing moved). There, each piece is first read-populated
(``MADV_POPULATE_READ``, Linux 5.14): its untouched pages map the shared zero page, which takes no memory and which
write protection does mark. A kernel with neither has no write protection here.

Without it, memory may be moved only while no other thread can write to it. Python's thread count misses threads
started with ``_thread`` and native ones (OpenMP, BLAS, a C extension's), so ``other_writers()`` counts the
process's OS threads (``/proc/self/task``), less the calling one and those that declared, with ``quiet()``, that
they write to no memory the library moves (the library's own watcher and mover threads, while they wait or move).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import operator
import os
import platform
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import SystemCallError
from .libc import madvise

_SYSCALL = {"x86_64": 323, "aarch64": 282}.get(platform.machine())
_USER_MODE_ONLY = 1  # UFFD_USER_MODE_ONLY: kernel-mode faults are not ours (allowed without privilege)
_API = 0xAA
_FEATURE_WP = 1 << 0  # UFFD_FEATURE_PAGEFAULT_FLAG_WP
_FEATURE_WP_UNPOPULATED = 1 << 13  # pages never touched are protected too (Linux 6.4)
_MADV_POPULATE_READ = 22  # Linux 5.14: map what is not there, read-only (the zero page for anonymous memory)
_REGISTER_MODE_WP = 2
_WRITEPROTECT_MODE_WP = 1
# _IOWR/_IOR(0xAA, nr, struct): the sizes are those of uffdio_api (24), uffdio_register (32), uffdio_range (16),
# uffdio_writeprotect (24)
_UFFDIO_API, _UFFDIO_REGISTER, _UFFDIO_WAKE, _UFFDIO_WRITEPROTECT = 0xC018AA3F, 0xC020AA00, 0x8010AA02, 0xC018AA06
_MAP_FIXED = 0x10


_TASKS = "/proc/self/task"
_quiet: dict[int, set[int]] = {}  # by pid (a forked child's threads are new): native ids of the quiet threads


def _tasks() -> set[int] | None:
    try:
        return {int(task) for task in os.listdir(_TASKS) if task.isdigit()}
    except OSError:
        return None


# The threads already there when the library is imported by a lone Python thread are NumPy's BLAS pool (OpenBLAS
# starts it when NumPy is imported): its threads work only inside a BLAS call made by another thread, which counts.
_quiet[os.getpid()] = (_tasks() or set()) - {threading.get_native_id()} if threading.active_count() == 1 else set()


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """For the block, count the calling thread as one that writes to no memory the library moves (``on``), or, with
    ``on=False``, again as one that may (a watcher calling the user's function)."""
    me, ids = threading.get_native_id(), _quiet.setdefault(os.getpid(), set())
    was = me in ids
    (ids.add if on else ids.discard)(me)
    try:
        yield
    finally:
        (ids.add if was else ids.discard)(me)


def other_writers() -> int | None:
    """How many other OS threads of this process may write to memory (not quiet); ``None`` where the threads cannot
    be counted (no ``/proc``): then as if some could."""
    tasks = _tasks()
    if tasks is None:
        return None
    return len(tasks - {threading.get_native_id()} - _quiet.get(os.getpid(), set()))


class _Range(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Api(ctypes.Structure):
    _fields_ = [("api", ctypes.c_uint64), ("features", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _Register(ctypes.Structure):
    _fields_ = [("range", _Range), ("mode", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _Protect(ctypes.Structure):
    _fields_ = [("range", _Range), ("mode", ctypes.c_uint64)]


@functools.cache
def _calls() -> dict[str, Any] | None:
    """``ioctl``, ``pwrite``, ``mmap`` and ``syscall`` of the C library, called with the GIL held."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        library = ctypes.PyDLL(None, use_errno=True)
    except OSError:
        return None
    prototypes = {"ioctl": (ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p),
                  "pwrite": (ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64),
                  "mmap": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int64),
                  "syscall": (ctypes.c_long,)}
    calls = {}
    for name, (restype, *argtypes) in prototypes.items():
        function = library[name]
        function.restype = restype
        if argtypes:
            function.argtypes = argtypes
        calls[name] = function
    return calls


def _open(user_mode_only: bool, features: int) -> int:
    """A new userfaultfd descriptor with write protection and ``features`` enabled, or ``-errno``."""
    calls = _calls()
    if calls is None or _SYSCALL is None:
        return -errno.ENOSYS
    flags = os.O_CLOEXEC | os.O_NONBLOCK | (_USER_MODE_ONLY if user_mode_only else 0)
    fd = int(calls["syscall"](ctypes.c_long(_SYSCALL), ctypes.c_long(flags)))
    if fd < 0:
        return -ctypes.get_errno()
    api = _Api(_API, _FEATURE_WP | features, 0)
    if calls["ioctl"](fd, _UFFDIO_API, ctypes.byref(api)) != 0:
        code = ctypes.get_errno()
        os.close(fd)
        return -code
    return fd


# The features asked for, best first: untouched pages protected by the kernel, else by populating each piece first.
WANTED = (_FEATURE_WP_UNPOPULATED, 0)


def _new() -> tuple[int, bool, str | None]:
    """A descriptor, whether its pieces must be populated first, or -1 and why not. Kernel-mode faults too where we
    may (a ``read()`` into the array waits like a store does); else user-mode only, where such a ``read()`` fails
    with EFAULT during the move."""
    fd = -errno.ENOSYS
    for features in WANTED:
        if features == 0 and not _can_populate():
            break
        for user_mode_only in (False, True):
            fd = _open(user_mode_only, features)
            if fd >= 0:
                return fd, features == 0, None
    return -1, False, f"userfaultfd write protection is not available here ({os.strerror(-fd)})"


@functools.cache
def _can_populate() -> bool:
    """Whether this kernel takes ``MADV_POPULATE_READ`` (Linux 5.14), tried on a page of our own."""
    with mmap.mmap(-1, mmap.PAGESIZE) as page:
        try:
            page.madvise(_MADV_POPULATE_READ)
        except OSError:  # EINVAL: an older kernel
            return False
        return True


@functools.cache
def available() -> str | None:
    """``None`` where write protection works; else why not (asked once per process)."""
    fd, _, why = _new()
    if fd >= 0:
        os.close(fd)
    return why


def _check(result: int, what: str, length: int, address: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise SystemCallError(code, f"could not {what} {length} bytes at {address:#x}: {os.strerror(code)}")


def page_up(n: int) -> int:
    """``n`` rounded up to whole pages."""
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


class Guard:
    """A registered range of anonymous memory (``address`` page-aligned) whose pieces move one call at a time."""

    def __init__(self, address: int, length: int) -> None:
        fd, self.populate, why = _new()
        if fd < 0:
            raise SystemCallError(errno.ENOSYS, why or "userfaultfd")
        self.fd = fd
        calls = _calls()
        assert calls is not None
        self._calls = calls
        register = _Register(_Range(address, page_up(length)), _REGISTER_MODE_WP, 0)
        try:
            _check(calls["ioctl"](fd, _UFFDIO_REGISTER, ctypes.byref(register)), "register", length, address)
        except OSError:
            os.close(fd)
            raise

    def move(self, address: int, length: int, fd: int, offset: int) -> None:
        """Protect ``[address, address + length)``, copy it to ``fd`` at ``offset``, map that part of the file over
        it (shared, fixed) and wake the writers that waited: one chain of C calls with the GIL held throughout
        (see the module docstring). Raises ``SystemCallError`` if the copy or the mapping failed; the writers are
        woken either way."""
        ioctl, pages = self._calls["ioctl"], page_up(length)
        # Before the protection (see the module docstring); a page a writer faults in meanwhile is there, and marked.
        if self.populate and not madvise(address, pages, _MADV_POPULATE_READ):
            raise SystemCallError(ctypes.get_errno() or errno.EINVAL, f"could not populate {length} bytes at "
                                  f"{address:#x} before protecting them")
        protect, wake = _Protect(_Range(address, pages), _WRITEPROTECT_MODE_WP), _Range(address, pages)
        flags = mmap.MAP_SHARED | _MAP_FIXED
        chain = (functools.partial(ioctl, self.fd, _UFFDIO_WRITEPROTECT, ctypes.byref(protect)),
                 functools.partial(self._calls["pwrite"], fd, address, length, offset),
                 functools.partial(self._calls["mmap"], address, pages, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd,
                                   offset),
                 functools.partial(ioctl, self.fd, _UFFDIO_WAKE, ctypes.byref(wake)))
        results = list(map(operator.methodcaller("__call__"), chain))  # from C: no bytecode between the calls
        _check(results[0], "write-protect", length, address)
        _check(0 if results[1] == length else -1, "copy", length, address)
        _check(0 if results[2] == address else -1, "map the spill file over", length, address)

    def close(self) -> None:
        """Ends the protection: ranges still registered (none once every piece moved) become plain memory."""
        os.close(self.fd)


def copy_and_map(address: int, length: int, fd: int, offset: int) -> None:
    """``Guard.move`` without protection: for a range no other thread can write to."""
    calls = _calls()
    if calls is None:
        raise SystemCallError(errno.ENOSYS, "moving memory needs Linux")
    _check(0 if calls["pwrite"](fd, address, length, offset) == length else -1, "copy", length, address)
    flags = mmap.MAP_SHARED | _MAP_FIXED
    result = calls["mmap"](address, page_up(length), mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, offset)
    _check(0 if result == address else -1, "map the spill file over", length, address)


# -- a fork child's own copy (``arrays.forking``) --------------------------------------------------------------------

_MAP_NORESERVE = 0x4000  # the same value on x86_64 and aarch64


def map_private(address: int, length: int, fd: int, offset: int, writable: bool) -> None:
    """Map ``fd`` from ``offset`` over the page-aligned range copy-on-write (``MAP_PRIVATE | MAP_FIXED``): a fork
    child's own copy of a shared spill mapping. ``MAP_NORESERVE``: no memory is charged up front for pages never
    written (else the copy of an array bigger than RAM + swap would be refused). Raises ``SystemCallError``."""
    calls = _calls()
    if calls is None:
        raise SystemCallError(errno.ENOSYS, "a private copy of a mapping needs Linux")
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    result = calls["mmap"](address, length, prot, mmap.MAP_PRIVATE | _MAP_FIXED | _MAP_NORESERVE, fd, offset)
    _check(0 if result == address else -1, "map a private copy of a spill file over", length, address)


def protect_read_only(address: int, length: int) -> bool:
    """Make the page-aligned range read-only (``mprotect``): where no private copy could be made, a child's write
    then crashes it instead of reaching its parent. Whether that worked."""
    calls = _calls()
    if calls is None:
        return False
    mprotect = calls.setdefault("mprotect", ctypes.PyDLL(None, use_errno=True)["mprotect"])
    mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return int(mprotect(address, length, mmap.PROT_READ)) == 0
