"""A fake ``torch`` (its ``torch.cuda`` part) over a machine's ``GpuDevices`` (see ``sim.gpu``)."""

from __future__ import annotations

import types
from collections.abc import Sequence

from sim.gpu.base import CachingPool, FakeTensor, GpuDevices, fmt_gib, nbytes


class TorchOutOfMemoryError(RuntimeError):
    """Shaped like ``torch.OutOfMemoryError`` (also ``torch.cuda.OutOfMemoryError``): a ``RuntimeError``."""


TorchOutOfMemoryError.__name__ = TorchOutOfMemoryError.__qualname__ = "OutOfMemoryError"
TorchOutOfMemoryError.__module__ = "torch"


class FakeTorch:
    def __init__(self, machine: GpuDevices) -> None:
        self.machine = machine
        self.visible = machine.visible() if machine.driver_loaded else []
        self.pools: dict[int, CachingPool] = {}
        self.initialized = False

    def _index(self, device: int | str | None) -> int:
        if device is None or device == "cuda":
            index = 0
        elif isinstance(device, str):
            if not device.startswith("cuda:"):
                raise NotImplementedError(f"the fake torch only models CUDA devices, not {device!r}")
            index = int(device.split(":", 1)[1])
        else:
            index = int(device)
        if not 0 <= index < len(self.visible):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def _pool(self, index: int) -> CachingPool:
        self.initialized = True
        physical = self.visible[index]
        self.machine.open_context(physical)
        return self.pools.setdefault(index, CachingPool(self.machine, physical))

    def empty(self, shape: int | Sequence[int], dtype: str = "float32", device: str = "cuda") -> FakeTensor:
        index = self._index(device)
        size = nbytes(shape, dtype)
        pool = self._pool(index)
        block = pool.malloc(size)
        if block is None:
            physical = self.visible[index]
            raise TorchOutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {fmt_gib(size)}. GPU {index} has a total capacity of "
                f"{fmt_gib(self.machine.gpus[physical].total_bytes)} of which {fmt_gib(self.machine.free(physical))}"
                f" is free. Of the allocated memory {fmt_gib(pool.allocated)} is allocated by PyTorch, and "
                f"{fmt_gib(pool.reserved - pool.allocated)} is reserved by PyTorch but unallocated.")
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return FakeTensor(block, dims, str(dtype), f"cuda:{index}")

    def module(self) -> types.ModuleType:
        torch = types.ModuleType("torch")
        cuda = types.ModuleType("torch.cuda")
        torch.__version__ = "0.0-fake"  # type: ignore[attr-defined]
        torch.cuda = cuda  # type: ignore[attr-defined]
        torch.OutOfMemoryError = TorchOutOfMemoryError  # type: ignore[attr-defined]
        torch.empty = self.empty  # type: ignore[attr-defined]
        torch.float32, torch.uint8 = "float32", "uint8"  # type: ignore[attr-defined]
        cuda.OutOfMemoryError = TorchOutOfMemoryError  # type: ignore[attr-defined]
        cuda.is_available = lambda: bool(self.visible)  # type: ignore[attr-defined]
        cuda.is_initialized = lambda: self.initialized  # type: ignore[attr-defined]
        cuda.device_count = lambda: len(self.visible)  # type: ignore[attr-defined]
        cuda.get_device_properties = self.get_device_properties  # type: ignore[attr-defined]
        cuda.mem_get_info = self.mem_get_info  # type: ignore[attr-defined]
        cuda.memory_allocated = lambda device=None: self._stat(device, "allocated")  # type: ignore[attr-defined]
        cuda.memory_reserved = lambda device=None: self._stat(device, "reserved")  # type: ignore[attr-defined]
        cuda.empty_cache = self.empty_cache  # type: ignore[attr-defined]
        return torch

    def get_device_properties(self, device: int | str) -> types.SimpleNamespace:
        gpu = self.machine.gpus[self.visible[self._index(device)]]
        # torch prints the UUID without NVML's "GPU-" prefix
        return types.SimpleNamespace(name=gpu.name, total_memory=gpu.total_bytes, uuid=gpu.uuid[4:])

    def mem_get_info(self, device: int | str | None = None) -> tuple[int, int]:
        index = self._index(device)
        self._pool(index)  # asking the driver needs a context on that device
        physical = self.visible[index]
        return self.machine.free(physical), self.machine.gpus[physical].total_bytes

    def _stat(self, device: int | str | None, what: str) -> int:
        pool = self.pools.get(self._index(device))
        return 0 if pool is None else int(getattr(pool, what))

    def empty_cache(self) -> None:
        for pool in self.pools.values():
            pool.empty()
