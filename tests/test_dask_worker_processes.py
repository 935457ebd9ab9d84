"""Issue 22 item 4: the ``dask worker`` processes of this cgroup, read from a sim ``/proc`` (no dask needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apsi_memory.adapters.dask_workers import dask_workers_in_group, parse_nworkers
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
    assert sorted(dask_workers_in_group(str(tmp_path))) == [1, 2]
    assert dask_workers_in_group(str(tmp_path / "nothing")) == []
