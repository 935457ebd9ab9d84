"""Fake GPUs: a machine of CUDA devices seen through fake ``torch``, ``cupy`` and ``pynvml`` modules.

The fakes speak the subset of each library's real API that ``apsi_memory.devices`` and ``apsi_memory.batch``
use, and are put into ``sys.modules`` (``machine.installed("torch", "pynvml")``), so the real code finds them
with its ordinary ``import``. What they model, because the library's behaviour depends on it:

* capacity: every allocation takes bytes from one physical device; past its free memory the framework raises
  its own out-of-memory exception with the real message (``torch.OutOfMemoryError``, a ``RuntimeError``;
  CuPy's ``OutOfMemoryError``, a ``MemoryError``);
* caching pools: a freed tensor's block stays reserved by its framework (torch ``memory_reserved`` vs
  ``memory_allocated``, CuPy ``free_bytes``) until ``empty_cache`` / ``free_all_blocks``. Like the real
  allocators, a pool that runs short first gives its *own* cached blocks back and retries; it cannot reach
  another framework's cache. Simplification: every block is its own segment (no merging of neighbours);
* lifetime by reference: a block is freed when its tensor is garbage, so a traceback that still references the
  frame holding a tensor keeps its memory taken, as in CPython with the real libraries;
* ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUID prefixes, enumeration stops at the first invalid or repeated
  entry), read when a framework module is installed, as CUDA reads it at initialisation. NVML ignores it and
  lists every physical device, as the real NVML does;
* the driver's kernel files (``write_driver_files``), by which the library decides whether importing a framework
  could find a GPU at all;
* CUDA contexts: a framework creates one on a device the first time it allocates or asks the driver for free
  memory there (``context_bytes`` each, counted as used); NVML never does.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

MiB = 1 << 20
GiB = 1 << 30

_DTYPE_SIZES = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8,
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

    machine: FakeGpuMachine
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


@dataclass
class FakeGpuMachine:
    """The physical devices plus what this process holds on them. ``context_bytes`` is each CUDA context's cost."""

    gpus: list[FakeGpu]
    context_bytes: int = 0
    driver_loaded: bool = True

    @classmethod
    def of(cls, *capacities_gb: float, name: str = "NVIDIA Fake A100", context_bytes: int = 0) -> FakeGpuMachine:
        devices = [FakeGpu(name, int(gb * GiB), f"GPU-{i:08x}-0000-4000-8000-{i:012x}")
                   for i, gb in enumerate(capacities_gb)]
        return cls(devices, context_bytes)

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
        return _FakeTorch(self).module()

    def _cupy(self) -> types.ModuleType:
        return _FakeCupy(self).module()

    def _nvml(self) -> types.ModuleType:
        return _FakeNvml(self).module()


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


def _nbytes(shape: int | Sequence[int], dtype: str) -> int:
    dims = [shape] if isinstance(shape, int) else list(shape)
    count = 1
    for dim in dims:
        count *= dim
    return count * _DTYPE_SIZES[str(dtype).replace("torch.", "")]


def _fmt_gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


class FakeTensor:
    def __init__(self, block: Block, shape: tuple[int, ...], dtype: str, device: str) -> None:
        self._block = block
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.nbytes = block.size

    def numel(self) -> int:
        return self.nbytes // _DTYPE_SIZES[self.dtype.replace("torch.", "")]


# -- torch ---------------------------------------------------------------------------------------------------------

class TorchOutOfMemoryError(RuntimeError):
    """Shaped like ``torch.OutOfMemoryError`` (also ``torch.cuda.OutOfMemoryError``): a ``RuntimeError``."""


TorchOutOfMemoryError.__name__ = TorchOutOfMemoryError.__qualname__ = "OutOfMemoryError"
TorchOutOfMemoryError.__module__ = "torch"


class _FakeTorch:
    def __init__(self, machine: FakeGpuMachine) -> None:
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
        size = _nbytes(shape, dtype)
        pool = self._pool(index)
        block = pool.malloc(size)
        if block is None:
            physical = self.visible[index]
            raise TorchOutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {_fmt_gib(size)}. GPU {index} has a total capacity of "
                f"{_fmt_gib(self.machine.gpus[physical].total_bytes)} of which {_fmt_gib(self.machine.free(physical))}"
                f" is free. Of the allocated memory {_fmt_gib(pool.allocated)} is allocated by PyTorch, and "
                f"{_fmt_gib(pool.reserved - pool.allocated)} is reserved by PyTorch but unallocated.")
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


# -- cupy ----------------------------------------------------------------------------------------------------------

class CupyOutOfMemoryError(MemoryError):
    """Shaped like ``cupy.cuda.memory.OutOfMemoryError``: a ``MemoryError``."""


CupyOutOfMemoryError.__name__ = CupyOutOfMemoryError.__qualname__ = "OutOfMemoryError"
CupyOutOfMemoryError.__module__ = "cupy.cuda.memory"


class _FakeCupyPool:
    """``cupy.get_default_memory_pool()``: one caching pool per device; the methods act on the current one."""

    def __init__(self, owner: _FakeCupy) -> None:
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


class _FakePinnedPool:
    def __init__(self) -> None:
        self.emptied = 0

    def free_all_blocks(self) -> None:
        self.emptied += 1


class _FakeCupy:
    def __init__(self, machine: FakeGpuMachine) -> None:
        self.machine = machine
        self.visible = machine.visible() if machine.driver_loaded else []
        self.current = 0
        self.pool = _FakeCupyPool(self)
        self.pinned = _FakePinnedPool()

    def empty(self, shape: int | Sequence[int], dtype: str = "float32") -> FakeTensor:
        self.machine.open_context(self.visible[self.current])
        size = _nbytes(shape, dtype)
        pool = self.pool.device_pool()
        block = pool.malloc(size)
        if block is None:
            raise CupyOutOfMemoryError(
                f"Out of memory allocating {size:,} bytes (allocated so far: {pool.allocated:,} bytes).")
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return FakeTensor(block, dims, str(dtype), f"cuda:{self.current}")

    def device(self, index: int) -> _FakeCupyDevice:
        return _FakeCupyDevice(self, index)

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


_Device = TypeVar("_Device", bound="_FakeCupyDevice")


class _FakeCupyDevice:
    def __init__(self, owner: _FakeCupy, index: int) -> None:
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


# -- NVML (nvidia-ml-py's ``pynvml``) ------------------------------------------------------------------------------

class NVMLError(Exception):
    pass


class _FakeNvml:
    def __init__(self, machine: FakeGpuMachine) -> None:
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


# -- JAX -----------------------------------------------------------------------------------------------------------

class XlaRuntimeError(RuntimeError):
    """Shaped like ``jaxlib.xla_extension.XlaRuntimeError`` (``jax.errors.JaxRuntimeError``): a ``RuntimeError``
    whose message starts with the XLA status, ``RESOURCE_EXHAUSTED`` for out-of-memory."""


XlaRuntimeError.__module__ = "jaxlib.xla_extension"
