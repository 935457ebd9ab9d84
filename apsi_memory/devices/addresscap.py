"""The address-space cap ``fit_batch`` sets around each try of the step (``capped``), so that in a memory cgroup —
where the kernel OOM-kills and no allocation ever fails — a batch that does not fit raises an error to halve on.

Why ``RLIMIT_AS`` and not the watcher: a watcher polls, and an async exception lands in the step's thread only at
the next bytecode, never inside the C loop that is filling the memory (``np.ones``, a matmul, autograd's backward):
the kernel kills before it arrives. ``RLIMIT_AS`` refuses the allocation itself, synchronously, in whichever call
makes it, and ``malloc``/``mmap`` failing is what NumPy and PyTorch already turn into ``MemoryError`` and
``DefaultCPUAllocator: can't allocate memory``. The cap is ``VmSize`` + the group's free memory, less a margin
(``decide.batchcap``); measured in a real v1 group (tests/real/test_fit_batch_cgroup.py) it turns the OOM kill of a
NumPy and a PyTorch CPU step into halvings.

What the choice cannot do, each a consequence of ``RLIMIT_AS`` being one number for the whole process:

* Other threads are capped too while a try runs: their big allocations may fail with ``MemoryError``.
* Address space is not RAM. Mappings never touched (``np.empty`` of a big array), new threads' stacks and malloc
  arenas, and file mappings (``np.memmap``, spill files of ``memory.array``, whose ``mmap`` then fails with an
  ``OSError`` that is not halved on) all count; memory mapped before the try but first touched during it does not.
* Never with a GPU: CUDA reserves address ranges far beyond RAM, so no cap is set when PyTorch sees CUDA, CuPy or
  JAX is imported (``why_not_cap``); a GPU step is protected by its own allocator's errors.
* Nested and concurrent ``fit_batch`` calls share one limit: the first try to start saves the limits, each try can
  only lower the cap, and the last to end restores them — always, also when the step raises.
* A child forked while a try runs gets the saved limits back (``os.register_at_fork``); a program started by
  ``subprocess`` keeps the cap (limits survive ``exec``, and no Python runs in between to lift it).
* A user's own lower ``RLIMIT_AS`` is kept as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from ..decide import address_space_cap, why_not_cap
from ..errors import ApsiMemoryError
from ..logs import logger
from ..machinery.machines import machine

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows; why_not_cap then says so
    resource = None  # type: ignore[assignment]

log = logger("apsi_memory.batch")

STATUS = "/proc/self/status"


class _Shared:
    """The one limit of the process, shared by every try running under ``fit_batch`` in any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0  # tries running now
        self.saved: tuple[int, int] | None = None  # the limits before the first of them lowered the cap


_shared = _Shared()


@contextlib.contextmanager
def capped(asked: bool = True) -> Iterator[int | None]:
    """While the block runs the soft ``RLIMIT_AS`` is at most ``VmSize`` + the group's free memory less a margin
    (``decide.batchcap``); yields the soft limit in force, in bytes (ours, or a lower one that was there), or
    ``None`` where there is none (``reason()`` says why). The limits are restored when the last block running
    ends, whatever it raised."""
    why = reason(asked)
    numbers = None if why is not None else _mapped_and_free()
    if numbers is None:
        log.debug("fit_batch: no address-space cap (%s)", why or "VmSize or the free memory could not be read")
        yield None
        return
    cap = _lower(*numbers)
    try:
        yield cap
    finally:
        _release()


def reason(asked: bool = True) -> str | None:
    """Why ``capped`` sets no cap here (``None``: it does)."""
    has_rlimit = resource is not None and sys.platform.startswith("linux") and os.path.exists(STATUS)
    return why_not_cap(asked, has_rlimit, os.path.realpath(machine().root) == "/", gpu_framework())


def gpu_framework() -> str | None:
    """The imported framework that may put the step on a GPU: PyTorch where it sees CUDA, CuPy, JAX. Never
    imports one."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "torch"
    for name in ("cupy", "jax"):
        if sys.modules.get(name) is not None:
            return name
    return None


def vm_size(text: str) -> int | None:
    """``VmSize`` of a ``/proc/<pid>/status`` text, in bytes (``None``: no such line)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        words = value.split()
        if name == "VmSize" and words and words[0].isdigit():
            return int(words[0]) * 1024
    return None


def _mapped_and_free() -> tuple[int, int] | None:
    try:
        with open(STATUS) as f:
            mapped = vm_size(f.read())
        limits = machine().limits()
    except (OSError, ApsiMemoryError) as exc:  # no reading, no cap: the step runs as it would without fit_batch
        log.debug("fit_batch: cannot read what the cap needs: %s", exc)
        return None
    if mapped is None:
        return None
    # what the other processes of the group have placed but the kernel has not charged yet is not free
    return mapped, limits.free_bytes - limits.siblings_reserved_bytes


def _lower(mapped: int, free: int) -> int | None:
    infinity = resource.RLIM_INFINITY
    with _shared.lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = address_space_cap(mapped, free, None if soft == infinity else soft, None if hard == infinity else hard)
        if _shared.depth == 0:
            _shared.saved = None
        if cap is not None:
            try:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            except (OSError, ValueError) as exc:  # a kernel that refuses it: run uncapped rather than not at all
                log.debug("fit_batch: RLIMIT_AS %d refused: %s", cap, exc)
                cap = None
            else:
                if _shared.saved is None:
                    _shared.saved = (soft, hard)
        _shared.depth += 1
    log.debug("fit_batch: RLIMIT_AS %s while the step runs (VmSize %d, free %d)", cap, mapped, free)
    return cap if cap is not None else (None if soft == infinity else soft)


def _release() -> None:
    with _shared.lock:
        _shared.depth = max(_shared.depth - 1, 0)  # a forked child that runs on through the block starts at 0
        if _shared.depth == 0 and _shared.saved is not None:
            saved, _shared.saved = _shared.saved, None
            try:
                resource.setrlimit(resource.RLIMIT_AS, saved)
            except (OSError, ValueError) as exc:  # the step lowered the hard limit itself: its limits stay
                log.warning("fit_batch: could not restore RLIMIT_AS %s: %s", saved, exc)


def _lift_in_child() -> None:
    """In a forked child: the saved limits back, and a fresh lock (another thread may have held it at the fork)."""
    global _shared
    saved = _shared.saved
    _shared = _Shared()
    if saved is not None:
        resource.setrlimit(resource.RLIMIT_AS, saved)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_lift_in_child)
