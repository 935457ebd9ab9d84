"""``apsi_memory.system.libc``: each C library call does what its docstring says on this Linux machine, and answers
"not available" (``None`` / ``False``) instead of raising where the platform lacks it or the kernel refuses."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from apsi_memory.errors import SystemCallError
from apsi_memory.system import libc

PAGE = mmap.PAGESIZE


@pytest.fixture(autouse=True)
def _fresh_lookups() -> Iterator[None]:
    """Tests that hide the library must not leave the hidden answer cached for the next test."""
    library, function = libc._library, libc._function  # the cached originals, whatever a test patches
    yield
    library.cache_clear()
    function.cache_clear()


@pytest.fixture
def anonymous() -> Iterator[tuple[mmap.mmap, int]]:
    """Four pages of fresh anonymous memory and their address."""
    memory = mmap.mmap(-1, 4 * PAGE)
    holder = ctypes.c_char.from_buffer(memory)
    yield memory, ctypes.addressof(holder)
    del holder
    memory.close()


@pytest.fixture
def written(tmp_path: Path) -> Iterator[int]:
    """A descriptor of a 16-page file whose pages were just written (so they are in the page cache)."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"x" * 16 * PAGE)
    os.fsync(fd)
    yield fd
    os.close(fd)


def test_importing_the_package_loads_no_c_library() -> None:
    code = "import apsi_memory, apsi_memory.system.libc as l; print(l._library.cache_info().currsize)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0"


def test_mincore_tells_touched_pages_from_untouched_ones(anonymous: tuple[mmap.mmap, int]) -> None:
    memory, address = anonymous
    memory[2 * PAGE] = 1
    states = libc.mincore(address, 4 * PAGE)
    assert states is not None and states.tolist() == [False, False, True, False]
    assert libc.mincore(address, 0) is not None and len(libc.mincore(address, 0)) == 0  # type: ignore[arg-type]


def test_mincore_of_unmapped_memory_does_not_say(anonymous: tuple[mmap.mmap, int]) -> None:
    assert libc.mincore(PAGE, PAGE) is None  # page 1 is never mapped: ENOMEM


def test_madvise_dontneed_empties_private_anonymous_memory(anonymous: tuple[mmap.mmap, int]) -> None:
    private = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    holder = ctypes.c_char.from_buffer(private)
    private[0] = 7
    assert libc.madvise(ctypes.addressof(holder), PAGE, mmap.MADV_DONTNEED)
    assert private[0] == 0
    assert not libc.madvise(ctypes.addressof(holder) + 1, PAGE, mmap.MADV_DONTNEED)  # unaligned: EINVAL
    del holder
    private.close()


def test_cachestat_counts_cached_pages_and_fadvise_drops_them(written: int) -> None:
    cached = libc.cachestat(written, 0, 16 * PAGE)
    if cached is None:  # the kernel predates cachestat (Linux 6.5) or a filter refuses it
        assert tuple(map(int, os.uname().release.split(".")[:2])) < (6, 5) or not libc._cachestat_works
        return
    assert cached == 16
    assert libc.fadvise(written, 0, 16 * PAGE, os.POSIX_FADV_DONTNEED)
    assert libc.cachestat(written, 0, 16 * PAGE) == 0


def test_cachestat_refused_once_is_not_asked_again(monkeypatch: pytest.MonkeyPatch, written: int) -> None:
    calls: list[object] = []

    def refusing(*args: object) -> int:
        calls.append(args)
        return -1

    monkeypatch.setattr(libc, "_cachestat_works", True)
    monkeypatch.setattr(libc, "_function", lambda name, *types: refusing)
    assert libc.cachestat(written, 0, PAGE) is None
    assert libc.cachestat(written, 0, PAGE) is None
    assert len(calls) == 1


