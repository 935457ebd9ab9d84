"""Peak RSS and throughput of streaming a big .npy file, each way in its own process, side by side.

    .venv/bin/python benchmarks/rss_stream.py                       # 100,000,000 x 8 float32 = 3.2 GB in /tmp
    .venv/bin/python benchmarks/rss_stream.py --rows 25_000_000     # a quicker 0.8 GB run
    .venv/bin/python benchmarks/rss_stream.py --cgroup 1GiB         # also inside a v1 memory group (root)
    .venv/bin/python benchmarks/rss_stream.py --work heavy --cache cold   # read-ahead overlapping the work

Ways, each summing every value block by block (float64 accumulation; ``--work heavy`` adds a square root and a
sine per value, about as long as reading the block from this machine's disk):

* ``np.load``        — the whole file into RAM, then its blocks;
* ``plain mmap``     — ``np.load(mmap_mode="r")`` iterated in blocks of ``--block`` rows;
* ``memory.chunks``  — ``memory.chunks(path, rows=--block)``;
* ``cat``            — ``cat file > /dev/null``: reading the file and nothing else, the physical limit.

Each runs with a warm page cache (the file read once before) and a cold one (``posix_fadvise(DONTNEED)`` on the
file only: other people's caches stay). Peak RSS is the child's own ``VmHWM`` (not shown for ``cat``); time is the
child's loop (imports excluded) or, for ``cat``, its whole run. With ``--cgroup`` every child also runs in a fresh
child memory cgroup of that limit and the group's peak usage (page cache included) is shown. The file is created
under ``--dir`` (default /tmp) and deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script: the repository's sim/ and tests/ helpers

from sim.pagecache import drop_cache

MiB, GiB = 1 << 20, 1 << 30
COLS = 8
WAYS = ("np.load", "plain mmap", "memory.chunks", "cat")


# -- the children: one way each, in a fresh process ----------------------------------------------------------------

WORK: dict[str, Callable[[np.ndarray], float]] = {
    "sum": lambda b: float(b.sum(dtype=np.float64)),
    # About as long as reading the block from this machine's disk: shows whether reading overlaps computing.
    "heavy": lambda b: float(np.sqrt(b).sum(dtype=np.float64) + np.sin(b[:, :4]).sum(dtype=np.float64)),
}


def child(way: str, path: str, block: int, work: str) -> None:
    import apsi_memory as memory  # imported by every way, outside the timing, so all start alike

    start = time.perf_counter()
    if way == "memory.chunks":
        blocks: Iterator[np.ndarray] = memory.chunks(path, rows=block)
    else:
        x = np.load(path) if way == "np.load" else np.load(path, mmap_mode="r")
        blocks = (x[i:i + block] for i in range(0, len(x), block))
    total = sum(WORK[work](b) for b in blocks)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "sum": total, "peak_rss": own_peak_rss()}))


def own_peak_rss() -> int:
    """This process's own high-water RSS (``VmHWM``). Not ``ru_maxrss``: Linux carries that over from the parent
    across fork and exec, so a child would report at least its parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# -- the parent ----------------------------------------------------------------------------------------------------

@dataclass
class Run:
    way: str
    cache: str
    seconds: float | None  # None: killed
    peak_rss: int | None  # None: not measured (cat: see own_peak_rss)
    group_peak: int | None
    total: float | None


def make_file(path: str, rows: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) >= rows * COLS * 4:
        return
    print(f"writing {path} ({rows:,} x {COLS} float32, {rows * COLS * 4 / GiB:.2f} GB) ...", flush=True)
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, COLS))
    step = 4_000_000
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        x[start:stop] = (np.arange(start, stop) % 1000)[:, None]
        x.flush()
        drop_cache(path)  # keep this script's own footprint small while writing
    del x


def warm_cache(path: str) -> None:
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def argv_for(way: str, path: str, block: int, work: str) -> list[str]:
    if way == "cat":
        return ["/bin/sh", "-c", 'exec cat "$0" > /dev/null', path]
    return [sys.executable, os.path.abspath(__file__), "--child", way, path, "--block", str(block), "--work", work]


@contextlib.contextmanager
def maybe_group(limit: int | None) -> Iterator[str | None]:
    if limit is None:
        yield None
        return
    import pytest

    from tests.realcg import child_group

    try:
        with child_group(limit) as group:
            yield group.path
    except pytest.skip.Exception as skipped:
        raise SystemExit(f"--cgroup: {skipped}") from None


