"""Issue 20 item 10 (the environment's part) and item 8: every ``APSI_*`` variable with a bad value gives an error
that names the variable, or a documented behaviour, and nothing stored is lost.

The variables (``grep -rn APSI_ apsi_memory``): APSI_HOME, APSI_SPILL_DIR, APSI_STORE_DIR (folders), APSI_RAM_BUDGET
(a size), APSI_FS_ROOT (the folder that stands for /), APSI_ALLOW_WRITE (folders), APSI_DASK_WORKERS (a count).

Documented behaviours rather than errors: an empty value counts as unset (the XDG rule; ``APSI_HOME=$UNSET_VAR``
gives ''); a missing folder is made, 0700; an ``APSI_FS_ROOT`` that is a link to a folder, or another user's,
is only read. Another uid's folder is refused by the trust checks (``tests/test_path_advice.py``,
``tests/real/test_path_trust_real.py`` with a real second user).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import spill
from apsi_memory.errors import ArgumentError, SizeError, UnsafePathError
from apsi_memory.machinery.machines import Machine
from apsi_memory.system import paths

FOLDERS = ("APSI_HOME", "APSI_SPILL_DIR", "APSI_STORE_DIR")
NONSENSE_SIZES = ("abc", "-1", "nan", "inf", "-inf", "1e400", "0x10", "1e30GB", "12 parsecs", "GB", "1,5GB", " ")


def put(store: str, key: str, value: object) -> None:
    s = memory.store(store)
    try:
        s.set(key, value)
    finally:
        s.close()


def use(variable: str) -> None:
    """What the variable's folder is for: a spill file, a store entry (and its key), or both."""
    if variable != "APSI_STORE_DIR":
        spill.release(spill.create((4,), np.dtype("float64")).filename)
    if variable != "APSI_SPILL_DIR":
        put("t", "k", b"v")


@pytest.fixture(autouse=True)
def user_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's home for these tests, a temp folder: an empty folder variable means the default,
    ``~/.apsi``, and that must not be the real user's (``tests/test_writes_stay_in_tmp.py`` checks)."""
    home = tmp_path_factory.mktemp("user-home")  # not in tmp_path, which some tests check stays empty
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def kept(private_apsi_home: Path) -> Callable[[], None]:
    """A store entry made before the bad value; returns the check that it is still there once the value is gone."""
    put("kept", "k", np.arange(100_000))
    before = dict(os.environ)

    def check() -> None:
        os.environ.clear()
        os.environ.update(before)
        again = memory.store("kept")
        try:
            assert np.array_equal(again.get("k"), np.arange(100_000)), "nothing stored is lost"
        finally:
            again.close()
    return check


def bad_folder(case: str, tmp_path: Path) -> str:
    """The value for one of the bad cases, made under ``tmp_path``."""
    if case == "relative":
        return "cache/apsi"
    if case == "file":
        (tmp_path / "a file").write_text("theirs")
        return str(tmp_path / "a file")
    if case == "symlink":
        (tmp_path / "target").mkdir(mode=0o700)
        (tmp_path / "link").symlink_to(tmp_path / "target")
        return str(tmp_path / "link")
    if case == "another uid's folder":
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another uid needs root")
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.chown(tmp_path / "theirs", 54321, 54321)
        return str(tmp_path / "theirs")
    if os.geteuid() == 0:
        pytest.skip("root writes through a read-only mode; tests/real/test_path_trust_real.py tries it as a user")
    (tmp_path / "read-only").mkdir(mode=0o500)
    return str(tmp_path / "read-only")


@pytest.mark.parametrize("variable", FOLDERS)
@pytest.mark.parametrize("case", ["relative", "file", "symlink", "another uid's folder", "read-only folder"])
def test_a_bad_folder_is_an_error_naming_its_variable(variable, case, tmp_path, monkeypatch, kept):
    monkeypatch.chdir(tmp_path)
    value = bad_folder(case, tmp_path)
    contents = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    before = sorted(tmp_path.rglob("*"))
    os.environ[variable] = value
    with pytest.raises((ArgumentError, UnsafePathError), match=f"{variable}=") as caught:
        use(variable)
    assert not isinstance(caught.value, UnsafePathError) or "Fix: " in str(caught.value)
    assert sorted(tmp_path.rglob("*")) == before, "nothing made where it pointed"
    assert {p: p.read_bytes() for p in contents} == contents
    kept()


@pytest.mark.parametrize("variable", FOLDERS)
def test_an_empty_folder_variable_means_the_default(variable, tmp_path, monkeypatch, kept, user_home):
    monkeypatch.chdir(tmp_path)
    os.environ[variable] = ""
    use(variable)
    assert list(tmp_path.iterdir()) == [], "not the working folder"
    if variable == "APSI_HOME":
        assert (user_home / ".apsi").is_dir(), "the default, ~/.apsi"
    kept()


