"""Issue 20 item 7 and issue 21 item 4 with a real second user (``useradd``, removed afterwards): spill folders get
the trust checks that keys and stores get, and a shared sticky folder gives each user a private subfolder.

Figures: each test counts the files written where it should not (0) and the refusals that name their variable."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import spill
from apsi_memory.errors import UnsafePathError
from apsi_memory.store import signing

pytestmark = pytest.mark.real
FLOAT64 = np.dtype("float64")


def as_user(uid: int, gid: int, work: Callable[[], str]) -> str:
    """``work()`` run in a forked child that becomes the other user; its answer, or what it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgid(gid)
            os.setuid(uid)
            answer = work()
        except BaseException as err:  # noqa: BLE001 - sent back to the test, which checks it
            answer = f"{type(err).__name__}: {err}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def sticky_in(folder: Path) -> Path:
    shared = folder / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def test_an_apsi_home_of_another_uid_is_refused_for_spill_files_too(other_user, reachable, monkeypatch):
    """Before: refused for the key and stores but used for spill files (a spill folder made inside it)."""
    uid, gid = other_user
    theirs = reachable / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, uid, gid)
    monkeypatch.setenv("APSI_HOME", str(theirs))
    monkeypatch.delenv("APSI_SPILL_DIR", raising=False)
    signing._cache.clear()
    refusals = 0
    for use in (lambda: spill.create((4,), FLOAT64), lambda: memory.store("t")):
        with pytest.raises(UnsafePathError, match=f"{theirs} .*belongs to uid {uid}.*Fix: APSI_HOME="):
            use()
        refusals += 1
    written = list(theirs.iterdir())
    print(f"refusals naming APSI_HOME: {refusals} of 2, files written in their folder: {len(written)}")
    assert written == []


def test_a_private_subfolder_someone_else_made_first_in_a_shared_folder_is_refused(other_user, reachable, monkeypatch):
    uid, gid = other_user
    shared = sticky_in(reachable)
    squatted = shared / f"apsi-{os.geteuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, uid, gid)
    monkeypatch.setenv("APSI_SPILL_DIR", str(shared))
    with pytest.raises(UnsafePathError, match=f"{squatted} belongs to uid {uid}.*Fix: APSI_SPILL_DIR=") as caught:
        spill.create((4,), FLOAT64)
    assert "rm" not in str(caught.value).split("Fix:")[1].split()
    assert list(squatted.iterdir()) == []


def test_two_users_share_a_sticky_spill_folder_each_in_a_private_subfolder(other_user, reachable, monkeypatch):
    uid, gid = other_user
    shared = sticky_in(reachable)
    monkeypatch.setenv("APSI_SPILL_DIR", str(shared))
    mine = spill.create((4,), FLOAT64)

    def spill_as_them() -> str:
        made = str(spill.create((4,), FLOAT64).filename)
        spill.release(made)
        return made

    try:
        theirs = as_user(uid, gid, spill_as_them)
    finally:
        spill.release(mine.filename)
    assert os.path.dirname(theirs) == str(shared / f"apsi-{uid}"), theirs
    assert os.path.dirname(mine.filename) == str(shared / f"apsi-{os.geteuid()}")
    info = (shared / f"apsi-{uid}").stat()
    assert info.st_uid == uid and stat.S_IMODE(info.st_mode) == 0o700
    assert not os.path.exists(theirs), "their process could delete its own file"


@pytest.mark.parametrize("below", [False, True], ids=["the folder", "a folder to make in it"])
def test_a_read_only_spill_folder_is_named_not_a_raw_permission_error(other_user, reachable, below):
    uid, gid = other_user
    folder = reachable / "read-only"
    folder.mkdir(mode=0o500)
    os.chown(folder, uid, gid)

    def spill_there() -> str:
        os.environ["APSI_SPILL_DIR"] = str(folder / "spill" if below else folder)
        return str(spill.create((4,), FLOAT64).filename)

    answer = as_user(uid, gid, spill_there)
    assert answer.startswith("UnsafePathError") and f"{folder} cannot be written by this user" in answer, answer
    assert "Fix: APSI_SPILL_DIR=" in answer and list(folder.iterdir()) == []
