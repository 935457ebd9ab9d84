"""Dask workers' rules (used by ``apsi_memory.dask`` and ``apsi-memory dask-limit``, which run without dask):
the memory a worker gets, its chunk size and settings, when it pauses, and blocks in flight on a cluster."""

from __future__ import annotations

from ..errors import ArgumentError
from ..units import fmt_size
from .levels import Level

# -- dask workers (apsi_memory.dask) -------------------------------------------------------------------------------

# What a dask deployment holds outside its workers, in the same memory: the client's interpreter, the scheduler and
# the nannies (all in the process that starts a LocalCluster: 60 MiB measured idle with 2 workers; the scheduler's
# task state grows with the graph) and multiprocessing's resource tracker (12 MiB). Rounded up, with room to grow.
DASK_OUTSIDE_WORKERS_BYTES = 256 * (1 << 20)
# Where only workers run (``dask worker`` in a pod, no client, no scheduler): each ``dask worker`` process's own
# interpreter with its nannies (60 MiB measured with 2), rounded up.
DASK_WORKER_PROCESS_BYTES = 96 * (1 << 20)
# A worker process's own interpreter with numpy and distributed imported (62 MiB measured), rounded up: a limit
# below this leaves no room for any data.
DASK_WORKER_BASE_BYTES = 128 * (1 << 20)
# dask's defaults: a worker spills its stored results down to 60 % of its limit and pauses at 80 %, so what runs
# has the 20 % between the two.
DASK_SPILL_TARGET = 0.60
DASK_PAUSE_FRACTION = 0.80
# One running task holds about three chunks at once (its input, its result, one NumPy temporary).
CHUNKS_PER_TASK = 3
MIN_CHUNK_BYTES = 1 << 20


def worker_memory_limit(usable_bytes: int, n_workers: int, nthreads: int = 1,
                        outside_bytes: int = DASK_OUTSIDE_WORKERS_BYTES) -> int:
    """Bytes per dask worker: the usable memory (the smallest limit up the cgroup hierarchy, ``memory.high``
    included, or the host's) less ``outside_bytes`` (what runs there besides the workers:
    ``DASK_OUTSIDE_WORKERS_BYTES`` for client, scheduler and nannies), shared equally by ``n_workers``. Raises
    ``ArgumentError`` (a ``ValueError``) when that share cannot hold a worker's interpreter plus one 1 MiB chunk per thread."""
    if n_workers < 1 or nthreads < 1:
        raise ArgumentError(f"a dask deployment needs at least 1 worker and 1 thread, not {n_workers} and {nthreads}")
    share = (usable_bytes - outside_bytes) // n_workers
    needed = DASK_WORKER_BASE_BYTES + nthreads * CHUNKS_PER_TASK * MIN_CHUNK_BYTES
    if share < needed:
        raise ArgumentError(f"{fmt_size(usable_bytes)} usable cannot hold {n_workers} dask workers of {nthreads} "
                         f"thread(s): each would get {fmt_size(max(0, share))}, under the {fmt_size(needed)} a "
                         "worker needs; use fewer workers")
    return share


def chunk_bytes(limit_bytes: int, nthreads: int = 1) -> int:
    """The largest power-of-two chunk (at least 1 MiB) such that ``nthreads`` running tasks of
    ``CHUNKS_PER_TASK`` chunks each fit between the spill target and the pause fraction of a worker limit: stored
    results are spilled down to the target, so the tasks never push the worker past the pause fraction."""
    room = int(limit_bytes * (DASK_PAUSE_FRACTION - DASK_SPILL_TARGET)) // (CHUNKS_PER_TASK * max(1, nthreads))
    size = MIN_CHUNK_BYTES
    while size * 2 <= room:
        size *= 2
    return size


# A worker paused for its own memory (RSS at the pause fraction of its limit) resumes once RSS is this much under
# it: the 10 points are hysteresis, so a worker hovering at the fraction does not flip every check.
DASK_RESUME_GAP = 0.10


def worker_pause_cause(level: Level, rss: int, limit: int, paused: bool, pause_level: Level = Level.HIGH,
                       pause_fraction: float = DASK_PAUSE_FRACTION) -> str | None:
    """Why a dask worker should be paused (or stay paused), in words; None when it should run.

    Paused at ``pause_level`` or above, and while its RSS is at ``pause_fraction`` of its ``limit`` (0: no limit)
    or more; a paused worker runs again once the level is under ``pause_level`` (the level table's own hysteresis:
    ``high`` is left above 25 % free, which a cluster whose workers are all paused can reach once they have spilled)
    and its RSS is ``DASK_RESUME_GAP`` under the fraction. Never "back at ok": memory held outside the workers (a
    client's array at 70 % of the group) would keep them paused for good."""
    if level >= pause_level:
        return f"pressure {level}"
    share = rss / limit if limit else 0.0
    if share >= pause_fraction:
        return f"worker memory {share:.0%} of its limit (pauses at {pause_fraction:.0%})"
    if paused and share >= pause_fraction - DASK_RESUME_GAP:
        return f"worker memory {share:.0%} of its limit (resumes under {pause_fraction - DASK_RESUME_GAP:.0%})"
    return None


# p2p rechunks and shuffles hold, on each worker and outside its spillable data, up to ``distributed.p2p.comm.buffer``
# of outgoing shards (1 GiB by default: more than a whole 384 MiB worker) and ``distributed.p2p.storage.buffer``
# of incoming ones (100 MiB). Each gets this share of the worker's limit, so both fit beside the running tasks.
P2P_BUFFER_SHARE = 0.10
# Under this worker limit a rechunk goes through tasks: p2p's fixed cost (10 concurrent 2 MiB messages, its own
# threads, two buffers) leaves too little of a small worker; tasks of ``chunk_bytes`` chunks are spilled as usual.
P2P_MIN_WORKER_BYTES = 512 * (1 << 20)


def dask_settings(limit_bytes: int, nthreads: int = 1) -> dict[str, int | str]:
    """The ``dask.config`` values a worker limit implies: array chunk size (``chunk_bytes``), the two p2p buffers
    and the rechunk method."""
    buffer = max(MIN_CHUNK_BYTES, int(limit_bytes * P2P_BUFFER_SHARE))
    return {"array.chunk-size": chunk_bytes(limit_bytes, nthreads),
            "distributed.p2p.comm.buffer": buffer, "distributed.p2p.storage.buffer": buffer,
            "array.rechunk.method": "p2p" if limit_bytes >= P2P_MIN_WORKER_BYTES else "tasks"}


# A block on a cluster costs a round trip through the scheduler (tens of ms on a busy machine), not a thread switch:
# two per thread in flight left small blocks waiting on latency. More may be in flight while together they hold
# no more input than the default blocks would (``in_flight_bytes``), up to this many.
CLUSTER_MAX_IN_FLIGHT = 256


def cluster_blocks_in_flight(threads: int, block_bytes: int, in_flight_bytes: int) -> int:
    """Blocks of ``map(engine=client)`` in flight at once: two per thread, more for blocks small enough that
    ``in_flight_bytes`` holds more of them (never over ``CLUSTER_MAX_IN_FLIGHT``)."""
    fits = in_flight_bytes // max(1, block_bytes)
    return max(2 * max(1, threads), min(CLUSTER_MAX_IN_FLIGHT, fits))
