"""``runner.run_pulled``, the threads of ``memory.map``: every block once, read ahead in row order and a bounded
way ahead, and every failure raised (the first in row order), including one while a block is being finished."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from apsi_memory.blocks.runner import Pulled, Stop, run_pulled

COUNT, WORKERS, AHEAD = 12, 3, 3


class Recorder:
    """The hooks of a run, each call noted in order (under the run's lock, so the list is the order they ran)."""

    def __init__(self, fail_work: frozenset[int] = frozenset(), fail_finish: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.fail_work, self.fail_finish = fail_work, fail_finish
        self.lock = threading.Lock()
        self.stopped = 0
        self.stop_seen = threading.Event()
        # blocks after the failing one wait for the stop, so however the threads are scheduled the ones that had
        # not started when it came are exactly those that must never start
        self.last_free = min([*fail_work, COUNT if fail_finish is None else fail_finish, COUNT])

    def note(self, what: str, index: int) -> None:
        with self.lock:
            self.events.append((what, index))

    def prepare(self, index: int) -> None:
        self.note("prepare", index)

    def work(self, index: int) -> None:
        self.note("work", index)
        if index > self.last_free:
            assert self.stop_seen.wait(10), "the run never stopped"
        if index in self.fail_work:
            raise ValueError(f"block {index}")

    def finish(self, index: int) -> None:
        self.note("finish", index)
        if index == self.fail_finish:
            raise OSError(f"finishing {index}")

    def on_stop(self) -> None:
        self.stopped += 1
        self.stop_seen.set()

    def run(self) -> None:
        blocks = Pulled(COUNT, AHEAD, self.prepare, self.finish, Stop(COUNT))
        with ThreadPoolExecutor(WORKERS) as pool:
            run_pulled(pool, WORKERS, self.work, blocks, self.on_stop)

    def indices(self, what: str) -> list[int]:
        return [index for kind, index in self.events if kind == what]


def test_every_block_is_prepared_before_it_runs_once_and_finished() -> None:
    recorder = Recorder()
    recorder.run()
    assert recorder.indices("prepare") == list(range(COUNT))  # read ahead in row order, each once
    assert sorted(recorder.indices("work")) == sorted(recorder.indices("finish")) == list(range(COUNT))
    for index in range(COUNT):
        assert recorder.events.index(("prepare", index)) < recorder.events.index(("work", index))
    assert recorder.stopped == 0


def test_at_most_ahead_blocks_beyond_those_running_are_prepared_and_not_finished() -> None:
    recorder = Recorder()
    recorder.run()
    prepared = finished = 0
    for kind, _ in recorder.events:
        prepared += kind == "prepare"
        finished += kind == "finish"
        assert prepared - finished <= WORKERS + AHEAD, recorder.events


def test_the_first_failing_block_in_row_order_is_raised_and_no_later_block_starts() -> None:
    recorder = Recorder(fail_work=frozenset({4, 7}))
    with pytest.raises(ValueError, match="block 4"):
        recorder.run()
    assert set(range(4)) <= set(recorder.indices("work"))  # the blocks before it ran
    assert max(recorder.indices("work")) < 4 + WORKERS  # those after it that had not started never did
    assert recorder.stopped >= 1


def test_a_failure_while_finishing_a_block_is_raised_not_lost() -> None:
    recorder = Recorder(fail_finish=2)
    with pytest.raises(OSError, match="finishing 2"):
        recorder.run()
    assert max(recorder.indices("work")) < 2 + WORKERS
