"""apsi_memory.dask: worker limits, the pressure plugin, ``map(engine=client)`` against the local ``map``.

One module-scoped ``apsi_memory.dask.cluster`` (2 worker processes × 1 thread) serves every cluster test."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")
pytest.importorskip("dask.array", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

import apsi_memory as memory
from apsi_memory import BlockError, ChunkError, decide
from apsi_memory import dask as amd
from apsi_memory.adapters.dask_workers import group_dask
from apsi_memory.blocks.rules import block_spans
from apsi_memory.cli import commands as cli
from apsi_memory.dask.tasks import EvenSpans, FileRows, first_block, rows_in_file
from apsi_memory.dask.waits import NO_WORKER_SETTING, NO_WORKER_TIMEOUT_S
from apsi_memory.decide import DASK_OUTSIDE_WORKERS_BYTES, Level
from apsi_memory.decide.workers import MAX_PAUSE_S
from apsi_memory.units import fmt_size
from sim import tree as machines
from sim.pressure import PressureMachine
from sim.tree import GiB, MiB
from tests.load import slowdown, stretched

pytestmark = pytest.mark.dask


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two process workers. Restarting one took over 30 s at load 15 on 2 cores: map waits for workers as long
    as the load stretches that (``tests.load``), as a user on such a machine would set it."""
    import dask

    with amd.cluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            cluster.get_client() as c, dask.config.set({NO_WORKER_SETTING: stretched(NO_WORKER_TIMEOUT_S)}):
        yield c


