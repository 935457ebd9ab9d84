"""``apsi-memory spill | stores | clean`` and ``--version``: the files the library keeps, as a user lists them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import apsi_memory as memory
from apsi_memory.adapters import processes
from apsi_memory.arrays import spill
from apsi_memory.cli import inventory


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "apsi_memory", *args], capture_output=True, text=True, timeout=60,
                          check=False, env=env)


def dead_pid() -> int:
    probe = subprocess.Popen(["true"])  # its pid is free again once it has been waited for
    probe.wait()
    return probe.pid


def spill_file(folder: Path, pid: int, start: str, size: int = 4096) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / spill.file_name(pid, start, "abc123")
    path.write_bytes(b"\0" * size)
    return path


def test_spill_lists_owner_liveness_and_size_and_skips_what_is_not_a_spill_file(tmp_path: Path) -> None:
    folder = tmp_path / "spill"
    live = spill_file(folder, *processes.own_owner(), size=8192)
    dead = spill_file(folder, dead_pid(), "1")
    (folder / "notes.txt").write_text("not ours")
    (folder / spill.file_name(os.getpid(), "7", "ffffff")).symlink_to(live)  # a link wearing our name
    found = {f.path: f for f in inventory.spill_files(str(folder))}
    assert set(found) == {str(live), str(dead)}
    assert found[str(live)].alive and found[str(live)].size_bytes == 8192 and found[str(live)].mine
    assert not found[str(dead)].alive and found[str(dead)].pid == int(dead.name.split("-")[1])


def test_clean_removes_only_dead_owners_files_and_dry_run_removes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "spill"
    live = spill_file(folder, *processes.own_owner())
    dead = spill_file(folder, dead_pid(), "1")
    assert [f.path for f in inventory.clean_spill(str(folder), dry_run=True)] == [str(dead)]
    assert dead.exists()
    assert [f.path for f in inventory.clean_spill(str(folder))] == [str(dead)]
    assert not dead.exists() and live.exists()


@pytest.mark.real
def test_another_users_dead_file_is_listed_but_never_removed(tmp_path: Path) -> None:
    """One file chowned to uid 54321 (needs root): `spill --json` shows it dead and not mine; `clean` keeps it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    folder = tmp_path / "spill"
    other = spill_file(folder, dead_pid(), "1")
    os.chown(other, 54321, 54321)
    env = {**os.environ, "APSI_SPILL_DIR": str(folder)}
    listed = json.loads(run("spill", "--json", env=env).stdout)
    assert [(f["path"], f["alive"], f["mine"]) for f in listed["files"]] == [(str(other), False, False)]
    assert json.loads(run("clean", "--json", env=env).stdout)["spill_files"] == [] and other.exists()


def test_stores_lists_entries_and_bytes_and_clean_store_clears_one(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path / "stores"))
    kept, cleared = memory.store("kept"), memory.store("emb")
    kept.set("a", 1)
    for i in range(3):
        cleared.set(i, bytes(20_000))  # over the inline limit: files of their own under data/
    kept.close()
    cleared.close()
    (tmp_path / "stores" / "not-a-store").mkdir()
    (tmp_path / "stores" / "link").symlink_to(tmp_path / "stores" / "emb")
    listed = json.loads(run("stores", "--json").stdout)["stores"]
    assert [(s["name"], s["entries"]) for s in listed] == [("emb", 3), ("kept", 1)]
    assert listed[0]["bytes_on_ssd"] > 60_000
    dry = run("clean", "--dry-run", "--store", "emb")
    assert "would clear store emb: 3 entries" in dry.stdout and len(memory.store("emb")) == 3
    assert json.loads(run("clean", "--store", "emb", "--json").stdout)["store"]["entries"] == 3
    assert len(memory.store("emb")) == 0 and len(memory.store("kept")) == 1


def test_a_damaged_store_is_listed_with_its_problem_and_the_others_still_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path / "stores"))
    memory.store("good").set("a", 1)
    (tmp_path / "stores" / "bad").mkdir()
    (tmp_path / "stores" / "bad" / "index").write_bytes(b"not a journal")
    listed = {s.name: s for s in inventory.stores()}
    assert listed["good"].entries == 1 and listed["bad"].entries is None
    assert "wrong magic" in (listed["bad"].problem or "") and "wrong magic" in str(listed["bad"])
    result = run("clean", "--store", "bad")  # a folder that never was a store: refused, every time, untouched
    assert result.returncode == 1 and "cannot be opened" in result.stderr and "wrong magic" in result.stderr
    assert [p.name for p in (tmp_path / "stores" / "bad").iterdir()] == ["index"]


def test_clean_store_names_a_bad_name_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path / "stores"))
    for name, says in (("../etc", "plain name"), ("nothing", "there is no store 'nothing'")):
        result = run("clean", "--store", name)
        assert result.returncode == 1 and says in result.stderr and "Traceback" not in result.stderr


def test_version_is_the_installed_metadata() -> None:
    assert memory.__version__ == importlib.metadata.version("apsi-memory")
    assert run("--version").stdout == f"apsi-memory {memory.__version__}\n"


def test_a_mistyped_flag_shows_the_subcommands_usage() -> None:
    result = run("pressure", "--wach", "1")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: apsi-memory pressure [-h] [--json]")
    assert "unrecognized arguments: --wach 1" in result.stderr
