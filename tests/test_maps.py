"""``/proc/self/maps`` (``apsi_memory.adapters.maps``): the pure line parser and region finder on captured text,
a property that any line the kernel could write parses back, and the reader under the injectable root."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apsi_memory.adapters.maps import Region, file_region, parse_maps_line, region_in_maps
from apsi_memory.blocks.pages import row_extent

MAPS = """\
55d0c8a00000-55d0c8a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 r--s 00000000 fd:01 1234                       /data/my features.npy
7f0000400000-7f0000800000 r--s 00400000 fd:01 1234                       /data/my features.npy
7f0000800000-7f0000900000 rw-s 00000000 00:01 77                         /dev/zero (deleted)
7f0000900000-7f0000a00000 rw-s 00000000 fd:01 99                         /spill/apsi-1.npy (deleted)
7f0000a00000-7f0000b00000 rw-p 00000000 00:00 0
7f0000b00000-7f0000c00000 r--p 00001000 fd:01 55                         /data/private.npy
"""


def test_parse_maps_line_reads_sharing_offset_and_paths_with_spaces() -> None:
    regions = [parse_maps_line(line) for line in MAPS.splitlines()]
    heap, features, features_2, zero, spill, anonymous, private = [r for r in regions if r is not None]
    assert (features.start, features.end, features.shared, features.writable) == (0x7F0000000000, 0x7F0000400000,
                                                                                    True, False)
    assert features.path == "/data/my features.npy" and features.is_file
    assert features_2.file_offset == 0x400000
    assert anonymous.path == "" and not anonymous.is_file and not heap.is_file
    assert not zero.is_file  # shared anonymous memory is RAM, not a file on a disk
    assert spill.is_file and spill.writable
    assert not private.shared
    assert parse_maps_line("") is None


def test_region_in_maps_joins_a_mapping_the_kernel_split() -> None:
    region = region_in_maps(MAPS, 0x7F0000100000, 0x7F0000700000)
    assert region is not None
    assert (region.start, region.end, region.file_offset) == (0x7F0000000000, 0x7F0000800000, 0)
    assert region_in_maps(MAPS, 0x7F0000100000, 0x7F0000200000) == parse_maps_line(MAPS.splitlines()[1])


def test_region_in_maps_finds_the_last_mapping() -> None:
    region = region_in_maps(MAPS, 0x7F0000B00000, 0x7F0000C00000)
    assert region is not None and region.path == "/data/private.npy"


@pytest.mark.parametrize("start,end", [
    (0x55D0C8A00010, 0x55D0C8A00020),  # the heap: RAM
    (0x7F0000800000, 0x7F0000800100),  # shared anonymous memory: RAM
    (0x7F0000300000, 0x7F0000880000),  # runs past the file into other memory
    (0x1000, 0x2000),  # before every mapping
    (0x7F0000C00000, 0x7F0000C00100),  # after every mapping
])
def test_region_in_maps_is_none_for_anything_but_one_file(start: int, end: int) -> None:
    assert region_in_maps(MAPS, start, end) is None



@given(start_page=st.integers(0, 2**35), pages=st.integers(1, 2**10), shared=st.booleans(), writable=st.booleans(),
       offset=st.integers(0, 2**40), path=st.sampled_from(["", "[heap]", "/data/a b.npy", "/x (deleted)"]))
def test_a_line_as_the_kernel_writes_it_parses_back(start_page: int, pages: int, shared: bool, writable: bool,
                                                     offset: int, path: str) -> None:
    start, end = start_page * 4096, (start_page + pages) * 4096
    perms = f"r{'w' if writable else '-'}-{'s' if shared else 'p'}"
    line = f"{start:x}-{end:x} {perms} {offset:08x} fd:01 1234{' ' * 10}{path}".rstrip()
    assert parse_maps_line(line) == Region(start, end, shared, writable, offset, path, 1234)


def test_file_region_reads_maps_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "maps").write_text(MAPS)
    region = file_region(0x7F0000100000, 0x7F0000700000, root=str(tmp_path))
    assert region is not None and region.path == "/data/my features.npy"


def test_a_machine_without_maps_has_no_file_mappings(tmp_path: Path) -> None:
    assert file_region(0x7F0000100000, 0x7F0000700000, root=str(tmp_path)) is None


def test_file_region_finds_a_real_memmap_and_not_ram(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(100_000, dtype=np.float64))
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    region = file_region(*row_extent(mapped))
    assert region is not None and region.path == str(tmp_path / "x.npy") and region.shared and region.is_file
    assert file_region(*row_extent(np.arange(100_000, dtype=np.float64))) is None

