"""Fixtures of the real-system tests: a small real tmpfs for a full disk (root on Linux, else a skip)."""

from __future__ import annotations

import gc
import os
import shutil
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


@pytest.fixture
def other_user() -> Iterator[tuple[int, int]]:
    """A second user (uid, gid) made for the test with ``useradd`` and removed afterwards, whatever happened."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("adding a user needs root on Linux")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd here to make a second user")
    name = f"apsi9t{os.getpid() % 100000}"
    done = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot add a user: {done.stderr.strip()}")
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder every user can reach (pytest's own are root-only), removed afterwards."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="apsi9-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
