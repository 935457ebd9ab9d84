"""Kernel files kept open under one root and re-read with ``pread``: a reading costs a ``pread`` per file, not an
``open``, a read and a ``close`` through Python's text layer.

A kernel file (``/proc/meminfo``, a cgroup's ``memory.current``) regenerates its text on every read from offset
0, so an open descriptor always reads the value of now; it has size 0 but reads text, which is how it is told
from an ordinary file. A kernel file is never replaced (a removed cgroup's files fail to read, and are then
opened afresh). An ordinary file (the fakes under a test root) may be replaced or deleted while it is open: one
``fstat`` per read sees that (no link is left to it) and the path is opened afresh. A missing or unreadable file
is ``None`` and is looked for again on the next read.

``/proc/self/mountinfo`` costs more to generate than all the rest; the kernel says when it changed (``POLLPRI``
on an open descriptor after a mount or unmount), so ``read_if_changed`` skips it while the mounts stay as they are.

After ``fork`` the child holds copies of the parent's descriptors, and ``/proc/self/...`` ones still show the
parent: the first read in a new process closes them all and opens afresh. Descriptors are closed by ``close()``,
or when the owner is collected.
"""

from __future__ import annotations

import os
import select
import weakref

from .root import read_text, under

_FIRST_READ = 8192  # bytes; a file that fills the buffer is read again with twice the room


class KernelFiles:
    """The files under ``root`` that a reading reads, open. Not thread-safe: its owner reads under a lock."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._open: dict[str, int] = {}  # path in the machine's view -> descriptor
        self._kernel: set[str] = set()  # paths whose open file is a kernel file (never replaced)
        self._room: dict[str, int] = {}  # path -> bytes its last read needed room for
        self._pid = os.getpid()
        self._closer = weakref.finalize(self, _close_all, self._open)

    def read(self, path: str) -> str | None:
        """The file's text now, or ``None`` when it is missing or cannot be read (the caller falls back)."""
        fd = self._open.get(path)
        if fd is not None and path not in self._kernel and not _still_there(fd):
            self._forget(path)
            fd = None
        if fd is not None:
            try:
                return self._whole(path, fd).decode("utf-8", errors="replace")
            except OSError:  # ENODEV: its group was removed; a group of that name may be there now
                self._forget(path)
        return self._read_fresh(path)

    def _read_fresh(self, path: str) -> str | None:
        if not hasattr(os, "pread"):  # Windows: nothing to keep open (and no kernel files to read)
            return read_text(self.root, path)
        try:
            fd = os.open(under(self.root, path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        self._open[path] = fd
        try:
            data = self._whole(path, fd)
            if data and os.fstat(fd).st_size == 0:
                self._kernel.add(path)
        except OSError:  # EOPNOTSUPP (PSI disabled), EISDIR: not available now
            self._forget(path)
            return None
        return data.decode("utf-8", errors="replace")

    def read_if_changed(self, path: str, last: str | None) -> str | None:
        """``last`` (the text read before) where the path is a kernel file open since then that signals change by
        ``POLLPRI`` and has not signalled; otherwise the text read now."""
        fd = self._open.get(path)
        if last is not None and fd is not None and path in self._kernel:
            poll = select.poll()
            poll.register(fd, select.POLLPRI)
            if not poll.poll(0):
                return last
        return self.read(path)

    def forked(self) -> bool:
        """True, once, in a process other than the one the descriptors were opened in; they are then closed."""
        if self._pid == os.getpid():
            return False
        self._pid = os.getpid()
        _close_all(self._open)
        self._kernel.clear()
        return True

    def close(self) -> None:
        """Close every descriptor now; a later read opens its file again (and that is closed on collection)."""
        self._closer()
        self._kernel.clear()
        self._closer = weakref.finalize(self, _close_all, self._open)

    def _whole(self, path: str, fd: int) -> bytes:
        room = self._room.get(path, _FIRST_READ)
        data = os.pread(fd, room, 0)
        while len(data) == room:  # the file may go on: read it whole again, in one call, so it is one snapshot
            room *= 2
            data = os.pread(fd, room, 0)
        self._room[path] = room
        return data

    def _forget(self, path: str) -> None:
        self._kernel.discard(path)
        fd = self._open.pop(path, None)
        if fd is not None:
            os.close(fd)


def _still_there(fd: int) -> bool:
    """False where the file was deleted or replaced since it was opened (no name links to it any more)."""
    try:
        return os.fstat(fd).st_nlink > 0
    except OSError:
        return False


def _close_all(descriptors: dict[str, int]) -> None:
    for fd in descriptors.values():
        try:
            os.close(fd)
        except OSError:  # already gone: nothing to give back
            pass
    descriptors.clear()
