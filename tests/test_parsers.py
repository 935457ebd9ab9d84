"""Every kernel-file parser: real formats, malformed input named clearly, and arbitrary bytes (hypothesis)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apsi_memory import CorruptFileError
from apsi_memory.adapters import cgroup, procfs, psi
from apsi_memory.adapters.cgroup import parse_limit
from apsi_memory.decide import effective_limit
from sim.tree import v1_unlimited

PARSERS: list[Callable[[str], object]] = [
    procfs.parse_meminfo, procfs.parse_self_cgroup, procfs.parse_mountinfo, procfs.parse_loadavg,
    procfs.parse_proc_status, procfs.parse_cpu_list, psi.parse_psi,
    lambda text: cgroup.parse_limit(text, "memory.max"), lambda text: cgroup.parse_memory_stat(text, "memory.stat"),
]


@pytest.mark.parametrize("parse", PARSERS)
@given(text=st.text() | st.binary().map(lambda b: b.decode("utf-8", "replace")))
def test_arbitrary_text_parses_or_raises_the_named_error(parse: Callable[[str], object], text: str) -> None:
    try:
        parse(text)
    except CorruptFileError as exc:
        assert exc.path and exc.problem


@given(st.text())
def test_limits_are_never_negative(text: str) -> None:
    try:
        value = effective_limit(parse_limit(text, "memory.limit_in_bytes"), physical=64 << 30)
    except CorruptFileError:
        return
    assert value is None or value >= 0


def test_meminfo_reads_bytes_and_falls_back_without_memavailable() -> None:
    info = procfs.parse_meminfo("MemTotal: 8000 kB\nMemFree: 1000 kB\nMemAvailable: 5000 kB\nSwapFree: 4 kB\n")
    assert (info.total, info.available, info.swap_free) == (8000 * 1024, 5000 * 1024, 4096)
    old_kernel = procfs.parse_meminfo("MemTotal: 8000 kB\nMemFree: 1000 kB\nBuffers: 100 kB\nCached: 2000 kB\n")
    assert old_kernel.available == 3100 * 1024


@pytest.mark.parametrize(("text", "problem"), [
    ("MemFree: 10 kB\n", "no MemTotal"),
    ("MemTotal: lots kB\n", "non-numeric value 'lots'"),
])
def test_malformed_meminfo_names_the_file_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(CorruptFileError, match=f"/proc/meminfo: .*{problem}"):
        procfs.parse_meminfo(text)


def test_self_cgroup_v1_v2_and_hybrid_lines() -> None:
    entries = procfs.parse_self_cgroup("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/user.slice\n")
    assert entries[0].controllers == ("memory",) and entries[0].path == "/docker/abc"
    assert entries[1].controllers == ("cpu", "cpuacct")
    assert entries[2].hierarchy == 0 and entries[2].controllers == ()
    with pytest.raises(CorruptFileError, match="not 'id:controllers:/path'"):
        procfs.parse_self_cgroup("memory:/docker\n")


def test_mountinfo_unescapes_paths_and_keeps_super_options() -> None:
    (mount,) = procfs.parse_mountinfo(
        r"35 31 0:32 /docker/x /sys/fs/cgroup/my\040memory rw,relatime shared:9 - cgroup cgroup rw,memory")
    assert mount.mount_point == "/sys/fs/cgroup/my memory" and mount.root == "/docker/x"
    assert mount.fstype == "cgroup" and "memory" in mount.super_options


def test_cpu_lists_count_like_nproc() -> None:
    assert procfs.parse_cpu_list("0-3,8,10-11") == 7
    with pytest.raises(CorruptFileError, match="runs backwards"):
        procfs.parse_cpu_list("5-2")


def test_psi_reads_avg10_of_some_and_full() -> None:
    reading = psi.parse_psi("some avg10=1.50 avg60=0.10 avg300=0.00 total=10\n"
                            "full avg10=0.25 avg60=0.00 avg300=0.00 total=5\n")
    assert (reading.some, reading.full) == (1.5, 0.25)
    assert psi.parse_psi("some avg10=3.00 avg60=0 avg300=0 total=0\n").full is None
    with pytest.raises(CorruptFileError, match="no 'some' line"):
        psi.parse_psi("")


@pytest.mark.parametrize("page_size", [4096, 16384, 65536])
def test_v1_unlimited_is_no_limit_whatever_the_page_size(page_size: int) -> None:
    raw = parse_limit(f"{v1_unlimited(page_size)}\n", "memory.limit_in_bytes")
    assert effective_limit(raw, physical=64 << 30) is None
    assert effective_limit(parse_limit("max\n", "memory.max"), physical=64 << 30) is None
    assert effective_limit(4 << 30, physical=64 << 30) == 4 << 30
    assert effective_limit(64 << 30, physical=64 << 30) is None  # at physical RAM: no real limit



def test_a_process_start_time_is_field_22_counted_after_the_command_name() -> None:
    fields = " ".join(str(n) for n in range(3, 53))  # fields 3..52; field 22 holds "22"
    assert procfs.parse_stat_start_time(f"4242 (a (weird) name) {fields}\n") == "22"
    assert procfs.parse_stat_start_time("4242 (cut) S 1 2") is None
    assert procfs.parse_stat_parent(f"4242 (a (weird) name) {fields}\n") == 4  # field 4, counted the same way
    assert procfs.parse_stat_parent("4242 (cut) S") is None
