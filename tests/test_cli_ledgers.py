"""``apsi-memory spill`` lists the reservation ledgers' files and ``clean`` removes those no live process holds
that the library made (issue 26 item 13): one file per memory group ever used otherwise stays in ``/dev/shm``.

Each ``Siblings`` here stands for a process (its own open file, its own slot lock); closing one is its death."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import apsi_memory as memory
from apsi_memory.cli.commands import main
from apsi_memory.machinery import ledgers
from apsi_memory.machinery.reservations import FILE_BYTES, Record, Siblings, group_key, pack_record
from apsi_memory.system.paths import ledger_name

MiB = 1 << 20
DEAD_KEY = ledger_name(1, "/sys/fs/cgroup/memory/gone")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def ledger() -> Path:
    return Path(os.environ["APSI_LEDGER_DIR"])


@pytest.fixture
def live_and_dead(ledger: Path):
    """A live process in this process's group, and the file of a group whose last process was SIGKILLed (its
    record is there, its lock went with it)."""
    live = Siblings([str(ledger)], pid=4242)
    live.publish(group_key(memory.machine().memory()), 300 * MiB, 300 * MiB)
    fd = os.open(ledger / DEAD_KEY, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.pwrite(fd, pack_record(Record(4343, 1, 100 * MiB, 100 * MiB, 0)).ljust(FILE_BYTES, b"\0"), 0)
    os.close(fd)
    yield live
    live.close()


def test_spill_lists_each_ledger_file_with_its_group_live_slots_and_size(capsys, ledger, live_and_dead):
    listed = cli(capsys, "spill")
    by_name = {Path(f["path"]).name: f for f in listed["ledgers"]}
    own = group_key(memory.machine().memory())
    assert set(by_name) == {own, DEAD_KEY}
    assert (by_name[own]["live_slots"], by_name[own]["size_bytes"], by_name[own]["ours"]) == (1, 6144, True)
    assert by_name[DEAD_KEY]["live_slots"] == 0
    assert by_name[own]["group"] == "host" or by_name[own]["group"].startswith("v")
    assert {"folder", "files", "total_bytes"} <= set(listed)  # the keys there were: kept
    assert main(["spill"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "2 ledger files, 1 with no live slot" in text and "1 live slot" in text


def test_clean_removes_only_the_ledger_no_live_process_holds(capsys, ledger, live_and_dead):
    own = group_key(memory.machine().memory())
    would = cli(capsys, "clean", "--dry-run")
    assert [Path(f["path"]).name for f in would["ledgers"]] == [DEAD_KEY] and (ledger / DEAD_KEY).exists()
    done = cli(capsys, "clean")
    assert [Path(f["path"]).name for f in done["ledgers"]] == [DEAD_KEY]
    assert {"dry_run", "spill_files", "store"} <= set(done)
    assert not (ledger / DEAD_KEY).exists() and (ledger / own).exists()
    observer = Siblings([str(ledger)])
    try:  # the live process's file is untouched: it is still seen
        assert observer.read(own).reserved_bytes == 300 * MiB
    finally:
        observer.close()


def made(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)
    return path.name


def test_clean_never_removes_a_file_the_library_did_not_make(capsys, ledger, tmp_path):
    """Named like a ledger, none of these is one of ours; each is listed with why, and kept. Control: the same
    kind of name holding an empty ledger of ours is removed."""
    ledger.mkdir(mode=0o700, exist_ok=True)
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(6144))
    name = [ledger / ledger_name(1, f"/kept/{n}") for n in range(5)]
    name[0].symlink_to(target)
    kept = {name[0].name: "symbolic links", made(name[1], bytes(6144), 0o644): "mode 644",
            made(name[2], b"x" * 6144): "slot 0 is not a record", made(name[3], bytes(100)): "100 bytes, not 6144"}
    if os.geteuid() == 0:
        kept[made(name[4], bytes(6144))] = "belongs to uid 54321"
        os.chown(name[4], 54321, 54321)
    ours = made(ledger / ledger_name(1, "/ours"), bytes(6144))
    listed = {Path(f["path"]).name: f for f in cli(capsys, "spill")["ledgers"]}
    print("\n".join(f"{n[:20]}: {f['problem']}" for n, f in listed.items()))
    assert {n: why in listed[n]["problem"] and not listed[n]["ours"] for n, why in kept.items()} == dict.fromkeys(
        kept, True)
    assert [Path(f["path"]).name for f in cli(capsys, "clean")["ledgers"]] == [ours]
    assert all(os.path.lexists(ledger / n) for n in kept) and not (ledger / ours).exists()
    assert target.read_bytes() == bytes(6144)


def test_a_slot_claimed_after_the_count_keeps_the_file(capsys, ledger, live_and_dead, monkeypatch):
    """The interleaving ``clean`` must survive: a process claims a slot after the slots were counted (here: the
    count says 0 while a live process holds one). The file is removed only under every slot's lock, so it stays.
    Control: the dead group's file, counted the same way, goes."""
    own = group_key(memory.machine().memory())
    monkeypatch.setattr(ledgers, "_live_slots", lambda fd: 0)
    removed = [Path(f["path"]).name for f in cli(capsys, "clean")["ledgers"]]
    assert removed == [DEAD_KEY] and (ledger / own).exists()
