"""Arrays that move, on a real kernel: a job with a 1.2 GiB ``memory.array`` in a real 2 GiB v1 group survives a
neighbour that grows to 1.2 GiB in the same group, and a limit lowered to 1 GiB, with every write kept; the control
with ``numpy.zeros`` is killed (neighbour) or blocks the resize (v1 refuses a limit below usage with EBUSY where v2
would kill). Each prints its figures: moves, bytes moved, time to move, kills."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from apsi_memory.adapters.psi import SYSTEM_PSI, open_trigger
from tests.load import stretched
from tests.realcg import ChildGroup, child_group

pytestmark = [pytest.mark.real, pytest.mark.faults]

MiB = 1 << 20
# For the measurements of docs/guides/what-moves.md: the level arrays move at, and the neighbour's pause between
# its 64 MiB steps (0.1 s: 640 MiB/s; 0.02 s: NumPy's own speed here).
MOVE_AT = os.environ.get("APSI_TEST_MOVE_AT", "high")
PAUSE = os.environ.get("APSI_TEST_NEIGHBOUR_PAUSE", "0.1")
# The neighbour's growth against what the disk takes now: 640 MiB/s (64 MiB per 0.1 s) against the ~900 MB/s a move
# ran at on a quiet machine (1,228 MB in 1.4 s, docs/guides/what-moves.md). A neighbour growing faster than the disk
# writes wins the race whatever the library does (a CI run at load 15 with other jobs' I/O beside it moved at
# 126 MB/s and the kernel killed the neighbour), so on a slower disk the neighbour slows down by as much: the race
# stays the same, and the test does not depend on the host's load. At most 0.5 s a step: grown within the job's 15 s.
NEIGHBOUR_OVER_DISK = 0.7
JOBS = str(Path(__file__).with_name("moving_jobs.py"))


def _start(group: ChildGroup, spill: Path, *argv: str) -> subprocess.Popen[str]:
    wrapper = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group.path, sys.executable, JOBS, *argv]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "APSI_SPILL_DIR": str(spill)}
    return subprocess.Popen(wrapper, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@contextmanager
def _job_in_ram(kind: str, tmp_path: Path) -> Iterator[tuple[ChildGroup, subprocess.Popen[str]]]:
    """A 2 GiB group running the job, its array filled in RAM. An array put on the SSD at once (nothing to move) is
    a failure: in an empty 2 GiB group the level is ``ok`` (host stalls count only while the host is short)."""
    with child_group(2048 * MiB, prefix=f"apsi-move-{os.getpid()}") as group:
        # The neighbour grows within the job's 15 s on an idle machine; under load both slow down alike (at load 14
        # on 2 cores the neighbour was still growing when a 15-s job ended, and the control lived)
        job = _start(group, tmp_path / "spill", "job", kind, f"{stretched(15):.0f}", MOVE_AT)
        assert job.stdout is not None
        ready = job.stdout.readline().split()
        if ready[-1:] != ["RAM"]:
            job.kill()
            _, err = job.communicate(60)
            host = Path(SYSTEM_PSI).read_text().splitlines()[0] if os.path.exists(SYSTEM_PSI) else "no PSI"
            pytest.fail(f"the job's array was not in RAM ({ready}) in an empty 2 GiB group: the level logic read "
                        f"pressure where there is none (host: {host}) {err[-1000:]}")
        try:
            yield group, job
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(60)


def _figures(name: str, group: ChildGroup, job: subprocess.Popen[str], extra: str = "") -> dict[str, Any]:
    out, err = job.communicate(stretched(90))
    figures = json.loads(out.strip().splitlines()[-1]) if job.returncode == 0 else {}
    print(f"\n{name}: exit {job.returncode}, {group.oom_kills()} kills, {figures.get('moves', 0)} moves, "
          f"{figures.get('bytes_moved', 0) / MiB:.0f} MiB moved in {figures.get('seconds_moving', 0)} s, windows "
          f"kept {figures.get('windows_kept', '-')}/{figures.get('windows', '-')}{extra}")
    if job.returncode not in (0, -9):
        print(err[-3000:])
    return figures


def _disk_rate(folder: Path, nbytes: int = 256 * MiB) -> float:
    """Bytes a second the disk under ``folder`` takes now: ``nbytes`` written and ``fdatasync``ed, then removed."""
    folder.mkdir(parents=True, exist_ok=True)
    path, block = folder / "rate", b"\1" * (8 * MiB)
    started = time.monotonic()
    with open(path, "wb") as f:
        f.writelines(block for _ in range(nbytes // len(block)))
        f.flush()
        os.fdatasync(f.fileno())
    seconds = time.monotonic() - started
    path.unlink()
    return nbytes / seconds


def _neighbour_pause(spill: Path) -> float:
    """The pause between the neighbour's 64 MiB steps: ``PAUSE``, or longer where the disk is slower now than the
    quiet machine's (``NEIGHBOUR_OVER_DISK``); ``APSI_TEST_NEIGHBOUR_PAUSE`` set: that, as it is."""
    if "APSI_TEST_NEIGHBOUR_PAUSE" in os.environ:
        return float(PAUSE)
    return min(0.5, max(float(PAUSE), 64 * MiB / (NEIGHBOUR_OVER_DISK * _disk_rate(spill))))


