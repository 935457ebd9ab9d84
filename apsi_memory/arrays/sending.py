"""Sending arrays that live on a spill file to another process: by reference, not by value.

``multiprocessing`` pickles what it sends (a Pool's arguments and results, queues, spawned processes; also
``concurrent.futures`` and PyTorch's DataLoader), and NumPy's pickle of a ``numpy.memmap`` copies its bytes, then
loads as a RAM copy: a spawn worker paid a full copy of a spilled array. With ``multiprocessing``'s pickler
(``ForkingPickler``) a ``memory.array`` on a spill file (spilled, or moved there) and every view of it pickle
instead as a reference: the file's path, its device, inode and size (checked on loading: the very file, not one
that took its name), and the view's byte range in the file, dtype, shape and strides (a slice or a column sends only
what it spans, like joblib's memmap reducer; no bytes of the array). Loading it maps that range of the file again,
``MAP_SHARED`` and read-only: the received array is a read-only view of the sender's, on disk (``on_disk`` true),
that sees the sender's later writes. To get a copy of one's own, ``numpy.array(received)``. Every other pickler
(``pickle.dumps``, ``torch.save``, ``joblib.dump``, a network send) keeps the bytes: those pickles outlive the
sender, and a reference in them would be a result lost at its exit.

Trust: the path is never taken on the pickle's word. It must name a spill file (``apsi-<pid>-<start>-<random>.npy``)
directly in the loading process's spill folder, which passes ``trust``'s folder checks; the file is opened in that
folder without following links, must be a regular file of this user, and its device, inode and size must be those
pickled. Anything else is an ``UnsafePathError`` saying what was wrong; nothing is mapped. So such a pickle is good
on the machine (and in the container) that made it; for another, send ``numpy.array(x)``.

Lifetime (the choice, and why): a pickle is only as good as its file. A sender that frees the array, or exits,
deletes it, and loading afterwards is a ``MissingFileError`` that says which of the two happened (the pid in the
file name is alive or not). What a program does not do on purpose does not count: an array that has been pickled
by reference is kept (file and all) until ``free`` or the exit of its process, even once nothing else refers to it,
because ``multiprocessing`` pickles a worker's return value and drops it before the parent has loaded it — without
this, returning a spilled array from a ``Pool`` worker would fail at random. The cost: an array sent and then
dropped keeps its disk space until exit (``report()`` says why it is still there). Once loaded, the receiver's mapping
keeps the data readable after the sender exits (the file is only unlinked then); after the sender's ``free`` it
reads zeros, as the sender's own views do (the file's blocks are punched out).

Everything else keeps NumPy's own pickling: arrays in RAM, a fork child's copy-on-write copies (its pages are not
the file's), a partly moved array, a freed one, user ``numpy.memmap``s; NumPy's protocol-5 form (out-of-band
buffers) included, and a RAM array's pickle loads where apsi_memory is not installed. The reducer is registered with
``ForkingPickler`` for ``numpy.ndarray`` and ``numpy.memmap`` with the process's first spill file
(``spill.on_first_file``), never at import.
"""

from __future__ import annotations

import copyreg
import errno
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..adapters.processes import owner_alive
from ..errors import CorruptFileError, MissingFileError, UnsafePathError
from ..system import paths, trust
from . import spill

Reduced = tuple[Any, ...]
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class _AsNumpyDoes:
    """Pickles as NumPy pickles ``array``, for the protocol the pickler uses: a ``copyreg`` reducer is not told it,
    and NumPy's protocol-5 form (whose buffer may go out of band) must stay."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.array.__reduce_ex__(protocol)


def by_value(x: np.ndarray) -> Reduced:
    """NumPy's pickle of ``x``, rebuilt with ``numpy.asanyarray`` (the array itself: no copy, and nothing of ours
    named in the pickle)."""
    return np.asanyarray, (_AsNumpyDoes(x),)


def byte_range(x: np.ndarray) -> tuple[int, int]:
    """The addresses of ``x``'s lowest byte and one past its highest (negative strides included)."""
    low = high = x.ctypes.data
    for n, stride in zip(x.shape, x.strides):
        low, high = low + min(0, stride * (n - 1)), high + max(0, stride * (n - 1))
    return low, high + x.itemsize


def reference(x: np.ndarray, path: str, address: int, nbytes: int) -> Reduced | None:
    """The pickle of ``x``, a view of the array of ``nbytes`` mapped from spill file ``path`` at ``address``, as a
    reference to its bytes in the file; ``None`` where it must go by value (the file is not this process's own,
    ``x`` is empty or not all in it)."""
    found = spill.identity(path)
    if found is None or x.size == 0:
        return None
    device, inode, size, data_offset = found
    data = address + data_offset % mmap.ALLOCATIONGRANULARITY  # where the mapping puts the data (numpy.memmap's rule)
    low, high = byte_range(x)
    if low < data or high > data + nbytes:
        return None
    at = data_offset - data  # file offset = address + at
    return reopen, (path, device, inode, size, low + at, high + at, x.ctypes.data + at, x.dtype, x.shape, x.strides)


