"""Compute embeddings into a ``memory.store`` in batches (``set_many``: one journal append a batch) so that a job
killed half-way loses nothing it finished: the rerun asks the store which ids it already holds (``in``) and
computes only the missing ones, then reads everything back with ``get_many``.

    python examples/night_embeddings.py --count 20000 --stop-after 10000

stops itself after 10,000 embeddings with ``os._exit`` (no cleanup, as a kill), then

    python examples/night_embeddings.py --count 20000

computes the other 10,000 and reads 20,000 back. The store is ``night-embeddings`` under ``~/.apsi/store``;
``--fresh`` empties it first.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import apsi_memory as memory


def embed(ids: list[int], dim: int) -> np.ndarray:
    """Stand-in for a model: each id's vector is a function of the id alone (a rerun computes the same), passed
    through a small random network and normalised."""
    tokens = np.stack([np.random.default_rng(i).normal(size=dim) for i in ids])
    weights = np.random.default_rng(-1 % 2**32).normal(scale=dim ** -0.5, size=(2, dim, dim))
    out = np.tanh(np.tanh(tokens @ weights[0]) @ weights[1]).astype(np.float32)
    normalised: np.ndarray = out / np.linalg.norm(out, axis=1, keepdims=True)
    return normalised


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="embeddings the job needs (ids 0 .. count-1)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1000, help="embeddings computed and stored together")
    parser.add_argument("--stop-after", type=int, help="end the process (os._exit) after computing this many")
    parser.add_argument("--fresh", action="store_true", help="empty the store first")
    args = parser.parse_args()
    store = memory.store("night-embeddings", ram_mb=64, disk_gb=1)
    if args.fresh:
        store.clear()
    missing = [i for i in range(args.count) if i not in store]
    computed = 0
    for first in range(0, len(missing), args.batch):
        ids = missing[first:first + args.batch]
        store.set_many(zip(ids, embed(ids, args.dim)))
        computed += len(ids)
        if args.stop_after is not None and computed >= args.stop_after:
            print(f"computed {computed:,} of the {len(missing):,} missing, then stopped (os._exit, as a kill)",
                  flush=True)
            os._exit(1)  # no store.close(), no atexit: what a kill leaves
    values = store.get_many(range(args.count))
    found = [i for i, value in enumerate(values) if value is not None]
    check = sorted(set(np.random.default_rng(2).choice(args.count, size=min(100, args.count), replace=False)))
    right = sum(bool(np.array_equal(values[i], embed([i], args.dim)[0])) for i in check if values[i] is not None)
    print(f"computed {computed:,}, read back {len(found):,} of {args.count:,} "
          f"({args.count - len(missing):,} were in the store already); {right} of {len(check)} sampled match a "
          "recomputation")
    store.close()


if __name__ == "__main__":
    main()
