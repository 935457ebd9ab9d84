"""memory.array on a real machine: in a child v1 memory cgroup limited to 1 GiB, three 1 GiB arrays are made,
filled and summed. With ``memory.array`` they go to spill files and the script finishes; with ``numpy.zeros`` the
kernel kills it. Both outcomes are asserted, so the test cannot pass because the limit was not enforced.

Also: four 350 MiB arrays all made before any is filled (unwritten pages must count as used, or they all land in
RAM and the filling is OOM-killed), and a real full disk (a 4 MiB tmpfs) for spill files, both before the file is
made and when the reservation itself fails."""

from __future__ import annotations

import os
import sys
import uuid

import numpy as np
import pytest

from apsi_memory.arrays import spill
from apsi_memory.errors import DiskFullError
from tests.realcg import tmpfs

pytestmark = pytest.mark.real

GiB = 1 << 30

SCRIPT = r"""
import sys
import numpy as np
import apsi_memory as memory

make = memory.array if sys.argv[1] == "memory.array" else np.zeros
n = (1 << 30) // 8  # 1 GiB of float64
block = 1 << 22
arrays = []
for value in (1.0, 2.0, 3.0):
    x = make(n, "float64")
    for start in range(0, n, block):  # fill in blocks: no temporary as big as the array
        x[start:start + block] = value
    arrays.append(x)
total = sum(float(x.sum()) for x in arrays)
where = ["SSD" if memory.on_disk(x) else "RAM" for x in arrays]
print(total, where, flush=True)
sys.exit(0 if total == 6.0 * n else 1)
"""


MAKE_ALL_THEN_FILL = r"""
import sys
import numpy as np
import apsi_memory as memory

n = 350 << 20  # four arrays of 350 MiB, all made before any is written
arrays = [memory.array(n, "uint8") for _ in range(4)]
for x in arrays:
    x[:] = 1
total = sum(int(x.sum(dtype=np.int64)) for x in arrays)
print(total, ["SSD" if memory.on_disk(x) else "RAM" for x in arrays], flush=True)
sys.exit(0 if total == 4 * n else 1)
"""


def run_in_group(memcg, how: str, spill_dir: str, script: str = SCRIPT) -> tuple[int, str, int]:
    """(exit status as a shell reports it, output, OOM kills in the group)."""
    with memcg(1 * GiB) as group:
        env = {**os.environ, "APSI_SPILL_DIR": spill_dir}
        env.pop("APSI_RAM_BUDGET", None)
        done = group.run([sys.executable, "-c", script, how], timeout=600, env=env)
        status = 128 - done.returncode if done.returncode < 0 else done.returncode  # killed by signal N: 128+N
        return status, done.stdout + done.stderr, group.oom_kills()


def test_three_1gib_arrays_finish_in_a_1gib_cgroup_where_numpy_zeros_is_oom_killed(memcg, tmp_path):
    spill_dir = str(tmp_path / "spill")
    status, output, oom_kills = run_in_group(memcg, "memory.array", spill_dir)
    assert (status, oom_kills) == (0, 0), output
    assert "['SSD', 'SSD', 'SSD']" in output
    assert os.listdir(spill_dir) == []  # deleted at exit
    status, output, oom_kills = run_in_group(memcg, "numpy.zeros", spill_dir)
    assert status == 137 and oom_kills >= 1, output  # SIGKILL (128 + 9) from the group's OOM killer


def test_arrays_made_before_they_are_filled_do_not_add_up_to_more_than_the_group_has(memcg, tmp_path):
    # Counting unwritten RAM arrays as free put all four in RAM (1400 MiB): the filling was OOM-killed.
    status, output, oom_kills = run_in_group(memcg, "", str(tmp_path / "spill"), MAKE_ALL_THEN_FILL)
    assert (status, oom_kills) == (0, 0), output
    assert "SSD" in output and "RAM" in output


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 4 MiB filesystem (tmpfs), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with tmpfs(tmp_path / f"tiny-{uuid.uuid4().hex[:8]}", "4m") as mount_point:
        yield str(mount_point / "spill")


def test_a_real_full_disk_is_a_clear_error_and_leaves_no_half_file(tiny_disk):
    kept = spill.create((1 << 17,), np.dtype("uint8"), tiny_disk)  # 128 KiB that must survive
    kept[:] = 7
    with pytest.raises(DiskFullError, match=f"in {tiny_disk}: .* MB free there"):
        spill.create((8 << 20,), np.dtype("uint8"), tiny_disk)  # 8 MiB on a 4 MiB disk
    # The reservation itself failing (the free space checked first looked big enough):
    with pytest.raises(DiskFullError, match=f"in {tiny_disk}"):
        spill.create((8 << 20,), np.dtype("uint8"), tiny_disk, free_bytes=lambda _: 1 << 40)
    assert os.listdir(tiny_disk) == [os.path.basename(kept.filename)] and int(kept.sum()) == 7 << 17
