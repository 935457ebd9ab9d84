"""Files captured on a real machine (fixtures/real-v1-host) parse, and rebuild that machine's view."""

from __future__ import annotations

import shutil
from pathlib import Path

from apsi_memory.adapters import cgroup, procfs, psi
from apsi_memory.machinery.reading import read_memory

REAL = Path(__file__).parent.parent / "fixtures" / "real-v1-host"


def text(name: str) -> str:
    return (REAL / name).read_text()


def test_captured_proc_files_parse() -> None:
    info = procfs.parse_meminfo(text("meminfo"))
    assert 0 < info.available <= info.total
    entries = procfs.parse_self_cgroup(text("self_cgroup"))
    assert any("memory" in e.controllers for e in entries) and any(e.hierarchy == 0 for e in entries)
    mounts = procfs.parse_mountinfo(text("mountinfo"))
    assert {m.fstype for m in mounts} >= {"cgroup", "cgroup2", "proc"}
    status = procfs.parse_proc_status(text("self_status"))
    assert status.rss and status.cpus
    assert procfs.parse_loadavg(text("loadavg")) >= 0
    assert psi.parse_psi(text("pressure_memory")).full is not None


def test_captured_cgroup_files_parse() -> None:
    stats = cgroup.parse_memory_stat(text("memory.stat"), "memory.stat")
    assert {"total_inactive_file", "hierarchical_memory_limit"} <= stats.keys()
    assert cgroup.parse_limit(text("memory.limit_in_bytes"), "memory.limit_in_bytes") == 0x7FFFFFFFFFFFF000


def test_the_captured_machine_rebuilt_under_a_root(tmp_path: Path) -> None:
    entries = procfs.parse_self_cgroup(text("self_cgroup"))
    group = next(e.path for e in entries if "memory" in e.controllers)
    proc, directory = tmp_path / "proc", tmp_path / "sys/fs/cgroup/memory" / group.lstrip("/")
    (proc / "self").mkdir(parents=True)
    (proc / "pressure").mkdir()
    directory.mkdir(parents=True)
    shutil.copy(REAL / "meminfo", proc / "meminfo")
    shutil.copy(REAL / "mountinfo", proc / "self/mountinfo")
    shutil.copy(REAL / "self_cgroup", proc / "self/cgroup")
    shutil.copy(REAL / "pressure_memory", proc / "pressure/memory")
    for name in ("memory.stat", "memory.limit_in_bytes", "memory.usage_in_bytes"):
        shutil.copy(REAL / name, directory / name)
    reading = read_memory(str(tmp_path))
    assert reading.cgroup is not None and reading.cgroup.version == 1 and reading.cgroup.path == group
    assert reading.source == "host"  # that group has no limit: the captured value is v1's "unlimited"
    assert reading.usable == procfs.parse_meminfo(text("meminfo")).total
    assert reading.psi is not None and reading.psi.source == "/proc/pressure/memory"
