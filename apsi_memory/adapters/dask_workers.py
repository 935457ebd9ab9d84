"""The ``dask worker`` command-line processes in this process's cgroup, counted from ``/proc`` (``apsi_memory.dask``
shares the group's memory between all their workers: two ``dask worker`` processes in one 1 GiB group each took
768 MiB).

Each counts for its ``--nworkers`` (default 1). Processes are matched by their command line only (``dask worker``,
``dask-worker``, ``python -m distributed.cli.dask_worker``) and by a ``/proc/<pid>/cgroup`` identical to this
process's; one that starts later is not seen, so set ``APSI_DASK_WORKERS`` where workers start together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .root import read_text, under


def parse_nworkers(argv: list[str]) -> int:
    """How many workers a command line starts: 0 unless it is a ``dask worker`` command line, else its
    ``--nworkers`` (``--nprocs`` in old releases); a value that is not a whole number (``auto``) counts as 1."""
    if not _is_dask_worker(argv):
        return 0
    for index, word in enumerate(argv):
        for flag in ("--nworkers", "--nprocs"):
            if word == flag and index + 1 < len(argv):
                return _whole(argv[index + 1])
            if word.startswith(flag + "="):
                return _whole(word.partition("=")[2])
    return 1


def _is_dask_worker(argv: list[str]) -> bool:
    names = [os.path.basename(word) for word in argv[:3]]
    if "dask-worker" in names or "distributed.cli.dask_worker" in argv[:3]:
        return True
    return any(a == "dask" and b == "worker" for a, b in zip(names, argv[1:4]))


def _whole(text: str) -> int:
    return int(text) if text.isdigit() and int(text) > 0 else 1


def dask_workers_in_group(root: str = "/") -> list[int]:
    """The ``--nworkers`` of each ``dask worker`` process whose cgroups are this process's (empty: none seen)."""
    own = read_text(root, "/proc/self/cgroup")
    if own is None:
        return []
    found = []
    for pid in _pids(root):
        if read_text(root, f"/proc/{pid}/cgroup") != own:
            continue
        cmdline = read_text(root, f"/proc/{pid}/cmdline")
        workers = parse_nworkers(cmdline.rstrip("\0").split("\0")) if cmdline else 0
        if workers:
            found.append(workers)
    return found


def _pids(root: str) -> list[str]:
    try:
        return [name for name in os.listdir(under(root, "/proc")) if name.isdigit()]
    except OSError:
        return []


def parse_ppid(status: str) -> str | None:
    """The ``PPid:`` of a ``/proc/<pid>/status`` text."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "PPid":
            return value.strip() or None
    return None


@dataclass(frozen=True)
class Family:
    """A worker process's view of its start: the workers its parent spawned (itself included), and whether it or
    that parent is a ``dask worker`` command (else a client's ``LocalCluster``: the client and scheduler live there)."""

    spawned: int
    worker_only: bool


def family(root: str = "/") -> Family:
    """Read from ``/proc``: the processes that share this one's parent and were started by ``multiprocessing``
    (as a nanny starts its worker), and the parent's command line."""
    status = read_text(root, "/proc/self/status")
    parent = parse_ppid(status) if status else None
    own_argv = (read_text(root, "/proc/self/cmdline") or "").rstrip("\0").split("\0")
    if parent is None:
        return Family(1, parse_nworkers(own_argv) > 0)
    spawned = 0
    for pid in _pids(root):
        text = read_text(root, f"/proc/{pid}/status")
        cmdline = read_text(root, f"/proc/{pid}/cmdline") or ""
        if text and parse_ppid(text) == parent and "spawn_main" in cmdline:
            spawned += 1
    parent_argv = (read_text(root, f"/proc/{parent}/cmdline") or "").rstrip("\0").split("\0")
    return Family(max(1, spawned), parse_nworkers(parent_argv) > 0 or parse_nworkers(own_argv) > 0)
