"""The two programs of the stranger scenario (tests/real/test_moving_real.py), run as scripts in a real group.

``job``: makes a 1.2 GiB array (``memory.array`` or, for the control, ``numpy.zeros``), fills it with 1, starts
``memory.on_pressure(fn, level="high")``, then, over ``seconds``, writes each 1 MiB slice once (slice ``k`` gets
``k % 250 + 2``, in an order that strides through the array): no write is ever written again, so a write lost
during the move cannot be hidden by a later one. At the end it checks every byte of every slice (written or
still 1) and prints one JSON line of figures (``windows``: the slices).
``neighbour``: plain NumPy that grows to 1.2 GiB in 64 MiB steps, then holds it.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

MiB = 1 << 20
SIZE = 1228 * MiB  # 1.2 GiB
WINDOW = 1 * MiB  # a slice written once
STRIDE = 37  # slices apart from one write to the next (prime to their count: each is written once)


def job(kind: str, seconds: float, move_at: str = "high") -> int:
    import apsi_memory as memory
    from apsi_memory.arrays import moving
    from apsi_memory.decide import Level

    moving.MOVE_AT = Level.parse(move_at)  # the level compared in docs/guides/what-moves.md

    calm_by = time.monotonic() + 30  # the host's stalls count in the level (issue 22): start while they are calm
    while memory.pressure().level >= Level.HIGH and time.monotonic() < calm_by:
        time.sleep(0.5)
    x = memory.array(SIZE, "uint8") if kind == "memory.array" else np.zeros(SIZE, "uint8")
    windows = SIZE // WINDOW
    x[:] = 1
    last = np.ones(windows, np.uint8)  # what each slice must hold: 1, or the one value written to it
    heard: list[str] = []
    watcher = memory.on_pressure(lambda reading: heard.append(str(reading.level)), level="high")
    print("ready", "RAM" if not memory.on_disk(x) else "SSD", flush=True)
    started, k, moved_at = time.monotonic(), 0, None
    while time.monotonic() - started < seconds and k < windows:
        w, value = k * STRIDE % windows, k % 250 + 2
        x[w * WINDOW:(w + 1) * WINDOW] = value
        last[w] = value
        k += 1
        if moved_at is None and memory.on_disk(x):
            moved_at = time.monotonic() - started
        time.sleep(seconds / windows)
    while time.monotonic() - started < seconds:
        time.sleep(0.05)
    watcher.stop()
    kept = sum(int(np.all(x[w * WINDOW:(w + 1) * WINDOW] == last[w])) for w in range(windows))
    print(json.dumps({"writes": k, "windows_kept": kept, "windows": windows, "on_disk": bool(memory.on_disk(x)),
                      "moves": moving.moves.count, "bytes_moved": moving.moves.bytes,
                      "seconds_moving": round(moving.moves.seconds, 3), "moved_at_s": moved_at,
                      "watcher_calls": len(heard), "triggered": watcher.triggered}), flush=True)
    return 0 if kept == windows else 1


def neighbour(total: int, step: int, pause: float, hold: float) -> int:
    chunks = []
    while len(chunks) * step < total:
        chunks.append(np.ones(step, np.uint8))
        time.sleep(pause)
    print("grown", flush=True)
    time.sleep(hold)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "job":
        sys.exit(job(sys.argv[2], float(sys.argv[3]), *sys.argv[4:]))
    sys.exit(neighbour(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])))
