"""The programs in examples/ run as a user runs them (a subprocess, a fresh HOME), at small sizes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from sim import tree as machines
from sim.pressure import used_share
from sim.tree import GiB, SimTree
from tests.realcg import ChildGroup

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


@pytest.mark.parametrize("page", ["docs/guides/examples.md", "README.md"])
def test_the_docs_run_each_example_with_the_venv_s_python_and_the_flags_its_docstring_suggests(page: str) -> None:
    """The examples page activates the venv (so ``python`` is the one the library was installed into) before it
    shows every example; each command it or the README shows is the example's own suggestion, which the tests here
    run."""
    text = (EXAMPLES.parent / page).read_text(encoding="utf-8")
    shown = [line.split("#")[0].split() for line in text.splitlines() if line.strip().startswith("python examples/")]
    assert shown, page
    if page != "README.md":  # the README shows one and links the page
        assert sorted(words[1] for words in shown) == sorted(f"examples/{p.name}" for p in EXAMPLES.glob("*.py"))
    for words in shown:
        assert words[2:] == suggested(words[1].removeprefix("examples/")), words
    assert text.index("source .venv/bin/activate") < text.index("python examples/")


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


def test_the_shared_cache_workers_map_one_file_and_get_the_plain_checksum(tmp_path: Path) -> None:
    """Each worker maps the one kept ``.npy``: its own RAM grows by far less than its share of the rows (the
    ``--copy`` control, a private copy each, grows by the share)."""
    flags = suggested("night_shared_cache.py")
    workers, rows, columns = (int(flags[flags.index(name) + 1]) for name in ("--workers", "--rows", "--columns"))
    share = rows // workers * columns * 4
    for copy, low, high in ((False, 0, share / 4), (True, share * 0.9, share * 1.5)):
        lines = run("night_shared_cache.py", *flags, *(["--copy"] if copy else []), cwd=tmp_path).stdout.splitlines()
        assert len(lines) == 2 and lines[0].endswith("equal to the plain sum"), lines
        grown = [memory.parse_size(size) for size in lines[1].split("grew by ")[1].split(" while")[0].split(", ")]
        assert len(grown) == workers and all(low <= g < high for g in grown), (copy, grown, share)
    dataset = np.load(tmp_path / "night-dataset.npy", mmap_mode="r")
    assert dataset.shape == (rows, columns)  # the one copy, kept for the next night


@pytest.mark.torch
def test_the_shared_cache_reads_through_a_torch_dataloader_when_torch_is_there(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = run("night_shared_cache.py", *suggested("night_shared_cache.py"), "--torch", cwd=tmp_path)
    assert re.fullmatch(r"4 DataLoader workers read [\d.]+ MB from one night-dataset\.npy: checksum [\d.]+, equal to "
                        r"the plain sum\n", result.stdout), result.stdout

def test_the_features_job_keeps_its_standardised_output_and_gram_and_they_match_numpy(tmp_path: Path) -> None:
    flags = suggested("night_features.py")
    rows, columns = (int(flags[flags.index(name) + 1]) for name in ("--rows", "--columns"))
    lines = run("night_features.py", *flags, cwd=tmp_path).stdout.splitlines()
    assert len(lines) == 2
    assert re.match(rf"standardised {rows:,} rows x {columns} columns \(([\d.]+) MB through a ([\d.]+) MB budget\)",
                    lines[0])
    size, budget, written = (float(n) for n in re.findall(r"([\d.]+) MB", lines[0])[:3])
    assert size > budget  # the job is larger than its budget, by default
    assert "written for it" in lines[0] and size <= written < size * 1.2  # the output's bytes written once, not spilled then saved
    sample, gram, diagonal = (float(n) for n in re.findall(r"(\d\.\d+e[-+]\d+)", lines[1]))
    assert sample < 1e-5 and gram < 1e-9 and diagonal < 1e-5, lines[1]
    out = np.load(tmp_path / "night-standardized.npy", mmap_mode="r")  # both stay after the job
    assert out.shape == (rows, columns) and np.abs(out.mean(axis=0, dtype=np.float64)).max() < 1e-4
    assert np.load(tmp_path / "night-gram.npy").shape == (columns, columns)
    assert not (tmp_path / ".apsi" / "spill").exists() or list((tmp_path / ".apsi" / "spill").iterdir()) == []


def test_the_embeddings_job_killed_half_way_computes_only_the_missing_ones_on_the_rerun(tmp_path: Path) -> None:
    flags = suggested("night_embeddings.py")
    count, stop = (int(flags[flags.index(name) + 1]) for name in ("--count", "--stop-after"))
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("APSI_HOME", None)
    killed = subprocess.run([sys.executable, str(EXAMPLES / "night_embeddings.py"), *flags], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert killed.returncode == 1 and f"computed {stop:,} of the {count:,} missing, then stopped" in killed.stdout
    rerun = run("night_embeddings.py", "--count", str(count), cwd=tmp_path).stdout
    assert f"computed {count - stop:,}, read back {count:,} of {count:,} ({stop:,} were in the store already); " \
           "100 of 100 sampled match a recomputation" in rerun
    again = run("night_embeddings.py", "--count", str(count), cwd=tmp_path).stdout
    assert f"computed 0, read back {count:,} of {count:,}" in again
    fresh = run("night_embeddings.py", "--count", str(count), "--fresh", cwd=tmp_path).stdout
    assert f"computed {count:,}, read back {count:,} of {count:,} (0 were" in fresh


def test_the_batch_search_halves_until_the_mlp_step_fits_and_the_loss_falls(tmp_path: Path) -> None:
    """The room ``--memory-mb`` gives holds half the first batch's activations: one halving, then it fits."""
    flags = suggested("night_batch_search.py")
    first = int(flags[flags.index("--batch") + 1])
    result = run("night_batch_search.py", *flags, cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"batch {first // 2:,} fitted (first tried {first:,};"), lines
    assert f"out of memory at batch {first} (MemoryError" in result.stderr and f"trying {first // 2}" in result.stderr
    before, after = (float(n) for n in re.findall(r"loss ([\d.]+) after the first step, ([\d.]+)", lines[1])[0])
    assert after < before
    roomy = run("night_batch_search.py", *flags[:flags.index("--memory-mb")], "--steps", "2", cwd=tmp_path)
    assert roomy.stdout.startswith(f"batch {first:,} fitted") and "out of memory" not in roomy.stderr


