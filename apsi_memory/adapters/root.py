"""The directory that stands for ``/`` when the adapters read kernel files, and the one way they read them."""

from __future__ import annotations

import errno
import os

from ..errors import ArgumentError, ArgumentTypeError, MissingFileError

ROOT_ENV = "APSI_FS_ROOT"


def resolve(root: str | None) -> str:
    """``root``, or where none is given ``APSI_FS_ROOT`` (read now, not at import), else ``/``. The library itself
    always passes its machine's root (``apsi_memory.machine().root``); ``None`` is for direct calls."""
    if root is None:
        return root_from_env()
    if not isinstance(root, str):  # a number would fail deep inside os.path, unnamed
        raise ArgumentTypeError(f"root must be a folder (str) or None, not {type(root).__name__} ({root!r})")
    if not root:  # "" would read proc/meminfo relative to the working folder
        raise ArgumentError("root must be a folder, not '' (None reads this machine's own files)")
    if not os.path.isdir(root):  # every file would read as missing: the host's numbers, silently
        raise MissingFileError(errno.ENOENT, "root is not a folder", root)
    return root


def root_from_env() -> str:
    """``APSI_FS_ROOT`` (empty counts as unset: ``/``). Anything but an absolute path to a folder is an
    ``ArgumentError`` naming the variable: a wrong root would otherwise read as a machine with no cgroup and no
    PSI, and report the host's memory without a word."""
    value = os.environ.get(ROOT_ENV, "")
    if not value:
        return "/"
    if not os.path.isabs(value) or not os.path.isdir(value):
        raise ArgumentError(f"{ROOT_ENV}={value!r} is not an absolute path to a folder (the folder that stands for "
                            f"/, e.g. a captured machine's tree); fix it, or unset {ROOT_ENV} to read this machine")
    return value


def under(root: str, path: str) -> str:
    """``path`` as seen from inside ``root`` (``path`` is absolute in the machine's view)."""
    return os.path.join(root, path.lstrip("/"))


def read_text(root: str, path: str) -> str | None:
    """The file's text, or ``None`` when it is missing or cannot be read (the caller falls back).

    A file that exists but fails to read — PSI with ``psi=0`` answers EOPNOTSUPP — is "not available" too."""
    try:
        with open(under(root, path), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
