"""apsi_memory on Dask (the ``apsi-memory[dask]`` extra): workers with the memory limit this machine really has,
paused when memory pressure is high, and ``memory.map(fn, x, rows, engine=client)`` on a cluster.

    from apsi_memory.dask import cluster
    client = cluster().get_client()

Why
---
``distributed`` sizes a worker from ``distributed.system.MEMORY_LIMIT``, read once at import from five fixed
cgroup paths: inside a 1 GiB child v1 group it saw 23.5 GiB, so two workers got 11.8 GiB each and the kernel
killed them. Here the limit comes from ``apsi_memory.limits()`` (the group of this process, every limit up the
hierarchy, ``memory.high``), split by the rule ``decide.worker_memory_limit``.

Where the limit is set
----------------------
The scheduler keeps the limit a worker registered with, so it must be set before the worker starts: by
``cluster()`` (a ``LocalCluster``), by ``dask worker --preload-nanny apsi_memory.dask`` (``dask_setup`` below, on
each machine), or, for a cluster already running, by registering ``MemoryLimitPlugin`` (a ``NannyPlugin`` that
restarts the workers with the new limit). A ``WorkerPlugin`` would be too late.

Pausing
-------
dask un-pauses any paused worker whose RSS is under its pause fraction every 100 ms, so ``PressurePlugin`` owns
pausing: it switches dask's own pause off on its worker and applies both rules (the pressure level, and RSS at the
pause fraction of the limit). A pause always ends (``decide.worker_pause_step``): a worker resumes on its own need
(its memory, and the group's free memory against its next tasks), after ``OWN_PAUSE_GRACE_S`` where only its own
memory holds it and the group has room, and after ``MAX_PAUSE_S`` whatever holds it.

Admission
---------
``cluster()``'s workers (``admission.AdmittedWorker``) start a task only where the group has room for what it will
need, or where no other task of the cluster runs (``decide.task_admitted``): the pause, read every 100 ms, let
four tasks of 128 MiB chunks start together in 1 GiB. Where the group runs out of memory all the same, the kernel
kills a worker first (``oom_score_adj``), not the client, the scheduler or a process beside the cluster.

``tasks`` holds what runs on the workers for ``map`` and ``to_dask``; ``settings`` the dask settings read here
(``apsi-memory.max-pause``, and dask's own ``distributed.worker.memory.*``: followed where stricter, else a
WARNING).

May import: decide, system, adapters, machinery, arrays, blocks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import pickle
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Iterable
from functools import partial
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError, BudgetWarning, MissingExtraError

try:
    import dask
    from dask.utils import parse_bytes
    from distributed import LocalCluster, Nanny, Worker
    from distributed.core import Status
    from distributed.diagnostics.plugin import NannyPlugin
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtraError("apsi_memory.dask needs dask and distributed: pip install 'apsi-memory[dask]' "
                            "(in a checkout: pip install '.[dask]')") from exc

from .. import decide
from ..adapters.dask_workers import family, group_dask
from ..decide import chunk_bytes, nanny_limit_now
from ..machinery.machines import machine
from ..units import fmt_size
from .admission import killed_first, note_chunk, preload_admission
from .chunks import largest_chunk, name_big_chunks, watch_submissions
from .nanny import GroupNanny, kill_when_group_full, worker_rss
from .pausing import PressurePlugin
from .settings import CHUNK_SETTING, follow_limit, max_pause_s, memory_lines, restore, settings_now, worker_side
from .tasks import map_on_cluster, to_dask

__all__ = ["MemoryCluster", "MemoryLimitPlugin", "PressurePlugin", "chunk_bytes", "cluster", "dask_setup",
           "follow_limit", "map_on_cluster", "max_pause_s", "to_dask", "worker_memory_limit"]

WORKERS_ENV = "APSI_DASK_WORKERS"  # how many workers share this machine, for dask_setup (default: its nannies)
# Under "distributed": its logging setup (INFO, to stderr) shows these lines in worker and cluster logs; ours alone
# would need the caller to configure logging, and the limit line never appeared.
logger = logging.getLogger("distributed.apsi_memory")


def worker_memory_limit(n_workers: int, nthreads: int = 1,
                        outside_bytes: int = decide.DASK_OUTSIDE_WORKERS_BYTES) -> int:
    """Bytes per worker when ``n_workers`` share the memory this process has (``decide.worker_memory_limit``)."""
    return decide.worker_memory_limit(machine().limits().usable_bytes, n_workers, nthreads, outside_bytes)


def cluster(n_workers: int | None = None, threads_per_worker: int = 1, **kw: Any) -> Any:
    """A ``distributed.LocalCluster`` whose workers have the right memory limit and run ``PressurePlugin``, and whose
    dask settings follow that limit (``decide.dask_settings``: array chunk size, p2p buffers, rechunk method; set
    here and on the workers, except any the caller set to a value other than dask's default, and set back here when
    the cluster closes; the chunk size sits between dask's own spill target and pause lines as the caller set
    them, ``decide.workers.worker_lines``). ``scale`` and ``adapt`` share the memory again between the new number
    of workers; this process's open clusters share one group (their workers count, and get the share too). ``n_workers=None``: one per core (``threads_per_worker`` cores each), fewer if memory cannot hold
    that many. Other keywords go to ``LocalCluster`` (``memory_limit`` there overrides the rule and is kept on
    ``scale``, with a ``BudgetWarning`` when it is more than the share; ``"auto"`` is the rule, the group's share,
    not dask's share of the host). With processes (the default), each task waits for room in the group
    (``admission``), and the kernel kills a worker before any other process of the group."""
    if n_workers is None:
        n_workers = _workers_that_fit(max(1, machine().cores() // threads_per_worker), threads_per_worker)
    fixed = kw.get("memory_limit")
    fixed = None if fixed == "auto" else fixed  # dask's "auto" is the host's share; the group's is ours
    share = worker_memory_limit(n_workers + _workers_elsewhere(), threads_per_worker)  # with open clusters'
    limit = _limit_bytes(fixed) if fixed is not None else share
    if limit > share:
        warnings.warn(BudgetWarning(f"cluster(memory_limit={fixed!r}): {fmt_size(limit)} is more than each of "
                                    f"{n_workers} workers' share of the memory here, {fmt_size(share)} "
                                    f"({machine().limits().source}); kept, but the kernel may kill them first"),
                      stacklevel=2)
    kw["memory_limit"] = limit
    kw["plugins"] = (*kw.get("plugins", ()), PressurePlugin())  # copied per worker in its setup
    if kw.get("processes", True):
        kw.setdefault("worker_class", GroupNanny)  # kills a worker over its share only when the group is full
    if isinstance(kw.get("worker_class"), type) and issubclass(kw["worker_class"], GroupNanny):
        kw["admission"] = tempfile.mkdtemp(prefix="apsi-admission-", dir=kw.get("local_directory"))  # its tasks'
    before = settings_now(decide.dask_settings(limit, threads_per_worker))
    settings = follow_limit(limit, threads_per_worker)
    try:
        with dask.config.set({"distributed.worker.memory.pause": False}):  # PressurePlugin pauses: dask undoes it
            made = MemoryCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, **kw)
    except BaseException:
        restore(before)
        _remove(kw.get("admission"))
        raise
    made.fixed_limit, made.config_before, made.arrays_named = fixed is not None, before, set()
    made.admission = kw.get("admission")
    _open.add(made)
    watch_submissions(_check_chunks)
    _share_elsewhere(made, share, settings)
    return made


_open: weakref.WeakSet[MemoryCluster] = weakref.WeakSet()  # this process's clusters: they share one group


def _workers_elsewhere(cluster: Any = None) -> int:
    """The workers of this process's open clusters other than ``cluster``: they live in the same group."""
    return sum(len(other.worker_spec) for other in _others(cluster))


def _others(cluster: Any = None) -> list[MemoryCluster]:
    """This process's open clusters other than ``cluster`` (all of them for None)."""
    return [other for other in list(_open) if other is not cluster and other.status == Status.running]


def _share_elsewhere(cluster: Any, limit: int, settings: dict[str, int | str]) -> None:
    """Give ``limit`` to the workers of this process's other open clusters (each running one spills down to a
    smaller limit first), as ``share_between`` does."""
    for other in _others(cluster):
        if other.fixed_limit:
            continue
        other.new_spec["options"]["memory_limit"] = limit
        other._share_on_its_loop(limit, settings)
        logger.info("apsi_memory: worker memory limit %s for the %d workers of another cluster of this process",
                    fmt_size(limit), len(other.worker_spec))


def _check_chunks(client: Any, graph: Any) -> None:
    """Names the arrays sent to one of this process's clusters with chunks its workers do not fit, each once."""
    address = getattr(getattr(client, "scheduler", None), "address", None)
    for made in _others():
        if made.scheduler_address == address:
            name_big_chunks(graph, *made.chunk_fits(), made.arrays_named)
            if made.admission:
                note_chunk(made.admission, largest_chunk(graph))


def _give_back(closed: Any) -> None:
    """The memory a closed cluster's workers had goes back to this process's other clusters."""
    left = [other for other in _others(closed) if not other.fixed_limit]
    if left:
        left[0].share_between(len(left[0].worker_spec))


def _limit_bytes(limit: str | float, nthreads: int = 1) -> int:
    """A ``memory_limit`` as dask reads it (``"auto"``: its share of what dask thinks the machine has)."""
    from distributed.worker_memory import parse_memory_limit

    return int(parse_memory_limit(limit, nthreads, logger=logger) or 0)


def _dask_chose(limit: int, nthreads: int) -> bool:
    """Whether ``limit`` is one dask picks itself: ``dask worker``'s ``auto`` (the host's share for ``nthreads``),
    or a ``LocalCluster``'s host split between its workers. Anything else was given with ``--memory-limit``."""
    from distributed.system import MEMORY_LIMIT

    split = {int(MEMORY_LIMIT * min(1, 1 / n)) for n in range(1, 257)}  # LocalCluster's "auto" for n workers
    return limit == _limit_bytes("auto", nthreads) or limit in split


class MemoryCluster(LocalCluster):
    """``cluster()``'s ``LocalCluster``: ``scale(n)``, ``scale(cores=…)`` or ``scale(memory=…)`` (and ``adapt``, up
    or down) gives every
    worker, running or new, ``worker_memory_limit(n)`` and the dask settings that follow from it; a running worker
    over a smaller share spills down to it before its nanny applies it (``decide.nanny_limit_now``)."""

    fixed_limit = False
    config_before: dict[str, tuple[Any, bool]] | None = None  # dask.config before cluster(): restored at close
    _sharing: asyncio.Future[None] | None = None  # the last share started from the event loop, kept till done
    arrays_named: set[str]  # the arrays sent here whose chunks were too big, named once each (cluster() sets it)
    _fits: tuple[int, int] = (0, 0)  # a worker limit and the chunk it fits, as chunk_fits read them last
    admission: str | None = None  # the folder of its running tasks (``admission``), removed at close

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            restore(self.config_before or {})
            self.config_before = None
            _open.discard(self)
            _give_back(self)
            _remove(self.admission)

    def scale(self, n: int = 0, memory: str | int | None = None, cores: int | None = None) -> Any:
        # dask's own rules for memory= (against today's share) and cores=, applied here so that they share too
        asked = None if memory is None else parse_bytes(memory)
        if asked is not None:
            n = max(n, math.ceil(asked / self._memory_per_worker()))
        if cores is not None:
            n = max(n, math.ceil(cores / self._threads_per_worker()))
        if n >= 1 and not self.fixed_limit:
            limit = self.share_between(n)
            if asked is not None and asked > n * limit:
                logger.warning("apsi_memory: scale(memory=%r): more workers do not add memory to a group; its %d "
                               "workers share %s (%s each)", memory, n, fmt_size(n * limit), fmt_size(limit))
        return super().scale(n)

    def chunk_fits(self) -> tuple[int, int]:
        """The chunk a worker fits now (``decide.dask_settings``, read again when the share changes) and its limit."""
        limit = int(self.new_spec["options"]["memory_limit"])
        if self._fits[1] != limit:
            advised = decide.dask_settings(limit, self._threads_per_worker(), memory_lines())
            self._fits = (int(advised[CHUNK_SETTING]), limit)
        return self._fits

    async def scale_down(self, workers: Iterable[str]) -> None:
        """``adapt`` retires workers through this, not ``scale``: those left share the memory they freed."""
        await super().scale_down(workers)
        if self.worker_spec and not self.fixed_limit:
            await self._share(*self._new_share(len(self.worker_spec)))

    def share_between(self, n: int) -> int:
        """Set ``worker_memory_limit(n)`` (``n`` and the workers of this process's other open clusters sharing the
        group; they get it too) for the workers to come and those running (each running one spills down to a
        smaller share before its nanny applies it: ``decide.nanny_limit_now``), and its dask settings."""
        limit, settings = self._new_share(n)
        self._share_on_its_loop(limit, settings)
        return limit

    def _share_on_its_loop(self, limit: int, settings: dict[str, int | str]) -> None:
        """``_share`` on this cluster's event loop, waited for unless called from an event loop: ``adapt()`` scales
        from the cluster's own, and another cluster closing on its own loop is not blocked on this one."""
        if _running_loop() is self.loop.asyncio_loop:
            self._sharing = asyncio.ensure_future(self._share(limit, settings))
            return
        done = asyncio.run_coroutine_threadsafe(self._share(limit, settings), self.loop.asyncio_loop)
        if _running_loop() is None:
            done.result()

    def _new_share(self, n: int) -> tuple[int, dict[str, int | str]]:
        """The share of ``n`` workers and this process's other clusters' (who get it too), and its settings."""
        threads = self._threads_per_worker()
        limit = worker_memory_limit(n + _workers_elsewhere(self), threads)
        settings = follow_limit(limit, threads)
        self.new_spec["options"]["memory_limit"] = limit  # the specs of the running workers share this dict
        logger.info("apsi_memory: worker memory limit %s (%d workers)", fmt_size(limit), n)
        _share_elsewhere(self, limit, settings)
        return limit, settings

    async def _share(self, limit: int, settings: dict[str, int | str]) -> None:
        for state in self.scheduler.workers.values():
            state.memory_limit = limit  # what the scheduler plans with
        if self.scheduler.workers:  # first: a worker spills down to a smaller limit before its nanny applies it
            await self.scheduler.broadcast(msg={"op": "run", "function": pickle.dumps(_worker_follows),
                                                "args": pickle.dumps((limit, settings))}, on_error="ignore")
        spill = dask.config.get("distributed.worker.memory.spill") or memory_lines().pause  # dask's, as set here
        for nanny in self.workers.values():
            if isinstance(nanny, Nanny):
                _nanny_follows(nanny, limit, spill)


def _remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _worker_follows(limit: int, settings: dict[str, int | str], dask_worker: Any) -> None:
    """On a running worker: the new limit (its memory monitor spills down to it, and its ``SpillBuffer`` keeps
    that share of it in RAM), and the p2p buffers (read once when the worker started) with it."""
    dask.config.set(settings)
    manager = dask_worker.memory_manager
    manager.memory_limit = limit
    target = manager.memory_target_fraction or manager.memory_spill_fraction
    if target and hasattr(dask_worker.data, "fast") and hasattr(dask_worker.data, "n"):
        dask_worker.data.n = int(limit * target)  # as dask sized it at the start
    shuffle = dask_worker.extensions.get("shuffle")
    for key, limiter in (("distributed.p2p.comm.buffer", "memory_limiter_comms"),
                         ("distributed.p2p.storage.buffer", "memory_limiter_disk")):
        if shuffle is not None and key in settings and hasattr(shuffle, limiter):
            getattr(shuffle, limiter).limit = settings[key]


def _workers_that_fit(wanted: int, nthreads: int) -> int:
    usable = machine().limits().usable_bytes
    for count in range(wanted, 1, -1):
        try:
            decide.worker_memory_limit(usable, count, nthreads)
            return count
        except ValueError:
            continue
    return 1  # and worker_memory_limit says why one does not fit, if it does not


class MemoryLimitPlugin(NannyPlugin):
    """Sets each nanny's worker limit from the machine it runs on, ``workers_per_machine`` sharing it, and
    restarts the workers so that the scheduler registers the new limit: ``client.register_plugin(
    MemoryLimitPlugin(4))`` on a cluster already running (``dask_setup`` does the same at start)."""

    restart = True
    name = "apsi-memory-limit"

    def __init__(self, workers_per_machine: int) -> None:
        self.workers_per_machine = workers_per_machine

    def setup(self, nanny: Any) -> None:
        set_limit(nanny, self.workers_per_machine)


def set_limit(nanny: Any, n_workers: int) -> int:
    limit = worker_memory_limit(n_workers, nanny.nthreads)
    _set_nanny_limit(nanny, limit)
    logger.info("apsi_memory: worker memory limit %s (%d workers on this machine)", fmt_size(limit), n_workers)
    return limit


def _set_nanny_limit(nanny: Any, limit: int) -> None:
    nanny.memory_manager.memory_limit = limit
    _set_worker_kwargs(nanny, limit)


def _set_worker_kwargs(nanny: Any, limit: int) -> None:
    """The limit a worker this nanny starts (or restarts) gets."""
    nanny.worker_kwargs["memory_limit"] = limit
    if nanny.process is not None:  # a restart reuses the worker process's arguments
        nanny.process.worker_kwargs["memory_limit"] = limit


SHRINKING = "apsi-shrink"  # the nanny's periodic callback that lowers its limit once its worker fits under it


def _nanny_follows(nanny: Any, limit: int, spill: float) -> None:
    """A running worker's nanny takes ``limit`` when ``decide.nanny_limit_now`` says so: at once, or (a smaller one
    its worker is over) checked as often as the nanny checks its worker's memory, till the worker has spilled
    down to it. A worker it starts gets ``limit`` in any case."""
    from tornado.ioloop import PeriodicCallback

    _set_worker_kwargs(nanny, limit)
    _stop_shrinking(nanny)  # an earlier share's
    step = partial(_nanny_step, nanny, limit, spill)
    nanny.periodic_callbacks[SHRINKING] = PeriodicCallback(step, nanny.memory_manager.memory_monitor_interval * 1000)
    step()
    if SHRINKING in nanny.periodic_callbacks:
        nanny.periodic_callbacks[SHRINKING].start()
        logger.info("apsi_memory: worker %s keeps its %s limit until it has spilled down to its new share, %s",
                    nanny.worker_address, fmt_size(nanny.memory_manager.memory_limit), fmt_size(limit))


def _nanny_step(nanny: Any, limit: int, spill: float) -> None:
    manager = nanny.memory_manager
    manager.memory_limit = nanny_limit_now(worker_rss(nanny), manager.memory_limit or limit, limit, spill)
    if manager.memory_limit == limit:
        _stop_shrinking(nanny)


def _stop_shrinking(nanny: Any) -> None:
    callback = nanny.periodic_callbacks.pop(SHRINKING, None)
    if callback is not None:
        callback.stop()


def dask_setup(server: Any) -> Any:
    """``dask worker --preload-nanny apsi_memory.dask`` (or ``--preload``): the right limit before the worker
    registers, and ``PressurePlugin`` on it (which switches dask's own pausing off). An explicit
    ``--memory-limit`` is kept (with a WARNING when it is more than the group's share). The workers sharing the
    machine are ``APSI_DASK_WORKERS`` (or the ``apsi-memory.workers`` dask setting) when set, else the most of this
    process's nannies serving the same scheduler and the workers of the ``dask worker`` processes in this cgroup
    (``adapters.dask_workers``). Where no scheduler runs in this process the memory kept outside the workers is
    ``DASK_WORKER_PROCESS_BYTES`` per ``dask worker`` process, plus the client's 256 MiB where another Python
    process (a ``dask scheduler``, a client) shares the group: only a worker-only pod goes without it."""
    if isinstance(server, Nanny):
        return _setup_nanny(server)
    if isinstance(server, Worker):
        return _setup_worker(server)
    raise ArgumentTypeError(f"apsi_memory.dask preloads into a dask worker or nanny, not a {type(server).__name__}: "
                            "use dask worker --preload-nanny apsi_memory.dask")


def _setup_nanny(nanny: Any) -> None:
    limit = _chosen_limit(nanny.memory_manager.memory_limit, nanny.nthreads, _nannies_here(nanny),
                          scheduler_here=bool(_schedulers_here()))
    _set_nanny_limit(nanny, limit)
    # The nanny took its config, which it hands to its workers, before its preload ran: p2p's settings go there,
    # into a deep copy (the nanny's is a shallow one, whose sections are this process's own).
    nanny.config = dask.config.merge(nanny.config)
    dask.config.set(worker_side(limit, nanny.nthreads), config=nanny.config)
    kill_when_group_full(nanny)
    preload_admission(nanny)
    nanny.worker_kwargs["plugins"] = (*nanny.worker_kwargs.get("plugins", ()), PressurePlugin())


def _setup_worker(worker: Any) -> Any:
    if any(isinstance(p, PressurePlugin) for p in (*worker._pending_plugins, *worker.plugins.values())):
        return None  # the nanny preload did it already
    killed_first()  # but admission needs the worker's class, chosen before a worker's own preload runs
    start = family(machine().root)
    limit = _chosen_limit(worker.memory_manager.memory_limit, worker.state.nthreads, start.spawned,
                          scheduler_here=not start.worker_only)
    worker.memory_manager.memory_limit = limit
    fraction = dask.config.get("distributed.worker.memory.transfer")
    if fraction is not False:
        worker.state.transfer_incoming_bytes_limit = int(limit * fraction)
    return worker.plugin_add(PressurePlugin())  # a coroutine: the preload awaits it before the worker registers


def _chosen_limit(current: int | None, nthreads: int, here: int, scheduler_here: bool) -> int:
    """The limit a worker starts with: the one given with ``--memory-limit``, else its share of this machine
    between ``here`` workers (this ``dask worker``'s) or those of every ``dask worker`` in the group, if more,
    less what the rest of the group keeps (``decide.dask_outside_bytes``: a scheduler or client there counts)."""
    group = group_dask(machine().root)
    count = workers_from_env() or max(here, sum(group.workers), 1)
    outside = decide.dask_outside_bytes(scheduler_here, len(group.workers), group.others)
    share = worker_memory_limit(count, nthreads, outside)
    if current is not None and not _dask_chose(current, nthreads):
        if current > share:
            logger.warning("apsi_memory: --memory-limit %s kept, but it is more than this worker's share of "
                           "the memory here (%s: %d workers); the kernel may kill it first",
                           fmt_size(current), fmt_size(share), count)
        return current
    logger.info("apsi_memory: worker memory limit %s (%d workers on this machine)", fmt_size(share), count)
    return share


def workers_from_env() -> int | None:
    """``APSI_DASK_WORKERS``, else the dask setting ``apsi-memory.workers`` (``DASK_APSI_MEMORY__WORKERS``)."""
    for name, value in ((WORKERS_ENV, os.environ.get(WORKERS_ENV)),
                        ("apsi-memory.workers", dask.config.get("apsi-memory.workers", default=None))):
        if value in (None, ""):
            continue
        text = str(value)
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise ArgumentError(f"{name}={value!r}: the number of dask workers on this machine, a whole number")
        return int(text)
    return None


def _schedulers_here() -> list[Any]:
    from distributed import Scheduler

    return [scheduler for scheduler in list(Scheduler._instances) if scheduler.status != Status.closed]


def _nannies_here(nanny: Any) -> int:
    """The nannies of this process that serve the same scheduler (``dask worker --nworkers N`` makes N)."""
    return max(1, sum(1 for other in list(Nanny._instances) if other.scheduler_addr == nanny.scheduler_addr))