@pytest.fixture(autouse=True)
def clusters_of_this_test_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clusters a test opens share the group with each other (``cluster()`` counts this process's open ones),
    not with the module's ``client`` cluster, which stays open across tests and would change every share."""
    monkeypatch.setattr(amd, "_open", weakref.WeakSet())


def registered_limits(client: Any) -> list[int]:
    return sorted(w["memory_limit"] for w in client.scheduler_info()["workers"].values())


# -- limits on the sim machines (pure rule + the real adapters) -----------------------------------------------------

@pytest.mark.parametrize(("scenario", "kwargs", "usable"), [
    (machines.docker_v1, {"limit": 4 * GiB}, 4 * GiB),
    (machines.kubernetes_v2, {"limit": 4 * GiB}, 4 * GiB),  # the limit is on the parent pod group
    (machines.systemd_slice, {"slice_limit": 2 * GiB}, 2 * GiB),
])
def test_worker_limit_comes_from_the_group_not_the_host(sim_machine: Callable[..., Any], scenario: Any,
                                                        kwargs: dict[str, int], usable: int) -> None:
    sim_machine(scenario, **kwargs)  # hosts of 64 GiB: dask would split those
    assert amd.worker_memory_limit(2) == (usable - DASK_OUTSIDE_WORKERS_BYTES) // 2


def test_memory_high_of_a_systemd_slice_caps_the_workers(sim_machine: Callable[..., Any]) -> None:
    tree = sim_machine(machines.systemd_slice, slice_limit=8 * GiB)
    tree.v2_group("/sys/fs/cgroup/batch.slice", limit=8 * GiB, high=3 * GiB, current=1 * GiB)
    assert amd.worker_memory_limit(4) == (3 * GiB - DASK_OUTSIDE_WORKERS_BYTES) // 4


def test_too_many_workers_for_the_memory_is_refused_with_the_numbers(sim_machine: Callable[..., Any]) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with pytest.raises(ValueError, match=r"1\.0 GB usable cannot hold 8 dask workers"):
        amd.worker_memory_limit(8)


def test_chunk_leaves_three_chunks_per_thread_under_the_pause_fraction() -> None:
    # 413 MiB per worker: 64 MiB chunks got workers restarted (measured); the rule gives 16 MiB
    assert amd.chunk_bytes(413 * MiB) == 16 * MiB
    assert amd.chunk_bytes(413 * MiB, nthreads=4) == 4 * MiB
    assert amd.chunk_bytes(10 * MiB) == 1 * MiB  # never under 1 MiB


def test_cli_dask_limit_prints_the_rule_for_this_machine(sim_machine: Callable[..., Any],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB)
    assert cli.main(["dask-limit", "--workers", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # the first four keys are the interface scripts read; keys are only ever added (nthreads, rechunk, p2p ...)
    assert shown.items() >= {"workers": 2, "usable_bytes": GiB, "memory_limit_bytes": 384 * MiB,
                             "chunk_bytes": 16 * MiB}.items()
    assert cli.main(["dask-limit", "--workers", "2"]) == 0
    assert "--memory-limit 402653184 per worker" in capsys.readouterr().out
    assert cli.main(["dask-limit", "--workers", "9"]) == 1
    assert "cannot hold 9 dask workers" in capsys.readouterr().err


# -- the cluster and its plugins --------------------------------------------------------------------------------

def test_cluster_workers_register_the_limit_from_limits(client: Any) -> None:
    assert registered_limits(client) == [amd.worker_memory_limit(2)] * 2


def _point_at(root: str) -> str:
    """In a worker process: read the kernel files under ``root`` (its default machine's root)."""
    worker = memory.machine()
    old, worker.root = worker.root, root
    return old


def _status(client: Any) -> list[str]:
    return sorted(w["status"] for w in client.scheduler_info()["workers"].values())


def _wait_status(client: Any, wanted: str) -> None:
    # Polls, on purpose: the plugin runs in the worker processes on distributed's own event loop and real clock
    # (its PeriodicCallback), and the scheduler learns a worker's status by message; no thread of this process is
    # awaited, and no FakeClock reaches across processes.
    deadline = time.monotonic() + 15
    while _status(client) != [wanted, wanted] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _status(client) == [wanted, wanted]


def test_plugin_pauses_spills_and_resumes_as_the_scheduler_sees_it(client: Any, tmp_path: Path) -> None:
    import dask.array as da

    sim = PressureMachine(tmp_path / "root", limit=256 * MiB)
    from distributed import wait

    held = client.persist(da.arange(8 * MiB, chunks=MiB, dtype=np.float64))  # 8 chunks of 8 MiB in the workers
    wait(held)
    client.run(_point_at, str(sim.tree))
    try:
        sim.at(Level.HIGH)
        _wait_status(client, "paused")
        sim.at(Level.OK)
        _wait_status(client, "running")
    finally:
        client.run(_point_at, "/")
    actions = [event["action"] for _, event in client.get_events("apsi-pressure")]
    assert actions.count("pause") >= 2 and actions.count("resume") >= 2
    spilled = sum(event.get("spilled_bytes", 0) for _, event in client.get_events("apsi-pressure"))
    assert spilled >= 32 * MiB  # half of the 64 MiB held, at least
    assert float(held.sum().compute()) == (8 * MiB - 1) * 8 * MiB / 2  # spilled data still reads back


class _Worker:
    """What ``PressurePlugin.check`` reads of a worker: status, RSS, limit, events (no SpillBuffer: nothing spills)."""

    def __init__(self, rss: int, limit: int) -> None:
        from distributed.core import Status

        self.status, self.address, self.data, self.events = Status.running, "tcp://sim:1", {}, []
        self.monitor = type("Monitor", (), {"get_process_memory": staticmethod(lambda: rss)})()
        self.memory_manager = type("MemoryManager", (), {"memory_limit": limit})()

    def log_event(self, topic: str, event: dict[str, Any]) -> None:
        self.events.append(event["action"])


def test_a_worker_paused_at_high_resumes_while_the_client_holds_the_group_at_moderate(
        pressure_machine: PressureMachine, caplog: pytest.LogCaptureFixture) -> None:
    """The deadlock: a 1 GiB group held at 67 % by the client (33 % free: moderate, never ok) kept both workers
    paused for good once a spike had paused them. They resume under high, and say why on each change."""
    worker = _Worker(rss=64 * MiB, limit=384 * MiB)
    plugin = amd.PressurePlugin()
    plugin.worker = worker
    with caplog.at_level("WARNING", logger="distributed.apsi_memory"):
        pressure_machine.at(Level.HIGH)
        plugin.check()
        assert str(worker.status) == "Status.paused"
        pressure_machine.set_usage(int(pressure_machine.limit * 0.67))
        plugin.check()
    assert memory.current_level() == Level.MODERATE
    assert str(worker.status) == "Status.running" and worker.events.count("resume") == 1
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "worker tcp://sim:1 paused: pressure high (free ≤ 20 %)",
        "worker tcp://sim:1 resumed: pressure moderate, worker memory 17% of its limit"]


def _held_group(tmp_path: Path, chunk: str) -> tuple[PressureMachine, Any]:
    """Issue 30's deadlock on the sim machine: a 1 GiB group, a 384 MiB worker at 90 MiB; a spike to 85 % used
    pauses it at high, then something outside the workers holds 77 % (high kept: it is left above 25 % free)."""
    import dask

    sim = PressureMachine(tmp_path / "root", limit=GiB)
    worker = _Worker(rss=90 * MiB, limit=384 * MiB)
    with sim.machine.use(), dask.config.set({"array.chunk-size": chunk}):
        plugin = amd.PressurePlugin()
        plugin.worker = worker
        sim.set_usage(int(0.85 * GiB))
        plugin.check()
        assert str(worker.status) == "Status.paused"
        sim.set_usage(int(0.77 * GiB))
        sim.next_measurement()
        plugin.check()
    return sim, plugin


def test_a_worker_paused_at_high_resumes_on_its_own_need_while_the_group_stays_at_77_percent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Workers resumed only under high and 70 % of their limit: a client at 77 % kept them paused for good (a
    1-second task timed out, 2 of 2). With 16 MiB chunks the next task needs 48 MiB, and 235 MiB are free."""
    with caplog.at_level("WARNING", logger="distributed.apsi_memory"):
        sim, plugin = _held_group(tmp_path, "16MiB")
    assert str(plugin.worker.status) == "Status.running" and plugin.worker.events.count("resume") == 1
    with sim.machine.use():
        assert sim.machine.pressure().level == Level.HIGH  # the level the workers stuck at is still there
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records][-1] == (
        "worker tcp://sim:1 resumed: pressure high (free ≤ 25 % (held)) still, but its own need fits: worker memory 23% of "
        "its limit, 235.5 MB free in the group for the 48.0 MB its next tasks need")


def test_a_pause_the_group_cannot_end_ends_after_the_longest_pause_naming_the_signal_and_holders(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """dask's default 128 MiB chunks: the next task needs 217 MiB (up to its own pause line), more than the group
    can spare, so the worker stays paused, then resumes after ``MAX_PAUSE_S`` and says what holds the memory."""
    import dask

    sim, plugin = _held_group(tmp_path, "128MiB")
    assert str(plugin.worker.status) == "Status.paused"
    own = (sim.tree.root / "proc/self/cgroup").read_text()
    for pid, argv, kib in ((4242, "python3\0stranger.py\0", 600 * 1024), (os.getpid(), "python3\0-c\0", 92160)):
        sim.tree.write(f"/proc/{pid}/cgroup", own)
        sim.tree.write(f"/proc/{pid}/cmdline", argv)
        sim.tree.write(f"/proc/{pid}/status", f"Name:\tpython3\nVmRSS:\t{kib} kB\n")
    with sim.machine.use(), dask.config.set({"array.chunk-size": "128MiB"}), \
            caplog.at_level("WARNING", logger="distributed.apsi_memory"):
        sim.clock.advance(MAX_PAUSE_S - 1)
        plugin.check()
        assert str(plugin.worker.status) == "Status.paused"
        sim.clock.advance(1)
        plugin.check()
    assert str(plugin.worker.status) == "Status.running"
    assert caplog.records[-1].getMessage() == (
        "apsi_memory: worker tcp://sim:1 resumed after 30 s paused, the longest pause (apsi-memory.max-pause): "
        "pressure high (free ≤ 25 % (held)) still; the group's memory: 788.5 MB used of 1.0 GB: pid 4242 (python3 "
        "stranger.py) 600.0 MB, this worker 90.0 MB, 98.5 MB in no process's RSS (page cache, shared memory, the "
        "kernel)")


@pytest.mark.parametrize(("setting", "seconds"), [(None, 30.0), (5, 5.0), ("2 minutes", 120.0), (float("inf"), None)])
def test_the_longest_pause_comes_from_the_dask_setting(setting: Any, seconds: float | None) -> None:
    import dask

    with dask.config.set({"apsi-memory.max-pause": setting}):
        assert amd.PressurePlugin().max_pause == (float("inf") if seconds is None else seconds)
    assert amd.PressurePlugin(max_pause=7).max_pause == 7.0
    with pytest.raises(memory.ArgumentError, match="apsi-memory.max-pause"):
        amd.max_pause_s(-1)


def test_memory_limit_plugin_restarts_running_workers_with_the_new_limit(client: Any) -> None:
    client.register_plugin(amd.MemoryLimitPlugin(4))
    try:
        client.wait_for_workers(2, timeout=stretched(30))
        assert registered_limits(client) == [amd.worker_memory_limit(4)] * 2
    finally:
        client.register_plugin(amd.MemoryLimitPlugin(2))
        client.wait_for_workers(2, timeout=stretched(30))
    assert registered_limits(client) == [amd.worker_memory_limit(2)] * 2


def test_preload_nanny_sets_the_limit_before_the_workers_register() -> None:
    """``dask worker --preload-nanny apsi_memory.dask``, here through LocalCluster's own preload_nanny option."""
    from distributed import LocalCluster

    from apsi_memory.dask.nanny import group_check

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      preload_nanny=["apsi_memory.dask"]) as stock, stock.get_client() as c:
        assert registered_limits(c) == [amd.worker_memory_limit(2)] * 2  # stock: half of the host each
        assert sum(len(p) for p in c.run(lambda dask_worker: list(dask_worker.plugins)).values()) >= 2
        monitors = [nanny.periodic_callbacks["memory_monitor"] for nanny in stock.workers.values()]
        # the nannies kill only for a full group, as cluster()'s do, and their check runs
        assert [(m.callback.func, m.is_running()) for m in monitors] == [(group_check, True)] * 2


def test_preload_nanny_gives_its_workers_the_p2p_settings_of_their_limit() -> None:
    """The preload's workers kept dask's p2p settings: a 1 GiB comm buffer in a small worker, and the 2 MiB message
    limit under which each sender kept the last shard it sent. A nanny takes the config it hands its workers before
    its preload runs; the preload now sets theirs, and a value the user set is kept."""
    import dask
    from distributed import LocalCluster

    before = {key: dask.config.get(key) for key in decide.dask_settings(1 << 30)}
    with dask.config.set({"distributed.p2p.storage.buffer": "7MiB"}), LocalCluster(
            n_workers=1, threads_per_worker=1, dashboard_address=":0", preload_nanny=["apsi_memory.dask"]) as stock, \
            stock.get_client() as c:
        (limit,) = registered_limits(c)
        (on,) = c.run(_settings_on).values()
    wanted = decide.dask_settings(limit)
    assert on["distributed.p2p.comm.buffer"] == wanted["distributed.p2p.comm.buffer"]
    assert on["distributed.p2p.comm.message-bytes-limit"] == decide.P2P_MESSAGE_BYTES
    assert on["distributed.p2p.storage.buffer"] == 7 << 20  # the user's
    assert {key: dask.config.get(key) for key in before} == before  # the nanny's process: its own, untouched


def _settings_on(dask_worker: Any) -> dict[str, Any]:
    import dask

    shuffle = dask_worker.extensions["shuffle"]
    return {"array.chunk-size": dask.config.get("array.chunk-size"),
            "distributed.p2p.comm.buffer": shuffle.memory_limiter_comms.limit,
            "distributed.p2p.storage.buffer": shuffle.memory_limiter_disk.limit,
            "distributed.p2p.comm.message-bytes-limit": dask.config.get("distributed.p2p.comm.message-bytes-limit"),
            "array.rechunk.method": dask.config.get("array.rechunk.method")}


def test_cluster_sets_the_chunk_size_p2p_buffers_and_rechunk_method_its_limit_implies(client: Any) -> None:
    """Dask's 128 MiB chunks and p2p's 1 GiB comm buffer per worker did not fit a 384 MiB worker: stock finished
    where cluster() hung. Both follow the limit, here (where graphs are built) and on every worker."""
    import dask

    wanted = decide.dask_settings(amd.worker_memory_limit(2))
    assert {key: dask.config.get(key) for key in wanted} == wanted
    assert list(client.run(_settings_on).values()) == [wanted, wanted]


def test_scale_shares_the_memory_again_and_each_thread_worker_has_its_own_plugin() -> None:
    """cluster(2).scale(4) gave 4 workers of the 2-worker limit; with processes=False one PressurePlugin was shared
    by the workers, and only the last one was ever paused."""
    import dask

    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as c, c.get_client() as cl:
        c.scale(4)
        cl.wait_for_workers(4, timeout=stretched(30))
        four = amd.worker_memory_limit(4)
        assert registered_limits(cl) == [four] * 4
        assert sorted(w.memory_manager.memory_limit for w in c.workers.values()) == [four] * 4
        assert [w.data.n for w in c.workers.values()] == [int(four * decide.DASK_SPILL_TARGET)] * 4  # kept in RAM
        assert dask.config.get("array.chunk-size") == amd.chunk_bytes(four)
        plugins = {address: w.plugins["apsi-pressure"] for address, w in
                   ((w.address, w) for w in c.workers.values())}
        assert len({id(p) for p in plugins.values()}) == 4
        assert all(p.worker.address == address for address, p in plugins.items())


def _limits_become(client: Any, wanted: list[int]) -> None:
    deadline = time.monotonic() + stretched(30)
    while registered_limits(client) != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert registered_limits(client) == wanted


def test_adapt_shares_the_memory_between_the_workers_it_starts() -> None:
    with amd.cluster(n_workers=1, processes=False, dashboard_address=":0") as c, c.get_client() as cl:
        c.adapt(minimum=3, maximum=3, interval="100ms")
        cl.wait_for_workers(3, timeout=stretched(30))
        _limits_become(cl, [amd.worker_memory_limit(3)] * 3)


def test_a_second_cluster_shares_the_group_with_the_first(sim_machine: Callable[..., Any]) -> None:
    """Two cluster() in one process each gave its workers the group's share: 4 x 384 MiB of workers in 1 GiB
    (issue 30 item 6). The second shares it with the first's workers, which get the larger share back when it
    closes; scaling either counts the other's workers."""
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=300 * MiB)
    two, three, four = (amd.worker_memory_limit(n) for n in (2, 3, 4))
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as first, first.get_client() as a:
        with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as second, \
                second.get_client() as b:
            assert registered_limits(b) == [four] * 2
            _limits_become(a, [four] * 2)
            second.scale(1)
            _limits_become(a, [three] * 2)
            _limits_become(b, [three])
        _limits_become(a, [two] * 2)


