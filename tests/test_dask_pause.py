"""Issue 30 item 1: a dask worker's pause that always ends (``decide.worker_pause_step``), as pure rules.

A client or neighbour holding a 1 GiB group at 75-80 % used kept ``high`` (left only above 25 % free) and with it
every worker paused for good. The rules here need no dask: a paused worker resumes on its own need (its memory
against its limit, the group's free memory against its next tasks), and no pause outlasts ``MAX_PAUSE_S``."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from apsi_memory.decide import DASK_PAUSE_FRACTION, DASK_RESUME_GAP, LEVELS, Level, worker_pause_cause
from apsi_memory.decide.workers import (
    MAX_PAUSE_S,
    OWN_PAUSE_GRACE_S,
    RESUME_NEED_FACTOR,
    PauseState,
    WorkerReading,
    critical_reserve,
    holders_text,
    task_need_bytes,
    worker_pause_step,
)

MiB, GiB = 1 << 20, 1 << 30
LIMIT = 384 * MiB  # each of 2 workers in 1 GiB
RESUME_AT = DASK_PAUSE_FRACTION - DASK_RESUME_GAP

levels = st.sampled_from(LEVELS)
shares = st.floats(0.0, 1.2)


@st.composite
def readings(draw: st.DrawFn, now: float = 0.0) -> WorkerReading:
    rss = int(draw(shares) * LIMIT)
    return WorkerReading(draw(levels), rss, LIMIT, draw(st.integers(0, GiB)), GiB,
                         draw(st.integers(0, 512 * MiB)), now, draw(st.sampled_from([None, "free ≤ 20 %"])),
                         draw(st.none() | st.integers(0, 512 * MiB)))


def looks(reading: WorkerReading, state: PauseState, times: list[float], **kw: float) -> list[PauseState]:
    """The states after looking at ``reading`` at each of ``times``."""
    seen = []
    for now in times:
        state = worker_pause_step(replace(reading, now=now), state, **kw).state  # type: ignore[arg-type]
        seen.append(state)
    return seen


@st.composite
def histories(draw: st.DrawFn) -> tuple[PauseState, float]:
    """A state reached from a fresh worker by a few arbitrary looks, and the time of the last one."""
    state, now = PauseState(), 0.0
    for _ in range(draw(st.integers(0, 6))):
        now += draw(st.floats(0.1, 20.0))
        state = worker_pause_step(draw(readings(now)), state).state
    return state, now


# -- it cannot stick ------------------------------------------------------------------------------------------------

@given(readings(), histories(), st.floats(0.1, 5.0))
def test_whatever_holds_the_memory_a_pause_ends_within_the_longest_pause(reading: WorkerReading,
                                                                        history: tuple[PauseState, float],
                                                                        every: float) -> None:
    """The defect: one reading held for good (the group at 77 % used, ``high`` kept) kept a worker paused for good.
    Now any reading held, after any history, leaves the worker running within ``MAX_PAUSE_S`` and for good."""
    state, start = history
    times = [start + every * (i + 1) for i in range(int(MAX_PAUSE_S / every) + 3)]
    seen = looks(reading, state, times)
    paused_at = [now for now, s in zip(times, seen) if s.paused]
    assert not paused_at or max(paused_at) - min(s.since for s in seen if s.paused) < MAX_PAUSE_S + every
    assert not seen[-1].paused and not any(s.paused for s in looks(reading, seen[-1], [times[-1] + 1000.0]))


@given(readings(), histories())
def test_one_reading_held_changes_a_worker_at_most_twice(reading: WorkerReading,
                                                        history: tuple[PauseState, float]) -> None:
    """No flapping: a pause, then a resume (on its own need or after the longest pause), then nothing."""
    state, start = history
    times = [start + 0.5 * (i + 1) for i in range(int(MAX_PAUSE_S / 0.5) + 10)]
    seen = [state, *looks(reading, state, times)]
    assert sum(a.paused != b.paused for a, b in pairwise(seen)) <= 2


def test_the_deadlock_of_the_issue_ends_on_the_workers_own_need() -> None:
    """1 GiB, workers of 384 MiB at 90 MiB RSS, 16 MiB chunks: a spike paused them at high; the client then holds
    77 % (high kept: left above 25 % free). They resume on the next look, not after the longest pause."""
    need = task_need_bytes(1, 16 * MiB, LIMIT, 90 * MiB)
    spike = WorkerReading(Level.HIGH, 90 * MiB, LIMIT, int(0.15 * GiB), GiB, need, 0.0, "free ≤ 20 %")
    paused = worker_pause_step(spike, PauseState())
    assert paused.change == "pause" and paused.why == "pressure high (free ≤ 20 %)"
    held = replace(spike, free=int(0.23 * GiB), now=0.5)
    resumed = worker_pause_step(held, paused.state)
    assert resumed.change == "resume" and not resumed.state.paused and resumed.state.through is Level.HIGH
    assert resumed.why == ("pressure high (free ≤ 20 %) still, but its own need fits: worker memory 23% of its "
                           "limit, 235.5 MB free in the group for the 48.0 MB its next tasks need")
    assert worker_pause_step(replace(held, now=1.0), resumed.state).change is None  # runs through high


def test_the_longest_pause_resumes_the_worker_and_names_the_signal() -> None:
    need = task_need_bytes(1, 128 * MiB, LIMIT, 90 * MiB)  # dask's default chunks: more than the group has free
    short = WorkerReading(Level.HIGH, 90 * MiB, LIMIT, 100 * MiB, GiB, need, 0.0, "free ≤ 20 %")
    state = worker_pause_step(short, PauseState()).state
    assert worker_pause_step(replace(short, now=MAX_PAUSE_S - 0.1), state).change is None
    step = worker_pause_step(replace(short, now=MAX_PAUSE_S), state)
    assert step.change == "bounded" and step.why == "pressure high (free ≤ 20 %)" and step.state.bounded
    assert worker_pause_step(replace(short, level=Level.CRITICAL, now=31.0), step.state).change == "pause"  # worse
    assert worker_pause_step(replace(short, now=5.0), state, max_pause_s=float("inf")).change is None


# -- a pause on its own memory alone, with room in the group --------------------------------------------------------

def has_room(reading: WorkerReading) -> bool:
    """Room in the group for what the worker's next tasks need past its own line."""
    need = max(reading.need, reading.past_line_need or 0)
    return reading.level < Level.CRITICAL and reading.free - critical_reserve(GiB) >= RESUME_NEED_FACTOR * need


