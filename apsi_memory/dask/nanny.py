"""``cluster()``'s nannies (and the preload's): a worker over its terminate line is killed only when its group is
nearly full too (``decide.nanny_kills``). dask's nanny kills at 95 % of the worker's limit whatever the group holds:
in a 1 GiB group a task of dask's 128 MiB chunks needs more than a worker's share, and was killed while the group
had room, where stock dask, whose workers think they have the host, finished."""

from __future__ import annotations

from functools import partial
from typing import Any

from distributed import Nanny

from ..decide import nanny_kills
from ..machinery.machines import machine
from .admission import AdmittedWorker, child_killed_first

MONITOR = "memory_monitor"  # dask's name for the nanny's periodic check
SCORED = "_apsi_scored_pid"  # the nanny's worker process whose OOM score the check has set
# The workers this process's nannies killed for a full group, until they have gone: the group's reading still
# counts their memory, and the other nannies killed theirs too (three of four workers in the same 100 ms, where
# one worker's memory was enough).
_dying: set[int] = set()


class GroupNanny(Nanny):
    """A ``Nanny`` whose memory check asks the group first (``kill_when_group_full``); given ``admission`` (a
    folder of ``cluster()``'s), its workers are ``AdmittedWorker``s: each task waits for room in the group."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("admission"):
            kwargs.setdefault("worker_class", AdmittedWorker)
        super().__init__(*args, **kwargs)
        kill_when_group_full(self)


def kill_when_group_full(nanny: Any) -> None:
    """Replace the nanny's memory check (where dask made one) by ``group_check``."""
    from tornado.ioloop import PeriodicCallback

    old = nanny.periodic_callbacks.get(MONITOR)
    if old is None:
        return
    new = PeriodicCallback(partial(group_check, nanny), nanny.memory_manager.memory_monitor_interval * 1000)
    nanny.periodic_callbacks[MONITOR] = new
    if old.is_running():  # the preload runs after the nanny started its callbacks
        old.stop()
        new.start()


def group_check(nanny: Any) -> None:
    """dask's check, which kills its worker over the terminate line, run only where ``decide.nanny_kills`` says so
    and no worker another nanny here killed is still going; the group is read only when the worker is over that
    line. A worker it has not seen before is first made the kernel's first choice (``child_killed_first``)."""
    process = getattr(nanny.process, "process", None)
    pid = getattr(process, "pid", None)
    if pid and pid != getattr(nanny, SCORED, None):
        setattr(nanny, SCORED, pid)
        child_killed_first(pid)
    manager = nanny.memory_manager
    terminate = manager.memory_terminate_fraction
    rss = worker_rss(nanny)
    if not manager.memory_limit or terminate is False or rss <= terminate * manager.memory_limit:
        return
    pid = int(nanny.process.process.pid)  # worker_rss found it
    _dying.intersection_update(p for p in _dying if _alive(p))
    if _dying - {pid}:
        return
    limits = machine().limits()
    if nanny_kills(rss, manager.memory_limit, terminate, limits.free_bytes, limits.usable_bytes):
        manager.memory_monitor(nanny)  # a second call for a worker still there sends SIGKILL: dask's own way
        _dying.add(pid)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def worker_rss(nanny: Any) -> int:
    """The RSS of the worker process a nanny runs, as the nanny reads it (0: none running)."""
    import psutil

    process = getattr(nanny.process, "process", None)
    try:
        return int(psutil.Process(process.pid).memory_info().rss) if process and process.pid else 0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
