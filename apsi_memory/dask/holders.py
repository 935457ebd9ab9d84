"""What holds the memory of a worker's group, read from ``/proc`` for the WARNING of a pause that reached
``decide.MAX_PAUSE_S``: the processes whose ``/proc/<pid>/cgroup`` is this process's, each with its RSS.

Read only then (a rare event), not every look: listing ``/proc`` costs milliseconds on a busy host. RSS counts a
shared page in every process that maps it, so the figures are what each holds, not a partition of the group.
"""

from __future__ import annotations

import os

from ..adapters.root import read_text, under

# A holder is named by its command line's first words (``python3 stranger.py``): ``comm`` alone said "python3" for
# the client, the workers and the stranger alike.
NAME_WORDS = 2
NAME_CHARS = 40


def group_holders(root: str = "/") -> list[tuple[int, str, int]]:
    """(pid, name, RSS bytes) of each process in this process's cgroups (empty when ``/proc`` cannot say)."""
    own = read_text(root, "/proc/self/cgroup")
    if own is None:
        return []
    try:
        pids = [int(name) for name in os.listdir(under(root, "/proc")) if name.isdigit()]
    except OSError:
        return []
    found = []
    for pid in pids:
        if read_text(root, f"/proc/{pid}/cgroup") != own:
            continue
        rss = _rss(read_text(root, f"/proc/{pid}/status") or "")
        if rss is not None:  # a kernel thread or a process that ended meanwhile has none
            found.append((pid, _name(root, pid), rss))
    return found


def _rss(status: str) -> int | None:
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "VmRSS":
            words = value.split()
            return int(words[0]) * 1024 if words and words[0].isdigit() else None
    return None


def _name(root: str, pid: int) -> str:
    words = (read_text(root, f"/proc/{pid}/cmdline") or "").rstrip("\0").split("\0")
    shown = " ".join(os.path.basename(word) if index == 0 else word for index, word in enumerate(words[:NAME_WORDS]))
    return shown[:NAME_CHARS] or (read_text(root, f"/proc/{pid}/comm") or "?").strip()
