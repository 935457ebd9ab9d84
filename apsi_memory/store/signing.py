"""This user's signing key and the MACs that guard pickled store values: keyed BLAKE2b (``mac``) for values, and
HMAC-SHA256 (``sign``) for deriving keys and for recognising entries signed by older versions.

The key lives outside every store (``~/.apsi/key``, mode 0600, checked before use: ``trust.py``), so a store
folder copied from elsewhere (or written by another user) brings no key that would make its files verify. A pickle is only ever loaded after its
signature checked out: nothing the library did not write itself is unpickled.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import struct
import threading
from functools import cache, lru_cache

from ..errors import CorruptFileError, DiskFullError
from ..system.fileio import is_disk_full, open_new
from ..system.once import fork_hooks
from ..system.paths import key_path, private_dir
from ..system.trust import open_file

KEY_BYTES = 32
SIGNATURE_BYTES = 32  # SHA-256 digest size

_cache: dict[str, bytes] = {}
_cache_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    """A fork while another thread read the key would copy ``_cache_lock`` taken: the child gets a free one."""
    global _cache_lock
    _cache_lock = threading.Lock()


_register_fork_hook = fork_hooks(after_in_child=_fresh_lock_in_child)


def user_key() -> bytes:
    """The key at ``paths.key_path()``, created (random, 0600) on first use; read once per path per process."""
    path = key_path()
    _register_fork_hook()
    with _cache_lock:
        key = _cache.get(path)
        if key is None:
            key = _read_or_create(path)
            _cache[path] = key
        return key


def _read_or_create(path: str) -> bytes:
    """The key, after checking it and its folder (``trust``): a key another user could have written or read would
    let them sign a pickle that we then load."""
    private_dir(os.path.dirname(path))
    try:
        fd = open_file(path, os.O_RDONLY, secret=True)
    except FileNotFoundError:
        _create(path)
        fd = open_file(path, os.O_RDONLY, secret=True)
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise CorruptFileError(path, f"signing key must be {KEY_BYTES} bytes, found {len(key)}; fix: move it "
                                     f"aside (mv {path} {path}.bad): a new key is made, and entries signed with this "
                                     "one read as misses")
    return key


def _create(path: str) -> None:
    """Write the key to a private temp file, then hard-link it into place: ``link`` fails if another process won
    the race, so two first users never end up with two keys, and nobody ever reads a half-written key. On any
    failure (a full disk: ``DiskFullError``) the temp file is removed."""
    temp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = open_new(temp)
    try:
        try:
            written = os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        if written != KEY_BYTES:  # a short write: the disk is full
            raise _no_room(path)
        os.link(temp, path)
    except FileExistsError:
        pass  # another process created it first; use theirs
    except OSError as err:
        if is_disk_full(err):
            raise _no_room(path) from err
        raise
    finally:
        os.unlink(temp)


def _no_room(path: str) -> DiskFullError:
    return DiskFullError(errno.ENOSPC, f"no space left in {os.path.dirname(path)} for this user's signing key; "
                                       "free some space there (no key was made)")


def sign(key: bytes, *parts: bytes | memoryview) -> bytes:
    """HMAC-SHA256 over the parts, led by their count and lengths so ``(b"ab", b"c")`` and ``(b"a", b"bc")``
    never sign alike."""
    mac = _keyed(key).copy()
    mac.update(_frame(parts))
    for part in parts:
        mac.update(part)
    return mac.digest()


def _frame(parts: tuple[bytes | memoryview, ...]) -> bytes:
    """What leads every signature's input: the parts' count and lengths."""
    return _lengths(len(parts)).pack(len(parts), *[len(part) for part in parts])


@cache
def _lengths(count: int) -> struct.Struct:
    return struct.Struct(f"<{count + 1}Q")


@lru_cache(maxsize=8)
def _keyed(key: bytes) -> hmac.HMAC:
    """The key's HMAC state, made once: each signature starts from a copy, cheaper than ``hmac.digest``, which
    re-keys every time."""
    return hmac.new(key, digestmod=hashlib.sha256)


def verify(key: bytes, signature: bytes, *parts: bytes | memoryview) -> bool:
    return hmac.compare_digest(signature, sign(key, *parts))


def mac(key: bytes, *parts: bytes | memoryview) -> bytes:
    """Keyed BLAKE2b-256 over the parts, framed as in ``sign``. BLAKE2b in keyed mode is a MAC by design (no
    HMAC construction around it), and a copy of the keyed state with one update of the joined small parts costs
    a third of an HMAC; big parts (array data) are hashed in place, never joined."""
    return mac_keyed(keyed_state(key), *parts)


def mac_keyed(keyed: hashlib.blake2b, *parts: bytes | memoryview) -> bytes:
    """``mac`` from the key's state (``keyed_state``), which a store keeps: no key lookup per value."""
    state = keyed.copy()
    if len(parts) == 4 and len(parts[3]) <= _JOIN_MAX:
        # A store value (tag, key, version, value): every get and set signs one, so this case is unrolled (a
        # third of the generic path's cost); the bytes hashed are the same.
        tag, key, version, value = parts
        state.update(b"".join((_FOUR.pack(4, len(tag), len(key), len(version), len(value)), tag, key, version,
                               value)))
        return state.digest()
    head = _frame(parts)
    if sum(len(part) for part in parts) <= _JOIN_MAX:
        state.update(head + b"".join(parts))
    else:
        state.update(head)
        for part in parts:
            state.update(part)
    return state.digest()


_JOIN_MAX = 64 * 1024  # parts up to this size together are joined: one copy is cheaper than several updates
_FOUR = _lengths(4)


def bulk_mac(key: bytes, *parts: bytes | memoryview) -> bytes:
    """Keyed BLAKE3 over the parts, framed as in ``mac``, for big bodies (the store's index checkpoint, read at
    every open): 6 MB in 0.9 ms where BLAKE2b takes 5.6 here, on any CPU with SIMD (SHA-256 is that fast only
    with SHA instructions). One thread: no pool that a forked child would inherit half-made."""
    from blake3 import blake3  # on first use: importing apsi_memory does no work

    state = blake3(key=key)
    state.update(_frame(parts))
    for part in parts:
        state.update(part)
    return state.digest()


def bulk_mac_verify(key: bytes, signature: bytes, *parts: bytes | memoryview) -> bool:
    return hmac.compare_digest(signature, bulk_mac(key, *parts))


@lru_cache(maxsize=8)
def keyed_state(key: bytes) -> hashlib.blake2b:
    """The keyed BLAKE2b state of ``key``, made once; every MAC starts from a copy of it."""
    return hashlib.blake2b(key=key, digest_size=SIGNATURE_BYTES)


def mac_verify(key: bytes, signature: bytes, *parts: bytes | memoryview) -> bool:
    return hmac.compare_digest(signature, mac(key, *parts))
