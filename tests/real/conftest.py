"""Fixtures of the real-system tests: a small real tmpfs for a full disk (root on Linux, else a skip)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import apsi_memory as memory


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs that stores may write to; unmounted afterwards, whatever the test did."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    memory.allow_write(mount)
    try:
        yield mount
    finally:
        gc.collect()  # close the stores' files before the disk goes
        subprocess.run(["umount", "-l", str(mount)], check=False)
