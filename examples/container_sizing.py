"""Size a job to the container it runs in: how many worker processes, and how big a batch each, from the memory
this process really has (its cgroup limit, not the host's RAM).

    python examples/container_sizing.py --per-worker-mb 900 --row-bytes 4096
    python examples/container_sizing.py --json       # for a launcher script

Run it inside ``docker run -m 4g`` and outside: the numbers follow the limit, where ``os.cpu_count()`` and
``/proc/meminfo`` would show the whole host.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import apsi_memory as memory

MiB = 1 << 20


def plan(per_worker_bytes: int, row_bytes: int, headroom: float) -> dict[str, Any]:
    """Workers: as many as there are cores, but no more than the free memory (less ``headroom``) holds. Batch:
    the rows one worker's share of the budget holds."""
    limits = memory.limits()
    usable_now = int(limits.free_bytes * (1 - headroom))
    workers = max(1, min(memory.cores(), usable_now // per_worker_bytes))
    batch_rows = max(1, limits.budget_bytes // workers // row_bytes)
    return {"source": limits.source, "usable_bytes": limits.usable_bytes, "free_bytes": limits.free_bytes,
            "budget_bytes": limits.budget_bytes, "cores": memory.cores(), "workers": workers,
            "batch_rows": batch_rows, "level": str(memory.pressure().level)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-worker-mb", type=float, default=1024, help="memory one worker needs (MB)")
    parser.add_argument("--row-bytes", type=int, default=4096, help="bytes of one row of input")
    parser.add_argument("--headroom", type=float, default=0.2, help="share of free memory to leave alone")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = plan(int(args.per_worker_mb * MiB), args.row_bytes, args.headroom)
    if args.json:
        print(json.dumps(result))
        return
    print(memory.limits())
    print(f"{result['workers']} workers (of {result['cores']} cores), {result['batch_rows']:,} rows per batch; "
          f"pressure {result['level']}")


if __name__ == "__main__":
    main()
