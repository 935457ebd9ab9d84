"""fit_batch against real allocator failures: a subprocess limits its address space (RLIMIT_AS) to what it has
mapped plus 640 MB, so a too-big NumPy or PyTorch (CPU) allocation fails for real — NumPy raises MemoryError,
PyTorch's DefaultCPUAllocator a RuntimeError — without using that memory (the allocations are never touched).

The step holds a first activation of batch/2 MB while it allocates batch MB: 1024 and 512 do not fit (1536, 768 MB),
256 does (384 MB) — but only once the failed tries' activations are freed. The simple retry inside ``except``
still holds them and fits nothing, which the control run shows for the same limit.

fit_batch's own address-space cap (VmSize + free memory) is far above this limit here, so the child's own, lower
RLIMIT_AS stays as it is. In a memory cgroup, where the kernel OOM-kills instead: test_fit_batch_cgroup.py."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux"),
]

CHILD = r"""
import json, resource, sys
import numpy as np
import apsi_memory as memory

MiB = 1 << 20
library, how = sys.argv[1], sys.argv[2]
if library == "torch":
    import torch
    torch.empty(1)  # load what PyTorch loads on first use before the limit is set

    def allocate(n):
        return torch.empty(n, dtype=torch.uint8)
else:
    def allocate(n):
        return np.empty(n, dtype=np.uint8)

def mapped():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))

_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped() + 640 * MiB, hard))

errors = []

def step(batch):
    try:
        first = allocate(batch // 2 * MiB)
        second = allocate(batch * MiB)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        raise
    return len(first) + len(second)

def naive(batch):
    try:
        return step(batch), batch
    except (MemoryError, RuntimeError):
        return naive(batch // 2) if batch > 1 else (None, 0)

result, batch = memory.fit_batch(step, 1024) if how == "fit_batch" else naive(1024)
print(json.dumps({"batch": batch, "result": result, "errors": errors}))
"""


def run_child(library: str, how: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, library, how], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_numpy_memory_error_is_recovered() -> None:
    out = run_child("numpy", "fit_batch")
    assert out["batch"] == 256 and out["result"] == (128 + 256) << 20
    assert len(out["errors"]) == 2
    assert all(e.startswith("MemoryError: Unable to allocate") for e in out["errors"])


@pytest.mark.torch
def test_torch_cpu_allocator_failure_is_recovered() -> None:
    pytest.importorskip("torch")
    out = run_child("torch", "fit_batch")
    assert out["batch"] == 256 and out["result"] == (128 + 256) << 20
    assert len(out["errors"]) == 2
    assert all("DefaultCPUAllocator: can't allocate memory" in e for e in out["errors"])


def test_the_simple_retry_inside_except_fails_under_the_same_limit() -> None:
    # the control: the leftovers of the failed tries are real and take the room the smaller batch needed
    assert run_child("numpy", "naive")["batch"] < 256
