"""One reading keeps its kernel files open and re-reads them with ``pread`` (issue 14, item 5). What must still
hold: a file replaced or deleted under the root is seen, a process moved to another group is read there at once,
a forked child reads its own ``/proc/self``, descriptors do not pile up and go with their machine, and an
allocation takes one reading for the level and the budget together."""

from __future__ import annotations

import gc
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
import sim
from apsi_memory import CorruptFileError, Machine
from apsi_memory.adapters.cgroup import V1, V2, parse_memory_stat, parse_stat_fields
from apsi_memory.decide import Level
from sim import tree as machines
from sim.pressure import PressureMachine
from sim.tree import GiB, MiB, SimTree
from tests.realcg import child_group


def replace(tree: SimTree, path: str, text: str) -> None:
    """Write ``path`` the way an atomic writer does: a new file (a new inode) renamed over the old one."""
    target = tree.root / path.lstrip("/")
    fresh = target.with_name(target.name + ".new")
    fresh.write_text(text)
    os.replace(fresh, target)


def test_a_file_replaced_after_a_reading_is_read_anew(tmp_path: Path) -> None:
    tree = machines.docker_v1(tmp_path, limit=4 * GiB)
    m = sim.machine(tree)
    assert m.limits().usable_bytes == 4 * GiB
    replace(tree, "/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{2 * GiB}\n")
    assert m.limits().usable_bytes == 2 * GiB
    tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{3 * GiB}\n")  # rewritten in place
    assert m.limits().usable_bytes == 3 * GiB


def test_files_deleted_after_a_reading_fall_back_as_if_never_there(tmp_path: Path) -> None:
    tree = machines.docker_v1(tmp_path, limit=4 * GiB)
    m = sim.machine(tree)
    assert m.limits().source == "container (cgroup v1)"
    os.remove(tree.root / "proc/self/cgroup")
    os.remove(tree.root / "proc/self/mountinfo")
    assert m.limits().source == "host"
    tree.psi_disabled()  # the file becomes one that fails to read
    assert m.pressure().some is None


def test_a_process_moved_to_another_group_is_read_there_on_the_next_reading(tmp_path: Path) -> None:
    tree = SimTree(tmp_path).meminfo(total=64 * GiB, available=60 * GiB).psi()
    tree.mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/small")
    tree.v2_group("/sys/fs/cgroup/small", limit=1 * GiB).v2_group("/sys/fs/cgroup/big", limit=8 * GiB)
    m = sim.machine(tree)
    assert m.limits().cgroup == "/small" and m.limits().usable_bytes == 1 * GiB
    tree.write("/proc/self/cgroup", "0::/big\n")  # what the kernel shows after a write to big/cgroup.procs
    assert m.limits().cgroup == "/big" and m.limits().usable_bytes == 8 * GiB


def test_mounts_changed_after_a_reading_are_read_anew(tmp_path: Path) -> None:
    tree = machines.docker_v1(tmp_path, limit=4 * GiB)
    m = sim.machine(tree)
    assert m.limits().usable_bytes == 4 * GiB
    tree.mount("/mnt/deeper", "cgroup", "memory", root="/docker/3f2a9c0e7b1d")  # same root, listed later
    tree.v1_group("/mnt/deeper", limit=1 * GiB)
    mountinfo = tree.root / "proc/self/mountinfo"
    lines = mountinfo.read_text().splitlines()
    replace(tree, "/proc/self/mountinfo", "\n".join(line for line in lines if "/sys/fs/cgroup/memory " not in line))
    assert m.limits().usable_bytes == 1 * GiB and m.limits().limit_file == "/mnt/deeper/memory.limit_in_bytes"


def test_a_corrupt_file_read_through_an_open_descriptor_is_still_named(tmp_path: Path) -> None:
    tree = machines.docker_v1(tmp_path)
    m = sim.machine(tree)
    m.limits()
    tree.write("/sys/fs/cgroup/memory/memory.stat", "cache\n")
    with pytest.raises(CorruptFileError, match="/sys/fs/cgroup/memory/memory.stat: line 'cache' is not"):
        m.limits()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_readings_reuse_their_descriptors_and_a_dropped_machine_closes_them(tmp_path: Path) -> None:
    tree = machines.kubernetes_v2(tmp_path)
    gc.collect()
    before = open_descriptors()
    m = sim.machine(tree)
    m.limits()
    kept = open_descriptors() - before
    assert kept > 0  # meminfo, the group's files at each level, PSI: open for the next reading
    for _ in range(20):
        m.limits()
        m.pressure()
    assert open_descriptors() - before == kept
    del m  # no gc.collect(): a machine is not in a reference cycle, its files close as it goes
    assert open_descriptors() == before


