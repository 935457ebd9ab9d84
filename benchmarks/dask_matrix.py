"""Issue 30's outside matrix: stock ``LocalCluster`` against ``apsi_memory.dask.cluster()`` in fresh real cgroup v1
memory groups (root), 13 workloads × group size × chunk mode, each cell run twice.

    sudo .venv/bin/python -m benchmarks.dask_matrix --out /var/tmp/matrix/run.jsonl   # the whole matrix
    sudo .venv/bin/python -m benchmarks.dask_matrix --workloads sum --group-mib 1024 --chunks default \
        --variants apsi --repeats 1 --out /var/tmp/matrix/one.jsonl                   # one cell
    .venv/bin/python -m benchmarks.dask_matrix --summary /var/tmp/matrix/run.jsonl    # its table

Each run: a fresh child group of ``--group-mib`` under this process's own v1 memory group (1 or 2 GiB), a client
process in it that makes the cluster (2 workers × 1 thread unless the workload says otherwise) and runs the
workload on data of 1.5× the group, watched until it finishes, fails or reaches the time limit; reported as in
``benchmarks.dask_cgroup`` (the kernel's OOM kills in the group, worker restarts, KilledWorker or time limit), and
the group is always removed. Chunk modes: ``default``, the data made with explicit 128 MiB chunks (dask's default
``array.chunk-size``) *before* the cluster, as a user who chunked by hand would; ``library``, the data made after
the cluster with dask's ``"auto"`` chunks, which follow ``cluster()``'s settings (stock: dask's 128 MiB).

Workloads: ``sum`` (``(x * 2 + 1).sum()``, a stream), ``rechunk-p2p`` and ``rechunk-tasks`` (a square array from
row to column chunks by that method, summed), ``persist`` (``x * 2 + 1`` persisted: it must spill), ``threads2``
(``sum``, 2 threads a worker), ``workers4`` (``sum``, 4 workers), ``big-limit`` (``sum``, each worker told the
whole group as its ``memory_limit``), ``neighbour`` (``sum`` beside a process of the group growing to 40 % of
it), ``stranger600`` and ``stranger400`` (``sum`` beside a process holding 600 or 400 MiB from before the cluster
to the end), ``client-holds`` (``sum``, the client process holding 25 % of the group), ``store`` (``map_blocks``
writing every block to disk), ``scale`` (``persist``, then ``scale(4)`` while it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.dask_cgroup import oom_kills, own_v1_memory_group, watch
from tests.realcg import remove_group

DEFAULT_CHUNK = 128 << 20  # dask's default array.chunk-size
DATA_SHARE = 1.5  # the data, against the group
OUT_DIR = Path("/var/tmp/matrix")


@dataclass(frozen=True)
class Workload:
    kind: str = "sum"  # sum, rechunk, persist, store
    method: str | None = None  # the rechunk method
    workers: int = 2
    threads: int = 1
    big_limit: bool = False  # each worker's memory_limit is the whole group
    stranger_mib: int = 0  # a process holding this much from before the cluster to the end
    neighbour: bool = False  # a process growing to NEIGHBOUR_SHARE of the group
    client_share: float = 0.0  # the client process holds this share of the group
    scale_to: int = 0  # scale(n) once the work is submitted


WORKLOADS = {
    "sum": Workload(), "rechunk-p2p": Workload("rechunk", "p2p"), "rechunk-tasks": Workload("rechunk", "tasks"),
    "persist": Workload("persist"), "threads2": Workload(threads=2), "workers4": Workload(workers=4),
    "big-limit": Workload(big_limit=True), "neighbour": Workload(neighbour=True),
    "stranger600": Workload(stranger_mib=600), "stranger400": Workload(stranger_mib=400),
    "client-holds": Workload(client_share=0.25), "store": Workload("store"), "scale": Workload("persist", scale_to=4),
}
NEIGHBOUR_SHARE = 0.4
GROW_S = 8.0  # the neighbour reaches its size in this many seconds, in steps


def build(work: Workload, total: int, chunk: int | None, store_dir: Path) -> tuple[Any, int]:
    """The workload's collection over ``total`` bytes: ``chunk`` bytes a chunk, or dask's ``"auto"`` if None; and
    the bytes of its input chunks."""
    import dask.array as da

    if work.kind == "rechunk":
        side = int((total // 8) ** 0.5)
        x = da.ones((side, side), chunks=(max(1, chunk // (8 * side)) if chunk else "auto", side))
        rows = x.chunks[0][0]
        return x.rechunk((side, rows), method=work.method).sum(), rows * side * 8
    x = da.ones(total // 8, chunks=chunk // 8 if chunk else "auto")
    y, size = x * 2 + 1, x.chunks[0][0] * 8
    if work.kind == "persist":
        return y, size
    if work.kind == "store":
        return y.map_blocks(_save_block, str(store_dir), dtype="i8", chunks=(1,)).sum(), size
    return y.sum(), size


def _save_block(block: Any, where: str, block_info: Any = None) -> Any:
    """Writes one block to ``where`` (the page cache it dirties is the group's too) and returns its size."""
    import numpy as np

    np.save(os.path.join(where, f"{block_info[0]['chunk-location'][0]}.npy"), block)
    return np.array([block.nbytes])


def make_cluster(variant: str, work: Workload, group_bytes: int, run_dir: Path) -> Any:
    from distributed import LocalCluster

    from apsi_memory.dask import cluster

    kw: dict[str, Any] = {"n_workers": work.workers, "threads_per_worker": work.threads, "dashboard_address": ":0",
                          "local_directory": str(run_dir)}  # spill and p2p files: removed with the run
    if work.big_limit:
        kw["memory_limit"] = group_bytes
    return cluster(**kw) if variant == "apsi" else LocalCluster(**kw)


def start_holder(work: Workload, group_bytes: int) -> subprocess.Popen[bytes] | None:
    """The stranger (its memory held before this returns) or the growing neighbour, in this process's group."""
    if work.stranger_mib:
        code = (f"import numpy as np, sys, time; a = np.ones({work.stranger_mib << 20} // 8); print(1, flush=True)\n"
                "while True: time.sleep(1)")
    elif work.neighbour:
        step, steps = 16 << 20, int(group_bytes * NEIGHBOUR_SHARE) // (16 << 20)
        code = (f"import numpy as np, time; print(1, flush=True); held = []\nfor _ in range({steps}):\n"
                f"    held.append(np.ones({step} // 8)); time.sleep({GROW_S / steps})\nwhile True: time.sleep(1)")
    else:
        return None
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert holder.stdout is not None
    holder.stdout.readline()
    return holder


def run_cell(variant: str, name: str, chunks: str, group_bytes: int, limit_s: float) -> dict[str, Any]:
    """Inside the group: the holders, the data (before the cluster in ``default`` mode), the cluster, the run."""
    import dask
    import distributed  # noqa: F401  # its config defaults must be in before the set below, which undoes all new keys
    import numpy as np

    work = WORKLOADS[name]
    total = int(group_bytes * DATA_SHARE)
    held = np.ones(int(group_bytes * work.client_share) // 8) if work.client_share else None
    store_dir = OUT_DIR / f"store-{os.getpid()}"
    store_dir.mkdir(parents=True, exist_ok=True)
    holder = start_holder(work, group_bytes)
    try:
        made_before = build(work, total, DEFAULT_CHUNK, store_dir) if chunks == "default" else None
        with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
            made = make_cluster(variant, work, group_bytes, store_dir)
        with made, made.get_client() as client:
            workers = client.scheduler_info()["workers"]
            limit = min(w["memory_limit"] for w in workers.values())
            data, chunk = made_before if made_before is not None else build(work, total, None, store_dir)
            print(json.dumps({"worker_limit_bytes": limit, "chunk_bytes": chunk}), flush=True)
            futures = client.futures_of(data.persist())
            if work.scale_to:
                made.scale(work.scale_to)
            watched = watch(client, futures, limit_s)
            seen = watched.pop("seen") | set(workers)
            expected = max(work.workers, work.scale_to)
            alive = None if holder is None else holder.poll() is None  # the stranger held its memory to the end
            restarts = max(0, len(seen) - expected)  # a run over before scale's workers came sees fewer
            return {"worker_limit_bytes": limit, "chunk_bytes": chunk, "restarts": restarts,
                    "holder_alive": alive, **watched}
    finally:
        if holder is not None:
            holder.kill()
        shutil.rmtree(store_dir, ignore_errors=True)
        del held


def in_group(cell: dict[str, Any], limit_s: float, log_dir: Path) -> dict[str, Any]:
    """One run of ``cell`` in a fresh group: the child's report, the group's OOM kills; the group removed."""
    group = os.path.join(own_v1_memory_group(), f"apsi-matrix-{os.getpid()}-{cell['run']}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(cell["group_mib"] << 20))
        argv = [sys.executable, "-m", "benchmarks.dask_matrix", "--child", cell["variant"], "--workloads",
                cell["workload"], "--chunks", cell["chunks"], "--group-mib", str(cell["group_mib"]),
                "--limit", str(limit_s)]
        wrapper = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group, *argv]
        started, code = time.monotonic(), "timeout"
        try:
            done = subprocess.run(wrapper, capture_output=True, text=True, timeout=limit_s + 90, check=False)
            out, err, code = done.stdout, done.stderr, str(done.returncode)
        except subprocess.TimeoutExpired as exc:
            out, err = _text(exc.stdout), _text(exc.stderr)
        result: dict[str, Any] = {**cell, "finished": False}
        lines = [line for line in out.splitlines() if line.startswith("{")]
        for line in lines:
            result.update(json.loads(line))
        if len(lines) < 2:  # the client itself was killed, or failed
            result["client_exit"], result["wall_s"] = code, round(time.monotonic() - started, 1)
        result["oom_kills"] = oom_kills(group)
        (log_dir / f"{cell['run']}.log").write_text(err if len(err) < 60000 else f"{err[:20000]}\n...\n{err[-40000:]}")
        return result
    finally:
        remove_group(group)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs, in order: each cell's variants side by side, ``--repeats`` times (stock ones ``--stock-repeats``);
    with ``--apsi-default-first``, one pass of the apsi × default cells first (issue 30 saw those fail)."""
    runs = []
    for repeat in range(max(args.repeats, args.stock_repeats)):
        for chunks in args.chunks:
            for group in args.group_mib:
                for workload in args.workloads:
                    for variant in args.variants:
                        if repeat < (args.stock_repeats if variant == "stock" else args.repeats):
                            runs.append({"variant": variant, "workload": workload, "chunks": chunks,
                                         "group_mib": group, "repeat": repeat})
    first = [r for r in runs if args.apsi_default_first and r["repeat"] == 0 and r["variant"] == "apsi"
             and r["chunks"] == "default"]
    ordered = first + [r for r in runs if r not in first]
    return [{**r, "run": i} for i, r in enumerate(ordered)]


def summary(rows: list[dict[str, Any]]) -> str:
    """Per cell: finished n/m, OOM kills, restarts, how the others ended, wall (median of the finished)."""
    by_cell: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_cell[(row["group_mib"], row["chunks"], row["workload"], row["variant"])].append(row)
    head = ("| group | chunks | workload | cluster | worker limit | chunk | finished | OOM kills | restarts "
            "| holder killed | not finished | wall (s) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (group, chunks, workload, variant), runs in sorted(by_cell.items()):
        done = [r for r in runs if r["finished"]]
        limit, chunk = runs[0].get("worker_limit_bytes"), runs[0].get("chunk_bytes")
        walls = sorted(r["wall_s"] for r in runs if "wall_s" in r)
        lines.append(f"| {group} MiB | {chunks} | {workload} | {variant} | {_mib(limit)} | {_mib(chunk)} | "
                     f"{len(done)}/{len(runs)} | {sum(r['oom_kills'] for r in runs)} | "
                     f"{sum(r.get('restarts', 0) for r in runs)} | "
                     f"{sum(r.get('holder_alive') is False for r in runs) or '-'} | {_ends(runs)} | "
                     f"{', '.join(str(w) for w in walls)} |")
    return "\n".join(lines)


def side_by_side(rows: list[dict[str, Any]]) -> str:
    """One line per cell, stock and ``cluster()`` side by side: finished n/m, OOM kills, restarts, walls."""
    by_cell: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_cell[(row["group_mib"], row["chunks"], row["workload"])][row["variant"]].append(row)
    lines = ["| group | chunks | workload | stock | cluster() |", "|---|---|---|---|---|"]
    for (group, chunks, workload), variants in sorted(by_cell.items()):
        lines.append(f"| {group >> 10} GiB | {chunks} | {workload} | {_brief(variants.get('stock', []))} | "
                     f"{_brief(variants.get('apsi', []))} |")
    return "\n".join(lines)


def _brief(runs: list[dict[str, Any]]) -> str:
    """``2/2, 0 OOM, 0 restarts, 3.1-4.0 s`` (and how the others ended, and a stranger the kernel killed)."""
    if not runs:
        return "-"
    walls = sorted(r["wall_s"] for r in runs if "wall_s" in r)
    text = (f"{sum(r['finished'] for r in runs)}/{len(runs)}, {sum(r['oom_kills'] for r in runs)} OOM, "
            f"{sum(max(0, r.get('restarts', 0)) for r in runs)} restarts, "
            f"{walls[0] if walls[0] == walls[-1] else f'{walls[0]}-{walls[-1]}'} s")
    killed = sum(r.get("holder_alive") is False for r in runs)
    ends = _ends(runs)
    return text + (f", {killed} stranger killed" if killed else "") + ("" if ends == "-" else f" ({ends})")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def _ends(runs: list[dict[str, Any]]) -> str:
    ends = []
    for row in runs:
        if row["finished"]:
            continue
        if "client_exit" in row:
            ends.append(f"client died ({row['client_exit']})")
        else:
            ends.append(str(row.get("error") or "time limit"))
    return ", ".join(ends) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("stock", "apsi"), help=argparse.SUPPRESS)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--group-mib", nargs="+", type=int, default=[1024, 2048])
    parser.add_argument("--chunks", nargs="+", default=["default", "library"], choices=("default", "library"))
    parser.add_argument("--variants", nargs="+", default=["apsi", "stock"], choices=("stock", "apsi"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stock-repeats", type=int, default=2)
    parser.add_argument("--apsi-default-first", action="store_true")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds each run may take")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "matrix.jsonl")
    parser.add_argument("--summary", type=Path, nargs="+", help="print the table of JSON lines files and exit")
    parser.add_argument("--side-by-side", action="store_true", help="--summary: one line a cell, stock beside apsi")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_cell(args.child, args.workloads[0], args.chunks[0], args.group_mib[0] << 20,
                                  args.limit)), flush=True)
        return
    if args.summary:
        rows = [json.loads(line) for path in args.summary for line in path.read_text().splitlines() if line.strip()]
        print(side_by_side(rows) if args.side_by_side else summary(rows))
        return
    if any(g > 2048 for g in args.group_mib):
        raise SystemExit("--group-mib: at most 2048 here")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # the group's removal runs on kill too
    log_dir = args.out.with_suffix(".logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    for cell in cells(args):
        row = in_group(cell, args.limit, log_dir)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
