"""The ``dask worker`` command-line processes in this process's cgroup, counted from ``/proc`` (``apsi_memory.dask``
shares the group's memory between all their workers: two ``dask worker`` processes in one 1 GiB group each took
768 MiB).

Each counts for its ``--nworkers`` (default 1). Processes are matched by their command line only (``dask worker``,
``dask-worker``, ``python -m distributed.cli.dask_worker``) and by a ``/proc/<pid>/cgroup`` identical to this
process's; one that starts later is not seen, so set ``APSI_DASK_WORKERS`` where workers start together. The other
Python processes of the group (a scheduler, a client: ``group_dask``) tell a worker-only pod from one where the
client and scheduler share the memory (there each of 2 workers took 464 MiB of 1 GiB).
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


@dataclass(frozen=True)
class GroupDask:
    """What shares this process's cgroup with its dask workers: the ``--nworkers`` of each ``dask worker`` process,
    and ``others``, the other Python processes (a ``dask scheduler``, a client, a notebook kernel) whose memory is
    the group's too. Processes started by ``multiprocessing`` (a nanny's worker) belong to their parent's count."""

    workers: tuple[int, ...] = ()
    others: int = 0


def group_dask(root: str = "/") -> GroupDask:
    """Read from ``/proc``: the processes whose cgroups are this process's (nothing, where that is not readable)."""
    own = read_text(root, "/proc/self/cgroup")
    if own is None:
        return GroupDask()
    workers, others = [], 0
    for pid in _pids(root):
        if read_text(root, f"/proc/{pid}/cgroup") != own:
            continue
        argv = (read_text(root, f"/proc/{pid}/cmdline") or "").rstrip("\0").split("\0")
        count = parse_nworkers(argv)
        if count:
            workers.append(count)
        elif _is_other_python(argv):
            others += 1
    return GroupDask(tuple(workers), others)


def _is_other_python(argv: list[str]) -> bool:
    """A Python process not started by ``multiprocessing`` (``spawn_main``, its resource tracker): a client,
    a scheduler, a notebook. Small non-Python processes (a container's ``tini`` or ``sh``) do not count."""
    return "python" in os.path.basename(argv[0]) and not any("multiprocessing" in word for word in argv)



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
