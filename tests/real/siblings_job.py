"""Several processes in one memory cgroup each make one big array at the same moment, fill it and check it.

    python siblings_job.py memory.array|numpy.zeros N MiB procs|pool

Prints one line per process (``ok RAM``/``ok SSD``/``wrong``) and exits 0 only when every process came back right;
a process the kernel killed shows up as ``killed``. ``procs``: N processes started together (``subprocess``);
``pool``: a ``multiprocessing`` Pool(N) of spawned workers, one task each. With ``numpy.zeros`` (the control) each
process holds its filled array until all have filled theirs (or 30 s passed): on a loaded machine the processes
started late, and those that finished first had freed theirs, so the control sometimes fitted (CI, load ~2)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time


def one(make: str, mib: int, start_at: float, filled: str | None = None, count: int = 0) -> str:
    import numpy as np

    import apsi_memory as memory

    time.sleep(max(0.0, start_at - time.time()))  # every process places at the same moment
    n = mib << 20
    x = memory.array(n, "uint8") if make == "memory.array" else np.zeros(n, "uint8")
    where = "SSD" if memory.on_disk(x) else "RAM"
    for start in range(0, n, 16 << 20):
        x[start:start + (16 << 20)] = 3
    right = int(x.sum(dtype=np.int64)) == 3 * n
    if make == "numpy.zeros" and filled is not None:
        wait_for_all(filled, count, 30)  # the control holds its array till every process filled its own
    return f"{'ok' if right else 'wrong'} {where}"


def wait_for_all(folder: str, count: int, seconds: float) -> None:
    """A file barrier: say this process got here (a file named by its pid in ``folder``), then wait until ``count``
    processes have said so, or ``seconds`` have passed."""
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + seconds
    while len(os.listdir(folder)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def oom_killed() -> bool:
    """Whether the kernel killed a process of our memory group (v1: its ``memory.oom_control``)."""
    with open("/proc/self/cgroup") as f:
        group = next(line.split(":", 2)[2].strip() for line in f if ":memory:" in line)
    with open(f"/sys/fs/cgroup/memory{group}/memory.oom_control") as f:
        return any(line.startswith("oom_kill ") and int(line.split()[1]) > 0 for line in f)


def task(args: tuple[str, int, float, str, int]) -> str:
    return one(*args)


def main(make: str, count: int, mib: int, how: str) -> int:
    start_at = time.time() + (4.0 if how == "pool" else 2.0)
    filled = tempfile.mkdtemp(prefix="filled-")
    try:
        return run(make, count, mib, how, start_at, filled)
    finally:
        shutil.rmtree(filled, ignore_errors=True)


def run(make: str, count: int, mib: int, how: str, start_at: float, filled: str) -> int:
    if how == "pool":
        with multiprocessing.get_context("spawn").Pool(count) as pool:
            result = pool.map_async(task, [(make, mib, start_at, filled, count)] * count, chunksize=1)
            deadline = time.time() + 120
            while not result.ready() and not oom_killed() and time.time() < deadline:
                result.wait(0.2)  # a worker killed never answers: its task is lost, so the group is watched
            lines = result.get() if result.ready() else ["killed"]
    else:
        children = [subprocess.Popen([sys.executable, __file__, "one", make, str(mib), str(start_at), filled,
                                      str(count)], stdout=subprocess.PIPE, text=True) for _ in range(count)]
        lines = [(child.communicate()[0].strip() if child.wait() == 0 else "") or f"killed ({child.returncode})"
                 for child in children]
    print("\n".join(lines), flush=True)
    return 0 if all(line.startswith("ok") for line in lines) and len(lines) == count else 1


if __name__ == "__main__":
    if sys.argv[1] == "one":
        print(one(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], int(sys.argv[6])))
    else:
        sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
