"""Fixtures every test module shares. Each name means one thing everywhere:

* ``sim_machine(scenario, **kwargs)``: builds a ``sim.tree`` scenario and installs ``sim.machine(tree)`` as the
  default machine for the test (``APSI_FS_ROOT`` too, for subprocesses); returns the tree.
* ``pressure_machine``: a container whose pressure level the test sets (``sim.pressure.PressureMachine``), installed.
* ``home``: the test's ``~/.apsi`` (``home / "home"``) and store folder (``home / "stores"``).
* ``spill_dir``, ``on_ssd``: a spill folder under the test's tmp; ``on_ssd`` also sets the budget to 0.
* ``memcg``: a real v1 child memory cgroup.
* ``ctrl_c_raises``: Python's own SIGINT handler for the test, for tests of what Ctrl-C does.
* ``calm_host``: a calm sim container (``docker run -m 4g``, 3 of 4 GiB free, no stalls, so a ledger too) unless
  the test asks for ``pressure_machine``: for modules whose arrays must stay in RAM whatever the real host's
  pressure.

Every test also runs on a fresh ``Machine`` of the real host (its own budget, ledger, level and components) and
its own ``APSI_HOME`` and reservation ledger (``APSI_LEDGER_DIR``), so nothing a test sets reaches another and no global needs resetting afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import pytest

import apsi_memory as memory
import sim
from apsi_memory import Machine
from apsi_memory.machinery.reservations import Siblings
from sim.pressure import PressureMachine
from sim.tree import MiB, SimTree
from tests.load import slowdown, stretched
from tests.realcg import ChildGroup, child_group

BuildMachine = Callable[..., SimTree]
ALONE = "APSI_TEST_ALONE"  # the node id a child pytest runs for real (``alone`` marker)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's timeout (its marker's, else the ini's) stretched by the machine's slowdown (``tests.load``)."""
    factor = slowdown()
    if factor <= 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        kwargs = dict(marker.kwargs) if marker is not None else {}
        seconds = float(marker.args[0] if marker is not None and marker.args else kwargs.pop("timeout", default))
        kwargs.pop("timeout", None)
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(seconds * factor, **kwargs), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``alone`` runs again in a fresh pytest process, and its result is that process's: it counts
    the threads of its process, which other tests' pools, watchers and dask clients may still have running."""
    if pyfuncitem.get_closest_marker("alone") is None or os.environ.get(ALONE) == pyfuncitem.nodeid:
        return None
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                          env={**os.environ, ALONE: pyfuncitem.nodeid}, cwd=pyfuncitem.config.rootpath,
                          capture_output=True, text=True, timeout=stretched(280), check=False)
    print(done.stdout[-4000:])
    assert done.returncode == 0, f"{pyfuncitem.nodeid} alone: exit {done.returncode}\n{done.stdout[-6000:]}"
    return True


@pytest.fixture(autouse=True)
def private_apsi_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own ~/.apsi and a fresh machine, so no test reads or writes the user's."""
    home = tmp_path_factory.mktemp("apsi-home")
    monkeypatch.setenv("APSI_HOME", str(home))
    for name in ("APSI_SPILL_DIR", "APSI_STORE_DIR", "APSI_RAM_BUDGET", "APSI_ALLOW_WRITE", "APSI_FS_ROOT"):
        monkeypatch.delenv(name, raising=False)
    # The reservation ledger of the test's own (and its subprocesses'): other test runs on the host are not its
    # siblings.
    monkeypatch.setenv("APSI_LEDGER_DIR", str(home / "ledger"))
    siblings = Siblings()
    with Machine(siblings=siblings).use():
        yield home
        monkeypatch.undo()  # while this machine is installed: a test's monkeypatched default must not outlive it
    siblings.close()


@pytest.fixture
def sim_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BuildMachine]:
    """``sim_machine(sim.tree.docker_v1, limit=...)`` builds a fake machine and makes it the default."""
    with contextlib.ExitStack() as installed:

        def build(scenario: BuildMachine, **kwargs: object) -> SimTree:
            tree = scenario(tmp_path / "root", **kwargs)
            installed.enter_context(sim.machine(tree).use())
            monkeypatch.setenv("APSI_FS_ROOT", str(tree.root))  # for subprocesses
            return tree

        yield build


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``home / "home"`` is ~/.apsi (the key) and ``home / "stores"`` the store folder, for tests that look there."""
    monkeypatch.setenv("APSI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path / "stores"))
    return tmp_path


@pytest.fixture
def pressure_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PressureMachine]:
    """A container (sim v1 tree, 256 MiB limit) whose pressure level the test sets; spill files under tmp."""
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path / "spill"))
    pm = PressureMachine(tmp_path / "root", limit=256 * MiB)
    with pm.machine.use():
        yield pm


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """A job a shell without job control starts in the background (``tox &`` in a script) inherits SIGINT ignored,
    and Python then installs no handler: a Ctrl-C test there saw nothing happen (both runs of a CI pair failed)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def calm_host(request: pytest.FixtureRequest) -> None:
    if "pressure_machine" not in request.fixturenames:
        request.getfixturevalue("sim_machine")(sim.tree.docker_v1)


@pytest.fixture
def spill_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spill folder (``APSI_SPILL_DIR``) under the test's tmp folder, not made yet."""
    folder = tmp_path / "spill"
    monkeypatch.setenv("APSI_SPILL_DIR", str(folder))
    return folder


@pytest.fixture
def on_ssd(spill_dir: Path) -> Path:
    """A RAM budget of zero: every array over 1 MiB goes to a spill file."""
    memory.budget(0)
    return spill_dir


@pytest.fixture
def memcg() -> Callable[[int], ContextManager[ChildGroup]]:
    """``with memcg(1 << 30) as group: group.run([...])`` — a real v1 child memory cgroup, removed afterwards."""
    return child_group
