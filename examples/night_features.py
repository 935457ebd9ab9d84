"""Standardise a feature matrix larger than the RAM budget, compute its Gram matrix and keep both: the column
statistics with ``memory.reduce`` (one pass, all cores), the standardised matrix with ``memory.map(..., out=)``
(written once into a ``.npy`` that stays, named only once whole), the Gram matrix with ``memory.reduce(lambda b:
b.T @ b, ...)``.

    python examples/night_features.py --rows 400000 --columns 32 --budget-mb 16

writes ``night-raw.npy`` (the input, kept for the next run), ``night-standardized.npy`` and ``night-gram.npy`` in the
working folder, says how many bytes the process wrote for the output (its size, once: no spill file then a copy), and
checks against NumPy: sampled rows of the output against NumPy's ``(x - mean) / std`` on them,
and the Gram matrix against NumPy's ``x.T @ x`` of the memory-mapped output (its diagonal is the rows: every column
now has variance 1).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import apsi_memory as memory

RAW, OUT, GRAM = "night-raw.npy", "night-standardized.npy", "night-gram.npy"


def make_input(rows: int, columns: int) -> None:
    """Test data, block by block into a kept ``.npy`` (never all of it in RAM)."""
    raw = memory.array([rows, columns], "float32", path=RAW, overwrite=True)
    rng = np.random.default_rng(0)
    for first in range(0, rows, 100_000):
        stop = min(rows, first + 100_000)
        raw[first:stop] = rng.normal(loc=np.arange(columns), scale=1 + np.arange(columns) / 4,
                                     size=(stop - first, columns))
    memory.free(raw)  # unmaps it; the file stays


def written() -> int:
    """The bytes this process has sent to storage so far (``write_bytes`` of ``/proc/self/io``)."""
    with open("/proc/self/io", encoding="ascii") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("write_bytes:"))


def moments(block: np.ndarray) -> np.ndarray:
    """A block's count, column sums and sums of squares, in float64 (float32 sums lose digits over many rows)."""
    wide = block.astype(np.float64)
    return np.concatenate([[len(block)], wide.sum(axis=0), np.square(wide).sum(axis=0)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--columns", type=int, default=32)
    parser.add_argument("--budget-mb", type=float, default=16, help="RAM budget for big arrays (the default input "
                        "is larger)")
    parser.add_argument("--sample", type=int, default=4096, help="rows checked against NumPy")
    args = parser.parse_args()
    memory.budget(f"{args.budget_mb}MB")
    if not os.path.exists(RAW) or np.load(RAW, mmap_mode="r").shape != (args.rows, args.columns):
        make_input(args.rows, args.columns)
    n, columns = args.rows, args.columns
    started = time.perf_counter()
    total = memory.reduce(moments, RAW)
    mean = total[1:1 + columns] / n
    std = np.sqrt(total[1 + columns:] / n - mean ** 2)
    shift, scale = mean.astype(np.float32), std.astype(np.float32)
    before = written()
    out = memory.map(lambda block: (block - shift) / scale, RAW, out=OUT, overwrite=True)
    out_written = written() - before
    gram = memory.reduce(lambda block: block.T.astype(np.float64) @ block.astype(np.float64), OUT)
    np.save(GRAM, gram)
    print(f"standardised {n:,} rows x {columns} columns ({memory.fmt_size(out.nbytes)} through a "
          f"{memory.fmt_size(memory.budget().bytes)} budget) into {OUT} ({memory.fmt_size(out_written)} written for it), Gram "
          f"matrix {columns} x {columns} into {GRAM}, in {time.perf_counter() - started:.1f} s")

    rows = np.sort(np.random.default_rng(1).choice(n, size=min(args.sample, n), replace=False))
    raw = np.load(RAW, mmap_mode="r")
    sample_error = float(np.abs(np.load(OUT, mmap_mode="r")[rows] - (raw[rows] - shift) / scale).max())
    mapped = np.load(OUT, mmap_mode="r")  # NumPy's Gram of the file: page cache, no copy in RAM
    gram_error = float(np.abs(gram - mapped.T.astype(np.float64) @ mapped.astype(np.float64)).max() / n)
    diagonal = float(np.abs(np.diag(gram) / n - 1).max())
    print(f"check against NumPy: {len(rows):,} sampled rows differ by {sample_error:.1e} at most, the Gram matrix "
          f"by {gram_error:.1e} of the rows, its diagonal / rows is 1 to {diagonal:.1e}")
    memory.free(out)  # unmaps it; the kept file stays


if __name__ == "__main__":
    main()
