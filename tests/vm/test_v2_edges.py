"""What only cgroup v2 has, beyond the headline tests (issue 27), in the VM's real v2 kernel:

* ``fit_batch`` under a real ``memory.max``: a NumPy step whose batch does not fit is halved and finishes; the plain
  loop at the same batch is OOM-killed (the control);
* PSI triggers on the group's own ``memory.pressure``: the windows this kernel takes (v1's host file wanted 2 s
  from an unprivileged writer), and the library's trigger firing while ``memory.high`` throttles the group;
* a delegated subtree (a group owned by an unprivileged uid, as systemd's ``Delegate=`` and ``user@.service``
  give): the uid makes its own child group, and there ``limits()`` reads the delegated group's limit, 2 siblings
  of 300 MiB place at once with the ledger and spill folders of that uid (0 kills, one on the SSD), and the PSI
  trigger windows that uid may open are measured (multiples of 2 s: the library's second try);
* a group whose parent did not enable the memory controller for its children (no ``+memory`` in
  ``cgroup.subtree_control``, so no ``memory.*`` files of its own): ``limits()`` reads the parent's limit;
* ``memory.oom.group`` 1: ``limits().oom_group`` names the group, and ``pressure()`` says that one OOM kill takes
  the whole group.

Each prints its figure (``group.describe()``: the limit, the peak, ``memory.events``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.real.fit_batch_job import check_capped_and_restored, fit_then_plain
from tests.realcg import ChildGroup, remove_group
from tests.vm.v2_run import JOBS, LIMIT, ROOT, Group, MiB, finish, job_env, last_json, start_job

pytestmark = pytest.mark.vm


@pytest.mark.timeout(420)
def test_fit_batch_halves_a_numpy_step_in_a_v2_group_where_the_plain_loop_is_killed(v2_group: Group) -> None:
    """The fixture skips outside a v2 kernel; ``fit_then_plain`` makes its own group and prints the figure."""
    figures, kills_fit, plain_status, kills_plain = fit_then_plain("numpy", LIMIT, 1024)
    assert kills_fit == 0 and kills_plain >= 1 and plain_status == -9
    assert figures["tried"][0] == 1024 and 16 <= figures["batch"] <= 256, figures
    assert figures["result"] == 2 * (figures["batch"] * MiB // 4096)
    check_capped_and_restored(figures)


@pytest.mark.timeout(300)
def test_a_psi_trigger_on_the_groups_memory_pressure_fires_while_memory_high_throttles(v2_group: Group,
                                                                                      tmp_path: Path) -> None:
    with v2_group(LIMIT, prefix="apsi-vm-trigger") as group:
        group.set_high(64 * MiB)
        job = start_job(group, tmp_path, "triggers", "60")
        assert job.stdout is not None
        assert job.stdout.readline().split() == ["ready"]
        started = time.monotonic()
        hog = start_job(group, tmp_path, "neighbour", str(256 * MiB), str(16 * MiB), "0", "60")
        status, out, err = finish(job, 120)
        took = time.monotonic() - started
        hog.kill()
        finish(hog, 60)
        result = last_json(out)
        print(f"\nPSI triggers on {group.path}/memory.pressure, memory.high 64 MiB, a job growing to 256 MiB: "
              f"{result}, {took:.0f} s; {group.describe()}")
        assert status == 0 and result is not None, err[-2000:]
        windows = result["windows_ms"]
        assert windows["1000"] == windows["2000"] == "taken" and windows["11000"] == "EINVAL", windows
        assert result["library_trigger"] and result["fired_after_s"] is not None, result


UID = 4242  # no passwd entry: an arbitrary uid, as OpenShift gives


@contextmanager
def _delegated(group: ChildGroup) -> Iterator[Path]:
    """``group`` handed to ``UID`` as systemd delegates (the group, its ``cgroup.procs``, ``cgroup.threads`` and
    ``cgroup.subtree_control`` chowned), and a home folder that uid owns; both undone afterwards."""
    for name in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
        os.chown(os.path.join(group.path, name), UID, UID)
    home = Path(tempfile.mkdtemp(prefix="apsi-vm-uid-"))
    (home / "ready").mkdir()
    for path in (home, home / "ready"):
        os.chown(path, UID, UID)
    try:
        yield home
    finally:
        for leaf in ("work", "init"):
            if os.path.isdir(os.path.join(group.path, leaf)):
                remove_group(os.path.join(group.path, leaf))
        shutil.rmtree(home, ignore_errors=True)


def _as_uid(group: ChildGroup, home: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**job_env(home), "HOME": str(home), "APSI_SPILL_DIR": str(home / "spill"),
           "APSI_LEDGER_DIR": str(home / "ledger")}
    env.pop("XDG_RUNTIME_DIR", None)
    return subprocess.Popen([sys.executable, *JOBS, "delegate", group.path, str(UID), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.timeout(420)
def test_a_delegated_subtree_under_an_unprivileged_uid(v2_group: Group) -> None:
    count, mib = 2, 300  # 600 MiB at once in 512: without the ledger both place in RAM, and one is killed
    with v2_group(LIMIT, prefix="apsi-vm-delegated") as group, _delegated(group) as home:
        started = time.monotonic()
        status, out, err = finish(_as_uid(group, home, "limits"), 120)
        limits, limits_s = last_json(out), time.monotonic() - started
        assert status == 0 and limits is not None, err[-2000:]
        status, out, err = finish(_as_uid(group, home, "triggers", "0.1"), 120)
        triggers = last_json(out)
        assert status == 0 and triggers is not None, err[-2000:]  # a refused trigger is no error: the watcher polls
        jobs = [_as_uid(group, home, "sibling", "memory.array", str(mib), str(home / "ready"), str(count))
                for _ in range(count)]
        done = [finish(job, 360) for job in jobs]
        siblings_s = time.monotonic() - started - limits_s
        lines = [o.strip().splitlines()[-1] if s == 0 and o.strip() else f"killed ({s}) {e[-300:]}" for s, o, e in done]
        owners = {path.stat().st_uid for path in (home / "spill", home / "ledger") if path.exists()}
        print(f"\ndelegated {group.path} to uid {UID}: limits() in {limits['proc_self_cgroup']}: {limits['text']} "
              f"(limit_file {limits['limit_file']}), {limits_s:.0f} s; {count} x {mib} MiB at once: {lines}, "
              f"{siblings_s:.0f} s; PSI triggers as the uid: {triggers['windows_ms']}, the library's "
              f"{'taken' if triggers['library_trigger'] else 'refused (it polls)'}; spill and ledger "
              f"folders owned by {owners}; {group.describe()}")
        assert limits["uid"] == UID and limits["proc_self_cgroup"].endswith("/work"), limits
        assert limits["usable_mib"] == LIMIT // MiB and limits["limit_file"] == f"{group.path}/memory.max", limits
        assert group.oom_kills() == 0 and all(line.startswith("ok") for line in lines), lines
        assert any("SSD" in line for line in lines) and owners == {UID}, (lines, owners)
        windows = triggers["windows_ms"]
        assert triggers["library_trigger"] and windows["2000"] == "taken" and windows["1000"] != "taken", triggers


@pytest.mark.timeout(180)
def test_a_group_whose_parent_did_not_enable_memory_for_it_reads_the_parents_limit(v2_group: Group,
                                                                                   tmp_path: Path) -> None:
    with v2_group(LIMIT, prefix="apsi-vm-nomem") as group:
        child = ChildGroup(os.path.join(group.path, "child"), LIMIT, "v2")
        os.mkdir(child.path)
        try:
            files = sorted(name for name in os.listdir(child.path) if name.startswith("memory."))
            status, out, err = finish(start_job(child, tmp_path, "limits"), 120)
        finally:
            remove_group(child.path)
        result = last_json(out)
        print(f"\nlimits() in {child.path}, no +memory in its parent's cgroup.subtree_control (its memory files: "
              f"{files}): {result and result['text']} (limit_file {result and result['limit_file']}); pressure(): "
              f"{result and result['pressure']}; {group.describe()}")
        assert "memory.max" not in files
        assert status == 0 and result is not None, err[-2000:]
        assert (result["usable_mib"], result["limit_file"]) == (LIMIT // MiB, f"{group.path}/memory.max"), result


@pytest.mark.timeout(180)
def test_memory_oom_group_is_named_by_limits_and_said_by_pressure(v2_group: Group, tmp_path: Path) -> None:
    with v2_group(LIMIT, prefix="apsi-vm-oomgroup") as group:
        with open(os.path.join(group.path, "memory.oom.group"), "w") as f:
            f.write("1")
        status, out, err = finish(start_job(group, tmp_path, "limits"), 120)
        result = last_json(out)
        print(f"\nmemory.oom.group 1 in {group.path}: limits(): {result and result['text']}; pressure(): "
              f"{result and result['pressure']}; {group.describe()}")
        assert status == 0 and result is not None, err[-2000:]
        assert result["oom_group"] == group.path, result  # limits().oom_group, and limits --json's key
        assert f"one OOM kill takes the whole group (memory.oom.group in {group.path})" in result["pressure"], result
