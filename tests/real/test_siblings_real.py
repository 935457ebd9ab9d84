"""Several processes in one real 2 GiB v1 memory cgroup place big arrays at the same moment (issue 18).

Each placement sees what its siblings placed and the kernel has not charged yet (the reservation ledger), so none
is OOM-killed and the arrays that do not fit go to spill files; the same scripts with ``numpy.zeros`` are the
control, and are killed, so the tests cannot pass because the limit was not enforced. Each prints its figure.

Also: a sibling SIGKILLed while it holds a 1 GiB reservation stops counting at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import apsi_memory as memory
from apsi_memory.machinery.reservations import Siblings
from tests.realcg import tmpfs

pytestmark = pytest.mark.real

GiB = 1 << 30
JOB = str(Path(__file__).with_name("siblings_job.py"))
CASES = [(4, 800, "procs"), (8, 400, "pool"), (16, 200, "procs")]


def run_job(memcg, tmp_path: Path, make: str, count: int, mib: int, how: str) -> tuple[int, list[str], int]:
    """(exit status, one line per process, OOM kills in the group) of the job in a fresh 2 GiB group."""
    env = {**os.environ, "APSI_SPILL_DIR": str(tmp_path / "spill"), "APSI_LEDGER_DIR": str(tmp_path / "ledger"),
           "TMPDIR": str(tmp_path)}  # the job's own folder (its processes' "filled" marks) under the test's
    env.pop("APSI_RAM_BUDGET", None)
    with memcg(2 * GiB) as group:
        started = time.monotonic()
        done = group.run([sys.executable, JOB, make, str(count), str(mib), how], timeout=300, env=env)
        lines = done.stdout.split("\n")[:-1] or [done.stderr[-500:]]
        kills = group.oom_kills()
        print(f"\n{make} {how} {count} x {mib} MiB in 2 GiB: {kills} OOM kills, "
              f"{sum('RAM' in line for line in lines)} RAM / {sum('SSD' in line for line in lines)} SSD, "
              f"{sum(not line.startswith('ok') for line in lines)} lost, {time.monotonic() - started:.0f} s")
        return done.returncode, lines, kills


@pytest.mark.parametrize("count,mib,how", CASES, ids=[f"{c}x{m}MiB-{h}" for c, m, h in CASES])
def test_processes_placing_at_once_in_one_group_are_not_oom_killed(memcg, tmp_path, count, mib, how):
    status, lines, kills = run_job(memcg, tmp_path, "memory.array", count, mib, how)
    assert (status, kills) == (0, 0), lines
    assert len(lines) == count and all(line.startswith("ok") for line in lines)  # every result right
    assert sum("RAM" in line for line in lines) * mib < 2048 <= count * mib  # those that do not fit: on the SSD
    status, lines, kills = run_job(memcg, tmp_path, "numpy.zeros", count, mib, how)
    assert status != 0 and kills >= 1, lines  # the control: the same job with numpy.zeros is killed


HOLD = r"""
import sys, time
import apsi_memory as memory
x = memory.array(1 << 30, "uint8")  # placed in RAM, never written: a 1 GiB reservation
print("SSD" if memory.on_disk(x) else "RAM", flush=True)
time.sleep(300)
"""


def test_a_sibling_killed_while_holding_a_reservation_stops_counting_at_once(tmp_path, monkeypatch):
    if memory.limits().free_bytes < 4 * GiB:
        pytest.skip("needs 4 GiB free for a 1 GiB reservation to go to RAM")
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "RAM"
        before = memory.siblings()
        assert before.processes == 1 and before.reserved_bytes >= GiB * 9 // 10, before
        assert memory.limits().siblings_reserved_bytes == before.reserved_bytes
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        after = memory.siblings()
        print(f"\nreserved by the sibling: {before.reserved_bytes / GiB:.2f} GiB before SIGKILL, "
              f"{after.reserved_bytes / GiB:.2f} GiB at the next reading ({after.ignored})")
        assert (after.reserved_bytes, after.processes) == (0, 0)
        assert any(f"pid {holder.pid} is gone" in why for why in after.ignored)
        assert memory.limits().siblings_reserved_bytes == 0
        # The slot was cleared, so even the upper bound a placement reads first no longer counts it.
        assert memory.machine().sibling_reading(exact=False).reserved_bytes == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_full_ledger_disk_places_arrays_as_with_no_siblings_after_one_warning(tmp_path, monkeypatch, caplog):
    """A full ``/dev/shm`` (Docker's default is 64 MB; DataLoader workers fill it): a real 64 KiB tmpfs, filled,
    as the ledger's folder. Before: every ``memory.array`` of 1 MB or more raised ``OSError ENOSPC``."""
    import logging

    import numpy as np

    with tmpfs(tmp_path / f"shm-{os.getpid()}", "64k", "0700") as mount:
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
            while True:  # until ENOSPC
                f.write(b"\1" * 4096)
                f.flush()
        monkeypatch.setenv("APSI_LEDGER_DIR", str(mount))
        siblings = Siblings()
        with memory.Machine(siblings=siblings).use():
            caplog.set_level(logging.INFO, "apsi_memory.siblings")
            arrays = [memory.array(8 << 20, "uint8") for _ in range(3)]
            for x in arrays:
                x[:] = 7
            said = [r.getMessage() for r in caplog.records
                    if r.name == "apsi_memory.siblings" and r.levelno == logging.WARNING]
            print(f"\nfull 64 KiB tmpfs as the ledger: {len(arrays)} arrays made and right, warnings: {said}")
            assert all(int(np.sum(x, dtype=np.int64)) == 7 * (8 << 20) for x in arrays)
            assert len(said) == 1 and "ENOSPC" in said[0] and str(mount) in said[0], said
            assert memory.siblings().ledger is None
        siblings.close()
