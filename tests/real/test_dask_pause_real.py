"""Issue 30 item 1 in a real 1 GiB v1 memory group: a pause that a neighbour holding the group cannot make stick.

``cluster(n_workers=2)`` and a holder share the group: a stranger process, or the client's own process (the issue's
"done when"). The holder first takes the group to 85 % used (both workers pause at ``high``), then gives back down
to 77 % and holds that to the end: ``high`` is left only above 25 % free, so every worker stayed paused and a
1-second task timed out (2 of 2 in the issue's matrix, where dask alone finished). Each worker must now run a
1-second task within 10 s of the hold.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.load import stretched
from tests.realcg import ChildGroup

pytest.importorskip("distributed", reason="apsi_memory.dask needs the dask extra: pip install 'apsi-memory[dask]'")

pytestmark = [pytest.mark.real, pytest.mark.dask, pytest.mark.timeout(420)]

GiB = 1 << 30
SPIKE, HOLD = 0.85, 0.77  # shares of the group used: past high's entry (80 %), then inside its hysteresis band
WITHIN_S = 10.0  # issue 30, "Done when": both workers running a task within 10 s

DRIVER = r'''
import json, subprocess, sys, time

from distributed import wait

import apsi_memory as memory
from apsi_memory.dask import cluster

STRANGER = """
import sys
import numpy as np
held = []
for line in sys.stdin:  # a target in MiB: take or give back 1 MiB blocks (np.ones writes every page)
    want = int(line)
    while len(held) < want:
        held.append(np.ones(1 << 20, np.uint8))
    del held[want:]
    print(len(held), flush=True)
"""
MiB = 1 << 20


class Stranger:
    """Another process of the group holding memory, told its target through a pipe."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", STRANGER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.held = 0

    def take(self, mib):
        self.proc.stdin.write(f"{mib}\n")
        self.proc.stdin.flush()
        self.held = int(self.proc.stdout.readline())

    def close(self):
        self.proc.kill()


class Client:
    """The client's own process holding the memory (1 MiB blocks: glibc maps and unmaps each one)."""

    def __init__(self):
        self.blocks, self.held = [], 0

    def take(self, mib):
        import numpy as np
        while len(self.blocks) < mib:
            self.blocks.append(np.ones(MiB, np.uint8))
        del self.blocks[mib:]
        self.held = len(self.blocks)

    def close(self):
        self.blocks.clear()


def used():
    reading = memory.pressure()
    return reading.usable_bytes - reading.free_bytes, reading.usable_bytes


def hold(holder, share):
    """The holder's share adjusted until the group is at ``share`` used (dask's own use moves meanwhile)."""
    for _ in range(4):
        now, usable = used()
        holder.take(max(0, holder.held + int((share * usable - now) / MiB)))
        time.sleep(0.3)
    return holder.held


def paused(client):
    """The workers that have paused (an event, not the status: a worker may already have resumed)."""
    return {e["worker"] for _, e in client.get_events("apsi-pressure") if e["action"] == "pause"}


def statuses(client):
    return sorted(w["status"] for w in client.scheduler_info()["workers"].values())


if __name__ == "__main__":
    out = {}
    holder = Stranger() if HOLDER == "stranger" else Client()
    with cluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as made, made.get_client() as client:
        client.wait_for_workers(2, timeout=WORKERS_S)
        out["holder_spike_mib"] = hold(holder, SPIKE)
        deadline = time.monotonic() + 30
        while len(paused(client)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        out["paused_by_spike"] = len(paused(client)) == 2
        out["holder_hold_mib"] = hold(holder, HOLD)
        now, usable = used()
        out["held_share"] = round(now / usable, 3)
        out["client_level"] = str(memory.pressure().level)
        start = time.monotonic()
        workers = list(client.scheduler_info()["workers"])
        futures = [client.submit(time.sleep, 1, workers=[w], allow_other_workers=False, pure=False) for w in workers]
        try:
            wait(futures, timeout=WAIT_S)
            out["finished"] = all(f.status == "finished" for f in futures)
        except Exception as exc:  # distributed's TimeoutError: the hang of the issue
            out["finished"], out["error"] = False, type(exc).__name__
        out["took_s"] = round(time.monotonic() - start, 2)
        out["statuses"] = statuses(client)
        out["events"] = [(e["action"], str(e["level"])) for _, e in client.get_events("apsi-pressure")]
        out["used_after"] = round(used()[0] / usable, 3)
    holder.close()
    print(json.dumps(out))
'''


def _run(memcg: Callable[[int], ContextManager[ChildGroup]], tmp_path: Path, holder: str = "stranger",
         **env: str) -> tuple[dict[str, Any], str, str]:
    """The driver in a fresh 1 GiB group, ``holder`` (``stranger`` or ``client``) holding the memory: its result,
    the group's figure, and its stderr (the workers' logs)."""
    script = tmp_path / "dask_pause_driver.py"
    script.write_text(f"SPIKE, HOLD, WAIT_S, WORKERS_S = {SPIKE}, {HOLD}, {2 * WITHIN_S}, {stretched(60)}\n"
                      f"HOLDER = {holder!r}\n" + DRIVER)
    with memcg(GiB, prefix=f"apsi-i30pause-{os.getpid()}") as group:
        done = group.run([sys.executable, str(script)], timeout=stretched(300), cwd=os.getcwd(),
                         env={**os.environ, **env})
        figure = group.describe()
        kills = group.oom_kills()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(figure, result)  # the figure: shown with -s, and in the report of a failure
    assert result["paused_by_spike"], f"the spike did not pause both workers: {result}"
    assert HOLD - 0.03 <= result["held_share"] < 0.80, result  # inside high's band: the level the workers stuck at
    assert kills == 0, figure
    return result, figure, done.stderr


@pytest.mark.parametrize("holder", ["stranger", "client"])
def test_workers_paused_by_a_spike_run_a_1s_task_while_the_group_stays_77_percent_used(
        memcg: Callable[[int], ContextManager[ChildGroup]], tmp_path: Path, holder: str) -> None:
    """cluster()'s own 16 MiB chunks: the next task needs 48 MiB, the group has 235 MiB free: resumed on its need,
    whether a stranger or the client itself holds the 77 %."""
    result, _, _ = _run(memcg, tmp_path, holder)
    assert result["finished"] and result["took_s"] <= WITHIN_S, f"a 1-second task did not finish: {result}"
    assert result["events"].count(["resume", "high"]) == 2, result  # resumed at high: the level that stuck


def test_a_pause_the_group_cannot_end_ends_after_the_longest_pause_with_the_holders_named(
        memcg: Callable[[int], ContextManager[ChildGroup]], tmp_path: Path) -> None:
    """256 MiB chunks (set by the user, so kept): the next task needs more than the group can spare, so the workers
    stay paused, until the longest pause (5 s here) ends it with a WARNING naming the signal and the stranger."""
    result, _, logs = _run(memcg, tmp_path, DASK_ARRAY__CHUNK_SIZE="256MiB", DASK_APSI_MEMORY__MAX_PAUSE="5s")
    assert result["finished"] and result["took_s"] <= 5 + WITHIN_S, result  # the 5 s count from the spike's pause
    warned = [line for line in logs.splitlines() if "the longest pause" in line]
    print(*warned, sep="\n")
    assert len(warned) == 2, logs[-3000:]
    stranger_first = re.compile(r"pressure high .* used of 1\.0 GB: pid \d+ \(\S*python\S* -c\) .*this worker")
    assert all(stranger_first.search(line) for line in warned), warned  # the signal, and the stranger first
