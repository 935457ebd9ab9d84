"""``fit_batch``: run a step at the largest batch that fits, halving on out-of-memory.

Theory of operation
-------------------
``fit_batch(fn, 512)`` calls ``fn(512)``. When that runs out of memory it gives memory back and tries 256, 128, ...
(odd sizes round down: 511 -> 255), never below ``min_batch`` — ``min_batch`` itself is tried last, so 10 with
``min_batch=4`` tries 10, 5, 4. It returns ``(result, batch_that_worked)`` so the next call can start there.

Out-of-memory means (``oom_kind``):

* ``MemoryError`` — CPU allocations (NumPy, Python), and CuPy's ``OutOfMemoryError``, which derives from it;
* ``RuntimeError`` whose type is named ``OutOfMemoryError`` (``torch.OutOfMemoryError`` is
  ``torch.cuda.OutOfMemoryError``), or whose message says ``out of memory`` (older PyTorch, HIP, MPS, XPU,
  ``CUDA error: out of memory``), ``DefaultCPUAllocator: can't allocate memory`` (PyTorch on the CPU),
  ``CUBLAS_STATUS_ALLOC_FAILED``, or ``RESOURCE_EXHAUSTED`` (JAX/XLA's ``XlaRuntimeError``).

A ``BlockError`` from ``memory.map`` counts as what it chains, so a ``fit_batch`` around ``map`` halves too.
Everything else passes through untouched. accelerate also retries on ``cuDNN error: CUDNN_STATUS_NOT_SUPPORTED``;
we do not, because that error also means a genuinely unsupported input and halving would hide it.

While ``fn`` runs, the process's address space is capped (``RLIMIT_AS`` = VmSize + the group's free memory less a
margin, ``addresscap``): in a memory cgroup the kernel OOM-kills instead of failing an allocation, and the cap turns the
allocation that would have been killed into a ``MemoryError`` (NumPy) or ``DefaultCPUAllocator`` error (PyTorch).
No cap where a GPU framework is in use (CUDA reserves address space far beyond RAM), on a simulated machine, off
Linux, or with ``cap_address_space=False``; the limits before the try are restored after it, also on errors.

Between tries, in this order: the exception is dropped, garbage is collected, then the GPU caches of frameworks
the program already imported are emptied (``torch.cuda.empty_cache``, CuPy's device and pinned pools) — a pool
gives back its own cache before it fails, but not another framework's — and after a CPU out-of-memory the
registered pools and stores give cached RAM back (``machine().components.relieve()``).

The retry happens *outside* the ``except`` block. The exception's traceback references the frames of ``fn`` and
through them every tensor ``fn`` had allocated; retrying while it is alive (inside ``except``, or while a variable
keeps it) runs the smaller batch next to the bigger one's leftovers and fails again — the pitfall of the simple
``try: fn(b) except OOM: fn(b // 2)``. In addition, the frames of the dropped traceback are cleared, so memory is
freed even if something else (a logging handler, a debugger) still holds the exception object.
"""

from __future__ import annotations

import enum
import gc
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..decide import halve_batch
from ..errors import ArgumentError, ArgumentTypeError, BatchTooSmallError, BlockError
from ..logs import logger
from ..machinery.machines import machine
from .addresscap import capped

log = logger("apsi_memory.batch")  # the documented logger name (docs: "What it logs")

T = TypeVar("T")


class Oom(str, enum.Enum):
    """Where memory ran out: decides what is given back before the next try."""

    CPU = "cpu"
    GPU = "gpu"


# Substrings of a RuntimeError's message that mean an allocation failed, and on which side (GPU ones compared
# in lower case: "CUDA out of memory", "CUDA error: out of memory", "HIP out of memory", "MPS backend out of memory").
_CPU_MESSAGES = ("DefaultCPUAllocator: can't allocate memory",)
_GPU_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "resource_exhausted")


def oom_kind(exc: BaseException) -> Oom | None:
    """``Oom.CPU``/``Oom.GPU`` when ``exc`` is an out-of-memory error, else ``None``. Pure: looks only at the
    exception's type and message, so no framework has to be imported to recognise its errors."""
    if isinstance(exc, BlockError) and exc.__cause__ is not None:
        return oom_kind(exc.__cause__)  # memory.map names the block's rows and chains fn's own error
    if isinstance(exc, MemoryError):
        return Oom.GPU if type(exc).__module__.split(".")[0] == "cupy" else Oom.CPU
    if not isinstance(exc, RuntimeError):
        return None
    message = str(exc)
    if any(text in message for text in _CPU_MESSAGES):
        return Oom.CPU
    if type(exc).__name__ == "OutOfMemoryError" or any(text in message.lower() for text in _GPU_MESSAGES):
        return Oom.GPU
    return None


