"""Who may have written a file before we read it: the checks at the trust boundary.

In the spirit of OpenSSH's StrictModes, a folder the library keeps files in must belong to the effective user and
be writable by nobody else, and so must every folder above it (root's are fine too, and so is a shared folder with
the sticky bit, like ``/tmp``, where nobody may rename or remove what is ours); a symbolic link on the way must be
root's or ours, and the folder itself must not be one. The signing key must be a regular file of ours with no
group or other bits, and the store's own files (``lock``, ``index``) must be regular files of ours. Files inside
our folders are opened with ``O_NOFOLLOW`` (a symbolic link there was planted: we never make one). Anything else
is an ``UnsafePathError`` that names the path, what is wrong, the ``APSI_*`` variable that pointed there (if one
did) and what to do; nothing was read from it or written to it. The advice never removes, chmods or chowns
anything: what we distrust may be someone else's, so the fix is always a folder of the user's own. The checks run
when a folder or file is opened, never per read.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import UnsafePathError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# The variables that name the folders we keep files in, most specific first (for the advice).
FOLDER_VARIABLES = ("APSI_SPILL_DIR", "APSI_STORE_DIR", "APSI_HOME")


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it (both absolute and normalised)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def pointed_by(path: str) -> str | None:
    """The ``APSI_*`` variable whose folder ``path`` is, lies in, or lies above (when set); ``None`` if none."""
    for variable in FOLDER_VARIABLES:
        value = os.environ.get(variable)
        folder = os.path.normpath(os.path.abspath(os.path.expanduser(value))) if value else ""
        if folder and (within(path, folder) or within(folder, path)):
            return variable
    return None


def advice(path: str) -> str:
    """What to do about a path we refuse: never to change it (it may not be ours), always to use another folder."""
    variable = pointed_by(path)
    if variable is not None:
        return (f"{variable}={os.environ[variable]} points there; set {variable} to a folder of your own that "
                f"nobody else can write (e.g. ~/.apsi), or unset it")
    return ("apsi_memory changes nothing there; use a folder of your own that nobody else can write (set APSI_HOME, "
            "or give the store another path)")


def untrusted(path: str, problem: str) -> UnsafePathError:
    """``path`` is refused because ``problem``; with the advice for it."""
    return UnsafePathError(errno.EPERM, f"{path} {problem}; apsi_memory does not trust it. Fix: {advice(path)}")


def unwritable(path: str) -> UnsafePathError:
    """A folder of ours that this user cannot write in (its mode, a read-only filesystem)."""
    return UnsafePathError(errno.EACCES, f"{path} cannot be written by this user (mode or a read-only disk). Fix: "
                                         f"{advice(path)}")


def shared(st: os.stat_result) -> bool:
    """A folder everyone may write to but where only an entry's owner may rename or remove it (``/tmp``)."""
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & stat.S_IWOTH)


def check_folder(path: str, st: os.stat_result) -> None:
    """``st`` (of ``path``) is a folder of ours that nobody else can write to."""
    if not stat.S_ISDIR(st.st_mode):
        raise untrusted(path, "is not a folder")
    if st.st_uid != os.geteuid():
        raise untrusted(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise untrusted(path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def _check_above(path: str, st: os.stat_result) -> None:
    """``st`` (``lstat`` of ``path``, a folder above ours or a link on the way) is root's or ours, and a folder
    that others may write is a shared sticky one."""
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise untrusted(path, "(above the folder used) is not a folder")
    if st.st_uid not in (0, os.geteuid()):
        raise untrusted(path, f"(above the folder used) belongs to uid {st.st_uid}, not to this user or root")
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise untrusted(path, f"(above the folder used) is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def check_above(path: str) -> None:
    """Every existing folder above ``path``, as written and with its links resolved, passes ``_check_above``:
    someone who could rename one of them could swap our folder for theirs."""
    for chain in (os.path.dirname(os.path.abspath(path)), os.path.realpath(os.path.dirname(os.path.abspath(path)))):
        head = os.sep
        for part in [p for p in chain.split(os.sep) if p]:
            head = os.path.join(head, part)
            try:
                _check_above(head, os.lstat(head))
            except FileNotFoundError:
                break  # made below, 0700


def check_file(path: str, st: os.stat_result, secret: bool = False) -> None:
    """``st`` (of ``path``) is a regular file of ours; a ``secret`` one has no group or other bits either."""
    if stat.S_ISDIR(st.st_mode):
        raise untrusted(path, "is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise untrusted(path, "is not a regular file")
    if st.st_uid != os.geteuid():
        raise untrusted(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if secret and st.st_mode & 0o077:
        raise untrusted(path, f"can be read or written by others (mode {stat.S_IMODE(st.st_mode):o})")


def make_private(path: str) -> str:
    """Check the folders above ``path`` (``check_above``), create ``path`` and every missing folder above it, each
    0700 (``makedirs`` gives the intermediate ones the umask's mode), then check that ``path`` is a folder of ours
    (not a symbolic link) that others cannot write and we can; returns it."""
    path = os.path.abspath(path)
    check_above(path)
    missing: list[str] = []
    head = path
    while not os.path.lexists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # another process made it meanwhile; checked below like any existing folder
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise unwritable(os.path.dirname(folder)) from err
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise untrusted(path, "is a symbolic link (apsi_memory follows none it did not make)")
    check_folder(path, st)
    if not os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise unwritable(path)
    return path


def open_file(path: str, flags: int, dir_fd: int | None = None, secret: bool = False, shown: str = "") -> int:
    """``os.open`` that never follows a symbolic link and refuses a file that is not a regular file of ours."""
    shown = shown or path
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise untrusted(shown, "is a symbolic link") from err
        if err.errno == errno.EISDIR:
            raise untrusted(shown, "is a folder, not a file") from err
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
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise untrusted(shown, "is not a folder (a symbolic link or a file)") from err
        raise
    try:
        check_folder(shown, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd
