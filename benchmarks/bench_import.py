"""What ``import apsi_memory`` costs on top of NumPy (issue 21, item 10: at most 30 ms), against ``import numpy``
measured in the same run: each round starts a fresh interpreter, as a script or an ``apsi-memory`` call does.

    .venv/bin/python -m pytest benchmarks/bench_import.py --benchmark-only -s

* ``import numpy``: the baseline (every program using the library imports it anyway);
* ``import numpy, apsi_memory``: the package alone, whose public names are imported on first use;
* ``apsi-memory status``: the command line's most common call, for comparison (not part of the target);
* the first ``memory.store(...)`` set after the import (issue 29 item 4: at most 25 ms more than the import), beside
  its peer, the first ``lmdb.open`` and put after ``import lmdb`` (the ``bench`` extra);
* the first call of the other features (``FIRST_CALLS``: a 64 MB array, ``pressure()``, ``map``, a ``cached`` call,
  ``status()``), in CPU time.

The first store and its peer are also given in CPU time (``time.process_time()`` in the child, around the import and
around the first call), which a busy machine inflates far less than wall time (at load 10-13 on 2 cores wall times
of whole children varied by 2x, and so did their CPU times: the numbers are the child's own, not NumPy's start-up):
the target is for an idle machine's wall time, and the CPU time says whether it is met when the machine is not idle.

Bytecode is written on the warm-up round (a checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise
compile every module on every round, which no installed package does).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from typing import Any

import pytest

from benchmarks.bench_pool import Ratios

ROUNDS = 15
TARGET_S = 0.030
FIRST_STORE_TARGET_S = 0.025
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}

FIRST_CALLS = {
    "first memory.array (64 MB)": "memory.array((1 << 26,), 'u1')",
    "first memory.pressure()": "memory.pressure()",
    "first memory.map": "list(memory.map(lambda block: block * 2, numpy.ones((1000, 4))))",
    "first @memory.cached call": "memory.cached(lambda x: x)(1)",
    "first memory.status()": "memory.status()",
}

ratios = Ratios("import numpy")
# (import, first call) in CPU seconds, as each round's child printed them, by benchmark (the warm-up round first)
cpu_s: dict[str, list[tuple[float, float]]] = {}


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    ratios.report()
    if {"import numpy, apsi_memory", "first memory.store"} <= ratios.medians.keys():
        first = ratios.medians["first memory.store"] - ratios.medians["import numpy, apsi_memory"]
        print(f"first memory.store set after the import: {first * 1000:.1f} ms (target "
              f"{FIRST_STORE_TARGET_S * 1000:.0f} ms on an idle machine)")
    for name in sorted(cpu_s.keys() & ratios.medians.keys()):
        imported, first = (statistics.median(figures) for figures in zip(*cpu_s[name][1:]))  # not the warm-up's
        target = ""
        if name == "first memory.store":  # printed, not asserted: the target is for an idle machine's wall time
            target = f" ({'within' if first <= FIRST_STORE_TARGET_S else 'over'} the target in CPU time)"
        print(f"{name}, the child's CPU time: its import {imported * 1000:.1f} ms, then the first call "
              f"{first * 1000:.1f} ms{target}")
    if {"import numpy", "import numpy, apsi_memory"} <= ratios.medians.keys():  # last: the lines above are printed
        cost = ratios.medians["import numpy, apsi_memory"] - ratios.medians["import numpy"]
        print(f"import apsi_memory after numpy: {cost * 1000:.1f} ms (target {TARGET_S * 1000:.0f} ms)")
        assert cost <= TARGET_S


def measure(benchmark: Any, name: str, *args: str, cpu: bool = False) -> None:
    """Runs of ``python *args``, each in a fresh interpreter, timed by pytest-benchmark; with ``cpu``, the child
    prints the CPU seconds of its import and of its first call (``timed``), kept in ``cpu_s``."""
    rounds = cpu_s.setdefault(name, []) if cpu else []

    def run() -> None:
        done = subprocess.run([sys.executable, *args], env=ENV, check=True, capture_output=True, text=True)
        if cpu:
            imported, first = map(float, done.stdout.split())
            rounds.append((imported, first))
    ratios.measure(benchmark, name, run, ROUNDS, warmup_rounds=1)


def timed(imports: str, first_call: str) -> str:
    """A child that prints the CPU seconds of ``imports`` and then of ``first_call``."""
    return (f"import time\nstarted = time.process_time()\n{imports}\nimported = time.process_time()\n{first_call}\n"
            "print(imported - started, time.process_time() - imported)")


def test_import_numpy(benchmark: Any) -> None:
    measure(benchmark, "import numpy", "-c", "import numpy")


def test_import_apsi_memory(benchmark: Any) -> None:
    measure(benchmark, "import numpy, apsi_memory", "-c", "import numpy, apsi_memory")


def test_cli_status(benchmark: Any) -> None:
    measure(benchmark, "apsi-memory status", "-m", "apsi_memory", "status")


def test_first_store(benchmark: Any, tmp_path: Any) -> None:
    code = ("import os, shutil, numpy\n"
            f"shutil.rmtree({str(tmp_path / 'stores')!r}, ignore_errors=True)\n"
            f"os.environ['APSI_STORE_DIR'] = {str(tmp_path / 'stores')!r}\n")
    measure(benchmark, "first memory.store", "-c", code + timed("import apsi_memory as memory",
                                                                "memory.store('first')['a'] = 1"), cpu=True)


@pytest.mark.parametrize("name", FIRST_CALLS)
def test_first_call(benchmark: Any, tmp_path: Any, name: str) -> None:
    code = f"import os, numpy\nos.environ['APSI_SPILL_DIR'] = {str(tmp_path / 'spill')!r}\n"
    measure(benchmark, name, "-c", code + timed("import apsi_memory as memory", FIRST_CALLS[name]), cpu=True)


def test_first_lmdb_put(benchmark: Any, tmp_path: Any) -> None:
    pytest.importorskip("lmdb")
    code = f"import shutil, numpy\nshutil.rmtree({str(tmp_path / 'lmdb')!r}, ignore_errors=True)\n"
    first = (f"env = lmdb.open({str(tmp_path / 'lmdb')!r}, map_size=1 << 26)\n"
             "with env.begin(write=True) as txn: txn.put(b'a', b'1')")
    measure(benchmark, "first lmdb put (peer)", "-c", code + timed("import lmdb", first), cpu=True)
