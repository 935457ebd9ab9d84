"""``/sys/devices/system/cpu``: the size of the cache each core has to itself, which ``map`` sizes the pieces of a
block by (a piece whose temporaries stay in that cache is not limited by memory bandwidth)."""

from __future__ import annotations

import os
import re

from .root import read_text, under

CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
_SIZE = re.compile(r"\s*(\d+)\s*([KMG]?)\s*$")
_FACTOR = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_cache_size(text: str) -> int | None:
    """``1024K`` (sysfs's way of writing a cache's size) as bytes; ``None`` for anything else."""
    found = _SIZE.match(text)
    return None if found is None else int(found[1]) * _FACTOR[found[2]]


def core_cache_bytes(root: str) -> int | None:
    """The size of cpu0's level-2 cache (the largest a core has to itself on current x86 and arm64), or ``None``
    where sysfs does not say (a container without ``/sys``, a fake tree)."""
    try:
        names = sorted(os.listdir(under(root, CACHE_DIR)))
    except OSError:
        return None
    for name in names:
        level, kind, size = (read_text(root, f"{CACHE_DIR}/{name}/{field}") for field in ("level", "type", "size"))
        if (level or "").strip() == "2" and (kind or "").strip() in ("Unified", "Data") and size is not None:
            return parse_cache_size(size)
    return None
