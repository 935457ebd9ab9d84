"""``apsi-memory`` and ``python -m apsi_memory`` as a user runs them, on a sim machine (APSI_FS_ROOT)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sim
from apsi_memory.cli.commands import main
from apsi_memory.decide import chunk_bytes, worker_memory_limit
from sim import tree as machines
from sim.clock import FakeClock
from sim.tree import GiB, MiB, SimTree


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "apsi_memory", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_limits_text_and_json(sim_machine: Callable[..., SimTree]) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    assert run("limits").stdout == "4.0 GB usable (container (cgroup v1)), 3.0 GB free, budget 2.1 GB\n"
    data = json.loads(run("limits", "--json").stdout)
    assert data["usable_bytes"] == 4 * GiB and data["cgroup"] == "/docker/3f2a9c0e7b1d"


def test_pressure_watch_prints_one_reading_per_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In-process on the machine's clock: each wait moves the fake clock by the interval (no real sleep)."""
    clock = FakeClock(autojump=True)
    with sim.machine(machines.kubernetes_v2(tmp_path, pod_psi=(45.0, 0.0)), clock).use():
        start = clock.now()
        assert main(["pressure", "--watch", "30", "--count", "3", "--json"]) == 0
    readings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["level"] for r in readings] == ["critical"] * 3 and readings[0]["some"] == 45.0
    assert clock.now() - start == 60  # two waits of 30 s between three readings


def test_status_line_on_a_sim_machine(sim_machine: Callable[..., SimTree]) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    line = run("status").stdout
    assert line.startswith("RAM 3.0/4.0 GB free (this program 40.0 MB, budget 2.1 GB) | swap 0 B | SSD ")
    assert line.rstrip().endswith("| 2 cores, load 0.34 | no GPU")
    assert json.loads(run("status", "--json").stdout)["cores"] == 2


def test_a_corrupt_file_is_one_clear_line_and_exit_1(sim_machine: Callable[..., SimTree]) -> None:
    tree = sim_machine(machines.docker_v1)
    tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "garbage\n")
    result = run("limits")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == ("apsi-memory: /sys/fs/cgroup/memory/memory.limit_in_bytes: "
                             "expected a byte count, got 'garbage'\n")


def test_bad_arguments_are_rejected() -> None:
    assert run("pressure", "--watch", "0").returncode == 2
    assert run("nonsense").returncode == 2


SUBCOMMANDS = ["status", "limits", "pressure", "dask-limit", "spill", "stores", "clean"]


def test_every_subcommand_is_listed_and_describes_itself_in_its_help() -> None:
    """(Test first failed: ``status --help`` showed only its usage and options.)"""
    listed = run("--help").stdout
    assert "Sizes are binary: 1 KB = 1024 bytes" in listed
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in listed, name
        description = run(name, "--help").stdout.split("\n\n")[1]
        assert description[0].isupper() and description.rstrip().endswith("."), (name, description)


def error_as_json(result: subprocess.CompletedProcess[str], code: int, kind: str) -> str:
    """The one JSON object an error under ``--json`` prints on stdout; its message."""
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    error = json.loads(result.stdout)
    assert set(error) == {"error", "type"} and error["type"] == kind
    return str(error["error"])


def test_every_subcommands_errors_are_json_under_json(sim_machine: Callable[..., SimTree]) -> None:
    """(Test first failed: the errors went to stderr as text, stdout was empty.)"""
    tree = sim_machine(machines.docker_v1)
    assert "fewer workers" in error_as_json(run("dask-limit", "--workers", "100000", "--json"), 1, "ArgumentError")
    assert "not 'a/b'" in error_as_json(run("clean", "--store", "a/b", "--json"), 1, "ArgumentError")
    for name in SUBCOMMANDS:
        assert "unrecognized arguments: --bogus" in error_as_json(run(name, "--json", "--bogus"), 2, "UsageError")
    tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", "garbage\n")
    for name in ("status", "limits", "pressure", "dask-limit"):
        assert "expected a byte count, got 'garbage'" in error_as_json(run(name, "--json"), 1, "CorruptFileError")


