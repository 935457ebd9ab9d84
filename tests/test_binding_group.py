"""The ledger is keyed by the group whose limit binds (issue 26 item 6), over sim trees of v1 and v2.

Processes in child groups of one limited parent (a systemd slice, a pod above its containers, Slurm steps) share
that parent's memory: keyed by each one's own group they never saw each other, and 2 of 4 were OOM-killed. The
binding group is the level, the process's own included, whose limit is the smallest; on a tie the outermost (two
children whose own limits equal the parent's still share the parent's memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

import apsi_memory as memory
import sim.tree
from apsi_memory import Machine
from apsi_memory.machinery.reading import read_memory
from apsi_memory.machinery.reservations import Siblings, group_key
from sim.clock import FakeClock

GiB, MiB = 1 << 30, 1 << 20
TOP = {1: "/sys/fs/cgroup/memory", 2: "/sys/fs/cgroup"}


def reading(tmp_path: Path, version: int, child: str, **kwargs: int | None):
    return read_memory(str(sim.tree.nested(tmp_path / child, version, child, **kwargs).root))


@pytest.mark.parametrize("version", [1, 2])
def test_two_children_under_one_limited_parent_share_one_ledger(tmp_path, version):
    a, b = reading(tmp_path, version, "step-a"), reading(tmp_path, version, "step-b")
    assert a.cgroup is not None and a.cgroup.directory == f"{TOP[version]}/batch/step-a"  # its own group ...
    assert a.cgroup.binding == f"{TOP[version]}/batch" and a.limited  # ... bound by the parent's 2 GiB
    assert group_key(a) == group_key(b), (a.cgroup, b.cgroup)


@pytest.mark.parametrize("version", [1, 2])
def test_a_child_with_its_own_smaller_limit_is_keyed_by_itself(tmp_path, version):
    small = reading(tmp_path, version, "step-a", child_limit=1 * GiB)
    other = reading(tmp_path, version, "step-b")
    assert small.cgroup is not None and small.cgroup.binding == small.cgroup.directory
    assert group_key(small) != group_key(other)


@pytest.mark.parametrize("version", [1, 2])
def test_a_child_limit_equal_to_its_parents_is_keyed_by_the_parent(tmp_path, version):
    a = reading(tmp_path, version, "step-a", child_limit=2 * GiB)
    b = reading(tmp_path, version, "step-b")
    assert group_key(a) == group_key(b)


@pytest.mark.parametrize("version", [1, 2])
def test_no_limit_anywhere_is_the_host(tmp_path, version):
    free = reading(tmp_path, version, "step-a", parent_limit=None)
    assert not free.limited and group_key(free) == "reservations-host"


def test_one_group_with_its_own_limit_keeps_its_key(tmp_path):
    """The common case, a container with its own limit: the key is what it was before the binding group."""
    docker = read_memory(str(sim.tree.docker_v1(tmp_path / "root").root))
    assert docker.cgroup is not None and docker.cgroup.binding == docker.cgroup.directory == TOP[1]


def place_beside(tmp_path: Path, version: int, reserved: int) -> tuple[bool, int]:
    """(on the SSD, siblings seen) of a 1 GiB array placed in step-b while a process in step-a holds ``reserved``
    bytes placed in RAM and not written yet (0: no such process)."""
    ledger = str(tmp_path / f"ledger-{reserved}")
    trees = [sim.tree.nested(tmp_path / f"{c}-{reserved}", version, c) for c in ("step-a", "step-b")]
    sibling = Siblings([ledger], pid=4242)
    if reserved:
        sibling.publish(group_key(read_memory(str(trees[0].root))), reserved, reserved)
    ours = Siblings([ledger])
    try:
        with Machine(root=str(trees[1].root), clock=FakeClock(), siblings=ours).use():
            x = memory.array(1 * GiB, "uint8")
            return memory.on_disk(x), memory.siblings().processes
    finally:
        sibling.close()
        ours.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_placement_in_one_child_sees_what_a_process_in_the_other_reserved(tmp_path, version):
    """Two steps under a 2 GiB parent (512 MiB used): one has placed 1.2 GiB it has not written yet. The other's
    1 GiB array must go to the SSD; keyed by its own group (the defect) it went to RAM and the two overran.
    Control: with nothing reserved beside it, the same array goes to RAM (the harness can see RAM)."""
    spilled, seen = place_beside(tmp_path, version, 1229 * MiB)
    alone, _ = place_beside(tmp_path, version, 0)
    print(f"\nv{version}: 1 GiB beside 1.2 GiB reserved in the other step: {'SSD' if spilled else 'RAM'} "
          f"({seen} sibling seen); alone: {'SSD' if alone else 'RAM'}")
    assert (spilled, seen, alone) == (True, 1, False)


def test_a_limit_from_above_the_mount_root_binds_the_top_group_seen(tmp_path):
    """Docker on v1: the container's group is its mount's root; a 2 GiB limit set above it shows only in its
    ``hierarchical_memory_limit``. The top group seen stands for the one above (all this container sees)."""
    tree = sim.tree.docker_v1(tmp_path / "root")
    tree.v1_group(TOP[1], None, 1 * GiB, hierarchical_limit=2 * GiB)
    seen = read_memory(str(tree.root))
    assert seen.cgroup is not None and seen.cgroup.limit == 2 * GiB and seen.cgroup.binding == TOP[1]


def test_a_parent_that_charges_nothing_does_not_bind(tmp_path):
    """v1 with ``memory.use_hierarchy`` 0: ``/batch`` has 1 GiB but does not charge its child; the child's own
    2 GiB binds, so it is keyed by itself."""
    seen = read_memory(str(sim.tree.v1_without_hierarchy(tmp_path / "root").root))
    assert seen.cgroup is not None and seen.cgroup.binding == f"{TOP[1]}/batch/job"
