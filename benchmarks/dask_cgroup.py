"""Stock ``LocalCluster`` against ``apsi_memory.dask.cluster()`` inside a 1 GiB cgroup v1 memory group (root).

    sudo .venv/bin/python -m benchmarks.dask_cgroup            # prints the table (two runs, 120 s limit each)
    sudo .venv/bin/python -m benchmarks.dask_cgroup --workloads sum rechunk --variants stock apsi stock-limit \
        --group-mib 1024 --total-mib 1536 --limit 60 [--namespace]  # docs/guides/dask-in-containers.md

Workloads: ``persist`` (below), ``sum`` (``(x * 2 + 1).sum()`` of ``--total-mib`` in dask's automatic chunks,
``array.chunk-size``) and ``rechunk`` (a square array of ``--total-mib`` from row chunks to column chunks with
dask's default rechunk method, summed). Variants: ``stock`` (``LocalCluster``), ``apsi`` (``cluster()``), and
``stock-limit`` (``LocalCluster`` with ``cluster()``'s worker limit and nothing else). ``--namespace``: the
cluster runs in a new cgroup and mount namespace whose ``/sys/fs/cgroup/memory`` is the group (as in a Docker
container), so stock dask reads the group's limit itself.

Each run: a fresh child group of 1 GiB under this process's own v1 memory group, 2 workers × 1 thread, 3 GiB of
``x * 2 + 1`` persisted in 16 MiB chunks. Reported: the worker limit the scheduler registered, the kernel's OOM
kills in the group (its ``memory.oom_control`` counter), worker restarts (worker addresses seen beyond the first
two), failed tasks, whether it finished, and the wall time; a run that did not finish says why: ``KilledWorker
after N s`` (dask gave up on a task whose workers kept dying), another task error, the client's death, or the
time limit. The group is always removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from tests.realcg import remove_group

TOTAL_BYTES = 3 << 30
CHUNK_BYTES = 16 << 20
GROUP_BYTES = 1 << 30
WORKERS = 2


def run_variant(variant: str, limit_s: float, workload: str = "persist", total: int = TOTAL_BYTES) -> dict[str, Any]:
    """Inside the group: start the cluster, run the workload, watch until done or the time limit."""
    import dask
    from distributed import LocalCluster

    from apsi_memory.dask import cluster, worker_memory_limit

    with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
        if variant == "apsi":
            made = cluster(n_workers=WORKERS, dashboard_address=":0")
        else:
            extra = {"memory_limit": worker_memory_limit(WORKERS)} if variant == "stock-limit" else {}
            made = LocalCluster(n_workers=WORKERS, threads_per_worker=1, dashboard_address=":0", **extra)
    with made, made.get_client() as client:
        limit = min(w["memory_limit"] for w in client.scheduler_info()["workers"].values())
        print(json.dumps({"variant": variant, "worker_limit_bytes": limit}), flush=True)  # in case we are killed
        seen = set(client.scheduler_info()["workers"])
        futures = client.futures_of(_workload(workload, total).persist())
        watched = watch(client, futures, limit_s)
        seen |= watched.pop("seen")
        return {"variant": variant, "worker_limit_bytes": limit, "restarts": len(seen) - WORKERS, **watched}


def watch(client: Any, futures: list[Any], limit_s: float) -> dict[str, Any]:
    """Until every future is done, one has failed (the run is lost: ``error`` names how, ``KilledWorker`` when
    dask gave up on a task whose workers kept dying), or ``limit_s`` has passed; and the workers seen meanwhile."""
    seen: set[str] = set()
    start = time.monotonic()
    error = None
    while time.monotonic() - start < limit_s and any(f.status == "pending" for f in futures):
        with contextlib.suppress(Exception):  # the scheduler may be busy or its worker gone
            seen |= set(client.scheduler_info()["workers"])
        error = failure(futures)
        if error is not None:
            break
        time.sleep(0.5)
    wall = time.monotonic() - start
    statuses = [f.status for f in futures]
    return {"failed_tasks": statuses.count("error"), "finished": statuses.count("finished") == len(futures),
            "error": error or failure(futures), "wall_s": round(wall, 1), "seen": seen}


def failure(futures: list[Any]) -> str | None:
    """How the first failed future failed: ``KilledWorker`` (distributed's: the workers running it died
    ``allowed-failures`` times, here the kernel's OOM killer or the nanny at 95 %), else its error's class name."""
    from distributed import KilledWorker

    for f in futures:
        if f.status == "error":
            exc = f.exception()
            return "KilledWorker" if isinstance(exc, KilledWorker) else f"task error {type(exc).__name__}"
    return None


def _workload(name: str, total: int) -> Any:
    import dask.array as da

    if name == "persist":
        x = da.ones(total // 8, chunks=CHUNK_BYTES // 8)
        return x * 2 + 1
    if name == "sum":
        return (da.ones(total // 8) * 2 + 1).sum()
    side = int((total // 8) ** 0.5)
    x = da.ones((side, side), chunks=("auto", side))  # row chunks, dask's automatic size
    return x.rechunk(chunks=(side, "auto")).sum()


def own_v1_memory_group() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
    raise SystemExit("no cgroup v1 memory controller for this process")


def oom_kills(group: str) -> int:
    with open(os.path.join(group, "memory.oom_control")) as f:
        counts = dict(line.split() for line in f if line.strip())
    return int(counts.get("oom_kill", 0))


def in_group(variant: str, limit_s: float, workload: str = "persist", group_bytes: int = GROUP_BYTES,
             total: int = TOTAL_BYTES, namespace: bool = False) -> dict[str, Any]:
    group = os.path.join(own_v1_memory_group(), f"apsi-i22dask-bench-{os.getpid()}-{variant}-{workload}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(group_bytes))
        argv = [sys.executable, "-m", "benchmarks.dask_cgroup", "--variant", variant, "--limit", str(limit_s),
                "--workloads", workload, "--total-mib", str(total >> 20)]
        if namespace:  # the group becomes / of a new cgroup namespace, and is mounted where the container sees it
            argv = ["unshare", "--cgroup", "--mount", "/bin/sh", "-c",
                    f'mount --bind "{group}" /sys/fs/cgroup/memory && exec "$@"', "sh", *argv]
        wrapper = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group, *argv]
        started = time.monotonic()
        done = subprocess.run(wrapper, capture_output=True, text=True, timeout=limit_s + 120, check=False)
        ended = time.monotonic() - started
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result: dict[str, Any] = {"variant": variant, "finished": False, "workload": workload,
                                  "group": f"{group_bytes >> 20} MiB" + (" (namespace)" if namespace else "")}
        for line in lines:
            result.update(json.loads(line))
        if len(lines) < 2:  # the client itself was killed, or failed: say how
            result["client_exit"], result["wall_s"] = done.returncode, round(ended, 1)
            print(f"{variant}: exit {done.returncode}\n{done.stderr[-3000:]}", file=sys.stderr)
        result["oom_kills"] = oom_kills(group)
        return result
    finally:
        remove_group(group)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| group | workload | cluster | worker limit | OOM kills | worker restarts | failed tasks | finished "
            "| wall |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        limit = row.get("worker_limit_bytes")
        lines.append(f"| {row.get('group', '-')} | {row.get('workload', 'persist')} | {row['variant']} | "
                     f"{'-' if limit is None else f'{limit / 2**30:.2f} GiB'} | "
                     f"{row['oom_kills']} | {row.get('restarts', '-')} | {row.get('failed_tasks', '-')} | "
                     f"{_finished(row)} | {row.get('wall_s', '-')} s |")
    return "\n".join(lines)


def _finished(row: dict[str, Any]) -> str:
    if row["finished"]:
        return "yes"
    if "client_exit" in row:
        return f"no: the client process died (exit {row['client_exit']})"
    if row.get("error"):
        return f"no: {row['error']} after {row['wall_s']} s"
    return "no: time limit"


VARIANTS = ("stock", "apsi", "stock-limit")
WORKLOADS = ("persist", "sum", "rechunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds each run may take")
    parser.add_argument("--variants", nargs="+", default=["stock", "apsi"], choices=VARIANTS)
    parser.add_argument("--workloads", nargs="+", default=["persist"], choices=WORKLOADS)
    parser.add_argument("--group-mib", type=int, default=GROUP_BYTES >> 20)
    parser.add_argument("--total-mib", type=int, default=TOTAL_BYTES >> 20)
    parser.add_argument("--namespace", action="store_true", help="run in a cgroup + mount namespace (a container)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.limit, args.workloads[0], args.total_mib << 20)), flush=True)
        return
    rows = []
    for workload in args.workloads:
        for variant in args.variants:
            rows.append(in_group(variant, args.limit, workload, args.group_mib << 20, args.total_mib << 20,
                                 args.namespace))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
