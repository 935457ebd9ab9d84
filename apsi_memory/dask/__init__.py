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
pause fraction of the limit).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError, MissingExtraError

try:
    import dask
    from distributed import LocalCluster, Nanny
    from distributed.core import Status
    from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingExtraError("apsi_memory.dask needs dask and distributed: pip install 'apsi-memory[dask]' "
                            "(in a checkout: pip install '.[dask]')") from exc

from .. import decide
from ..decide import DASK_PAUSE_FRACTION, Level, chunk_bytes, ram_tier_limit, worker_pause_cause
from ..machinery import machine
from ..watch import relieve
from .blocks import map_on_cluster, to_dask

__all__ = ["MemoryLimitPlugin", "PressurePlugin", "chunk_bytes", "cluster", "dask_setup", "map_on_cluster",
           "to_dask", "worker_memory_limit"]

WORKERS_ENV = "APSI_DASK_WORKERS"  # how many workers share this machine, for dask_setup (default: its nannies)
logger = logging.getLogger(__name__)


def worker_memory_limit(n_workers: int, nthreads: int = 1) -> int:
    """Bytes per worker when ``n_workers`` share the memory this process has (``decide.worker_memory_limit``)."""
    return decide.worker_memory_limit(machine().limits().usable_bytes, n_workers, nthreads)


def cluster(n_workers: int | None = None, threads_per_worker: int = 1, **kw: Any) -> Any:
    """A ``distributed.LocalCluster`` whose workers have the right memory limit and run ``PressurePlugin``.
    ``n_workers=None``: one per core (``threads_per_worker`` cores each), fewer if memory cannot hold that
    many. Other keywords go to ``LocalCluster`` (``memory_limit`` there overrides the rule)."""
    if n_workers is None:
        n_workers = _workers_that_fit(max(1, machine().cores() // threads_per_worker), threads_per_worker)
    kw.setdefault("memory_limit", worker_memory_limit(n_workers, threads_per_worker))
    kw["plugins"] = (*kw.get("plugins", ()), PressurePlugin())
    with dask.config.set({"distributed.worker.memory.pause": False}):  # PressurePlugin pauses: dask would undo it
        return LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, **kw)


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
    nanny.memory_manager.memory_limit = limit
    if nanny.process is not None:  # a restart reuses the worker process's arguments
        nanny.process.worker_kwargs["memory_limit"] = limit
    logger.info("apsi_memory: worker memory limit %d MiB (%d workers on this machine)", limit >> 20, n_workers)
    return limit


def dask_setup(nanny: Any) -> None:
    """``dask worker --preload-nanny apsi_memory.dask``: the right limit before the worker starts, and
    ``PressurePlugin`` on it (which switches dask's own pausing off). The machine's workers are the nannies of
    this process serving the same scheduler (``dask worker --nworkers``), or ``APSI_DASK_WORKERS`` when several
    ``dask worker`` processes share the machine."""
    if not isinstance(nanny, Nanny):
        raise ArgumentTypeError("apsi_memory.dask is a nanny preload: use --preload-nanny, not --preload")
    from_env = os.environ.get(WORKERS_ENV)
    if from_env and not from_env.isdigit():
        raise ArgumentError(f"{WORKERS_ENV}={from_env!r}: the number of workers on this machine, a whole number")
    count = int(from_env) if from_env else _nannies_here(nanny)
    set_limit(nanny, count)
    nanny.worker_kwargs["plugins"] = (*nanny.worker_kwargs.get("plugins", ()), PressurePlugin())


def _nannies_here(nanny: Any) -> int:
    """The nannies of this process that serve the same scheduler (``dask worker --nworkers N`` makes N)."""
    return max(1, sum(1 for other in list(Nanny._instances) if other.scheduler_addr == nanny.scheduler_addr))


class PressurePlugin(WorkerPlugin):
    """Every ``every`` seconds: pause the worker when the pressure level reaches ``level`` or its RSS reaches
    ``pause`` × its limit; at ``high`` spill half of what its ``SpillBuffer`` holds in RAM (all of it at
    ``critical``, via the public ``evict()``); at ``critical`` also ``memory.relieve()``; resume once the level is
    under ``level`` again (its own hysteresis) and RSS 10 points under the pause fraction
    (``decide.worker_pause_cause``: never "back at ok", which memory held outside the workers can keep from them).
    Each change is logged with ``worker.log_event`` under the topic ``apsi-pressure``, and each pause and resume
    as a WARNING (``apsi_memory.dask``) naming its cause."""

    name = "apsi-pressure"
    topic = "apsi-pressure"

    def __init__(self, level: Level | str = Level.HIGH, every: float = 0.5, pause: float = DASK_PAUSE_FRACTION):
        self.level, self.every, self.pause = Level.parse(level), every, pause
        self.worker: Any = None
        self.seen = Level.OK
        self.paused_here = False

    def setup(self, worker: Any) -> None:
        from tornado.ioloop import PeriodicCallback  # distributed's own event loop

        self.worker = worker
        worker.memory_manager.memory_pause_fraction = False  # we pause: dask's rule would un-pause
        callback = PeriodicCallback(self.check, self.every * 1000)
        worker.periodic_callbacks[self.name] = callback
        callback.start()

    def teardown(self, worker: Any) -> None:
        callback = worker.periodic_callbacks.pop(self.name, None)
        if callback is not None:
            callback.stop()

    def check(self) -> None:
        level = machine().pressure().level
        rss = int(self.worker.monitor.get_process_memory())
        limit = self.worker.memory_manager.memory_limit or 0
        if level != self.seen:
            self._log("level", level, rss)
            self.seen = level
        if level >= Level.HIGH:
            self._spill(level, rss)
        if level >= Level.CRITICAL:
            relieve()
            self._log("relieve", level, rss)
        cause = worker_pause_cause(level, rss, limit, self.paused_here, self.level, self.pause)
        if cause and self.worker.status == Status.running:
            self.worker.status = Status.paused
            self.paused_here = True
            self._log("pause", level, rss)
            logger.warning("apsi_memory: worker %s paused: %s", self.worker.address, cause)
        elif self.paused_here and not cause and self.worker.status == Status.paused:
            self.worker.status = Status.running
            self.paused_here = False
            self._log("resume", level, rss)
            logger.warning("apsi_memory: worker %s resumed: pressure %s, worker memory %s of its limit",
                           self.worker.address, level, f"{rss / limit:.0%}" if limit else "unlimited")

    def _spill(self, level: Level, rss: int) -> None:
        data = self.worker.data
        fast = getattr(data, "fast", None)
        if fast is None or not hasattr(data, "evict"):
            return  # not a SpillBuffer: nothing we can spill
        held = int(getattr(fast, "total_weight", 0))
        keep = ram_tier_limit(held, level)
        spilled = 0
        while int(getattr(fast, "total_weight", 0)) > keep:
            weight = data.evict()
            if weight < 0:  # could not spill (pickling, disk): dask has logged why
                break
            spilled += weight
        if spilled:
            self._log("spill", level, rss, spilled_bytes=spilled)

    def _log(self, action: str, level: Level, rss: int, **more: int) -> None:
        self.worker.log_event(self.topic, {"action": action, "level": level.value, "rss_bytes": rss,
                                           "worker": self.worker.address, **more})