def reopen(path: str, device: int, inode: int, size: int, low: int, high: int, first: int, dtype: np.dtype[Any],
           shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A pickled reference loaded: bytes ``[low, high)`` of spill file ``path`` mapped shared and read-only, seen
    as ``dtype``, ``shape`` and ``strides`` from file offset ``first``; after the checks of the module docstring."""
    if not 0 <= low <= first < high <= size:
        raise CorruptFileError(path, f"a pickled memory.array names bytes {low} to {high} (first element at "
                                     f"{first}) of this {size}-byte file as {dtype}: the pickle was altered")
    fd = _open_checked(path, device, inode, size)
    with open(path, "rb", opener=lambda _path, _flags: fd) as f:  # numpy.memmap maps this very descriptor
        window = np.memmap(f, np.uint8, "r", offset=low, shape=(high - low,))
    try:
        return np.ndarray(shape, dtype, buffer=window, offset=first - low, strides=strides)
    except (TypeError, ValueError) as exc:
        raise CorruptFileError(path, f"a pickled memory.array does not fit the bytes it names ({exc}): the "
                                     "pickle was altered") from None


def _open_checked(path: str, device: int, inode: int, size: int) -> int:
    """A read-only descriptor of ``path``, which must be the pickled spill file in this process's spill folder."""
    folder = os.path.abspath(paths.spill_dir())
    name = os.path.basename(path)
    if os.path.join(folder, name) != path or spill.owner_of(name) is None:
        raise UnsafePathError(errno.EPERM, f"{path} is not a spill file in this process's spill folder {folder}: a "
                                           "pickled memory.array is reopened only from there (set APSI_SPILL_DIR "
                                           "or APSI_HOME as the sender does, or send np.array(x), a copy)")
    trust.check_above(folder)
    try:
        folder_fd = os.open(folder, _FOLDER_FLAGS)
    except FileNotFoundError:
        raise _gone(path) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise trust.untrusted(folder, "is not a folder (a symbolic link or a file)") from None
        raise
    try:
        trust.check_folder(folder, os.fstat(folder_fd))
        fd = trust.open_file(name, os.O_RDONLY, dir_fd=folder_fd, shown=path)
    except FileNotFoundError:
        raise _gone(path) from None
    finally:
        os.close(folder_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino, st.st_size) != (device, inode, size):
        os.close(fd)
        raise UnsafePathError(errno.EPERM, f"{path} is not the file that was pickled (device, inode, size "
                                           f"{st.st_dev}, {st.st_ino}, {st.st_size}, not {device}, {inode}, "
                                           f"{size}): another file took its name; nothing was read from it")
    return fd


def _gone(path: str) -> MissingFileError:
    """The file of a pickled array is gone: why, from whether the process named in it still runs."""
    owner = spill.owner_of(os.path.basename(path))
    pid, start = owner if owner is not None else (0, "0")
    why = (f"process {pid}, which sent it, freed the array (memory.free) before this pickle was loaded"
           if owner_alive(pid, start) else
           f"process {pid}, which sent it, has exited (its spill files go with it) before this pickle was loaded, "
           "or runs where this file is not (another machine or container)")
    return MissingFileError(errno.ENOENT, f"the spill file of a pickled memory.array is gone: {why}; keep the "
                                          "array, unfreed, and its process running until every receiver has "
                                          "loaded it, or send np.array(x), a copy", path)


def install(reference_of: Callable[[np.ndarray], Reduced | None]) -> None:
    """``multiprocessing`` pickles every ``numpy.ndarray`` and ``numpy.memmap`` as ``reference_of`` says from now
    on, and where it says ``None`` as before: a reducer another library registered for that type, else NumPy's way.
    Only ``multiprocessing``'s pickler (``ForkingPickler``: a Pool's arguments and results, queues, spawned
    processes, ``concurrent.futures``, PyTorch's DataLoader) sends by path, between processes alive at once on one
    machine; ``pickle.dumps``, ``torch.save`` and ``joblib.dump`` write pickles that outlive the sender, so they keep
    the bytes."""
    # Here, at the first spill file: multiprocessing (socket, selectors, secrets) was most of a first memory.array
    from multiprocessing.reduction import ForkingPickler

    for kind in (np.ndarray, np.memmap):
        registered = getattr(ForkingPickler, "_extra_reducers", {}).get(kind)  # its own table, not public
        before = registered or copyreg.dispatch_table.get(kind, by_value)
        ForkingPickler.register(kind, _reducer(reference_of, before))


def _reducer(reference_of: Callable[[np.ndarray], Reduced | None],
             otherwise: Callable[[Any], Any]) -> Callable[[np.ndarray], Any]:
    def reduce(x: np.ndarray) -> Any:
        reduced = reference_of(x)
        return otherwise(x) if reduced is None else reduced
    return reduce
