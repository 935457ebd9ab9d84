"""On this machine's real kernel: a child v1 memory cgroup with a 1 GiB limit, and the host figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import pytest

import apsi_memory as memory
from apsi_memory.adapters.procfs import parse_meminfo
from tests.realcg import ChildGroup

pytestmark = pytest.mark.real
GiB = 1 << 30


def test_limits_inside_a_1gib_child_cgroup(memcg: Callable[[int], ContextManager[ChildGroup]]) -> None:
    with memcg(GiB) as group:
        result = group.run([sys.executable, "-m", "apsi_memory", "limits", "--json"], timeout=60)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["usable_bytes"] == GiB and data["source"] == "container (cgroup v1)"
        assert data["cgroup"].endswith(os.path.basename(group.path))
        assert 0.8 * GiB < data["free_bytes"] <= GiB  # the interpreter itself uses a little
        assert data["limit_file"].endswith("memory.limit_in_bytes")


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux /proc")
def test_status_agrees_with_free_and_nproc() -> None:
    status = memory.status()
    free_b = subprocess.run(["free", "-b"], capture_output=True, text=True, check=True).stdout.split("\n")[1].split()
    assert status.ram_usable_bytes == int(free_b[1]) or memory.limits().source != "host"
    assert abs(status.ram_free_bytes - int(free_b[6])) < 256 << 20  # "available", moments apart
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    assert status.cores == nproc
    with open("/proc/meminfo") as f:
        assert memory.limits().host_total_bytes == parse_meminfo(f.read()).total
