"""The process's memory cgroup (v1, v2, or hybrid), its smallest limit up the hierarchy, the group whose limit that
is (the binding group: the processes under it share one reservation ledger), and its working set.

The group is found the way the kernel describes it — ``/proc/self/cgroup`` gives the path, ``/proc/self/mountinfo``
where that hierarchy is mounted and which part of it (a container sees its own group as the mount's root) — not
by guessing fixed paths. Limits are re-read on every call: a pod can be resized in place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cached_property
from typing import NamedTuple

from ..decide import (
    V1_LIMIT_FILES,
    V1_STAT_LIMIT,
    V2_LIMIT_FILES,
    GroupLevel,
    binding_level,
    charged_levels,
    combine_levels,
    effective_limit,
    smallest_limit,
)
from ..errors import CorruptFileError
from ..logs import logger
from . import cgroup_v2, cgroupns
from .files import KernelFiles
from .procfs import CgroupEntry, Mount, parse_mountinfo_lines, parse_self_cgroup


class CgroupMemory(NamedTuple):
    version: int  # 1 or 2
    path: str  # the group as /proc/self/cgroup names it
    directory: str  # where its files are, in the machine's view (without the root prefix)
    limit: int | None  # smallest limit up the hierarchy; None when unlimited
    limit_file: str | None  # the file that set it
    working_set: int  # usage minus inactive file cache, clamped to [0, limit]
    free: int | None  # smallest headroom up the hierarchy; None when unlimited
    guessed: bool = False  # the group is not below any mount's root: read at the mount point (the JVM's choice)
    binding: str | None = None  # the level whose limit binds (``decide.binding_level``), as ``directory``; None: none
    high_events: int | None = None  # v2: memory.events ``high`` counts up the levels (``cgroup_v2.high_events``)
    oom_group: str | None = None  # v2: the level one OOM kill takes whole (memory.oom.group), as ``directory``


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
    return number  # negative (v1's -1) is kept: decide.effective_limit reads it as unlimited


def parse_memory_stat(text: str, path: str) -> dict[str, int]:
    """``memory.stat``: ``name value`` lines (both versions)."""
    return cgroup_v2.parse_flat_keyed(text, path, parse_bytes, "value")


def parse_stat_fields(text: str, path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Only ``names`` of a ``memory.stat`` (a reading needs two or three of its 40 to 70 lines), found where the
    kernel writes them (``name value`` at the start of a line; the last one wins, as in ``parse_memory_stat``).
    Where one is not found so, the whole file is parsed: a malformed file is then named as that names it."""
    lines, found = "\n" + text, {}
    for name in names:
        start = lines.rfind(f"\n{name} ")
        if start < 0:
            stats = parse_memory_stat(text, path)
            return {name: stats[name] for name in names if name in stats}
        end = lines.find("\n", start + 1)
        found[name] = parse_bytes(lines[start + len(name) + 2:end if end >= 0 else len(lines)], path)
    return found


# -- finding the group ---------------------------------------------------------------------------------------------

def _relative(path: str, mount_root: str) -> str | None:
    if mount_root == "/":
        return path
    if path == mount_root or path.startswith(mount_root + "/"):
        return path[len(mount_root):] or "/"
    return None


def _climbs(path: str) -> bool:
    return ".." in path.split("/")


class Location(NamedTuple):
    """Where a hierarchy's group is. ``problem`` set: the group cannot be read safely and is not read at all."""

    entry: CgroupEntry
    directory: str
    mount_point: str
    guessed: bool = False  # not below any mount's root: the mount point stands for the group (as the JVM reads)
    problem: str | None = None
    search_depth: int = 0  # > 0: a namespace that kept the outer mount; the group is this many levels below it


def _best_mount(path: str, candidates: list[Mount]) -> tuple[Mount, str] | None:
    """The mount whose root is the longest prefix of ``path`` (the deepest view of our group), the first on a tie."""
    best: tuple[Mount, str] | None = None
    for mount in candidates:
        rel = _relative(path, mount.root)
        if rel is not None and (best is None or len(mount.root) > len(best[0].root)):
            best = mount, rel
    return best


def locate(entries: list[CgroupEntry], mounts: list[Mount], version: int) -> Location | None:
    """The memory hierarchy's group of ``version``, or None where there is no such hierarchy."""
    if version == 1:
        entry = next((e for e in entries if "memory" in e.controllers), None)
        candidates = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
    else:
        entry = next((e for e in entries if e.hierarchy == 0 and not e.controllers), None)
        candidates = [m for m in mounts if m.fstype == "cgroup2"]
    if entry is None or not candidates:
        return None
    found = _best_mount(entry.path, candidates)
    # Outside the reader's cgroup namespace (``/../../user.slice/x.scope``): only a mount whose root has the same
    # ``/..`` form shows it; anything else would resolve to a folder outside the mount.
    if _climbs(entry.path) and (found is None or _climbs(found[1])):
        return Location(entry, candidates[0].mount_point, candidates[0].mount_point, problem=(
                f"group {entry.path} is outside this cgroup namespace and no mount shows it: not read"))
    depth, deepest = max(((cgroupns.climbs_only(m.root), m) for m in candidates), key=lambda pair: pair[0],
                         default=(0, None))
    if found is None and deepest is not None and depth:
        return Location(entry, deepest.mount_point, deepest.mount_point, search_depth=depth)
    if found is None:
        # Peers split here; the JVM reads the mount point, and so do we, but say so.
        return Location(entry, candidates[0].mount_point, candidates[0].mount_point, guessed=True)
    mount, rel = found
    return Location(entry, os.path.normpath(os.path.join(mount.mount_point, rel.lstrip("/"))), mount.mount_point)


