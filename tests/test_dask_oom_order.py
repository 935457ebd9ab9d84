"""The kernel's first choice where a group is full: a nanny's worker, from its nanny's first check after it starts.

A worker sets its own ``oom_score_adj`` only once dask is imported, about a second after it starts; in the 1 GiB
matrix a group full in that second (both workers starting again) had the kernel kill the process beside the
cluster. The nanny's check (every 100 ms) now sets it for each new worker, and only for a child of its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

from apsi_memory.dask.admission import OOM_SCORE_ADJ, child_killed_first
from apsi_memory.dask.nanny import group_check

pytestmark = [pytest.mark.dask, pytest.mark.timeout(60)]


def score(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def nanny_of(pid: int) -> SimpleNamespace:
    """What ``group_check`` reads of a dask ``Nanny``: its worker process and its memory manager (no limit)."""
    return SimpleNamespace(process=SimpleNamespace(process=SimpleNamespace(pid=pid)),
                           memory_manager=SimpleNamespace(memory_limit=None, memory_terminate_fraction=0.95))


def test_a_nannys_new_worker_is_the_kernels_first_choice_from_the_nannys_next_check(
        child: subprocess.Popen[bytes]) -> None:
    assert score(child.pid) != OOM_SCORE_ADJ  # this process's own, inherited
    group_check(nanny_of(child.pid))
    assert score(child.pid) == OOM_SCORE_ADJ


def test_a_process_that_is_not_this_ones_child_is_never_scored() -> None:
    """A pid may be another process's by the time a check runs: a grandchild, reparented once its parent ends."""
    shell = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                           check=True)
    orphan = int(shell.stdout)
    try:
        before = score(orphan)
        assert not child_killed_first(orphan)
        assert score(orphan) == before != OOM_SCORE_ADJ
    finally:
        subprocess.run(["kill", str(orphan)], check=False)


def test_a_child_that_has_ended_is_not_written(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait()
    assert not child_killed_first(child.pid)
