"""The programs in examples/ run as a user runs them (a subprocess, a fresh HOME), at small sizes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sim import tree as machines
from sim.tree import GiB, SimTree

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(cwd)}
    env.pop("APSI_HOME", None)
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return result


def test_the_training_loop_finds_the_batch_that_fits_and_learns(tmp_path: Path) -> None:
    result = run("training_loop.py", "--samples", "4000", "--hidden", "1024", "--batch", "1024", "--device-mb", "4",
                 "--epochs", "4", cwd=tmp_path)
    epochs = re.findall(r"epoch (\d): loss ([\d.]+) at batch (\d+)", result.stdout)
    assert [(e, b) for e, _, b in epochs] == [("0", "512"), ("1", "512"), ("2", "512"), ("3", "512")]
    losses = [float(loss) for _, loss, _ in epochs]
    assert losses[-1] < losses[0]
    assert "out of memory at batch 1024" in result.stderr and "trying 512" in result.stderr  # the WARNING log


def test_the_feature_pipeline_spills_its_output_and_keeps_its_statistics(tmp_path: Path) -> None:
    first = run("feature_pipeline.py", "--rows", "200000", "--budget-mb", "4", cwd=tmp_path)
    assert "column statistics: one pass over the file" in first.stdout
    assert "standardised 200,000 rows x 16 columns" in first.stdout
    assert re.search(r"\[200000, 16\] float32 12\.207 MB SSD \S+\.npy — 12\.2 MB is more than the 4\.0 MB left",
                     first.stdout)
    means = float(re.findall(r"column means after: ([\d.]+) at most", first.stdout)[0])
    assert means < 0.05
    second = run("feature_pipeline.py", "--rows", "200000", "--budget-mb", "4", cwd=tmp_path)
    assert "column statistics: from the store" in second.stdout
    assert list((tmp_path / ".apsi" / "spill").iterdir()) == []  # the output was freed, its file deleted


def test_container_sizing_follows_the_cgroup_limit(sim_machine: Callable[..., SimTree], tmp_path: Path) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    text = run("container_sizing.py", cwd=tmp_path).stdout
    assert text.splitlines() == ["4.0 GB usable (container (cgroup v1)), 3.0 GB free, budget 2.1 GB",
                                 "2 workers (of 2 cores), 275,251 rows per batch; pressure ok"]
    one = json.loads(run("container_sizing.py", "--per-worker-mb", "2048", "--json", cwd=tmp_path).stdout)
    assert (one["workers"], one["usable_bytes"], one["source"]) == (1, 4 * GiB, "container (cgroup v1)")
