"""``PressurePlugin``: a dask worker paused under memory pressure and resumed on its own need (the ``Pausing``
section of ``apsi_memory.dask``), its spill buffer halved at ``high`` and emptied at ``critical``.

May import: decide, system, adapters, machinery, arrays, blocks.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import replace
from typing import Any

import dask
from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin

from ..decide import (
    DASK_PAUSE_FRACTION,
    MIN_CHUNK_BYTES,
    Level,
    PauseState,
    WorkerReading,
    chunk_bytes,
    holders_text,
    ram_tier_limit,
    task_need_bytes,
    worker_pause_step,
)
from ..machinery.machines import machine
from ..machinery.watcher import relieve
from .holders import group_holders
from .settings import max_pause_s, memory_lines
from .shards import release_sent_shards

logger = logging.getLogger("distributed.apsi_memory")  # the same logger as the package's (its docstring: why)

class PressurePlugin(WorkerPlugin):
    """Every ``every`` seconds: pause the worker when the pressure level reaches ``level`` or its RSS reaches
    ``pause`` × its limit (sooner where dask's own ``distributed.worker.memory.pause`` or ``terminate`` set here is
    stricter; a looser one, or ``pause: False``, is a WARNING saying what is done instead: ``settings``); at
    ``high`` spill half of what its ``SpillBuffer`` holds in RAM (all of it at ``critical``, via the public
    ``evict()``); at ``critical`` also ``memory.relieve()``. A paused worker resumes
    on its own need (``decide.worker_pause_step``): its RSS 10 points under the pause fraction, and the level under
    ``level`` again or the group's free memory enough for its next tasks (it then runs through that level); held by
    its own memory alone, after ``decide.OWN_PAUSE_GRACE_S`` where the group has that room (it then runs through
    its own line); and after ``max_pause`` seconds paused whatever holds it (default: the dask setting
    ``apsi-memory.max-pause``, else ``decide.MAX_PAUSE_S``; ``float("inf")``: never), with a WARNING naming the
    signal and what holds the group's memory. Each change is logged with ``worker.log_event`` under the topic
    ``apsi-pressure``, and each pause and resume as a WARNING (logger ``distributed.apsi_memory``) naming its
    cause."""

    name = "apsi-pressure"
    topic = "apsi-pressure"

    def __init__(self, level: Level | str = Level.HIGH, every: float = 0.5, pause: float = DASK_PAUSE_FRACTION,
                 max_pause: float | None = None):
        self.level, self.every = Level.parse(level), every
        self.pause = memory_lines(pause, self.level).pause  # dask's own pause or terminate, where stricter
        self.max_pause = max_pause_s(max_pause)
        self.worker: Any = None
        self.seen = Level.OK
        self.paused_here = False
        self.state = PauseState()

    def setup(self, worker: Any) -> None:
        from tornado.ioloop import PeriodicCallback  # distributed's own event loop

        # One instance may be handed to several workers of one process (LocalCluster(processes=False)): each gets
        # a copy of its own, or the last worker's state would be the only one kept and checked.
        own = copy.copy(self)
        own.worker, worker.plugins[self.name] = worker, own
        worker.memory_manager.memory_pause_fraction = False  # we pause: dask's rule would un-pause
        release_sent_shards()  # sent p2p shards held outside the spillable data: this pause could not end
        callback = PeriodicCallback(own.check, self.every * 1000)
        worker.periodic_callbacks[self.name] = callback
        callback.start()

    def teardown(self, worker: Any) -> None:
        callback = worker.periodic_callbacks.pop(self.name, None)
        if callback is not None:
            callback.stop()

    def check(self) -> None:
        here = machine()
        reading = here.pressure()
        level = reading.level
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
        if self.paused_here and self.worker.status != Status.paused:  # resumed by someone else: ours no more
            self.paused_here, self.state = False, replace(self.state, paused=False)
        threads, chunk = self._tasks(limit)
        look = WorkerReading(level, rss, limit, reading.free_bytes, reading.usable_bytes,
                             task_need_bytes(threads, chunk, limit, rss, self.pause), here.clock.now(), reading.cause,
                             task_need_bytes(threads, chunk, 0, rss))
        step = worker_pause_step(look, self.state, self.level, self.pause, self.max_pause)
        if step.change == "pause":
            if self.worker.status != Status.running:
                return  # closing, or paused by another: not ours to pause
            self.worker.status = Status.paused
            self._log("pause", level, rss)
            logger.warning("apsi_memory: worker %s paused: %s", self.worker.address, step.why)
        elif step.change is not None and self.paused_here and self.worker.status == Status.paused:
            self.worker.status = Status.running
            self._log("resume", level, rss)
            if step.change == "bounded":
                used = max(0, reading.usable_bytes - reading.free_bytes)
                logger.warning("apsi_memory: worker %s resumed after %.0f s paused, the longest pause "
                               "(apsi-memory.max-pause): %s still; the group's memory: %s", self.worker.address,
                               look.now - self.state.since, step.why,
                               holders_text(used, reading.usable_bytes, group_holders(here.root), os.getpid()))
            else:
                logger.warning("apsi_memory: worker %s resumed: %s", self.worker.address, step.why)
        self.state, self.paused_here = step.state, step.state.paused

    def _tasks(self, limit: int) -> tuple[int, int]:
        """The worker's threads and the chunk size dask arrays get: what its next tasks need is made of
        (``decide.task_need_bytes``)."""
        from dask.utils import parse_bytes

        threads = int(getattr(self.worker, "nthreads", 1) or 1)
        try:
            chunk = int(parse_bytes(dask.config.get("array.chunk-size")))
        except (TypeError, ValueError, KeyError):
            chunk = chunk_bytes(limit, threads) if limit else MIN_CHUNK_BYTES
        return threads, chunk

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
