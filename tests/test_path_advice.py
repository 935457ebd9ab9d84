"""Issue 20 items 7, 8 and 11, issue 21 item 4: spill folders get the trust checks of keys and stores, every
``UnsafePathError`` names the ``APSI_*`` variable that pointed there and never advises to remove, chmod or chown
anything, and a shared sticky folder (``/tmp``, ``/dev/shm``) just works through a private per-user subfolder.

(Cases that need a second user are in ``tests/real/test_path_trust_real.py``.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import spill
from apsi_memory.cli.commands import main
from apsi_memory.errors import ArgumentError, UnsafePathError
from apsi_memory.system import paths, trust

FLOAT64 = np.dtype("float64")
DESTRUCTIVE = re.compile(r"\b(rm|rmdir|chmod|chown|unlink)\b")


def assert_safe_advice(error: BaseException, variable: str | None) -> None:
    """The message says what to do, names ``variable`` (if one pointed there), and changes nothing it found."""
    text = str(error)
    assert "Fix: " in text, text
    assert not DESTRUCTIVE.search(text.split("Fix: ", 1)[1]), text
    if variable is not None:
        assert f"{variable}=" in text and f"set {variable} to a folder of your own" in text, text


@pytest.fixture
def sticky(tmp_path: Path) -> Iterator[Path]:
    """A folder like /tmp: everyone may write, only an entry's owner may rename or remove it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    yield folder


# -- item 11: advice that changes nothing, naming the variable ------------------------------------------------------

def test_a_spill_folder_that_is_a_file_like_etc_passwd_is_refused_without_advice_to_remove_it(monkeypatch):
    """Before: "Fix: rm /etc/passwd"."""
    before = os.stat("/etc/passwd")
    monkeypatch.setenv("APSI_SPILL_DIR", "/etc/passwd")
    with pytest.raises(UnsafePathError, match="/etc/passwd is not a folder") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, "APSI_SPILL_DIR")
    assert os.stat("/etc/passwd").st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("variable", ["APSI_SPILL_DIR", "APSI_HOME"])
def test_a_folder_others_can_write_is_refused_with_advice_naming_the_variable(tmp_path, monkeypatch, variable):
    """Before: "Fix: chmod go-w <folder>", which run on a shared folder breaks it for everyone."""
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv(variable, str(folder))
    with pytest.raises(UnsafePathError, match="writable by others") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, variable)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 and list(folder.iterdir()) == []


