"""A reading reads only what can bind (issue 29 item 2): a parent with no limit of its own, where none comes from
above the levels seen, adds nothing to ``combine_levels``' sums, so its ``memory.stat`` and usage are not read;
every other tree reads as it did. And the kernel's PSI and meminfo layouts are read by their fast paths with the
same results as the general ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from apsi_memory.adapters import psi
from apsi_memory.adapters.cgroup import read_cgroup_memory, read_layout
from apsi_memory.adapters.files import KernelFiles
from apsi_memory.adapters.procfs import parse_meminfo
from apsi_memory.adapters.psi import _as_the_kernel_writes, _by_lines
from apsi_memory.decide import GroupLevel, combine_levels
from apsi_memory.errors import CorruptFileError
from sim.tree import GiB, MiB, SimTree, v1_unlimited

PHYSICAL = 16 * GiB
LEVELS = ("", "/batch", "/batch/step")  # the mount's top, a parent, the group


class CountedFiles(KernelFiles):
    """The real reader's files, each path read counted."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.paths: list[str] = []

    def read(self, path: str) -> str | None:
        self.paths.append(path)
        return super().read(path)


Level = tuple[int | None, int, int]  # own limit (None: none), usage, inactive_file


def tree_of(root: Path, version: int, levels: list[Level]) -> SimTree:
    """``levels`` from the top down: v1 with each level's ``hierarchical_memory_limit`` as the kernel makes it."""
    tree = SimTree(root).meminfo(total=PHYSICAL, available=12 * GiB).psi()
    top = "/sys/fs/cgroup/memory" if version == 1 else "/sys/fs/cgroup"
    tree.mount(top, "cgroup", "memory") if version == 1 else tree.mount(top, "cgroup2", "nsdelegate")
    tree.member(f"4:memory:{LEVELS[-1]}" if version == 1 else f"0::{LEVELS[-1]}")
    inherited = v1_unlimited()
    for name, (limit, usage, inactive) in zip(LEVELS, levels):
        if version == 1:
            inherited = min(inherited, v1_unlimited() if limit is None else limit)
            tree.v1_group(top + name, limit, usage, inactive, hierarchical_limit=inherited)
        else:
            tree.v2_group(top + name, limit, current=usage, inactive_file=inactive)
    return tree


def expected(version: int, levels: list[Level]) -> tuple[int | None, int | None, int]:
    """Limit, free and working set from every number of every level, from the group up."""
    up = list(reversed(levels))
    inherited = [min((limit for limit, _, _ in up[at:] if limit is not None), default=None) for at in range(len(up))]
    read = [GroupLevel(((limit, "limit"),) + (((hier, "stat"),) if version == 1 else ()), usage, inactive)
            for (limit, usage, inactive), hier in zip(up, inherited)]
    group = combine_levels(read, PHYSICAL)
    assert group is not None
    return group.limit, group.free, group.working_set


def read_tree(root: Path) -> tuple[CountedFiles, tuple[int | None, int | None, int]]:
    files = CountedFiles(str(root))
    group = read_cgroup_memory(PHYSICAL, files, read_layout(files))
    assert group is not None and not isinstance(group, str)
    return files, (group.limit, group.free, group.working_set)


def stat_reads(files: CountedFiles) -> list[str]:
    return [path for path in files.paths if path.endswith(("memory.stat", "usage_in_bytes", "memory.current"))]


def test_unlimited_parents_are_not_read_for_usage_or_page_cache(tmp_path: Path) -> None:
    tree_of(tmp_path, 1, [(None, 9 * GiB, 0), (None, 3 * GiB, 0), (None, 1 * GiB, 256 * MiB)])
    files, _ = read_tree(tmp_path)
    assert stat_reads(files) == ["/sys/fs/cgroup/memory/batch/step/memory.stat",
                                 "/sys/fs/cgroup/memory/batch/step/memory.usage_in_bytes"]
    assert "/sys/fs/cgroup/memory/memory.limit_in_bytes" in files.paths  # a parent's limit is still read each time


