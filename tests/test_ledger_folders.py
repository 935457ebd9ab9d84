"""Where the reservation ledger may live: ``$XDG_RUNTIME_DIR/apsi`` only for an absolute ``XDG_RUNTIME_DIR``
(issue 26 item 14: the XDG base directory spec says a relative one is to be ignored; it would put the ledger
wherever the program happens to run, so two processes in two folders would not see each other)."""

from __future__ import annotations

import pytest

from apsi_memory.machinery.ledger_folders import candidate_dirs
from apsi_memory.system import paths


@pytest.fixture
def default_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APSI_LEDGER_DIR", raising=False)


@pytest.mark.parametrize("relative", ["run/user/0", "./xdg", "xdg/../run"])
def test_a_relative_xdg_runtime_dir_is_ignored(default_folders, monkeypatch, tmp_path, relative):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", relative)
    chosen = candidate_dirs()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert chosen == candidate_dirs()  # as if unset
    assert all(folder.startswith("/") for folder in chosen), chosen


def test_an_absolute_xdg_runtime_dir_is_used(default_folders, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert str(tmp_path / "xdg" / "apsi") in candidate_dirs()
    assert paths.runtime_dir() == str(tmp_path / "xdg")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    assert paths.runtime_dir() is None
