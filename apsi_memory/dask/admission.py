"""Group admission for the tasks of ``cluster()``'s workers: a task starts only where the group has room for what it
will need, or where no other task of the cluster runs (``decide.task_admitted``). The pause is read every 100 ms
and the nanny acts after the fact: four tasks of dask's 128 MiB chunks started in the same instant in a 1 GiB
group needed more than it had, and the kernel killed workers where stock dask, by luck, had not.

The tasks running are files in a folder the cluster owns, one a task, each ``flock``'ed by its worker while the
task runs and naming what it needs: a worker killed mid-task leaves a file no one holds, which the next look
removes, so a dead worker never holds a place. Admissions are made one at a time under a lock file of the folder.

Where the group runs out of memory all the same, the kernel kills a worker first (``killed_first``).

``dask worker --preload-nanny apsi_memory.dask`` has no folder of ``cluster()``'s: its nannies start
``AdmittedWorker``s that share one folder per memory group and scheduler (``preload_admission``), made and checked
like the reservation ledger's (``system.trust``), in the same place.

May import: decide, system, adapters, machinery, arrays, blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import itertools
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from distributed import Worker
from distributed.core import Status

from ..adapters.procfs import parse_stat_parent
from ..decide import task_admitted, task_needs_admission, task_start_need
from ..errors import ArgumentError
from ..machinery.ledger_folders import candidate_dirs
from ..machinery.machines import machine
from ..machinery.reservations import group_key
from ..machinery.slots import Statm, outstanding
from ..system import trust
from ..units import fmt_size
from .settings import max_pause_s

logger = logging.getLogger("distributed.apsi_memory")  # as in __init__: dask's logging setup shows it
LOCK = "admit.lock"  # held while one task is admitted
CHUNK = "chunk"  # the largest array chunk sent to the cluster, in bytes: what a task is assumed to need
TASK_SUFFIX = ".task"
TOPIC = "apsi-admission"  # the worker's event (``Client.get_events``) for each task that waits for room
POLL_S = 0.05  # how often a waiting task looks again: tasks of big chunks run for 100s of ms
# The most: where its group is out of memory, the kernel kills the process of the highest score, and this puts a
# worker first. dask recovers a worker (its nanny starts it again and its tasks rerun); the client's or the
# scheduler's death ends the job, and a process beside the cluster is not ours to kill (holding 600 MiB of a 1 GiB
# group, the largest, it was the one killed in every run, stock and cluster()).
OOM_SCORE_ADJ = 1000


class RunningTask:
    """One admitted task's file, locked while it runs."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)  # and its lock with it