def test_a_parent_with_a_limit_is_read_whole_and_binds(tmp_path: Path) -> None:
    levels: list[Level] = [(None, 9 * GiB, 0), (2 * GiB, 1536 * MiB, 0), (None, 256 * MiB, 0)]
    tree_of(tmp_path, 1, levels)
    files, found = read_tree(tmp_path)
    assert len(stat_reads(files)) == 6  # the group's limit comes from above: every level is read
    assert found[:2] == (2 * GiB, 512 * MiB)  # the parent's headroom, where its other children use 1.25 GiB


def test_a_group_without_memory_files_takes_the_nearest_parents_usage_though_that_parent_has_no_limit(
        tmp_path: Path) -> None:
    tree_of(tmp_path, 2, [(4 * GiB, 3 * GiB, 0), (None, 1 * GiB, 0), (None, 0, 0)])
    for name in ("memory.max", "memory.high", "memory.current", "memory.stat"):  # memory not handed down to it
        (tmp_path / f"sys/fs/cgroup/batch/step/{name}").unlink()
    assert read_tree(tmp_path)[1] == (4 * GiB, 1 * GiB, 1 * GiB)  # the parent's working set, the top's headroom


LIMITS = st.none() | st.integers(1, 20).map(lambda n: n * 256 * MiB)
LEVEL = st.tuples(LIMITS, st.integers(0, 24).map(lambda n: n * 128 * MiB), st.integers(0, 4).map(lambda n: n * 64 * MiB))


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from([1, 2]), levels=st.lists(LEVEL, min_size=3, max_size=3))
def test_a_reading_that_skips_parents_finds_what_reading_every_level_finds(version: int, levels: list[Level]) -> None:
    with tempfile.TemporaryDirectory() as root:
        tree_of(Path(root), version, levels)
        assert read_tree(Path(root))[1] == expected(version, levels)


AVG10 = st.sampled_from(["1.5", "", "x", "nan", "\t1.5", "1.5\t", " 1.5", "2 "]).map(lambda v: "avg10=" + v)
WORDS = st.sampled_from(["avg60=0.1", "total=9", "avg10=2", "xavg10=3", "\x0bfull avg10=3", "\r", "\t", "some"])
LINE = st.tuples(st.sampled_from(["some", "full", "other", ""]), AVG10, st.lists(WORDS, max_size=3)).map(
    lambda parts: " ".join([parts[0], parts[1], *parts[2]]))
PSI_TEXT = st.lists(LINE, min_size=1, max_size=3).map("\n".join) | st.text(max_size=60)


@settings(max_examples=500)
@given(text=PSI_TEXT.map(lambda t: t + "\n") | PSI_TEXT)
@example("some avg10=1.5 avg10=2\n")  # the last avg10 of a line wins
@example("some avg10=\t1.5 total=1\n")  # float() would take the tab, the words do not
@example("some avg10=1.5 total=1\x0bfull avg10=2 total=1\n")  # a line break that is not "\n"
def test_psi_in_the_kernels_layout_reads_as_every_line_split_does(text: str) -> None:
    fast = _as_the_kernel_writes(text)
    if fast is not None:
        assert repr(fast) == repr(_by_lines(text, "memory.pressure"))


def test_psi_as_the_kernel_writes_it_is_read_without_splitting_its_words(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = "some avg10=0.06 avg60=0.59 avg300=0.38 total=9321\nfull avg10=0.05 avg60=0.52 avg300=0.30 total=7\n"
    monkeypatch.setattr(psi, "_by_lines", None)  # called, it raises
    assert psi.parse_psi(kernel)[:2] == (0.06, 0.05)
    assert psi.parse_psi(kernel.split("\n")[0] + "\n")[:2] == (0.06, None)


def test_meminfo_reads_the_estimate_only_without_memavailable() -> None:
    fields = "MemTotal: 8000 kB\nMemFree: lots kB\nMemAvailable: 5000 kB\n"
    assert parse_meminfo(fields).available == 5000 * 1024  # a field not used is not parsed, so not an error
    with pytest.raises(CorruptFileError, match="'MemFree' has a non-numeric value 'lots'"):
        parse_meminfo(fields.replace("MemAvailable: 5000 kB\n", ""))
