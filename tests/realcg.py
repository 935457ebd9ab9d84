"""Real memory cgroups for the real-system tests, on cgroup v1 (``/sys/fs/cgroup/memory``) or v2 (the unified
hierarchy at ``/sys/fs/cgroup``): make a child of our own group, run a command in it, read its counters, and always
remove it again. Skips (with the reason) where that is impossible: not root, no memory controller, or a read-only
cgroup filesystem. Also a real small tmpfs (``tmpfs``), for a full disk.

v1 wins where a host has both (a hybrid host: the memory controller is on v1 there). On v2 the parent is this
process's own group; v2's no-internal-process rule forbids enabling ``memory`` for its children while that group
holds processes (the root group excepted), so the processes of the group are first moved into a leaf child
``apsi-test-runner`` (the move systemd and Docker-in-Docker make), and the test groups become siblings of that leaf.
"""

from __future__ import annotations

import contextlib
import errno
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
V2_MOUNT = "/sys/fs/cgroup"
RUNNER = "apsi-test-runner"  # the leaf this process's group's processes move to on v2 (see the docstring)


def _skip(reason: str) -> NoReturn:
    import pytest  # here, not at the top: the dask benchmark uses remove_group where pytest is not installed

    pytest.skip(reason)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


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


def own_v2_group() -> str | None:
    """This process's group in the unified hierarchy (``0::/path``), where ``/sys/fs/cgroup`` is cgroup2."""
    if not os.path.exists(os.path.join(V2_MOUNT, "cgroup.controllers")):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
                if hierarchy == "0" and controllers == "":
                    return os.path.join(V2_MOUNT, path.lstrip("/"))
    except OSError:
        return None
    return None


def cgroup_version() -> str | None:
    """``"v1"`` where the memory controller is on v1 (hybrid hosts too), ``"v2"`` on a unified hierarchy with it,
    else ``None``."""
    v1 = own_v1_memory_group()
    if v1 is not None and os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
        return "v1"
    v2 = own_v2_group()
    if v2 is not None and "memory" in _controllers(v2, "cgroup.controllers"):
        return "v2"
    return None


def _controllers(group: str, name: str) -> list[str]:
    try:
        return _read(os.path.join(group, name)).split()
    except OSError:
        return []


def skip_reason() -> str | None:
    if sys.platform != "linux":
        return "real cgroup tests need Linux"
    if os.geteuid() != 0:
        return "real cgroup tests need root to create a memory cgroup"
    version = cgroup_version()
    if version is None:
        return ("no memory controller for this process: neither cgroup v1 at /sys/fs/cgroup/memory nor 'memory' "
                f"in {own_v2_group() or V2_MOUNT}/cgroup.controllers (cgroup v2)")
    parent = own_v1_memory_group() if version == "v1" else own_v2_group()
    assert parent is not None
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable"
    return None


def v2_skip_reason() -> str | None:
    """Why a test that needs a real cgroup v2 kernel cannot run here (``None``: it can)."""
    return skip_reason() or (None if cgroup_version() == "v2" else
                             "needs a real cgroup v2 kernel (this one has the memory controller on cgroup v1: "
                             "the tox env 'vm' boots one)")


