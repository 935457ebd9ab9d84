"""Running the programs of ``v2_jobs`` inside a real v2 group, for the VM's tests (``test_v2_headline``,
``test_v2_edges``): their environment, start, finish and last JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

from tests.load import stretched
from tests.realcg import ChildGroup

MiB = 1 << 20
LIMIT = 512 * MiB
ROOT = str(Path(__file__).resolve().parents[2])  # the checkout: the jobs import tests.real
JOBS = ["-m", "tests.vm.v2_jobs"]
Group = Callable[..., ContextManager[ChildGroup]]


def job_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "APSI_SPILL_DIR": str(tmp_path / "spill"), "APSI_LEDGER_DIR": str(tmp_path / "ledger")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env.pop("APSI_RAM_BUDGET", None)
    return env


def start_job(group: ChildGroup, tmp_path: Path, *argv: str, prefix: tuple[str, ...] = (),
           stdin: int | None = None) -> subprocess.Popen[str]:
    """A job of ``v2_jobs`` in ``group`` (behind ``prefix``, e.g. ``unshare -C``), its output piped."""
    return subprocess.Popen(group.wrap([*prefix, sys.executable, *JOBS, *argv]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=stdin, text=True, env=job_env(tmp_path), cwd=ROOT)


def finish(job: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = job.communicate(timeout=stretched(timeout))
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate(30)
    return job.returncode, out, err


def last_json(out: str) -> dict[str, Any] | None:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return None


def outcome(status: int, result: dict[str, Any] | None, kills: int) -> str:
    if kills or status < 0:
        return f"killed (exit {status}, {kills} OOM kills)"
    return f"survived, {result}" if result is not None else f"exit {status}, no result"
