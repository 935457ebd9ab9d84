"""memory.store: what a user of the two-tier cache sees (single process)."""

from __future__ import annotations

import mmap
import os
import re
import shutil

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.decide import Level
from apsi_memory.errors import SizeError
from apsi_memory.store import decode_key
from apsi_memory.store.codec import MMAP_MIN_BYTES
from apsi_memory.units import GiB, MiB

KIB = 1024


# A simulated container at ``ok`` (conftest's ``pressure_machine``), so this machine's own memory pressure cannot
# shrink the RAM tiers under test; ``home`` puts the key and the stores under the test's folder.
pytestmark = pytest.mark.usefixtures("pressure_machine", "home")


def gb(n_bytes: int) -> float:
    return n_bytes / GiB


def files_in(s: memory.Store) -> list[str]:
    return sorted(os.listdir(os.path.join(s.folder, "data")))


def test_values_of_every_kind_come_back_equal():
    s = memory.store("kinds")
    s.set("dict", {"a": [1, 2, 3]})
    s.set(7, "seven")
    s.set(b"\x00raw", b"bytes value")
    s.set("small", np.arange(10, dtype=np.int16))
    s.set("medium", np.arange(10_000, dtype=np.float32))  # 40 KiB: a file read whole
    s.set("big", np.ones((300, 1000), dtype=np.float64))  # 2.3 MiB: memory-mapped
    assert s.get("dict") == {"a": [1, 2, 3]}
    assert s.get(7) == "seven"
    assert s.get(b"\x00raw") == b"bytes value"
    np.testing.assert_array_equal(s.get("small"), np.arange(10, dtype=np.int16))
    np.testing.assert_array_equal(s.get("medium"), np.arange(10_000, dtype=np.float32))
    assert s.get("big").shape == (300, 1000) and s.get("big").dtype == np.float64


def test_int_str_and_bytes_keys_are_different_keys():
    s = memory.store("keys")
    s.set(1, "int")
    s.set("1", "str")
    s.set(b"1", "bytes")
    assert (s.get(1), s.get("1"), s.get(b"1")) == ("int", "str", "bytes")
    assert len(s) == 3


def test_keys_of_other_types_are_refused_with_the_type_named():
    s = memory.store("badkeys")
    for key in (1.5, True, ("a", 1), None):
        with pytest.raises(TypeError, match=type(key).__name__):
            s.set(key, 1)


def test_missing_keys_default_or_raise():
    s = memory.store("missing")
    assert s.get("nope") is None
    assert s.get("nope", 42) == 42
    with pytest.raises(KeyError):
        s["nope"]
    with pytest.raises(KeyError):
        del s["nope"]
    assert s.delete("nope") is False
    assert "nope" not in s


def test_none_is_a_value_not_a_miss():
    s = memory.store("none")
    s["k"] = None
    assert "k" in s and s["k"] is None and s.get("k", "default") is None


def test_delete_clear_len_iteration():
    s = memory.store("ops")
    for i in range(5):
        s[i] = i * i
    s.set("big", np.zeros(50_000))
    assert len(s) == 6
    assert list(s) == [0, 1, 2, 3, 4, "big"]
    del s[2]
    assert s.delete("big") is True
    assert 2 not in s and len(s) == 4 and files_in(s) == []
    s.clear()
    assert len(s) == 0 and list(s) == [] and s.get(1) is None and s.disk_bytes == 0 and s.ram_bytes == 0


def test_iteration_is_least_recently_used_first():
    s = memory.store("order")
    for key in "abcd":
        s[key] = key
    s.get("a")
    s.set("c", "again")
    assert list(s) == ["b", "d", "a", "c"]


