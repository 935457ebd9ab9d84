"""What a Dask user sets or reads around ``apsi_memory.dask``: ``apsi-memory dask-limit --nthreads`` against what
``cluster()`` really sets, dask's own ``distributed.worker.memory.*`` lines (followed where stricter, else a
WARNING once), the signal each pause names, and the dask benchmark telling a ``KilledWorker`` from a time limit
(issue 30 items 7 and 8). Clusters here are ``processes=False``: thread workers start in a second at any load."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")
pytest.importorskip("dask.array", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

import dask

from apsi_memory import ArgumentError, Level
from apsi_memory import dask as amd
from apsi_memory.dask import settings
from benchmarks import dask_cgroup
from sim import tree as machines
from sim.pressure import PressureMachine
from sim.tree import GiB, MiB

pytestmark = pytest.mark.dask

WORKERS_WAIT_S = 120  # thread workers start in a second, but the machine may be loaded
SETTINGS = ("array.chunk-size", "array.rechunk.method", "distributed.p2p.comm.buffer",
            "distributed.p2p.storage.buffer")
LOGGER = "distributed.apsi_memory"


@pytest.fixture(autouse=True)
def dask_defaults() -> Iterator[None]:
    """dask's own defaults for the keys cluster() sets: a value an earlier test's cluster left behind is, for the
    library, one the user set, and kept."""
    defaults = dask.config.merge(*dask.config.defaults)
    with dask.config.set({key: dask.config.get(key, config=defaults) for key in SETTINGS}):
        yield


def dask_limit(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "apsi_memory", "dask-limit", "--json", *args], capture_output=True,
                          text=True, timeout=120, check=True)
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


# -- dask-limit --nthreads against cluster() ----------------------------------------------------------------------

@pytest.mark.parametrize("group", [1 * GiB, 4 * GiB])  # tasks-rechunk workers, and p2p ones
def test_dask_limit_prints_what_cluster_sets_for_the_same_workers_and_threads(
        sim_machine: Callable[..., Any], group: int) -> None:
    """dask-limit assumed 1 thread a worker and printed neither the rechunk method nor the p2p buffers: with 4
    threads it advised chunks 4 times too big for the threads that share a worker."""
    sim_machine(machines.docker_v1, limit=group)
    shown = dask_limit("--workers", "2", "--nthreads", "4")
    with amd.cluster(n_workers=2, threads_per_worker=4, processes=False, dashboard_address=":0") as made, \
            made.get_client() as client:
        client.wait_for_workers(2, timeout=WORKERS_WAIT_S)
        limits = {w["memory_limit"] for w in client.scheduler_info()["workers"].values()}
        cluster_set = {key: dask.config.get(key) for key in SETTINGS}
    assert limits == {shown["memory_limit_bytes"]} and shown["nthreads"] == 4 and shown["workers"] == 2
    assert {"array.chunk-size": shown["chunk_bytes"], "array.rechunk.method": shown["rechunk_method"],
            "distributed.p2p.comm.buffer": shown["p2p_comm_buffer_bytes"],
            "distributed.p2p.storage.buffer": shown["p2p_storage_buffer_bytes"]} == cluster_set
    assert shown["chunk_bytes"] == amd.chunk_bytes(shown["memory_limit_bytes"], 4) < \
        amd.chunk_bytes(shown["memory_limit_bytes"], 1)


# -- dask's own memory lines ---------------------------------------------------------------------------------------

class FakeWorker:
    """What ``PressurePlugin.check`` reads of a worker: status, RSS, limit, events (no SpillBuffer)."""

    def __init__(self, rss: int, limit: int) -> None:
        from distributed.core import Status

        self.status, self.address = Status.running, "tcp://sim:1"
        self.data: dict[str, Any] = {}
        self.events: list[str] = []
        self.monitor = SimpleNamespace(get_process_memory=lambda: rss)
        self.memory_manager = SimpleNamespace(memory_limit=limit)

    def log_event(self, topic: str, event: dict[str, Any]) -> None:
        self.events.append(event["action"])


class Recorder(logging.Handler):
    """The records of one logger, whatever dask's logging setup does with them."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def checked(rss_share: float, **memory: object) -> tuple[str, list[str]]:
    """A ``PressurePlugin`` made under ``distributed.worker.memory`` = ``memory``, one look at a 384 MiB worker at
    ``rss_share`` of its limit: its status, and the WARNINGs logged meanwhile (messages)."""
    handler = Recorder()
    logging.getLogger(LOGGER).addHandler(handler)
    try:
        with dask.config.set({f"distributed.worker.memory.{key}": value for key, value in memory.items()}):
            plugin = amd.PressurePlugin()
        plugin.worker = FakeWorker(int(384 * MiB * rss_share), 384 * MiB)
        plugin.check()
    finally:
        logging.getLogger(LOGGER).removeHandler(handler)
    return str(plugin.worker.status), [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING]


