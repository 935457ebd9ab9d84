"""devices(), gpus(), best_device(): what each library reports, the framework's numbering under
CUDA_VISIBLE_DEVICES, free memory counting our own caching pools, and no CUDA context where NVML can answer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import apsi_memory as memory
import sim.tree
from apsi_memory import machinery as api
from apsi_memory.devices.hardware import (
    Gpu,
    NvmlGpu,
    canonical_uuid,
    choose_device,
    cuda_visible,
    gpu_driver_present,
    gpus,
    gpus_from_nvml,
    usable_free,
)
from sim.gpu import FakeGpu, FakeGpuMachine, GiB
from sim.tree import SimTree


@pytest.fixture(autouse=True)
def _no_visible_devices_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def three() -> FakeGpuMachine:
    """Three 16 GB devices; the others' processes use 4 GB of the first and 1 GB of the third."""
    gpus = FakeGpuMachine.of(16, 16, 16, context_bytes=300 << 20)
    gpus.gpus[0].used_by_others = 4 * GiB
    gpus.gpus[2].used_by_others = 1 * GiB
    return gpus


def uuids(found: list[Gpu]) -> list[str | None]:
    return [gpu.uuid for gpu in found]


# -- no GPU library ------------------------------------------------------------------------------------------------

def test_without_gpu_libraries_there_is_no_gpu_and_nothing_fails() -> None:
    with FakeGpuMachine.of(16).installed():  # torch, cupy and pynvml all fail to import
        assert gpus() == []
        assert memory.best_device(0) == "cpu"
        found = memory.devices()
        assert len(found) == 1 and found.cpu.device == "cpu" and found.gpus == []
        assert "no GPU" in str(memory.status())


def test_the_cpu_entry_sees_the_container_not_the_host(sim_machine: Callable[..., SimTree]) -> None:
    sim_machine(sim.tree.docker_v1, limit=4 * GiB, usage=1 * GiB)
    with FakeGpuMachine.of(16).installed():
        cpu = memory.devices().cpu
    limits = api.limits()
    assert cpu.usable_bytes == limits.usable_bytes <= 4 * GiB
    assert cpu.free_bytes == limits.free_bytes and cpu.source == "container (cgroup v1)"
    assert cpu.cores == api.cores()
    assert str(cpu).startswith(f"cpu {cpu.cores} cores, ") and "(container (cgroup v1))" in str(cpu)


def test_a_machine_without_a_driver_has_no_gpu(three: FakeGpuMachine) -> None:
    three.driver_loaded = False
    with three.installed("torch", "cupy", "pynvml"):
        assert gpus() == []


