"""The process's memory cgroup (v1, v2, or hybrid), its smallest limit up the hierarchy, and its working set.

The group is found the way the kernel describes it — ``/proc/self/cgroup`` gives the path, ``/proc/self/mountinfo``
where that hierarchy is mounted and which part of it (a container sees its own group as the mount's root) — not
by guessing fixed paths. Limits are re-read on every call: a pod can be resized in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import CorruptFileError
from .procfs import CgroupEntry, Mount, read_mountinfo, read_self_cgroup
from .root import read_text, resolve


@dataclass(frozen=True)
class CgroupMemory:
    version: int  # 1 or 2
    path: str  # the group as /proc/self/cgroup names it
    directory: str  # where its files are, in the machine's view (without the root prefix)
    limit: int | None  # smallest limit up the hierarchy; None when unlimited
    limit_file: str | None  # the file that set it
    working_set: int  # usage minus inactive file cache, clamped to [0, limit]
    free: int | None  # smallest headroom up the hierarchy; None when unlimited


# -- pure parsing --------------------------------------------------------------------------------------------------

def parse_limit(text: str, path: str) -> int | None:
    """A limit file: a byte count, or v2's ``max`` (no limit)."""
    value = text.strip()
    if value == "max":
        return None
    return parse_bytes(value, path)


def parse_bytes(text: str, path: str) -> int:
    value = text.strip()
    try:
        number = int(value)
    except ValueError:
        raise CorruptFileError(path, f"expected a byte count, got {value[:40]!r}") from None
    if number < 0:
        # v1 reports -1 for "unlimited" in some files and kernels; there is no negative memory.
        return 2**63 - 1
    return number


def parse_memory_stat(text: str, path: str) -> dict[str, int]:
    """``memory.stat``: ``name value`` lines (both versions)."""
    stats = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) != 2:
            raise CorruptFileError(path, f"line {line!r} is not 'name value'")
        stats[words[0]] = parse_bytes(words[1], path)
    return stats


def working_set(usage: int, inactive_file: int, limit: int | None) -> int:
    """Usage without the page cache the kernel would drop first, so a big cache does not read as pressure."""
    ws = max(0, usage - inactive_file)
    return ws if limit is None else min(ws, limit)


def effective_limit(value: int | None, physical: int) -> int | None:
    """v1 has no "unlimited" keyword: it prints a huge page-aligned number that depends on the page size
    (0x7FFFFFFFFFFFF000 with 4 KiB pages, ...FF0000 with 64 KiB). Any limit at or above the RAM there is is none."""
    return None if value is None or value >= physical else value


# -- finding the group ---------------------------------------------------------------------------------------------

def _relative(path: str, mount_root: str) -> str | None:
    if mount_root == "/":
        return path
    if path == mount_root or path.startswith(mount_root + "/"):
        return path[len(mount_root):] or "/"
    return None


def locate(entries: list[CgroupEntry], mounts: list[Mount], version: int) -> tuple[CgroupEntry, str, str] | None:
    """(entry, group directory, mount point) for the memory hierarchy of ``version``, or None."""
    if version == 1:
        entry = next((e for e in entries if "memory" in e.controllers), None)
        candidates = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
    else:
        entry = next((e for e in entries if e.hierarchy == 0 and not e.controllers), None)
        candidates = [m for m in mounts if m.fstype == "cgroup2"]
    if entry is None or not candidates:
        return None
    # The mount showing the deepest part of our path is the one our group lives in; a mount whose root is not on
    # our path at all (a namespace shows our own group as its root) stands for the group itself.
    best, rel = candidates[0], None
    for mount in candidates:
        candidate_rel = _relative(entry.path, mount.root)
        if candidate_rel is not None and (rel is None or len(mount.root) > len(best.root)):
            best, rel = mount, candidate_rel
    directory = os.path.normpath(os.path.join(best.mount_point, (rel or "/").lstrip("/")))
    return entry, directory, best.mount_point


def _levels(directory: str, mount_point: str) -> list[str]:
    """The group and its parents up to the mount point (parents above a namespace's root are not visible)."""
    levels = [directory]
    while directory != mount_point and directory.startswith(mount_point):
        directory = os.path.dirname(directory)
        levels.append(directory)
    return levels


