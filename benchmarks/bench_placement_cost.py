"""What a placement costs now against a baseline checkout (issue 29, item 2): a 2 MiB ``memory.array`` + ``free``
in one process, this checkout alone and with 16 live siblings, against the baseline alone, in the same run.

    APSI_BENCH_BASELINE=/tmp/base986 PYTHONPATH=$PWD .venv/bin/python -m pytest benchmarks/bench_placement_cost.py \\
        --benchmark-only -s

``APSI_BENCH_BASELINE`` names a checkout of the baseline (``git worktree add --detach /tmp/base986 986d415``);
without it the benchmark is skipped. Two copies of the package cannot be imported in one interpreter, so each
version runs in a worker process of its own (``PYTHONPATH`` its checkout), which times ``COUNT`` placements when
asked. Every round asks the three workers in turn (the order rotates from round to round), and the figures are
the medians of the rounds' paired ratios: on a shared, loaded machine the load drifts between rounds far more than
within one. The 16 siblings are real sleeping processes entered in the ledger folder of the "16 siblings" worker
(``bench_siblings.sleeping_siblings``); the "alone" worker has a ledger folder of its own, empty but for itself.
The "no ledger" worker runs this checkout with its machine's ledger steps switched off: the rest of a placement
against the baseline. ``test_placement_opcodes`` counts the Python opcodes of a placement in each version (no load
changes them): it shows where the Python went, but not what system calls and cold caches cost, so only the timed
test says whether a target is met.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import pytest

from benchmarks.bench_siblings import sleeping_siblings

BASELINE_ENV = "APSI_BENCH_BASELINE"
NBYTES = 2 << 20
COUNT = 200  # placements a worker times per round
ROUNDS = 31

# What both kinds of worker run first: the package, the ledger's steps switched off if asked, one placement.
PRELUDE = f"""
import sys, time
import apsi_memory as memory
if sys.argv[1:] == ["no-ledger"]:  # the ledger's steps off and the rest as it is: what the steps cost
    from apsi_memory.machinery.machines import machine
    machine().siblings = machine().ledger._changed = None
def one():
    memory.free(memory.array({NBYTES}, "uint8"))
"""

# The worker: says which package it imported, then times COUNT placements per line read until stdin closes.
WORKER = PRELUDE + """
print(memory.__file__, flush=True)
for _ in range(50):
    one()
for line in sys.stdin:
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(int(line)):
        one()
    print(time.perf_counter() - started, time.process_time() - cpu, flush=True)
