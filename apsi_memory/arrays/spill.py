"""Spill files: the SSD side of ``memory.array``.

A spill file is a ``.npy`` file (header + raw data, so ``numpy.load`` can read one while it exists) in
``APSI_SPILL_DIR`` or ``~/.apsi/spill`` (created 0700; files 0600), named ``apsi-<pid>-<start>-<random>.npy``:
the owner's process id and its start time (clock ticks since boot, from ``/proc/<pid>/stat``), so a recycled pid
is not mistaken for the owner.

Lifetime: deleted when the array is freed, when it is garbage-collected, and at exit (``atexit``, registered with
the first spill). A process that was SIGKILLed runs none of that; the next process to spill into the folder
reclaims its files then (importing the library does nothing), deleting only files whose owner is dead.

Forks: a child gets its own copy-on-write copy of every spill file mapping (``forking``, from the fork hook the
first spill registers), and never deletes or truncates its parent's files (``made_here``).

Space: the whole file is reserved with ``posix_fallocate`` before it is mapped. A sparse file would fail later,
on the first write to a page the full disk cannot hold, with SIGBUS — a crash; reserving up front turns a full disk
into a ``DiskFullError`` at creation, naming the folder and its free space, and the half-made file is removed.

Freeing while views exist: unmapping memory that a view still points at would crash the interpreter on the next
touch, and replacing the mapping with anonymous memory asks the kernel for as much memory as the file is long (an
array bigger than RAM + swap is refused, and under ``vm.overcommit_memory=2`` much less). So ``release`` leaves the
mapping alone and punches the file's blocks out (``fallocate`` with ``FALLOC_FL_PUNCH_HOLE``, keeping its size),
then unlinks it: the blocks are free at once, its pages leave RAM, no memory is asked for whatever the size, and
every view stays valid and reads zeros. A view written after that writes into the deleted file, whose blocks go
when the last view goes. Where a filesystem cannot punch holes, the blocks go then too.

Pickling: an array on a spill file pickles as a reference to it (``sending``); ``identity`` is what the reference
carries, and ``on_first_file`` is how the reducer gets installed with the first spill or move.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import math
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable

import numpy as np

from ..adapters.disk import disk_free
from ..adapters.processes import own_owner, owner_alive
from ..errors import DiskFullError
from ..system import libc, paths
from ..system.fileio import new_file, npy_header, write_all
from ..system.once import once
from ..units import fmt_size
from . import forking

_NAME = re.compile(r"apsi-(\d+)-(\d+)-[0-9a-f]+\.npy")


# -- names (pure) ------------------------------------------------------------------------------------------------

def file_name(pid: int, start: str, token: str) -> str:
    return f"apsi-{pid}-{start}-{token}.npy"


def new_file_name() -> str:
    """A spill file name of this process, with 12 random hex digits (``secrets.token_hex``'s bytes: importing
    ``secrets`` brought ``hmac``, ``base64`` and ``random`` onto a first ``memory.array``'s path)."""
    return file_name(*own_owner(), os.urandom(6).hex())


def owner_of(name: str) -> tuple[int, str] | None:
    """``(pid, start)`` of the process that made spill file ``name``; ``None`` for a file we did not name."""
    match = _NAME.fullmatch(name)
    return (int(match.group(1)), match.group(2)) if match else None


def fits(needed_bytes: int, free_bytes: int) -> bool:
    return needed_bytes <= free_bytes


def made_here(path: str) -> bool:
    """Whether this process made spill file ``path``: a child forked from it inherits the parent's arrays (and
    their finalizers) but must never delete or truncate the parent's files."""
    owner = owner_of(os.path.basename(path))
    return owner is not None and owner[0] == os.getpid()


# -- reclaiming files of dead owners -----------------------------------------------------------------------------

_reclaimed: set[str] = set()
_reclaim_lock = threading.Lock()


def reclaim(directory: str, alive: Callable[[int, str], bool] = owner_alive) -> list[str]:
    """Delete the spill files in ``directory`` whose owner process is dead; returns their paths.

    Files not named by us, files of live processes and other users' files (whose processes this user may not
    even see, e.g. with ``/proc`` mounted ``hidepid``) are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        owner = owner_of(name)
        path = os.path.join(directory, name)
        if owner is None or not _this_users(path) or alive(*owner):
            continue
        with contextlib.suppress(OSError):  # gone already (another process reclaimed it), or not ours to delete
            os.unlink(path)
            removed.append(path)
    return removed


def _this_users(path: str) -> bool:
    """A regular file of ours (``lstat``: a symbolic link someone planted is never followed, nor removed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def reclaim_once(directory: str) -> None:
    """``reclaim`` the first time this process uses ``directory``."""
    with _reclaim_lock:
        if directory in _reclaimed:
            return
        _reclaimed.add(directory)
    reclaim(directory)


# -- creating ----------------------------------------------------------------------------------------------------

_live: dict[str, tuple[int, int, int]] = {}  # path -> (device, inode, data offset) of the file made there
_live_lock = threading.Lock()
on_first_file: list[Callable[[], None]] = []  # run by set_up (placement adds the pickle reducer's set-up)


def create(shape: tuple[int, ...], dtype: np.dtype, directory: str | None = None,
           free_bytes: Callable[[str], int] = disk_free) -> np.memmap:
    """A zero-filled ``numpy.memmap`` backed by a new spill file with all its space reserved.

    Raises ``DiskFullError`` (naming the folder and its free space) when the disk cannot hold it; no file is left."""
    path, fd, offset = reserve(shape, dtype, directory, free_bytes)
    # Mapped through the descriptor we created, never by opening the path again.
    with open(path, "r+b", opener=lambda _path, _flags: fd) as f:
        return np.memmap(f, dtype=dtype, mode="r+", offset=offset, shape=shape)


def reserve(shape: tuple[int, ...], dtype: np.dtype, directory: str | None = None,
            free_bytes: Callable[[str], int] = disk_free, page_aligned: bool = False) -> tuple[str, int, int]:
    """A new spill file with its space reserved: its path, open descriptor and where the data starts. With
    ``page_aligned`` the data starts at a page boundary and the file ends at one, so it can be mapped over memory
    (``moving``); the header is then padded with spaces, which ``numpy.load`` reads as before."""
    set_up()
    directory = paths.private_dir(os.path.abspath(directory or paths.spill_dir()))
    reclaim_once(directory)
    header = npy_header(dtype, shape)
    data = math.prod(shape) * dtype.itemsize
    if page_aligned:
        header, data = padded_header(header, mmap.PAGESIZE), -(-data // mmap.PAGESIZE) * mmap.PAGESIZE
    total = len(header) + data
    free = free_bytes(directory)
    if not fits(total, free):
        raise _disk_full(directory, total, free)
    path = os.path.join(directory, new_file_name())
    fd = _write_reserved(path, header, total, directory, free_bytes)
    st = os.fstat(fd)
    with _live_lock:
        _live[path] = (st.st_dev, st.st_ino, len(header))
    return path, fd, len(header)


def padded_header(header: bytes, multiple: int) -> bytes:
    """An ``.npy`` header padded with spaces before its closing newline to a multiple of ``multiple`` bytes: format
    1.0 (a 2-byte length) while that can count it, else 2.0 (4 bytes)."""
    text = header[10 if header[6] == 1 else 12:-1]  # the dict and its padding, without the newline
    for version, prefix in ((1, 10), (2, 12)):
        size = -(-(prefix + len(text) + 1) // multiple) * multiple
        body = text + b" " * (size - prefix - len(text) - 1) + b"\n"
        if version == 2 or len(body) <= 0xFFFF:
            break
    return b"\x93NUMPY" + bytes([version, 0]) + len(body).to_bytes(prefix - 8, "little") + body


def _write_reserved(path: str, header: bytes, total: int, directory: str,
                    free_bytes: Callable[[str], int]) -> int:
    """The new file, reserved and with its header, still open."""
    with new_file(path, lambda: _disk_full(directory, total, free_bytes(directory)), flags=os.O_RDWR) as fd:
        _reserve(fd, total)
        write_all(fd, header)
    return fd


def _reserve(fd: int, total: int) -> None:
    """Reserve the blocks; where that is impossible (macOS, a filesystem without it) only extend the file — a
    write to it can then still fail later on a full disk."""
    if not libc.posix_fallocate(fd, 0, total):
        os.ftruncate(fd, total)


def _disk_full(directory: str, needed: int, free: int) -> DiskFullError:
    return DiskFullError(
        errno.ENOSPC,
        f"no room for a {fmt_size(needed)} spill file in {directory}: {fmt_size(free)} free there "
        f"(free some space, or set APSI_SPILL_DIR to a bigger disk)")


# -- deleting ----------------------------------------------------------------------------------------------------

def _made(path: str, st: os.stat_result) -> tuple[int, int, int] | None:
    """What this process recorded of the file it created at ``path`` (device, inode, data offset), if ``st`` is
    that very file (same device and inode), not one swapped in; else None."""
    with _live_lock:
        made = _live.get(path)
    return made if made_here(path) and made is not None and made[:2] == (st.st_dev, st.st_ino) else None


def _ours(path: str, st: os.stat_result) -> bool:
    return _made(path, st) is not None


def identity(path: str) -> tuple[int, int, int, int] | None:
    """``(device, inode, size, data offset)`` of spill file ``path`` while it is the very file this process made
    there (not a fork child's parent's, nor one swapped in); ``None`` otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    made = _made(path, st)
    return None if made is None else (st.st_dev, st.st_ino, st.st_size, made[2])


def delete(path: str) -> None:
    """Remove a spill file this process made (it may still be mapped: its blocks are then freed when the mapping
    goes). A file someone put in its place (another inode, a symbolic link) is left alone."""
    with contextlib.suppress(FileNotFoundError):
        if _ours(path, os.lstat(path)):
            os.unlink(path)
    with _live_lock:
        _live.pop(path, None)


def release(path: str) -> None:
    """Give the file's blocks back now, although views of its mapping may live on (see the module docstring); never
    asks for memory, and the file is unlinked whatever happens. Punched through a descriptor opened without
    following links and checked to be our file: a symbolic link swapped in for it would otherwise empty whatever
    it points to."""
    try:
        if made_here(path):
            _punch_out(path)
    finally:
        delete(path)


def _punch_out(path: str) -> None:
    with contextlib.suppress(OSError):  # gone, or a symbolic link (ELOOP): nothing of ours to punch
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if _ours(path, st):
                libc.punch_hole(fd, 0, st.st_size)
        finally:
            os.close(fd)


def _fresh_locks_in_child() -> None:
    """A fork while another thread held one of these would copy it taken: the child gets free ones."""
    global _live_lock, _reclaim_lock
    _live_lock, _reclaim_lock = threading.Lock(), threading.Lock()


def _in_child() -> None:
    """The fork hook: free locks, and the child's own copy-on-write copy of every spill file mapping (the fork rule,
    ``forking``)."""
    _fresh_locks_in_child()
    forking.private_copies(is_spill_file)


def is_spill_file(path: str) -> bool:
    """Whether ``path`` is named like a spill file (the library's own: nothing else maps one)."""
    return owner_of(os.path.basename(path)) is not None


def _delete_all_at_exit() -> None:
    with _live_lock:
        left = list(_live)
    for path in left:
        delete(path)


@once
def set_up() -> None:
    """With the first spill or move of the process, or the first kept file (``npyfiles``): the fork hook and the
    at-exit cleanup (never at import)."""
    os.register_at_fork(after_in_child=_in_child)
    atexit.register(_delete_all_at_exit)
    for hook in on_first_file:
        hook()


# -- pages: replacing a mapping in place, counting what is resident ----------------------------------------------

def resident(address: int, length: int) -> int:
    """Bytes of the page-aligned range that are in memory; 0 where that cannot be asked (so the caller assumes
    nothing was written, the safe side)."""
    states = libc.mincore(address, length)
    return 0 if states is None else int(np.count_nonzero(states)) * mmap.PAGESIZE


def detach(address: int, length: int) -> bool:
    """Replace the pages at ``[address, address + length)`` with fresh anonymous zero pages, atomically.

    What was there is released at once; pointers into the range stay valid. For a big RAM array this costs no
    memory (the kernel takes back the old pages' charge); over a spill file's mapping it would ask for as much as
    the file is long, so ``release`` does not use it. ``False`` where this cannot be done (not Linux): the caller
    then only drops its own reference. A failure raises ``SystemCallError`` (an ``OSError``) naming the range."""
    return libc.map_anonymous_fixed(address, length)
