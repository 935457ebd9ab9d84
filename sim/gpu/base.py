"""What every fake framework shares: the physical device (``FakeGpu``), the machine's devices and what this process
holds on them (``GpuDevices``: ``take``/``give``, contexts, ``CUDA_VISIBLE_DEVICES``), a framework's caching allocator
on a device (``CachingPool``, handing out ``Block``s), the tensors they back, and byte counts by dtype (see
``sim.gpu``). The lowest module of ``sim.gpu``: it imports none of the others."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

MiB = 1 << 20
GiB = 1 << 30

DTYPE_SIZES = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8,
                "float64": 8}


@dataclass
class FakeGpu:
    """One physical device (NVML's view). ``used_by_others`` is memory other processes hold on it."""

    name: str
    total_bytes: int
    uuid: str
    used_by_others: int = 0
    taken: int = 0  # bytes this process's pools took from the device
    contexts: int = 0  # CUDA contexts this process created on it

    def used(self, context_bytes: int) -> int:
        return self.used_by_others + self.taken + self.contexts * context_bytes


@dataclass
class GpuDevices:
    """The physical devices plus what this process holds on them. ``context_bytes`` is each CUDA context's cost.
    What the fake frameworks and their pools work on; ``sim.gpu.machine.FakeGpuMachine`` adds making a machine,
    the driver's files and installing the fakes."""

    gpus: list[FakeGpu]
    context_bytes: int = 0
    driver_loaded: bool = True

    def free(self, physical: int) -> int:
        gpu = self.gpus[physical]
        return gpu.total_bytes - gpu.used(self.context_bytes)

    def take(self, physical: int, size: int) -> bool:
        if size > self.free(physical):
            return False
        self.gpus[physical].taken += size
        return True

    def give(self, physical: int, size: int) -> None:
        self.gpus[physical].taken -= size

    def open_context(self, physical: int) -> None:
        if not self.gpus[physical].contexts:
            self.gpus[physical].contexts = 1

    def contexts(self) -> int:
        return sum(gpu.contexts for gpu in self.gpus)

    def visible(self) -> list[int]:
        """Physical indices in CUDA's order under ``CUDA_VISIBLE_DEVICES``. Written independently of
        ``apsi_memory.devices`` on purpose: it is the oracle the library's own mapping is checked against."""
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        if spec is None:
            return list(range(len(self.gpus)))
        chosen: list[int] = []
        for entry in (e.strip() for e in spec.split(",")):
            matches = [i for i, gpu in enumerate(self.gpus)
                       if (entry.isdigit() and int(entry) == i)
                       or (entry.startswith("GPU-") and len(entry) > 4 and gpu.uuid.startswith(entry))]
            if len(matches) != 1 or matches[0] in chosen:
                break
            chosen.append(matches[0])
        return chosen


class Block:
    """Device memory handed out by a pool; returned to the pool's cache when no longer referenced."""

    def __init__(self, pool: CachingPool, size: int) -> None:
        self.pool = pool
        self.size = size

    def __del__(self) -> None:
        self.pool.release(self.size)


@dataclass
class CachingPool:
    """One framework's caching allocator on one device."""

    machine: GpuDevices
    physical: int
    allocated: int = 0
    cached: list[int] = field(default_factory=list)

    @property
    def reserved(self) -> int:
        return self.allocated + sum(self.cached)

    def malloc(self, size: int) -> Block | None:
        """A block of ``size`` bytes, or None when the device is full even after emptying this pool's cache."""
        fitting = [c for c in self.cached if c >= size]
        if fitting:
            best = min(fitting)
            self.cached.remove(best)
            if best > size:
                self.cached.append(best - size)  # the split-off rest stays cached
        elif not self.machine.take(self.physical, size):
            self.empty()  # as the real allocators do before giving up
            if not self.machine.take(self.physical, size):
                return None
        self.allocated += size
        return Block(self, size)

    def release(self, size: int) -> None:
        self.allocated -= size
        self.cached.append(size)

    def empty(self) -> None:
        self.machine.give(self.physical, sum(self.cached))
        self.cached.clear()



def nbytes(shape: int | Sequence[int], dtype: str) -> int:
    dims = [shape] if isinstance(shape, int) else list(shape)
    count = 1
    for dim in dims:
        count *= dim
    return count * DTYPE_SIZES[str(dtype).replace("torch.", "")]


def fmt_gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


class FakeTensor:
    def __init__(self, block: Block, shape: tuple[int, ...], dtype: str, device: str) -> None:
        self._block = block
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.nbytes = block.size

    def numel(self) -> int:
        return self.nbytes // DTYPE_SIZES[self.dtype.replace("torch.", "")]

