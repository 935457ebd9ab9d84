"""A fake NVML (nvidia-ml-py's ``pynvml``) over a machine's ``GpuDevices``: every physical device, whatever
``CUDA_VISIBLE_DEVICES`` says (see ``sim.gpu``)."""

from __future__ import annotations

import types

from sim.gpu.base import FakeGpu, GpuDevices


class NVMLError(Exception):
    pass


class FakeNvml:
    def __init__(self, machine: GpuDevices) -> None:
        self.machine = machine
        self.initialized = False

    def init(self) -> None:
        if not self.machine.driver_loaded:
            raise NVMLError("Driver Not Loaded")
        self.initialized = True

    def _checked(self, handle: int) -> FakeGpu:
        if not self.initialized:
            raise NVMLError("Uninitialized")
        return self.machine.gpus[handle]

    def count(self) -> int:
        if not self.initialized:
            raise NVMLError("Uninitialized")
        return len(self.machine.gpus)

    def handle_by_index(self, index: int) -> int:
        if not 0 <= index < self.count():
            raise NVMLError("Invalid Argument")
        return index

    def memory_info(self, handle: int) -> types.SimpleNamespace:
        gpu = self._checked(handle)
        used = gpu.used(self.machine.context_bytes)
        return types.SimpleNamespace(total=gpu.total_bytes, used=used, free=gpu.total_bytes - used)

    def module(self) -> types.ModuleType:
        nvml = types.ModuleType("pynvml")
        nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
        nvml.nvmlInit = self.init  # type: ignore[attr-defined]
        nvml.nvmlShutdown = lambda: setattr(self, "initialized", False)  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetCount = self.count  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetHandleByIndex = self.handle_by_index  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetName = lambda h: self._checked(h).name  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetUUID = lambda h: self._checked(h).uuid  # type: ignore[attr-defined]
        nvml.nvmlDeviceGetMemoryInfo = self.memory_info  # type: ignore[attr-defined]
        return nvml