def test_dask_limit_shows_its_sizes_in_the_one_convention(sim_machine: Callable[..., SimTree]) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    limit = worker_memory_limit(4 * GiB, 2)
    assert run("dask-limit", "--workers", "2").stdout == (  # (test first failed: "1.88 GiB", "128 MiB")
        f"--memory-limit {limit} per worker ({limit / GiB:.2f} GB, 2 workers of 1 thread sharing 4.0 GB), chunks "
        f"of {chunk_bytes(limit) >> 20} MB\nrechunk method p2p, p2p buffers {limit / 10 / 2**20:.1f} MB (comm) and "
        f"{limit / 10 / 2**20:.1f} MB (storage) per worker\n")


def test_dask_limit_with_threads_gives_each_thread_its_chunks_and_counts_workers_as_cluster_does(
        sim_machine: Callable[..., SimTree]) -> None:
    """``--nthreads`` (the rule assumed 1 thread a worker): 4 threads' running tasks share the room 1 thread's
    had (64 MB chunks where 1 thread gets dask's most, 128 MB), and 2 cores of 2 threads are 1 worker."""
    sim_machine(machines.docker_v1, limit=4 * GiB)
    one, four = (json.loads(run("dask-limit", "--workers", "1", "--nthreads", n, "--json").stdout) for n in "14")
    assert one["memory_limit_bytes"] == four["memory_limit_bytes"] == worker_memory_limit(4 * GiB, 1)
    assert (one["chunk_bytes"], four["chunk_bytes"]) == (128 * MiB, 64 * MiB) and four["nthreads"] == 4
    assert json.loads(run("dask-limit", "--nthreads", "2", "--json").stdout)["workers"] == 1
    assert "N must be a whole number of threads, at least 1, not '0'" in error_as_json(
        run("dask-limit", "--nthreads", "0", "--json"), 2, "UsageError")


def test_dask_limit_never_advises_chunks_over_dasks_own_128_mib(sim_machine: Callable[..., SimTree]) -> None:
    """A 64 GB host's one worker got 4 GB chunks: a handful of tasks per array, each spilled whole."""
    sim_machine(machines.host, total=64 * GiB, available=60 * GiB)
    shown = json.loads(run("dask-limit", "--workers", "1", "--json").stdout)
    assert shown["memory_limit_bytes"] > 16 * GiB and shown["chunk_bytes"] == 128 * MiB


# `apsi-memory pressure --watch SECONDS` as ``python -m apsi_memory`` runs it, but on an autojump FakeClock over the
# APSI_FS_ROOT tree: it prints readings as fast as the pipe takes them, forever, so it is writing when the reader
# leaves whatever the timing (no real interval to outlast the reader, no sleep).
WATCH_ON_A_FAKE_CLOCK = """
import os, sys
import sim
from apsi_memory.cli import main
from apsi_memory.decide import chunk_bytes, worker_memory_limit
from sim.clock import FakeClock
with sim.machine(os.environ["APSI_FS_ROOT"], FakeClock(autojump=True)).use():
    sys.exit(main(["pressure", "--watch", "30"]))
"""


def test_a_reader_that_leaves_early_is_no_traceback(sim_machine: Callable[..., SimTree]) -> None:
    sim_machine(machines.host)
    watch = subprocess.Popen([sys.executable, "-c", WATCH_ON_A_FAKE_CLOCK],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watch.stdout is not None and watch.stderr is not None
    assert watch.stdout.readline().startswith("ok: 7.0 GB free")
    watch.stdout.close()  # like `| head -1`
    assert watch.wait(timeout=30) == 141 and "Traceback" not in watch.stderr.read()
    watch.stderr.close()
