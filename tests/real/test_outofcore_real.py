"""chunks and map inside a real cgroup v1 memory limit: a file three times the limit streams through it, and a map
whose output is three times the limit completes with the right result. Loading the same file whole is killed, so
the limit is real. The page cache a process brings in is charged to its group, so this also proves that what
chunks/map read and write is let go."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest

from tests.realcg import ChildGroup

pytestmark = pytest.mark.real

MiB = 1 << 20
LIMIT = 256 * MiB
COLS = 8
Memcg = Callable[[int], AbstractContextManager[ChildGroup]]


def write_npy(path: str, n_rows: int) -> float:
    """A float32 (n_rows, 8) file of small integers (so float64 sums are exact); returns its sum."""
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n_rows, COLS))
    total = 0.0
    for start in range(0, n_rows, 1 << 20):
        stop = min(start + (1 << 20), n_rows)
        x[start:stop] = (np.arange(start, stop) % 1000)[:, None]
        total += float(x[start:stop].sum(dtype=np.float64))
    x.flush()
    del x
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # nothing of it cached: the child reads it all itself
    os.close(fd)
    return total


def run_in(group: ChildGroup, code: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = group.run([sys.executable, "-c", code, *args], env={**os.environ, **(env or {})})
    return result.returncode, result.stdout + result.stderr


def peak_usage(group: ChildGroup) -> int:
    with open(os.path.join(group.path, "memory.max_usage_in_bytes")) as f:
        return int(f.read())


STREAM = """
import sys, numpy as np, apsi_memory as memory
print(sum(float(b.sum(dtype=np.float64)) for b in memory.chunks(sys.argv[1], rows=500_000)))
"""

PLAIN_MMAP = """
import sys, numpy as np
x = np.load(sys.argv[1], mmap_mode="r")
print(sum(float(x[i:i + 1_000_000].sum(dtype=np.float64)) for i in range(0, len(x), 1_000_000)))
"""

LOAD_WHOLE = """
import sys, numpy as np
print(float(np.load(sys.argv[1]).sum(dtype=np.float64)))
"""


def test_a_file_three_times_the_limit_streams_through_it(memcg: Memcg, tmp_path: Path) -> None:
    path = str(tmp_path / "big.npy")
    expected = write_npy(path, 3 * LIMIT // (COLS * 4))  # 768 MiB
    with memcg(LIMIT) as group:
        code, out = run_in(group, STREAM, path)
        assert code == 0, out
        assert float(out.split()[-1]) == expected
        assert group.oom_kills() == 0
        # Page cache included: the interpreter (~45 MiB), the block in use and the one read ahead (16 MiB each).
        assert peak_usage(group) < LIMIT // 2
    with memcg(LIMIT) as group:  # plain mmap completes too, but only by running the group into its limit
        code, out = run_in(group, PLAIN_MMAP, path)
        assert code == 0 and float(out.split()[-1]) == expected, out
        assert peak_usage(group) >= LIMIT * 0.9
    with memcg(LIMIT) as group:  # the limit is real: the same file loaded whole is killed
        code, out = run_in(group, LOAD_WHOLE, path)
        assert code in (137, -9), out
        assert group.oom_kills() >= 1


MAP = """
import sys, numpy as np, apsi_memory as memory
y = memory.map(lambda b: np.concatenate([b, b], axis=1).astype(np.float64), sys.argv[1], rows=65_536)
print(memory.on_disk(y), y.shape, y.dtype)
print(sum(float(b.sum(dtype=np.float64)) for b in memory.chunks(y, rows=500_000)))
"""


def test_map_with_an_output_three_times_the_limit_completes_and_is_right(memcg: Memcg, tmp_path: Path) -> None:
    path = str(tmp_path / "in.npy")
    n_rows = 3 * LIMIT // (2 * COLS * 8)  # the output: (n_rows, 16) float64 = 768 MiB
    expected = 2 * write_npy(path, n_rows)
    spill = tmp_path / "spill"
    with memcg(LIMIT) as group:
        code, out = run_in(group, MAP, path, env={"APSI_SPILL_DIR": str(spill)})
        assert code == 0, out
        lines = out.strip().splitlines()
        assert lines[-2] == f"True ({n_rows}, 16) float64"  # the output went to the SSD by itself
        assert float(lines[-1]) == expected
        assert group.oom_kills() == 0
    assert os.listdir(spill) == []  # the spill file went with the process
