"""What the reservation ledger adds to a placement that takes a reading (issue 18, item 3): ``memory.array`` of
64 MiB (placed in RAM, dropped again) on a machine without the ledger (today's path) and on one whose group has 16
live siblings, each holding a reservation, measured in the same run. The target: at most 1.3x.

    PYTHONPATH=$PWD .venv/bin/python -m pytest benchmarks/bench_siblings.py --benchmark-only -s

The siblings are 16 real sleeping processes entered in a private ledger folder, so each reading asks the kernel
about 16 slot locks and reads 16 ``/proc/<pid>/statm``, as it would in a container of 17 workers.
Each round makes and drops 100 arrays, so the time per placement is the median / 100. On a shared, loaded machine
the two medians drift apart with the load between them, so ``test_placement_paired`` also times both in every
round, one after the other, and prints the median of the rounds' ratios: the figure to read there.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import apsi_memory as memory
from apsi_memory import Machine
from apsi_memory.machinery.reservations import Siblings, group_key
from benchmarks.bench_pool import Ratios

SIBLINGS = 16
BIG = (8192, 1024)  # 64 MiB of float64
COUNT = 100
ROUNDS = 30

ratios = Ratios("without the ledger")


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    print(f"\none placement taking a reading (µs; the column says ms per round of {COUNT}):")
    ratios.report()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ledger folder in which 16 live processes each hold a 100 MiB reservation."""
    folder = str(tmp_path_factory.mktemp("ledger"))
    with sleeping_siblings(folder):
        yield folder


@contextmanager
def sleeping_siblings(folder: str, count: int = SIBLINGS) -> Iterator[None]:
    """``count`` real sleeping processes, each entered in the ledger in ``folder`` with a 100 MiB reservation
    (their slots' locks held here, their ``statm`` theirs), until the block ends."""
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(count)]
    entries = [Siblings([folder], pid=p.pid) for p in sleepers]
    key = group_key(Machine(siblings=None).memory())
    try:
        for entry in entries:
            entry.publish(key, 100 << 20, 100 << 20)
        yield
    finally:
        for entry, sleeper in zip(entries, sleepers):
            entry.close()
            sleeper.kill()
            sleeper.wait()


def placing(machine: Machine) -> Any:
    def run() -> None:
        with machine.use():
            for _ in range(COUNT):
                memory.array(BIG)
    return run


@pytest.mark.parametrize("name", ["without the ledger", "16 siblings"])
def test_placement(benchmark: Any, ledger: str, name: str) -> None:
    siblings = Siblings([ledger]) if name == "16 siblings" else None
    machine = Machine(siblings=siblings)
    machine.budget("auto")
    if siblings is not None:
        assert machine.join().processes == SIBLINGS  # the 16 are seen
    ratios.measure(benchmark, name, placing(machine), ROUNDS, warmup_rounds=2)
    if siblings is not None:
        siblings.close()


def test_placement_paired(benchmark: Any, ledger: str) -> None:
    siblings = Siblings([ledger])
    machines = [Machine(siblings=None), Machine(siblings=siblings)]
    runs = [placing(m) for m in machines]
    found: list[float] = []

    def pair() -> None:
        took = []
        for run in runs:
            started = time.perf_counter()
            run()
            took.append(time.perf_counter() - started)
        found.append(took[1] / took[0])

    benchmark.pedantic(pair, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    ratio = statistics.median(found[2:] or found)
    benchmark.extra_info["ledger_cost_ratio"] = round(ratio, 3)
    print(f"\n16 siblings against without the ledger, paired rounds: median ratio {ratio:.2f}x "
          f"(quartiles {statistics.quantiles(found, n=4)[0]:.2f}-{statistics.quantiles(found, n=4)[2]:.2f})")
    siblings.close()
