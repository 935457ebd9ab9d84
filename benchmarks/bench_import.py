"""What ``import apsi_memory`` costs on top of NumPy (issue 21, item 10: at most 30 ms), against ``import numpy``
measured in the same run: each round starts a fresh interpreter, as a script or an ``apsi-memory`` call does.

    .venv/bin/python -m pytest benchmarks/bench_import.py --benchmark-only -s

* ``import numpy``: the baseline (every program using the library imports it anyway);
* ``import numpy, apsi_memory``: the package alone, whose public names are imported on first use;
* ``apsi-memory status``: the command line's most common call, for comparison (not part of the target);
* the first ``memory.store(...)`` set after the import (issue 29 item 4: at most 25 ms more than the import), beside
  its peer, the first ``lmdb.open`` and put after ``import lmdb`` (the ``bench`` extra).

Bytecode is written on the warm-up round (a checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise
compile every module on every round, which no installed package does).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.bench_pool import Ratios

ROUNDS = 15
TARGET_S = 0.030
FIRST_STORE_TARGET_S = 0.025
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}

ratios = Ratios("import numpy")


@pytest.fixture(scope="module", autouse=True)
def print_ratios() -> Any:
    yield
    ratios.report()
    if {"import numpy", "import numpy, apsi_memory"} <= ratios.medians.keys():
        cost = ratios.medians["import numpy, apsi_memory"] - ratios.medians["import numpy"]
        print(f"import apsi_memory after numpy: {cost * 1000:.1f} ms (target {TARGET_S * 1000:.0f} ms)")
        assert cost <= TARGET_S
    if {"import numpy, apsi_memory", "first memory.store"} <= ratios.medians.keys():
        first = ratios.medians["first memory.store"] - ratios.medians["import numpy, apsi_memory"]
        # Printed, not asserted: the target is not met yet (issue 29 stays open on it).
        print(f"first memory.store set after the import: {first * 1000:.1f} ms (target "
              f"{FIRST_STORE_TARGET_S * 1000:.0f} ms)")


def python(*args: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run([sys.executable, *args], env=ENV, check=True, stdout=subprocess.DEVNULL)
    return run


def test_import_numpy(benchmark: Any) -> None:
    ratios.measure(benchmark, "import numpy", python("-c", "import numpy"), ROUNDS, warmup_rounds=1)


def test_import_apsi_memory(benchmark: Any) -> None:
    ratios.measure(benchmark, "import numpy, apsi_memory", python("-c", "import numpy, apsi_memory"), ROUNDS,
                   warmup_rounds=1)


def test_cli_status(benchmark: Any) -> None:
    ratios.measure(benchmark, "apsi-memory status", python("-m", "apsi_memory", "status"), ROUNDS, warmup_rounds=1)


def test_first_store(benchmark: Any, tmp_path: Any) -> None:
    code = ("import os, shutil, numpy, apsi_memory as memory\n"
            f"shutil.rmtree({str(tmp_path / 'stores')!r}, ignore_errors=True)\n"
            f"os.environ['APSI_STORE_DIR'] = {str(tmp_path / 'stores')!r}\n"
            "memory.store('first')['a'] = 1")
    ratios.measure(benchmark, "first memory.store", python("-c", code), ROUNDS, warmup_rounds=1)


def test_first_lmdb_put(benchmark: Any, tmp_path: Any) -> None:
    pytest.importorskip("lmdb")
    code = ("import shutil, numpy, lmdb\n"
            f"shutil.rmtree({str(tmp_path / 'lmdb')!r}, ignore_errors=True)\n"
            f"env = lmdb.open({str(tmp_path / 'lmdb')!r}, map_size=1 << 26)\n"
            "with env.begin(write=True) as txn: txn.put(b'a', b'1')")
    ratios.measure(benchmark, "first lmdb put (peer)", python("-c", code), ROUNDS, warmup_rounds=1)
