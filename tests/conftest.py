from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import pytest

import apsi_memory.adapters.root as fs_root
from apsi_memory import api
from sim.pressure import PressureMachine
from sim.tree import MiB, SimTree
from tests.realcg import ChildGroup, child_group


@pytest.fixture(autouse=True)
def private_apsi_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own ~/.apsi and the default budget, so no test reads or writes the user's."""
    home = tmp_path_factory.mktemp("apsi-home")
    monkeypatch.setenv("APSI_HOME", str(home))
    for name in ("APSI_SPILL_DIR", "APSI_STORE_DIR", "APSI_RAM_BUDGET", "APSI_ALLOW_WRITE", "APSI_FS_ROOT"):
        monkeypatch.delenv(name, raising=False)
    yield home
    monkeypatch.undo()  # back on the real machine first: budget() measures
    api.budget("auto")


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., SimTree]:
    """``machine(sim.tree.docker_v1, limit=...)`` builds a fake machine and points the real adapters at it."""

    def build(scenario: Callable[..., SimTree], **kwargs: object) -> SimTree:
        tree = scenario(tmp_path / "root", **kwargs)
        monkeypatch.setattr(fs_root, "ROOT", str(tree.root))
        monkeypatch.setenv("APSI_FS_ROOT", str(tree.root))  # for subprocesses
        return tree

    return build


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``home / "home"`` is ~/.apsi (the key) and ``home / "stores"`` the store folder, for tests that look there."""
    monkeypatch.setenv("APSI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path / "stores"))
    return tmp_path


@pytest.fixture
def pressure_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PressureMachine:
    """A container (sim v1 tree, 256 MiB limit) whose pressure level the test sets; spill files under tmp."""
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path / "spill"))
    return PressureMachine(tmp_path / "root", limit=256 * MiB).install(monkeypatch)


@pytest.fixture
def memcg() -> Callable[[int], ContextManager[ChildGroup]]:
    """``with memcg(1 << 30) as group: group.run([...])`` — a real v1 child memory cgroup, removed afterwards."""
    return child_group
