"""Issue 9 on the real system: a full disk (a small tmpfs) and a second real user (a throwaway uid).

Full disk: ``@cached`` returns its result with a ``NotCachedWarning``; ``delete`` and ``clear`` work (they free
space); making the signing key is a ``DiskFullError`` that leaves no ``key.<pid>.<hex>`` behind. Second user: a
home, key and store that another uid made (with a pickle that would create a marker file when loaded) are refused
with ``UnsafePathError``; code executions 0.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import DiskFullError, NotCachedWarning, UnsafePathError
from apsi_memory.store import signing

pytestmark = pytest.mark.real


def needs_root() -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs and adding a user need root on Linux")


def fill(disk: Path) -> None:
    """Take every free byte left."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert shutil.disk_usage(disk).free < 8192


def test_cached_on_a_full_disk_returns_the_result_and_warns(small_disk):
    @memory.cached(store=str(small_disk / "cache"))
    def big(n: int) -> np.ndarray:
        return np.arange(n, dtype=np.float64)

    assert big(10)[3] == 3  # the store exists; now nothing more fits
    fill(small_disk)
    with pytest.warns(NotCachedWarning, match="big: result returned but not cached: .*no space left"):
        result = big(200_000)
    assert result.shape == (200_000,) and result[-1] == 199_999


def test_cached_whose_store_cannot_even_be_made_runs_uncached_and_warns(small_disk):
    @memory.cached(store=str(small_disk / "never"))
    def double(x: int) -> int:
        return 2 * x

    fill(small_disk)
    with pytest.warns(NotCachedWarning, match="double: result returned but not cached"):
        assert double(21) == 42


def test_delete_and_clear_work_on_a_full_disk(small_disk):
    s = memory.store(small_disk / "s", disk_gb=1)
    for i in range(5):
        s.set(f"file{i}", np.full(50_000, i))  # memory-mapped files
        s.set(f"small{i}", {"i": i})  # inside the journal
    fill(small_disk)
    assert s.delete("file0") and s.delete("small0")
    (small_disk / "filler").unlink()
    fill(small_disk)
    s.clear()
    reader = memory.store(small_disk / "s", ram_mb=0, disk_gb=1)
    assert len(reader) == 0 and reader.get("file1") is None and reader.get("small1") is None
    assert os.listdir(small_disk / "s" / "data") == []


def test_on_a_full_disk_new_values_are_refused_and_removals_still_recorded(small_disk):
    """Values inside the journal free nothing when deleted, and their DEL records need room: the journal keeps
    room past its end that only removals may use, so a disk filled by someone else never makes a store whose
    values cannot be deleted. Figure: 300 deletes of 300 (they need about 9 KiB, more than any page left over)."""
    s = memory.store(small_disk / "s", disk_gb=1)
    for i in range(400):
        s.set(f"small{i}", {"i": i})
    fill(small_disk)
    refused = 0
    for i in range(2000):  # new values go on only while they leave the removals' room alone
        try:
            s.set(f"more{i}", {"i": i})
        except DiskFullError:
            refused += 1
            break
    assert refused == 1
    deleted = sum(s.delete(f"small{i}") for i in range(300))
    assert deleted == 300
    reader = memory.store(small_disk / "s", ram_mb=0, disk_gb=1)
    assert reader.get("small350") == {"i": 350} and reader.get("small5") is None
    assert len([key for key in reader if str(key).startswith("small")]) == 100


def test_making_the_key_on_a_full_disk_is_a_disk_full_error_and_leaves_nothing(small_disk, monkeypatch):
    home = small_disk / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("APSI_HOME", str(home))
    fill(small_disk)
    signing._cache.clear()
    with pytest.raises(DiskFullError, match="signing key"):
        signing.user_key()
    assert os.listdir(home) == []


# -- a second real uid ---------------------------------------------------------------------------------------

class RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def as_user(uid: int, gid: int, home: Path, stores: Path, marker: Path) -> None:
    """In a forked child that becomes the other user: make their home, key and a store holding a pickle that
    would create ``marker`` when loaded, all signed with their own key."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(gid)
            os.setuid(uid)
            os.environ["APSI_HOME"], os.environ["APSI_STORE_DIR"] = str(home), str(stores)
            signing._cache.clear()
            memory.store("shared").set("k", [RunsCode(str(marker)), "x" * 30_000])
            code = 0
        except BaseException as err:  # noqa: BLE001 - reported, then the child exits non-zero
            os.write(2, f"as the other user: {err!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_home_and_store_made_by_another_uid_are_refused_and_nothing_runs(other_user, reachable, monkeypatch):
    uid, gid = other_user
    tmp_path = reachable
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, uid, gid)
    home, stores, marker = shared / "home", shared / "stores", tmp_path / "it ran"
    as_user(uid, gid, home, stores, marker)
    assert (home / "key").stat().st_uid == uid and (stores / "shared").stat().st_uid == uid
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    signing._cache.clear()
    monkeypatch.setenv("APSI_HOME", str(home))  # their home, with their key
    monkeypatch.setenv("APSI_STORE_DIR", str(stores))
    with pytest.raises(UnsafePathError, match=f"belongs to uid {uid}"):
        memory.store("shared").get("k")
    monkeypatch.setenv("APSI_HOME", str(tmp_path / "mine"))  # our own key, their store folder
    signing._cache.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # refused at their folder above the store folder, naming the variable that pointed there
        with pytest.raises(UnsafePathError, match=rf"{shared} \(above the folder used\) belongs to uid {uid}.*Fix: "
                                                  "APSI_STORE_DIR="):
            memory.store("shared").get("k")
    assert not marker.exists(), "code executions: 0"
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before, "nothing written"
