"""Bad input outside the store: always a clear error that names the problem, never silence (issue 9).

Each error is the library's own class and also the builtin a caller would catch (``ArgumentError`` is a
``ValueError``, ``ArgumentTypeError`` a ``TypeError``); the CLI answers bad flags as argparse does, exit 2.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import numpy.lib.format as npy_format
import pytest

import apsi_memory as memory
from apsi_memory.errors import ArgumentError, ArgumentTypeError, CorruptFileError
from apsi_memory.units import seconds
from apsi_memory.watch import Watcher
from sim import tree as machines
from sim.tree import MiB

# -- arrays and the pool ----------------------------------------------------------------------------------------

def test_an_unsized_string_dtype_is_counted_as_the_bytes_numpy_really_uses(pressure_machine):
    """``"S0"`` has itemsize 0, but NumPy makes ``S1`` arrays: 4 Mi of them are 4 MiB, over a zero budget."""
    memory.budget(0)
    x = memory.array(4 * MiB, "S0")
    assert x.dtype == np.dtype("S1") and memory.on_disk(x)
    assert [r.nbytes for r in memory.report() if r.shape == (4 * MiB,)] == [4 * MiB]
    assert memory.pool().take(3, "U0").dtype == np.dtype("U1")


def test_a_zero_byte_dtype_that_is_really_empty_stays_empty(pressure_machine):
    memory.budget(0)
    x = memory.array(4 * MiB, [])
    assert x.nbytes == 0 and not memory.on_disk(x)


def test_a_shape_too_big_for_any_array_is_named():
    with pytest.raises(ArgumentError, match=r"shape \(4611686018427387904,\) of float64 .* more than any array"):
        memory.pool().take([2**62])
    with pytest.raises(ValueError, match="4611686018427387904"):
        memory.array([2**62, 4], "int8")


@pytest.mark.parametrize("zero", ["no", 0, None, 1.0])
def test_take_zero_must_be_a_bool(zero):
    with pytest.raises(ArgumentTypeError, match=f"zero must be True or False, not {type(zero).__name__}"):
        memory.pool().take(4, zero=zero)


def test_take_zero_accepts_numpy_bools():
    assert not memory.pool().take(4, zero=np.bool_(True)).any()


@pytest.mark.parametrize("value", [None, [1], "x.npy", 3])
def test_on_disk_names_what_is_not_an_array(value):
    with pytest.raises(ArgumentTypeError, match=f"on_disk takes a NumPy array, not {type(value).__name__}"):
        memory.on_disk(value)


@pytest.mark.parametrize("root", [123, b"/", ["/"]])
def test_cores_root_must_be_a_folder_name(root):
    with pytest.raises(TypeError, match=f"root must be a folder .* not {type(root).__name__}"):
        memory.cores(root)


def test_cores_with_a_root_still_reads_it(sim_machine):
    tree = sim_machine(machines.docker_v1)
    assert memory.cores(str(tree)) == 2


# -- chunks on a .npy header that lies ---------------------------------------------------------------------------

def npy_with_shape(path: Path, shape: tuple[int, ...]) -> Path:
    """A .npy file whose header claims ``shape`` (float64) followed by 24 bytes of data."""
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    path.write_bytes(header.getvalue() + bytes(24))
    return path


@pytest.mark.parametrize("shape,problem", [((-5, 3), "negative or impossibly large dimension"),
                                           ((0, 2**70), "negative or impossibly large dimension"),
                                           ((2**62, 2**62), "truncated"),
                                           ((2**40, 2**40, 2**40), "truncated")])
def test_a_npy_header_with_an_impossible_shape_is_a_corrupt_file(tmp_path, shape, problem):
    path = npy_with_shape(tmp_path / "lies.npy", shape)
    with pytest.raises(CorruptFileError, match=problem) as caught:
        next(iter(memory.chunks(path)))
    assert caught.value.path == str(path)


def test_a_npy_header_that_tells_the_truth_still_streams(tmp_path):
    assert [block.shape for block in memory.chunks(npy_with_shape(tmp_path / "ok.npy", (3,)))] == [(3,)]


# -- on_pressure's every and repeat -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["every", "repeat"])
@pytest.mark.parametrize("value", ["1", None, True])
def test_every_and_repeat_must_be_numbers(name, value):
    with pytest.raises(ArgumentTypeError, match=f"on_pressure: {name} must be a number of seconds, not"):
        Watcher(print, **{name: value})


@pytest.mark.parametrize("name", ["every", "repeat"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, 1e300, pytest.param(10**400, id="10**400")])
def test_every_and_repeat_must_be_positive_finite_seconds(name, value):
    with pytest.raises(ArgumentError, match=f"on_pressure: {name} must be a number of seconds above 0"):
        memory.on_pressure(print, **{name: value})


def test_every_and_repeat_take_any_real_number():
    watcher = Watcher(print, every=np.float32(0.5), repeat=np.int64(3))
    assert (watcher.every, watcher.repeat) == (0.5, 3.0)
    assert seconds(2, "x") == 2.0


# -- apsi-memory pressure --watch / --count --------------------------------------------------------------------

def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "apsi_memory", *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("args,problem", [
    (["--watch", "nan"], "argument --watch: SECONDS must be a number of seconds above 0"),
    (["--watch", "inf"], "argument --watch: SECONDS must be a number of seconds above 0"),
    (["--watch", "1e300"], "argument --watch: SECONDS must be a number of seconds above 0"),
    (["--watch", "-2"], "argument --watch: SECONDS must be a number of seconds above 0"),
    (["--watch", "soon"], "argument --watch: could not convert string to float"),
    (["--watch", "1", "--count", "-1"], "argument --count: N must be a whole number of readings, at least 1"),
    (["--watch", "1", "--count", "0"], "argument --count: N must be a whole number of readings, at least 1"),
    (["--count", "3"], "--count counts the readings of --watch: give --watch SECONDS too"),
])
def test_bad_watch_flags_are_a_usage_error(args, problem):
    result = run("pressure", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert problem in result.stderr and "Traceback" not in result.stderr


# -- issue 20 item 8: nonsense that was accepted silently -------------------------------------------------------

@pytest.mark.parametrize("shape", [[True, 2], (2, False), True, np.bool_(True), [np.bool_(False)]])
def test_a_bool_is_not_a_size_in_a_shape(shape):
    with pytest.raises(ArgumentTypeError, match="bool"):
        memory.array(shape)
    with pytest.raises(ArgumentTypeError, match="bool"):
        memory.pool().take(shape)


@pytest.mark.parametrize(("max_bytes", "error", "problem"), [
    (-1, ArgumentError, "at least 0"), (math.nan, ArgumentTypeError, "float"), (math.inf, ArgumentTypeError, "float"),
    (1.5, ArgumentTypeError, "float"), (True, ArgumentTypeError, "bool"), ("1GB", ArgumentTypeError, "str"),
    (None, ArgumentTypeError, "NoneType"), (2**70, ArgumentError, "larger than any machine's memory"),
])
def test_a_pool_bound_must_be_a_whole_number_of_bytes(max_bytes, error, problem):
    with pytest.raises(error, match=f"Pool: max_bytes .*{problem}"):
        memory.Pool(max_bytes)


def test_a_pool_bound_takes_numpy_integers():
    assert memory.Pool(np.int64(4096)).max_bytes == 4096


class _NoWait:
    def now(self) -> float:
        return 0.0


class _StringTime:
    def now(self) -> str:
        return "noon"

    def wait(self, seconds: float, stop: object = None) -> bool:
        return True


@pytest.mark.parametrize(("clock", "problem"), [
    (object(), "clock must have now\\(\\) and wait\\(seconds, stop\\)"),
    (_NoWait(), "clock must have now\\(\\) and wait\\(seconds, stop\\)"),
    (_StringTime(), "clock.now\\(\\) must return a number of seconds, not str"),
    (__import__("time").monotonic, "clock must have now\\(\\) and wait\\(seconds, stop\\)"),
])
def test_a_watcher_with_a_bad_clock_is_refused_before_any_thread_starts(clock, problem):
    before = threading.active_count()
    with pytest.raises(ArgumentTypeError, match=problem):
        Watcher(print, clock=clock).start()
    assert threading.active_count() == before


def test_a_watcher_with_a_bad_read_is_refused():
    with pytest.raises(ArgumentTypeError, match="on_pressure: read must be a function"):
        Watcher(print, read=42)  # type: ignore[arg-type]
