"""A fake ``cupy`` (device memory, its pools, ``cupy.cuda.runtime``) over a machine's ``GpuDevices`` (see
``sim.gpu``)."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import TypeVar

from sim.gpu.base import CachingPool, FakeTensor, GpuDevices, nbytes


class CupyOutOfMemoryError(MemoryError):
    """Shaped like ``cupy.cuda.memory.OutOfMemoryError``: a ``MemoryError``."""


CupyOutOfMemoryError.__name__ = CupyOutOfMemoryError.__qualname__ = "OutOfMemoryError"
CupyOutOfMemoryError.__module__ = "cupy.cuda.memory"


class FakeCupyPool:
    """``cupy.get_default_memory_pool()``: one caching pool per device; the methods act on the current one."""

    def __init__(self, owner: FakeCupy) -> None:
        self.owner = owner
        self.pools: dict[int, CachingPool] = {}

    def device_pool(self) -> CachingPool:
        index = self.owner.current
        return self.pools.setdefault(index, CachingPool(self.owner.machine, self.owner.visible[index]))

    def used_bytes(self) -> int:
        return self.device_pool().allocated

    def total_bytes(self) -> int:
        return self.device_pool().reserved

    def free_bytes(self) -> int:
        return self.device_pool().reserved - self.device_pool().allocated

    def free_all_blocks(self) -> None:
        for pool in self.pools.values():
            pool.empty()


class FakePinnedPool:
    def __init__(self) -> None:
        self.emptied = 0

    def free_all_blocks(self) -> None:
        self.emptied += 1


class FakeCupy:
    def __init__(self, machine: GpuDevices) -> None:
        self.machine = machine
        self.visible = machine.visible() if machine.driver_loaded else []
        self.current = 0
        self.pool = FakeCupyPool(self)
        self.pinned = FakePinnedPool()

    def empty(self, shape: int | Sequence[int], dtype: str = "float32") -> FakeTensor:
        self.machine.open_context(self.visible[self.current])
        size = nbytes(shape, dtype)
        pool = self.pool.device_pool()
        block = pool.malloc(size)
        if block is None:
            raise CupyOutOfMemoryError(
                f"Out of memory allocating {size:,} bytes (allocated so far: {pool.allocated:,} bytes).")
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return FakeTensor(block, dims, str(dtype), f"cuda:{self.current}")

    def device(self, index: int) -> FakeCupyDevice:
        return FakeCupyDevice(self, index)

    def get_device_properties(self, index: int) -> dict[str, object]:
        if not 0 <= index < len(self.visible):
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        gpu = self.machine.gpus[self.visible[index]]
        # CuPy gives the name as bytes and the UUID as its 16 raw bytes
        return {"name": gpu.name.encode(), "totalGlobalMem": gpu.total_bytes,
                "uuid": bytes.fromhex(gpu.uuid[4:].replace("-", ""))}

    def get_device_count(self) -> int:
        if not self.machine.driver_loaded:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return len(self.visible)

    def mem_get_info(self) -> tuple[int, int]:
        physical = self.visible[self.current]
        self.machine.open_context(physical)
        return self.machine.free(physical), self.machine.gpus[physical].total_bytes

    def module(self) -> types.ModuleType:
        cupy = types.ModuleType("cupy")
        cuda = types.ModuleType("cupy.cuda")
        runtime = types.ModuleType("cupy.cuda.runtime")
        memory = types.ModuleType("cupy.cuda.memory")
        cupy.__version__ = "0.0-fake"  # type: ignore[attr-defined]
        cupy.cuda = cuda  # type: ignore[attr-defined]
        cupy.empty = self.empty  # type: ignore[attr-defined]
        cupy.get_default_memory_pool = lambda: self.pool  # type: ignore[attr-defined]
        cupy.get_default_pinned_memory_pool = lambda: self.pinned  # type: ignore[attr-defined]
        cuda.runtime = runtime  # type: ignore[attr-defined]
        cuda.memory = memory  # type: ignore[attr-defined]
        cuda.Device = self.device  # type: ignore[attr-defined]
        memory.OutOfMemoryError = CupyOutOfMemoryError  # type: ignore[attr-defined]
        runtime.getDeviceCount = self.get_device_count  # type: ignore[attr-defined]
        runtime.getDeviceProperties = self.get_device_properties  # type: ignore[attr-defined]
        runtime.getDevice = lambda: self.current  # type: ignore[attr-defined]
        runtime.memGetInfo = self.mem_get_info  # type: ignore[attr-defined]
        return cupy


_Device = TypeVar("_Device", bound="FakeCupyDevice")


class FakeCupyDevice:
    def __init__(self, owner: FakeCupy, index: int) -> None:
        self.owner = owner
        self.id = index
        self._previous: list[int] = []

    def use(self) -> None:
        self.owner.current = self.id

    def __enter__(self: _Device) -> _Device:  # noqa: PYI019 - typing.Self is Python 3.11+
        self._previous.append(self.owner.current)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        self.owner.current = self._previous.pop()