@dataclass
class ChildGroup:
    path: str
    limit_bytes: int
    version: str = "v1"

    def run(self, argv: Sequence[str], timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the group (the shell joins it, then execs the command)."""
        return subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` behind a shell that joins the group first (for ``subprocess.Popen``)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path, *argv]

    def _file(self, v1: str, v2: str) -> str:
        return os.path.join(self.path, v2 if self.version == "v2" else v1)

    def events(self) -> dict[str, int]:
        """The kernel's own counters: v2's ``memory.events`` (low, high, max, oom, oom_kill, ...); on v1 the OOM
        kills (``memory.oom_control``) and the times the limit was hit (``memory.failcnt``) under v2's names."""
        if self.version == "v2":
            pairs = (line.split() for line in _read(os.path.join(self.path, "memory.events")).splitlines())
            return {name: int(value) for name, value in pairs}
        kills = next((int(line.split()[1]) for line in _read(os.path.join(self.path, "memory.oom_control")).splitlines()
                      if line.startswith("oom_kill ")), 0)
        return {"max": int(_read(os.path.join(self.path, "memory.failcnt"))), "oom_kill": kills}

    def oom_kills(self) -> int:
        return self.events().get("oom_kill", 0)

    def set_limit(self, nbytes: int) -> None:
        """The hard limit: v2 takes one below the usage (reclaim, then OOM kills); v1 refuses it (EBUSY)."""
        _write(self._file("memory.limit_in_bytes", "memory.max"), str(nbytes))
        self.limit_bytes = nbytes

    def set_high(self, nbytes: int | None) -> None:
        """v2's ``memory.high`` (``None``: ``max``), above which the kernel throttles and reclaims instead of
        killing."""
        if self.version != "v2":
            raise OSError(errno.ENOTSUP, f"memory.high is cgroup v2 only; {self.path} is a v1 group")
        _write(os.path.join(self.path, "memory.high"), "max" if nbytes is None else str(nbytes))

    def usage(self) -> int:
        return int(_read(self._file("memory.usage_in_bytes", "memory.current")))

    def peak(self) -> int | None:
        """The highest usage seen (v2's ``memory.peak``, kernel 5.19+; v1's ``memory.max_usage_in_bytes``)."""
        try:
            return int(_read(self._file("memory.max_usage_in_bytes", "memory.peak")))
        except OSError:
            return None

    def describe(self) -> str:
        """One line for a test's figure: the limit, the peak, the kernel's counters."""
        peak = self.peak()
        counters = " ".join(f"{name} {value}" for name, value in self.events().items())
        return (f"{self.version} limit {self.limit_bytes >> 20} MiB, peak "
                f"{'-' if peak is None else peak >> 20} MiB, memory.events: {counters}")


@contextlib.contextmanager
def child_group(limit_bytes: int, prefix: str = "apsi-test") -> Iterator[ChildGroup]:
    reason = skip_reason()
    if reason:
        _skip(reason)
    version = cgroup_version()
    parent = own_v1_memory_group() if version == "v1" else _v2_parent()
    assert parent is not None and version is not None
    path = os.path.join(parent, f"{prefix}-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        _skip(f"cannot create a child memory cgroup under {parent}: {exc}")
    try:
        group = ChildGroup(path, limit_bytes, version)
        group.set_limit(limit_bytes)
        if version == "v2":  # no swap: the limit is the RAM the group has, as on v1 without memsw
            with contextlib.suppress(OSError):
                _write(os.path.join(path, "memory.swap.max"), "0")
        yield group
    finally:
        remove_group(path)


def _v2_parent() -> str:
    """This process's v2 group, with ``memory`` enabled for its children (moving its processes into the leaf
    ``RUNNER`` first where they would forbid that)."""
    group = own_v2_group()
    assert group is not None
    if "memory" in _controllers(group, "cgroup.subtree_control"):
        return group
    try:
        _write(os.path.join(group, "cgroup.subtree_control"), "+memory")
    except OSError as exc:
        if exc.errno != errno.EBUSY:  # EBUSY: the group has processes (no-internal-process rule)
            _skip(f"cannot enable memory for the children of {group}: {exc}")
        _move_processes_to_leaf(group)
        _write(os.path.join(group, "cgroup.subtree_control"), "+memory")
    return group


def _move_processes_to_leaf(group: str) -> None:
    leaf = os.path.join(group, RUNNER)
    os.makedirs(leaf, exist_ok=True)
    for _ in range(10):  # a process forked meanwhile lands in the group: go again until it is empty
        pids = _read(os.path.join(group, "cgroup.procs")).split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                _write(os.path.join(leaf, "cgroup.procs"), pid)
    raise OSError(errno.EBUSY, f"{group} still has processes after moving them into {leaf}")


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
