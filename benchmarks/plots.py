"""The pictures of the docs, drawn from one run on the machine at hand (``pip install '.[plot]'``: matplotlib).

    python benchmarks/plots.py                    # all four into docs/
    python benchmarks/plots.py --only store pool  # some of them
    python benchmarks/plots.py --rows 25_000_000  # a 0.8 GB file for the streaming picture

The store and pool pictures are medians of several rounds (``--rounds``), and the numbers each one draws are
written beside it (``docs/store_set.json``, ``docs/pool.json``, with the command): the figures the docs quote for a
picture are those numbers (``tests/test_plots.py`` checks).

* ``docs/rss_stream.png``: RSS over time while a child process streams a ``.npy`` (``--rows`` x 8 float32, 3.2 GB
  by default) with ``np.load``, a plain ``np.load(mmap_mode="r")`` and ``memory.chunks``, sampled from
  ``/proc/<pid>/status`` every 20 ms (the children are ``benchmarks/rss_stream.py --child``);
* ``docs/store_set.png``: time per ``set`` of a 1 KiB array as a store fills up to ``--entries``, for
  ``memory.store`` and diskcache (the median of each batch of 500 sets, then the median over the rounds, each
  round a fresh store of each kind);
* ``docs/pool.png``: the time of each of twenty 256 MiB temporaries, fresh (``numpy.zeros``) against
  ``pool.take(zero=True)`` and ``zero=False`` (``benchmarks/bench_pool.py``'s steps; the median over the rounds,
  the ways taking turns within each round, after one round that warms the pools up);
* ``docs/oom.png``: a real 1 GiB cgroup v1 memory group (root, ``/sys/fs/cgroup/memory``): its usage over time
  while ``tests/real/test_arrays_oom.py``'s script makes and fills three 1 GiB arrays with ``numpy.zeros``
  (killed) and with ``memory.array`` (finishes), the limit drawn as a line. The group is named
  ``apsi-plot-i13user-<pid>`` and removed afterwards, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script: the repository's benchmarks/, sim/ and tests/ helpers

import apsi_memory as memory
from benchmarks import bench_pool, rss_stream
from tests.real.test_arrays_oom import SCRIPT as OOM_SCRIPT

MiB, GiB = 1 << 20, 1 << 30
FIGURES = ("rss", "store", "pool", "oom")
STYLE = {"np.load": "tab:red", "plain mmap": "tab:orange", "memory.chunks": "tab:blue", "memory.store": "tab:blue",
         "diskcache": "tab:gray", "fresh": "tab:red", "take(zero=True)": "tab:blue", "take(zero=False)": "tab:cyan",
         "numpy.zeros": "tab:red", "memory.array": "tab:blue"}


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plots.py needs matplotlib: pip install 'apsi-memory[plot]', or pip install '.[plot]' "
                         "in a checkout") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KB)", flush=True)


def save_numbers(path: str, command: str, numbers: dict[str, Any]) -> None:
    """What a picture drew, beside it as JSON: the docs quote these numbers, and a test holds them to it."""
    load = [round(x, 1) for x in os.getloadavg()]  # the machine's other work: it moves these figures
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"command": command, "load_average_1_5_15_min": load, **numbers}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {path}: {numbers.get('summary')}", flush=True)


def rounded(values: Sequence[float]) -> list[float]:
    return [round(value, 3) for value in values]


def medians(runs: Sequence[Sequence[float]]) -> list[float]:
    """Point by point, the median over the rounds."""
    return [statistics.median(point) for point in zip(*runs)]


def sample(proc: subprocess.Popen[bytes], read: Callable[[], int | None], every: float
           ) -> tuple[list[float], list[int]]:
    """``read()`` every ``every`` seconds until ``proc`` ends: times since the start and the values."""
    times: list[float] = []
    values: list[int] = []
    start = time.perf_counter()
    while proc.poll() is None:
        value = read()
        if value is not None:
            times.append(time.perf_counter() - start)
            values.append(value)
        time.sleep(every)
    return times, values


def vm_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# -- RSS while streaming -------------------------------------------------------------------------------------------

def rss_figure(plt: Any, out: str, rows: int, folder: str) -> None:
    path = os.path.join(folder, "apsi-plot-stream.npy")
    rss_stream.make_file(path, rows)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    try:
        for way in ("np.load", "plain mmap", "memory.chunks"):
            rss_stream.warm_cache(path)
            proc = subprocess.Popen(rss_stream.argv_for(way, path, 1_000_000, "sum"), cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times, values = sample(proc, functools.partial(vm_rss, proc.pid), 0.02)
            peak, took = max(values) / MiB, times[-1]
            # Runs take 1 to 15 s: each on its own time scale, so the fast ones are not a smudge at the left.
            ax.plot([100 * t / took for t in times], [v / MiB for v in values], color=STYLE[way],
                    label=f"{way}: peak {peak:,.0f} MB ({took:.1f} s)")
    finally:
        os.unlink(path)
    ax.set(xlabel="% of the run (the child's whole life, imports included)", ylabel="RSS (MB)",
           title=f"Streaming a {rows * rss_stream.COLS * 4 / GiB:.1f} GB .npy in 1,000,000-row blocks (warm cache)")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, os.path.join(out, "rss_stream.png"))


# -- store.set against the number of entries -----------------------------------------------------------------------

def set_times(setter: Callable[[Any, Any], None], entries: int, batch: int) -> tuple[list[int], list[float]]:
    """Fill to ``entries`` in batches; the median microseconds per set of each batch, against the count."""
    value = np.arange(256, dtype=np.float32)  # 1 KiB
    counts, micros = [], []
    for start in range(0, entries, batch):
        times = []
        for key in range(start, start + batch):
            began = time.perf_counter()
            setter(key, value)
            times.append(time.perf_counter() - began)
        counts.append(start + batch)
        micros.append(statistics.median(times) * 1e6)
    return counts, micros


def store_figure(plt: Any, out: str, entries: int, folder: str, rounds: int) -> None:
    import diskcache

    micros: dict[str, list[list[float]]] = {"memory.store": [], "diskcache": []}
    memory.allow_write(folder)
    for round_ in range(rounds):
        ours = memory.store(os.path.join(folder, f"apsi-{round_}"), ram_mb=256, disk_gb=20)
        theirs = diskcache.Cache(os.path.join(folder, f"diskcache-{round_}"), size_limit=20 << 30)
        try:
            for name, setter in (("memory.store", ours.set), ("diskcache", theirs.set)):
                counts, times = set_times(setter, entries, 500)
                micros[name].append(times)
        finally:
            ours.close()
            theirs.close()
    drawn = {name: medians(runs) for name, runs in micros.items()}
    median = {name: statistics.median(points) for name, points in drawn.items()}
    ratio = median["diskcache"] / median["memory.store"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, points in drawn.items():
        ax.plot(counts, points, label=f"{name} (median {median[name]:.0f} µs)", color=STYLE[name])
    ax.set(xlabel="entries in the store", ylabel="µs per set (median of 500)", ylim=(0, None),
           title=f"store.set of a 1 KiB array: {ratio:.1f}x diskcache's speed (median of {rounds} rounds)")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, os.path.join(out, "store_set.png"))
    save_numbers(os.path.join(out, "store_set.json"),
                 f"python benchmarks/plots.py --only store --entries {entries} --rounds {rounds}",
                 {"rounds": rounds, "entries": counts, "micros_per_set": {n: rounded(p) for n, p in drawn.items()}, "median_micros": median,
                  "summary": {"times_faster_than_diskcache": round(ratio, 1)}})


# -- pool against fresh allocation ---------------------------------------------------------------------------------

def step_times(step: Callable[[], None], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1e3)
    return times


def pool_steps(shape: tuple[int, int]) -> dict[str, Callable[[], None]]:
    def fresh() -> None:
        a = np.zeros(shape)
        bench_pool.touch(a)
        del a

    def pooled(p: memory.Pool, zero: bool) -> Callable[[], None]:
        def step() -> None:
            a = p.take(shape, zero=zero)
            bench_pool.touch(a)
            p.give(a)
        return step

    return {"fresh": fresh, "take(zero=True)": pooled(memory.pool(1), True),
            "take(zero=False)": pooled(memory.pool(1), False)}


def pool_figure(plt: Any, out: str, shape: tuple[int, int], steps: int, rounds: int) -> None:
    ways = pool_steps(shape)
    runs: dict[str, list[list[float]]] = {name: [] for name in ways}
    for round_ in range(rounds + 1):  # round 0 fills the pools, as bench_pool.py's warm-up round does
        for name, step in ways.items():  # taking turns, so a busier minute slows every way alike
            times = step_times(step, steps)
            if round_:
                runs[name].append(times)
    total = {name: statistics.median(sum(times) for times in rounds_) for name, rounds_ in runs.items()}
    faster = {name: total["fresh"] / total[name] for name in ways}
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, rounds_ in runs.items():
        ax.plot(range(1, steps + 1), medians(rounds_), marker="o", markersize=3, color=STYLE[name],
                label=f"{name}: {total[name]:,.0f} ms in all, {faster[name]:.2f}x fresh's speed")
    mib = shape[0] * shape[1] * 8 / MiB
    ax.set(xlabel="temporary", ylabel="ms (take, fill, give back)", ylim=(0, None),
           title=f"{steps} temporaries of {mib:.0f} MiB, fresh against the pool (median of {rounds} rounds)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, os.path.join(out, "pool.png"))
    save_numbers(os.path.join(out, "pool.json"), f"python benchmarks/plots.py --only pool --rounds {rounds} --pool-shape {shape[0]} {shape[1]}",
                 {"rounds": rounds, "shape": list(shape), "ms_per_temporary": {n: rounded(medians(r)) for n, r in runs.items()},
                  "ms_in_all": total, "summary": {"times_faster_than_fresh": {n: round(faster[n], 2) for n in ways}}})


# -- a real 1 GiB container ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def memory_group(limit: int) -> Iterator[str]:
    from tests.realcg import own_v1_memory_group, skip_reason

    reason = skip_reason()
    parent = own_v1_memory_group()
    if reason or parent is None:
        raise SystemExit(f"--only oom: {reason or 'no v1 memory group'}")
    path = os.path.join(parent, f"apsi-plot-i13user-{os.getpid()}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        yield path
    finally:
        for _ in range(50):  # the killed child leaves the group a moment after it is reaped
            with contextlib.suppress(OSError):
                os.rmdir(path)
                break
            time.sleep(0.1)


def read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def group_reading(group: str) -> tuple[int, int] | None:
    """The group's usage (what the kernel holds against the limit, page cache included) and its anonymous
    memory (``total_rss`` in ``memory.stat``: what cannot be dropped or written back)."""
    usage = read_int(os.path.join(group, "memory.usage_in_bytes"))
    try:
        with open(os.path.join(group, "memory.stat")) as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("total_rss "))
    except (OSError, StopIteration, ValueError):
        return None
    return None if usage is None else (usage, rss)


def oom_run(group: str, make: str, spill: str) -> tuple[list[float], list[tuple[int, int]], int]:
    argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group, sys.executable, "-c", OOM_SCRIPT,
            make]
    env = {**os.environ, "APSI_SPILL_DIR": spill, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times, values = sample(proc, functools.partial(group_reading, group), 0.05)
    return times, values, proc.returncode


def oom_figure(plt: Any, out: str, folder: str) -> None:
    """The solid lines are what the kernel counts against the limit: memory.array's spill files fill it with page
    cache, which the kernel writes back and drops as needed; the dotted ones are the part it cannot drop."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for make in ("numpy.zeros", "memory.array"):
        with memory_group(GiB) as group:
            times, values, code = oom_run(group, make, folder)
        outcome = "killed by the kernel" if code == -signal.SIGKILL else f"exit {code}"
        ax.plot(times, [usage / MiB for usage, _ in values], color=STYLE[make], label=f"{make}: {outcome}")
        ax.plot(times, [rss / MiB for _, rss in values], color=STYLE[make], linestyle=":",
                label=f"{make}: of which anonymous (RSS)")
        if code == -signal.SIGKILL:
            ax.plot(times[-1:], [values[-1][0] / MiB], "X", color=STYLE[make], markersize=10)
    ax.axhline(1024, color="black", linestyle="--", linewidth=1, label="the group's limit (1 GiB)")
    ax.set(xlabel="seconds", ylabel="group memory usage (MB)", ylim=(0, 1250),
           title="Three 1 GiB arrays filled in a 1 GiB container (cgroup v1)")
    ax.legend(loc="center right", fontsize="small")
    ax.grid(alpha=0.3)
    save(fig, os.path.join(out, "oom.png"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"))
    parser.add_argument("--rows", type=int, default=100_000_000, help="rows of 8 float32 for the streaming file")
    parser.add_argument("--entries", type=int, default=100_000, help="entries to fill each store to")
    parser.add_argument("--pool-shape", type=int, nargs=2, default=list(bench_pool.SHAPE))
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the store and pool pictures (medians)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the big files go (deleted after)")
    args = parser.parse_args(argv)
    plt = pyplot()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="apsi-plots-", dir=args.dir)
    try:
        if "rss" in args.only:
            rss_figure(plt, args.out, args.rows, work)
        if "store" in args.only:
            store_figure(plt, args.out, args.entries, work, args.rounds)
        if "pool" in args.only:
            pool_figure(plt, args.out, (args.pool_shape[0], args.pool_shape[1]), bench_pool.STEPS, args.rounds)
        if "oom" in args.only:
            oom_figure(plt, args.out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
