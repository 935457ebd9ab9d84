"""Issue 22 item 4: the ``dask worker`` processes of this cgroup, read from a sim ``/proc`` (no dask needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apsi_memory.adapters.dask_workers import GroupDask, group_dask, parse_nworkers
from sim.tree import SimTree

OWN = "12:memory:/pods/a\n0::/pods/a\n"


@pytest.mark.parametrize(("argv", "workers"), [
    (["/usr/bin/python3", "/usr/bin/dask", "worker", "tcp://s:8786"], 1),
    (["dask", "worker", "tcp://s:8786", "--nworkers", "3"], 3),
    (["dask-worker", "tcp://s:8786", "--nworkers=2"], 2),
    (["python", "-m", "distributed.cli.dask_worker", "--nprocs", "4"], 4),
    (["dask", "worker", "--nworkers", "auto"], 1),
    (["dask", "scheduler"], 0),
    (["python", "train.py", "--nworkers", "8"], 0),
])
def test_a_dask_worker_command_line_counts_its_workers(argv: list[str], workers: int) -> None:
    assert parse_nworkers(argv) == workers


def _process(tree: SimTree, pid: int, argv: list[str], cgroup: str) -> None:
    tree.write(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
    tree.write(f"/proc/{pid}/cgroup", cgroup)


def test_only_the_dask_workers_of_this_group_are_counted(tmp_path: Path) -> None:
    tree = SimTree(tmp_path)
    tree.write("/proc/self/cgroup", OWN)
    _process(tree, 101, ["dask", "worker", "tcp://s:8786"], OWN)
    _process(tree, 102, ["dask", "worker", "tcp://s:8786", "--nworkers", "2"], OWN)
    _process(tree, 103, ["dask", "worker", "tcp://s:8786"], "12:memory:/pods/b\n0::/pods/b\n")  # another pod
    _process(tree, 104, ["dask", "scheduler"], OWN)
    assert sorted(group_dask(str(tmp_path)).workers) == [1, 2]
    assert group_dask(str(tmp_path / "nothing")).workers == ()


SPAWNED = ["/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
           "--multiprocessing-fork"]


def test_a_scheduler_or_client_in_the_group_is_seen_not_a_shell_or_a_workers_own_process(tmp_path: Path) -> None:
    """The preload took a group with a scheduler and a client for a worker-only pod (issue 30 item 5): they are
    the other Python processes of the group; a worker's spawned process or a shell is not one."""
    tree = SimTree(tmp_path)
    tree.write("/proc/self/cgroup", OWN)
    _process(tree, 101, ["/usr/bin/python3", "/usr/bin/dask", "worker", "tcp://s:8786", "--nworkers", "2"], OWN)
    _process(tree, 102, SPAWNED, OWN)
    _process(tree, 103, ["/bin/sh", "-c", "exec tail -f /dev/null"], OWN)
    _process(tree, 104, ["python3", "client.py"], "12:memory:/pods/b\n0::/pods/b\n")  # another pod's
    assert group_dask(str(tmp_path)) == GroupDask((2,), 0)  # a worker-only pod
    _process(tree, 105, ["/usr/bin/python3", "/usr/bin/dask", "scheduler"], OWN)
    _process(tree, 106, ["python3.11", "client.py"], OWN)
    assert group_dask(str(tmp_path)) == GroupDask((2,), 2)
