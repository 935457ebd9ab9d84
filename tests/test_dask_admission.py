"""Group admission for the tasks of ``cluster()``'s workers (``apsi_memory.dask.admission``): a task starts only where
the group has room for what it will need, or where no other task of the cluster runs. In a 1 GiB group four tasks
of dask's 128 MiB chunks (2 workers x 2 threads) started at once and the kernel killed workers (issue 30)."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")
pytest.importorskip("dask.array", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

from apsi_memory import dask as amd
from apsi_memory import decide
from apsi_memory.dask.admission import TOPIC, TaskLedger, folder_name, note_chunk, read_chunk, shared_folder
from apsi_memory.machinery.slots import outstanding
from sim import tree as machines
from sim.tree import GiB, MiB
from tests.load import stretched

pytestmark = pytest.mark.dask

sizes = st.integers(0, 4 * GiB)


@pytest.fixture(autouse=True)
def clusters_of_this_test_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amd, "_open", weakref.WeakSet())


# -- the rule (decide.task_admitted) ---------------------------------------------------------------------------------

@given(need=sizes, free=sizes, usable=st.integers(GiB, 4 * GiB), outstanding=sizes)
def test_a_task_alone_in_its_group_always_starts_so_the_work_goes_on(need: int, free: int, usable: int,
                                                                      outstanding: int) -> None:
    assert decide.task_admitted(need, free, usable, 0, outstanding)


@given(need=sizes, free=sizes, usable=st.integers(GiB, 4 * GiB), running=st.integers(1, 16), outstanding=sizes)
def test_beside_running_tasks_a_task_starts_only_where_the_group_holds_it_and_what_they_will_still_take(
        need: int, free: int, usable: int, running: int, outstanding: int) -> None:
    admitted = decide.task_admitted(need, free, usable, running, outstanding)
    assert admitted == (need + outstanding + decide.critical_reserve(usable) <= free)
    if admitted:  # more room, or a smaller task, starts too
        assert decide.task_admitted(need // 2, free + MiB, usable, running, outstanding)


@given(chunk=sizes, inputs=sizes, grown=st.integers(-GiB, 4 * GiB))
def test_a_task_needs_three_of_its_clusters_largest_chunk_or_twice_its_inputs(chunk: int, inputs: int,
                                                                              grown: int) -> None:
    need = decide.task_start_need(chunk, inputs)
    assert need == max(decide.CHUNKS_PER_TASK * chunk, 2 * inputs)
    assert 0 <= outstanding(need, GiB, GiB + grown) <= need  # a worker that shrank still owes its whole need


# -- the ledger of running tasks -------------------------------------------------------------------------------------

HOLD = """
import sys, time
from apsi_memory.dask.admission import TaskLedger
task = TaskLedger(sys.argv[1]).try_admit(64 << 20)
print(task is not None, flush=True)
time.sleep(60)
"""


def test_a_worker_killed_mid_task_leaves_no_place_held(sim_machine: Callable[..., Any], tmp_path: Path) -> None:
    """A count of running tasks kept in memory or a file would stay raised by a worker the kernel killed, and every
    task after it would wait for room that a dead task holds: a task's place is a lock its process holds."""
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=100 * MiB, inactive_file=0)
    ledger = TaskLedger(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        assert [need for _, need, _ in ledger.running()] == [64 << 20]
        assert ledger.try_admit(2 * GiB) is None  # a task beside it that the group does not hold waits
    finally:
        holder.kill()
        holder.wait()
    assert ledger.running() == []
    task = ledger.try_admit(2 * GiB)  # alone now: it starts
    assert task is not None
    task.close()
    assert ledger.running() == []


def test_a_task_of_small_need_starts_at_once_and_holds_no_place(sim_machine: Callable[..., Any],
                                                                 tmp_path: Path) -> None:
    """Admission reads the group and the running tasks (hundreds of microseconds, on the worker's event loop): a task
    that needs no more than the smallest chunk the library advises starts without it, even beside a task the group
    cannot hold another of, so thousands of small tasks pay nothing."""
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=1000 * MiB, inactive_file=0)
    ledger = TaskLedger(tmp_path)
    big = ledger.try_admit(64 << 20)  # alone: it starts
    assert big is not None
    try:
        started = asyncio.run(asyncio.wait_for(ledger.admit(decide.MIN_CHUNK_BYTES // 2), stretched(5)))
        assert started is None and len(ledger.running()) == 1  # ran at once, no place of its own
    finally:
        big.close()


def test_a_wait_for_room_ends_after_the_longest_pause_with_a_warning(sim_machine: Callable[..., Any], tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A task whose parent task holds the only place (a task that waits on tasks it submitted, as with
    ``worker_client``) would wait for ever where the group never has room: like a pause, the wait ends at the
    longest pause (``apsi-memory.max-pause``) and says why."""
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=1000 * MiB, inactive_file=0)
    ledger = TaskLedger(tmp_path)
    parent = ledger.try_admit(64 << 20)
    assert parent is not None
    try:
        started = time.monotonic()
        child = asyncio.run(asyncio.wait_for(ledger.admit(32 << 20, max_wait=0.3), stretched(10)))
        assert child is not None and time.monotonic() - started >= 0.3
        child.close()
    finally:
        parent.close()
    assert "for room in its group" in caplog.text and "longest pause" in caplog.text


def test_the_largest_chunk_sent_is_kept(tmp_path: Path) -> None:
    assert read_chunk(tmp_path) == 0
    note_chunk(tmp_path, 64 * MiB)
    note_chunk(tmp_path, 16 * MiB)
    assert read_chunk(tmp_path) == 64 * MiB


# -- real worker processes -------------------------------------------------------------------------------------------

def _record(block: Any) -> Any:
    start = time.time()
    time.sleep(0.5)
    return np.array([start, time.time()])


def _spans(usage: int, sim_machine: Callable[..., Any], tmp_path: Path) -> tuple[list[tuple[float, float]], int]:
    """When each of four tasks over 64 MiB chunks ran on 2 workers x 2 threads, the 1 GiB group at ``usage``, and
    how many waited (the workers' ``apsi-admission`` events)."""
    import dask.array as da

    sim_machine(machines.docker_v1, limit=1 * GiB, usage=usage, inactive_file=0)  # what workers read, not hold
    x = da.zeros(4 * (8 << 20), chunks=8 << 20)  # 64 MiB chunks, none of them in memory (a broadcast zero)
    with amd.cluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                     local_directory=str(tmp_path)) as c, c.get_client() as cl:
        cl.wait_for_workers(2, timeout=stretched(60))
        ends = x.map_blocks(_record, chunks=((2,) * 4,), dtype=float).compute()
        waits = [msg for _, msg in cl.get_events(TOPIC)]
    assert all(msg["need_bytes"] == 3 * 64 * MiB for msg in waits)
    return sorted(zip(ends[::2], ends[1::2], strict=True)), len(waits)


def _overlap(spans: list[tuple[float, float]]) -> bool:
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def test_tasks_the_group_cannot_hold_together_run_one_after_another_and_all_finish(
        sim_machine: Callable[..., Any], tmp_path: Path) -> None:
    """768 MiB of the 1 GiB group used: one task of three 64 MiB chunks fits beside the critical reserve, two do
    not; the four run one at a time (none waits for ever) where dask alone ran them together."""
    spans, waited = _spans(768 * MiB, sim_machine, tmp_path)
    assert len(spans) == 4 and not _overlap(spans)
    assert waited >= 1  # and the workers said so


def test_control_tasks_the_group_holds_together_run_together(sim_machine: Callable[..., Any],
                                                             tmp_path: Path) -> None:
    spans, waited = _spans(100 * MiB, sim_machine, tmp_path)
    assert _overlap(spans) and waited == 0


def test_the_cluster_folder_of_running_tasks_goes_with_the_cluster(tmp_path: Path) -> None:
    with amd.cluster(n_workers=1, processes=True, dashboard_address=":0", local_directory=str(tmp_path)) as c:
        folder = c.admission
        assert folder is not None and os.path.isdir(folder)
    assert not os.path.exists(folder)


# -- dask worker --preload-nanny apsi_memory.dask -------------------------------------------------------------------

def _preloaded(tmp_path: Path, n_workers: int, threads: int = 1) -> Any:
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True, dashboard_address=":0",
                        local_directory=str(tmp_path), preload_nanny=["apsi_memory.dask"])


def _admission_of(dask_worker: Any) -> tuple[str | None, str]:
    ledger = dask_worker.ledger
    return (None if ledger is None else str(ledger.folder)), Path("/proc/self/oom_score_adj").read_text().strip()


def test_preloaded_nannies_of_one_group_share_a_folder_and_start_tasks_it_cannot_hold_together_one_at_a_time(
        sim_machine: Callable[..., Any], tmp_path: Path) -> None:
    """The preload's workers were stock: two workers of one pod started tasks of big chunks together however little
    the group had left. Tasks of 8 MiB inputs need 16 MiB each (no client of ours notes a chunk): the group holds
    one beside its critical reserve, not two, and the four run one at a time; the workers go first where it is
    full all the same."""
    import dask.array as da
    from distributed import wait

    usage = GiB - decide.critical_reserve(GiB) - 24 * MiB
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=usage, inactive_file=0)
    with _preloaded(tmp_path, 2, threads=2) as c, c.get_client() as cl:
        cl.wait_for_workers(2, timeout=stretched(60))
        shown = set(cl.run(_admission_of).values())
        x = da.random.random(4 << 20, chunks=1 << 20).persist()  # 8 MiB inputs, real
        wait(x)
        ends = x.map_blocks(_record, chunks=((2,) * 4,), dtype=float).compute()
        waits = [msg for _, msg in cl.get_events(TOPIC)]
    ((folder, score),) = shown  # one folder for both
    assert folder is not None and score == "1000"
    assert os.path.dirname(folder) == os.environ["APSI_LEDGER_DIR"] and os.stat(folder).st_mode & 0o777 == 0o700
    assert not _overlap(sorted(zip(ends[::2], ends[1::2], strict=True)))
    assert waits and all(msg["need_bytes"] == 16 * MiB for msg in waits)


def test_a_relative_ledger_folder_gives_the_preload_no_admission_folder_and_no_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_LEDGER_DIR", "ledger")  # refused by name wherever the library reads it
    assert shared_folder("tcp://127.0.0.1:8786") is None


@pytest.mark.parametrize("planted", ["writable by all", "a symbolic link"])
def test_preloaded_workers_refuse_an_admission_folder_they_cannot_trust_and_run_without_admission(
        tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    """Another user who could write the folder could hold every place (no task would start) or free them all."""
    with _preloaded(tmp_path, 0) as c, c.get_client() as cl:
        ledgers = Path(os.environ["APSI_LEDGER_DIR"])
        ledgers.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = ledgers / folder_name(c.scheduler_address)  # where the preload looks
        if planted == "writable by all":
            folder.mkdir()
            os.chmod(folder, 0o777)
        else:
            (tmp_path / "theirs").mkdir(mode=0o700)
            folder.symlink_to(tmp_path / "theirs")
        with caplog.at_level("INFO", logger="distributed.apsi_memory"):
            c.scale(2)
            cl.wait_for_workers(2, timeout=stretched(60))
        assert list(cl.run(_admission_of).values()) == [(None, "1000")] * 2  # they still go first where it is full
        assert cl.submit(sum, [1, 2]).result(timeout=stretched(30)) == 3
    refusals = [r.getMessage() for r in caplog.records if "without group admission" in r.getMessage()]
    assert len(refusals) == 1 and "does not trust it" in refusals[0], refusals  # once, not once a worker


# -- a real group out of memory: the kernel kills a worker, not the process beside the cluster ----------------------

STRANGER = "import numpy as np, time; a = np.ones((350 << 20) // 8); print(1, flush=True); time.sleep(120)"
JOB = """
import numpy as np
from apsi_memory.dask import cluster

def grow():
    global held
    held = [np.ones((16 << 20) // 8) for _ in range(16)]  # 256 MiB, 16 at a time: the group has under 100 left

if __name__ == "__main__":
    with cluster(n_workers=1, dashboard_address=":0", local_directory=%r) as c, c.get_client() as client:
        try:
            client.run(grow)
            print("grown")
        except Exception as exc:
            print("worker lost:", type(exc).__name__)
"""


@pytest.mark.real
def test_in_a_real_group_out_of_memory_the_kernel_kills_a_worker_not_the_larger_process_beside_it(
        tmp_path: Path, memcg: Callable[[int], Any]) -> None:
    """A process we do not control holds 350 MiB of a 600 MiB group; the cluster's worker grows past the rest. The
    kernel kills the process of the highest score, by default the largest: the stranger, killed in every run of
    issue 30's stranger600 cells (stock too). ``cluster()``'s workers ask to go first."""
    env = {key: value for key, value in os.environ.items() if key not in ("APSI_FS_ROOT", "APSI_HOME")}
    with memcg(600 << 20) as group:
        stranger = subprocess.Popen(group.wrap([sys.executable, "-c", STRANGER]), stdout=subprocess.PIPE, env=env)
        try:
            assert stranger.stdout is not None and stranger.stdout.readline()
            job = group.run([sys.executable, "-c", JOB % str(tmp_path)], timeout=stretched(120), env=env)
            alive, kills, seen = stranger.poll() is None, group.oom_kills(), group.describe()
        finally:
            stranger.kill()
            stranger.wait()
    assert kills >= 1, (job.stdout, seen)  # the group did run out of memory
    assert alive, (job.stdout, job.stderr[-2000:])
