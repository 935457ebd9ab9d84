"""Spill files: where, how they are named, when they go, and a full disk."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from apsi_memory.adapters import processes
from apsi_memory.arrays import spill
from apsi_memory.errors import DiskFullError
from apsi_memory.units import MiB

FLOAT64 = np.dtype("float64")


def run_python(code: str, spill_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "APSI_SPILL_DIR": str(spill_dir), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=60, check=False)


def dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    return int(finished.stdout)


def test_names_carry_the_owner_and_nothing_else_is_taken_for_ours():
    name = spill.file_name(4242, "98765", "ab12cd")
    assert spill.owner_of(name) == (4242, "98765")
    for foreign in ("data.npy", "apsi-12-x-ab.npy", "apsi-12-34-ab.npy.bak", "my-apsi-12-34-ab.npy"):
        assert spill.owner_of(foreign) is None


def test_the_folder_is_made_private_and_the_file_is_ours_alone(spill_dir):
    x = spill.create((4, 4), FLOAT64)
    assert stat.S_IMODE(os.stat(spill_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(x.filename).st_mode) == 0o600
    assert spill.owner_of(os.path.basename(x.filename)) == (os.getpid(), processes.process_start(os.getpid()))


def test_a_full_disk_is_a_clear_error_that_leaves_no_file_and_keeps_the_others(spill_dir):
    kept = spill.create((8,), FLOAT64)
    kept[:] = 2.0
    with pytest.raises(DiskFullError) as caught:
        spill.create((MiB,), FLOAT64, free_bytes=lambda _: 5 * MiB)  # 8 MiB asked, 5 MiB free
    message = str(caught.value)
    assert f"no room for a 8.0 MB spill file in {spill_dir}: 5.0 MB free there" in message
    assert isinstance(caught.value, OSError)
    assert os.listdir(spill_dir) == [os.path.basename(kept.filename)] and kept.sum() == 16.0


def test_files_of_dead_owners_are_reclaimed_and_only_those(spill_dir, tmp_path):
    os.makedirs(spill_dir)
    dead = dead_pid()
    me, my_start = os.getpid(), processes.process_start(os.getpid())
    names = {
        "dead": spill.file_name(dead, "1", "aa"),
        "recycled pid": spill.file_name(me, "1" + str(my_start), "bb"),  # our pid, another process's start
        "alive": spill.file_name(me, str(my_start), "cc"),
        "not ours": "results.npy",
    }
    for name in names.values():
        open(os.path.join(spill_dir, name), "w").close()
    removed = spill.reclaim(spill_dir)
    assert sorted(os.path.basename(p) for p in removed) == sorted([names["dead"], names["recycled pid"]])
    assert sorted(os.listdir(spill_dir)) == sorted([names["alive"], names["not ours"]])


def test_a_sigkilled_process_leaves_its_file_and_the_next_process_to_spill_reclaims_it(spill_dir):
    killed = run_python("""
        import os, signal, apsi_memory as memory
        x = memory.array((2, 1 << 20))
        x[:] = 1
        print(x.filename, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, spill_dir, APSI_RAM_BUDGET="0")
    assert killed.returncode == -signal.SIGKILL
    left = killed.stdout.strip()
    assert os.path.exists(left)
    imported = run_python("import apsi_memory", spill_dir)
    assert imported.returncode == 0, imported.stderr
    assert os.path.exists(left), "importing the library must not delete files (reclaiming waits for a spill)"
    nxt = run_python("import apsi_memory as memory; memory.array((2, 1 << 20))", spill_dir, APSI_RAM_BUDGET="0")
    assert nxt.returncode == 0, nxt.stderr
    assert not os.path.exists(left)


def test_files_are_deleted_at_exit_even_while_their_arrays_live(spill_dir):
    done = run_python("""
        import apsi_memory as memory
        keep = [memory.array((2, 1 << 20)) for _ in range(2)]
        view = keep[0][1:]
        cycle = [memory.array((1 << 20,))]
        cycle.append(cycle)  # collected (or not) during shutdown, after the files are gone
        print(*(x.filename for x in keep))
    """, spill_dir, APSI_RAM_BUDGET="0")
    assert done.returncode == 0 and done.stderr == "", done.stderr  # no "Exception ignored" at shutdown either
    paths = done.stdout.split()
    assert len(paths) == 2 and not any(os.path.exists(p) for p in paths)
    assert os.listdir(spill_dir) == []


def test_release_frees_the_blocks_while_views_stay_valid(spill_dir):
    x = spill.create((4, MiB // 8), FLOAT64)
    x[:] = 3.0
    view = x[2:]
    handle = os.open(x.filename, os.O_RDONLY)  # keeps the inode to look at after the unlink
    try:
        spill.release(x.filename)
        assert os.listdir(spill_dir) == []
        assert os.fstat(handle).st_blocks * 512 <= os.fstatvfs(handle).f_bsize  # at most the last, partial one
    finally:
        os.close(handle)
    assert float(view.sum()) == 0.0


def test_a_forked_child_never_deletes_or_truncates_its_parents_files(spill_dir):
    import apsi_memory as memory

    x = spill.create((2, MiB // 8), FLOAT64)
    x[:] = 5.0
    arrays_before = memory.report()
    child = os.fork()
    if child == 0:  # the child inherits x, its finalizer and the at-exit list: all must leave the file alone
        try:
            spill.release(x.filename)
            spill._delete_all_at_exit()
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert status == 0
    assert os.listdir(spill_dir) == [os.path.basename(x.filename)]
    assert os.path.getsize(x.filename) > 2 * MiB and float(x.sum()) == 5.0 * 2 * (MiB // 8)
    assert memory.report() == arrays_before


def test_other_users_files_are_never_reclaimed(spill_dir):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.makedirs(spill_dir)
    theirs = os.path.join(spill_dir, spill.file_name(dead_pid(), "1", "dd"))
    open(theirs, "w").close()
    os.chown(theirs, 12345, 12345)
    assert spill.reclaim(spill_dir) == [] and os.path.exists(theirs)


def test_a_file_named_without_a_start_time_is_kept_while_its_pid_lives(spill_dir):
    """Where no ``/proc`` was seen (macOS, a fake machine's root) a file is named with start "0": only its pid can
    be checked, so a live pid keeps it (test first failed: the file was reclaimed as a dead owner's)."""
    os.makedirs(spill_dir)
    mine = os.path.join(spill_dir, spill.file_name(os.getpid(), "0", "dd"))
    theirs = os.path.join(spill_dir, spill.file_name(dead_pid(), "0", "ee"))
    open(mine, "w").close()
    open(theirs, "w").close()
    assert spill.reclaim(spill_dir) == [theirs] and os.path.exists(mine)


def test_owners_are_read_through_the_adapters_root(spill_dir, tmp_path, monkeypatch):
    """A fake machine's tree (``APSI_FS_ROOT``) shows no processes: the pid alone decides, and this process names
    its files "0"."""
    import sim.tree

    monkeypatch.setenv("APSI_FS_ROOT", str(sim.tree.docker_v1(tmp_path / "root")))
    assert processes.process_start(os.getpid()) == "0" and processes.process_start(dead_pid()) is None
    x = spill.create((4,), FLOAT64)
    assert spill.owner_of(os.path.basename(x.filename)) == (os.getpid(), "0")
