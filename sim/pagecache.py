"""A cold page cache for one file, without dropping the whole machine's caches (others may be working)."""

from __future__ import annotations

import os


def drop_cache(path: str) -> None:
    """Write the file's dirty pages out, then ask the kernel to drop its clean ones from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