@pytest.mark.parametrize("kind", ["memory.array", "numpy"])
def test_a_neighbour_growing_to_1_2_gib_kills_numpy_but_the_array_moves(kind: str, tmp_path: Path) -> None:
    pause = _neighbour_pause(tmp_path / "spill")
    with _job_in_ram(kind, tmp_path) as (group, job):
        neighbour = _start(group, tmp_path / "spill", "neighbour", str(1228 * MiB), str(64 * MiB), f"{pause:.3f}", "6")
        figures = _figures(f"neighbour grows 64 MiB per {pause:.3f} s, job with {kind} (moves at {MOVE_AT})", group,
                           job)
        neighbour.communicate(stretched(60))
        if kind == "numpy":
            assert job.returncode == -9 and group.oom_kills() >= 1, "the control was not killed: no pressure?"
        else:
            assert (job.returncode, group.oom_kills()) == (0, 0)
            assert figures["windows_kept"] == figures["windows"] and figures["on_disk"]
            assert figures["moves"] == 1 and figures["bytes_moved"] >= 1228 * MiB


def _lower(group: ChildGroup, job: subprocess.Popen[str], to: int, seconds: float) -> tuple[int, int]:
    """Lower the limit 128 MiB at a time, retrying a refused step (as a resize controller does) for ``seconds``;
    the limit reached and the refusals."""
    limit, refused, started = group.limit_bytes, 0, time.monotonic()
    while limit > to and time.monotonic() - started < seconds and job.poll() is None:
        try:
            with open(os.path.join(group.path, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit - 128 * MiB))
            limit -= 128 * MiB
        except OSError:  # EBUSY: v1 cannot reclaim the group below its usage
            refused += 1
        time.sleep(0.2)
    return limit, refused


@pytest.mark.parametrize("kind", ["memory.array", "numpy"])
def test_a_limit_lowered_from_2_to_1_gib_under_the_job(kind: str, tmp_path: Path) -> None:
    with _job_in_ram(kind, tmp_path) as (group, job):
        limit, refused = _lower(group, job, 1024 * MiB, stretched(12))
        figures = _figures(f"limit lowered 2 -> 1 GiB, job with {kind}", group, job,
                           f", limit reached {limit // MiB} MiB ({refused} refusals)")
        assert (job.returncode, group.oom_kills()) == (0, 0)
        assert figures["windows_kept"] == figures["windows"]
        if kind == "numpy":
            assert limit > 1024 * MiB  # v1 refuses (EBUSY); a v2 kernel kills instead
        else:
            assert limit == 1024 * MiB and figures["on_disk"] and figures["moves"] == 1


def test_this_kernel_takes_a_psi_trigger() -> None:
    if not os.path.exists(SYSTEM_PSI):
        pytest.skip(f"no {SYSTEM_PSI}: the kernel has no PSI (before 4.20, or psi=0)")
    fd = open_trigger(SYSTEM_PSI)
    assert fd is not None, "PSI is there but refused a trigger"
    os.close(fd)
