"""A job holds a big table in RAM while another process grows beside it in the same container. A plain
``numpy.zeros`` table waits for the kernel's OOM killer, which kills the biggest process: the job. A
``memory.array`` table is moved to a spill file on the SSD in place under pressure (the same array, every byte
kept: docs/guides/what-moves.md), and the job goes on working on it.

    python examples/night_neighbour.py --table-mb 64 --neighbour-mb 256

prints whether the table moved (``memory.report()``'s line for it) and that its contents are unchanged while the
job kept writing to it. Nothing moves unless memory gets tight (pressure ``high``: under 15 % of the container
free): on a roomy machine the example says so. To see a move, run it in a container that the two do not fit, e.g.
``docker run -m 1g`` with ``--table-mb 400 --neighbour-mb 600``; add ``--plain`` for the control, a ``numpy.zeros``
table, which the kernel kills there.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from multiprocessing.synchronize import Event

import numpy as np

import apsi_memory as memory

MiB = 1 << 20
WINDOW = 1 << 18  # values the job rewrites at a time


def neighbour(megabytes: float, step_mb: float, pause: float, hold: float, grown: Event) -> None:
    """Another program: takes ``megabytes`` of RAM ``step_mb`` at a time, holds it ``hold`` seconds, exits."""
    held: list[bytes] = []
    while len(held) * step_mb < megabytes:
        held.append(b"\1" * int(step_mb * MiB))  # written, so the pages are really taken
        time.sleep(pause)
    grown.set()
    time.sleep(hold)


def differing(table: np.ndarray) -> int:
    """How many values of the table are not their index (window by window: no table-sized temporary)."""
    return sum(int(np.count_nonzero(table[i:i + WINDOW] != np.arange(i, min(len(table), i + WINDOW))))
               for i in range(0, len(table), WINDOW))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-mb", type=float, default=64)
    parser.add_argument("--neighbour-mb", type=float, default=256)
    parser.add_argument("--step-mb", type=float, default=16, help="what the neighbour takes at a time")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between the neighbour's steps")
    parser.add_argument("--hold", type=float, default=2, help="seconds the neighbour holds its memory")
    parser.add_argument("--plain", action="store_true", help="the table is numpy.zeros (the control)")
    args = parser.parse_args()

    count = int(args.table_mb * MiB) // 8
    table = np.zeros(count, "int64") if args.plain else memory.array(count, "int64")
    for i in range(0, count, WINDOW):  # window by window: a table-sized temporary would double what it takes
        table[i:i + WINDOW] = np.arange(i, min(count, i + WINDOW))
    placed = "SSD" if memory.on_disk(table) else "RAM"
    # The job only writes, it allocates nothing: the watcher is what reads the level (and so asks for a move).
    tight: list[float] = []
    watcher = memory.on_pressure(lambda reading: tight.append(time.perf_counter()), level="high", every=0.2)
    grown = multiprocessing.get_context("spawn").Event()
    other = multiprocessing.get_context("spawn").Process(
        target=neighbour, args=(args.neighbour_mb, args.step_mb, args.pause, args.hold, grown))
    other.start()
    print(f"table {memory.fmt_size(table.nbytes)} in {placed}; a neighbour grows to {memory.fmt_size(args.neighbour_mb * MiB)} "
          "beside it", flush=True)
    moved_at = None
    window = 0
    try:
        while other.is_alive() and moved_at is None:  # the job works on its table meanwhile
            part = table[window:window + WINDOW]
            part += 1
            part -= 1
            window = (window + WINDOW) % len(table)
            if memory.on_disk(table) and placed == "RAM":
                moved_at = time.perf_counter()
    finally:
        other.terminate()
        other.join()
        watcher.stop()
    wrong = differing(table)
    record = next((str(line) for line in memory.report() if line.nbytes == table.nbytes), "nothing (numpy.zeros)")
    if moved_at is not None:
        waited = moved_at - tight[0] if tight else 0.0
        print(f"1 move: the table went to the SSD {waited:.1f} s after pressure reached high, while the job "
              f"wrote to it; {wrong:,} of {len(table):,} values differ")
    else:
        now = memory.pressure()
        seen = "the watcher read high, the table stayed (see below)" if tight else "the watcher never read high"
        print(f"no move: {seen}; pressure {now.level} now, {memory.fmt_size(now.free_bytes)} free, the neighbour "
              f"{'grew to its size' if grown.is_set() else 'did not finish growing'}; {wrong:,} of {len(table):,} "
              "values differ")
    print(f"memory.report(): {record}")
    if not args.plain:
        memory.free(table)


if __name__ == "__main__":
    main()
