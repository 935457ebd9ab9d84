"""Two kernel formats real machines produce (issue 20, items 12 and 13): a mountinfo line whose mount source is
empty, and cgroup v1 with ``memory.use_hierarchy`` 0 on an ancestor. Fixtures and their provenance:
fixtures/kernel-formats/README.md."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
import sim
from apsi_memory import CorruptFileError
from apsi_memory.adapters import procfs
from apsi_memory.decide import charged_levels
from sim import tree as machines
from sim.tree import GiB, MiB, SimTree

FORMATS = Path(__file__).parent.parent / "fixtures" / "kernel-formats"
BuildMachine = Callable[..., SimTree]


# -- item 12: mountinfo by proc(5)'s field rules -----------------------------------------------------------------

def test_an_empty_mount_source_keeps_the_super_options() -> None:
    (mount,) = procfs.parse_mountinfo("51 47 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup  rw,memory\n")
    assert (mount.mount_point, mount.fstype, mount.super_options) == ("/sys/fs/cgroup/memory", "cgroup",
                                                                       ("rw", "memory"))


def test_optional_fields_and_escapes_in_every_field() -> None:
    line = r"36 35 98:0 /a\040b /mnt\011x rw,noatime master:1 shared:2 - cgroup my\040src rw,mem\054x,memory"
    (mount,) = procfs.parse_mountinfo(line)
    assert (mount.root, mount.mount_point) == ("/a b", "/mnt\tx")
    assert mount.super_options == ("rw", "mem,x", "memory")  # an escaped comma is not a separator


def test_a_dash_among_the_first_six_fields_is_not_the_separator() -> None:
    (mount,) = procfs.parse_mountinfo("36 35 98:0 / /- rw - cgroup cgroup rw,memory")
    assert mount.mount_point == "/-" and mount.super_options == ("rw", "memory")


@pytest.mark.parametrize("line", [
    "36 35 98:0 / /mnt rw shared:1 cgroup cgroup rw",  # no separator
    "36 35 98:0 / /mnt rw - cgroup",  # nothing after the type
    "36 35 98:0 /mnt rw - cgroup cgroup rw",  # a field short before the separator
])
def test_a_malformed_line_is_named(line: str) -> None:
    with pytest.raises(CorruptFileError, match="is not a mountinfo line"):
        procfs.parse_mountinfo(line + "\n")


def test_a_memory_mount_with_an_empty_source_is_read(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.host)
    tree.mount("/sys/fs/cgroup/memory", "cgroup", "memory", source="").member("4:memory:/job")
    tree.v1_group("/sys/fs/cgroup/memory/job", limit=3 * GiB, usage=1 * GiB)
    assert "- cgroup  rw," in (tree.root / "proc/self/mountinfo").read_text()
    limits = memory.limits()
    assert (limits.usable_bytes, limits.cgroup_version, limits.cgroup) == (3 * GiB, 1, "/job")


def test_the_captured_empty_source_tree_reads_the_groups_limit() -> None:
    root = FORMATS / "v1-empty-mount-source"
    with sim.machine(root).use():
        limits = memory.limits()
    assert limits.source == "container (cgroup v1)" and limits.usable_bytes == 256 * MiB
    assert limits.cgroup is not None and limits.cgroup.endswith("/apsi-parse-capture")


# -- item 13: v1 memory.use_hierarchy = 0 ------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "charged"), [
    ([True], 1), ([True, True, True], 3), ([True, False, True], 1), ([False, True, True], 3),
    ([True, True, False], 2), ([False, False, False], 1),
])
def test_a_charge_climbs_only_through_hierarchical_parents(flags: list[bool], charged: int) -> None:
    # The group's own flag is about its children, not about it: only its parents' flags stop the climb.
    assert charged_levels(flags) == charged


@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_a_charge_stops_right_below_the_first_non_hierarchical_parent(flags: list[bool]) -> None:
    charged = charged_levels(flags)
    assert 1 <= charged <= len(flags) and all(flags[1:charged])  # every parent it reaches passes charges on
    assert charged == len(flags) or not flags[charged]  # and it stops only at one that does not
    assert charged_levels([not flags[0], *flags[1:]]) == charged  # the group's own flag is about its children


def test_a_non_hierarchical_parents_limit_does_not_apply(sim_machine: BuildMachine) -> None:
    sim_machine(machines.v1_without_hierarchy, parent_limit=1 * GiB, group_limit=2 * GiB)
    limits = memory.limits()
    assert limits.usable_bytes == 2 * GiB and limits.free_bytes == 2 * GiB - 512 * MiB
    assert limits.limit_file == "/sys/fs/cgroup/memory/batch/job/memory.limit_in_bytes"


def test_without_a_limit_of_its_own_the_group_is_the_hosts(sim_machine: BuildMachine) -> None:
    sim_machine(machines.v1_without_hierarchy, parent_limit=1 * GiB, group_limit=None)
    assert memory.limits().usable_bytes == 16 * GiB


def test_a_hierarchical_parents_limit_still_applies(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.v1_without_hierarchy, parent_limit=1 * GiB, group_limit=2 * GiB)
    tree.v1_group("/sys/fs/cgroup/memory/batch", 1 * GiB, 900 * MiB, use_hierarchy=True)
    assert memory.limits().usable_bytes == 1 * GiB


def test_the_kernel_documented_tree_reads_the_groups_own_limit() -> None:
    with sim.machine(FORMATS / "v1-use-hierarchy-0").use():
        limits = memory.limits()
    assert (limits.usable_bytes, limits.free_bytes, limits.cgroup) == (2 * GiB, 1664 * MiB, "/batch/job")


def test_a_malformed_use_hierarchy_file_is_named(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.v1_without_hierarchy)
    tree.write("/sys/fs/cgroup/memory/batch/memory.use_hierarchy", "maybe\n")
    with pytest.raises(CorruptFileError, match="batch/memory.use_hierarchy"):
        memory.limits()
