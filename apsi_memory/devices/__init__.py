"""The devices a job can compute on: the CPU and each GPU with its free memory, asked of NVML, PyTorch or CuPy,
whichever is installed (``hardware``: ``devices()``, ``best_device()``); and ``fit_batch``, which halves a batch
until a step fits (``batch``), capping the address space while the step runs so that in a memory cgroup a batch too
big fails instead of being OOM-killed (``addresscap``).

``apsi_memory.devices`` is callable as ``devices()``.

May import: decide, adapters, machinery.
"""

from .batch import fit_batch
from .hardware import Cpu, Devices, Gpu, best_device, devices

__all__ = ["Cpu", "Devices", "Gpu", "best_device", "devices", "fit_batch"]
