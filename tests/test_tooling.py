"""The harness around the tests: the per-test timeout, and toxfile.py finding pyenv's interpreters for tox."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_a_hanging_test_fails_by_itself_with_the_suites_settings(tmp_path: Path) -> None:
    """The suite's pytest settings (pyproject.toml) stop a test that hangs, and name it; before, a regression that
    made fit_batch loop ran its file past 15 minutes. The 300 s limit is lowered to 2 s here by ``-o``."""
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(600)\n")
    began = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-o", "timeout=2", str(tmp_path / "test_hang.py")],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    took = time.monotonic() - began
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "Timeout" in ran.stdout and "test_hangs" in ran.stdout, ran.stdout
    assert took < 60, f"the hanging test ran {took:.0f} s"


def test_the_suites_timeout_is_set_for_every_test(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.getini("timeout") == "300"
    assert pytestconfig.getini("timeout_method") == "signal"


@pytest.fixture
def toxfile(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """toxfile.py, loaded with stand-ins for the three tox names it imports (tox is not a test dependency)."""
    fakes = {name: types.ModuleType(name) for name in ("tox", "tox.plugin", "tox.config", "tox.config.sets",
                                                       "tox.session", "tox.session.state")}
    fakes["tox.plugin"].impl = lambda function: function  # type: ignore[attr-defined]
    fakes["tox.config.sets"].CoreConfigSet = object  # type: ignore[attr-defined]
    fakes["tox.session.state"].State = object  # type: ignore[attr-defined]
    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("toxfile", REPO / "toxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def fake_pyenv(folder: Path, versions: list[str]) -> None:
    folder.mkdir()
    script = folder / "pyenv"
    script.write_text("#!/bin/sh\n[ \"$1 $2\" = 'versions --bare' ] && printf '%s\\n' " +
                      " ".join(versions) + "\n")
    script.chmod(0o755)


def test_newest_patch_release_of_each_supported_minor(toxfile: types.ModuleType) -> None:
    listed = ["2.7.18", "3.9.18", "3.10.9", "3.10.13", "3.11.7", "3.12.1", "3.13.0", "3.13.2", "3.14.0", "pypy3.10",
              "3.12.1/envs/x"]
    assert toxfile.newest_of_each(listed) == ["3.10.13", "3.11.7", "3.12.1", "3.13.2"]
    assert toxfile.newest_of_each([]) == []


def test_the_hook_names_pyenvs_interpreters_when_unset(toxfile: types.ModuleType, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pyenv(tmp_path / "bin", ["3.10.13", "3.11.7", "3.12.1", "3.13.0"])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYENV_VERSION", raising=False)
    toxfile.tox_add_core_config(None, None)
    assert os.environ["PYENV_VERSION"] == "3.10.13:3.11.7:3.12.1:3.13.0"


def test_the_hook_leaves_a_users_pyenv_version_alone(toxfile: types.ModuleType, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pyenv(tmp_path / "bin", ["3.10.13", "3.11.7"])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYENV_VERSION", "3.11.7")
    toxfile.tox_add_core_config(None, None)
    assert os.environ["PYENV_VERSION"] == "3.11.7"


def test_without_pyenv_nothing_is_set(toxfile: types.ModuleType, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("PYENV_VERSION", raising=False)
    toxfile.tox_add_core_config(None, None)
    assert "PYENV_VERSION" not in os.environ
