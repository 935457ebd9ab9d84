"""Who may have written a file before we read it: the checks at the trust boundary.

In the spirit of OpenSSH's StrictModes, a folder the library keeps files in must belong to the effective user and
be writable by nobody else, the signing key must be a regular file of ours with no group or other bits, and the
store's own files (``lock``, ``index``) must be regular files of ours. Files inside our folders are opened with
``O_NOFOLLOW`` (a symbolic link there was planted: we never make one). Anything else is an
``UnsafePathError`` that names the path, what is wrong and the one command that fixes it; nothing was read
from it or written to it. The checks run when a folder or file is opened, never per read.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import UnsafePathError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _untrusted(path: str, problem: str, fix: str) -> UnsafePathError:
    return UnsafePathError(errno.EPERM, f"{path} {problem}; apsi_memory does not trust it. Fix: {fix}")


def check_folder(path: str, st: os.stat_result) -> None:
    """``st`` (of ``path``) is a folder of ours that nobody else can write to."""
    if not stat.S_ISDIR(st.st_mode):
        raise _untrusted(path, "is not a folder", f"rm {path}")
    if st.st_uid != os.geteuid():
        raise _untrusted(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})",
                         f"choose a folder of your own, or (as root) chown {os.geteuid()} {path}")
    if st.st_mode & 0o022:
        raise _untrusted(path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})", f"chmod go-w {path}")


def check_file(path: str, st: os.stat_result, secret: bool = False) -> None:
    """``st`` (of ``path``) is a regular file of ours; a ``secret`` one has no group or other bits either."""
    if stat.S_ISDIR(st.st_mode):
        raise _untrusted(path, "is a folder, not a file", f"rmdir {path}")
    if not stat.S_ISREG(st.st_mode):
        raise _untrusted(path, "is not a regular file", f"rm {path}")
    if st.st_uid != os.geteuid():
        raise _untrusted(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})", f"rm {path}")
    if secret and st.st_mode & 0o077:
        raise _untrusted(path, f"can be read or written by others (mode {stat.S_IMODE(st.st_mode):o})",
                         f"chmod 600 {path}")


def make_private(path: str) -> str:
    """Create ``path`` and every missing folder above it, each 0700 (``makedirs`` gives the intermediate ones
    the umask's mode), then check that ``path`` is ours and not writable by others; returns it."""
    missing: list[str] = []
    head = os.path.abspath(path)
    while not os.path.lexists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # another process made it meanwhile; checked below like any existing folder
    check_folder(path, os.stat(path))
    return path


def open_file(path: str, flags: int, dir_fd: int | None = None, secret: bool = False, shown: str = "") -> int:
    """``os.open`` that never follows a symbolic link and refuses a file that is not a regular file of ours."""
    shown = shown or path
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _untrusted(shown, "is a symbolic link", f"rm {shown}") from err
        if err.errno == errno.EISDIR:
            raise _untrusted(shown, "is a folder, not a file", f"rmdir {shown}") from err
        raise
    try:
        check_file(shown, os.fstat(fd), secret)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_folder(path: str, dir_fd: int | None = None, shown: str = "") -> int:
    """A file descriptor of folder ``path`` (made 0700 if missing), checked; inside a folder of ours (``dir_fd``)
    a symbolic link is refused, so a swapped folder cannot redirect later file operations."""
    shown = shown or path
    if dir_fd is None:
        make_private(path)
    else:
        try:
            os.mkdir(path, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC | (_NOFOLLOW if dir_fd is not None else 0),
                     dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _untrusted(shown, "is not a folder (a symbolic link or a file)", f"rm {shown}") from err
        raise
    try:
        check_folder(shown, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd
