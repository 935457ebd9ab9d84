"""Where a store operation's time goes: a cProfile summary of one path on a store of 100,000 small dicts.

    .venv/bin/python benchmarks/profile_store.py set|ssd|ram [rows]

``set``: 5,000 sets of new keys; ``ssd``: 5,000 gets of random keys with the RAM tier emptied first; ``ram``:
the same gets again, now RAM hits. Prints microseconds per operation (unprofiled, one pass) and the profile's
``rows`` heaviest functions by their own time. Issue 14's before/after profiles were taken with it.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Callable

ENTRIES = 100_000
OPERATIONS = 5_000


def small_dict(i: int) -> dict[str, object]:
    return {"id": i, "name": f"document {i}", "tags": ["a", "b"], "score": i / 7}


def main(path: str, rows: int) -> None:
    folder = tempfile.mkdtemp(prefix="apsi-profile-")
    os.environ.setdefault("APSI_HOME", os.path.join(folder, "home"))
    import apsi_memory as memory  # after APSI_HOME: the key goes to the temporary folder

    memory.allow_write(folder)
    store = memory.store(os.path.join(folder, "store"), ram_mb=64, disk_gb=20)
    for i in range(ENTRIES):
        store.set(f"k{i}", small_dict(i))
    values = [small_dict(i) for i in range(OPERATIONS)]
    keys = [f"k{i}" for i in random.Random(1).sample(range(ENTRIES), OPERATIONS)]
    fresh = iter(range(ENTRIES, 10**9))

    def sets() -> None:
        for value in values:
            store.set(f"n{next(fresh)}", value)

    def gets() -> None:
        for key in keys:
            store.get(key)

    run: Callable[[], None] = sets if path == "set" else gets
    if path == "ssd":
        store.relieve()
    elif path == "ram":
        gets()  # every key into the RAM tier
    started = time.perf_counter()
    run()
    print(f"{path}: {(time.perf_counter() - started) / OPERATIONS * 1e6:.1f} us per operation, unprofiled")
    if path == "ssd":
        store.relieve()
    profile = cProfile.Profile()
    profile.runcall(run)
    pstats.Stats(profile).sort_stats("tottime").print_stats(rows)
    store.close()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("set", "ssd", "ram"):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 18)
