"""Whether a process still runs, by pid and start time: a pid alone is reused, so the spill files and the
siblings' reservations name their owner as ``(pid, start)`` (``/proc/<pid>/stat`` field 22 under
the adapters' root)."""

from __future__ import annotations

import os

from . import procfs
from .root import resolve


def process_start(pid: int) -> str | None:
    """The process's start time as the kernel counts it (``/proc/<pid>/stat`` under the adapters' root), or
    ``None`` when no such process runs.

    Where the root shows no processes (macOS, a fake machine's tree) only the pid can be checked: a live pid
    gives ``"0"``."""
    if procfs.read_start_time(os.getpid()) is None:
        return _start_without_proc(pid)
    return procfs.read_start_time(pid)


def _start_without_proc(pid: int) -> str | None:
    import psutil

    return "0" if psutil.pid_exists(pid) else None


def owner_alive(pid: int, start: str) -> bool:
    """Whether the process that named a file ``(pid, start)`` still runs; a start of ``"0"`` on either side means
    only the pid was known (no ``/proc`` where one of them looked), so the pid alone decides."""
    found = process_start(pid)
    return found is not None and (found == start or "0" in (found, start))


# (pid, root) -> (pid, start) of this process; a fork's child, or another root, has its own
_own: tuple[tuple[int, str], tuple[int, str]] | None = None


def own_owner() -> tuple[int, str]:
    global _own
    asked = (os.getpid(), resolve(None))
    if _own is None or _own[0] != asked:
        _own = (asked, (os.getpid(), process_start(os.getpid()) or "0"))
    return _own[1]