def next_batch(batch: int, min_batch: int) -> int | None:
    """The batch to try after ``batch`` ran out of memory: half of it, but ``min_batch`` before giving up."""
    if batch <= min_batch:
        return None
    return max(halve_batch(batch), min_batch)


@dataclass(frozen=True)
class _Done(Generic[T]):
    result: T


@dataclass(frozen=True)
class _OutOfMemory:
    kind: Oom
    summary: str


def fit_batch(fn: Callable[[int], T], batch: int, min_batch: int = 1, *,
              cap_address_space: bool = True) -> tuple[T, int]:
    """``fn(batch)``, halving ``batch`` on out-of-memory; returns ``(result, batch_that_worked)``.

    Raises ``BatchTooSmallError`` (a ``MemoryError``) chained to the last out-of-memory error when even
    ``min_batch`` does not fit. Any other exception from ``fn`` propagates unchanged.

    ``cap_address_space``: cap ``RLIMIT_AS`` near VmSize + the free memory while ``fn`` runs, so that in a memory
    cgroup a batch too big fails with ``MemoryError`` instead of being OOM-killed (never with a GPU framework in
    use; ``False``: never).
    """
    _check_arguments(fn, batch, min_batch)
    if not isinstance(cap_address_space, bool):
        raise ArgumentTypeError(f"fit_batch: cap_address_space must be True or False, not {cap_address_space!r}")
    tried: list[int] = []
    while True:
        tried.append(batch)
        outcome = _try(fn, batch, min_batch, tried, cap_address_space)
        if isinstance(outcome, _Done):
            return outcome.result, batch
        # Out here the failed call's exception is gone, so what its frames held can be freed.
        _give_memory_back(outcome.kind)
        smaller = next_batch(batch, min_batch)
        assert smaller is not None  # _try raised when there was nothing smaller to try
        log.warning("out of memory at batch %d (%s); trying %d", batch, outcome.summary, smaller)
        batch = smaller


def _try(fn: Callable[[int], T], batch: int, min_batch: int, tried: list[int],
         cap: bool) -> _Done[T] | _OutOfMemory:
    try:
        # the cap is lifted before the error is handled: what follows may allocate and must not fail for it
        with capped(cap):
            result = fn(batch)
        return _Done(result)
    except Exception as exc:
        kind = oom_kind(exc)
        if kind is None:
            raise
        if next_batch(batch, min_batch) is None:
            sizes = ", ".join(map(str, tried))
            raise BatchTooSmallError(
                f"out of memory even at batch {batch} (min_batch={min_batch}); tried {sizes}. "
                f"Last error: {_summary(exc)}") from exc
        summary = _summary(exc)
        _clear_frames(exc)
        # returning leaves the except block, which deletes ``exc``: the last reference to its traceback
        return _OutOfMemory(kind, summary)


def _summary(exc: BaseException) -> str:
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__


def _clear_frames(exc: BaseException) -> None:
    """Drop the local variables of every finished frame in ``exc``'s tracebacks (and those of the exceptions it
    chains), so its tensors are freed even while someone else keeps the exception object."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # skips frames still running (ours)
        pending += [current.__cause__, current.__context__]


def _give_memory_back(kind: Oom) -> None:
    gc.collect()  # tensors caught in reference cycles first, so the caches below can return their blocks
    _empty_gpu_caches()
    if kind is Oom.CPU:
        machine().components.relieve()


def _empty_gpu_caches() -> None:
    """Empty the caching pools of GPU frameworks the program already imported; never imports one."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def _check_arguments(fn: object, batch: object, min_batch: object) -> None:
    if not callable(fn):
        raise ArgumentTypeError(f"fit_batch needs a function of the batch size, not {type(fn).__name__}")
    for name, value in (("batch", batch), ("min_batch", min_batch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"fit_batch: {name} must be an int, not {type(value).__name__} ({value!r})")
        if value < 1:
            raise ArgumentError(f"fit_batch: {name} must be at least 1, not {value}")
    assert isinstance(batch, int) and isinstance(min_batch, int)
    if min_batch > batch:
        raise ArgumentError(f"fit_batch: min_batch ({min_batch}) is larger than batch ({batch})")