@given(readings(), st.floats(0.0, MAX_PAUSE_S, exclude_max=True))
def test_a_pause_on_its_own_memory_alone_ends_after_the_grace_where_the_group_has_room(reading: WorkerReading,
                                                                                      paused_for: float) -> None:
    """2 GiB p2p rechunk of 128 MiB chunks: both workers sat out the longest pause at 80-92 % of their limits, held
    by p2p buffers no pause frees, with 500 MB free in the group. Over its own line, a worker resumes after the grace
    where the group has room; short of the grace, or with the group short of room (the pause on its pressure),
    it stays paused as before, within the longest pause."""
    reading = replace(reading, rss=max(reading.rss, int(RESUME_AT * LIMIT) + 1), now=paused_for)
    step = worker_pause_step(reading, PauseState(paused=True))
    if has_room(reading) and paused_for >= OWN_PAUSE_GRACE_S:
        assert step.change == "resume" and step.state.own_through and step.why.startswith("worker memory")
    else:
        assert step.state.paused


@given(readings(), histories(), st.floats(0.0, MAX_PAUSE_S, exclude_max=True))
def test_a_worker_over_its_own_line_resumes_before_the_longest_pause_only_with_room_after_the_grace(
        reading: WorkerReading, history: tuple[PauseState, float], paused_for: float) -> None:
    state = replace(history[0], paused=True, since=reading.now - paused_for, own_through=False)
    step = worker_pause_step(reading, state)
    if reading.rss >= RESUME_AT * LIMIT and not step.state.paused:
        assert paused_for >= OWN_PAUSE_GRACE_S and has_room(reading) and step.state.own_through


def test_the_p2p_rechunk_of_the_issue_resumes_after_the_grace_and_runs_through_its_own_line() -> None:
    """2 GiB, 2 workers of 896 MiB (32 MiB chunks advised): one at 85 % of its limit (p2p buffers), 500 MiB free,
    ``moderate``. Over its line it may grow by nothing (``need`` 0); past it, its next task needs 96 MiB."""
    limit, group = 896 * MiB, 2 * GiB
    rss = int(0.85 * limit)
    held = WorkerReading(Level.MODERATE, rss, limit, 500 * MiB, group, task_need_bytes(1, 32 * MiB, limit, rss),
                         past_line_need=task_need_bytes(1, 32 * MiB, 0, rss))
    paused = worker_pause_step(held, PauseState())
    assert paused.change == "pause"
    assert worker_pause_step(replace(held, now=OWN_PAUSE_GRACE_S - 0.1), paused.state).change is None
    resumed = worker_pause_step(replace(held, now=OWN_PAUSE_GRACE_S), paused.state)
    assert resumed.change == "resume" and resumed.why == (
        "worker memory 85% of its limit (resumes under 70%) after 5 s paused on it, but the group has room: "
        "500.0 MB free for the 96.0 MB its next tasks need past its line (resumes at 294.4 MB); it runs through its "
        "line")
    short_of_room = replace(held, free=critical_reserve(group) + 2 * 96 * MiB - 1, now=OWN_PAUSE_GRACE_S + 1)
    assert worker_pause_step(short_of_room, paused.state).state.paused  # its need past its line does not fit
    assert worker_pause_step(replace(held, now=6.0), resumed.state).change is None  # runs through its own line
    full = replace(held, level=Level.HIGH, free=critical_reserve(group) - 1, now=7.0, signal="free ≤ 20 %")
    assert worker_pause_step(full, resumed.state).change == "pause"  # the group's pressure still pauses it
    short = replace(held, level=Level.CRITICAL, now=OWN_PAUSE_GRACE_S + 1)
    assert worker_pause_step(short, paused.state).state.paused  # never at critical


