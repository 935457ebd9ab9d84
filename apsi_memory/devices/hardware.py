"""The devices a program can compute on: the CPU (cores, free RAM as ``limits()`` sees it) and every visible GPU.

    memory.devices()        # cpu 2 cores, 5.8/7.8 GB free (container (cgroup v1)) | cuda:0 NVIDIA H200 131.2/139.8 GB free
    memory.best_device(8)   # "cuda:0" if a GPU has 8 GB free, otherwise "cpu"

Theory of operation
-------------------
GPU indices are the ones the program's framework uses: ``cuda:0`` is the first device left by
``CUDA_VISIBLE_DEVICES``. Free memory is what the driver reports as free plus what the program's own caching
pools hold but do not use (``torch.cuda.memory_reserved - memory_allocated``; CuPy's pool ``free_bytes`` on its
current device): a tensor allocated there reuses that first.

Which library is asked, the first that applies:

1. PyTorch, when the program imported it *and already uses CUDA* (``torch.cuda.is_initialized()``), or CuPy when
   the program imported it (it is only ever imported for the GPU). Their device numbering is by definition the
   program's, and their pools are the ones to count.
2. NVML (``pynvml`` from nvidia-ml-py): it creates no CUDA context. A context costs a few hundred MB on each
   device it is made on, and initialising CUDA inside PyTorch would make a later ``fork`` unable to use CUDA, so
   ``status()`` must not do either. NVML numbers devices in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``;
   ``cuda_visible`` maps its list the way CUDA does. That matches the framework's numbering when
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when the GPUs are all the same model (CUDA's default "fastest first"
   order cannot be known without CUDA); ``Gpu.uuid`` names the device exactly either way.
3. PyTorch then CuPy, imported if need be (``import_frameworks=False`` skips this). Last, because importing
   PyTorch costs seconds (1.8-2.9 s and 180 MB of RSS for the CPU build on a 2-core VM) and asking it for free
   memory makes a context on every device. Skipped, too, where the kernel shows no GPU driver (``/dev/nvidiactl``,
   ``/proc/driver/nvidia/gpus``, ROCm's ``/dev/kfd``, WSL's ``/dev/dxg``; read under the machine's root): there
   PyTorch could not find a GPU anyway, so ``status()`` on a CPU machine stays fast.

When a framework lists the devices and NVML is installed, free memory still comes from NVML (matched by UUID),
so only devices the program already uses get a context. Without any of these libraries there is no GPU, and
nothing fails: ``gpus()`` never raises (a broken driver is logged at debug level and reads as no GPU).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..adapters.root import resolve, under
from ..logs import logger
from ..machinery.machines import machine
from ..units import in_one_unit, parse_size

log = logger("apsi_memory.devices")  # the documented logger name (docs: "What it logs")


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``devices()`` lists it: ``device`` ("cuda:0"), ``index`` (after ``CUDA_VISIBLE_DEVICES``),
    ``name``, ``total_bytes``, ``free_bytes`` (the driver's free plus what this program's caching pools hold
    unused), ``uuid`` (as nvidia-smi prints it) and ``backend`` ("torch", "cupy" or "nvml": who was asked)."""

    device: str  # "cuda:0", the string frameworks take
    index: int  # the framework's index, after CUDA_VISIBLE_DEVICES
    name: str
    total_bytes: int
    free_bytes: int  # driver free + what this program's caching pools hold unused
    uuid: str | None  # "GPU-…", as nvidia-smi prints it
    backend: str  # who was asked: "torch", "cupy" or "nvml"

    def __str__(self) -> str:
        free, total, unit = in_one_unit(self.free_bytes, self.total_bytes)
        return f"{self.device} {self.name} {free}/{total} {unit} free"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Cpu:
    """The CPU side as ``devices()`` lists it: ``cores`` this process may use, and ``free_bytes``,
    ``usable_bytes`` and ``source`` as ``limits()`` reads them (the container's when it is smaller)."""

    cores: int
    free_bytes: int  # as limits() sees it: the container's limit when that is smaller than the host
    usable_bytes: int
    source: str  # "host", "container (cgroup v1)", ...
    device: str = "cpu"

    def __str__(self) -> str:
        free, usable, unit = in_one_unit(self.free_bytes, self.usable_bytes)
        return (f"{self.device} {self.cores} cores, {free}/{usable} {unit} free "
                f"({self.source})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Device = Cpu | Gpu


class Devices(tuple):  # type: ignore[type-arg]
    """The CPU first, then the GPUs by index. A tuple, so it can be indexed and iterated as is."""

    @property
    def cpu(self) -> Cpu:
        return self[0]  # type: ignore[no-any-return]

    @property
    def gpus(self) -> list[Gpu]:
        return list(self[1:])

    def __str__(self) -> str:
        return " | ".join(str(device) for device in self)

    def to_dict(self) -> list[dict[str, Any]]:
        return [device.to_dict() for device in self]


def devices() -> Devices:
    """The CPU (cores, free RAM as ``limits()`` sees it, cgroup-aware) and every visible GPU."""
    m = machine()
    limits = m.limits()
    cpu = Cpu(m.cores(), limits.free_bytes, limits.usable_bytes, limits.source)
    return Devices([cpu, *gpus()])


def best_device(gb: float | str) -> str:
    """``"cuda:N"`` for the GPU with the most free memory if it has at least ``gb`` GB free (a number of GB or
    a size string such as ``"512MB"``), otherwise ``"cpu"``."""
    return choose_device(gpus(), parse_size(gb))


def choose_device(candidates: Sequence[Gpu], need_bytes: int) -> str:
    """Pure: the device string of the GPU with the most free memory (the lowest index on a tie) when it has
    ``need_bytes`` free, else ``"cpu"``."""
    best = max(candidates, key=lambda gpu: gpu.free_bytes, default=None)
    return best.device if best is not None and best.free_bytes >= need_bytes else "cpu"


def gpus(*, import_frameworks: bool = True) -> list[Gpu]:
    """Every GPU the program can use, by framework index; ``[]`` without GPU libraries. Never raises."""
    try:
        return _read_gpus(import_frameworks)
    except Exception:  # a broken driver or library must read as "no GPU", never break status()
        log.debug("could not read the GPUs", exc_info=True)
        return []


def _read_gpus(import_frameworks: bool) -> list[Gpu]:
    imported = [framework for framework in _frameworks(sys.modules.get) if framework.available()]
    in_use = next((framework for framework in imported if framework.in_use()), None)
    nvml = read_nvml()
    if in_use is None and nvml is not None:
        return gpus_from_nvml(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    framework = in_use or next(iter(imported), None)
    if framework is None and import_frameworks and gpu_driver_present():
        framework = next((f for f in _frameworks(_import) if f.available()), None)
    if framework is None:
        return []
    return _gpus_from_framework(framework, nvml or [], imported)


# Kernel files that exist only where a GPU driver is loaded (NVIDIA, also inside containers given a GPU; AMD ROCm;
# WSL's GPU paravirtualisation).
DRIVER_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia/gpus", "/dev/kfd", "/dev/dxg")


def gpu_driver_present(platform: str = sys.platform, root: str | None = None) -> bool:
    """Whether importing a GPU framework could find a device. Unknown (True) where the files cannot tell."""
    if platform == "darwin":
        return False  # no CUDA on macOS
    if not platform.startswith("linux"):
        return True
    base = machine().root if root is None else resolve(root)
    return any(os.path.exists(under(base, path)) for path in DRIVER_FILES)


# -- NVML ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NvmlGpu:
    """One physical device as NVML lists it (PCI bus order, all devices)."""

    name: str
    uuid: str
    total_bytes: int
    free_bytes: int


def read_nvml() -> list[NvmlGpu] | None:
    """Every physical GPU through NVML, or None without nvidia-ml-py or a driver. Creates no CUDA context."""
    nvml = _import("pynvml")
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.debug("NVML not available: %s", exc)
        return None
    try:
        return [_nvml_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


def _nvml_gpu(nvml: ModuleType, handle: object) -> NvmlGpu:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return NvmlGpu(_text(nvml.nvmlDeviceGetName(handle)), canonical_uuid(nvml.nvmlDeviceGetUUID(handle)) or "",
                   int(memory.total), int(memory.free))


def gpus_from_nvml(physical: Sequence[NvmlGpu], visible_spec: str | None) -> list[Gpu]:
    """Pure: NVML's devices renumbered as CUDA numbers them under ``CUDA_VISIBLE_DEVICES=visible_spec``."""
    order = cuda_visible(visible_spec, [gpu.uuid for gpu in physical])
    return [Gpu(f"cuda:{index}", index, gpu.name, gpu.total_bytes, gpu.free_bytes, gpu.uuid, "nvml")
            for index, gpu in enumerate(physical[p] for p in order)]


def cuda_visible(spec: str | None, uuids: Sequence[str]) -> list[int]:
    """Pure: the physical indices CUDA makes visible, in its order, for ``CUDA_VISIBLE_DEVICES=spec``.

    Unset means all. Entries are indices or ``GPU-`` UUIDs (a unique prefix is enough). As in CUDA, the list
    ends at the first entry that is invalid or repeated, so ``""``, ``"-1"`` or ``"none"`` hide every device.
    MIG instances (``MIG-…``) are not listed by NVML's device list and also end it.
    """
    if spec is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in (part.strip() for part in spec.split(",")):
        physical = _physical_index(entry, uuids)
        if physical is None or physical in chosen:
            break
        chosen.append(physical)
    return chosen


def _physical_index(entry: str, uuids: Sequence[str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry[:4].upper() == "GPU-" and len(entry) > 4:
        matches = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(entry.lower())]
        return matches[0] if len(matches) == 1 else None
    return None


def canonical_uuid(raw: str | bytes | None) -> str | None:
    """``GPU-xxxxxxxx-xxxx-…`` from NVML's string, PyTorch's (no prefix) or CuPy's 16 raw bytes."""
    if raw is None:
        return None
    if isinstance(raw, bytes) and len(raw) == 16:
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    text = _text(raw).strip().lower()
    if not text:
        return None
    return text.upper()[:4] + text[4:] if text[:4] in ("gpu-", "mig-") else f"GPU-{text}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # old pynvml returns bytes


# -- frameworks ----------------------------------------------------------------------------------------------------

class _Torch:
    name = "torch"

    def __init__(self, torch: ModuleType) -> None:
        self.cuda = torch.cuda

    def available(self) -> bool:
        return bool(self.cuda.is_available())

    def in_use(self) -> bool:
        return bool(self.cuda.is_initialized())

    def count(self) -> int:
        return int(self.cuda.device_count())

    def describe(self, index: int) -> tuple[str, int, str | None]:
        props = self.cuda.get_device_properties(index)
        return str(props.name), int(props.total_memory), canonical_uuid(str(getattr(props, "uuid", "")))

    def driver_free(self, index: int) -> int:
        return int(self.cuda.mem_get_info(index)[0])

    def pool_slack(self, index: int) -> int:
        return int(self.cuda.memory_reserved(index)) - int(self.cuda.memory_allocated(index))


class _Cupy:
    name = "cupy"

    def __init__(self, cupy: ModuleType) -> None:
        self.cupy = cupy
        self.runtime = cupy.cuda.runtime

    def available(self) -> bool:
        try:
            return int(self.runtime.getDeviceCount()) > 0
        except Exception:  # noqa: BLE001 - CuPy raises CUDARuntimeError when there is no driver or device
            return False

    def in_use(self) -> bool:
        return True  # CuPy is only imported to use the GPU

    def count(self) -> int:
        return int(self.runtime.getDeviceCount())

    def describe(self, index: int) -> tuple[str, int, str | None]:
        props = self.runtime.getDeviceProperties(index)
        return _text(props["name"]), int(props["totalGlobalMem"]), canonical_uuid(props.get("uuid"))

    def driver_free(self, index: int) -> int:
        with self.cupy.cuda.Device(index):
            return int(self.runtime.memGetInfo()[0])

    def pool_slack(self, index: int) -> int:
        # CuPy's pool methods count its current device; switching devices to ask would create a context there
        if int(self.runtime.getDevice()) != index:
            return 0
        return int(self.cupy.get_default_memory_pool().free_bytes())


Framework = _Torch | _Cupy
_FRAMEWORKS: tuple[tuple[str, Callable[[ModuleType], Framework]], ...] = (("torch", _Torch), ("cupy", _Cupy))


def _frameworks(find: Callable[[str], ModuleType | None]) -> list[Framework]:
    """The frameworks ``find`` returns a module for (``sys.modules.get``: imported ones; ``_import``: installed)."""
    found = []
    for module_name, adapter in _FRAMEWORKS:
        module = find(module_name)
        if module is not None:
            found.append(adapter(module))
    return found


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as exc:  # OSError: installed, but its CUDA libraries do not load
        log.debug("cannot import %s: %s", name, exc)
        return None


def _gpus_from_framework(framework: Framework, nvml: Sequence[NvmlGpu], pools: Iterable[Framework]) -> list[Gpu]:
    free_by_uuid = {gpu.uuid: gpu.free_bytes for gpu in nvml}
    pools = list(pools)
    found = []
    for index in range(framework.count()):
        name, total, uuid = framework.describe(index)
        driver_free = free_by_uuid[uuid] if uuid in free_by_uuid else framework.driver_free(index)
        slack = sum(pool.pool_slack(index) for pool in pools)
        found.append(Gpu(f"cuda:{index}", index, name, total, usable_free(driver_free, slack, total), uuid,
                         framework.name))
    return found


def usable_free(driver_free: int, pool_slack: int, total: int) -> int:
    """Pure: free memory as a new allocation in this program sees it — the driver's free memory plus what our own
    caching pools hold unused (they hand that out first), never more than the device has."""
    return max(0, min(total, driver_free + max(0, pool_slack)))
