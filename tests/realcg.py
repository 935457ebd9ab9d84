"""Real cgroup v1 memory groups for the real-system tests: make a child of our own group, run a command in it,
and always remove it again. Skips (with the reason) where that is impossible: not root, no v1 memory controller,
or a read-only cgroup filesystem. Also a real small tmpfs (``tmpfs``), for a full disk."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

V1_MEMORY_MOUNT = "/sys/fs/cgroup/memory"


def _skip(reason: str) -> NoReturn:
    import pytest  # here, not at the top: the dask benchmark uses remove_group where pytest is not installed

    pytest.skip(reason)


def own_v1_memory_group() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    return os.path.join(V1_MEMORY_MOUNT, path.lstrip("/"))
    except OSError:
        return None
    return None


def skip_reason() -> str | None:
    if sys.platform != "linux":
        return "real cgroup tests need Linux"
    if os.geteuid() != 0:
        return "real cgroup tests need root to create a memory cgroup"
    parent = own_v1_memory_group()
    if parent is None or not os.path.exists(os.path.join(parent, "memory.limit_in_bytes")):
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory for this process"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable"
    return None


@dataclass
class ChildGroup:
    path: str
    limit_bytes: int

    def run(self, argv: Sequence[str], timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the group (the shell joins it, then execs the command)."""
        wrapper = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path, *argv]
        return subprocess.run(wrapper, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]

    def oom_kills(self) -> int:
        with open(os.path.join(self.path, "memory.oom_control")) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0


@contextlib.contextmanager
def child_group(limit_bytes: int, prefix: str = "apsi-test") -> Iterator[ChildGroup]:
    reason = skip_reason()
    if reason:
        _skip(reason)
    parent = own_v1_memory_group()
    assert parent is not None
    path = os.path.join(parent, f"{prefix}-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        _skip(f"cannot create a child memory cgroup under {parent}: {exc}")
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_bytes))
        yield ChildGroup(path, limit_bytes)
    finally:
        remove_group(path)


def remove_group(path: str) -> None:
    """Kill what is left in the cgroup ``path`` and remove it (a group with processes cannot be removed)."""
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    os.rmdir(path)  # one last try; raising here makes the leak visible


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str, mode: str | None = None) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``"64k"``) mounted at the new folder ``mount_point``, unmounted afterwards; the test
    is skipped, with the reason, where mounting is not allowed."""
    mount_point.mkdir()
    options = f"size={size}" + (f",mode={mode}" if mode else "")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        _skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