def test_a_broken_library_reads_as_no_gpu_and_is_logged(three: FakeGpuMachine,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with three.installed("torch") as fake:
        def broken(index: int) -> None:
            raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")
        fake["torch"].cuda.get_device_properties = broken
        with caplog.at_level(logging.DEBUG, logger="apsi_memory.devices"):
            assert gpus() == []
    assert "driver version is insufficient" in caplog.text


# -- which library answers -----------------------------------------------------------------------------------------

def test_torch_lists_every_gpu_with_name_memory_and_uuid(three: FakeGpuMachine) -> None:
    with three.installed("torch"):
        found = gpus()
    assert [g.device for g in found] == ["cuda:0", "cuda:1", "cuda:2"] and [g.index for g in found] == [0, 1, 2]
    assert {g.backend for g in found} == {"torch"} and {g.name for g in found} == {"NVIDIA Fake A100"}
    assert uuids(found) == [gpu.uuid for gpu in three.gpus]
    assert [g.total_bytes for g in found] == [16 * GiB] * 3
    # asking torch for free memory made a context (300 MB) on each device: that is why NVML is preferred
    assert [g.free_bytes for g in found] == [16 * GiB - 4 * GiB - (300 << 20), 16 * GiB - (300 << 20),
                                             16 * GiB - 1 * GiB - (300 << 20)]


def test_nvml_is_asked_before_a_torch_that_does_not_use_cuda_yet(three: FakeGpuMachine) -> None:
    with three.installed("torch", "pynvml") as fake:
        found = gpus()
        assert not fake["torch"].cuda.is_initialized()  # a fork after status() can still use CUDA
    assert three.contexts() == 0
    assert {g.backend for g in found} == {"nvml"}
    assert [g.free_bytes for g in found] == [12 * GiB, 16 * GiB, 15 * GiB]
    assert uuids(found) == [gpu.uuid for gpu in three.gpus]


def test_nvml_is_asked_before_importing_a_framework(three: FakeGpuMachine) -> None:
    import sys

    with three.installed("torch", "cupy", "pynvml", imported=False):
        found = gpus()
        assert "torch" not in sys.modules and "cupy" not in sys.modules
    assert {g.backend for g in found} == {"nvml"} and three.contexts() == 0


def test_an_installed_framework_is_imported_when_nothing_else_answers(three: FakeGpuMachine,
                                                                      sim_machine: Callable[..., SimTree]) -> None:
    import sys

    three.write_driver_files(sim_machine(sim.tree.host).root)
    with three.installed("torch", imported=False):
        assert gpus(import_frameworks=False) == [] and "torch" not in sys.modules
        found = gpus()
        assert "torch" in sys.modules
    assert len(found) == 3 and {g.backend for g in found} == {"torch"}


def test_no_framework_is_imported_where_the_kernel_shows_no_gpu_driver(three: FakeGpuMachine,
                                                                        sim_machine: Callable[..., SimTree]) -> None:
    import sys

    sim_machine(sim.tree.host)  # a machine without /dev/nvidiactl: importing torch could only find the CPU
    with three.installed("torch", "cupy", imported=False):
        assert gpus() == [] and memory.best_device(0) == "cpu"
        assert "torch" not in sys.modules and "cupy" not in sys.modules


@pytest.mark.parametrize("platform, files, present", [
    ("linux", [], False),
    ("linux", ["dev/nvidiactl"], True),
    ("linux", ["proc/driver/nvidia/gpus/0000:01:00.0/information"], True),
    ("linux", ["dev/kfd"], True),
    ("linux", ["dev/dxg"], True),
    ("linux", ["dev/null", "proc/driver/other"], False),
    ("darwin", ["dev/nvidiactl"], False),
    ("win32", [], True),
])
def test_gpu_driver_files(tmp_path: Path, platform: str, files: list[str], present: bool) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    assert gpu_driver_present(platform, str(tmp_path)) is present


def test_torch_in_use_counts_its_cached_memory_as_free(three: FakeGpuMachine) -> None:
    with three.installed("torch", "pynvml") as fake:
        torch = fake["torch"]
        kept = torch.empty(2 * GiB, dtype="uint8", device="cuda:1")
        dropped = torch.empty(3 * GiB, dtype="uint8", device="cuda:1")
        del dropped  # torch keeps its 3 GB reserved, so the driver (and nvidia-smi) still count it used
        found = gpus()
    assert {g.backend for g in found} == {"torch"}
    assert found[1].free_bytes == 16 * GiB - (300 << 20) - kept.nbytes
    # the driver's view is taken from NVML (matched by UUID): no context was made on devices torch never used
    assert [gpu.contexts for gpu in three.gpus] == [0, 1, 0]


def test_without_nvml_torch_in_use_asks_the_driver_and_still_counts_its_cache(three: FakeGpuMachine) -> None:
    with three.installed("torch") as fake:
        torch = fake["torch"]
        dropped = torch.empty(3 * GiB, dtype="uint8", device="cuda:0")
        del dropped
        assert torch.cuda.memory_reserved(0) == 3 * GiB
        found = gpus()
    assert found[0].free_bytes == 16 * GiB - 4 * GiB - (300 << 20)


def test_cupy_lists_the_gpus_and_counts_its_pool_on_the_current_device(three: FakeGpuMachine) -> None:
    with three.installed("cupy") as fake:
        cupy = fake["cupy"]
        with cupy.cuda.Device(2):
            dropped = cupy.empty(2 * GiB, dtype="uint8")
            del dropped  # back in CuPy's pool, unused
            found = gpus()
    assert {g.backend for g in found} == {"cupy"} and {g.name for g in found} == {"NVIDIA Fake A100"}
    assert uuids(found) == [gpu.uuid for gpu in three.gpus]  # from CuPy's 16 raw bytes
    assert found[2].free_bytes == 16 * GiB - 1 * GiB - (300 << 20)


# -- CUDA_VISIBLE_DEVICES: NVML's list renumbered exactly as the framework numbers it ------------------------------

VISIBLE_SPECS = [None, "", "1", "2,0", " 2 , 1 ", "GPU-00000002", "GPU-00000001-0000,0", "0,0,1", "1,7,0", "-1",
                 "MIG-4b8a2c1e-1234", "GPU-0000000", "none"]


@pytest.mark.parametrize("spec", VISIBLE_SPECS)
def test_nvml_numbering_matches_the_framework(three: FakeGpuMachine, monkeypatch: pytest.MonkeyPatch,
                                              spec: str | None) -> None:
    if spec is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    with three.installed("pynvml"):
        from_nvml = gpus()
    with three.installed("torch"):
        from_torch = gpus()
    assert [(g.device, g.uuid) for g in from_nvml] == [(g.device, g.uuid) for g in from_torch]


def test_a_hidden_device_is_left_out_and_the_rest_renumbered(three: FakeGpuMachine,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    with three.installed("pynvml"):
        found = gpus()
    assert [(g.device, g.index, g.uuid) for g in found] == [("cuda:0", 0, three.gpus[2].uuid),
                                                            ("cuda:1", 1, three.gpus[1].uuid)]


def test_cuda_visible_rules() -> None:
    ids = ["GPU-aa11", "GPU-aa22", "GPU-bb33"]
    assert cuda_visible(None, ids) == [0, 1, 2]
    assert cuda_visible("2,0", ids) == [2, 0]
    assert cuda_visible("GPU-bb", ids) == [2]
    assert cuda_visible("GPU-aa", ids) == []  # ambiguous prefix: invalid, and nothing after it counts
    assert cuda_visible("1,5,0", ids) == [1]
    assert cuda_visible("1,1", ids) == [1]
    assert cuda_visible("", ids) == [] and cuda_visible("-1", ids) == []


def test_uuids_read_the_same_from_every_library() -> None:
    nvml = "GPU-5d3e5a1c-2f4b-4c3d-9e8f-0a1b2c3d4e5f"
    assert canonical_uuid(nvml) == nvml
    assert canonical_uuid(b"GPU-5d3e5a1c-2f4b-4c3d-9e8f-0a1b2c3d4e5f") == nvml  # old pynvml: bytes
    assert canonical_uuid("5D3E5A1C-2F4B-4C3D-9E8F-0A1B2C3D4E5F") == nvml  # torch: no prefix
    assert canonical_uuid(bytes.fromhex("5d3e5a1c2f4b4c3d9e8f0a1b2c3d4e5f")) == nvml  # CuPy: 16 raw bytes
    assert canonical_uuid("") is None and canonical_uuid(None) is None


# -- best_device ---------------------------------------------------------------------------------------------------

def test_best_device_is_the_gpu_with_most_free_memory(three: FakeGpuMachine) -> None:
    with three.installed("pynvml"):
        assert memory.best_device(8) == "cuda:1"  # 16 GB free, against 12 and 15
        assert memory.best_device("15.5GB") == "cuda:1"
        assert memory.best_device(17) == "cpu"


def test_best_device_uses_the_frameworks_index(three: FakeGpuMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # physical 1, the emptiest, is hidden
    with three.installed("pynvml"):
        assert memory.best_device(8) == "cuda:0"  # physical 2, 15 GB free


def test_best_device_rejects_a_size_it_cannot_read() -> None:
    with pytest.raises(memory.SizeError, match="'eight'"):
        memory.best_device("eight")


def test_choose_device_prefers_the_lowest_index_on_a_tie() -> None:
    same = [Gpu(f"cuda:{i}", i, "X", 8 * GiB, 8 * GiB, None, "nvml") for i in range(3)]
    assert choose_device(same, 8 * GiB) == "cuda:0"
    assert choose_device(same, 8 * GiB + 1) == "cpu"
    assert choose_device([], 0) == "cpu"


def test_usable_free_never_exceeds_the_device() -> None:
    assert usable_free(10, 5, 100) == 15
    assert usable_free(90, 50, 100) == 100
    assert usable_free(10, -3, 100) == 10  # a pool reporting less reserved than allocated adds nothing


# -- what the user reads -------------------------------------------------------------------------------------------

def test_devices_print_and_serialise(three: FakeGpuMachine) -> None:
    with three.installed("pynvml"):
        found = memory.devices()
    text = str(found)
    assert text.startswith("cpu ") and " | cuda:0 NVIDIA Fake A100 12.0/16.0 GB free | cuda:1 " in text
    as_dicts = found.to_dict()
    assert [d["device"] for d in as_dicts] == ["cpu", "cuda:0", "cuda:1", "cuda:2"]
    assert as_dicts[1] == {"device": "cuda:0", "index": 0, "name": "NVIDIA Fake A100", "total_bytes": 16 * GiB,
                           "free_bytes": 12 * GiB, "uuid": three.gpus[0].uuid, "backend": "nvml"}


def test_status_names_the_gpus(three: FakeGpuMachine) -> None:
    with three.installed("pynvml"):
        text = str(memory.status())
    assert "cuda:0 NVIDIA Fake A100 12.0/16.0 GB free" in text and "cuda:2 NVIDIA Fake A100" in text


def test_gpus_from_nvml_keeps_what_nvml_read() -> None:
    physical = [NvmlGpu("A", "GPU-1", 8 * GiB, 7 * GiB), NvmlGpu("B", "GPU-2", 24 * GiB, 20 * GiB)]
    assert gpus_from_nvml(physical, "1") == [Gpu("cuda:0", 0, "B", 24 * GiB, 20 * GiB, "GPU-2", "nvml")]


@pytest.fixture
def mixed() -> Iterator[FakeGpuMachine]:
    yield FakeGpuMachine([FakeGpu("NVIDIA T4", 15 * GiB, "GPU-aaaaaaaa-0000-4000-8000-000000000001"),
                          FakeGpu("NVIDIA L4", 22 * GiB, "GPU-bbbbbbbb-0000-4000-8000-000000000002")])


def test_different_models_keep_their_names(mixed: FakeGpuMachine) -> None:
    with mixed.installed("pynvml"):
        assert [(g.device, g.name) for g in gpus()] == [("cuda:0", "NVIDIA T4"), ("cuda:1", "NVIDIA L4")]
        assert memory.best_device(16) == "cuda:1"
