"""The address-space cap ``fit_batch`` sets while a step runs, so a CPU allocation that does not fit fails with an
error it can halve on instead of the kernel's OOM killer ending the process.

In a memory cgroup an allocation never fails: ``mmap`` hands out address space, and the group's OOM killer sends
SIGKILL when the pages are touched. ``RLIMIT_AS`` makes the allocation itself fail (``malloc`` returns NULL, NumPy
raises ``MemoryError``, PyTorch's ``DefaultCPUAllocator`` a ``RuntimeError``) once the process's mappings would
exceed it. Set to what the process has mapped (``VmSize``) plus what its group has free, a new mapping is refused
when touching all of it could not fit. The cap counts address space, not RAM: mappings never touched, thread stacks
and file mappings count too (refused early), and memory mapped before the step but touched only during it is not
counted at all (let through).

That last part is why the cap keeps a margin (``cap_margin``) below the free memory: RAM grows a little faster than
the mappings do (heap pages mapped before and reused, page tables, library pages faulted back in). Measured in a
1 GiB v1 group, a PyTorch step at batch 8192 grew by 528 MiB of RSS for 512 MiB of new mappings; with the cap at
VmSize + all of the 782 MB free, its next 256 MiB gradient was let through and the group killed it 2 MiB short.
"""

from __future__ import annotations

CAP_MARGIN_SHARE = 8  # the margin is at least an eighth of the free memory ...
CAP_MARGIN_BYTES = 64 << 20  # ... and at least 64 MiB, but never more than half of what is free


def cap_margin(free: int) -> int:
    """What ``address_space_cap`` keeps below ``free`` bytes of free memory: ``free / 8``, at least 64 MiB but at
    most half of ``free``."""
    free = max(free, 0)
    return max(min(CAP_MARGIN_BYTES, free // 2), free // CAP_MARGIN_SHARE)


def address_space_cap(mapped: int, free: int, soft: int | None, hard: int | None) -> int | None:
    """The soft ``RLIMIT_AS`` to set while a step runs: ``mapped`` (VmSize, bytes) plus ``free`` (the group's free
    memory, bytes; below 0 counts as 0) less ``cap_margin(free)``, never above the hard limit. ``soft``/``hard``:
    the limits now, ``None`` for unlimited. ``None``: leave the limit alone, it is already at or below the cap (a
    user's own ``RLIMIT_AS``)."""
    free = max(free, 0)
    cap = max(mapped, 0) + free - cap_margin(free)
    if hard is not None:
        cap = min(cap, hard)
    if soft is not None and soft <= cap:
        return None
    return cap


def why_not_cap(asked: bool, has_rlimit: bool, real_kernel: bool, gpu: str | None) -> str | None:
    """Why no cap is set (``None``: set one). ``asked``: the caller's ``cap_address_space``; ``has_rlimit``: the
    platform has ``RLIMIT_AS`` and ``/proc/self/status``; ``real_kernel``: the free memory is read from this
    process's own kernel (not a simulated root); ``gpu``: the GPU framework in use, if any — CUDA reserves virtual
    ranges far larger than RAM (tens of GB to TBs), which any cap from RAM would refuse."""
    if not asked:
        return "cap_address_space=False"
    if not has_rlimit:
        return "no RLIMIT_AS here (Linux only)"
    if not real_kernel:
        return "the machine reads a simulated root, not this process's kernel"
    if gpu is not None:
        return f"{gpu} may use a GPU: CUDA reserves address space far beyond RAM"
    return None
