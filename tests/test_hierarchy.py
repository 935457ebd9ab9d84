"""Finding the group on real-world layouts (issue 10, items 1, 3, 4, 5): sim trees read by the real adapters."""

from __future__ import annotations

import os
from collections.abc import Callable

import apsi_memory as memory
from sim import tree as machines
from sim.tree import GiB, MiB, SimTree

BuildMachine = Callable[..., SimTree]


# -- item 1: a level without the memory controller ---------------------------------------------------------------

def test_service_without_memory_controller_keeps_the_slices_limit(sim_machine: BuildMachine) -> None:
    # The service has no memory.current: its slice does not hand memory down. The kernel charges the slice and
    # enforces its MemoryMax=1G; reading the host would report 2 TiB.
    sim_machine(machines.service_without_memory_controller, slice_limit=1 * GiB, slice_usage=256 * MiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.free_bytes) == (1 * GiB, 768 * MiB)
    assert limits.source == "container (cgroup v2)" and limits.cgroup == "/batch.slice/job.service"
    assert limits.limit_file == "/sys/fs/cgroup/batch.slice/memory.max"
    assert str(limits).startswith("1.0 GB usable (container (cgroup v2)), 768.0 MB free")


def test_v1_group_without_usage_file_keeps_its_limit_and_uses_the_parents_charge(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.hybrid, limit=5 * GiB, usage=2 * GiB)
    tree.v1_group("/sys/fs/cgroup/memory/system.slice", usage=3 * GiB)
    os.remove(tree.root / "sys/fs/cgroup/memory/system.slice/app.service/memory.usage_in_bytes")
    limits = memory.limits()
    assert limits.usable_bytes == 5 * GiB and limits.cgroup_version == 1
    assert limits.working_set_bytes == 3 * GiB and limits.free_bytes == 2 * GiB  # the slice's charge


def test_no_level_with_a_usage_file_is_the_host(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.service_without_memory_controller)
    os.remove(tree.root / "sys/fs/cgroup/batch.slice/memory.current")
    assert memory.limits().source == "host" and memory.limits().usable_bytes == 2048 * GiB


# -- item 3: '..' in /proc/self/cgroup ----------------------------------------------------------------------------

def test_a_group_outside_the_namespace_is_never_read_outside_the_mount(sim_machine: BuildMachine) -> None:
    # The path climbs to /sys/user-1000.slice/..., where a 1 GiB group waits: reading it would be a lie.
    sim_machine(machines.outside_namespace)
    limits = memory.limits()
    assert limits.source == "host" and limits.usable_bytes == 64 * GiB and limits.limit_bytes is None
    assert limits.cgroup_problem == ("group /../../user-1000.slice/session-520.scope is outside this cgroup "
                                     "namespace and no mount shows it: not read")
    assert str(limits).startswith("64.0 GB usable (host; group /../../user-1000.slice/session-520.scope is outside")
    assert memory.pressure().psi_source == "/proc/pressure/memory"  # not the mount point's group either


def test_a_mount_with_the_same_dotdot_root_shows_the_group(sim_machine: BuildMachine) -> None:
    sim_machine(machines.outside_namespace, mount_root="/../..")
    limits = memory.limits()
    assert limits.usable_bytes == 2 * GiB and limits.cgroup_problem is None
    assert limits.limit_file == "/sys/fs/cgroup/user-1000.slice/session-520.scope/memory.max"


# -- item 4: a group not under any mount root ---------------------------------------------------------------------

def test_a_group_not_under_the_mount_root_is_read_at_the_mount_point_and_marked(sim_machine: BuildMachine) -> None:
    sim_machine(machines.group_not_under_mount_root, limit=1 * GiB)
    limits = memory.limits()
    assert limits.usable_bytes == 1 * GiB and limits.group_guessed is True
    assert limits.to_dict()["group_guessed"] is True
    assert str(limits).startswith(
        "1.0 GB usable (container (cgroup v1), group not visible: read at the mount point), ")


def test_a_visible_group_is_not_marked_guessed(sim_machine: BuildMachine) -> None:
    sim_machine(machines.docker_v1)
    assert memory.limits().group_guessed is False and "not visible" not in str(memory.limits())


def test_the_mount_whose_root_is_the_longest_prefix_wins(sim_machine: BuildMachine) -> None:
    # Two memory mounts: the host's whole tree (root /) first, the container's (root /docker/3f2a9c0e7b1d) second.
    tree = sim_machine(machines.docker_v1, limit=4 * GiB)
    tree.mount("/mnt/hostcg", "cgroup", "memory", root="/")
    tree.v1_group("/mnt/hostcg/docker/3f2a9c0e7b1d", limit=3 * GiB)
    mountinfo = tree.root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines()
    mountinfo.write_text("\n".join(lines[:2] + lines[-1:] + lines[2:-1]) + "\n")  # the / mount comes first
    assert memory.limits().usable_bytes == 4 * GiB  # /docker/<id> is the longer root: its mount is read


def test_with_no_mount_showing_the_group_the_first_is_read(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.group_not_under_mount_root, limit=1 * GiB)
    tree.mount("/mnt/other", "cgroup", "memory", root="/docker/other")
    tree.v1_group("/mnt/other", limit=3 * GiB)
    assert memory.limits().usable_bytes == 1 * GiB and memory.limits().group_guessed


# -- item 5: what is not a limit ----------------------------------------------------------------------------------

def test_reclaim_targets_and_protections_are_not_limits(sim_machine: BuildMachine) -> None:
    # dask counts memory.soft_limit_in_bytes (v1) and memory.low / memory.min (v2); they are not caps.
    tree = sim_machine(machines.docker_v1, limit=4 * GiB)
    tree.write("/sys/fs/cgroup/memory/memory.soft_limit_in_bytes", f"{512 * MiB}\n")
    assert memory.limits().usable_bytes == 4 * GiB
    tree = sim_machine(machines.cgroup_namespace, limit=3 * GiB)
    tree.write("/sys/fs/cgroup/memory.low", f"{256 * MiB}\n")
    tree.write("/sys/fs/cgroup/memory.min", f"{128 * MiB}\n")
    assert memory.limits().usable_bytes == 3 * GiB and memory.limits().limit_file == "/sys/fs/cgroup/memory.max"