@pytest.mark.parametrize("variable", FOLDERS)
def test_a_missing_folder_is_made_private(variable, tmp_path, kept):
    folder = tmp_path / "new" / "deeper"
    os.environ[variable] = str(folder)
    use(variable)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    kept()


@pytest.mark.parametrize("value", NONSENSE_SIZES)
def test_a_nonsense_ram_budget_is_an_error_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("APSI_RAM_BUDGET", value)
    with pytest.raises(SizeError, match="APSI_RAM_BUDGET"):
        memory.limits()


def test_an_empty_ram_budget_means_the_default(monkeypatch):
    monkeypatch.setenv("APSI_RAM_BUDGET", "")
    empty = memory.limits()
    monkeypatch.delenv("APSI_RAM_BUDGET")
    assert empty.budget_bytes > 0 and memory.limits().usable_bytes == empty.usable_bytes


@pytest.mark.parametrize("case", ["relative", "missing", "file"])
def test_a_bad_fs_root_is_an_error_naming_the_variable(case, tmp_path, monkeypatch):
    """Before: a wrong root read as a machine without cgroups or PSI, and the host was reported without a word."""
    (tmp_path / "a file").write_text("")
    value = {"relative": "sim/tree", "missing": str(tmp_path / "nowhere"), "file": str(tmp_path / "a file")}[case]
    monkeypatch.setenv("APSI_FS_ROOT", value)
    with pytest.raises(ArgumentError, match="APSI_FS_ROOT="):
        Machine()


@pytest.mark.parametrize("case", ["empty", "symlink to a folder"])
def test_an_empty_or_linked_fs_root_is_read(case, tmp_path, monkeypatch):
    (tmp_path / "link").symlink_to("/")
    monkeypatch.setenv("APSI_FS_ROOT", "" if case == "empty" else str(tmp_path / "link"))
    assert Machine().limits().usable_bytes > 0


def test_a_relative_allowed_folder_is_an_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APSI_ALLOW_WRITE", f"{tmp_path / 'ok'}{os.pathsep}stores")
    with pytest.raises(ArgumentError, match="APSI_ALLOW_WRITE holds the relative path 'stores'"):
        memory.store(str(tmp_path / "ok" / "s"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["empty", "missing", "file"])
def test_allowed_folders_that_are_empty_missing_or_a_file(case, tmp_path, monkeypatch):
    """Empty allows nothing (an empty entry is not the working folder); a missing folder is made; below a file
    nothing can be, and that is named."""
    (tmp_path / "a file").write_text("theirs")
    root = {"empty": "", "missing": str(tmp_path / "new"), "file": str(tmp_path / "a file")}[case]
    monkeypatch.setenv("APSI_ALLOW_WRITE", root)
    monkeypatch.chdir(tmp_path)
    target = os.path.join(root or str(tmp_path), "s")
    if case == "missing":
        put(target, "k", 1)
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        return
    match = "not allowed for writing" if case == "empty" else f"{tmp_path / 'a file'} .*is not a folder"
    with pytest.raises(UnsafePathError, match=match):
        memory.store(target)
    assert (tmp_path / "a file").read_text() == "theirs"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "\u0663", " 2", "1e3"])
def test_a_nonsense_dask_worker_count_is_an_error_naming_the_variable(value, monkeypatch):
    pytest.importorskip("distributed", reason="needs the dask extra: the tox env 'dask' runs this")
    from apsi_memory import dask
    monkeypatch.setenv("APSI_DASK_WORKERS", value)
    with pytest.raises(ArgumentError, match=f"APSI_DASK_WORKERS={value!r}"):
        dask.workers_from_env()


def test_an_empty_dask_worker_count_means_counting_the_nannies(monkeypatch):
    pytest.importorskip("distributed", reason="needs the dask extra: the tox env 'dask' runs this")
    from apsi_memory import dask
    monkeypatch.setenv("APSI_DASK_WORKERS", "")
    assert dask.workers_from_env() is None
    monkeypatch.setenv("APSI_DASK_WORKERS", "3")
    assert dask.workers_from_env() == 3


def test_the_ledger_folder_variable_follows_the_rules_of_the_other_folders(monkeypatch, tmp_path):
    """APSI_LEDGER_DIR: a relative path is refused naming it (it made the ledger in the working folder), and a
    shared sticky folder means this user's private subfolder in it (``/tmp`` gave no ledger at all)."""
    from apsi_memory.machinery.ledger_folders import candidate_dirs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APSI_LEDGER_DIR", "relx")
    with pytest.raises(ArgumentError, match="APSI_LEDGER_DIR='relx' is a relative path"):
        candidate_dirs()
    assert not (tmp_path / "relx").exists()
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    monkeypatch.setenv("APSI_LEDGER_DIR", str(sticky))
    assert candidate_dirs() == [str(sticky / f"apsi-{os.geteuid()}")]
    monkeypatch.setenv("APSI_LEDGER_DIR", "")
    assert candidate_dirs()[-1] == os.path.join(paths.apsi_home(), "run")  # empty is unset: the defaults
