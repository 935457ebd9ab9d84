"""The programs in examples/ run as a user runs them (a subprocess, a fresh HOME), at small sizes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sim import tree as machines
from sim.tree import GiB, SimTree

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def calm_container(sim_machine: Callable[..., SimTree]) -> SimTree:
    """Every example reads a simulated container (APSI_FS_ROOT, inherited by the subprocess) at pressure ``ok``:
    on a busy machine the real PSI stalls reach ``high``, and the examples rightly behave differently there
    (training_loop halves its batch before any out-of-memory error, arrays spill for the pressure)."""
    return sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)


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


def suggested(name: str) -> list[str]:
    """The first command line of an example's docstring, as a user would paste it (``python examples/x.py ...``)."""
    doc = (EXAMPLES / name).read_text(encoding="utf-8").split('"""')[1]
    line = next(line.split("#")[0].split() for line in doc.splitlines() if line.strip().startswith("python "))
    assert line[:2] == ["python", f"examples/{name}"]
    return line[2:]


def test_the_readme_runs_each_example_with_the_venv_s_python_and_the_flags_its_docstring_suggests() -> None:
    """The README activates the venv (so ``python`` is the one the library was installed into) before it shows
    the examples; each command it shows is the example's own suggestion, which the tests here run."""
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    shown = [line.split("#")[0].split() for line in readme.splitlines() if line.strip().startswith("python examples/")]
    assert sorted(words[1] for words in shown) == sorted(f"examples/{p.name}" for p in EXAMPLES.glob("*.py"))
    for words in shown:
        assert words[2:] == suggested(words[1].removeprefix("examples/")), words
    assert readme.index("source .venv/bin/activate") < readme.index("python examples/")


def test_container_sizing_runs_with_the_flags_its_docstring_suggests(tmp_path: Path) -> None:
    lines = run("container_sizing.py", *suggested("container_sizing.py"), cwd=tmp_path).stdout.splitlines()
    assert len(lines) == 2 and " usable (" in lines[0]
    assert re.fullmatch(r"\d+ workers? \(of \d+ cores\), [\d,]+ rows per batch; pressure \w+", lines[1])


def test_the_training_loop_halves_its_batch_with_the_flags_its_docstring_suggests(tmp_path: Path) -> None:
    """Before, ``--batch 1024 --device-mb 64`` fitted at once: nothing was halved."""
    flags = suggested("training_loop.py")
    first = int(flags[flags.index("--batch") + 1])
    result = run("training_loop.py", *flags, cwd=tmp_path)
    assert f"out of memory at batch {first}" in result.stderr
    batches = {int(b) for b in re.findall(r"epoch \d: loss [\d.]+ at batch (\d+)", result.stdout)}
    assert batches == {first // 2}


def test_the_feature_pipeline_by_default_is_larger_than_its_budget_and_spills(tmp_path: Path) -> None:
    """Before, the default budget was 70 % of free memory: on most machines the default input fitted in RAM."""
    assert suggested("feature_pipeline.py") == []
    result = run("feature_pipeline.py", cwd=tmp_path)
    assert re.search(r"float32 [\d.]+ [KMGT]?B SSD \S+\.npy — [\d.]+ MB is more than the 64\.0 MB left", result.stdout)


def test_the_feature_pipeline_makes_the_rows_asked_for_even_when_a_data_file_exists(tmp_path: Path) -> None:
    """Before, a second run with another --rows read the first run's raw_features.npy."""
    assert "standardised 1,000 rows" in run("feature_pipeline.py", "--rows", "1000", cwd=tmp_path).stdout
    assert "standardised 3,000 rows" in run("feature_pipeline.py", "--rows", "3000", cwd=tmp_path).stdout
    named = tmp_path / "mine.npy"
    np.save(named, np.ones((500, 4), dtype="float32"))
    assert "standardised 500 rows x 4 columns" in run("feature_pipeline.py", "--input", str(named), cwd=tmp_path).stdout
    env = {**os.environ, "HOME": str(tmp_path)}
    refused = subprocess.run([sys.executable, str(EXAMPLES / "feature_pipeline.py"), "--input", str(named), "--rows",
                              "900"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "holds 500 rows x 4 columns, not 900 x 4" in refused.stderr
    assert np.load(named).shape == (500, 4)  # a file the user named is never overwritten


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


def test_container_sizing_follows_the_cgroup_limit(tmp_path: Path) -> None:
    text = run("container_sizing.py", cwd=tmp_path).stdout
    assert text.splitlines() == ["4.0 GB usable (container (cgroup v1)), 3.0 GB free, budget 2.1 GB",
                                 "2 workers (of 2 cores), 275,251 rows per batch; pressure ok"]
    one = json.loads(run("container_sizing.py", "--per-worker-mb", "2048", "--json", cwd=tmp_path).stdout)
    assert (one["workers"], one["usable_bytes"], one["source"]) == (1, 4 * GiB, "container (cgroup v1)")
