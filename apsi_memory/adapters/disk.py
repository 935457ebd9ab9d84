"""Free space on the filesystem that holds a folder, asked before the folder exists (spill dirs are made late)."""

from __future__ import annotations

import os


def existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def disk_free(path: str) -> int:
    """Bytes an unprivileged user may still write where ``path`` is (or would be created)."""
    stats = os.statvfs(existing_ancestor(path))
    return stats.f_bavail * stats.f_frsize