def test_sync_file_range_and_fadvise_on_a_file_and_refused_on_a_pipe(written: int) -> None:
    os.pwrite(written, b"y" * PAGE, 0)
    assert libc.sync_file_range(written, 0, PAGE)
    read_end, write_end = os.pipe()
    try:
        assert not libc.sync_file_range(read_end, 0, PAGE)  # ESPIPE
        assert not libc.fadvise(read_end, 0, PAGE, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_malloc_trim_runs_where_the_c_library_is_glibc() -> None:
    result = libc.malloc_trim(0)
    if platform.libc_ver()[0] == "glibc":
        assert result in (0, 1)
    else:
        assert result is None


def test_posix_fallocate_reserves_the_blocks(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "r", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert libc.posix_fallocate(fd, 0, 64 * PAGE)
        stat = os.fstat(fd)
        assert stat.st_size == 64 * PAGE and stat.st_blocks * 512 >= 64 * PAGE
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FALLOC_FL_KEEP_SIZE is Linux's")
def test_posix_fallocate_keeping_the_size_reserves_blocks_past_the_end(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "r", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 100)
        assert libc.posix_fallocate(fd, 100, 64 * PAGE, keep_size=True)
        stat = os.fstat(fd)
        assert stat.st_size == 100 and stat.st_blocks * 512 >= 64 * PAGE
        with pytest.raises(OSError) as bad:
            libc.posix_fallocate(-1, 0, PAGE, keep_size=True)
        assert bad.value.errno == errno.EBADF
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP])
def test_posix_fallocate_where_the_filesystem_cannot_says_false(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def cannot(fd: int, offset: int, length: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", cannot)
    assert not libc.posix_fallocate(0, 0, PAGE)


def test_posix_fallocate_on_a_full_disk_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as info:
        libc.posix_fallocate(0, 0, PAGE)
    assert info.value.errno == errno.ENOSPC


def test_map_anonymous_fixed_replaces_a_file_mapping_with_zeros_in_place(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(b"z" * 2 * PAGE)
    with open(path, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 2 * PAGE)
    view = np.frombuffer(mapped, dtype=np.uint8)
    assert libc.map_anonymous_fixed(view.ctypes.data, 2 * PAGE)
    assert not view.any()  # the same pointer now reads fresh zero pages
    view[0] = 1  # and is writable memory of this process, no longer the file
    assert path.read_bytes() == b"z" * 2 * PAGE
    assert not libc.map_anonymous_fixed(view.ctypes.data, 0)
    with pytest.raises(SystemCallError, match="could not release") as info:
        libc.map_anonymous_fixed(view.ctypes.data + 1, PAGE)  # unaligned: EINVAL
    assert isinstance(info.value, OSError) and info.value.errno == errno.EINVAL


def test_off_linux_every_call_says_not_available(monkeypatch: pytest.MonkeyPatch, written: int,
                                                 anonymous: tuple[mmap.mmap, int]) -> None:
    monkeypatch.setattr(libc, "_LINUX", False)
    monkeypatch.setattr(libc, "_cachestat_works", True)
    address = anonymous[1]
    assert not libc.page_calls_available()
    assert not libc.madvise(address, PAGE, mmap.MADV_DONTNEED)
    assert libc.mincore(address, PAGE) is None
    assert libc.cachestat(written, 0, PAGE) is None
    assert not libc.sync_file_range(written, 0, PAGE)
    assert not libc.map_anonymous_fixed(address, PAGE)


def test_without_a_c_library_malloc_trim_and_posix_fallocate_say_not_available(
        monkeypatch: pytest.MonkeyPatch) -> None:
    libc._function.cache_clear()
    monkeypatch.setattr(libc, "_library", lambda: None)
    monkeypatch.delattr(os, "posix_fallocate")
    monkeypatch.delattr(os, "posix_fadvise")
    assert libc.malloc_trim(0) is None
    assert not libc.posix_fallocate(0, 0, PAGE)
    assert not libc.fadvise(0, 0, PAGE, 4)
    assert not libc.page_calls_available()
