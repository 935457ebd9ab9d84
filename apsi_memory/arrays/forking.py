"""The fork rule: a forked child gets its own copy-on-write copy of every SSD or moved array, as it does of an array
in RAM (NumPy's semantics); the child's writes and its ``free`` never reach the parent.

Why
---
An SSD or moved array is a ``MAP_SHARED`` mapping of its spill file (so the kernel can write its pages back and
drop them), and ``fork`` copies a shared mapping shared: without this, a child's write (a fork ``Pool`` or DataLoader
worker scaling its slice in place) would change the parent's data, while the same array in RAM — private memory —
is copied on write. So the first spill of a process registers a fork hook (``spill.set_up``) that, in the child,
maps each such mapping again at the same address, from the same file and offset, ``MAP_PRIVATE | MAP_FIXED``
(``uffd.map_private``): the child reads the parent's data, and its first write to a page makes the page its own.

Which mappings
--------------
The kernel's own list of the child's mappings (``/proc/self/maps``, read in the child) is the registry: every
shared mapping of a spill file (``is_ours``: named like one) is the library's. It is the state at the very moment
of the fork — a move half done (the pieces already on the file), an array collected a moment before — so nothing
kept on the side can be stale and remap an address that holds something else by then. The file is opened again by
its path (no link followed, the same inode as the mapping) or, once deleted (views of a freed array), through
``/proc/self/map_files`` (where the kernel allows it).

Where no copy can be made (the file cannot be opened, ``mmap`` refused), the range is made read-only: a write in the
child then crashes it (SIGSEGV) instead of silently changing the parent's data, and a WARNING names the file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from ..adapters.maps import Region, parse_maps_line
from ..errors import SystemCallError
from ..logs import logger
from ..system import uffd

log = logger("apsi_memory.arrays")
_DELETED = " (deleted)"


def shared_mappings(maps: str) -> Iterator[Region]:
    """The shared file mappings in ``/proc/self/maps`` text (their paths as the kernel shows them: `` (deleted)``
    at the end once unlinked)."""
    for line in maps.splitlines():
        region = parse_maps_line(line)
        if region is not None and region.shared and region.path.startswith("/"):
            yield region


def private_copies(is_ours: Callable[[str], bool]) -> int:
    """In a fork child: every shared mapping of a file ``is_ours(path)`` accepts becomes the child's copy-on-write
    copy (see the module docstring); how many did. Reads the real kernel's list, never a simulated machine's: the
    mappings are real."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError as exc:  # no /proc (a sandbox): nothing says which mappings are ours
        log.warning("a forked child shares its SSD and moved arrays with its parent: %s", exc)
        return 0
    done = 0
    for mapping in shared_mappings(maps):
        if is_ours(mapping.path.removesuffix(_DELETED)):
            done += _make_private(mapping)
    return done


def _make_private(mapping: Region) -> bool:
    length = mapping.end - mapping.start
    fd = _reopen(mapping)
    why = "the file cannot be opened again"
    if fd is not None:
        try:
            uffd.map_private(mapping.start, length, fd, mapping.file_offset, mapping.writable)
            return True
        except SystemCallError as exc:
            why = str(exc)
        finally:
            os.close(fd)
    protected = uffd.protect_read_only(mapping.start, length)
    log.warning("a forked child shares %s with its parent (%s): the child's copy is %s", mapping.path, why,
                "read-only (a write crashes the child)" if protected else "not protected")
    return False


def _reopen(mapping: Region) -> int | None:
    """A read-only descriptor of the very file mapped (its inode), or ``None``."""
    candidates = [f"/proc/self/map_files/{mapping.start:x}-{mapping.end:x}"]
    if not mapping.path.endswith(_DELETED):
        candidates.insert(0, mapping.path)
    for path in candidates:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if path == mapping.path else 0))
            if os.fstat(fd).st_ino == mapping.inode:
                return fd
            os.close(fd)
    return None