"""


def imported_from(checkout: str, imported: str) -> None:
    """Raise unless ``imported`` (a worker's ``apsi_memory.__file__``) is in ``checkout``."""
    if not imported.startswith(os.path.join(os.path.realpath(checkout), "")):
        raise RuntimeError(f"the worker for {checkout} imported {imported}")


class Worker:
    """One interpreter that imports the package from ``checkout`` and uses ``ledger_dir`` as its ledger folder."""

    def __init__(self, checkout: str, ledger_dir: str, *options: str) -> None:
        env = {**os.environ, "PYTHONPATH": checkout, "APSI_LEDGER_DIR": ledger_dir}
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, *options], cwd=checkout, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        imported_from(checkout, self._line())

    def _line(self) -> str:
        out: IO[str] | None = self.process.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise RuntimeError(f"the worker ended with {self.process.wait()}")
        return line.strip()

    def time(self, count: int) -> tuple[float, float]:
        """Seconds for ``count`` placements: on the clock, and of this worker's CPU time."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{count}\n")
        self.process.stdin.flush()
        wall, cpu = self._line().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


@pytest.fixture(scope="module")
def baseline() -> str:
    checkout = os.environ.get(BASELINE_ENV, "")
    if not checkout:
        pytest.skip(f"{BASELINE_ENV} names no baseline checkout (e.g. git worktree add --detach /tmp/base986 "
                    f"986d415; {BASELINE_ENV}=/tmp/base986)")
    if not os.path.isdir(os.path.join(checkout, "apsi_memory")):
        pytest.fail(f"{BASELINE_ENV}={checkout} is not a checkout of apsi_memory (no apsi_memory folder)")
    return checkout


@pytest.fixture(scope="module")
def workers(baseline: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Worker]]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    alone, crowded = (str(tmp_path_factory.mktemp(name)) for name in ("alone", "crowded"))
    with sleeping_siblings(crowded):
        started = {"baseline alone": Worker(baseline, alone), "alone": Worker(here, alone),
                   "16 siblings": Worker(here, crowded), "no ledger": Worker(here, alone, "no-ledger")}
        try:
            yield started
        finally:
            for worker in started.values():
                worker.close()


PAIRS = [("alone", "baseline alone"), ("16 siblings", "baseline alone"), ("16 siblings", "alone"),
         ("no ledger", "baseline alone")]


def test_placement_cost(benchmark: Any, workers: dict[str, Worker]) -> None:
    names = list(workers)
    rounds: list[dict[str, tuple[float, float]]] = []

    def one_round() -> None:
        turn = len(rounds) % len(names)
        rounds.append({name: workers[name].time(COUNT) for name in names[turn:] + names[:turn]})

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    counted = rounds[1:]
    print(f"\n2 MiB memory.array + free, {len(counted)} rounds of {COUNT}, load {os.getloadavg()[0]:.1f} "
          "(µs: medians; ratios: medians of the rounds' paired ratios, on the clock and in CPU time, which a "
          "loaded machine disturbs less):")
    for name in names:
        print(f"{name:>16}: {statistics.median(r[name][0] for r in counted) / COUNT * 1e6:7.1f} µs, "
              f"CPU {statistics.median(r[name][1] for r in counted) / COUNT * 1e6:6.1f} µs")
    for new, old in PAIRS:
        line = f"{new:>16} / {old}:"
        for clock, label in ((0, "clock"), (1, "CPU")):
            found = [r[new][clock] / r[old][clock] for r in counted]
            quartiles = statistics.quantiles(found, n=4)
            ratio = statistics.median(found)
            benchmark.extra_info[f"{new} / {old} ({label})"] = round(ratio, 3)
            line += f" {label} {ratio:.3f}x ({quartiles[0]:.3f}-{quartiles[2]:.3f})"
        print(line)


# Counts the Python opcodes one placement runs (``sys.settrace`` with opcode events): a measure of its Python that
# no load disturbs, for a machine too busy for the timings above to settle. (System calls are not counted.)
COUNTER = PRELUDE + """
for _ in range(100):
    one()
ops = [0]
def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        ops[0] += 1
    return trace
sys.settrace(trace)
for _ in range(90):  # ten cycles of the credit: a full step and eight draws each
    one()
sys.settrace(None)
print(memory.__file__, ops[0] / 90)
"""


def opcodes(checkout: str, ledger_dir: str, *options: str) -> float:
    """Python opcodes per placement of the package in ``checkout``, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": checkout, "APSI_LEDGER_DIR": ledger_dir}
    done = subprocess.run([sys.executable, "-c", COUNTER, *options], cwd=checkout, env=env, text=True,
                          capture_output=True, check=True, timeout=120)
    imported, ops = done.stdout.split()
    imported_from(checkout, imported)
    return float(ops)


def test_placement_opcodes(benchmark: Any, baseline: str, tmp_path: Any) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found: dict[str, float] = {}

    def count() -> None:
        found.update({"baseline alone": opcodes(baseline, str(tmp_path)), "alone": opcodes(here, str(tmp_path)),
                      "no ledger": opcodes(here, str(tmp_path), "no-ledger")})

    benchmark.pedantic(count, rounds=1, iterations=1)
    print("\n2 MiB memory.array + free, Python opcodes per placement: " + ", ".join(
        f"{name} {ops:.0f}" for name, ops in found.items()))
    for new in ("alone", "no ledger"):
        ratio = found[new] / found["baseline alone"]
        benchmark.extra_info[f"{new} / baseline alone (opcodes)"] = round(ratio, 3)
        print(f"{new:>16} / baseline alone: {ratio:.3f}x")