def _levels(directory: str, mount_point: str) -> list[str]:
    """The group and its parents up to the mount point (parents above a namespace's root are not visible)."""
    levels = [directory]
    while directory != mount_point and directory.startswith(mount_point):
        directory = os.path.dirname(directory)
        levels.append(directory)
    return levels


# -- reading -------------------------------------------------------------------------------------------------------

class _Files(NamedTuple):
    """File names that differ between the versions; which ones are limits is decided in ``decide``."""

    limits: tuple[str, ...]
    usage: str
    inactive_file: tuple[str, ...]  # first present wins: v1's hierarchical total before the group's own
    stat_limit: str | None  # a limit kept in memory.stat
    hierarchy: str | None = None  # v1's memory.use_hierarchy: 0 on a parent keeps its limit off its children

    @property
    def stat_fields(self) -> tuple[str, ...]:
        return self.inactive_file + ((self.stat_limit,) if self.stat_limit else ())


V1 = _Files(V1_LIMIT_FILES, "memory.usage_in_bytes", ("total_inactive_file", "inactive_file"), V1_STAT_LIMIT,
            "memory.use_hierarchy")
V2 = _Files(V2_LIMIT_FILES, "memory.current", ("inactive_file",), None)


class _LevelPaths(NamedTuple):
    """The files of one level, joined once per layout rather than on every reading."""

    directory: str
    stat: str
    limits: tuple[str, ...]
    usage: str
    hierarchy: str | None


def _level_paths(files: _Files, directory: str) -> _LevelPaths:
    return _LevelPaths(directory, os.path.join(directory, "memory.stat"),
                       tuple(os.path.join(directory, name) for name in files.limits),
                       os.path.join(directory, files.usage),
                       None if files.hierarchy is None else os.path.join(directory, files.hierarchy))


def _charged(source: KernelFiles, levels: list[_LevelPaths]) -> list[_LevelPaths]:
    """The levels a charge of the group reaches (v1: up to a parent with ``memory.use_hierarchy`` 0). A missing
    flag file is hierarchical: v2, and v1 since Linux 5.11, have nothing else."""
    flags = [(_read_number(source, level.hierarchy, parse_bytes) if level.hierarchy else None) != 0
             for level in levels]
    return levels[:charged_levels(flags)]


def _read_number(source: KernelFiles, path: str, parse: Callable[[str, str], int | None]) -> int | None:
    text = source.read(path)
    return None if text is None else parse(text, path)


def _read_levels(source: KernelFiles, files: _Files, levels: list[_LevelPaths], physical: int) -> list[GroupLevel]:
    """The raw numbers of each level, from the group up. A parent with no limit of its own cannot bind where none
    comes from above the levels seen (v1's ``hierarchical_memory_limit`` on the group is none) and a level below it
    has a usage: ``combine_levels`` takes neither its usage nor its page cache, so neither is read. Every placement
    takes a reading, and on a host with unlimited parents their ``memory.stat`` was a third of it (7 µs each)."""
    read: list[GroupLevel] = []
    for paths in levels:
        limits = tuple((_read_number(source, path, parse_limit), path) for path in paths.limits)
        if read and _cannot_bind(read[0], limits, files, physical):
            read.append(GroupLevel(limits + ((None, paths.stat),) if files.stat_limit else limits, None, 0))
        else:
            read.append(_read_level(source, files, paths, limits))
    return read


def _cannot_bind(group: GroupLevel, limits: tuple[tuple[int | None, str], ...], files: _Files,
                 physical: int) -> bool:
    """Whether a parent with its own ``limits`` is left out of ``combine_levels``' sums; ``group``: the first
    level read."""
    if group.usage is None or smallest_limit(limits, physical)[0] is not None:
        return False
    if files.stat_limit is None:
        return True
    inherited = group.limits[-1][0]  # v1's hierarchical_memory_limit; None where memory.stat could not be read
    return inherited is not None and effective_limit(inherited, physical) is None


def _read_level(source: KernelFiles, files: _Files, paths: _LevelPaths,
                limits: tuple[tuple[int | None, str], ...]) -> GroupLevel:
    """The raw numbers of one level whose own ``limits`` are read."""
    stat_text = source.read(paths.stat)
    stats = {} if stat_text is None else parse_stat_fields(stat_text, paths.stat, files.stat_fields)
    if files.stat_limit is not None:
        limits += ((stats.get(files.stat_limit), paths.stat),)
    usage = _read_number(source, paths.usage, parse_bytes)
    inactive = next((stats[name] for name in files.inactive_file if name in stats), 0)
    return GroupLevel(limits, usage, inactive)