class TaskLedger:
    """The tasks of one cluster's workers running in their group, as files in ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._seq = itertools.count()
        self._statm = Statm(machine().root)  # the workers' statm kept open: a pread each look

    async def admit(self, input_bytes: int, still_wanted: Callable[[], bool] = lambda: True,
                    on_wait: Callable[[int], None] = lambda need: None,
                    max_wait: float = float("inf")) -> RunningTask | None:
        """Wait till a task with ``input_bytes`` of inputs may start, and hold its place (None: it needs none,
        ``decide.task_needs_admission``, or ``still_wanted()`` said no first, as for a worker closing);
        ``on_wait(need)`` is called once if it has to wait. After ``max_wait`` seconds it starts all the same, with
        a WARNING: a task that waits on tasks it submitted (``worker_client``) holds a place its children would
        wait for, for ever where the group never has room."""
        need = task_start_need(read_chunk(self.folder), input_bytes)
        if not task_needs_admission(need):
            return None
        started, told = time.monotonic(), False
        while still_wanted():
            task = self.try_admit(need)
            if task is not None:
                return task
            waited = time.monotonic() - started
            if waited >= max_wait:
                limits = machine().limits()
                logger.warning("apsi_memory: a task that needs %s started after %.0f s waiting for room in its group, "
                               "the longest pause (apsi-memory.max-pause): %s free of %s, %d tasks of the cluster "
                               "running", fmt_size(need), waited, fmt_size(limits.free_bytes),
                               fmt_size(limits.usable_bytes), len(self.running()))
                return self._hold(need)
            if not told:
                on_wait(need)
                told = True
            await asyncio.sleep(POLL_S)
        return None

    def try_admit(self, need: int) -> RunningTask | None:
        """The place of a task that needs ``need`` bytes if ``decide.task_admitted`` says it starts now."""
        with _locked(self.folder / LOCK):
            running = self.running()
            limits = machine().limits()
            still_to_take = _outstanding(running, self._rss)
            if not task_admitted(need, limits.free_bytes, limits.usable_bytes, len(running), still_to_take):
                return None
            return self._hold(need)

    def running(self) -> list[tuple[int, int, int]]:
        """(pid, need, its RSS when the task started) of each task running; files no one holds are removed."""
        found = []
        for path in self.folder.glob(f"*{TASK_SUFFIX}"):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # it ended meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its task runs
                found.append(_entry(path, os.read(fd, 100)))
            else:  # its worker is gone (or the task ended a moment ago): not running
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            finally:
                os.close(fd)
        return [entry for entry in found if entry is not None]

    def _rss(self, pid: int) -> int:
        """``pid``'s anonymous memory, what its tasks grow (0: gone, or not readable)."""
        return self._statm.anon_rss(pid) or 0

    def _hold(self, need: int) -> RunningTask:
        path = self.folder / f"{os.getpid()}-{next(self._seq)}{TASK_SUFFIX}"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()} {need} {self._rss(os.getpid())}".encode())
        return RunningTask(path, fd)


def _entry(path: Path, text: bytes) -> tuple[int, int, int] | None:
    try:
        pid, need, rss = (int(part) for part in text.split())
    except ValueError:
        return None  # not written yet: the lock is taken before the line is (a moment, under the admission lock)
    return pid, need, rss


