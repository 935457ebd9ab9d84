"""The directory that stands for ``/`` when the adapters read kernel files, and the one way they read them."""

from __future__ import annotations

import os

from ..errors import ArgumentTypeError

ROOT = os.environ.get("APSI_FS_ROOT", "/")


def resolve(root: str | None) -> str:
    if root is not None and not isinstance(root, str):  # a number would fail deep inside os.path, unnamed
        raise ArgumentTypeError(f"root must be a folder (str) or None, not {type(root).__name__} ({root!r})")
    return ROOT if root is None else root


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
