"""The one small exception tree.

Every error the library raises on purpose derives from ``ApsiMemoryError`` and also from the builtin a caller
would already catch for that kind of problem (``ValueError`` for bad input, ``OSError`` for the disk,
``MemoryError`` for running out), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class ApsiMemoryError(Exception):
    """Base of every error raised by apsi_memory."""


class SizeError(ApsiMemoryError, ValueError):
    """A size string or number that cannot be read as bytes."""


class CorruptFileError(ApsiMemoryError, ValueError):
    """A file whose content is not in the expected format — a kernel file, a store's file, or a ``.npy`` given
    to ``chunks`` that is truncated or not ``.npy`` at all; names the file and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class DiskFullError(ApsiMemoryError, OSError):
    """Not enough space on the SSD for a spill file or a store entry; names the folder and what is free."""


class PoolError(ApsiMemoryError, ValueError):
    """A buffer given back twice, or one the pool never handed out."""


class ChunkError(ApsiMemoryError, ValueError):
    """A source that cannot be split into row blocks, or a block result that disagrees with the first."""


class BlockError(ApsiMemoryError, RuntimeError):
    """The function given to ``map`` failed on a block; names the row range and chains the original error."""


class BatchTooSmallError(ApsiMemoryError, MemoryError):
    """``fit_batch`` ran out of memory even at ``min_batch``; chains the last out-of-memory error."""


class TamperWarning(UserWarning):
    """A store file whose signature did not match was removed unread."""


class UntrustedPathError(ApsiMemoryError, PermissionError):
    """A key, folder or store file that another user could have written or redirected (wrong owner, group or
    other bits, a symbolic link, not the expected type); names the path, what is wrong and the command that fixes
    it. Nothing was read from it or written to it."""


class WriteNotAllowedError(ApsiMemoryError, PermissionError):
    """A store path outside ``~/.apsi/store`` that ``allow_write``/``APSI_ALLOW_WRITE`` did not allow."""


class PathArgumentError(ApsiMemoryError, ValueError):
    """An empty or meaningless path or store name (``allow_write("")``, ``store("..")``)."""


class StoreClosedError(ApsiMemoryError, ValueError):
    """``get``/``set`` (or any other use) of a store after its ``close()``."""


class UnstorableError(ApsiMemoryError, TypeError):
    """A key of the wrong type, or a value (or ``@cached`` argument) that cannot be pickled."""


class UnloadableWarning(UserWarning):
    """A store entry whose signature checked out but that cannot be loaded here (a renamed class, a changed
    module); it reads as a miss and stays on disk for the processes that can load it."""


class OldEntryWarning(UserWarning):
    """Entries signed by an older apsi_memory (before signatures named their store and version) read as misses."""


class NotCachedWarning(UserWarning):
    """``@cached`` returned its result but could not keep it (a full disk)."""