def test_asynchronous_clusters_share_the_group_on_their_common_event_loop(sim_machine: Callable[..., Any]) -> None:
    """cluster(asynchronous=True) runs on the caller's event loop, as a second one does: sharing from that loop is
    started there, not waited for (waiting would block the loop it needs)."""
    import asyncio

    sim_machine(machines.docker_v1, limit=1 * GiB, usage=300 * MiB)
    one, two, three = (amd.worker_memory_limit(n) for n in (1, 2, 3))

    async def limits_become(c: Any, wanted: list[int]) -> None:
        deadline = time.monotonic() + stretched(30)
        while _worker_limits(c) != wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert _worker_limits(c) == wanted

    async def run() -> None:
        async with amd.cluster(n_workers=1, processes=False, asynchronous=True, dashboard_address=":0") as first:
            await limits_become(first, [one])
            async with amd.cluster(n_workers=1, processes=False, asynchronous=True, dashboard_address=":0") as second:
                await limits_become(first, [two])
                await second.scale(2)
                await limits_become(second, [three] * 2)
                await limits_become(first, [three])

    asyncio.run(asyncio.wait_for(run(), stretched(120)))


def _worker_limits(c: Any) -> list[int]:
    return sorted(w.memory_manager.memory_limit for w in c.workers.values() if w.status.name == "running")


def _pid_and_rss() -> tuple[int, int]:
    import psutil

    return os.getpid(), int(psutil.Process().memory_info().rss)


def _nanny_limits(c: Any) -> list[int]:
    return sorted(nanny.memory_manager.memory_limit for nanny in c.workers.values())


