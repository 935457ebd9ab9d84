"""Arrays on a spill file pickle by path (issue 28, item 7; apsi_memory/arrays/sending.py): a spawn worker gets a
read-only view of the same file from a pickle of a few hundred bytes, a tampered pickle is refused, arrays in RAM
keep NumPy's pickling, and a pickle whose file is gone says why."""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import moving, placement
from apsi_memory.decide import Level
from apsi_memory.errors import CorruptFileError, MissingFileError, UnsafePathError

MiB = 1 << 20
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spill files are Linux's mmap here"),
              pytest.mark.usefixtures("calm_host", "spill_dir")]  # RAM arrays stay in RAM whatever the host


def _spilled(nbytes: int = 2 * MiB) -> np.ndarray:
    memory.budget(0)
    x = memory.array(nbytes // 4, "uint32")
    assert memory.on_disk(x), "the test needs an SSD array"
    x[:] = np.arange(x.size, dtype=np.uint32) * 2654435761  # no two pages alike
    return x


def _moved(nbytes: int = 2 * MiB) -> np.ndarray:
    x = memory.array(nbytes // 4, "uint32")
    assert not memory.on_disk(x), "the test needs a RAM array to move"
    x[:] = np.arange(x.size, dtype=np.uint32) * 2654435761
    entry = placement._find(x)
    assert entry is not None and moving.move(entry, Level.HIGH) and memory.on_disk(x)
    return x


MAKERS: dict[str, Callable[..., np.ndarray]] = {"spilled": _spilled, "moved": _moved}


def _sent(x: Any) -> bytes:
    """What ``multiprocessing`` sends of ``x`` (a Pool's arguments and results, a Queue, a spawned Process)."""
    return bytes(ForkingPickler.dumps(x))


@pytest.fixture(autouse=True)
def _let_go_of_sent_arrays() -> Iterator[None]:
    """An array pickled by path stays until free or exit: the tests after these must not find them in report()."""
    yield
    placement._kept.clear()
    gc.collect()


def _received(y: np.ndarray) -> tuple[str, bool, bool, str]:
    """In the worker: what it got (a digest of the bytes), whether on disk, writable, and which file."""
    return hashlib.sha256(y.tobytes()).hexdigest(), memory.on_disk(y), y.flags.writeable, str(y.base.filename)


def _made_in_worker(n: int) -> np.ndarray:
    """In the worker (``APSI_RAM_BUDGET=0``): a spilled array returned, so the worker drops it right after sending."""
    y = memory.array(n, "uint32")
    y[:] = 7
    return y


@pytest.mark.parametrize("kind", MAKERS)
def test_a_spawn_pool_gets_a_64_mib_array_from_a_pickle_under_4_kib_and_reads_the_same_bytes(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = MAKERS[kind](64 * MiB)
    sent = _sent(x)  # what multiprocessing sends
    assert len(sent) < 4096, len(sent)
    monkeypatch.setenv("APSI_RAM_BUDGET", "0")  # for the worker's own array below
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        digest, on_disk, writable, path = pool.apply(_received, (x,))
        back = pool.apply(_made_in_worker, (16 * MiB // 4,))
        pool.close()
        pool.join()  # the worker has exited: its file is unlinked, the mapping here keeps it
    assert (digest, on_disk, writable) == (hashlib.sha256(x.tobytes()).hexdigest(), True, False)
    assert path == placement._find(x).path  # type: ignore[union-attr]  # the sender's very file, not a copy
    assert memory.on_disk(back) and not back.flags.writeable and int(back.min()) == int(back.max()) == 7


@pytest.mark.parametrize("kind", MAKERS)
def test_a_view_pickles_as_the_bytes_it_spans_and_sees_the_senders_later_writes(kind: str) -> None:
    x = MAKERS[kind]().reshape(512, 1024)
    for view in (x, x[100:200], x[:, 7], x[::-3, ::2], x.T, x.view(np.uint8)[5:, 3:9]):
        sent = _sent(view)
        got = pickle.loads(sent)
        assert len(sent) < 1024 and np.array_equal(got, view) and got.strides == view.strides
        assert memory.on_disk(got) and not got.flags.writeable
    column = pickle.loads(_sent(x[:, 7]))
    x[:, 7] = 5  # shared: the receiver's mapping is the same file
    assert int(column.min()) == int(column.max()) == 5


@pytest.mark.parametrize("kind", MAKERS)
def test_a_pickle_for_a_file_or_a_socket_holds_the_bytes_and_outlives_the_array_and_its_process(
        kind: str, tmp_path: Path) -> None:
    """pickle.dumps, torch.save, joblib.dump and a network send write pickles that outlive this process: a
    reference there would be a result lost at exit. Only multiprocessing's pickler sends by path."""
    x = MAKERS[kind]()
    saved, expected = pickle.dumps(x), x.copy()
    assert len(saved) >= x.nbytes and b"apsi_memory" not in saved
    memory.free(x)
    got = pickle.loads(saved)
    assert np.array_equal(got, expected) and not memory.on_disk(got) and got.flags.writeable


def test_arrays_in_ram_keep_numpys_pickling() -> None:
    _spilled()  # the reducer is installed with the first spill
    memory.budget("1GB")
    for x in (memory.array(2 * MiB // 8), np.arange(1000.0), np.zeros(0)):
        sent = _sent(x)
        assert len(sent) >= x.nbytes and b"apsi_memory" not in sent  # loads where apsi_memory is not installed
        got = pickle.loads(sent)
        assert np.array_equal(got, x) and not memory.on_disk(got) and got.flags.writeable
        buffers: list[pickle.PickleBuffer] = []
        out_of_band = pickle.dumps(x, protocol=5, buffer_callback=buffers.append)
        assert len(buffers) == 1 and len(out_of_band) < 1024  # the zero-copy form dask and others use stays


def test_a_user_memmap_still_pickles_by_value_and_its_ram_copy_is_not_on_disk(tmp_path: Path) -> None:
    _spilled()
    m = np.memmap(tmp_path / "own.bin", np.float64, mode="w+", shape=(1 << 16,))
    m[:] = 3.0
    got = pickle.loads(pickle.dumps(m))
    assert memory.on_disk(m) and not memory.on_disk(got) and float(got.sum()) == 3.0 * (1 << 16)


def _forged(x: np.ndarray, **changes: Any) -> bytes:
    """A pickle of ``x``'s reference with some of its fields changed, as someone who edited the bytes would."""
    function, args = ForkingPickler._extra_reducers[type(x)](x)
    names = ("path", "device", "inode", "size", "low", "high", "first", "dtype", "shape", "strides")
    fields = dict(zip(names, args)) | changes

    class Forged:
        def __reduce__(self) -> tuple[Any, ...]:
            return function, tuple(fields[n] for n in names)
    return pickle.dumps(Forged())


def test_a_pickle_naming_a_file_outside_the_spill_folder_is_refused(tmp_path: Path) -> None:
    x = _spilled()
    path = placement._find(x).path  # type: ignore[union-attr]
    elsewhere = tmp_path / "elsewhere" / os.path.basename(path)
    elsewhere.parent.mkdir()
    os.link(path, elsewhere)  # the very file (device, inode, size), under another folder
    with pytest.raises(UnsafePathError, match="not a spill file in this process's spill folder"):
        pickle.loads(_forged(x, path=str(elsewhere)))


def test_a_pickle_naming_a_symbolic_link_is_refused() -> None:
    x = _spilled()
    path = placement._find(x).path  # type: ignore[union-attr]
    link = path.replace(".npy", "0.npy")  # named like a spill file, in the spill folder, pointing at the real one
    os.symlink(path, link)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        pickle.loads(_forged(x, path=link))


def test_another_file_at_the_pickled_path_is_refused_unread() -> None:
    x = _spilled()
    path = placement._find(x).path  # type: ignore[union-attr]
    sent = _sent(x)
    os.rename(path, path + ".away")
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * os.path.getsize(path + ".away"))  # same name, same size, another inode
        with pytest.raises(UnsafePathError, match="not the file that was pickled"):
            pickle.loads(sent)
    finally:
        os.replace(path + ".away", path)


@pytest.mark.parametrize("change", ["high", "shape", "dtype"])
def test_a_pickle_naming_other_bytes_than_the_array_has_is_refused(change: str) -> None:
    x = _spilled()
    size = os.path.getsize(placement._find(x).path)  # type: ignore[arg-type, union-attr]
    changes = {"high": {"high": size + 4096}, "shape": {"shape": (x.size * 2,)}, "dtype": {"dtype": np.dtype("O")}}
    with pytest.raises(CorruptFileError, match="the pickle was altered"):
        pickle.loads(_forged(x, **changes[change]))


def test_a_pickled_array_outlives_its_last_reference_until_free() -> None:
    x = _spilled()
    expected, sent = x.copy(), _sent(x[10:])
    del x
    gc.collect()  # the sender dropped it (a Pool worker's return value): its file must stay for the receiver
    got = pickle.loads(sent)
    assert np.array_equal(got, expected[10:])
    assert [r.why.endswith(placement.KEPT) for r in memory.report()] == [True]  # it says why it stays


def test_a_pickle_loaded_after_its_sender_freed_the_array_says_so() -> None:
    x = _spilled()
    sent = _sent(x)
    memory.free(x)
    with pytest.raises(MissingFileError, match=f"process {os.getpid()}, which sent it, freed the array"):
        pickle.loads(sent)


def test_a_pickle_loaded_after_its_sender_exited_says_so(tmp_path: Path) -> None:
    out = tmp_path / "sent.pickle"
    code = ("import sys, apsi_memory as memory\n"
            "from multiprocessing.reduction import ForkingPickler\n"
            "x = memory.array(1 << 20, 'uint32'); assert memory.on_disk(x)\n"
            "open(sys.argv[1], 'wb').write(ForkingPickler.dumps(x))\n")
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=120,
                   env={**os.environ, "APSI_RAM_BUDGET": "0"})
    with pytest.raises(MissingFileError, match="which sent it, has exited"):
        pickle.loads(out.read_bytes())


def test_a_fork_childs_copy_pickles_by_value_with_the_childs_writes() -> None:
    x = _spilled()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy-on-write copy is not the file, so it cannot go by path
        try:
            x[0] = 99
            os.write(write, b"%d" % int(pickle.loads(_sent(x))[0]))
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    assert got == b"99" and int(x[0]) == 0
