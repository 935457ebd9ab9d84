"""What ``import apsi_memory`` costs on top of NumPy (issue 21, item 10: at most 30 ms), against ``import numpy``
measured in the same run: each round starts a fresh interpreter, as a script or an ``apsi-memory`` call does.

    .venv/bin/python -m pytest benchmarks/bench_import.py --benchmark-only -s

* ``import numpy``: the baseline (every program using the library imports it anyway);
* ``import numpy, apsi_memory``: the package alone, whose public names are imported on first use;
* ``apsi-memory status``: the command line's most common call, for comparison (not part of the target);
* the first ``memory.store(...)`` set after the import (issue 29 item 4: at most 25 ms more than the import), beside
  its peer, the first ``lmdb.open`` and put after ``import lmdb`` (the ``bench`` extra).

Each figure is given in wall time and in the CPU time (user + system) of the child, which a busy machine inflates
far less (at load 10 on 2 cores, the first store's wall time was ~3x its CPU time): the target is for an idle machine's
wall time, and the CPU time says whether it is met when the machine is not idle.

Bytecode is written on the warm-up round (a checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise
compile every module on every round, which no installed package does).
"""

from __future__ import annotations

import os
import resource
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

ratios = Ratios("import numpy")
cpu_s: dict[str, list[float]] = {}  # each round's child CPU time, by benchmark (the warm-up round first)


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    ratios.report()
    print("CPU time of a round's child, median: " + ", ".join(f"{name} {cpu_median(name) * 1000:.1f} ms"
                                                             for name in ratios.medians))
    if {"import numpy, apsi_memory", "first memory.store"} <= ratios.medians.keys():
        first, cpu = more("first memory.store", "import numpy, apsi_memory")
        # Printed, not asserted: the target is for an idle machine's wall time (issue 29 stays open until then).
        met = "met" if cpu <= FIRST_STORE_TARGET_S else "not met"
        print(f"first memory.store set after the import: {first * 1000:.1f} ms, {cpu * 1000:.1f} ms CPU (target "
              f"{FIRST_STORE_TARGET_S * 1000:.0f} ms on an idle machine: {met} in CPU time here)")
    if {"import numpy", "import numpy, apsi_memory"} <= ratios.medians.keys():  # last: the store's line is printed
        cost, cpu = more("import numpy, apsi_memory", "import numpy")
        print(f"import apsi_memory after numpy: {cost * 1000:.1f} ms, {cpu * 1000:.1f} ms CPU (target "
              f"{TARGET_S * 1000:.0f} ms)")
        assert cost <= TARGET_S


def more(name: str, than: str) -> tuple[float, float]:
    """What ``name`` costs more than ``than``: the difference of their medians, wall and the child's CPU time."""
    return ratios.medians[name] - ratios.medians[than], cpu_median(name) - cpu_median(than)


def cpu_median(name: str) -> float:
    return statistics.median(cpu_s[name][1:])  # not the warm-up round, which wrote the bytecode


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(benchmark: Any, name: str, *args: str) -> None:
    """Runs of ``python *args``, each in a fresh interpreter: wall time by pytest-benchmark, CPU time in ``cpu_s``."""
    rounds = cpu_s.setdefault(name, [])

    def run() -> None:
        before = children_cpu()
        subprocess.run([sys.executable, *args], env=ENV, check=True, stdout=subprocess.DEVNULL)
        rounds.append(children_cpu() - before)
    ratios.measure(benchmark, name, run, ROUNDS, warmup_rounds=1)


def test_import_numpy(benchmark: Any) -> None:
    measure(benchmark, "import numpy", "-c", "import numpy")


def test_import_apsi_memory(benchmark: Any) -> None:
    measure(benchmark, "import numpy, apsi_memory", "-c", "import numpy, apsi_memory")


def test_cli_status(benchmark: Any) -> None:
    measure(benchmark, "apsi-memory status", "-m", "apsi_memory", "status")


def test_first_store(benchmark: Any, tmp_path: Any) -> None:
    code = ("import os, shutil, numpy, apsi_memory as memory\n"
            f"shutil.rmtree({str(tmp_path / 'stores')!r}, ignore_errors=True)\n"
            f"os.environ['APSI_STORE_DIR'] = {str(tmp_path / 'stores')!r}\n"
            "memory.store('first')['a'] = 1")
    measure(benchmark, "first memory.store", "-c", code)


def test_first_lmdb_put(benchmark: Any, tmp_path: Any) -> None:
    pytest.importorskip("lmdb")
    code = ("import shutil, numpy, lmdb\n"
            f"shutil.rmtree({str(tmp_path / 'lmdb')!r}, ignore_errors=True)\n"
            f"env = lmdb.open({str(tmp_path / 'lmdb')!r}, map_size=1 << 26)\n"
            "with env.begin(write=True) as txn: txn.put(b'a', b'1')")
    measure(benchmark, "first lmdb put (peer)", "-c", code)