@pytest.fixture
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test meets the notes for the first time (they are logged once per process)."""
    monkeypatch.setattr(settings, "_warned", set())


def test_a_stricter_dask_pause_is_followed(pressure_machine: PressureMachine, fresh_notes: None) -> None:
    """``distributed.worker.memory.pause: 0.6`` was ignored: the plugin paused at 80 % whatever the user said."""
    status, said = checked(0.65, pause=0.6)
    assert status == "Status.paused"
    assert said == ["apsi_memory: worker tcp://sim:1 paused: worker memory 65% of its limit (pauses at 60%)"]
    assert checked(0.65)[0] == "Status.running"  # control: dask's default pause, the plugin's 80 %


def test_a_terminate_line_close_to_the_pause_moves_the_pause_under_it(pressure_machine: PressureMachine,
                                                                       fresh_notes: None) -> None:
    """With ``terminate: 0.82`` the nanny would kill a worker at 82 % before anything paused it at 80 %; the pause
    keeps dask's own 15 points under the terminate line (67 %)."""
    assert checked(0.70, terminate=0.82) == (
        "Status.paused", ["apsi_memory: worker tcp://sim:1 paused: worker memory 70% of its limit (pauses at 67%)"])
    assert checked(0.70, terminate=0.95)[0] == "Status.running"  # dask's default: the pause stays at 80 %


@pytest.mark.parametrize(("pause", "shown"), [(0.9, "0.9"), (False, "False")])
def test_a_looser_dask_pause_is_a_warning_once_saying_what_is_done_instead(
        pressure_machine: PressureMachine, fresh_notes: None, pause: float | bool, shown: str) -> None:
    note = (f"apsi_memory: dask setting distributed.worker.memory.pause={shown} not followed: apsi_memory pauses "
            "each worker at 80% of its limit and at pressure high (its PressurePlugin owns pausing: dask's rule "
            "would un-pause what the pressure level paused)")
    status, said = checked(0.85, pause=pause)
    assert status == "Status.paused" and said == [
        note, "apsi_memory: worker tcp://sim:1 paused: worker memory 85% of its limit (pauses at 80%)"]
    assert checked(0.5, pause=pause)[1] == []  # once per process, not once per worker or per cluster


def test_a_lower_spill_target_leaves_room_for_bigger_chunks_in_what_cluster_sets(
        sim_machine: Callable[..., Any]) -> None:
    """Chunks fit between the spill target and the pause: with ``target: 0.4`` a 384 MiB worker's three chunks
    have 154 MiB, not 77 MiB."""
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with dask.config.set({"distributed.worker.memory.target": 0.4}), \
            amd.cluster(n_workers=2, processes=False, dashboard_address=":0"):
        assert dask.config.get("array.chunk-size") == 32 * MiB
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0"):
        assert dask.config.get("array.chunk-size") == 16 * MiB  # control: dask's 60 %


