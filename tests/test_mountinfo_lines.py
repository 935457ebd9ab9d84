"""Issue 27 item 4: one ``/proc/self/mountinfo`` line the kernel could not have written (as a tree captured by
another project's test had) must not take the whole reading down. The line is skipped with a warning that names it,
and the memory mount beside it is read; a file with nothing readable in it is still named as corrupt."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

import apsi_memory as memory
from apsi_memory import CorruptFileError
from apsi_memory.adapters import procfs
from sim import tree as machines
from sim.tree import GiB, SimTree

BuildMachine = Callable[..., SimTree]
MALFORMED = "41 30 0:40 / /mnt/odd rw,relatime shared:9 tmpfs tmpfs rw"  # no ' - ' separator: not the kernel's


def _insert_line(tree: SimTree, line: str) -> None:
    mountinfo = tree.root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines()
    mountinfo.write_text("\n".join([*lines[:1], line, *lines[1:]]) + "\n")


def test_a_malformed_line_beside_valid_ones_is_skipped_with_a_warning_naming_it(
        sim_machine: BuildMachine, caplog: pytest.LogCaptureFixture) -> None:
    tree = sim_machine(machines.docker_v1, limit=3 * GiB)
    _insert_line(tree, MALFORMED)
    with caplog.at_level(logging.WARNING, logger="apsi_memory.limits"):
        limits = memory.limits()
        memory.limits()
    assert (limits.usable_bytes, limits.source) == (3 * GiB, "container (cgroup v1)")
    warned = [r.getMessage() for r in caplog.records if r.name == "apsi_memory.limits"]
    assert len(warned) == 1, warned  # once for this text of the file, not on every reading
    assert "/proc/self/mountinfo" in warned[0] and MALFORMED in warned[0]


def test_only_malformed_lines_are_still_a_corrupt_file(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.docker_v1)
    tree.write("/proc/self/mountinfo", MALFORMED + "\n" + "a b c\n")
    with pytest.raises(CorruptFileError, match="is not a mountinfo line"):
        memory.limits()


def test_the_parser_keeps_every_valid_line_and_lists_the_skipped_ones() -> None:
    valid = "51 47 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
    mounts, skipped = procfs.parse_mountinfo_lines(f"{MALFORMED}\n{valid}\n\n{valid.replace('51', '52', 1)}\n")
    assert [m.mount_point for m in mounts] == ["/sys/fs/cgroup/memory"] * 2 and skipped == [MALFORMED]