def test_a_symlinked_spill_folder_is_refused_and_not_followed(tmp_path, monkeypatch):
    """Before: the link was followed and the spill file made in its target."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "spill"
    link.symlink_to(target)
    monkeypatch.setenv("APSI_SPILL_DIR", str(link))
    with pytest.raises(UnsafePathError, match=f"{link} is a symbolic link") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, "APSI_SPILL_DIR")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("variable", ["APSI_SPILL_DIR", "APSI_HOME"])
def test_a_folder_above_the_spill_folder_that_others_can_write_is_refused(tmp_path, monkeypatch, variable):
    """Before: folders above the spill folder were never checked; whoever can write one can swap ours."""
    above = tmp_path / "above"
    above.mkdir()
    above.chmod(0o777)
    monkeypatch.setenv(variable, str(above / "mine"))
    with pytest.raises(UnsafePathError, match=f"{above} \\(above the folder used\\) is writable by others") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, variable)
    assert list(above.iterdir()) == []


def test_a_store_path_given_in_python_is_refused_with_advice_that_names_no_variable(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    memory.allow_write(tmp_path)
    with pytest.raises(UnsafePathError, match=f"{folder} is writable by others") as caught:
        memory.store(str(folder))
    assert_safe_advice(caught.value, None)
    assert "give the store another path" in str(caught.value)


@pytest.mark.parametrize("kind", ["file", "symbolic link", "folder"])
def test_a_planted_data_folder_inside_a_store_is_refused_with_safe_advice(home, tmp_path, kind):
    s = memory.store("t")
    s.set("k", b"x")
    s.close()
    data = Path(s.folder) / "data"
    for name in os.listdir(data):
        os.unlink(data / name)
    data.rmdir()
    if kind == "file":
        data.write_bytes(b"planted")
    elif kind == "symbolic link":
        data.symlink_to(tmp_path)
    else:
        data.mkdir()
        data.chmod(0o777)
    with pytest.raises(UnsafePathError, match=f"{data} is") as caught:
        memory.store("t")
    assert_safe_advice(caught.value, "APSI_STORE_DIR")


def test_a_read_only_spill_folder_is_named_not_a_raw_permission_error(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes through a read-only mode; tests/real/test_path_trust_real.py tries it as a user")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    monkeypatch.setenv("APSI_SPILL_DIR", str(folder))
    with pytest.raises(UnsafePathError, match=f"{folder} cannot be written by this user") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, "APSI_SPILL_DIR")


def test_no_advice_in_the_package_removes_chmods_or_chowns():
    """A sweep over the source: a fix is written after "Fix:"/"fix:" in an f-string or string constant."""
    package = Path(memory.__file__).parent
    found = []
    for source in package.rglob("*.py"):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            advice = re.search(r"[Ff]ix: (.*)", line)
            if advice and DESTRUCTIVE.search(advice.group(1)):
                found.append(f"{source.name}:{number}: {line.strip()}")
    assert found == []


# -- issue 21 item 4: shared sticky folders just work ---------------------------------------------------------------

@pytest.mark.parametrize("variable", ["APSI_SPILL_DIR", "APSI_HOME"])
def test_a_shared_sticky_spill_folder_means_a_private_subfolder_there(sticky, monkeypatch, variable):
    """Before: refused with "Fix: chmod go-w /tmp"."""
    monkeypatch.setenv(variable, str(sticky))
    x = memory.array((2, 1 << 17))
    memory.budget(0)
    y = memory.array((2, 1 << 17))
    assert memory.on_disk(y)
    own = sticky / f"apsi-{os.geteuid()}"
    assert Path(y.filename).is_relative_to(own)
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.stat().st_uid == os.geteuid()
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1777, "the shared folder itself is left as it was"
    memory.free(y)
    del x


def test_a_store_folder_in_a_shared_sticky_folder_just_works(sticky, monkeypatch):
    monkeypatch.setenv("APSI_STORE_DIR", str(sticky))
    s = memory.store("t")
    s.set("k", b"v")
    assert s.get("k") == b"v"
    assert Path(s.folder).parent == sticky / f"apsi-{os.geteuid()}"
    s.close()


def test_a_store_path_under_a_shared_sticky_folder_is_used_as_given(sticky):
    """The sticky bit keeps others from renaming or removing our folder there, so it needs no subfolder."""
    memory.allow_write(sticky)
    s = memory.store(str(sticky / "mine"))
    s.set("k", 1)
    assert s.get("k") == 1 and s.folder == str(sticky / "mine")
    s.close()


@pytest.mark.parametrize("shared", ["/tmp", "/dev/shm"])
def test_the_real_tmp_and_dev_shm_work_as_spill_folders(monkeypatch, shared):
    if not os.path.isdir(shared) or not os.stat(shared).st_mode & stat.S_ISVTX:
        pytest.skip(f"{shared} is not a shared sticky folder here")
    own = Path(shared) / f"apsi-{os.geteuid()}"
    existed = own.exists()
    monkeypatch.setenv("APSI_SPILL_DIR", shared)
    x = spill.create((4, 1 << 10), FLOAT64)
    try:
        assert os.path.dirname(x.filename) == str(own)
    finally:
        spill.release(x.filename)
        if not existed:
            with contextlib.suppress(OSError):  # another test process may be using it now: then it stays
                own.rmdir()


def test_a_subfolder_there_that_is_a_link_is_refused_naming_the_variable(sticky, tmp_path, monkeypatch):
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    (sticky / f"apsi-{os.geteuid()}").symlink_to(target)
    monkeypatch.setenv("APSI_SPILL_DIR", str(sticky))
    with pytest.raises(UnsafePathError, match="is a symbolic link") as caught:
        spill.create((4,), FLOAT64)
    assert_safe_advice(caught.value, "APSI_SPILL_DIR")
    assert list(target.iterdir()) == []


# -- issue 20 item 8: empty and relative values, the CLI's listings ------------------------------------------------

def test_an_empty_apsi_home_means_the_default_not_the_working_folder(tmp_path, monkeypatch):
    """``APSI_HOME=$UNSET_VAR`` gives ''; before, spill files went into the working folder."""
    monkeypatch.setenv("APSI_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.chdir(tmp_path)
    assert paths.spill_dir() == str(tmp_path / "me" / ".apsi" / "spill")
    x = spill.create((4,), FLOAT64)
    assert os.path.dirname(x.filename) == str(tmp_path / "me" / ".apsi" / "spill")
    spill.release(x.filename)


@pytest.mark.parametrize("variable", ["APSI_HOME", "APSI_SPILL_DIR", "APSI_STORE_DIR"])
def test_a_relative_folder_is_an_error_naming_the_variable(tmp_path, monkeypatch, variable):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, "cache")
    with pytest.raises(ArgumentError, match=f"{variable}='cache' is a relative path"):
        if variable == "APSI_STORE_DIR":
            memory.store("t")
        else:
            spill.create((4,), FLOAT64)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["spill", "stores"])
def test_the_cli_refuses_to_list_a_regular_file_as_an_empty_folder(tmp_path, monkeypatch, capsys, command):
    file = tmp_path / "a file"
    file.write_text("not a folder")
    variable = "APSI_SPILL_DIR" if command == "spill" else "APSI_STORE_DIR"
    monkeypatch.setenv(variable, str(file))
    assert main([command]) == 1
    err = capsys.readouterr().err
    assert f"{file} is not a folder" in err and f"{variable}=" in err
    assert file.read_text() == "not a folder"


def test_the_cli_takes_an_empty_store_name_as_an_error_before_removing_anything(home, capsys):
    s = memory.store("t")
    s.set("k", 1)
    s.close()
    assert main(["clean", "--store", "", "--json"]) == 1
    assert "--store takes the plain name of a store" in json.loads(capsys.readouterr().out)["error"]  # --json
    assert memory.store("t").get("k") == 1
    assert main(["clean", "--json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["store"] is None


def test_sticky_folders_are_told_apart_from_folders_that_are_merely_open(tmp_path):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    folder.chmod(0o777)
    assert paths.own_part(str(folder)) == str(folder)
    folder.chmod(0o1777)
    assert paths.own_part(str(folder)) == str(folder / f"apsi-{os.geteuid()}")
    folder.chmod(0o1755)  # sticky but only its owner writes: nothing shared
    assert paths.own_part(str(folder)) == str(folder)


# -- every refusal of the trust checks, one by one: what it says and what it advises ------------------------------

def stat_of(mode: int, uid: int | None = None) -> os.stat_result:
    """A stat result with ``mode`` and ``uid`` (default: ours), the rest zero."""
    return os.stat_result((mode, 0, 0, 1, os.geteuid() if uid is None else uid, 0, 0, 0, 0, 0))


OTHER_UID = 54321
REFUSALS = [  # (check, stat, what the message says)
    (trust.check_folder, stat_of(stat.S_IFREG | 0o600), "is not a folder"),
    (trust.check_folder, stat_of(stat.S_IFDIR | 0o700, OTHER_UID), f"belongs to uid {OTHER_UID}"),
    (trust.check_folder, stat_of(stat.S_IFDIR | 0o770), "is writable by others"),
    (trust.check_file, stat_of(stat.S_IFDIR | 0o700), "is a folder, not a file"),
    (trust.check_file, stat_of(stat.S_IFIFO | 0o600), "is not a regular file"),
    (trust.check_file, stat_of(stat.S_IFREG | 0o600, OTHER_UID), f"belongs to uid {OTHER_UID}"),
    (lambda path, st: trust.check_file(path, st, secret=True), stat_of(stat.S_IFREG | 0o640),
     "can be read or written by others"),
    (trust._check_above, stat_of(stat.S_IFREG | 0o600), r"\(above the folder used\) is not a folder"),
    (trust._check_above, stat_of(stat.S_IFDIR | 0o755, OTHER_UID), r"\(above the folder used\) belongs to uid"),
    (trust._check_above, stat_of(stat.S_IFDIR | 0o777), r"\(above the folder used\) is writable by others"),
]


@pytest.mark.parametrize(("check", "st", "says"), REFUSALS)
@pytest.mark.parametrize("variable", [None, *trust.FOLDER_VARIABLES])
def test_every_refusal_names_the_variable_that_pointed_there_and_changes_nothing(check, st, says, variable,
                                                                                  tmp_path, monkeypatch):
    for name in trust.FOLDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if variable is not None:
        monkeypatch.setenv(variable, str(tmp_path))
    path = str(tmp_path / "folder" / "file")
    with pytest.raises(UnsafePathError, match=f"{path} {says}") as caught:
        check(path, st)
    assert_safe_advice(caught.value, variable)


def test_a_shared_sticky_folder_and_our_own_folders_pass_the_checks_above():
    trust._check_above("/tmp", stat_of(stat.S_IFDIR | 0o1777, 0))
    trust._check_above("/home/me", stat_of(stat.S_IFDIR | 0o755))
    trust._check_above("/bin", stat_of(stat.S_IFLNK | 0o777, 0))
