"""The fake GPU machine: the physical devices and what this process holds on them (``base.GpuDevices``), the
driver's files, and the fake framework modules it puts into ``sys.modules`` (see ``sim.gpu``). The top module of
``sim.gpu``: it assembles ``base`` and the three fake frameworks, none of which imports it."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sim.gpu.base import FakeGpu, GiB, GpuDevices
from sim.gpu.fake_cupy import FakeCupy
from sim.gpu.fake_nvml import FakeNvml
from sim.gpu.fake_torch import FakeTorch


@dataclass
class FakeGpuMachine(GpuDevices):
    """The physical devices plus what this process holds on them (``GpuDevices``, in ``base``, which the fake
    frameworks work on). ``context_bytes`` is each CUDA context's cost. Adds making one, the driver's files and
    installing the fake frameworks."""

    @classmethod
    def of(cls, *capacities_gb: float, name: str = "NVIDIA Fake A100", context_bytes: int = 0) -> FakeGpuMachine:
        devices = [FakeGpu(name, int(gb * GiB), f"GPU-{i:08x}-0000-4000-8000-{i:012x}")
                   for i, gb in enumerate(capacities_gb)]
        return cls(devices, context_bytes)

    def write_driver_files(self, root: str | os.PathLike[str]) -> None:
        """What a loaded NVIDIA driver shows under ``root`` (a ``sim.tree`` root): the control device node and
        one ``/proc/driver/nvidia/gpus/<PCI address>`` folder per GPU."""
        base = Path(root)
        (base / "dev").mkdir(parents=True, exist_ok=True)
        (base / "dev" / "nvidiactl").touch()
        for i, gpu in enumerate(self.gpus):
            folder = base / "proc" / "driver" / "nvidia" / "gpus" / f"0000:{i + 1:02x}:00.0"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "information").write_text(f"Model: \t\t {gpu.name}\nGPU UUID: \t {gpu.uuid}\n")

    @contextlib.contextmanager
    def installed(self, *names: str, imported: bool = True) -> Iterator[dict[str, types.ModuleType]]:
        """Put the named fakes (``"torch"``, ``"cupy"``, ``"pynvml"``) into ``sys.modules`` — or, with
        ``imported=False``, make them importable but not yet imported. The others are blocked (``import`` fails)
        so a real library on the machine cannot leak into a test. Everything is restored afterwards."""
        makers = {"torch": self._torch, "cupy": self._cupy, "pynvml": self._nvml}
        unknown = set(names) - set(makers)
        if unknown:
            raise ValueError(f"no fake for {sorted(unknown)}; choose from {sorted(makers)}")
        covered = [m for m in sys.modules if m.split(".")[0] in makers]
        saved = {m: sys.modules[m] for m in covered}
        modules = {name: makers[name]() for name in names}
        finder = _Finder(modules)
        try:
            for m in covered:
                del sys.modules[m]
            for name in set(makers) - set(names):
                sys.modules[name] = None  # type: ignore[assignment]  # None makes ``import name`` fail
            if imported:
                sys.modules.update(modules)
            else:
                sys.meta_path.insert(0, finder)
            yield modules
        finally:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            for name in makers:
                sys.modules.pop(name, None)
            sys.modules.update(saved)

    # -- the fake modules --------------------------------------------------------------------------------------

    def _torch(self) -> types.ModuleType:
        return FakeTorch(self).module()

    def _cupy(self) -> types.ModuleType:
        return FakeCupy(self).module()

    def _nvml(self) -> types.ModuleType:
        return FakeNvml(self).module()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes fake modules importable (found by ``import``) without their being imported yet."""

    def __init__(self, modules: dict[str, types.ModuleType]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in self.modules else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the fake is built already

