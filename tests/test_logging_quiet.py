"""Issue 28 item 8: the docs say nothing prints unless logging is configured, yet every fit_batch halving printed
to stderr (Python's last-resort handler, for a library logger with no handler). The library's loggers have a
NullHandler; a program that configures logging sees them, and the command line still shows its warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim import tree as machines

HALVING = """
import apsi_memory as memory
{configure}
def step(batch):
    if batch > 2:
        raise MemoryError("out of memory")
    return batch
print(memory.fit_batch(step, 8))
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **env})


def test_a_halving_prints_nothing_where_logging_is_not_configured() -> None:
    quiet = _run(HALVING.format(configure=""))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "(2, 2)\n", "")


def test_a_program_that_configures_logging_sees_each_halving() -> None:
    shown = _run(HALVING.format(configure="import logging; logging.basicConfig()"))
    assert shown.returncode == 0 and shown.stderr.count("WARNING:apsi_memory.batch:out of memory at batch") == 2


def _odd_mountinfo(folder: Path) -> Path:
    """A machine whose ``/proc/self/mountinfo`` has a line that is not a mountinfo line: each reading warns."""
    tree = machines.docker_v1(folder)
    mountinfo = tree.root / "proc/self/mountinfo"
    mountinfo.write_text(mountinfo.read_text() + "41 30 0:40 / /mnt/odd rw tmpfs tmpfs rw\n")
    return tree.root


def test_a_warning_whose_logger_is_made_where_it_logs_prints_nothing_where_logging_is_not_configured(
        tmp_path: Path) -> None:
    """The readings' loggers are made where they log (``apsi_memory.logs``: a first reading that logs nothing
    never imports logging); the first one made still has the package's NullHandler above it."""
    done = _run("import apsi_memory as memory\nmemory.limits()\nprint('read')",
                APSI_FS_ROOT=str(_odd_mountinfo(tmp_path / "machine")))
    assert (done.returncode, done.stdout, done.stderr) == (0, "read\n", "")


def test_the_command_line_still_prints_the_librarys_warnings(tmp_path: Path) -> None:
    root = _odd_mountinfo(tmp_path / "machine")
    done = subprocess.run([sys.executable, "-m", "apsi_memory", "limits"], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "APSI_FS_ROOT": str(root)})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("/proc/self/mountinfo: skipped line '41 30 0:40 / /mnt/odd rw tmpfs tmpfs rw', which is "
                           "not a mountinfo line; read the rest\n")
