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

Modules, each importing only those before it: ``base`` (device, the machine's devices and what this process holds
on them — ``GpuDevices`` —, caching pool, tensor), one per framework over ``base``: ``fake_torch``, ``fake_cupy``,
``fake_nvml``; and on top ``machine`` (``FakeGpuMachine``, a ``GpuDevices`` that is made by ``of``, writes the
driver files and installs the fakes). Here too ``XlaRuntimeError``, the one piece of JAX the tests raise.
"""

from __future__ import annotations

from sim.gpu.base import Block, CachingPool, FakeGpu, FakeTensor, GiB, GpuDevices, MiB
from sim.gpu.fake_cupy import CupyOutOfMemoryError
from sim.gpu.fake_nvml import NVMLError
from sim.gpu.fake_torch import TorchOutOfMemoryError
from sim.gpu.machine import FakeGpuMachine

__all__ = ["Block", "CachingPool", "CupyOutOfMemoryError", "FakeGpu", "FakeGpuMachine", "FakeTensor", "GiB",
           "GpuDevices", "MiB", "NVMLError", "TorchOutOfMemoryError", "XlaRuntimeError"]


class XlaRuntimeError(RuntimeError):
    """Shaped like ``jaxlib.xla_extension.XlaRuntimeError`` (``jax.errors.JaxRuntimeError``): a ``RuntimeError``
    whose message starts with the XLA status, ``RESOURCE_EXHAUSTED`` for out-of-memory."""


XlaRuntimeError.__module__ = "jaxlib.xla_extension"
