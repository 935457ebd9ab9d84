"""fit_batch: halving on every kind of out-of-memory, and only on those; the batch sizes tried; the error below
min_batch; and (on fake GPUs) memory really given back before the retry."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.devices.batch import Oom, next_batch, oom_kind
from sim.gpu import (
    CupyOutOfMemoryError,
    FakeGpuMachine,
    MiB,
    TorchOutOfMemoryError,
    XlaRuntimeError,
)

Fakes = tuple[FakeGpuMachine, dict[str, Any]]  # a fake GPU machine and its installed modules, by name

# -- every kind of out-of-memory the issue names, each as its library raises it ------------------------------------


def _numpy_oom() -> BaseException:
    try:
        np.empty(1 << 62, dtype=np.uint8)  # refused before anything is touched
    except MemoryError as exc:
        return exc
    raise AssertionError("NumPy allocated 4 EiB")


OOM_KINDS: dict[str, tuple[Callable[[], BaseException], Oom]] = {
    "python MemoryError": (MemoryError, Oom.CPU),
    "numpy _ArrayMemoryError": (_numpy_oom, Oom.CPU),
    "torch.OutOfMemoryError (CUDA)": (lambda: TorchOutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB"), Oom.GPU),
    "older torch RuntimeError (CUDA)": (lambda: RuntimeError(
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity)"), Oom.GPU),
    "torch CUDA error: out of memory": (lambda: RuntimeError("CUDA error: out of memory"), Oom.GPU),
    "torch CPU allocator": (lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"), Oom.CPU),
    "cuBLAS workspace": (lambda: RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), Oom.GPU),
    "cupy OutOfMemoryError": (lambda: CupyOutOfMemoryError(
        "Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes)."), Oom.GPU),
    "jax/XLA RESOURCE_EXHAUSTED": (lambda: XlaRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes."), Oom.GPU),
}

NOT_OOM: dict[str, Callable[[], BaseException]] = {
    "RuntimeError about devices": lambda: RuntimeError("Expected all tensors to be on the same device"),
    "cuDNN not supported": lambda: RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."),
    "ValueError that mentions memory": lambda: ValueError("out of memory"),
    "KeyError": lambda: KeyError("batch"),
    "OSError ENOMEM-like": lambda: OSError(12, "Cannot allocate memory"),
}


@pytest.mark.parametrize("name", OOM_KINDS)
def test_each_out_of_memory_kind_is_recognised_on_its_side(name: str) -> None:
    make, side = OOM_KINDS[name]
    assert oom_kind(make()) is side


@pytest.mark.parametrize("name", NOT_OOM)
def test_other_errors_are_not_out_of_memory(name: str) -> None:
    assert oom_kind(NOT_OOM[name]()) is None


def _fails_above(limit: int, make: Callable[[], BaseException], calls: list[int]) -> Callable[[int], str]:
    def step(batch: int) -> str:
        calls.append(batch)
        if batch > limit:
            raise make()
        return f"trained on {batch}"
    return step


@pytest.mark.parametrize("name", OOM_KINDS)
def test_fit_batch_halves_on_each_out_of_memory_kind(name: str) -> None:
    calls: list[int] = []
    result, batch = memory.fit_batch(_fails_above(100, OOM_KINDS[name][0], calls), 512)
    assert (result, batch) == ("trained on 64", 64)
    assert calls == [512, 256, 128, 64]


@pytest.mark.parametrize("name", NOT_OOM)
def test_any_other_exception_passes_through_untouched(name: str) -> None:
    error = NOT_OOM[name]()
    calls: list[int] = []

    def step(batch: int) -> None:
        calls.append(batch)
        raise error

    with pytest.raises(type(error)) as raised:
        memory.fit_batch(step, 512)
    assert raised.value is error
    assert calls == [512]


def test_keyboard_interrupt_is_not_retried() -> None:
    calls: list[int] = []

    def step(batch: int) -> None:
        calls.append(batch)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        memory.fit_batch(step, 64)
    assert calls == [64]


def test_a_batch_that_fits_runs_once() -> None:
    calls: list[int] = []
    assert memory.fit_batch(_fails_above(1000, MemoryError, calls), 512) == ("trained on 512", 512)
    assert calls == [512]


@pytest.mark.parametrize("start, tried", [
    (511, [511, 255, 127, 63, 31]),
    (512, [512, 256, 128, 64, 32]),
    (100, [100, 50, 25]),
])
def test_odd_sizes_halve_downwards(start: int, tried: list[int]) -> None:
    calls: list[int] = []
    _, batch = memory.fit_batch(_fails_above(tried[-1], MemoryError, calls), start)
    assert calls == tried and batch == tried[-1]


def test_min_batch_is_tried_before_giving_up() -> None:
    assert [next_batch(b, 4) for b in (10, 5, 4)] == [5, 4, None]
    calls: list[int] = []
    last = MemoryError("still too big")

    def step(batch: int) -> None:
        calls.append(batch)
        raise last

    with pytest.raises(memory.BatchTooSmallError) as raised:
        memory.fit_batch(step, 10, min_batch=4)
    assert calls == [10, 5, 4]
    assert raised.value.__cause__ is last
    assert isinstance(raised.value, MemoryError)
    assert "batch 4 (min_batch=4)" in str(raised.value) and "10, 5, 4" in str(raised.value)
    assert "still too big" in str(raised.value)


def test_below_one_the_error_carries_the_gpu_error() -> None:
    oom = TorchOutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB.")

    def step(batch: int) -> None:
        raise oom

    with pytest.raises(memory.BatchTooSmallError, match="CUDA out of memory") as raised:
        memory.fit_batch(step, 3)
    assert raised.value.__cause__ is oom


@pytest.mark.parametrize("fn, batch, min_batch, error, words", [
    ("not callable", 8, 1, TypeError, "function"),
    (len, 0, 1, ValueError, "batch must be at least 1"),
    (len, 2.5, 1, TypeError, "batch must be an int"),
    (len, True, 1, TypeError, "batch must be an int"),
    (len, 8, 0, ValueError, "min_batch must be at least 1"),
    (len, 8, 16, ValueError, "min_batch (16) is larger than batch (8)"),
])
def test_bad_arguments_are_named(fn: object, batch: object, min_batch: object, error: type, words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        memory.fit_batch(fn, batch, min_batch)  # type: ignore[arg-type]


def test_each_retry_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="apsi_memory.batch"):
        memory.fit_batch(_fails_above(300, lambda: MemoryError("no room"), []), 512)
    assert "out of memory at batch 512 (MemoryError: no room); trying 256" in caplog.text


class _RamCache:
    """A registered component, as pools and stores are: counts how often it was asked to give RAM back."""

    def __init__(self) -> None:
        self.relieved = 0

    def on_level(self, level: memory.Level) -> None:
        pass

    def relieve(self) -> None:
        self.relieved += 1


@pytest.fixture
def ram_cache() -> Iterator[_RamCache]:
    cache = _RamCache()
    memory.machine().components.register(cache)
    yield cache
    memory.machine().components.unregister(cache)


def test_cpu_out_of_memory_asks_pools_and_stores_for_their_ram(ram_cache: _RamCache) -> None:
    memory.fit_batch(_fails_above(128, MemoryError, []), 512)
    assert ram_cache.relieved == 2  # after 512 and after 256


def test_gpu_out_of_memory_leaves_ram_caches_alone(ram_cache: _RamCache) -> None:
    memory.fit_batch(_fails_above(128, lambda: RuntimeError("CUDA error: out of memory"), []), 512)
    assert ram_cache.relieved == 0


# -- on fake GPUs: memory is really given back before the next try -------------------------------------------------

@pytest.fixture
def gpu() -> Iterator[Fakes]:
    """One 1000 MiB device with fake torch and cupy installed."""
    machine = FakeGpuMachine.of(1000 * MiB / (1 << 30))
    with machine.installed("torch", "cupy") as modules:
        yield machine, modules


def _two_activations(torch: object) -> Callable[[int], int]:
    """A step that holds one activation while it allocates a second of the same size: needs 2 * batch MiB."""
    def step(batch: int) -> int:
        first = torch.empty(batch * MiB, dtype="uint8", device="cuda:0")  # type: ignore[attr-defined]
        second = torch.empty(batch * MiB, dtype="uint8", device="cuda:0")  # type: ignore[attr-defined]
        return int(first.nbytes + second.nbytes)
    return step


def _naive_fit(step: Callable[[int], int], batch: int) -> tuple[int, int]:
    """The retry-inside-except shape the issue warns about (what peers write)."""
    try:
        return step(batch), batch
    except RuntimeError:
        return _naive_fit(step, batch // 2)


def test_the_fake_reproduces_the_traceback_pitfall(gpu: Fakes) -> None:
    _, modules = gpu
    # 512 + 512 > 1000. Retried inside except, every failed try's first activation is still referenced by its
    # traceback (512, then 256, 128, ...), so every smaller try fails too, down to an empty batch.
    assert _naive_fit(_two_activations(modules["torch"]), 512)[1] == 0


def test_fit_batch_retries_after_the_failed_try_is_freed(gpu: Fakes) -> None:
    _, modules = gpu
    torch = modules["torch"]
    used, batch = memory.fit_batch(_two_activations(torch), 512)
    assert batch == 256 and used == 512 * MiB
    assert torch.cuda.memory_allocated(0) == 0  # nothing of the failed tries is left


def test_memory_is_freed_even_when_something_keeps_the_exception(gpu: Fakes) -> None:
    _, modules = gpu
    kept: list[BaseException] = []  # a logging handler or debugger holding on to the error
    two = _two_activations(modules["torch"])

    def logged_step(batch: int) -> int:
        try:
            return two(batch)
        except RuntimeError as exc:
            kept.append(exc)
            raise

    assert memory.fit_batch(logged_step, 512)[1] == 256
    assert len(kept) == 1 and "CUDA out of memory" in str(kept[0])


def test_tensors_in_reference_cycles_are_collected_before_the_retry(gpu: Fakes) -> None:
    _, modules = gpu
    torch = modules["torch"]

    def step(batch: int) -> int:
        layer: dict[str, object] = {"weights": torch.empty(batch * MiB, dtype="uint8", device="cuda:0")}
        layer["self"] = layer  # a cycle, as modules with hooks back to themselves make: only gc frees it
        return int(torch.empty(batch * MiB, dtype="uint8", device="cuda:0").nbytes)

    assert memory.fit_batch(step, 512)[1] == 256


def test_gpu_caches_of_other_frameworks_are_emptied(gpu: Fakes) -> None:
    _, modules = gpu
    torch, cupy = modules["torch"], modules["cupy"]
    leftover = torch.empty(900 * MiB, dtype="uint8", device="cuda:0")
    del leftover  # freed, but torch's pool keeps the 900 MiB reserved; CuPy cannot reach them

    def cupy_step(batch: int) -> int:
        return int(cupy.empty(batch * MiB, dtype="uint8").nbytes)

    assert memory.fit_batch(cupy_step, 512) == (256 * MiB, 256)
    assert torch.cuda.memory_reserved(0) == 0


def test_cupy_out_of_memory_halves_and_frees_its_pools(gpu: Fakes) -> None:
    _, modules = gpu
    cupy = modules["cupy"]

    def step(batch: int) -> int:
        held = cupy.empty(batch * MiB, dtype="uint8")
        more = cupy.empty(batch * MiB, dtype="uint8")
        return int(held.nbytes + more.nbytes)

    assert memory.fit_batch(step, 1024) == (512 * MiB, 256)
    assert cupy.get_default_pinned_memory_pool().emptied == 2  # once after each failed try


def test_fit_batch_never_imports_a_gpu_framework() -> None:
    with FakeGpuMachine.of(1).installed():  # torch and cupy blocked: an import would raise
        assert memory.fit_batch(_fails_above(8, MemoryError, []), 64) == ("trained on 8", 8)
        assert sys.modules["torch"] is None and sys.modules["cupy"] is None


@pytest.mark.torch
def test_real_torch_cpu_allocator_failure_is_recovered() -> None:
    torch = pytest.importorskip("torch")

    def step(batch: int) -> int:
        # far more than any machine: the real CPU allocator refuses it at once, without touching memory
        size = (1 << 60) if batch > 4 else batch
        return int(torch.empty(size, dtype=torch.uint8).numel())

    assert memory.fit_batch(step, 64) == (4, 4)


def test_an_out_of_memory_inside_memory_map_is_halved_too() -> None:
    # memory.map raises fn's errors as BlockError (naming the rows) chained to the original MemoryError.
    x = np.arange(1024, dtype=np.float64).reshape(256, 4)

    def double_small_blocks(block: np.ndarray) -> np.ndarray:
        if len(block) > 64:
            raise MemoryError("block too big for this worker")
        return block * 2

    result, rows = memory.fit_batch(lambda rows: memory.map(double_small_blocks, x, rows=rows), 256)
    assert rows == 64 and np.array_equal(result, x * 2)


def test_a_non_memory_error_inside_memory_map_passes_through() -> None:
    x = np.zeros((8, 2))

    def broken(block: np.ndarray) -> np.ndarray:
        raise KeyError("not memory")

    with pytest.raises(memory.BlockError) as caught:
        memory.fit_batch(lambda rows: memory.map(broken, x, rows=rows), 8)
    assert isinstance(caught.value.__cause__, KeyError)