def test_scale_up_keeps_the_running_workers_and_their_data(sim_machine: Callable[..., Any], tmp_path: Path) -> None:
    """cluster(2).scale(4) gave the running workers' nannies the smaller share at once: each worker holding more
    than its terminate line was killed by its own nanny and its data recomputed (2 of 2 runs). They now spill down
    to the new share first; only then does their nanny apply it."""
    import dask
    import dask.array as da
    from distributed import futures_of, wait

    sim_machine(machines.docker_v1, limit=1 * GiB, usage=300 * MiB)  # the workers read it too (APSI_FS_ROOT)
    four = amd.worker_memory_limit(4)
    with amd.cluster(n_workers=2, processes=True, dashboard_address=":0", local_directory=str(tmp_path)) as c, \
            c.get_client() as cl:
        # 16 chunks of 8 MiB in each: chunks of the size that fits the new share (chunk_bytes), not dask's 128 MiB,
        # so that reading them back after the spill does not pause the smaller workers
        held = [cl.persist(da.arange(16 * MiB, chunks=MiB, dtype=np.float64) + number, workers=[address])
                for number, address in enumerate(cl.scheduler_info()["workers"])]
        wait(held)
        before = cl.run(_pid_and_rss)
        over = dask.config.get("distributed.worker.memory.terminate") * four
        assert all(rss > over for _, rss in before.values()), (before, fmt_size(int(over)))  # each would be killed
        c.scale(4)
        cl.wait_for_workers(4, timeout=stretched(60))
        deadline = time.monotonic() + stretched(30)
        while _nanny_limits(c) != [four] * 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _nanny_limits(c) == [four] * 4  # the old workers too, once they spilled down to it
        after = cl.run(_pid_and_rss)
        assert {address: after.get(address, (None,))[0] for address in before} == \
            {address: pid for address, (pid, _) in before.items()}  # the same worker processes, none restarted
        assert not cl.get_events("worker-restart-memory")
        assert set().union(*cl.who_has(futures_of(held)).values()) == set(before)  # the data where it was
        n = 16 * MiB  # pinned to a killed worker, a chunk would wait for it for ever: hence the timeout
        sums = cl.compute([x.sum() for x in held])
        assert [s.result(timeout=stretched(60)) for s in sums] == [n * (n - 1) // 2 + n * i for i in (0, 1)]


@given(rss=st.integers(0, GiB), current=st.integers(128 * MiB, GiB), wanted=st.integers(128 * MiB, GiB))
def test_a_nanny_takes_a_smaller_limit_only_once_its_worker_fits_under_it(rss: int, current: int, wanted: int) -> None:
    now = decide.nanny_limit_now(rss, current, wanted)
    assert now in (current, wanted)
    assert now >= current or rss <= decide.DASK_TERMINATE_FRACTION * now  # lowering it kills no worker
    assert now == wanted or rss > decide.DASK_SPILL_FRACTION * wanted  # and it gets there once the worker fits

@given(rss=st.integers(0, GiB), limit=st.integers(64 * MiB, GiB), free=st.integers(0, 2 * GiB),
       usable=st.integers(GiB, 2 * GiB))
def test_a_nanny_kills_its_worker_over_its_share_only_when_the_group_is_nearly_full(rss: int, limit: int, free: int,
                                                                                 usable: int) -> None:
    """Issue 30's matrix: in a 1 GiB group a rechunk of 128 MiB chunks (made before cluster()) needs more than a
    384 MiB worker's share for one task; the nanny killed it at 95 % of the share 7 times (KilledWorker) while the
    group had room, where stock dask, killed by nothing, finished."""
    terminate = decide.DASK_TERMINATE_FRACTION
    kills = decide.nanny_kills(rss, limit, terminate, free, usable)
    over, full = rss > terminate * limit, free < (1 - terminate) * usable
    assert kills == (over and full)


class _Manager:
    """A nanny's memory manager whose kill is recorded, not done."""

    memory_terminate_fraction = decide.DASK_TERMINATE_FRACTION

    def __init__(self) -> None:
        self.memory_limit, self.killed = MiB, False  # any test process is over 95 % of 1 MiB

    def memory_monitor(self, nanny: Any) -> None:
        self.killed = True


def test_of_nannies_over_their_line_in_a_full_group_one_kills_till_its_worker_is_gone(
        sim_machine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Four workers of 128 MiB chunks in 1 GiB: three nannies killed their workers in the same 100 ms, where one
    worker's memory was enough; the others' readings still counted the dying worker's memory."""
    from types import SimpleNamespace

    from apsi_memory.dask import nanny as nannies

    sim_machine(machines.docker_v1, limit=1 * GiB, usage=GiB - 8 * MiB, inactive_file=0)  # the group nearly full
    monkeypatch.setattr(nannies, "_dying", set())  # the second "worker" is this process: it never goes
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline()  # running: its RSS is the interpreter's
        first, second = (SimpleNamespace(memory_manager=_Manager(), process=SimpleNamespace(process=process))
                         for process in (sleeper, SimpleNamespace(pid=os.getpid())))
        nannies.group_check(first)
        nannies.group_check(second)
        assert (first.memory_manager.killed, second.memory_manager.killed) == (True, False)
    finally:
        sleeper.kill()
        sleeper.wait()
    nannies.group_check(second)  # the first's worker has gone: its memory is out of the reading
    assert second.memory_manager.killed


def _hold_on_worker(nbytes: int) -> int:
    import numpy as np

    global _held_here
    _held_here = np.ones(nbytes // 8)  # touched: RSS
    return os.getpid()


def test_a_worker_over_its_share_runs_on_while_the_group_has_room(sim_machine: Callable[..., Any],
                                                                   tmp_path: Path) -> None:
    """The nanny killed a worker at 95 % of its share whatever the group held (dask's rule): now only once the group
    is nearly full too (``decide.nanny_kills``), which is when the kernel would kill something."""
    tree = sim_machine(machines.docker_v1, limit=1 * GiB, usage=300 * MiB)  # the nannies read it here
    with amd.cluster(n_workers=1, processes=True, memory_limit=160 * MiB, dashboard_address=":0",
                     local_directory=str(tmp_path)) as c, c.get_client() as cl:
        pid = next(iter(cl.run(_hold_on_worker, 200 * MiB).values()))  # over 95 % of 160 MiB
        time.sleep(stretched(2))  # 20 of the nanny's checks
        assert not cl.get_events("worker-restart-memory")
        assert list(cl.run(os.getpid).values()) == [pid]
        tree.v1_group("/sys/fs/cgroup/memory", 1 * GiB, usage=GiB - 8 * MiB)  # the group nearly full: now it must go
        deadline = time.monotonic() + stretched(30)
        while not cl.get_events("worker-restart-memory") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cl.get_events("worker-restart-memory")


def test_scale_by_cores_shares_the_memory_too() -> None:
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as c, c.get_client() as cl:
        c.scale(cores=3)
        cl.wait_for_workers(3, timeout=stretched(30))
        assert registered_limits(cl) == [amd.worker_memory_limit(3)] * 3


def test_scale_by_memory_shares_the_memory_too(caplog: pytest.LogCaptureFixture) -> None:
    """scale(memory=…) started its workers at the old share: 3 workers of the 2-worker limit (issue 30 item 2).
    More workers do not give a group more memory: a WARNING says what they share."""
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0") as c, c.get_client() as cl, \
            caplog.at_level(logging.WARNING, "distributed.apsi_memory"):
        asked = 2 * amd.worker_memory_limit(2) + 1  # dask's rule: one worker more than two of today's share
        c.scale(memory=asked)
        cl.wait_for_workers(3, timeout=stretched(30))
        three = amd.worker_memory_limit(3)
        assert registered_limits(cl) == [three] * 3
    assert [r.getMessage() for r in caplog.records if "scale(memory=" in r.getMessage()] == [
        (f"apsi_memory: scale(memory={asked}): more workers do not add memory to a group; its 3 workers share "
         f"{fmt_size(3 * three)} ({fmt_size(three)} each)")]


def test_adapt_scaling_down_gives_the_remaining_workers_the_larger_share() -> None:
    with amd.cluster(n_workers=3, processes=False, dashboard_address=":0") as c, c.get_client() as cl:
        c.adapt(minimum=1, maximum=1, interval="100ms", wait_count=1)
        _limits_become(cl, [amd.worker_memory_limit(1)])
        assert [w.memory_manager.memory_limit for w in c.workers.values()] == [amd.worker_memory_limit(1)]


def test_memory_limit_auto_is_the_groups_share_not_the_hosts(sim_machine: Callable[..., Any]) -> None:
    """cluster(memory_limit="auto") gave dask's own "auto", the host's share: 12,052 MiB each in a 1 GiB group."""
    sim_machine(machines.docker_v1, limit=1 * GiB)  # a host of 64 GiB
    with amd.cluster(n_workers=2, processes=False, memory_limit="auto", dashboard_address=":0") as c, \
            c.get_client() as cl:
        assert registered_limits(cl) == [amd.worker_memory_limit(2)] * 2 == [(GiB - DASK_OUTSIDE_WORKERS_BYTES) // 2] * 2


def test_an_explicit_memory_limit_above_the_share_is_kept_and_warned_of(sim_machine: Callable[..., Any]) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB)
    share = amd.worker_memory_limit(2)
    with pytest.warns(memory.BudgetWarning, match=f"memory_limit='1GiB'\\): {fmt_size(GiB)} is more than each of 2 "
                                                    f"workers' share of the memory here, {fmt_size(share)}"):
        made = amd.cluster(n_workers=2, processes=False, memory_limit="1GiB", dashboard_address=":0")
    with made as c, c.get_client() as cl:
        assert registered_limits(cl) == [GiB] * 2  # the caller's word is kept


def test_control_an_explicit_memory_limit_within_the_share_warns_of_nothing(sim_machine: Callable[..., Any]) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB)
    with amd.cluster(n_workers=2, processes=False, memory_limit="256MiB", dashboard_address=":0") as c, \
            c.get_client() as cl:
        assert registered_limits(cl) == [256 * MiB] * 2


def test_the_settings_a_cluster_made_go_with_it(sim_machine: Callable[..., Any]) -> None:
    """cluster() changed dask.config for the rest of the process: arrays chunked after it closed still got its
    16 MiB chunks. Closed, the process's settings are those from before; one the user set meanwhile stays."""
    import dask

    sim_machine(machines.docker_v1, limit=1 * GiB)
    keys = list(decide.dask_settings(amd.worker_memory_limit(2)))
    before = {key: dask.config.get(key) for key in keys}
    with amd.cluster(n_workers=2, processes=False, dashboard_address=":0"):
        assert {key: dask.config.get(key) for key in keys} != before
    assert {key: dask.config.get(key) for key in keys} == before
    try:
        with amd.cluster(n_workers=2, processes=False, dashboard_address=":0"):
            dask.config.set({"array.chunk-size": "3MiB"})  # the user's, while the cluster runs
        assert dask.config.get("array.chunk-size") == "3MiB"
        assert dask.config.get("array.rechunk.method") == before["array.rechunk.method"]
    finally:
        dask.config.set(before)


def test_settings_the_user_made_are_kept() -> None:
    import dask

    with dask.config.set({"array.chunk-size": "7MiB"}):
        settings = amd.follow_limit(384 * MiB, 1)
        assert "array.chunk-size" not in settings and dask.config.get("array.chunk-size") == "7MiB"
    assert settings["distributed.p2p.comm.buffer"] == int(384 * MiB * decide.P2P_BUFFER_SHARE)


SCHEDULER_AND_WORKER = """
import json, os, subprocess, sys, time
from distributed import Client
if __name__ == "__main__":
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                              "--scheduler-file", "s.json", "--no-dashboard"], stderr=subprocess.DEVNULL)
    while not os.path.exists("s.json"):
        time.sleep(0.1)
    time.sleep(0.5)
    prefix = json.loads(os.environ.get("APSI_TEST_WORKER_PREFIX", "[]"))  # the worker alone in a group
    worker = subprocess.Popen([*prefix, sys.executable, "-m", "distributed.cli.dask_worker",
                               "--scheduler-file", "s.json",
                               "--nworkers", "2", "--nthreads", "1", "--no-dashboard", *sys.argv[1:]],
                              stderr=open("worker.log", "w"))
    try:
        waits = 60 * float(os.environ["APSI_TEST_SLOWDOWN"])
        with Client(scheduler_file="s.json", timeout=waits) as c:
            c.wait_for_workers(2, timeout=waits)
            workers = c.scheduler_info()["workers"].values()
            plugins = c.run(lambda dask_worker: sorted(dask_worker.plugins))
            oom = c.run(lambda: open("/proc/self/oom_score_adj").read().strip())
            print(json.dumps({"limits": sorted(w["memory_limit"] for w in workers),
                              "plugins": sorted(p for ps in plugins.values() for p in ps),
                              "oom_score_adj": sorted(oom.values())}))
    finally:
        worker.terminate(); worker.wait(30); sched.terminate(); sched.wait(30)
"""


def _dask_worker(tmp_path: Path, *args: str, group: Any = None,
                 worker_only: bool = False) -> tuple[dict[str, Any], str]:
    """A client, a ``dask scheduler`` and a ``dask worker --nworkers 2 ARGS``, all in ``group`` (a real cgroup) if
    given, or the worker alone there (``worker_only``: client and scheduler outside, as in a worker-only pod)."""
    script = tmp_path / "run.py"
    script.write_text(SCHEDULER_AND_WORKER)
    argv = [sys.executable, str(script), *args]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "APSI_TEST_SLOWDOWN": str(slowdown())}
    if worker_only:
        env["APSI_TEST_WORKER_PREFIX"], group = json.dumps(group.wrap([])), None
    if group is None and (strangers := list(group_dask().workers)):
        # their workers share this group's memory too (as they should): the expected share would be a guess
        pytest.skip(f"{len(strangers)} dask worker processes of another job run in this test's cgroup")
    if group is None:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=stretched(120),
                              check=False)
    else:
        done = group.run(argv, timeout=stretched(120), cwd=tmp_path, env=env)
    log = (tmp_path / "worker.log").read_text()
    assert done.returncode == 0, done.stderr[-2000:] + log[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), log


