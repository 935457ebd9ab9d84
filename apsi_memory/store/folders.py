"""Where stores may live: a plain name under ``store_dir()``, or a path below an allowed root
(``memory.allow_write(path)`` in Python, ``APSI_ALLOW_WRITE`` in the environment)."""

from __future__ import annotations

import errno
import os
import threading

from ..errors import ArgumentError, ArgumentTypeError, UnsafePathError
from ..system.once import fork_hooks
from ..system.paths import display, store_dir
from ..system.trust import within

_allowed: set[str] = set()
_allowed_lock = threading.Lock()


def path_text(value: object, what: str, kind: str = "a path") -> str:
    """``value`` (a ``str`` or an ``os.PathLike`` of one) as a ``str``; anything else is an error naming ``what``,
    not a builtin's from deep inside ``os.path``. Bytes are refused: every path we keep or show is text."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else value
    if isinstance(text, str):
        if "\0" in text:
            raise ArgumentError(f"{what} {text!r} holds a NUL character, which no path can")
        return text
    hint = f"; decode it with os.fsdecode({text!r})" if isinstance(text, bytes) else ""
    raise ArgumentTypeError(f"{what} must be {kind} (str or os.PathLike), not {type(text).__name__} "
                            f"({value!r}){hint}")


def allow_write(path: str | os.PathLike[str]) -> None:
    """Allow stores (and other writes) at ``path`` and below it, for this process: what ``APSI_ALLOW_WRITE``
    (folders separated by ``os.pathsep``) does from the environment, e.g. ``memory.allow_write("/data/cache")``."""
    text = path_text(path, "allow_write: path")
    if not text.strip():
        raise ArgumentError(f"allow_write needs a folder, not {text!r} (an empty path would allow the working "
                            "folder)")
    folder = os.path.expanduser(text)
    if not os.path.isabs(folder):  # as for APSI_ALLOW_WRITE and store paths: no meaning that depends on the cwd
        raise ArgumentError(f"allow_write: path {text!r} is a relative path, which would allow another folder in "
                            f"every working folder; give an absolute path (os.path.abspath({text!r}) for the working "
                            "folder's)")
    _register_fork_hook()
    with _allowed_lock:
        _allowed.add(os.path.realpath(folder))


def _allowed_roots() -> list[str]:
    _register_fork_hook()
    with _allowed_lock:
        return list(_allowed) + roots_from_env()


def roots_from_env() -> list[str]:
    """The folders of ``APSI_ALLOW_WRITE`` (separated by ``os.pathsep``; empty entries are skipped, not taken for
    the working folder as ``PATH`` would). A relative one is an ``ArgumentError`` naming the variable: it would
    allow whatever folder the program happens to run in."""
    roots = []
    for entry in os.environ.get("APSI_ALLOW_WRITE", "").split(os.pathsep):
        folder = os.path.expanduser(entry)
        if entry and not os.path.isabs(folder):
            raise ArgumentError(f"APSI_ALLOW_WRITE holds the relative path {entry!r}, which would allow writes "
                                f"wherever the program runs; give absolute paths (e.g. {os.path.abspath(entry)})")
        if entry:
            roots.append(os.path.realpath(folder))
    return roots


def resolve_folder(name_or_path: str | os.PathLike[str]) -> str:
    """A plain name is a folder under ``store_dir()``; an absolute path (or one from ``~``) is a path the caller
    chose, allowed only under ``allow_write``/``APSI_ALLOW_WRITE`` roots. Anything else (``"a/b"``, ``"./x"``,
    ``".x"``) is refused: it would name another store from every working folder, so the same program would miss its
    cache, or write one where it was started, depending on where that was. Refused rather than read as a sub-store
    of the store folder: nothing there lists or cleans nested stores, and a refusal can be given a meaning later."""
    text = path_text(name_or_path, "store: name_or_path")
    if not text or text in (".", ".."):
        raise ArgumentError(f"store name {text!r} is empty or not a name; use e.g. 'embeddings'")
    if os.sep not in text and not text.startswith(("~", ".")) and (os.altsep is None or os.altsep not in text):
        return os.path.join(store_dir(), text)
    expanded = os.path.expanduser(text)
    if not os.path.isabs(expanded):
        raise ArgumentError(f"store {text!r} is a relative path, which would mean another store in every working "
                            f"folder; give a plain name (a store under {display(store_dir())}) or an absolute path "
                            f"(os.path.abspath({text!r}) for the working folder's)")
    return allowed_folder(expanded)


def checked_arguments(folder: object, label: object, level: object) -> str:
    """What ``Store(...)`` made directly takes, named before anything is made (the folder as ``str``):
    ``memory.store`` resolves a name to an absolute folder, so a relative one here would be another store in every
    working folder."""
    text = path_text(folder, "Store: folder")
    if not os.path.isabs(text):
        raise ArgumentError(f"Store: folder {folder!r} is not an absolute path; give one, or open a store by name "
                            "with memory.store(name)")
    if not isinstance(label, str):
        raise ArgumentTypeError(f"Store: label must be a str, not {type(label).__name__} ({label!r})")
    if level is not None and not callable(level):
        raise ArgumentTypeError(f"Store: level must be a function returning a Level, not {type(level).__name__}")
    return text


def allowed_folder(path: str) -> str:
    """``path``, resolved, if it is under the store folder or an allowed root; else ``UnsafePathError``."""
    folder = os.path.realpath(os.path.expanduser(path))
    roots = [os.path.realpath(store_dir())] + _allowed_roots()
    if not any(within(folder, root) for root in roots):
        raise UnsafePathError(
            errno.EPERM,
            f"store path {folder} is outside {display(store_dir())} and not allowed for writing; allow it with "
            f"memory.allow_write({folder!r}) in Python, or APSI_ALLOW_WRITE={folder} in the environment")
    return folder


def _fresh_lock_in_child() -> None:
    """A fork while another thread held ``_allowed_lock`` would copy it taken: the child gets a free one."""
    global _allowed_lock
    _allowed_lock = threading.Lock()


_register_fork_hook = fork_hooks(after_in_child=_fresh_lock_in_child)