def test_read_memory_alone_leaves_nothing_open(tmp_path: Path) -> None:
    from apsi_memory.machinery.reading import read_memory

    tree = machines.kubernetes_v2(tmp_path, limit=4 * GiB)
    before = open_descriptors()
    assert read_memory(str(tree.root)).usable == 4 * GiB
    assert open_descriptors() == before


def test_readings_from_several_threads_while_files_are_replaced_read_one_value_or_the_other(tmp_path: Path) -> None:
    """4 threads × 150 readings while a fifth replaces the limit file 300 times, alternating 1 and 2 GiB: every
    reading sees 1 or 2 GiB, none fails or reads another file's number through a descriptor closed under it."""
    tree = machines.kubernetes_v2(tmp_path, limit=1 * GiB, current=0, inactive_file=0)
    limit_file = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/" \
                 "cri-containerd-abcdef.scope/memory.max"
    m = sim.machine(tree)

    def read() -> set[int]:
        return {m.limits().usable_bytes for _ in range(150)}

    with ThreadPoolExecutor(4) as pool:
        readers = [pool.submit(read) for _ in range(4)]
        for i in range(300):
            replace(tree, limit_file, f"{(1 + i % 2) * GiB}\n")
        seen = set().union(*(reader.result() for reader in readers))  # a reader's error is raised here
    assert seen and seen <= {1 * GiB, 2 * GiB}


def test_an_allocation_takes_one_reading_for_the_level_and_the_budget(pressure_machine: PressureMachine,
                                                                      spill_dir: Path) -> None:
    m = pressure_machine.machine
    calls = []
    real_read = m.reader.read

    def counted() -> memory.measure.MemoryReading:
        calls.append(1)
        return real_read()

    m.reader.read = counted  # type: ignore[method-assign]
    pressure_machine.at(Level.HIGH)
    pressure_machine.next_measurement()
    assert memory.on_disk(memory.array(2 * MiB, "uint8"))  # the level was due: measured, and it is high
    assert len(calls) == 1 and m.tracker.level is Level.HIGH
    memory.array(2 * MiB, "uint8")  # not due: the level is the last one, the budget is read now
    assert len(calls) == 2


@pytest.mark.real
def test_a_forked_child_reads_its_own_group_not_its_parents() -> None:
    """1 fork: the parent's machine has its files open; the child joins a new memory group and reads through
    the same machine. It must read its own /proc/self/cgroup (the parent's open one would show the parent's)."""
    with child_group(512 * MiB, prefix=f"apsi-i14mem-{os.getpid()}") as group:
        m = Machine()
        parent = m.limits()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: join the group, read, say what it read, and leave at once
            try:
                with open(os.path.join(group.path, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                child = m.limits()
                os.write(write_end, f"{child.cgroup} {child.usable_bytes}".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        said = os.read(read_end, 4096).decode()
        os.close(read_end)
        os.waitpid(pid, 0)
        cgroup, usable = said.split()
        assert cgroup == parent.cgroup.rstrip("/") + "/" + os.path.basename(group.path)  # type: ignore[union-attr]
        assert int(usable) == 512 * MiB
        assert m.limits().cgroup == parent.cgroup  # the parent still reads its own


@given(st.text(alphabet=st.sampled_from(list("ab_ 0123456789\n\t-")), max_size=60)
       .map(lambda text: text.replace("a", "inactive_file").replace("b", "total_inactive_file")))
def test_the_fields_a_reading_takes_from_memory_stat_are_what_the_whole_parse_gives(text: str) -> None:
    for names in (V1.stat_fields, V2.stat_fields):
        try:
            whole = parse_memory_stat(text, "memory.stat")
        except CorruptFileError:
            continue  # a file the whole parse refuses: the fields either raise or are read, both are fine
        assert parse_stat_fields(text, "memory.stat", names) == {name: whole[name] for name in names if name in whole}


@pytest.mark.real
def test_mountinfo_is_read_again_only_after_the_kernel_says_the_mounts_changed(tmp_path: Path) -> None:
    """1 tmpfs mounted and unmounted: until then the open /proc/self/mountinfo gives no POLLPRI and the last text
    stands; after the mount the text is read anew and shows it."""
    import subprocess

    from apsi_memory.adapters.files import KernelFiles

    if os.geteuid() != 0 or not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("needs root (to mount a tmpfs) and /proc/self/mountinfo")
    files = KernelFiles("/")
    try:
        first = files.read("/proc/self/mountinfo")
        assert first is not None
        assert files.read_if_changed("/proc/self/mountinfo", "as before") == "as before"  # not read again
        point = tmp_path / f"i14mem-{os.getpid()}"
        point.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=False).returncode:
            pytest.skip("cannot mount a tmpfs here")
        try:
            text = files.read_if_changed("/proc/self/mountinfo", "as before")
            assert text is not None and str(point) in text
            assert files.read_if_changed("/proc/self/mountinfo", "as before") == "as before"  # told once per change
        finally:
            subprocess.run(["umount", str(point)], check=True)
    finally:
        files.close()