def test_the_pause_the_user_set_reaches_the_workers_cluster_starts(sim_machine: Callable[..., Any],
                                                                    fresh_notes: None) -> None:
    """cluster() starts its workers with dask's own pausing off; the user's stricter line still reaches them."""
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with dask.config.set({"distributed.worker.memory.pause": 0.5}), \
            amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as made, made.get_client() as client:
        client.wait_for_workers(2, timeout=WORKERS_WAIT_S)
        assert [w.plugins["apsi-pressure"].pause for w in made.workers.values()] == [0.5, 0.5]


def test_dask_spilling_nothing_is_a_warning_and_a_bad_line_an_error(pressure_machine: PressureMachine,
                                                                     fresh_notes: None) -> None:
    assert checked(0.5, target=False, spill=False)[1] == [(
        "apsi_memory: dask settings distributed.worker.memory.target and .spill are False: dask spills nothing by "
        "memory; apsi_memory spills at pressure high only, and sizes chunks as if results were spilled down to 60% "
        "of the limit")]
    with pytest.raises(ArgumentError, match=r"distributed.worker.memory.pause='80%': a fraction of the worker's"):
        checked(0.5, pause="80%")


# -- the signal a pause names --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("setup", "rss_share", "why"), [
    ("free", 0.2, "pressure high (free ≤ 20 %)"),
    ("psi", 0.2, "pressure high (some ≥ 15 %)"),
    ("own", 0.85, "worker memory 85% of its limit (pauses at 80%)"),
])
def test_each_pause_names_the_signal_behind_it(pressure_machine: PressureMachine, fresh_notes: None, setup: str,
                                               rss_share: float, why: str) -> None:
    """Item 4 of issue 30 asked for "pressure high" to say which reading: the group's free memory, PSI stalls, or
    the worker's own memory against its limit."""
    if setup == "free":
        pressure_machine.at(Level.HIGH)
    elif setup == "psi":
        pressure_machine.stalls(some=20.0)
    assert checked(rss_share) == ("Status.paused", [f"apsi_memory: worker tcp://sim:1 paused: {why}"])


# -- the benchmark's failed runs -----------------------------------------------------------------------------------

def _killed(seconds: float) -> None:
    """What the scheduler raises for a task whose workers kept dying (here raised by the task itself)."""
    from distributed import KilledWorker

    time.sleep(seconds)
    raise KilledWorker("rechunk-merge-1", SimpleNamespace(address="tcp://gone:1"), 3)


