"""``apsi-memory`` and ``python -m apsi_memory`` as a user runs them, on a sim machine (APSI_FS_ROOT)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sim
from apsi_memory.cli import main
from sim import tree as machines
from sim.clock import FakeClock
from sim.tree import GiB, SimTree


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
    assert line.startswith("RAM 3.0/4.0 GB free (this program 0.04 GB, budget 2.1 GB) | swap 0.0 GB | SSD ")
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


# `apsi-memory pressure --watch SECONDS` as ``python -m apsi_memory`` runs it, but on an autojump FakeClock over the
# APSI_FS_ROOT tree: it prints readings as fast as the pipe takes them, forever, so it is writing when the reader
# leaves whatever the timing (no real interval to outlast the reader, no sleep).
WATCH_ON_A_FAKE_CLOCK = """
import os, sys
import sim
from apsi_memory.cli import main
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