# -- reading -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Files:
    """File names that differ between the versions."""

    limits: tuple[str, ...]
    usage: str
    inactive_file: tuple[str, ...]  # first present wins: v1's hierarchical total before the group's own
    stat_limit: str | None  # a limit kept in memory.stat


# hierarchical_memory_limit includes ancestors a container cannot see above its mount root.
V1 = _Files(("memory.limit_in_bytes",), "memory.usage_in_bytes", ("total_inactive_file", "inactive_file"),
            "hierarchical_memory_limit")
# memory.high is where the kernel starts throttling and reclaiming hard: a limit for planning purposes.
V2 = _Files(("memory.max", "memory.high"), "memory.current", ("inactive_file",), None)


@dataclass(frozen=True)
class _Level:
    limit: int | None
    limit_file: str | None
    usage: int | None
    working_set: int


def _read_limit(root: str, path: str) -> int | None:
    text = read_text(root, path)
    return None if text is None else parse_limit(text, path)


def _read_level(root: str, files: _Files, directory: str, physical: int) -> _Level:
    usage_path, stat_path = os.path.join(directory, files.usage), os.path.join(directory, "memory.stat")
    usage_text, stat_text = read_text(root, usage_path), read_text(root, stat_path)
    usage = None if usage_text is None else parse_bytes(usage_text, usage_path)
    stats = {} if stat_text is None else parse_memory_stat(stat_text, stat_path)
    candidates = [(_read_limit(root, os.path.join(directory, name)), os.path.join(directory, name))
                  for name in files.limits]
    if files.stat_limit is not None:
        candidates.append((stats.get(files.stat_limit), stat_path))
    limit, limit_file = None, None
    for value, path in candidates:
        value = effective_limit(value, physical)
        if value is not None and (limit is None or value < limit):
            limit, limit_file = value, path
    inactive = next((stats[name] for name in files.inactive_file if name in stats), 0)
    return _Level(limit, limit_file, usage, working_set(usage or 0, inactive, limit))


@dataclass(frozen=True)
class Layout:
    """What ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` say, read once per measurement."""

    entries: list[CgroupEntry]
    mounts: list[Mount]

    def locate(self, version: int) -> tuple[CgroupEntry, str, str] | None:
        return locate(self.entries, self.mounts, version)

    @property
    def v2_directory(self) -> str | None:
        """The v2 group directory (also on hybrid hosts, where only PSI lives there); None without a v2 mount."""
        found = self.locate(2)
        return None if found is None else found[1]


def read_layout(root: str | None = None) -> Layout:
    root = resolve(root)
    return Layout(read_self_cgroup(root), read_mountinfo(root))


def read_cgroup_memory(physical: int, root: str | None = None, layout: Layout | None = None) -> CgroupMemory | None:
    """The memory cgroup of this process, or None where there is none to read (bare host, no controller)."""
    root = resolve(root)
    layout = layout or read_layout(root)
    for version, files in ((1, V1), (2, V2)):
        found = layout.locate(version)
        if found is None:
            continue
        entry, directory, mount_point = found
        levels = [_read_level(root, files, level, physical) for level in _levels(directory, mount_point)]
        if levels[0].usage is None:
            continue  # no memory controller on this group (v2 without memory enabled, or a bare host's root)
        return _combine(version, entry.path, directory, levels)
    return None


def _combine(version: int, path: str, directory: str, levels: list[_Level]) -> CgroupMemory:
    """The smallest limit wins, and the least headroom (each level's limit minus that level's own working set)."""
    limit, limit_file, free = None, None, None
    for level in levels:
        if level.limit is None:
            continue
        if limit is None or level.limit < limit:
            limit, limit_file = level.limit, level.limit_file
        if level.usage is not None:  # a level whose usage cannot be read limits, but its headroom is unknown
            headroom = level.limit - level.working_set
            free = headroom if free is None else min(free, headroom)
    if limit is not None and free is None:
        free = limit - levels[0].working_set
    leaf_ws = levels[0].working_set if limit is None else min(levels[0].working_set, limit)
    return CgroupMemory(version, path, directory, limit, limit_file, leaf_ws, free)