def test_the_benchmark_tells_a_killed_worker_from_a_time_limit() -> None:
    """A rerun of "no: time limit" showed KilledWorker at 23 s: each is reported as what it was, when it was."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as made, made.get_client() as client:
        client.wait_for_workers(1, timeout=WORKERS_WAIT_S)
        killed = dask_cgroup.watch(client, [client.submit(_killed, 1.0, pure=False)], limit_s=60)
        slow = dask_cgroup.watch(client, [client.submit(time.sleep, 5, pure=False)], limit_s=1)
    assert killed["error"] == "KilledWorker" and 1.0 <= killed["wall_s"] < 60
    assert dask_cgroup._finished(killed) == f"no: KilledWorker after {killed['wall_s']} s"
    assert slow["error"] is None and dask_cgroup._finished(slow) == "no: time limit"


@pytest.mark.parametrize("size", ["128MiB", "8MiB"])
def test_an_explicit_chunk_size_is_kept_even_at_dasks_default_and_warned_of_where_it_will_not_fit(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, size: str) -> None:
    """DASK_ARRAY__CHUNK_SIZE=128MiB equals dask's default, and cluster() took it for no setting at all and set
    16 MiB for a 384 MiB worker (issue 30 item 3). It is the user's: kept, with a WARNING where it will not fit;
    a size that fits is kept without one."""
    monkeypatch.setenv("DASK_ARRAY__CHUNK_SIZE", size)
    with dask.config.set({"array.chunk-size": size}), caplog.at_level(logging.WARNING, "distributed.apsi_memory"):
        settings_made = amd.follow_limit(384 * MiB, 1)
        assert "array.chunk-size" not in settings_made and dask.config.get("array.chunk-size") == size
    warned = [r.getMessage() for r in caplog.records if "array.chunk-size" in r.getMessage()]
    if size == "128MiB":
        assert warned == [("apsi_memory: dask setting array.chunk-size='128MiB' kept (yours), but a 384.00 MiB "
                           "worker fits chunks of 16.00 MiB: arrays chunked at 128.00 MiB may pause or kill its "
                           "workers")]
    else:
        assert warned == []


def test_control_dasks_default_chunk_size_not_given_is_ours_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DASK_ARRAY__CHUNK_SIZE", raising=False)
    before = dask.config.get("array.chunk-size")
    try:
        assert amd.follow_limit(384 * MiB, 1)["array.chunk-size"] == 16 * MiB
    finally:
        dask.config.set({"array.chunk-size": before})


# -- chunk advice for arrays made before cluster() ------------------------------------------------------------------

def named_arrays(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("apsi_memory: dask array ")]


def test_an_array_chunked_too_big_for_the_workers_is_named_once_when_sent_to_the_cluster(
        sim_machine: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    """cluster() sets the chunk size for the arrays made after it; one made before it, or chunked by hand at dask's
    default 128 MiB, still failed where stock finished (issue 30 item 3). Work sent to the cluster's client names
    each such array once (not the arrays computed from it, whose chunks follow its), with the chunk that fits;
    an array chunked small is not named."""
    import dask.array as da

    from apsi_memory.units import fmt_size

    sim_machine(machines.docker_v1, limit=1 * GiB)  # two workers of 384 MiB: 16 MiB chunks fit
    big = da.zeros((4096, 4096), chunks=(4096, 4096))  # one 128 MiB chunk (dask's zeros take no memory)
    small = da.zeros((4096, 4096), chunks=(256, 4096))  # 8 MiB chunks
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as c, c.get_client() as client, \
            caplog.at_level(logging.WARNING, LOGGER):
        assert (small + 1).sum().compute() == 4096 * 4096
        assert named_arrays(caplog) == []
        assert big.sum().compute() == 0  # dask.compute, through the client
        client.persist(big).sum().compute()  # the same array again, sent another way
        client.compute(big[:1]).result(timeout=WORKERS_WAIT_S)
    limit = amd.worker_memory_limit(2)
    assert named_arrays(caplog) == [
        (f"apsi_memory: dask array {big.name} of shape (4096, 4096) has chunks of {fmt_size(128 * MiB)}, more "
         f"than this cluster's {fmt_size(limit)} workers fit: rechunk it to chunks of {fmt_size(16 * MiB)} or less "
         "(or build it after cluster()), else it may pause or kill them")]


def test_a_distributed_without_the_submission_point_still_makes_clusters(
        sim_machine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk check wraps a private method of distributed's Client; a release without it must cost the advice,
    not the cluster."""
    from distributed import Client

    monkeypatch.delattr(Client, "_graph_to_futures")
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with amd.cluster(n_workers=1, processes=False, dashboard_address=":0") as c:
        assert not hasattr(Client, "_graph_to_futures")
        assert c.workers


def test_to_dask_chunks_fit_the_workers_of_the_cluster_it_runs_on(
        sim_machine: Callable[..., Any], caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """to_dask chunked as map's default blocks, 32 MiB, above the 16 MiB that cluster() sets for 384 MiB workers:
    the library's own arrays were too big for its workers. Its default follows dask's array.chunk-size where that
    is smaller (dask's own 128 MiB leaves map's blocks)."""
    import numpy as np

    import apsi_memory as memory

    x = tmp_path / "x.npy"  # 64 MiB of 8 KiB rows, read by the tasks from the file
    np.save(x, np.zeros((8192, 1024)))
    assert memory.to_dask(x).chunksize == (4096, 1024)  # 32 MiB, map's default, under dask's 128 MiB
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as c, c.get_client(), \
            caplog.at_level(logging.WARNING, LOGGER):
        d = memory.to_dask(x)
        assert d.chunksize == (2048, 1024) and dask.config.get("array.chunk-size") == 16 * MiB
        assert d.sum().compute() == 0
    assert named_arrays(caplog) == []
