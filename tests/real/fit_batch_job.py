"""fit_batch's real-cgroup check, shared by the v1 test (``tests/real/test_fit_batch_cgroup.py``) and the v2 one in
the VM (``tests/vm/test_v2_edges.py``): a child process in a memory group runs a step whose batch does not fit,
first under ``fit_batch``, then as the plain loop a user writes (the step at the starting batch). The step touches
every page it allocates (``np.ones``, a real PyTorch forward and backward), so the plain loop is killed by the
group's OOM killer (exit -9): the control. Under ``fit_batch`` the address-space cap it sets while the step runs
(``RLIMIT_AS`` = VmSize + the group's free memory) turns the allocation that would have been killed into a
``MemoryError`` (NumPy) or a ``DefaultCPUAllocator`` ``RuntimeError`` (PyTorch), so it halves and finishes with no
OOM kill; the child also checks the cap was set inside the step and lifted afterwards."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tests.realcg import ChildGroup, child_group

MiB = 1 << 20

CHILD = r"""
import json, logging, resource, sys
import numpy as np
import apsi_memory as memory

how, library, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
MiB = 1 << 20
tried, caps = [], []

if library == "torch":
    import torch
    torch.manual_seed(0)
    width = 8192  # 32 KiB of float32 per sample and hidden layer: forward and backward hold several of them
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        tried.append(batch)
        caps.append(resource.getrlimit(resource.RLIMIT_AS)[0])
        x = torch.randn(batch, 256)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x)
        loss.backward()
        optimizer.step()
        return float(loss.item())
else:
    def step(batch):
        tried.append(batch)
        caps.append(resource.getrlimit(resource.RLIMIT_AS)[0])
        x = np.ones(batch * MiB, dtype=np.uint8)   # batch MiB, every page touched
        y = x * 2                                   # and as much again: the step needs 2 x batch MiB
        return int(y[::4096].sum())

if how == "fit_batch":
    result, batch = memory.fit_batch(step, start)
else:  # the plain loop: the step at the batch the user chose
    result, batch = step(start), start
after = resource.getrlimit(resource.RLIMIT_AS)[0]
print(json.dumps({"batch": batch, "result": result, "tried": tried, "caps": caps, "after": after,
                  "unlimited": resource.RLIM_INFINITY}), flush=True)
"""


def run(group: ChildGroup, how: str, library: str, start: int) -> tuple[int, dict[str, Any] | None, str]:
    """(exit status, the child's figures or None when it died, its stderr's tail)."""
    env = {**os.environ}
    env.pop("APSI_RAM_BUDGET", None)
    env.pop("APSI_FS_ROOT", None)
    done = group.run([sys.executable, "-c", CHILD, how, library, str(start)], timeout=600, env=env)
    lines = done.stdout.strip().splitlines()
    figures = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    return done.returncode, figures, done.stderr[-3000:]


def fit_then_plain(library: str, limit: int, start: int) -> tuple[dict[str, Any], int, int, int]:
    """fit_batch's figures and the group's OOM kills after it, then the plain loop's exit status and the kills."""
    with child_group(limit) as group:
        status, figures, err = run(group, "fit_batch", library, start)
        kills_fit, peak_fit = group.oom_kills(), group.peak()
        assert status == 0 and figures is not None, f"fit_batch: exit {status}, {group.describe()}\n{err}"
        plain_status, _, plain_err = run(group, "plain", library, start)
        kills_plain = group.oom_kills() - kills_fit
        halvings = len(figures["tried"]) - 1
        print(f"\n{library} in a {limit // MiB} MiB {group.version} group, from batch {start}: fit_batch reached "
              f"{figures['batch']} after {halvings} halvings ({figures['tried']}), finished, peak {(peak_fit or 0) // MiB} MiB, "
              f"{kills_fit} OOM kills; "
              f"the plain loop: exit {plain_status}, {kills_plain} OOM kills. {group.describe()}")
        assert plain_status in (-9, 137), f"the control was not OOM-killed: exit {plain_status}\n{plain_err}"
        return figures, kills_fit, plain_status, kills_plain


def check_capped_and_restored(figures: dict[str, Any]) -> None:
    unlimited = figures["unlimited"]
    assert all(cap != unlimited for cap in figures["caps"]), figures["caps"]  # each try ran under a cap
    assert figures["after"] == unlimited  # and it was lifted once fit_batch returned
