"""An out-of-core feature pipeline: a raw ``.npy`` larger than the RAM budget is standardised column by column
(``memory.chunks`` for the statistics, ``memory.map`` for the transform, whose output spills to the SSD by itself),
and the per-column statistics are kept in a ``memory.store`` so a second run skips the first pass.

    python examples/feature_pipeline.py                                      # 122 MB through a 64 MB budget
    python examples/feature_pipeline.py --rows 20000000 --budget-mb 512     # a 1.2 GB input

Without ``--input`` it writes test data to ``raw_features-<rows>x<columns>.npy`` in the working folder (kept for
the next run: delete it when done). With ``--input`` it reads that file, and makes it only if it is not there.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import apsi_memory as memory


def make_input(path: str, rows: int, columns: int) -> None:
    """Write ``rows`` x ``columns`` float32 of test data block by block (never all of it in RAM)."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype="float32", shape=(rows, columns))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 1_000_000):
        stop = min(rows, start + 1_000_000)
        out[start:stop] = rng.normal(loc=np.arange(columns), scale=2.0, size=(stop - start, columns))
    out.flush()
    del out


def column_stats(path: str, cache: memory.Store) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of each column in one streaming pass, kept in the store under the file's
    identity (an edited input is a new key)."""
    info = os.stat(path)
    key = f"stats:{os.path.abspath(path)}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
    kept = cache.get(key)
    if kept is not None:
        print("column statistics: from the store")
        return kept[0], kept[1]
    columns = np.load(path, mmap_mode="r").shape[1]  # reads the header only
    count, total, squares = 0, np.zeros(columns), np.zeros(columns)
    for block in memory.chunks(path, rows=500_000):
        count += len(block)
        total += block.sum(axis=0, dtype=np.float64)
        squares += np.square(block, dtype=np.float64).sum(axis=0)
    mean = total / count
    std = np.sqrt(squares / count - mean ** 2)
    cache.set(key, np.stack([mean, std]))
    print("column statistics: one pass over the file")
    return mean, std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="rows of test data to make (default 2,000,000)")
    parser.add_argument("--columns", type=int, help="columns of test data to make (default 16)")
    parser.add_argument("--budget-mb", type=float, default=64, help="RAM budget for big arrays (default 64; the "
                        "default input is larger, so the output spills)")
    parser.add_argument("--input", help="a 2-d float .npy to standardise (default: test data of --rows x --columns)")
    args = parser.parse_args()
    memory.budget(f"{args.budget_mb}MB")
    rows, columns = args.rows or 2_000_000, args.columns or 16
    path = args.input or f"raw_features-{rows}x{columns}.npy"
    if not os.path.exists(path):
        make_input(path, rows, columns)
    shape = np.load(path, mmap_mode="r").shape  # reads the header only
    asked = (args.rows or shape[0], args.columns or shape[1])
    if args.input and asked != shape:  # never overwrite a file the user named, and never ignore what was asked
        parser.error(f"{path} holds {shape[0]:,} rows x {shape[1]} columns, not {asked[0]:,} x {asked[1]}: "
                     "leave out --rows/--columns to use it, or name another --input")
    print(f"input {path}: {shape[0]:,} rows x {shape[1]} columns")
    cache = memory.store("feature-pipeline", ram_mb=16, disk_gb=1)
    mean, std = column_stats(path, cache)
    scaled = memory.map(lambda block: (block - mean.astype("float32")) / std.astype("float32"), path,
                        rows=500_000)
    print(f"standardised {scaled.shape[0]:,} rows x {scaled.shape[1]} columns")
    print(memory.report()[-1])  # where the output lives, and why
    print(f"column means after: {np.abs(scaled[:100_000].mean(axis=0)).max():.3f} at most (was up to {mean.max():.1f})")
    memory.free(scaled)


if __name__ == "__main__":
    main()