def test_the_neighbour_job_says_nothing_moved_on_a_calm_machine(tmp_path: Path) -> None:
    lines = run("night_neighbour.py", *suggested("night_neighbour.py"), cwd=tmp_path).stdout.splitlines()
    assert lines[0] == "table 64.0 MB in RAM; a neighbour grows to 256.0 MB beside it"
    assert lines[1].startswith("no move: the watcher never read high; pressure ok now, 3.0 GB free, the neighbour grew")
    assert lines[1].endswith("; 0 of 8,388,608 values differ") and " RAM — fits the budget" in lines[2]


def test_the_neighbour_job_s_table_moves_to_the_ssd_when_the_container_gets_tight(tmp_path: Path,
                                                                                 calm_container: SimTree) -> None:
    """The container's usage rises to ``high`` once the neighbour starts (the sim tree plays the kernel, which
    would charge the neighbour's pages to the group): the watcher's reading moves the table, whose every value
    stays right while the job writes to it."""
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("APSI_HOME", None)
    job = subprocess.Popen([sys.executable, str(EXAMPLES / "night_neighbour.py"), *suggested("night_neighbour.py"),
                            "--hold", "60"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    assert job.stdout is not None
    assert job.stdout.readline() == "table 64.0 MB in RAM; a neighbour grows to 256.0 MB beside it\n"
    calm_container.v1_group("/sys/fs/cgroup/memory", 4 * GiB, int(4 * GiB * used_share(memory.Level.HIGH)), 0)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    lines = out.splitlines()
    assert re.fullmatch(r"1 move: the table went to the SSD [\d.]+ s after pressure reached high, while the job "
                        r"wrote to it; 0 of 8,388,608 values differ", lines[0]), lines
    assert re.fullmatch(r"memory.report\(\): \[8388608\] int64 64\.000 MB SSD \S+\.npy — moved at pressure high",
                        lines[1]), lines


def in_group(group: ChildGroup, name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """An example run inside a real memory cgroup, reading the real kernel (not the calm sim container)."""
    env = {**os.environ, "HOME": str(cwd)}
    for name_ in ("APSI_HOME", "APSI_FS_ROOT"):
        env.pop(name_, None)
    return group.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env, timeout=240)


def job_and_control(memcg: Callable[[int], ContextManager[ChildGroup]], limit: int, name: str, flags: tuple[str, ...],
                    cwd: Path) -> subprocess.CompletedProcess[str]:
    """The example run in a real group of ``limit`` bytes, then its ``--plain`` control in the same group, which
    the kernel must OOM-kill (-9): the job's run, for its own checks."""
    with memcg(limit) as group:
        job = in_group(group, name, *flags, cwd=cwd)
        plain = in_group(group, name, *flags, "--plain", cwd=cwd)
    assert job.returncode == 0, job.stderr
    assert plain.returncode == -9, (plain.returncode, plain.stdout)  # the kernel's OOM kill: the control
    return job


@pytest.mark.real
def test_in_a_real_1_gib_group_the_table_moves_and_the_job_lives_where_numpy_zeros_is_killed(
        tmp_path: Path, memcg: Callable[[int], ContextManager[ChildGroup]]) -> None:
    """Issue 28's fifth job at a third of its size: a 600 MB table and a neighbour growing to 500 MB in 1 GiB."""
    kept = job_and_control(memcg, 1 << 30, "night_neighbour.py", ("--table-mb", "600", "--neighbour-mb", "500"),
                           tmp_path)
    assert re.search(r"^1 move: .* 0 of 78,643,200 values differ$", kept.stdout, re.MULTILINE), kept.stdout


@pytest.mark.real
def test_in_a_real_768_mib_group_fit_batch_halves_where_the_plain_step_is_killed(
        tmp_path: Path, memcg: Callable[[int], ContextManager[ChildGroup]]) -> None:
    """No ``--memory-mb``: the room is the group's, which ``fit_batch``'s own address-space cap enforces."""
    fitted = job_and_control(memcg, 768 << 20, "night_batch_search.py", ("--batch", "65536", "--steps", "3"),
                             tmp_path)
    batch = int(re.findall(r"^batch ([\d,]+) fitted", fitted.stdout)[0].replace(",", ""))
    assert batch < 65536 and "out of memory at batch 65536" in fitted.stderr