def run_one(way: str, cache: str, path: str, block: int, work: str, limit: int | None) -> Run:
    (warm_cache if cache == "warm" else drop_cache)(path)
    with maybe_group(limit) as group:
        argv = argv_for(way, path, block, work)
        if group is not None:  # join the group, then become the command (as tests/realcg.py does)
            argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group, *argv]
        started = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, check=False)
        wall = time.perf_counter() - started
        group_peak = _group_peak(group)
    if proc.returncode != 0:
        return Run(way, cache, None, None, group_peak, None)
    if way == "cat":
        return Run(way, cache, wall, None, group_peak, None)
    result = json.loads(proc.stdout)
    return Run(way, cache, result["seconds"], result["peak_rss"], group_peak, result["sum"])


def _group_peak(group: str | None) -> int | None:
    if group is None:
        return None
    with open(os.path.join(group, "memory.max_usage_in_bytes")) as f:
        return int(f.read())


def best(runs: list[Run]) -> Run:
    """The fastest repetition's time with the highest peak seen: memory is judged by its worst run."""
    finished = [r for r in runs if r.seconds is not None]
    if not finished:
        return runs[0]
    fastest = min(finished, key=lambda r: r.seconds or 0.0)
    fastest.peak_rss = _highest([r.peak_rss for r in runs])
    fastest.group_peak = _highest([r.group_peak for r in runs])
    return fastest


def _highest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _mb(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / MiB:,.0f}"


def table(results: dict[tuple[str, str], Run], caches: tuple[str, ...], file_bytes: int, with_group: bool) -> str:
    header = ["way", "cache", "seconds", "GB/s", "x plain mmap", "peak RSS MB"] + (["group peak MB"] if with_group
                                                                                 else [])
    rows = [header]
    for cache in caches:
        plain = results[("plain mmap", cache)].seconds
        for way in WAYS:
            r = results[(way, cache)]
            if r.seconds is None:
                cells = [way, cache, "killed", "-", "-", _mb(r.peak_rss)]
            else:
                ratio = f"{plain / r.seconds:.2f}" if plain else "-"
                cells = [way, cache, f"{r.seconds:.2f}", f"{file_bytes / GiB / r.seconds:.2f}", ratio,
                         _mb(r.peak_rss)]
            if with_group:
                cells.append(_mb(r.group_peak))
            rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def verdicts(results: dict[tuple[str, str], Run], caches: tuple[str, ...], block: int) -> list[str]:
    targets = {"warm": ">= 0.95x", "cold": "> 1x"}
    peaks = [results[("memory.chunks", cache)].peak_rss for cache in caches]
    lines = [f"peak RSS of memory.chunks ({block:,}-row blocks): {_mb(_highest(peaks))} MB (target <= 100 MB)"]
    for cache in caches:
        chunks, plain = results[("memory.chunks", cache)].seconds, results[("plain mmap", cache)].seconds
        if chunks and plain:
            lines.append(f"{cache}: memory.chunks at {plain / chunks:.2f}x plain mmap (target {targets[cache]})")
    sums = {r.total for r in results.values() if r.total is not None}
    lines.append("every way got the same sum" if len(sums) == 1 else f"SUMS DIFFER: {sorted(sums)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("WAY", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=lambda s: int(s.replace("_", "")), default=100_000_000)
    parser.add_argument("--block", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--keep", action="store_true", help="keep the data file for the next run")
    parser.add_argument("--cgroup", help="also run each child in a v1 memory group with this limit, e.g. 1GiB")
    parser.add_argument("--cache", choices=("warm", "cold", "both"), default="both")
    parser.add_argument("--work", choices=sorted(WORK), default="sum", help="what each block is used for")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.block, args.work)
        return
    from apsi_memory.units import parse_size

    limit = parse_size(args.cgroup) if args.cgroup else None
    path = os.path.join(args.dir, f"apsi-rss-stream-{args.rows}.npy")
    make_file(path, args.rows)
    try:
        caches = ("warm", "cold") if args.cache == "both" else (args.cache,)
        runs: dict[tuple[str, str], list[Run]] = {}
        for _ in range(args.repeat):  # interleaved, so a noisy moment hits every way alike
            for cache in caches:
                for way in WAYS:
                    runs.setdefault((way, cache), []).append(run_one(way, cache, path, args.block, args.work, limit))
        results = {key: best(value) for key, value in runs.items()}
        print(f"\n{args.rows:,} rows x {COLS} float32 = {os.path.getsize(path) / GiB:.2f} GB, blocks of "
              f"{args.block:,} rows, {args.work} per block, best of {args.repeat}" + (f", in a {args.cgroup} v1 memory group" if limit else ""))
        print(table(results, caches, os.path.getsize(path), limit is not None))
        print("\n".join(verdicts(results, caches, args.block)))
    finally:
        if not args.keep:
            os.unlink(path)


if __name__ == "__main__":
    main()
