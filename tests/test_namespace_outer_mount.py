"""Issue 27 item 3: a cgroup namespace that kept the outer mount (``unshare -C``; kind, Docker-in-Docker, LXC).
``/proc/self/cgroup`` says ``0::/`` and the mount's root ``/..``: the mount point is the host's root group, and
reading it planned with the host's RAM (in a real v2 kernel: 2.0 GB usable, ``source: host``, in a 512 MiB group).
The group is the one below the mount whose ``cgroup.procs`` holds our pid, searched within a bound; never the
host's root read as ours."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

import apsi_memory as memory
from apsi_memory.adapters import cgroupns
from sim import tree as machines
from sim.tree import MiB, SimTree

BuildMachine = Callable[..., SimTree]


@pytest.mark.parametrize("depth", [1, 2])
def test_the_group_holding_our_pid_is_read_not_the_hosts_root(sim_machine: BuildMachine, depth: int) -> None:
    sim_machine(machines.namespace_outer_mount, depth=depth, limit=512 * MiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.source, limits.cgroup_problem) == (512 * MiB, "container (cgroup v2)", None)
    assert limits.limit_file == "/sys/fs/cgroup" + "/kubepods" * (depth - 1) + "/apsi-ns/memory.max"


def test_no_group_holding_our_pid_is_a_problem_named_not_a_silent_host_reading(sim_machine: BuildMachine) -> None:
    sim_machine(machines.namespace_outer_mount, holds_pid=False)
    limits = memory.limits()
    assert limits.source == "host" and limits.limit_bytes is None
    assert limits.cgroup_problem == ("group / is the root of a cgroup namespace below /sys/fs/cgroup (mount root /..) "
                                     "and no group 1 level(s) below /sys/fs/cgroup holds pid 4711: not read")


def test_the_search_is_bounded(sim_machine: BuildMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    sim_machine(machines.namespace_outer_mount)
    monkeypatch.setattr(cgroupns, "MAX_SEARCHED", 1)  # the tree has 2 groups at the namespace's depth
    limits = memory.limits()
    assert limits.source == "host" and "more than 1 groups to search" in (limits.cgroup_problem or "")


def test_a_symlink_below_the_mount_is_never_followed(sim_machine: BuildMachine, tmp_path_factory:
                                                    pytest.TempPathFactory) -> None:
    tree = sim_machine(machines.namespace_outer_mount, holds_pid=False)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # a group someone placed outside the cgroup filesystem
    (elsewhere / "cgroup.procs").write_text("4711\n")
    (elsewhere / "memory.max").write_text(f"{64 * MiB}\n")
    (elsewhere / "memory.current").write_text("0\n")
    os.symlink(elsewhere, tree.root / "sys/fs/cgroup/planted")
    limits = memory.limits()
    assert limits.source == "host" and "holds pid 4711" in (limits.cgroup_problem or "")


def test_only_pure_dotdot_roots_are_searched() -> None:
    assert [cgroupns.climbs_only(r) for r in ("/..", "/../..", "/", "/docker/1", "/../x", "/../../")] == \
        [1, 2, 0, 0, 0, 2]
