"""The fast paths of issue 14 keep the store's guarantees: the cheaper MAC still binds store, key and version
(entries signed the previous way are misses: ``test_store_trust.OLD_SIGNATURES``), and the index checkpoint that
makes opening cheap is only ever a shortcut (stale, changed, copied or linked: ignored, the journal replayed
whole)."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory.errors import TamperWarning
from apsi_memory.store import checkpoint, signing


def test_the_mac_binds_every_part_and_the_key():
    key, parts = b"k" * 32, (b"P", b"skey", b"0123456789abcdef", b"value")
    signature = signing.mac(key, *parts)
    assert signing.mac_verify(key, signature, *parts)
    assert not signing.mac_verify(b"j" * 32, signature, *parts)
    assert not signing.mac_verify(key, signature, b"P", b"skey", b"0123456789abcdef", b"valuf")
    assert not signing.mac_verify(key, signature, b"P", b"ske", b"y0123456789abcdef", b"value")  # framed
    big = b"v" * (1 << 20)  # hashed in parts, not joined: the same framing
    assert signing.mac_verify(key, signing.mac(key, b"M", big), b"M", memoryview(big))


# -- the index checkpoint: an open replays only the journal's tail, and a checkpoint is only ever a shortcut --------

N = 300


@pytest.fixture
def small_checkpoints(monkeypatch):
    monkeypatch.setattr(checkpoint, "MIN_RECORDS", 64)  # so a few hundred entries write one


def filled(name: str = "t") -> memory.Store:
    s = memory.store(name)
    for i in range(N):
        s.set(f"k{i}", {"i": i})
    return s


def replayed(name: str = "t") -> list[object]:
    """Keys in recency order as a full replay sees them (the checkpoint moved away for the look)."""
    path = Path(memory.store(name).folder) / "checkpoint"
    saved = path.read_bytes()
    path.unlink()
    keys = list(memory.store(name))
    path.write_bytes(saved)
    return keys


def test_a_reopened_store_starts_from_the_checkpoint_and_replays_only_the_tail(home, small_checkpoints):
    s = filled()
    s.get("k3")
    s.flush()
    assert (Path(s.folder) / "checkpoint").exists()
    reopened = memory.store("t")
    assert reopened._journal.since_checkpoint < 64  # the records after the checkpoint, not all N
    assert list(reopened) == replayed() and len(reopened) == N
    assert all(reopened[f"k{i}"] == {"i": i} for i in range(N))


def test_a_long_journal_without_checkpoint_gets_one_from_its_first_opener(home, small_checkpoints):
    """A store only ever read (or written by a version without checkpoints) must not replay all of it forever."""
    path = Path(filled().folder) / "checkpoint"
    path.unlink()
    assert memory.store("t")["k5"] == {"i": 5} and path.exists()
    assert memory.store("t")._journal.since_checkpoint <= 1  # the touch record of that read, after the checkpoint


def test_a_writer_that_closes_saves_its_tail_so_the_next_open_replays_nothing(home, small_checkpoints):
    s = memory.store("t")
    for i in range(1000):  # a checkpoint every 1/8 of the entries: 125 records apart by the end
        s.set(f"k{i}", i)
    while s._journal.since_checkpoint < checkpoint.MIN_RECORDS:
        s.set(f"more{s._journal.since_checkpoint}", 1)
    s.close()
    reopened = memory.store("t")
    assert reopened._journal.since_checkpoint == 0 and len(reopened) == len(replayed())
    assert reopened["k999"] == 999


def test_writes_after_the_checkpoint_are_seen_by_the_next_open(home, small_checkpoints):
    s = filled()
    s.delete("k0")
    s.set("k1", "replaced")
    s.set("new", 1)
    reopened = memory.store("t")
    assert "k0" not in reopened and reopened["k1"] == "replaced" and reopened["new"] == 1
    assert len(reopened) == N


@pytest.mark.parametrize("change", ["clear", "compact"])
def test_a_checkpoint_of_an_earlier_journal_is_ignored(home, small_checkpoints, change):
    s = filled()
    path = Path(s.folder) / "checkpoint"
    earlier = path.read_bytes()
    if change == "clear":
        s.clear()
        s.set("only", 1)
    else:
        for i in range(N // 2):
            s.delete(f"k{i}")
        s._compact_if_due(force=True)
    assert not path.exists()  # removed with the journal it described
    path.write_bytes(earlier)  # as if a process had been killed before removing it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stale is not tampered: no warning
        reopened = memory.store("t")
    assert sorted(map(str, reopened)) == (["only"] if change == "clear" else sorted(f"k{i}" for i in range(N // 2, N)))


def test_a_changed_checkpoint_is_ignored_with_a_warning_and_the_journal_replayed(home, small_checkpoints):
    s = filled()
    path = Path(s.folder) / "checkpoint"
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    with pytest.warns(TamperWarning, match="checkpoint: does not verify"):
        reopened = memory.store("t")
    assert len(reopened) == N and reopened["k7"] == {"i": 7}


def test_a_checkpoint_copied_from_another_store_is_ignored(home, small_checkpoints):
    filled("a")
    b = memory.store("b")
    b.set("mine", 1)
    (Path(b.folder) / "checkpoint").write_bytes((Path(memory.store("a").folder) / "checkpoint").read_bytes())
    with pytest.warns(TamperWarning):
        assert list(memory.store("b")) == ["mine"]


def test_a_checkpoint_that_is_a_symbolic_link_is_not_followed(home, small_checkpoints, tmp_path):
    s = filled()
    path = Path(s.folder) / "checkpoint"
    target = tmp_path / "elsewhere"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    assert len(memory.store("t")) == N  # replayed whole


def test_a_failed_checkpoint_write_leaves_the_set_done_and_the_old_checkpoint(home, small_checkpoints, monkeypatch):
    s = filled()
    before = (Path(s.folder) / "checkpoint").read_bytes()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(checkpoint, "write_all", full)
        for i in range(N):
            s.set(f"more{i}", i)
    assert (Path(s.folder) / "checkpoint").read_bytes() == before
    assert not [p for p in Path(s.folder).iterdir() if p.name.endswith(".tmp")]
    reopened = memory.store("t")
    assert len(reopened) == 2 * N and reopened["more7"] == 7


# -- the disk a checkpoint may take: bounded without a stat, and never of an older journal -------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=120),
       deleted=st.integers(0, 100), compact=st.booleans())
def test_a_checkpoint_and_its_replacement_fit_the_bound_eviction_counts_without_a_stat(
        home, small_checkpoints, keys, deleted, compact):
    """``checkpoint.room_bound`` lets every write skip looking the checkpoint up while the store is far below its
    limit: it must hold for any keys (long ones make the widest rows), before and after a compaction."""
    checkpoint.MIN_RECORDS = 1
    s = memory.store(f"b{len(keys)}-{deleted}-{compact}")
    for i, key in enumerate(keys):
        s.set(key, i)
    for key in keys[:deleted]:
        s.delete(key)
    if compact:
        s._compact_if_due(force=True)
    with s._lock, s._journal:
        s._catch_up()
        s._journal.checkpoint_if_due(s._seal.store_key, s._index.snapshot, share=0)
    path = Path(s.folder) / "checkpoint"
    if path.exists():
        records = s._journal.offset - s._index.inline_total
        assert 2 * path.stat().st_size <= checkpoint.room_bound(records)


def test_a_compaction_killed_after_its_switch_leaves_no_checkpoint_of_the_old_journal(home, small_checkpoints,
                                                                                        monkeypatch):
    """The compacting writer dies after the new journal took the old one's place (odd epoch still): the next
    writer finishes the switch and removes the old journal's checkpoint, which no disk accounting may miss."""
    s = filled()
    other = memory.store("t")
    path = Path(s.folder) / "checkpoint"
    assert path.exists()
    monkeypatch.setattr(checkpoint, "MIN_RECORDS", 10**9)  # no new checkpoint from here on
    with s._journal:
        s._journal._bump(epoch_step=1)  # the compaction's first step
    copy = s._journal.path + ".new.tmp"
    shutil.copyfile(s._journal.path, copy)
    os.replace(copy, s._journal.path)  # the switch; then the writer died, its checkpoint still there
    other.set("after", 1)
    assert not path.exists()
    assert memory.store("t")["after"] == 1 and len(memory.store("t")) == N + 1
