"""Our group in a cgroup namespace that kept the outer mount.

``unshare -C`` (kind, Docker-in-Docker, LXC, a private cgroupns with ``/sys/fs/cgroup`` bind-mounted from outside)
makes the process's group the namespace's root: ``/proc/self/cgroup`` says ``0::/``, while the cgroup filesystem
mounted before the unshare still shows the whole hierarchy and its mountinfo root reads ``/..`` (one ``..`` per
level the namespace root lies below the mount's root). Neither file names the group, and the mount point is the
host's root group: reading it plans with the host's RAM. The kernel charges the group whose ``cgroup.procs`` holds
our pid, ``depth`` levels below the mount point; it is searched for there, within ``MAX_SEARCHED`` folders, and
where it is not found the group is not read at all (``problem``) rather than the host's root read as ours.
"""

from __future__ import annotations

import os

from .root import read_text, under

MAX_SEARCHED = 2000  # folders looked at: a node with a few hundred pods and their containers, not a walk of all


def climbs_only(mount_root: str) -> int:
    """How many levels a mount root of only ``..`` (``/..``, ``/../..``) climbs; 0 for any other root."""
    parts = [part for part in mount_root.split("/") if part]
    return len(parts) if parts and all(part == ".." for part in parts) else 0


def parse_stat_pid(text: str) -> int | None:
    """The pid, ``/proc/self/stat``'s first field (None where it is not a number)."""
    first = text.split(" ", 1)[0]
    return int(first) if first.isdigit() else None


def find_group(root: str, mount_point: str, depth: int, relative: str) -> tuple[str | None, str]:
    """The folder ``<mount_point>/<depth levels>/<relative>`` whose ``cgroup.procs`` lists our pid, or None with
    the reason. Symlinks are never followed (a cgroup filesystem has none; a tree that does is not one)."""
    stat = read_text(root, "/proc/self/stat")
    pid = None if stat is None else parse_stat_pid(stat)
    if pid is None:
        return None, "/proc/self/stat gives no pid to look for"
    searched = 0
    level = [mount_point]
    for _ in range(depth):
        below = []
        for folder in level:
            for name in _subfolders(root, folder):
                below.append(os.path.join(folder, name))
                searched += 1
                if searched > MAX_SEARCHED:
                    return None, f"more than {MAX_SEARCHED} groups to search"
        level = below
    for folder in level:
        directory = os.path.normpath(os.path.join(folder, relative.lstrip("/")))
        if _holds(root, directory, pid):
            return directory, ""
    return None, f"no group {depth} level(s) below {mount_point} holds pid {pid}"


def _subfolders(root: str, folder: str) -> list[str]:
    try:
        with os.scandir(under(root, folder)) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _holds(root: str, directory: str, pid: int) -> bool:
    text = read_text(root, os.path.join(directory, "cgroup.procs"))
    return text is not None and str(pid) in text.split()