def _share(usable: int, client_too: bool = True) -> int:
    """Each of 2 workers' share: usable less one ``dask worker`` process, and less the client's and scheduler's
    256 MiB where they share the group (as the test runner and the script do on the host)."""
    outside = decide.DASK_WORKER_PROCESS_BYTES + (DASK_OUTSIDE_WORKERS_BYTES if client_too else 0)
    return (usable - outside) // 2


def test_the_preload_leaves_a_scheduler_and_client_in_its_group_their_memory(sim_machine: Callable[..., Any]) -> None:
    """With no scheduler in its own process the preload took every group for a worker-only pod: beside a
    scheduler and a client, 2 workers took 464 MiB each of 1 GiB (issue 30 item 5)."""
    tree = sim_machine(machines.docker_v1, limit=1 * GiB, usage=300 * MiB)
    own = (tree.root / "proc/self/cgroup").read_text()
    for pid, argv in ((101, ["python3", "-m", "distributed.cli.dask_worker", "--nworkers", "2"]),
                      (102, ["python3", "-m", "distributed.cli.dask_scheduler"]), (103, ["python3", "client.py"])):
        tree.write(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
        tree.write(f"/proc/{pid}/cgroup", own if pid == 101 else "0::/elsewhere\n")
    assert amd._chosen_limit(None, 1, 2, scheduler_here=False) == (GiB - decide.DASK_WORKER_PROCESS_BYTES) // 2
    for pid in (102, 103):
        tree.write(f"/proc/{pid}/cgroup", own)  # now in the worker's group
    assert amd._chosen_limit(None, 1, 2, scheduler_here=False) == \
        (GiB - decide.DASK_WORKER_PROCESS_BYTES - DASK_OUTSIDE_WORKERS_BYTES) // 2

def test_dask_worker_preload_works_and_shares_the_memory_between_its_workers(tmp_path: Path) -> None:
    """``dask worker --preload apsi_memory.dask --nworkers 2`` logged a traceback and started each worker with the
    host's memory. Each now gets half of what is usable less one ``dask worker`` process and the client's and
    scheduler's memory (both run here), says so in the worker log, and runs PressurePlugin."""
    shown, log = _dask_worker(tmp_path, "--preload", "apsi_memory.dask")
    share = _share(memory.limits().usable_bytes)
    assert shown["limits"] == [share] * 2, log[-3000:]
    assert shown["plugins"].count("apsi-pressure") == 2
    assert shown["oom_score_adj"] == ["1000"] * 2  # the kernel kills a worker first where the group is full
    assert "Traceback" not in log and log.count(f"worker memory limit {fmt_size(share)} (2 workers") == 2


def test_an_explicit_memory_limit_is_kept_and_one_above_the_share_warned_of(tmp_path: Path) -> None:
    usable = memory.limits().usable_bytes
    asked = (usable - 64 * MiB) >> 20  # more than half, within what dask itself accepts
    shown, log = _dask_worker(tmp_path, "--preload-nanny", "apsi_memory.dask", "--memory-limit", f"{asked}MiB")
    assert shown["limits"] == [asked * MiB] * 2 and shown["plugins"].count("apsi-pressure") == 2
    assert shown["oom_score_adj"] == ["1000"] * 2
    assert f"--memory-limit {fmt_size(asked * MiB)} kept, but it is more than this worker's share" in log


@pytest.mark.real
@pytest.mark.parametrize("worker_only", [True, False])
def test_in_a_real_1gib_group_dask_worker_preload_leaves_room_for_what_else_runs_there(
        memcg: Any, tmp_path: Path, worker_only: bool) -> None:
    """Alone in its group (a worker-only pod) each of 2 workers gets half of 1 GiB less its ``dask worker``
    process. With the scheduler and client in the group too, it took the same 464 MiB (928 MiB of workers beside
    them): they now leave them 256 MiB (issue 30 item 5)."""
    with memcg(GiB, prefix=f"apsi-i22dask-{os.getpid()}") as group:
        shown, log = _dask_worker(tmp_path, "--preload", "apsi_memory.dask", group=group, worker_only=worker_only)
        kills = group.oom_kills()
    assert shown["limits"] == [_share(GiB, client_too=not worker_only)] * 2, log[-3000:]
    assert kills == 0


# -- map(engine=client) equals the local map ----------------------------------------------------------------------

def twice_plus_one(block: np.ndarray) -> np.ndarray:
    return block * 2 + 1


def same(local: np.ndarray, remote: np.ndarray) -> None:
    assert (remote.shape, remote.dtype) == (local.shape, local.dtype)
    assert remote.tobytes() == local.tobytes()


def both(fn: Callable[[np.ndarray], np.ndarray], x: Any, rows: int, client: Any) -> tuple[np.ndarray, np.ndarray]:
    return memory.map(fn, x, rows=rows), memory.map(fn, x, rows=rows, engine=client)


def test_in_ram_input(client: Any) -> None:
    x = np.random.default_rng(1).standard_normal((10_000, 7))
    same(*both(twice_plus_one, x, 999, client))


def test_npy_input_and_memmap_input(client: Any, tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(30_000, dtype=np.int32).reshape(10_000, 3))
    same(*both(twice_plus_one, str(path), 1000, client))
    same(*both(twice_plus_one, np.load(path, mmap_mode="r")[2000:7001], 1000, client))


def test_private_memmap_changes_are_seen(client: Any, tmp_path: Path) -> None:
    """np.memmap mode "c": changes live in this process only, so the file must not be handed to the workers."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((5000, 2)))
    x = np.load(path, mmap_mode="c")
    x[1234] = 7.0
    local, remote = both(twice_plus_one, x, 1000, client)
    same(local, remote)
    assert remote[1234, 0] == 15.0


def test_one_dimensional_input_with_a_new_dtype(client: Any) -> None:
    x = np.arange(12_345, dtype=np.int16)
    same(*both(lambda b: b.astype(np.float32) / 3, x, 1000, client))


def test_empty_input(client: Any) -> None:
    local, remote = both(lambda b: b.sum(axis=1), np.zeros((0, 4), np.float32), 10, client)
    same(local, remote)
    assert remote.shape == (0,)


def test_spilled_output(client: Any) -> None:
    memory.budget("1MB")  # the local output goes to a spill file too
    x = np.random.default_rng(2).standard_normal((200_000, 4))
    local, remote = both(twice_plus_one, x, 20_000, client)
    assert memory.on_disk(local) and memory.on_disk(remote)
    same(local, remote)


def fails_on_row_3500(block: np.ndarray) -> np.ndarray:
    if block[0] <= 3500 < block[0] + len(block):
        raise ValueError("row 3500 is bad")
    return block + 1


def test_block_error_names_the_same_block_and_frees_the_output(client: Any,
                                                              private_apsi_home: Path) -> None:
    x = np.arange(10_000.0)
    errors = []
    for engine in (None, client):
        with pytest.raises(BlockError) as caught:
            memory.map(fails_on_row_3500, x, rows=1000, engine=engine)
        errors.append(caught.value)
    assert str(errors[1]) == str(errors[0]) == "fn failed on rows 3000:4000 (block 4 of 10): ValueError: row 3500 is bad"
    assert isinstance(errors[1].__cause__, ValueError)
    spill_dir = private_apsi_home / "spill"
    assert not spill_dir.exists() or not list(spill_dir.iterdir())  # input copy and output both deleted


def float32_in_block_3(block: np.ndarray) -> np.ndarray:
    return block.astype(np.float32) if block[0] == 2000 else block * 1.0


def test_dtype_mismatch_names_the_block(client: Any) -> None:
    x = np.arange(5000.0)
    messages = []
    for engine in (None, client):
        with pytest.raises(ChunkError) as caught:
            memory.map(float32_in_block_3, x, rows=1000, engine=engine)
        messages.append(str(caught.value))
    assert messages[1] == messages[0] and "rows 2000:3000 (block 3 of 5)" in messages[0]


class _Counting:
    """A client that notes, at each submit, how many of the futures it handed out are still referenced (by the
    caller: ``map``) and how big the task's arguments pickle (everything but ``fn``)."""

    def __init__(self, client: Any) -> None:
        self.client, self.most_futures, self.most_bytes = client, 0, 0
        self.alive: weakref.WeakSet[Any] = weakref.WeakSet()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.most_futures = max(self.most_futures, len(self.alive))
        self.most_bytes = max(self.most_bytes, len(pickle.dumps(args[2:])))
        future = self.client.submit(*args, **kwargs)
        self.alive.add(future)
        return future


def test_a_1000_block_map_sends_and_keeps_a_bounded_amount_per_block(client: Any) -> None:
    """Each task carried the list of all the blocks and every future was kept to the end: 1,000 blocks took 33 s
    (0.3 s locally), 10,000 never finished. Now a task's arguments and the futures held do not grow with the count
    (timings: benchmarks/bench_dask_map.py)."""
    x = np.arange(4000.0).reshape(1000, 4)
    counting = _Counting(client)
    same(memory.map(twice_plus_one, x, rows=1), memory.map(twice_plus_one, x, rows=1, engine=counting))
    assert counting.most_bytes < 1024
    # those in flight, and those just finished until the next wait: never the 999 of a run that keeps them all
    assert counting.most_futures <= 2 * decide.CLUSTER_MAX_IN_FLIGHT


def _tasks_run(client: Any, run: Callable[[], np.ndarray]) -> tuple[np.ndarray, int]:
    """``run()``'s result and how many tasks the cluster ran for it (its task stream)."""
    from distributed import get_task_stream

    with get_task_stream(client) as stream:
        out = run()
    return out, len(stream.data)


def test_a_1000_block_map_runs_several_blocks_a_task_with_the_same_bytes(
        client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29: one task a block cost a scheduler round trip each, 2.1x dask's own graph over 1,000 blocks. A task
    now runs its blocks for ~100 ms (block 0 is timed): microsecond blocks go 250 a task, two tasks a thread. The
    progress bar still counts the rows of every block."""
    x = np.arange(4000.0).reshape(1000, 4)
    remote, tasks = _tasks_run(client, lambda: memory.map(twice_plus_one, x, rows=1, engine=client, progress=True))
    same(memory.map(twice_plus_one, x, rows=1), remote)
    assert tasks <= 100, f"{tasks} tasks for 1,000 blocks"  # one a block before: 1,000
    err = capsys.readouterr().err
    assert "1.00k/1.00k" in err and "rows" in err


def test_blocks_slower_than_a_task_go_one_a_task(client: Any) -> None:
    """A block longer than a task's ~100 ms is a task of its own, so the threads share the work block by block."""
    out, tasks = _tasks_run(client, lambda: memory.map(slow_twice, np.ones((6, 2)), rows=1, engine=client))
    assert tasks == 6 and np.array_equal(out, np.full((6, 2), 2.0))


def fails_on_rows_3500_and_9000(block: np.ndarray) -> np.ndarray:
    if block[0] <= 3500 < block[0] + len(block) or block[0] <= 9000 < block[0] + len(block):
        raise ValueError(f"row {3500 if block[0] < 5000 else 9000} is bad")
    return block + 1


def test_a_failing_block_inside_a_batch_is_named_as_locally(client: Any, private_apsi_home: Path) -> None:
    """A batch of blocks fails with its first failing block's own rows, not the batch's; and a later batch failing
    too (maybe first) does not change which block is named: the first failing one in row order."""
    x = np.arange(10_000.0)
    with pytest.raises(BlockError) as local:
        memory.map(fails_on_rows_3500_and_9000, x, rows=10)
    with pytest.raises(BlockError) as remote:
        memory.map(fails_on_rows_3500_and_9000, x, rows=10, engine=client)
    assert str(remote.value) == str(local.value) == ("fn failed on rows 3500:3510 (block 351 of 1000): ValueError: "
                                                     "row 3500 is bad")
    assert isinstance(remote.value.__cause__, ValueError)
    spill_dir = private_apsi_home / "spill"
    assert not spill_dir.exists() or not list(spill_dir.iterdir())


def spins_for_50_ms_of_cpu(block: np.ndarray) -> np.ndarray:
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    return block


def test_block_0_is_timed_less_its_waits_for_a_cpu(tmp_path: Path) -> None:
    """Block 0's time sizes the batches. Sharing one CPU with a busy process, its 50 ms of work took twice that or
    more of wall time; counted whole, that would halve the batches (at load 12, cut them to a block or two)."""
    np.save(tmp_path / "x.npy", np.zeros((10, 2)))
    rows = rows_in_file(str(tmp_path / "x.npy"))
    assert rows is not None
    kept = os.sched_getaffinity(0)
    cpu = min(kept)
    rival = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        time.sleep(0.2)  # the rival is spinning
        os.sched_setaffinity(0, {cpu})  # this thread only
        began = time.perf_counter()
        _, seconds = first_block(spins_for_50_ms_of_cpu, rows, EvenSpans(10, 10))
        wall = time.perf_counter() - began
    finally:
        os.sched_setaffinity(0, kept)
        rival.kill()
        rival.wait()
    assert 0.045 < seconds < 0.75 * wall, (seconds, wall)


@pytest.mark.parametrize(("blocks", "threads", "block_s", "block_bytes", "share", "per_task"), [
    (999, 2, 1e-5, 32, 0, 250),          # tiny blocks: two tasks a thread
    (999, 2, 0.004, 32, 0, 25),          # 4 ms blocks: 100 ms a task
    (999, 2, 0.5, 32, 0, 1),             # slower than a task: one a task
    (999, 2, 1e-5, 1 << 20, 8 << 20, 8),  # 1 MiB blocks, 8 MiB a thread
    (1, 4, 0.0, 32, 0, 1),
])
def test_blocks_per_task_take_100_ms_within_the_threads_share(blocks: int, threads: int, block_s: float,
                                                             block_bytes: int, share: int, per_task: int) -> None:
    assert decide.cluster_blocks_per_task(blocks, threads, block_s, block_bytes, share) == per_task


@given(st.integers(0, 5000), st.integers(1, 700))
def test_even_spans_are_the_local_maps_blocks(n_rows: int, rows: int) -> None:
    spans = EvenSpans(n_rows, rows)
    assert list(spans) == (block_spans(n_rows, rows) or [(0, 0)]) and len(pickle.dumps(spans)) < 200


def test_a_relative_npy_path_is_the_callers_file(client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers resolved a relative path in their own folder: another file, or none."""
    monkeypatch.chdir(tmp_path)
    np.save("x.npy", np.arange(3000.0).reshape(1000, 3))
    same(*both(twice_plus_one, "x.npy", 100, client))


def row_sums(block: np.ndarray) -> np.ndarray:
    return block.sum(axis=1)


def test_an_f_ordered_input_gives_the_same_bytes_for_row_reductions(client: Any) -> None:
    """A C-ordered copy was read on the workers: its row sums add in another order and differ in the last bits."""
    x = np.asfortranarray(np.random.default_rng(5).standard_normal((4000, 301)))
    local, remote = both(row_sums, x, 500, client)
    assert local.tobytes() != row_sums(np.ascontiguousarray(x)).tobytes()  # the layout does change the bytes
    same(local, remote)


def slow_twice(block: np.ndarray) -> np.ndarray:
    time.sleep(0.4)
    return block * 2


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_cancels_the_blocks_and_leaves_the_workers_alive_and_no_file(client: Any,
                                                                       private_apsi_home: Path) -> None:
    """Ctrl-C truncated the output while tasks wrote to it: every worker died of SIGBUS. Now the blocks not started
    are cancelled and the output is unlinked, never truncated: the workers live on and no spill file is left."""
    import signal
    import threading

    workers = sorted(client.scheduler_info()["workers"])
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            memory.map(slow_twice, np.ones((60_000, 8)), rows=1000, engine=client)
    finally:
        timer.cancel()
    time.sleep(1)  # a worker killed by SIGBUS would be gone (or restarted under a new address) by now
    assert sorted(client.scheduler_info()["workers"]) == workers
    assert client.submit(sum, [1, 2]).result(timeout=stretched(30)) == 3
    spill_dir = private_apsi_home / "spill"
    assert not spill_dir.exists() or not list(spill_dir.iterdir())


@pytest.mark.usefixtures("ctrl_c_raises")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed KeyboardInterrupt
def test_ctrl_c_during_a_finalizer_still_stops_map(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CI runs at load 11-14 lost the Ctrl-C above: map drops each finished block's future on the main thread,
    and a KeyboardInterrupt raised inside ``Future.__del__`` is printed as 'Exception ignored' and swallowed, so
    map ran to the end. Here the Ctrl-C arrives inside the fifth finalizer, every time: map must still stop."""
    import signal

    from distributed import Future

    calls = 0
    finalize = Future.__del__

    def interrupted_finalizer(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside __del__
        finalize(self)

    monkeypatch.setattr(Future, "__del__", interrupted_finalizer)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        memory.map(slow_twice, np.ones((20_000, 8)), rows=1000, engine=client)
    assert calls >= 5
    assert time.monotonic() - started < 20 * 0.4 / 2  # stopped before the last blocks: the whole run takes 4 s


# -- the traps ------------------------------------------------------------------------------------------------------

def test_memmap_input_travels_as_a_path_not_as_its_data(tmp_path: Path) -> None:
    """numpy #2049: an np.memmap pickles as the whole array. The tasks get its file and offset instead."""
    path = tmp_path / "x.npy"
    np.save(path, np.ones((4096, 1024)))  # 32 MiB
    m = np.load(path, mmap_mode="r")
    assert len(pickle.dumps(m[1024:])) > 24 * MiB  # what sending the array would cost
    found = rows_in_file(m[1024:])
    assert found is not None and found.path == str(path) and len(pickle.dumps(found)) < 1024
    assert np.array_equal(found.open(0, 3072), m[1024:])


def test_to_dask_of_a_memmap_holds_no_data_in_its_graph(client: Any, tmp_path: Path) -> None:
    """dask #11850: da.from_array copies an np.memmap into RAM; to_dask's tasks read the file by path."""
    path = tmp_path / "x.npy"
    x = np.random.default_rng(3).standard_normal((4096, 1024))
    np.save(path, x)
    d = memory.to_dask(np.load(path, mmap_mode="r"), rows=512)
    assert d.chunks[0] == (512,) * 8
    assert len(pickle.dumps(dict(d.__dask_graph__()))) < 64 * 1024  # the data is 32 MiB
    assert client.compute(d).result().tobytes() == x.tobytes()
    scattered = memory.to_dask(x, rows=1000, client=client)  # no shared files: blocks sent one at a time
    assert scattered.chunks[0] == (1000,) * 4 + (96,)
    assert client.compute(scattered * 2 + 1).result().tobytes() == (x * 2 + 1).tobytes()


def _spilled_ones_as_dask() -> Any:
    memory.budget("1MB")  # 2 MiB goes to a spill file
    x = memory.array((4096, 64))
    x[:] = 1.0
    return memory.to_dask(x, rows=512), x.filename  # type: ignore[attr-defined]


def test_to_dask_holds_its_source_and_is_one_layer(client: Any) -> None:
    """``def load(): x = memory.array(...); return to_dask(x)`` failed on compute with FileNotFoundError (x was
    collected and its spill file deleted); 4,096 chunks built 8,193 layers."""
    import gc

    d, path = _spilled_ones_as_dask()
    gc.collect()
    assert os.path.exists(path)
    assert client.compute(d.sum()).result() == 4096 * 64
    assert len(d.__dask_graph__().layers) == 1
    del d
    gc.collect()
    assert not os.path.exists(path)  # held by the dask array, not for ever


def test_to_dask_after_free_says_the_source_was_freed(client: Any) -> None:
    memory.budget("1MB")
    x = memory.array((4096, 64))
    d = memory.to_dask(x, rows=512)
    memory.free(x)
    with pytest.raises(ChunkError, match="source file .* is gone: the array was freed"):
        client.compute(d.sum()).result()


def test_output_file_itself_is_right_under_a_process_cluster(client: Any) -> None:
    """da.store into an open_memmap under processes wrote to pickled copies and left the file wrong; the tasks
    here open the output by path, so the file on disk (read back independently) holds the result."""
    x = np.random.default_rng(4).standard_normal((100_000, 4))
    out = memory.map(twice_plus_one, x, rows=10_000, engine=client)
    on_disk = np.load(out.filename)  # type: ignore[attr-defined]
    assert on_disk.tobytes() == (x * 2 + 1).tobytes()


def test_out_is_filled_by_the_workers_and_named_only_when_whole(client: Any, tmp_path: Path) -> None:
    """``map(engine=client, out=path)``: the process workers write the file under its temporary name; a failing
    block leaves nothing at the path."""
    x = np.random.default_rng(5).standard_normal((100_000, 4))
    path = tmp_path / "y.npy"
    y = memory.map(twice_plus_one, x, rows=10_000, engine=client, out=path)
    assert np.load(path).tobytes() == (x * 2 + 1).tobytes() and y.filename == str(path)  # type: ignore[attr-defined]
    assert os.listdir(tmp_path) == ["y.npy"]
    with pytest.raises(memory.BlockError, match="rows 3000:4000"):
        memory.map(fails_on_row_3500, np.arange(10_000.0), rows=1000, engine=client, out=tmp_path / "z.npy")
    assert os.listdir(tmp_path) == ["y.npy"]


def test_file_rows_refuses_nothing_silently_for_a_scattered_view() -> None:
    x = np.ones((100, 4))
    assert rows_in_file(x) is None and rows_in_file(x[:, :2]) is None  # in RAM: copied to a spill file first
    assert FileRows("", 0, np.dtype("f8"), (0, 4)).open().shape == (0, 4)


# -- real cgroup --------------------------------------------------------------------------------------------------

REAL_SCRIPT = """
import json, dask.array as da
from apsi_memory.dask import cluster, chunk_bytes
if __name__ == "__main__":
    with cluster(n_workers=2, dashboard_address=":0") as c, c.get_client() as client:
        limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
        rows = chunk_bytes(min(limits)) // 8
        x = da.ones(1536 * 2**20 // 8, chunks=rows)
        y = (x * 2 + 1).persist()
        total = float(y.sum().compute())
        print(json.dumps({"limits": limits, "total": total, "n": x.shape[0]}))
"""


@pytest.mark.real
def test_in_a_1gib_group_workers_get_at_most_half_and_1_5gib_completes(memcg: Any, tmp_path: Path) -> None:
    """Real v1 group of 1 GiB, 2 workers, 1.5 GiB persisted through x*2+1: 0 OOM kills expected (1 run)."""
    script = tmp_path / "real_dask.py"
    script.write_text(REAL_SCRIPT)
    with memcg(GiB, prefix=f"apsi-i12dask-{os.getpid()}") as group:
        done = group.run([sys.executable, str(script)], timeout=stretched(240), cwd=os.getcwd())
        kills = group.oom_kills()
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["limits"]) == 2 and max(result["limits"]) <= GiB // 2
    assert result["total"] == 3.0 * result["n"] and kills == 0


def test_the_dask_benchmark_runs_with_the_dask_extra_alone() -> None:
    """``python -m benchmarks.dask_cgroup`` imported pytest, which the dask extra does not install."""
    script = "import sys\nsys.modules['pytest'] = None\nimport benchmarks.dask_cgroup\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=stretched(60),
                          check=False, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("env", "config", "count"), [("3", None, 3), (None, 5, 5), ("2", 5, 2), (None, None, None)])
def test_the_workers_sharing_the_machine_come_from_the_variable_or_the_dask_setting(
        monkeypatch: pytest.MonkeyPatch, env: str | None, config: int | None, count: int | None) -> None:
    import dask

    if env is None:
        monkeypatch.delenv("APSI_DASK_WORKERS", raising=False)
    else:
        monkeypatch.setenv("APSI_DASK_WORKERS", env)
    with dask.config.set({"apsi-memory.workers": config}):
        assert amd.workers_from_env() == count


def test_a_bad_worker_count_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_DASK_WORKERS", "two")
    with pytest.raises(ValueError, match="APSI_DASK_WORKERS='two': the number of dask workers"):
        amd.workers_from_env()


# -- the extra stays optional ---------------------------------------------------------------------------------------

def test_the_core_never_imports_dask_and_says_how_to_get_it() -> None:
    script = (
        "import sys\n"
        "import numpy as np, apsi_memory as memory\n"
        "memory.map(lambda b: b, np.ones(10)); memory.limits(); memory.status()\n"
        "assert not {'dask', 'distributed'} & set(sys.modules), 'the core imported dask'\n"
        "sys.modules['distributed'] = None  # as if the extra were not installed\n"
        "try:\n"
        "    memory.map(lambda b: b, np.ones(10), engine=object())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=stretched(60),
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "pip install 'apsi-memory[dask]'" in done.stdout


# -- issue 26 item 18: a cluster that lost its workers; item 17: a freed input ---------------------------------------

LOST_WORKERS_SCRIPT = """
import sys, time
import dask
import numpy as np
from distributed import LocalCluster, get_worker
import apsi_memory as memory

when = sys.argv[1]
dask.config.set({"apsi-memory.no-worker-timeout": 2})
x = np.arange(40_000.0).reshape(-1, 4)

def closes_its_worker_at_block_2(block):
    if block[0, 0] == 4000.0:  # rows 1000:2000; blocks 3 to 10 are left with no worker
        worker = get_worker()
        worker.loop.add_callback(worker.close)
    return block * 2

with LocalCluster(n_workers=1, threads_per_worker=1, processes=when == "before", dashboard_address=":0") as cluster, \\
        cluster.get_client() as client:
    fn = lambda block: block * 2
    if when == "before":
        cluster.scale(0)
        while client.nthreads():
            time.sleep(0.05)
    else:
        fn = closes_its_worker_at_block_2
    started = time.monotonic()
    try:
        memory.map(fn, x, rows=1000, engine=client)
        print("finished")
    except memory.BlockError as exc:
        print(f"raised after {time.monotonic() - started:.1f} s: {exc}")
"""


@pytest.mark.parametrize("when", ["before", "during"])
def test_map_on_a_cluster_that_lost_its_workers_raises_within_the_timeout(when: str, tmp_path: Path) -> None:
    """Before the fix ``map(engine=client)`` waited forever for a worker (it hung the dask tox env): the child is
    killed at 60 s. Now it waits ``apsi-memory.no-worker-timeout`` seconds (2 here) for one, then raises."""
    env = {**os.environ, "APSI_SPILL_DIR": str(tmp_path / "spill")}
    try:
        done = subprocess.run([sys.executable, "-c", LOST_WORKERS_SCRIPT, when], capture_output=True, text=True,
                              timeout=60, check=False, cwd=Path(__file__).parent.parent, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"map(engine=client) still waiting for a worker after 60 s: {exc.stdout!r}")
    print("\n" + done.stdout.strip())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised after" in done.stdout and "no dask worker" in done.stdout, done.stdout
    elapsed = float(done.stdout.split("raised after ")[1].split(" s")[0])
    assert elapsed < 20, f"{elapsed} s: not bounded by the 2 s timeout"
    assert not list((tmp_path / "spill").glob("*")), "the output's spill file was left behind"


@pytest.fixture
def in_process_client() -> Iterator[Any]:
    """A one-worker cluster of threads in this process: a block's ``fn`` can free the caller's array."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as c, \
            c.get_client() as cl:
        yield cl


TO_FREE: list[np.ndarray] = []  # the caller's array, freed by a block on a worker thread of this process


def frees_its_input_at_block_3(block: np.ndarray) -> np.ndarray:
    if block[0, 0] == 20_000.0:  # column 0 is the row number: rows 20000:30000
        memory.free(TO_FREE[0])
    return block * 2.0


@pytest.mark.parametrize("where", ["ram", "ssd"])
def test_map_on_a_cluster_of_an_array_freed_before_or_while_it_runs_raises(in_process_client: Any, where: str,
                                                                           spill_dir: Path) -> None:
    """Before the fix a freed input's zeros came back as the result (a spilled one: its deleted file was taken for
    a RAM array and copied)."""
    memory.budget(0 if where == "ssd" else "1GB")
    try:
        x = memory.array((100_000, 4))  # 3.2 MB: over the small-array size
        x[:] = 1.0
        memory.free(x)
        with pytest.raises(ChunkError, match=r"freed \(memory\.free\) before map"):
            memory.map(twice_plus_one, x, rows=10_000, engine=in_process_client)
        y = memory.array((100_000, 4))
        y[:] = 1.0
        y[:, 0] = np.arange(len(y))
        TO_FREE[:] = [y]
        with pytest.raises(ChunkError, match=r"freed \(memory\.free\) while map") as caught:
            memory.map(frees_its_input_at_block_3, y, rows=10_000, engine=in_process_client)
        print(f"\n{where}: {caught.value}")
    finally:
        memory.budget("auto")
        TO_FREE.clear()
