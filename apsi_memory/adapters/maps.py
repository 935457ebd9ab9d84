"""``/proc/self/maps``: which file, if any, holds a range of this process's memory.

The kernel itself says whether memory is a shared mapping of a file, which file, at which offset and with which
access, so nothing relies on how NumPy or ``memory.array`` built the mapping. ``parse_maps_line`` and
``region_in_maps`` are pure; ``file_region`` reads the file under the injectable root (a fake machine without the
file has no file mappings: streaming then leaves pages to the kernel).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .root import read_text, resolve

# How /proc/self/maps names shared mappings that are memory, not a file on a disk.
_MEMORY_ONLY_FILES = ("/dev/zero", "/memfd:", "/SYSV", "/dev/shm/")


@dataclass(frozen=True)
class Region:
    """One mapping of this process, as ``/proc/self/maps`` lists it."""

    start: int
    end: int
    shared: bool
    writable: bool
    file_offset: int
    path: str  # "" for anonymous memory, "[heap]" and the like for the kernel's own
    inode: int = 0  # the file's, to tell it is still the one mapped (0 for anonymous memory)

    @property
    def is_file(self) -> bool:
        """A file with its own pages on a disk; shared anonymous memory (``mmap(-1, n)``, memfd, System V) is RAM."""
        return self.path.startswith("/") and not self.path.startswith(_MEMORY_ONLY_FILES)


def parse_maps_line(line: str) -> Region | None:
    """``7f..-7f.. r--s 00001000 fd:01 1234   /data/x.npy`` (the path may hold spaces, or be absent)."""
    fields = line.split(maxsplit=5)
    if len(fields) < 5:
        return None
    start, end = (int(part, 16) for part in fields[0].split("-"))
    perms = fields[1]
    path = fields[5] if len(fields) == 6 else ""
    return Region(start, end, perms[3:4] == "s", perms[1:2] == "w", int(fields[2], 16), path, int(fields[4]))


def region_in_maps(maps: str, start: int, end: int) -> Region | None:
    """The file mapping in ``/proc/self/maps`` text that holds ``[start, end)``, joining neighbours the kernel
    split (same file, consecutive offsets, same access); ``None`` if the range is not one file mapping.

    The lines are sorted by address: a binary search finds the first, so only a few lines are parsed."""
    lines = maps.splitlines()
    first = bisect.bisect_right(lines, start, key=_line_start) - 1
    joined = parse_maps_line(lines[first]) if first >= 0 else None
    if joined is None or not joined.start <= start < joined.end:
        return None
    for line in lines[first + 1:]:
        if joined.end >= end:
            break
        region = parse_maps_line(line)
        if region is None or not _continues(joined, region):
            break
        joined = Region(joined.start, region.end, joined.shared, joined.writable, joined.file_offset, joined.path,
                            joined.inode)
    return joined if joined.is_file and end <= joined.end else None


def _line_start(line: str) -> int:
    return int(line[:line.find("-")] or "0", 16)


def _continues(left: Region, right: Region) -> bool:
    return (right.start == left.end and right.path == left.path and right.shared == left.shared
            and right.writable == left.writable and right.file_offset == left.file_offset + (left.end - left.start))


def file_region(start: int, end: int, root: str | None = None) -> Region | None:
    """The file mapping of this process that holds ``[start, end)``; ``None`` if there is none or the file cannot
    be read."""
    text = read_text(resolve(root), "/proc/self/maps")
    return None if text is None else region_in_maps(text, start, end)