class Layout:
    """What ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` say, and the texts it was made from: a reading
    whose texts are the same keeps the layout (and where its groups are) instead of parsing and locating again.
    A plain class, and the readings' parts named tuples: a frozen dataclass takes ~7x as long to define, on the
    first store's path (issue 29 item 4)."""

    def __init__(self, entries: list[CgroupEntry], mounts: list[Mount],
                 texts: tuple[str | None, str | None] = (None, None),
                 located: dict[int, Location | None] | None = None) -> None:
        self.entries = entries
        self.mounts = mounts
        self.texts = texts
        self.located = {} if located is None else located  # by version: ``locate``, ``in_namespace``
        # The levels a charge reaches, found once: v1 refuses to change a group's use_hierarchy while it has
        # children, and every parent of ours has one (us).
        self._charged: dict[int, list[_LevelPaths]] = {}

    def locate(self, version: int) -> Location | None:
        return self.located.get(version)

    @cached_property
    def level_paths(self) -> dict[int, list[_LevelPaths]]:
        """The files of each level of each readable group, from the group up."""
        paths = {}
        for version, files in ((1, V1), (2, V2)):
            found = self.located.get(version)
            if found is not None and not found.problem:
                paths[version] = [_level_paths(files, level) for level in _levels(found.directory, found.mount_point)]
        return paths

    def charged_paths(self, version: int, source: KernelFiles) -> list[_LevelPaths]:
        """``level_paths`` of ``version`` up to where the group's charges stop."""
        if version not in self._charged:
            self._charged[version] = _charged(source, self.level_paths[version])
        return self._charged[version]

    @property
    def v2_directory(self) -> str | None:
        """The v2 group directory (also on hybrid hosts, where only PSI lives there); None without a v2 mount or
        where the group cannot be read safely."""
        found = self.locate(2)
        return None if found is None or found.problem else found.directory


def read_layout(source: KernelFiles, known: Layout | None = None) -> Layout:
    """The layout now; ``known`` itself where both files read as they did when it was made."""
    mountinfo = source.read_if_changed("/proc/self/mountinfo", known.texts[1] if known else None)
    texts = source.read("/proc/self/cgroup"), mountinfo
    if known is not None and known.texts == texts:
        return known
    cgroup_text, mounts_text = texts
    entries = [] if cgroup_text is None else parse_self_cgroup(cgroup_text)
    mounts, skipped = ([], []) if mounts_text is None else parse_mountinfo_lines(mounts_text)
    for line in skipped:  # once per text of the file: a reading whose texts are the same keeps its layout
        logger("apsi_memory.limits").warning("/proc/self/mountinfo: skipped line %r, which is not a mountinfo line; "
                                             "read the rest", line)
    located = {version: in_namespace(source.root, locate(entries, mounts, version)) for version in (1, 2)}
    return Layout(entries, mounts, texts, located)


def in_namespace(root: str, found: Location | None) -> Location | None:
    """``found``, with a group searched for in a namespace that kept the outer mount (``cgroupns``) made the
    folder that holds our pid, or a problem where none does: never the mount point, the host's root group."""
    if found is None or not found.search_depth:
        return found
    directory, why = cgroupns.find_group(root, found.mount_point, found.search_depth, found.entry.path)
    if directory is None:
        return Location(found.entry, found.directory, found.mount_point, problem=(
            f"group {found.entry.path} is the root of a cgroup namespace below {found.mount_point} (mount root "
            f"{'/..' * found.search_depth}) and {why}: not read"))
    return Location(found.entry, directory, found.mount_point)


def _own_limits(read: list[GroupLevel], files: _Files, physical: int) -> list[int | None]:
    """Each level's own smallest limit: its own limits come first in its ``limits``; the one kept in memory.stat is
    inherited. (Looked up only under a limit: without one no level binds, and every reading would pay for it.)"""
    return [smallest_limit(level.limits[:len(files.limits)], physical)[0] for level in read]


def read_cgroup_memory(physical: int, source: KernelFiles, layout: Layout) -> CgroupMemory | str | None:
    """The memory cgroup of this process; None where there is none to read (bare host, no controller on any level);
    a sentence saying why where there is one but it must not be read (outside our namespace)."""
    problem = None
    for version, files in ((1, V1), (2, V2)):
        found = layout.locate(version)
        if found is None:
            continue
        if found.problem:
            problem = problem or found.problem
            continue
        levels = layout.charged_paths(version, source)
        read = _read_levels(source, files, levels, physical)
        group = combine_levels(read, physical)
        if group is not None:
            at = None if group.limit is None else binding_level(_own_limits(read, files, physical), group.limit)
            directories = [paths.directory for paths in levels] if version == 2 else []
            return CgroupMemory(version, found.entry.path, found.directory, group.limit, group.limit_file,
                                group.working_set, group.free, found.guessed,
                                None if at is None else levels[at].directory, cgroup_v2.high_events(source, directories),
                                cgroup_v2.oom_group(source, directories, at) if directories else None)
    return problem
