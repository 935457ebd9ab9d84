"""Several data-loading workers read one dataset: the dataset is ONE ``.npy`` that ``memory.array(..., path=)``
made, which every worker maps read-only, instead of each worker caching its own copy (4 workers x a 600 MB cache
is 2.4 GB of RAM, and the kernel OOM-kills the job in a 2 GB container).

    python examples/night_shared_cache.py --workers 4 --rows 200000 --columns 64

prints the workers' checksum (equal to the plain sum over the file) and what each worker's own memory grew by while
it read its share (under 1 MB: the file's pages are page cache that the kernel shares between the workers and can
drop, where a private copy is the share). With
``--copy`` every worker caches its own copy of the rows it reads, the plain way, for comparison; with ``--torch``
(PyTorch installed) a ``torch.utils.data.DataLoader`` with ``--workers`` workers reads the same file.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from collections.abc import Iterator

import numpy as np

import apsi_memory as memory

DATASET = "night-dataset.npy"


def own_memory() -> int:
    """This process's anonymous RAM (``RssAnon``): what a private copy takes, unlike a file's shared pages."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(task: tuple[str, int, int, bool]) -> tuple[float, int]:
    """One worker: reads rows ``start:stop`` of the dataset in batches; returns their sum and how much its own
    memory grew meanwhile."""
    path, start, stop, copy = task
    before = own_memory()
    data = np.load(path, mmap_mode="r")  # a read-only map: the pages are the file's, shared by every worker
    if copy:
        data = np.array(data[start:stop])  # the plain way: a private cache of the rows this worker reads
        start, stop = 0, stop - start
    total = sum(float(batch.sum(dtype=np.float64)) for batch in batches(data, start, stop))
    return total, max(0, own_memory() - before)


def batches(data: np.ndarray, start: int, stop: int, rows: int = 4096) -> Iterator[np.ndarray]:
    for first in range(start, stop, rows):
        yield data[first:min(stop, first + rows)]


def make_dataset(rows: int, columns: int) -> np.ndarray:
    """The dataset, written once into a kept ``.npy`` (never all of it in RAM: the array maps the file)."""
    data = memory.array([rows, columns], "float32", path=DATASET, overwrite=True)
    rng = np.random.default_rng(0)
    for first in range(0, rows, 65536):
        data[first:first + 65536] = rng.random((min(rows, first + 65536) - first, columns), dtype=np.float32)
    return data


class RowsOfFile:
    """A map-style dataset (what ``DataLoader`` asks of one: ``len`` and ``[index]``) over the one file: each
    worker opens its read-only map on first use, after the fork or spawn."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: np.ndarray | None = None

    def __len__(self) -> int:
        return int(np.load(self.path, mmap_mode="r").shape[0])

    def __getitem__(self, index: int) -> np.ndarray:
        if self.data is None:
            self.data = np.load(self.path, mmap_mode="r")
        return np.array(self.data[index], dtype=np.float64)


def with_torch(path: str, workers: int) -> float:
    """The same read through a PyTorch ``DataLoader`` with ``workers`` worker processes (PyTorch only if
    installed)."""
    from torch.utils.data import DataLoader  # type: ignore[import-not-found, unused-ignore]  # optional

    loader = DataLoader(RowsOfFile(path), batch_size=4096, num_workers=workers)
    return float(sum(float(batch.sum()) for batch in loader))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", type=int, default=64)
    parser.add_argument("--copy", action="store_true", help="each worker caches its own copy (the plain way)")
    parser.add_argument("--torch", action="store_true", help="read through a torch DataLoader (PyTorch needed)")
    args = parser.parse_args()
    data = make_dataset(args.rows, args.columns)
    expected = float(data.sum(dtype=np.float64))  # the plain computation, in this process
    path = os.path.abspath(DATASET)
    if args.torch:
        total = with_torch(path, args.workers)
        print(f"{args.workers} DataLoader workers read {memory.fmt_size(data.nbytes)} from one {DATASET}: checksum "
              f"{total:.6f}, {'equal to' if np.isclose(total, expected, rtol=1e-9) else 'NOT'} the plain sum")
        return
    share = -(-args.rows // args.workers)
    tasks = [(path, i * share, min(args.rows, (i + 1) * share), args.copy) for i in range(args.workers)]
    # one task a process: a process that took a second task would reuse the first one's freed RAM, and its own
    # memory would seem not to grow (a CI run at load 14 showed 4 KB for a private copy)
    with multiprocessing.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
        results = pool.map(worker, tasks)
    total = sum(result[0] for result in results)
    equal = "equal to" if np.isclose(total, expected, rtol=1e-9) else "NOT equal to"
    print(f"{args.workers} workers read {memory.fmt_size(data.nbytes)} from one {DATASET}: checksum {total:.6f}, "
          f"{equal} the plain sum")
    grown = ", ".join(memory.fmt_size(result[1]) for result in results)
    kind = "a private copy each" if args.copy else "the file's pages are page cache they share"
    print(f"each worker's own RAM grew by {grown} while it read its {memory.fmt_size(data.nbytes / args.workers)} ({kind})")


if __name__ == "__main__":
    main()
