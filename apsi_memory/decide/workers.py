"""Dask workers' rules (used by ``apsi_memory.dask`` and ``apsi-memory dask-limit``, which run without dask):
the memory a worker gets, its chunk size and settings, when it pauses, and blocks in flight on a cluster."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ArgumentError
from ..units import fmt_size
from .levels import LEVEL_TABLE, Level

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
# dask's own default ``array.chunk-size``, the most advised: for a 64 GiB worker the rule alone gave 4 GiB chunks,
# which leave an array a handful of tasks to spread over the workers, each spilled or moved whole.
MAX_CHUNK_BYTES = 128 << 20


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


def dask_outside_bytes(scheduler_here: bool, worker_processes: int, others: int) -> int:
    """What a group's dask workers leave to the rest of it: ``DASK_OUTSIDE_WORKERS_BYTES`` where the scheduler (and
    so the client, with its ``LocalCluster``) runs in the nannies' process; else ``DASK_WORKER_PROCESS_BYTES`` per
    ``dask worker`` process, plus ``DASK_OUTSIDE_WORKERS_BYTES`` where ``others`` (a scheduler, a client) share the
    group: counted as a worker-only pod, 2 workers beside them took 464 MiB each of 1 GiB."""
    if scheduler_here:
        return DASK_OUTSIDE_WORKERS_BYTES
    return DASK_WORKER_PROCESS_BYTES * max(1, worker_processes) + (DASK_OUTSIDE_WORKERS_BYTES if others else 0)


def chunk_bytes(limit_bytes: int, nthreads: int = 1, target: float = DASK_SPILL_TARGET,
                pause: float = DASK_PAUSE_FRACTION) -> int:
    """The largest power-of-two chunk (at least 1 MiB, at most dask's default ``MAX_CHUNK_BYTES``) such that
    ``nthreads`` running tasks of ``CHUNKS_PER_TASK`` chunks each fit between the spill ``target`` and the ``pause``
    fraction of a worker limit: stored results are spilled down to the target, so the tasks never push the worker
    past the pause fraction."""
    room = int(limit_bytes * max(0.0, pause - target)) // (CHUNKS_PER_TASK * max(1, nthreads))
    size = MIN_CHUNK_BYTES
    while size * 2 <= min(room, MAX_CHUNK_BYTES):
        size *= 2
    return size


# dask's own lines, ``distributed.worker.memory.*``, as a worker reads them: spill stored results down to ``target``
# (or ``spill``, where ``target`` is False), pause at ``pause``, and the nanny kills at ``terminate``. Its defaults
# keep 15 points between pause and terminate: room for the tasks running at the pause to finish.
MEMORY_SETTINGS = ("target", "spill", "pause", "terminate")
DASK_SPILL_FRACTION = 0.70
DASK_TERMINATE_FRACTION = 0.95
PAUSE_TO_TERMINATE = DASK_TERMINATE_FRACTION - DASK_PAUSE_FRACTION


@dataclass(frozen=True)
class WorkerLines:
    """What ``PressurePlugin`` and the chunk rule follow of a worker's memory, as fractions of its limit: stored
    results spilled down to ``target``, a pause at ``pause``; ``notes``: each of the user's dask settings not
    followed, with what is done instead (a WARNING for each)."""

    target: float
    pause: float
    notes: tuple[str, ...] = ()


def worker_lines(user: dict[str, float | bool], pause: float = DASK_PAUSE_FRACTION,
                 level: Level = Level.HIGH) -> WorkerLines:
    """The lines a worker follows, given the ``distributed.worker.memory`` settings the user set (``user``: the
    keys of ``MEMORY_SETTINGS`` set to other than dask's defaults) and the plugin's own ``pause`` and ``level``.

    Stricter ones are followed: a lower ``pause``; a ``terminate`` under 15 points above the pause moves the pause
    under it (as dask's defaults keep them, never under half of ``terminate``); the spill target (``target``, else
    ``spill``) sets the room the chunk rule divides. dask applies ``target``, ``spill`` and ``terminate`` on the
    worker as set. Not followed, with a note: a looser ``pause`` or ``pause: False`` (the plugin owns pausing:
    dask's rule would un-pause what the pressure level paused), and ``target`` and ``spill`` both False (dask then
    spills nothing by memory; the chunk rule keeps dask's 60 %). Raises ``ArgumentError`` for a value dask would
    not take either."""
    for key, value in user.items():
        if key not in MEMORY_SETTINGS or not (value is False or (not isinstance(value, bool)
                                                                 and isinstance(value, (int, float))
                                                                 and 0 < value <= 1)):
            raise ArgumentError(f"dask setting distributed.worker.memory.{key}={value!r}: a fraction of the "
                                "worker's memory limit (over 0, at most 1) or False")
    notes = []
    given = user.get("pause")
    if given is False or (given is not None and given > pause):
        notes.append(f"dask setting distributed.worker.memory.pause={given!r} not followed: apsi_memory pauses "
                     f"each worker at {pause:.0%} of its limit and at pressure {level} (its PressurePlugin owns "
                     "pausing: dask's rule would un-pause what the pressure level paused)")
    elif given is not None:
        pause = float(given)
    terminate = user.get("terminate")
    if terminate is not None and terminate is not False:
        pause = min(pause, max(terminate / 2, terminate - PAUSE_TO_TERMINATE))
    target = user.get("target", DASK_SPILL_TARGET)
    if target is False:
        target = user.get("spill", DASK_SPILL_FRACTION)
    if target is False:
        notes.append("dask settings distributed.worker.memory.target and .spill are False: dask spills nothing "
                     f"by memory; apsi_memory spills at pressure {level} only, and sizes chunks as if results were "
                     f"spilled down to {DASK_SPILL_TARGET:.0%} of the limit")
        target = DASK_SPILL_TARGET
    return WorkerLines(float(target), pause, tuple(notes))


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
    client's array at 70 % of the group) would keep them paused for good. ``PressurePlugin`` applies
    ``worker_pause_step``, which is this rule plus two ways out: its own need, and the longest pause."""
    if level >= pause_level:
        return f"pressure {level}"
    share = rss / limit if limit else 0.0
    if share >= pause_fraction:
        return f"worker memory {share:.0%} of its limit (pauses at {pause_fraction:.0%})"
    if paused and share >= pause_fraction - DASK_RESUME_GAP:
        return f"worker memory {share:.0%} of its limit (resumes under {pause_fraction - DASK_RESUME_GAP:.0%})"
    return None


# -- the pause that always ends (PressurePlugin) --------------------------------------------------------------------
# ``worker_pause_cause`` alone left workers paused for good: ``high`` is left only above 25 % free, and a client or
# neighbour holding the group at 75-80 % used keeps it there whatever the workers spill (a 1-second task hung 2 of
# 2 times where dask alone finished). So a paused worker also resumes on its own need, and no pause outlasts
# ``MAX_PAUSE_S``.

# A worker paused by the group's level resumes once the group's free memory, less the critical line's reserve, holds
# this many times what its next tasks need: workers paused together all resume on one reading, and the factor
# leaves room for two of them; one that runs through the level pauses again under one time its need (hysteresis).
RESUME_NEED_FACTOR = 2
# The longest pause: after it the worker runs through the signal that paused it, with a WARNING naming it and what
# holds the group's memory. Long enough for spilling (seconds) and for a neighbour's peak to pass; a pause that
# lasts longer is held by memory the workers cannot free, and waiting on it is a hang.
MAX_PAUSE_S = 30.0
# A worker paused on its own memory alone (RSS over its pause fraction, the group under no pressure that pauses it)
# resumes after this much where its group holds what its next tasks need: dask spills its stored results every
# 100 ms, so a few seconds spill what can be; what is left (p2p buffers, running tasks' results) no wait frees. Both
# workers of a 2 GiB p2p rechunk of 128 MiB chunks sat out the longest pause at 80-92 % of their limits with 500 MB
# free in the group, 3-5x stock's time. The group stays guarded without the worker's own line: the pause on the
# group's pressure (``high`` unless its need fits, ``critical`` always), each task's admission where ``cluster()``
# runs it (``task_admitted``: a task starts only where the group holds it) and the nanny at under 5 % free
# (``nanny_kills``), as for a worker over its share after the longest pause.
OWN_PAUSE_GRACE_S = 5.0


def task_need_bytes(nthreads: int, chunk: int, limit: int, rss: int,
                    pause_fraction: float = DASK_PAUSE_FRACTION) -> int:
    """What a worker's next tasks need of the group: ``CHUNKS_PER_TASK`` chunks of ``chunk`` bytes per thread, but
    never more than it may grow before its own rule pauses it (``pause_fraction`` of ``limit`` less ``rss``; no
    such cap with ``limit`` 0): a worker of 128 MiB chunks in a 384 MiB limit needs at most 307 MiB less its RSS."""
    tasks = max(1, nthreads) * CHUNKS_PER_TASK * max(0, chunk)
    return tasks if not limit else max(0, min(tasks, int(limit * pause_fraction) - rss))


@dataclass(frozen=True)
class WorkerReading:
    """One look at a dask worker: its group's ``level`` (``signal``: the pressure reading's cause, such as
    ``free ≤ 20 %``), its ``rss`` and ``limit`` (0: none), the group's ``free`` and ``usable`` bytes, what its next
    tasks ``need`` (``task_need_bytes``) and the time ``now`` (seconds, any monotonic scale); ``past_line_need``:
    what they need once it runs past its own pause line (``task_need_bytes`` with no limit: ``need`` is capped at
    what it may grow under that line, nothing for a worker over it), never taken as less than ``need``."""

    level: Level
    rss: int
    limit: int
    free: int
    usable: int
    need: int
    now: float = 0.0
    signal: str | None = None
    past_line_need: int | None = None


@dataclass(frozen=True)
class PauseState:
    """What ``worker_pause_step`` keeps between looks: ``paused`` since ``since``, for ``cause``; ``through``: the
    level the worker runs through (it resumed on its own need or after ``MAX_PAUSE_S`` at that level: only a
    worse one pauses it again); ``own_through``: its own memory was let through after the longest pause;
    ``bounded``: the last resume was the longest pause's (the group's need is not looked at until the signals
    clear)."""

    paused: bool = False
    since: float = 0.0
    cause: str | None = None
    through: Level | None = None
    own_through: bool = False
    bounded: bool = False


@dataclass(frozen=True)
class PauseStep:
    """``worker_pause_step``'s answer: the next ``state``; ``change`` is ``pause``, ``resume`` or ``bounded`` (resumed
    after the longest pause), None when nothing changes; ``why``: the cause of a pause, or what a resume rests on."""

    state: PauseState
    change: str | None = None
    why: str = ""


def critical_reserve(usable: int) -> int:
    """What the group keeps free below a worker's next tasks: the free share that enters ``critical``."""
    return int(usable * LEVEL_TABLE[Level.CRITICAL].enter_free)


def worker_pause_step(reading: WorkerReading, state: PauseState, pause_level: Level = Level.HIGH,
                      pause_fraction: float = DASK_PAUSE_FRACTION, max_pause_s: float = MAX_PAUSE_S) -> PauseStep:
    """One look of ``PressurePlugin``: whether the worker pauses, stays paused, or resumes.

    * It pauses at ``pause_level`` or above (a level it runs through aside), or with its RSS at ``pause_fraction``
      of its limit, as ``worker_pause_cause``.
    * A paused worker resumes on its own need: RSS ``DASK_RESUME_GAP`` under the fraction and, while the level is
      still ``pause_level`` or above (never at ``critical``), the group's free memory less ``critical_reserve``
      at least ``RESUME_NEED_FACTOR`` times ``reading.need``. It then runs through that level, pausing again only
      at a worse one, or when the free memory falls under one time its need.
    * A pause held by its own memory alone resumes after ``OWN_PAUSE_GRACE_S`` where the group's free memory less
      ``critical_reserve`` holds ``RESUME_NEED_FACTOR`` times ``reading.past_line_need`` (never at ``critical``):
      the worker then runs through its own line until its RSS is under it again; one held by the group's pressure
      waits.
    * No pause lasts over ``max_pause_s``: the worker then resumes and runs through the signals it had.
    """
    r, share = reading, (reading.rss / reading.limit if reading.limit else 0.0)
    resume_at = pause_fraction - DASK_RESUME_GAP
    # A signal let through is kept only while it lasts: a later entry into it pauses as the first did.
    through = state.through if r.level >= pause_level else None
    own_through = state.own_through and share >= resume_at
    base = replace(state, through=through, own_through=own_through,
                   bounded=state.bounded and (through is not None or own_through))
    group = _group_cause(r, base, pause_level)
    if not state.paused:
        cause = _own_cause(share, pause_fraction, "pauses at", pause_fraction) if not own_through else None
        cause = cause or group
        if cause is None:
            return PauseStep(base)
        return PauseStep(replace(base, paused=True, since=r.now, cause=cause), "pause", cause)
    own = _own_cause(share, resume_at, "resumes under", resume_at) if not own_through else None
    cause = own or group
    past_line = max(r.need, r.past_line_need or 0)  # room for it is room for ``need``: no group cause holds it
    if own is not None and r.now - state.since >= OWN_PAUSE_GRACE_S and _room_for(r, past_line):
        why = (f"{own} after {r.now - state.since:.0f} s paused on it, but the group has room: {fmt_size(r.free)} "
               f"free for the {fmt_size(past_line)} its next tasks need past its line (resumes at "
               f"{fmt_size(RESUME_NEED_FACTOR * past_line + critical_reserve(r.usable))}); it runs through its line")
        let = max(r.level, state.through or r.level) if r.level >= pause_level else None
        return PauseStep(PauseState(through=let, own_through=True), "resume", why)
    if cause is not None and r.now - state.since >= max_pause_s:
        let = r.level if r.level >= pause_level else None
        return PauseStep(PauseState(through=let, own_through=share >= resume_at, bounded=True), "bounded", cause)
    if cause is not None:
        return PauseStep(replace(base, cause=cause))
    running = replace(base, paused=False, since=0.0, cause=None)
    if r.level < pause_level:
        return PauseStep(running, "resume", f"pressure {r.level}, worker memory {_share_text(share, r.limit)} of "
                                            "its limit")
    why = (f"{_signal(r)} still, but its own need fits: worker memory {_share_text(share, r.limit)} of its limit, "
           f"{fmt_size(r.free)} free in the group for the {fmt_size(r.need)} its next tasks need")
    return PauseStep(replace(running, through=max(r.level, through or r.level)), "resume", why)


def _room_for(r: WorkerReading, need: int) -> bool:
    """Whether the group's free memory, less the critical reserve, holds ``RESUME_NEED_FACTOR`` times ``need``."""
    return r.level < Level.CRITICAL and r.free - critical_reserve(r.usable) >= RESUME_NEED_FACTOR * need


def _own_cause(share: float, at: float, says: str, fraction: float) -> str | None:
    if share >= at:
        return f"worker memory {share:.0%} of its limit ({says} {fraction:.0%})"
    return None


def _share_text(share: float, limit: int) -> str:
    return f"{share:.0%}" if limit else "unlimited"


def _signal(r: WorkerReading) -> str:
    return f"pressure {r.level}" + (f" ({r.signal})" if r.signal else "")


def _group_cause(r: WorkerReading, state: PauseState, pause_level: Level) -> str | None:
    """Why the group's memory keeps the worker paused (or pauses it); None when it may run."""
    if r.level < pause_level:
        return None
    reserve = critical_reserve(r.usable)
    room = r.free - reserve
    if state.through is not None and r.level <= state.through:  # a level it runs through
        factor = RESUME_NEED_FACTOR if state.paused else 1
        if state.bounded or room >= factor * r.need:
            return None
        return (f"{_signal(r)} and {fmt_size(max(0, r.free))} free in the group, under the "
                f"{fmt_size(factor * r.need + reserve)} it {'resumes' if state.paused else 'runs'} at ({factor} × "
                f"the {fmt_size(r.need)} its next tasks need, and {fmt_size(reserve)} kept free)")
    if not state.paused or not _room_for(r, r.need):
        return _signal(r)  # entering the level pauses first: the pause spills, then its own need is looked at
    return None


def holders_text(used: int, usable: int, holders: list[tuple[int, str, int]], own_pid: int, top: int = 4) -> str:
    """What holds a group's memory, for the longest pause's WARNING: ``used`` of ``usable`` bytes, then the ``top``
    biggest ``holders`` (pid, name, RSS bytes; ``own_pid`` named "this worker"), then what no process holds."""
    biggest = sorted(holders, key=lambda h: (-h[2], h[0]))[:top]
    parts = [f"{'this worker' if pid == own_pid else f'pid {pid} ({name})'} {fmt_size(rss)}" for pid, name, rss in biggest]
    rest = len(holders) - len(biggest)
    if rest:
        parts.append(f"{rest} more {fmt_size(sum(h[2] for h in holders) - sum(h[2] for h in biggest))}")
    outside = used - sum(h[2] for h in holders)
    if outside > 0:
        parts.append(f"{fmt_size(outside)} in no process's RSS (page cache, shared memory, the kernel)")
    return f"{fmt_size(used)} used of {fmt_size(usable)}" + (": " + ", ".join(parts) if parts else "")


# p2p rechunks and shuffles hold, on each worker and outside its spillable data, up to ``distributed.p2p.comm.buffer``
# of outgoing shards (1 GiB by default: more than a whole 384 MiB worker) and ``distributed.p2p.storage.buffer``
# of incoming ones (100 MiB). Each gets this share of the worker's limit, so both fit beside the running tasks.
P2P_BUFFER_SHARE = 0.10
# Under this worker limit a rechunk goes through tasks: p2p's fixed cost (10 concurrent 2 MiB messages, its own
# threads, two buffers) leaves too little of a small worker; tasks of ``chunk_bytes`` chunks are spilled as usual.
P2P_MIN_WORKER_BYTES = 512 * (1 << 20)
# p2p's ``distributed.p2p.comm.message-bytes-limit`` (2 MiB): none. A sender filling a message up to it keeps the
# last shard it took till its next message, and a shard over it goes whole anyway (10.7 MiB of a 128 MiB chunk); so
# each of 10 senders kept one, 256 MiB a worker in a 1 GiB p2p rechunk (``apsi_memory.dask.shards``). With none a
# sender takes a worker's shards in one list, which the library empties once sent; the comm buffer
# (``P2P_BUFFER_SHARE``) still bounds what waits to be sent.
P2P_MESSAGE_BYTES = 0


def nanny_limit_now(rss_bytes: int, current: int, wanted: int, spill: float = DASK_SPILL_FRACTION) -> int:
    """The limit a running worker's nanny applies now on its way to ``wanted`` (a new share after ``scale``): a
    larger one at once; a smaller one once the worker's RSS is under its ``spill`` line of it (dask spills a worker
    above that line down to its target, so it gets there; at the pause line, 15 points under the terminate line, a
    worker still spilling was killed once), ``current`` till then. Lowered at once, a worker holding more than the
    smaller limit's terminate line is killed by its own nanny: ``scale(4)`` killed both of two workers holding
    data."""
    return wanted if wanted >= current or rss_bytes <= spill * wanted else current


def nanny_kills(rss_bytes: int, limit_bytes: int, terminate: float, free_bytes: int, usable_bytes: int) -> bool:
    """Whether a nanny kills its worker now: over the ``terminate`` fraction of its limit (dask's rule) while the
    group is nearly full, under ``1 - terminate`` of its usable memory free. A worker over its share while the group
    has room runs on: one task of dask's 128 MiB chunks needs more than a 384 MiB share of 1 GiB, and its nanny
    killed it 7 times where stock dask, killed by nothing, finished; the kernel kills only at the group's limit, so
    the nanny still kills first where the group is full."""
    return rss_bytes > terminate * limit_bytes and free_bytes < (1 - terminate) * usable_bytes


def dask_settings(limit_bytes: int, nthreads: int = 1, lines: WorkerLines | None = None) -> dict[str, int | str]:
    """The ``dask.config`` values a worker limit implies: array chunk size (``chunk_bytes``, between the spill
    target and the pause of ``lines``, dask's defaults if None), the two p2p buffers, p2p's message limit and the
    rechunk method."""
    buffer = max(MIN_CHUNK_BYTES, int(limit_bytes * P2P_BUFFER_SHARE))
    lines = lines or WorkerLines(DASK_SPILL_TARGET, DASK_PAUSE_FRACTION)
    return {"array.chunk-size": chunk_bytes(limit_bytes, nthreads, lines.target, lines.pause),
            "distributed.p2p.comm.buffer": buffer, "distributed.p2p.storage.buffer": buffer,
            "distributed.p2p.comm.message-bytes-limit": P2P_MESSAGE_BYTES,
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


# How long a task of ``map(engine=client)`` runs: dask's scheduler costs about 6 ms a task at load 8 (1,000 bare
# tasks took 6.1 s, issue 29), so a task of one small block cost more to schedule than to run; at 100 ms that cost
# is a few percent, while a Ctrl-C still cancels all but the tasks running.
CLUSTER_TASK_S = 0.1


def cluster_blocks_per_task(blocks: int, threads: int, block_s: float, block_bytes: int, share_bytes: int) -> int:
    """Blocks one task of ``map(engine=client)`` runs, one after another, when each takes ``block_s`` seconds and
    reads and writes ``block_bytes``: enough for ``CLUSTER_TASK_S``, no more than its thread's ``share_bytes`` of
    the worker's memory (0: no limit), and never so many that a thread gets fewer than two of the ``blocks``' tasks
    (one task holding all would leave the other threads idle)."""
    by_time = int(CLUSTER_TASK_S / block_s) if block_s > 0 else blocks
    by_memory = share_bytes // max(1, block_bytes) if share_bytes > 0 else blocks
    balanced = -(-blocks // (2 * max(1, threads)))
    return max(1, min(by_time, by_memory, balanced))


# -- admission: a task of a cluster() worker starts only where its group has room for it ----------------------------
# The pause is read every 100 ms and the nanny acts after the fact: four tasks of dask's 128 MiB chunks started in
# the same instant in a 1 GiB group (2 workers x 2 threads) needed more than it had, and the kernel killed workers.


def task_start_need(chunk: int, input_bytes: int) -> int:
    """What a task will grow its worker by: ``CHUNKS_PER_TASK`` chunks of the largest array chunk its cluster was
    sent (0: none known), or twice its inputs (a result and one temporary of their size), whichever is more."""
    return max(CHUNKS_PER_TASK * max(0, chunk), 2 * max(0, input_bytes))


def task_needs_admission(need: int) -> bool:
    """Whether a task that will grow its worker by ``need`` bytes waits for admission at all: one of no more than the
    smallest chunk the library advises (``MIN_CHUNK_BYTES``) starts at once, as the critical reserve holds a few of
    those, and admission costs each task a reading of the group and of the running tasks."""
    return need > MIN_CHUNK_BYTES


def task_admitted(need: int, free: int, usable: int, running: int, outstanding: int) -> bool:
    """Whether a task of a cluster's worker that will grow it by ``need`` bytes starts now: where none of the
    cluster's tasks runs in the group (``running`` 0: the work always goes on, one task at a time at worst), or
    where the group's ``free`` bytes, less what the running tasks will still take (``outstanding``) and the
    ``critical_reserve`` of ``usable``, hold it."""
    return running == 0 or need <= free - max(0, outstanding) - critical_reserve(usable)