def test_str_reports_both_tiers_as_in_the_spec():
    s = memory.store("embeddings", ram_mb=1, disk_gb=1)
    s.set("in ram", np.zeros(1000, np.float32))
    s.set("too big for ram", np.zeros(2 * MiB // 4, np.float32))
    text = str(s)
    # 4,000 bytes in RAM show as KB, not "0.0 MB" (test first failed on that)
    assert re.fullmatch(r"<store embeddings: 1 in RAM \(3\.9 KB\), 2 on SSD \(2\.0 MB\)>", text), text


def test_keys_are_never_file_names():
    s = memory.store("paths")
    evil = ["../../escape", "/etc/passwd", "a/b\\c", "x" * 5000, "\x00", "con", b"../.." * 1000, -10**40]
    for i, key in enumerate(evil):
        s.set(key, np.full(20_000, i))  # big enough for a file of its own
    for i, key in enumerate(evil):
        assert s.get(key)[0] == i
    assert all(re.fullmatch(r"[0-9a-f]{16}\.npy", name) for name in files_in(s))
    assert sorted(os.listdir(s.folder)) == ["data", "index", "lock"]


@pytest.mark.parametrize("n", [10, 1_000_000], ids=["small", "big"])
@pytest.mark.parametrize("tier", ["RAM", "SSD"])
def test_arrays_come_back_writable_and_writing_them_never_changes_the_store(tier, n):
    """As ``np.load`` would: every get is the caller's own writable array (test first failed: read-only)."""
    s = memory.store("arrays")
    s.set("a", np.arange(n, dtype=np.float32))
    if tier == "SSD":
        s.relieve()
    assert (s.ram_bytes > 0) == (tier == "RAM")
    got = s.get("a")
    got += 1
    got[-1] = -5
    assert got[0] == 1 and s["a"][0] == 0 and s["a"][-1] == n - 1  # a second get: the value as stored
    assert isinstance(got.base, mmap.mmap) == (n * 4 >= MMAP_MIN_BYTES)  # big: mapped, not copied
    s.close()
    again = memory.store("arrays")["a"]
    assert again[0] == 0 and again[-1] == n - 1  # the file never changed either


def test_writable_false_shares_the_stores_read_only_array():
    s = memory.store("arrays")
    s.set("big", np.arange(1_000_000, dtype=np.float32))
    shared = s.get("big", writable=False)
    assert shared is s.get("big", writable=False)
    with pytest.raises(ValueError, match="read-only"):
        shared[0] = 99


def test_a_big_array_whose_file_went_meanwhile_still_comes_back_writable_as_stored():
    """The RAM tier's mapping outlives a file another process evicted: the caller gets a copy of it."""
    s = memory.store("arrays")
    s.set("big", np.arange(1_000_000, dtype=np.float32))
    (name,) = files_in(s)
    os.unlink(os.path.join(s.folder, "data", name))
    got = s.get("big")
    got[0] = 7
    assert s.get("big", writable=False)[0] == 0 and got[-1] == 999_999


def anonymous_memory() -> int:
    """This process's anonymous resident memory (a copy counts here; a mapping of a file does not)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="RssAnon is read from Linux's /proc")
def test_a_big_array_set_keeps_no_second_copy_in_ram_and_the_callers_changes_do_not_reach_it():
    s = memory.store("big", ram_mb=256)
    value = np.arange(16 * MiB, dtype=np.float32)  # 64 MiB
    before = anonymous_memory()
    s.set("big", value)
    grown = anonymous_memory() - before
    assert grown < 8 * MiB, f"the set copied the array into RAM ({grown / MiB:.0f} MiB more)"
    assert s.ram_bytes == value.nbytes  # still in the RAM tier: the page cache's copy, mapped
    value[:] = -1  # the caller's array changes after the set
    before = anonymous_memory()
    got = s.get("big")
    got[:256] = 1  # one page copied on write, not the array
    grown = anonymous_memory() - before
    assert grown < 8 * MiB, f"the get copied the array into RAM ({grown / MiB:.0f} MiB more)"
    assert got[0] == 1 and got[-1] == 16 * MiB - 1
    assert s.get("big")[0] == 0


def test_an_array_whose_npy_header_needs_format_2_round_trips():
    """A dtype with very many fields has a header over 64 KiB: written as .npy 2.0, as spill files and
    ``numpy.save`` do (test first failed: ``set`` raised numpy's "Header length ... too big for version=(1, 0)")."""
    wide = np.dtype([(f"field{i}", "u1") for i in range(5000)])
    s = memory.store("wide")
    for key, rows in (("read", 4), ("mapped", 64)):  # 20 KB read whole, 320 KB memory-mapped
        value = np.zeros(rows, dtype=wide)
        value["field7"] = 7
        s.set(key, value)
        s.relieve()  # read back from the SSD
        got = s.get(key)
        assert got.dtype == wide and got.shape == (rows,) and (got["field7"] == 7).all()


def test_changing_what_was_set_or_got_does_not_change_the_cache():
    s = memory.store("copies")
    array, record = np.zeros(4), {"list": [1]}
    s.set("a", array)
    s.set("r", record)
    array[0] = 5
    record["list"].append(2)
    got = s.get("r")
    got["list"].append(3)
    assert s.get("a")[0] == 0 and s.get("r") == {"list": [1]}


def test_ram_tier_keeps_the_most_recently_used_within_its_size():
    s = memory.store("ram", ram_mb=1, disk_gb=1)
    chunk = np.zeros(100 * KIB // 8)  # 100 KiB each: ten fit in 1 MiB
    for i in range(10):
        s.set(i, chunk)
    s.get(0)  # 0 is now the most recently used
    s.set(10, chunk)
    s.set(11, chunk)
    assert s.ram_bytes <= MiB
    in_ram = [decode_key(k) for k in s._ram.values]  # the RAM tier's own order, least recent first
    assert in_ram == [3, 4, 5, 6, 7, 8, 9, 0, 10, 11]
    assert len(s) == 12  # every value is still on the SSD


def test_ssd_tier_evicts_least_recently_used_down_to_90_percent():
    limit = 1 * MiB
    s = memory.store("ssd", ram_mb=0, disk_gb=gb(limit))
    value = np.zeros(100 * KIB // 8)
    for i in range(10):
        s.set(i, value)
    s.get(0)
    before = s.disk_bytes
    s.set(10, value)  # takes it over 1 MiB
    assert before <= limit < before + 100 * KIB + 1000
    assert 0.8 * limit < s.disk_bytes <= 0.9 * limit
    assert list(s) == [3, 4, 5, 6, 7, 8, 9, 0, 10]  # 1 and 2 were the least recently used; 0 was read
    assert len(files_in(s)) == len(s)


def test_a_value_bigger_than_the_ssd_tier_is_refused_and_keeps_the_old_one():
    s = memory.store("toobig", disk_gb=gb(MiB))
    s.set("k", "old")
    with pytest.raises(SizeError, match="does not fit"):
        s.set("k", np.zeros(MiB))
    assert s.get("k") == "old"


def test_an_unpicklable_value_is_refused_and_keeps_the_old_one():
    s = memory.store("unpicklable")
    s.set("k", "old")
    with pytest.raises(TypeError, match="function"):
        s.set("k", lambda: 1)
    assert s.get("k") == "old" and len(s) == 1


def test_bad_sizes_are_named():
    with pytest.raises(SizeError, match="ram_mb"):
        memory.store("x", ram_mb=-1)
    with pytest.raises(SizeError, match="disk_gb"):
        memory.store("x", disk_gb=float("nan"))


def test_reopening_finds_entries_and_their_recency():
    s = memory.store("persist", disk_gb=1)
    for key in "abc":
        s.set(key, {"v": key})
    s.set("arr", np.arange(100_000))
    s.get("a")
    s.close()
    again = memory.store("persist", ram_mb=0, disk_gb=1)
    assert list(again) == ["b", "c", "arr", "a"]
    assert again.get("a") == {"v": "a"} and again.get("arr")[-1] == 99_999


@pytest.mark.parametrize("compacted_by", ["this handle", "another handle"])
def test_reads_keep_their_recency_across_a_compaction(compacted_by):
    """Reads are remembered in memory and reach the index in batches: a compaction in between (by this handle or
    by another process's) must neither lose them nor put them out of order."""
    s = memory.store("order", disk_gb=1)
    for key in "abcd":
        s.set(key, {"v": key})
    s.get("a")
    s.get("b")
    list(s)  # settles both reads into this handle's index
    s.get("c")  # and one more, still only in memory when the compaction comes
    compacting = s if compacted_by == "this handle" else memory.store("order", disk_gb=1)
    with compacting._lock, compacting._journal:
        compacting._catch_up()
        compacting._compact_if_due(force=True)
    assert list(s) == ["d", "a", "b", "c"]
    s.close()
    assert list(memory.store("order", disk_gb=1)) == ["d", "a", "b", "c"]


def test_reopening_with_a_smaller_limit_evicts_the_least_recent():
    s = memory.store("shrink", disk_gb=1)
    for i in range(10):
        s.set(i, np.zeros(100 * KIB // 8))
    s.get(0)
    s.close()
    small = memory.store("shrink", disk_gb=gb(500 * KIB))
    assert small.disk_bytes <= 0.9 * 500 * KIB
    assert 0 in small and 1 not in small


def test_overwriting_one_key_keeps_the_journal_bounded():
    s = memory.store("overwrite", disk_gb=1)
    other = memory.store("overwrite", disk_gb=1)  # a second handle, as another process would hold
    value = np.zeros(1000)  # 8 KiB, inline in the journal
    for i in range(2000):
        s.set("k", value + i)
    journal = os.path.getsize(os.path.join(s.folder, "index"))
    assert journal < 2 * (4 * MiB + 8 * KIB)  # compaction kicked in (2000 writes would be 16 MB)
    assert s.get("k")[0] == 1999 and other.get("k")[0] == 1999 and len(other) == 1


def test_a_second_handle_sees_sets_deletes_and_clears():
    a, b = memory.store("shared"), memory.store("shared")
    a.set("k", 1)
    assert b.get("k") == 1
    b.set("k", 2)
    assert a.get("k") == 2  # a's RAM copy of 1 was dropped when it saw b's record
    a.delete("k")
    assert "k" not in b
    b.set("x", 1)
    a.clear()
    assert len(b) == 0 and b.get("x") is None


# -- where stores live ---------------------------------------------------------------------------------------------

def test_a_plain_name_lives_under_the_store_dir(home):
    s = memory.store("named")
    assert s.folder == str(home / "stores" / "named")
    assert oct(os.stat(s.folder).st_mode & 0o777) == "0o700"


def test_a_path_must_be_allowed_first(home):
    target = home / "elsewhere" / "cache"
    with pytest.raises(PermissionError, match=r"allow_write\(") as err:
        memory.store(str(target))
    assert f"APSI_ALLOW_WRITE={target}" in str(err.value) and "Apsi" not in str(err.value)
    assert not target.exists()
    memory.allow_write(home / "elsewhere")
    memory.store(str(target)).set("k", 1)
    assert memory.store(str(target)).get("k") == 1


def test_allow_write_from_the_environment(home, monkeypatch):
    monkeypatch.setenv("APSI_ALLOW_WRITE", os.pathsep.join(["/nonexistent", str(home / "env")]))
    memory.store(str(home / "env" / "c")).set(1, 1)
    with pytest.raises(PermissionError):
        memory.store(str(home / "envy"))  # a sibling whose name merely starts the same


def test_a_symlink_out_of_an_allowed_folder_is_not_allowed(home):
    (home / "ok").mkdir()
    (home / "secret").mkdir()
    os.symlink(home / "secret", home / "ok" / "link")
    memory.allow_write(home / "ok")
    with pytest.raises(PermissionError):
        memory.store(str(home / "ok" / "link" / "c"))


@pytest.mark.parametrize("name", ["", ".", ".."])
def test_names_that_are_not_names_are_refused(name):
    with pytest.raises(ValueError, match="not a name"):
        memory.store(name)


def test_a_folder_that_is_not_a_store_is_refused(home):
    folder = home / "stores" / "notastore"
    folder.mkdir(parents=True)
    (folder / "index").write_bytes(b"something else entirely")
    for _ in range(2):  # the same answer every time: a refused open leaves nothing that makes it a store
        with pytest.raises(memory.CorruptFileError, match="not an apsi_memory store index"):
            memory.store("notastore")
        assert [p.name for p in folder.iterdir()] == ["index"]
        assert (folder / "index").read_bytes() == b"something else entirely"


# -- pressure ------------------------------------------------------------------------------------------------------

def test_pressure_halves_then_empties_then_regrows_the_ram_tier():
    s = memory.store("pressure", ram_mb=1)
    value = np.zeros(100 * KIB // 8)
    for i in range(9):
        s.set(i, value)
    assert s.ram_bytes == 9 * 100 * KIB
    memory.machine().components.notify(Level.HIGH)
    assert s.ram_bytes <= MiB // 2
    memory.machine().components.notify(Level.CRITICAL)
    assert s.ram_bytes == 0
    s.set("new", value)
    assert s.ram_bytes == 0 and len(s) == 10  # values still go to the SSD
    memory.machine().components.notify(Level.OK)
    for i in range(9):
        np.testing.assert_array_equal(s.get(i), value)
    assert s.ram_bytes == 9 * 100 * KIB


def test_a_store_hears_the_level_measured_on_its_own_sets(pressure_machine):
    """End to end: the (simulated) container fills up, the next ``set`` re-measures, the store reacts."""
    s = memory.store("measured", ram_mb=1)
    value = np.zeros(100 * KIB // 8)
    for i in range(9):
        s.set(i, value)
    pressure_machine.at(Level.HIGH)
    pressure_machine.next_measurement()
    s.set("one more", value)
    assert s.ram_bytes <= MiB // 2
    pressure_machine.at(Level.CRITICAL)
    pressure_machine.next_measurement()
    s.set("and another", value)
    assert s.ram_bytes == 0
    pressure_machine.at(Level.OK)
    pressure_machine.next_measurement()
    s.set("back", value)
    assert s.ram_bytes == 100 * KIB and len(s) == 12


def test_a_store_opened_under_pressure_starts_small(pressure_machine):
    pressure_machine.at(Level.HIGH)
    pressure_machine.next_measurement()
    s = memory.store("opened under pressure", ram_mb=1)
    for i in range(9):
        s.set(i, np.zeros(100 * KIB // 8))
    assert s.ram_bytes <= MiB // 2


def test_relieve_empties_the_ram_tier_and_keeps_every_value():
    s = memory.store("relieve")
    for i in range(20):
        s.set(i, {"i": i})
    assert s.ram_bytes > 0
    memory.relieve()
    assert s.ram_bytes == 0
    assert [s.get(i)["i"] for i in range(20)] == list(range(20))


def test_the_signing_key_is_private_and_outside_every_store(home):
    memory.store("k").set("x", 1)
    key = home / "home" / "key"
    assert key.stat().st_size == 32 and oct(key.stat().st_mode & 0o777) == "0o600"
    assert not any("key" in f for f in os.listdir(home / "stores" / "k"))


@pytest.mark.parametrize("n", [3, 10_000, 100_000], ids=["inline", "file", "mapped"])
def test_structured_and_unusual_dtypes_round_trip(n):
    s = memory.store("dtypes")
    values = {
        "structured": np.array([(i, i / 2) for i in range(n)], dtype=[("id", "<i4"), ("score", "<f8")]),
        "big endian": np.arange(n, dtype=">i8"),
        "datetime": np.arange(n).astype("datetime64[s]"),
        "fortran": np.asfortranarray(np.arange(2 * n, dtype=np.float32).reshape(2, n)),
        "zero-d": np.array(7.5),
        "empty": np.zeros((0, n)),
    }
    for key, value in values.items():
        s.set(key, value)
    s.relieve()
    for key, value in values.items():
        got = s.get(key)
        assert got.dtype == value.dtype and got.shape == value.shape, key
        np.testing.assert_array_equal(got, value)


def test_a_compaction_cut_short_after_others_looked_is_finished_by_the_next_writer():
    """A compacting writer marks the switch (odd epoch), another handle looks meanwhile (and reopens the old
    journal), the new journal takes the old one's place, and the compacting writer dies before it marks the end.
    The next writer must notice, or its sets would go to the replaced (deleted) journal."""
    w, r = memory.store("cut"), memory.store("cut")
    w.set("k", 1)
    journal = w._journal
    with journal.locked():
        journal._bump(epoch_step=1)  # the compaction's first step
    assert r.get("k") == 1  # r looks while the epoch is odd: it reopens the journal that is still in place
    copy = journal.path + ".new.tmp"
    shutil.copyfile(journal.path, copy)
    os.replace(copy, journal.path)  # the second step; then the writer died
    r.set("after", 2)
    assert memory.store("cut").get("after") == 2
