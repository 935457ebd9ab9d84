"""The one small exception tree.

Every error the library raises on purpose derives from ``ApsiMemoryError`` and also from the builtin a caller
would already catch for that kind of problem (``ValueError`` for bad input, ``OSError`` for the disk,
``MemoryError`` for running out), so ``except ValueError`` keeps working. The tree (a test checks it against the
classes below; docs/reference/errors.md shows the same drawing)::

    ApsiMemoryError(Exception)
    ├── ArgumentError(ValueError)
    │   ├── SizeError
    │   └── PoolError
    ├── ArgumentTypeError(TypeError)
    ├── CorruptFileError(ValueError)
    ├── ChunkError(ValueError)
    ├── DiskFullError(OSError)
    ├── StoreClosedError(ValueError)
    ├── UnsafePathError(PermissionError)
    ├── SystemCallError(OSError)
    ├── MissingKeyError(KeyError)
    ├── MissingFileError(FileNotFoundError)
    ├── MissingExtraError(ImportError)
    ├── BlockError(RuntimeError)
    └── BatchTooSmallError(MemoryError)
    ApsiMemoryWarning(UserWarning)
    ├── TamperWarning
    ├── BudgetWarning
    ├── UnloadableWarning
    ├── OldEntryWarning
    ├── NotCachedWarning
    ├── CacheKeyWarning
    └── NotFreedWarning
"""

from __future__ import annotations


class _OwnMembers(type):
    """The type of our errors and warnings: ``dir()``, and so ``help()``, lists what they add, not the dozens of
    members every builtin exception has (they still work)."""

    def __dir__(cls) -> list[str]:
        return sorted({name for klass in cls.__mro__ if klass.__module__ == __name__ for name in vars(klass)})


class ApsiMemoryError(Exception, metaclass=_OwnMembers):
    """Base of every error raised by apsi_memory."""


class ArgumentError(ApsiMemoryError, ValueError):
    """An argument with a value the call cannot use (a negative shape, ``every=0``); names the argument."""


class SizeError(ArgumentError):
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


class PoolError(ArgumentError):
    """A buffer given back twice, or one the pool never handed out."""


class ChunkError(ApsiMemoryError, ValueError):
    """A source that cannot be split into row blocks, or a block result that disagrees with the first."""


class BlockError(ApsiMemoryError, RuntimeError):
    """The function given to ``map`` failed on a block; names the row range and chains the original error."""


class BatchTooSmallError(ApsiMemoryError, MemoryError):
    """``fit_batch`` ran out of memory even at ``min_batch``; chains the last out-of-memory error."""


class ApsiMemoryWarning(UserWarning, metaclass=_OwnMembers):
    """Base of every warning apsi_memory gives: ``warnings.simplefilter("ignore", ApsiMemoryWarning)`` silences
    them all, ``"error"`` turns them all into errors."""


class TamperWarning(ApsiMemoryWarning):
    """A store file whose signature did not match was removed unread."""


class ArgumentTypeError(ApsiMemoryError, TypeError):
    """An argument of a type the call does not take (``on_disk(None)``); names the argument and the type."""


class UnsafePathError(ApsiMemoryError, PermissionError):
    """A path the library will not use: outside the folders allowed for writing, or a file or folder that another
    user owns or may write; says what is wrong and the command that fixes it."""


class SystemCallError(ApsiMemoryError, OSError):
    """A system call the library relies on failed in a way it cannot work around; names the call and errno."""


class MissingKeyError(ApsiMemoryError, KeyError):
    """``store[key]`` or ``del store[key]`` for a key that is not there."""


class MissingFileError(ApsiMemoryError, FileNotFoundError):
    """A file or folder the caller named that is not there (a ``.npy`` given to ``chunks``, a machine's root);
    names it."""


class MissingExtraError(ApsiMemoryError, ImportError):
    """An optional feature whose extra is not installed; says which ``pip install`` adds it."""


class StoreClosedError(ApsiMemoryError, ValueError):
    """``get``/``set`` (or any other use) of a store after its ``close()``; names the store."""


class UnloadableWarning(ApsiMemoryWarning):
    """A store entry whose signature checked out but that cannot be loaded here (a renamed class, a changed
    module); it reads as a miss and stays on disk for the processes that can load it."""


class OldEntryWarning(ApsiMemoryWarning):
    """Entries signed by an older apsi_memory (before signatures named their store and version) read as misses."""


class NotCachedWarning(ApsiMemoryWarning):
    """``@cached`` returned its result but could not keep it (a full disk)."""


class BudgetWarning(ApsiMemoryWarning):
    """``budget()`` was set above the memory this process may use; arrays are still placed by what is free."""


class CacheKeyWarning(ApsiMemoryWarning):
    """A ``@cached`` function reads data that is not part of its key (a closure's variables, mutable globals): a
    result cached while they held one value comes back after they change. Names them; pass them as arguments."""


class NotFreedWarning(ApsiMemoryWarning):
    """``free()`` was given an array ``memory.array`` did not make: nothing was freed."""