def _outstanding(running: list[tuple[int, int, int]], rss_of: Callable[[int], int]) -> int:
    """What the running tasks will still take: per worker, their needs less what it grew by since the first
    started."""
    needs: dict[int, int] = defaultdict(int)
    start: dict[int, int] = {}
    for pid, need, rss in running:
        needs[pid] += need
        start[pid] = min(start.get(pid, rss), rss)
    return sum(outstanding(need, start[pid], rss_of(pid)) for pid, need in needs.items())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_chunk(folder: Path) -> int:
    """The largest array chunk sent to the cluster (0: none yet)."""
    try:
        return int((folder / CHUNK).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def note_chunk(folder: str | Path, chunk: int) -> None:
    """Keep ``chunk`` as the largest array chunk sent to the cluster if it is larger than the one kept."""
    folder = Path(folder)
    if chunk <= read_chunk(folder):
        return
    new = folder / f"{CHUNK}.{os.getpid()}"
    new.write_text(str(chunk))
    new.replace(folder / CHUNK)  # readers see the old value or the new, never half of one


class AdmittedWorker(Worker):
    """``cluster()``'s worker (started by ``GroupNanny``): each task waits for its admission (``TaskLedger`` in the
    cluster's folder ``admission``) before it runs, and one that has to wait is a ``log_event`` under ``TOPIC``
    (its key and ``need_bytes``); where the group runs out of memory all the same, the kernel kills it before any
    other process of the group (``killed_first``)."""

    def __init__(self, *args: Any, admission: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = TaskLedger(admission) if admission else None
        killed_first()

    async def execute(self, key: Any, *, stimulus_id: str) -> Any:
        ts = self.state.tasks.get(key)
        if self.ledger is None or ts is None:
            return await super().execute(key, stimulus_id=stimulus_id)
        inputs = sum(dep.nbytes or 0 for dep in ts.dependencies)
        task = await self.ledger.admit(inputs, lambda: self.status in (Status.running, Status.paused),
                                       partial(self._waits, key), max_pause_s())
        try:
            return await super().execute(key, stimulus_id=stimulus_id)  # a worker closing: dask's own answer
        finally:
            if task is not None:
                task.close()

    def _waits(self, key: Any, need: int) -> None:
        self.log_event(TOPIC, {"action": "wait", "key": str(key), "need_bytes": need, "worker": self.address})


def killed_first() -> None:
    """Ask the kernel to kill this process first where its group runs out of memory (``OOM_SCORE_ADJ``)."""
    try:
        Path("/proc/self/oom_score_adj").write_text(str(OOM_SCORE_ADJ))
    except OSError as exc:  # no /proc (not Linux): the kernel's own choice stays
        logger.info("apsi_memory: worker %d left to the kernel's choice where its group is full: %s", os.getpid(), exc)


def child_killed_first(pid: int) -> bool:
    """``killed_first`` for ``pid``, a child of this process: a nanny's new worker, which sets its own score only
    once dask is imported, about a second after it starts (a group full in that second had the kernel kill the
    process beside the cluster). Written through a descriptor of the child's ``/proc`` folder, checked to be this
    process's child: a pid the kernel has given to another process since is never written. True where done."""
    try:
        folder = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        with open(os.open("stat", os.O_RDONLY, dir_fd=folder), encoding="utf-8", errors="replace") as stat:
            if parse_stat_parent(stat.read()) != os.getpid():
                return False
        score = os.open("oom_score_adj", os.O_WRONLY, dir_fd=folder)
        try:
            os.write(score, str(OOM_SCORE_ADJ).encode())
        finally:
            os.close(score)
        return True
    except OSError:  # gone meanwhile (its folder's files fail once the process has ended)
        return False
    finally:
        os.close(folder)


def preload_admission(nanny: Any) -> None:
    """The nanny of ``dask worker --preload-nanny apsi_memory.dask`` (its preload runs before it starts its worker)
    starts ``AdmittedWorker``s, their tasks admitted in the folder of its group and scheduler (``shared_folder``;
    without one they still go first where the group is full). A worker class of the user's own is kept, and its
    tasks start without admission (said at INFO)."""
    if nanny.Worker is Worker:
        nanny.Worker = AdmittedWorker
    elif not (isinstance(nanny.Worker, type) and issubclass(nanny.Worker, AdmittedWorker)):
        logger.info("apsi_memory: worker class %s kept: its tasks start without group admission", nanny.Worker)
        return
    if not nanny.worker_kwargs.get("admission"):  # cluster() gave its own
        nanny.worker_kwargs["admission"] = shared_folder(str(nanny.scheduler_addr))


def shared_folder(scheduler: str) -> str | None:
    """The admission folder that the workers of this memory group serving ``scheduler`` share: ``admission-<hash>``
    of the group's ledger name and the address, in the first of the reservation ledger's folders
    (``ledger_folders.candidate_dirs``) where it is, or can be made, a folder of ours that nobody else may write and
    not a symbolic link (``trust.open_folder``); None, said once at INFO, where there is none."""
    try:
        parents = tuple(candidate_dirs())
    except ArgumentError as exc:  # a relative APSI_LEDGER_DIR: refused, the worker runs all the same
        logger.info("apsi_memory: tasks start without group admission: %s", exc)
        return None
    return _trusted_folder(parents, folder_name(scheduler))


def folder_name(scheduler: str) -> str:
    """``admission-<hash>`` of this memory group's ledger name and ``scheduler`` (any text: it is hashed)."""
    key = f"{group_key(machine().memory())}\0{scheduler}".encode()
    return f"admission-{hashlib.sha256(key).hexdigest()[:24]}"


@functools.cache  # once per process: each nanny of dask worker --nworkers N asks
def _trusted_folder(parents: tuple[str, ...], name: str) -> str | None:
    problems = []
    for parent in parents:
        try:
            fd = trust.open_folder(parent)
            try:
                os.close(trust.open_folder(name, dir_fd=fd, shown=os.path.join(parent, name)))
            finally:
                os.close(fd)
            return os.path.join(parent, name)
        except OSError as exc:  # UnsafePathError too: never a worker's crash
            problems.append(str(exc))
    logger.info("apsi_memory: tasks start without group admission (no folder to share): %s", "; ".join(problems))
    return None
