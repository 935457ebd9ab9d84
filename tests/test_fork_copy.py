"""The fork rule (issue 26, item 2): a forked child sees its own copy-on-write copy of every SSD or moved array, as
NumPy's arrays in RAM behave; its writes and its ``free`` never reach the parent. The control is a raw
``np.memmap(mode="r+")``, whose child's writes do reach the parent: the harness can see a leak."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import json
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.adapters.maps import Region
from apsi_memory.arrays import forking, moving, placement, spill
from apsi_memory.decide import Level
from apsi_memory.errors import SystemCallError
from apsi_memory.system import uffd

MiB = 1 << 20
N = 2 * MiB // 8  # float64 elements: two MiB, over the 1 MiB below which arrays always stay in RAM
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and mmap are Linux's here"),
              # other tests' threads (pools' zeroing, watchers) may still run: these forks are the point
              pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
              pytest.mark.usefixtures("calm_host")]  # the real host's pressure must not decide what stays in RAM


def _spilled() -> np.ndarray:
    memory.budget(0)
    x = memory.array(N, "float64")
    assert memory.on_disk(x), "the test needs an SSD array"
    x[:] = 1.0
    return x


def _moved() -> np.ndarray:
    x = memory.array(N, "float64")
    assert not memory.on_disk(x), "the test needs a RAM array to move"
    x[:] = 1.0
    entry = placement._find(x)
    assert entry is not None and moving.move(entry, Level.HIGH) and memory.on_disk(x)
    return x


def _raw_memmap(tmp_path: Path) -> np.ndarray:
    x = np.memmap(tmp_path / "raw.npy", "float64", mode="w+", shape=(N,))
    x[:] = 1.0
    return x


MAKERS: dict[str, Callable[[], np.ndarray]] = {"spilled": _spilled, "moved": _moved}


Handoff = Callable[[], None]  # the child lets the parent run ``meanwhile`` and waits for it


def _in_child(action: Callable[[Handoff], list[float]], meanwhile: Callable[[], None] = lambda: None) -> list[float]:
    """Run ``action`` in a forked child; what it returned (the child's exit status must be 0). ``meanwhile`` runs in
    the parent when the child calls its handoff (or once it finished, if it never does)."""
    result_r, result_w = os.pipe()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def handoff() -> None:
        os.write(ready_w, b"r")
        os.read(go_r, 1)

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(result_w, json.dumps(action(handoff)).encode())
            code = 0
        except BaseException:  # noqa: BLE001 - shown in the output; the parent fails on the status
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in (result_w, ready_w, go_r):
        os.close(fd)
    os.read(ready_r, 1)  # b"" once the child exited without a handoff
    meanwhile()
    with contextlib.suppress(BrokenPipeError):  # the child finished without a handoff
        os.write(go_w, b"g")
    with os.fdopen(result_r, "rb") as pipe:
        said = pipe.read().decode()
    for fd in (ready_r, go_w):
        os.close(fd)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the child failed"
    return [float(v) for v in json.loads(said)]


def _write_ten(x: np.ndarray) -> Callable[[Handoff], list[float]]:
    def child(_: Handoff) -> list[float]:
        before = float(x[0])
        x[0] = 10.0
        return [before, float(x[0]), float(x[-1])]
    return child


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_childs_write_stays_in_the_child_and_it_read_the_parents_data(kind: str, spill_dir: Path) -> None:
    x = MAKERS[kind]()
    seen = _in_child(_write_ten(x))
    print(f"{kind}: the child read {seen[0]}, wrote {seen[1]}; the parent reads {float(x[0])}")
    assert seen == [1.0, 10.0, 1.0], "the child must start from the parent's data (copy-on-write, not zeros)"
    assert float(x[0]) == 1.0, "the child's write reached the parent"
    assert np.all(x == 1.0)


def test_control_a_raw_shared_memmap_passes_the_childs_write_to_the_parent(tmp_path: Path) -> None:
    x = _raw_memmap(tmp_path)
    assert _in_child(_write_ten(x)) == [1.0, 10.0, 1.0]
    assert float(x[0]) == 10.0, "the harness must see a child's write reach the parent of a MAP_SHARED file"


_POOL_ARRAY: list[np.ndarray] = []  # the array the pool's workers inherit (fork), as a DataLoader's do


def _scale_slice(i: int) -> float:
    x = _POOL_ARRAY[0]
    part = x[i * (N // 4):(i + 1) * (N // 4)]
    part *= 10.0  # in place, in the worker
    return float(part[0])


@pytest.mark.faults
@pytest.mark.parametrize("kind", [*sorted(MAKERS), "raw memmap (control)"])
def test_a_fork_pool_scaling_slices_in_place_leaves_the_parent_unchanged(kind: str, spill_dir: Path,
                                                                         tmp_path: Path) -> None:
    x = MAKERS[kind]() if kind in MAKERS else _raw_memmap(tmp_path)
    _POOL_ARRAY[:] = [x]
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map_async(_scale_slice, range(4)).get(timeout=30)
    finally:
        _POOL_ARRAY.clear()
    changed = int(np.count_nonzero(x != 1.0))
    print(f"{kind}: workers read {results}; {changed} of {N} elements changed in the parent")
    assert results == [10.0] * 4
    if kind in MAKERS:
        assert changed == 0 and float(x[0]) == 1.0
    else:
        assert changed == N and float(x[0]) == 10.0, "the control must show the workers' writes in the parent"


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_childs_free_leaves_the_parents_file_and_data(kind: str, spill_dir: Path) -> None:
    x = MAKERS[kind]()
    entry = placement._find(x)
    assert entry is not None and entry.path is not None
    before = memory.report()

    def child(_: Handoff) -> list[float]:
        x[0] = 10.0
        memory.free(x)
        return [float(placement.is_freed(x))]

    assert _in_child(child) == [1.0]
    assert os.path.exists(entry.path), "the child's free deleted the parent's file"
    assert np.all(x == 1.0) and memory.report() == before and not placement.is_freed(x)
    x[1] = 2.0  # the parent's array is still its own, writable
    assert float(x[1]) == 2.0


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_parents_later_writes_never_reach_a_page_the_child_wrote(kind: str, spill_dir: Path) -> None:
    x = MAKERS[kind]()

    def child(handoff: Handoff) -> list[float]:
        x[0] = 10.0
        handoff()  # the parent writes now
        return [float(x[0]), float(x[-1])]

    def parent_writes() -> None:
        x[0], x[-1] = 5.0, 7.0

    seen = _in_child(child, parent_writes)
    print(f"{kind}: after the parent wrote, the child reads x[0]={seen[0]} (its own page), x[-1]={seen[1]}")
    assert seen[0] == 10.0, "the parent's write reached a page the child had written"
    assert float(x[0]) == 5.0 and float(x[-1]) == 7.0


@pytest.mark.faults
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_where_no_private_copy_can_be_made_a_childs_write_crashes_it_instead_of_reaching_the_parent(
        kind: str, spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = MAKERS[kind]()

    def refused(address: int, length: int, *_: object) -> None:
        raise SystemCallError(errno.ENOMEM, f"could not map {length} bytes at {address:#x}: refused (injected)")

    monkeypatch.setattr(uffd, "map_private", refused)
    pid = os.fork()
    if pid == 0:
        try:
            faulthandler.disable()  # the crash is expected: no stack dump in the output
            x[0] = 10.0 if float(x[1]) == 1.0 else 3.0  # reads the parent's data, then writes: SIGSEGV
        finally:
            os._exit(0)
    status = os.waitpid(pid, 0)[1]
    print(f"{kind}: the child ended with {status:#x}; the parent reads {float(x[0])}")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    assert float(x[0]) == 1.0


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_parents_free_keeps_the_pages_the_child_wrote_and_zeros_the_rest(kind: str, spill_dir: Path) -> None:
    x = MAKERS[kind]()
    entry = placement._find(x)
    assert entry is not None and entry.path is not None
    path = entry.path

    def child(handoff: Handoff) -> list[float]:
        x[0] = 10.0
        handoff()  # the parent frees now
        return [float(x[0]), float(x[-1])]

    seen = _in_child(child, lambda: memory.free(x))
    print(f"{kind}: after the parent's free the child reads x[0]={seen[0]} (its own page), x[-1]={seen[1]}")
    assert seen == [10.0, 0.0]
    assert not os.path.exists(path) and placement.is_freed(x)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_view_of_a_freed_array_is_the_childs_own_copy_too(kind: str, spill_dir: Path) -> None:
    x = MAKERS[kind]()
    view = x[:]
    memory.free(x)  # the file is deleted; the view (made before) is still a writable shared mapping of it
    view[:] = 1.0
    pid = os.fork()
    if pid == 0:
        try:
            faulthandler.disable()  # where the deleted file cannot be opened again the write crashes the child
            view[0] = 10.0
        finally:
            os._exit(0)
    status = os.waitpid(pid, 0)[1]
    how = "copied" if os.WIFEXITED(status) else f"read-only (signal {os.WTERMSIG(status)})"
    print(f"{kind}: a child's copy of a freed array's view: {how}; the parent reads {float(view[0])}")
    assert float(view[0]) == 1.0, "the child's write reached the parent's view"
    assert os.WIFEXITED(status) or os.WTERMSIG(status) == signal.SIGSEGV


def test_shared_mappings_lists_shared_files_with_inode_and_the_kernels_path() -> None:
    maps = ("7f0000000000-7f0000200000 rw-s 00001000 fd:01 1234   /spill/a b/apsi-1-2-ab.npy (deleted)\n"
            "7f0000200000-7f0000300000 rw-p 00000000 fd:01 99   /spill/private.npy\n"
            "7f0000300000-7f0000400000 rw-s 00000000 00:01 5   /dev/zero (deleted)\n"
            "7f0000400000-7f0000500000 r--s 00002000 fd:01 77   /data/x.npy\n"
            "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [stack]\n")
    assert list(forking.shared_mappings(maps)) == [
        Region(0x7F0000000000, 0x7F0000200000, True, True, 0x1000, "/spill/a b/apsi-1-2-ab.npy (deleted)", 1234),
        Region(0x7F0000300000, 0x7F0000400000, True, True, 0, "/dev/zero (deleted)", 5),
        Region(0x7F0000400000, 0x7F0000500000, True, False, 0x2000, "/data/x.npy", 77)]
    assert spill.is_spill_file("/spill/a b/apsi-1-2-ab.npy") and not spill.is_spill_file("/data/x.npy")
