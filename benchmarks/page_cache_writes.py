"""What writing 1 MiB costs the kernel here, whoever writes it: the floor under a 1 MiB ``store.set``.

    .venv/bin/python benchmarks/page_cache_writes.py [folder ...]     (default: the temp folder and /dev/shm)

For each folder, microseconds per MiB (the median of 7 rounds of 50): a new file written with one ``write``;
the same into a file that exists (appended); over pages already in the page cache (``pwrite`` at offset 0); and,
for comparison, filling fresh anonymous memory. On a VM where fresh pages are expensive the first two are far
above the third and fourth, on tmpfs as on a disk, and swing from one minute to the next.
"""

from __future__ import annotations

import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

MIB = 1 << 20
ROUNDS, PER_ROUND = 7, 50


def per_mib(write: Callable[[int], None]) -> float:
    times = []
    for r in range(ROUNDS):
        started = time.perf_counter()
        for i in range(PER_ROUND):
            write(r * PER_ROUND + i)
        times.append((time.perf_counter() - started) / PER_ROUND * 1e6)
    return statistics.median(times)


def measure(folder: str) -> None:
    data = os.urandom(MIB)
    where = tempfile.mkdtemp(dir=folder, prefix="apsi-writes-")
    appended = os.open(os.path.join(where, "appended"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    cached = os.open(os.path.join(where, "cached"), os.O_RDWR | os.O_CREAT, 0o600)
    os.write(cached, data)

    def new_file(i: int) -> None:
        fd = os.open(os.path.join(where, f"new{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)

    def anonymous(_: int) -> None:
        with mmap.mmap(-1, MIB) as fresh:
            fresh[:] = data

    try:
        cases = {"new file": new_file, "appended": lambda _: os.write(appended, data),
                 "over cached pages": lambda _: os.pwrite(cached, data, 0), "fresh anonymous memory": anonymous}
        for name, write in cases.items():
            print(f"{folder:>16}  {name:24} {per_mib(write):8.0f} us per MiB")
    finally:
        os.close(appended)
        os.close(cached)
        for name in os.listdir(where):
            os.unlink(os.path.join(where, name))
        os.rmdir(where)


if __name__ == "__main__":
    for folder in sys.argv[1:] or [tempfile.gettempdir(), "/dev/shm"]:
        if os.path.isdir(folder):
            measure(folder)