# -- it still pauses ------------------------------------------------------------------------------------------------

@given(readings(), st.booleans())
def test_with_no_room_for_its_tasks_and_no_bound_the_rule_is_the_old_one(reading: WorkerReading,
                                                                        paused: bool) -> None:
    """Where the group never has room for the worker's next tasks, the step pauses and resumes exactly where
    ``worker_pause_cause`` does: the new rule only adds ways out."""
    reading = replace(reading, need=GiB)
    state = PauseState(paused=paused)
    step = worker_pause_step(reading, state, max_pause_s=float("inf"))
    assert step.state.paused == bool(worker_pause_cause(reading.level, reading.rss, LIMIT, paused))


@given(readings(), histories())
def test_a_running_worker_pauses_at_critical_or_its_own_pause_fraction(reading: WorkerReading,
                                                                      history: tuple[PauseState, float]) -> None:
    state = replace(history[0], paused=False, own_through=False, bounded=False)
    step = worker_pause_step(reading, state)
    if reading.level >= Level.CRITICAL and (state.through is None or state.through < Level.CRITICAL):
        assert step.change == "pause"
    if reading.rss >= DASK_PAUSE_FRACTION * LIMIT:
        assert step.change == "pause"


@given(readings(), histories(), st.integers(0, GiB), st.floats(0.0, 1.0))
def test_more_free_memory_or_less_rss_never_keeps_paused_a_worker_that_would_resume(
        reading: WorkerReading, history: tuple[PauseState, float], more: int, less: float) -> None:
    state = replace(history[0], paused=True, since=reading.now)
    if not worker_pause_step(reading, state).state.paused:
        better = replace(reading, free=reading.free + more, rss=int(reading.rss * less))
        assert not worker_pause_step(better, state).state.paused


@given(readings())
def test_a_paused_worker_resumes_on_its_own_need(reading: WorkerReading) -> None:
    own_ok = reading.rss < RESUME_AT * LIMIT
    room = reading.free - critical_reserve(GiB) >= RESUME_NEED_FACTOR * reading.need
    step = worker_pause_step(reading, PauseState(paused=True))
    if own_ok and (reading.level < Level.HIGH or (reading.level < Level.CRITICAL and room)):
        assert step.change == "resume"
    if not own_ok or reading.level >= Level.CRITICAL or (reading.level >= Level.HIGH and not room):
        assert step.state.paused  # within the longest pause


def test_a_worker_running_through_high_pauses_when_the_group_falls_under_its_need() -> None:
    need = 48 * MiB
    running = PauseState(through=Level.HIGH)
    low = WorkerReading(Level.HIGH, 90 * MiB, LIMIT, critical_reserve(GiB) + need - 1, GiB, need, 1.0)
    step = worker_pause_step(low, running)
    assert step.change == "pause" and "under the 99.2 MB it runs at" in step.why
    between = replace(low, free=critical_reserve(GiB) + need + 1, now=2.0)  # under 2 × need: stays paused
    assert worker_pause_step(between, step.state).change is None
    assert worker_pause_step(replace(between, free=critical_reserve(GiB) + 2 * need), step.state).change == "resume"


def test_the_level_let_through_clears_once_it_is_left() -> None:
    running = PauseState(through=Level.HIGH, bounded=True)
    calm = WorkerReading(Level.MODERATE, 90 * MiB, LIMIT, 300 * MiB, GiB, 48 * MiB, 1.0)
    cleared = worker_pause_step(calm, running).state
    assert cleared == PauseState()
    assert worker_pause_step(replace(calm, level=Level.HIGH, free=150 * MiB), cleared).change == "pause"


# -- what the next tasks need, and who holds the memory ---------------------------------------------------------

@given(st.integers(1, 16), st.integers(0, GiB), st.integers(0, 2 * GiB), st.integers(0, 2 * GiB))
def test_the_need_is_three_chunks_a_thread_capped_by_the_workers_own_room(threads: int, chunk: int, limit: int,
                                                                         rss: int) -> None:
    need = task_need_bytes(threads, chunk, limit, rss)
    assert 0 <= need <= threads * 3 * chunk
    if limit:
        assert need <= max(0, int(limit * DASK_PAUSE_FRACTION) - rss)
    assert task_need_bytes(threads, chunk, 0, rss) == threads * 3 * chunk


def test_the_holders_are_named_biggest_first_with_what_no_process_holds() -> None:
    holders = [(11, "python3 stranger.py", 600 * MiB), (12, "python3", 90 * MiB), (13, "sh", MiB),
               (14, "python3", 95 * MiB)]
    assert holders_text(800 * MiB, GiB, holders, own_pid=12, top=3) == (
        "800.0 MB used of 1.0 GB: pid 11 (python3 stranger.py) 600.0 MB, pid 14 (python3) 95.0 MB, this worker "
        "90.0 MB, 1 more 1.0 MB, 14.0 MB in no process's RSS (page cache, shared memory, the kernel)")
    assert holders_text(0, GiB, [], own_pid=1) == "0 B used of 1.0 GB"
