"""Check devices, best_device and fit_batch on a real CUDA GPU (needs PyTorch with CUDA; nvidia-ml-py optional).

    python benchmarks/gpu_check.py

Prints what it found and PASS/FAIL per check; exits 1 when a check failed, 2 when there is no CUDA GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import apsi_memory as memory
from apsi_memory.devices.hardware import canonical_uuid, gpus

MiB = 1 << 20
failed: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")
    if not ok:
        failed.append(name)


def in_child(code: str, **env: str) -> object:
    """Run ``code`` in a fresh interpreter (no torch imported, its own CUDA_VISIBLE_DEVICES); it prints JSON."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **env})
    if done.returncode != 0:
        return f"child failed: {done.stderr[-500:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


LIST_GPUS = ("import json, sys, time; from apsi_memory.devices.hardware import gpus; t = time.perf_counter(); "
             "found = gpus(import_frameworks={}); took = time.perf_counter() - t; "
             "print(json.dumps({{'gpus': [g.to_dict() for g in found], 'seconds': took, "
             "'torch_imported': 'torch' in sys.modules}}))")


def main() -> int:
    fresh = in_child(LIST_GPUS.format(False))
    print("before torch is imported:", fresh)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible to PyTorch: nothing to check")
        return 2
    count = torch.cuda.device_count()
    print(memory.devices())
    if isinstance(fresh, dict) and fresh["gpus"]:  # nvidia-ml-py is installed: the no-context path answered
        check("NVML lists the GPUs without importing torch", not fresh["torch_imported"]
              and len(fresh["gpus"]) == count, f"{len(fresh['gpus'])} GPUs in {fresh['seconds'] * 1000:.1f} ms")

    torch.empty(1, device="cuda:0")  # torch now uses CUDA: it is asked first
    for index in range(count):
        torch.cuda.mem_get_info(index)  # a context on every device first, so the readings below compare alike
    found = gpus()
    check("gpus() lists every device torch sees", len(found) == count and found[0].backend == "torch")
    for index, gpu in enumerate(found):
        props = torch.cuda.get_device_properties(index)
        driver_free, total = torch.cuda.mem_get_info(index)
        check(f"cuda:{index} name, total and uuid", gpu.name == props.name and gpu.total_bytes == total
              and gpu.uuid == canonical_uuid(str(props.uuid)), str(gpu))
        check(f"cuda:{index} free memory close to the driver's", abs(gpu.free_bytes - driver_free) < 256 * MiB,
              f"{gpu.free_bytes / MiB:.0f} MB vs {driver_free / MiB:.0f} MB")
        if isinstance(fresh, dict) and fresh["gpus"]:
            check(f"cuda:{index} same uuid through NVML", fresh["gpus"][index]["uuid"] == gpu.uuid)

    cached = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    del cached  # stays reserved by torch's pool
    before = torch.cuda.mem_get_info(0)[0]
    check("free memory counts torch's cached 1 GB", gpus()[0].free_bytes - before >= (1 << 30) - 64 * MiB,
          f"driver {before / MiB:.0f} MB, gpus() {gpus()[0].free_bytes / MiB:.0f} MB")

    best = max(gpus(), key=lambda g: g.free_bytes)
    check("best_device(1) is the emptiest GPU", memory.best_device(1) == best.device, best.device)
    check("best_device(too much) is cpu", memory.best_device(best.total_bytes / (1 << 30) + 1) == "cpu")

    torch.cuda.empty_cache()
    chunk = torch.cuda.mem_get_info(0)[0] // 64 // MiB * MiB  # batch 64 needs 1.5x free memory, 32 needs 0.75x
    errors: list[str] = []

    def step(batch: int) -> int:
        try:
            first = torch.empty(batch * chunk // 2, dtype=torch.uint8, device="cuda:0")
            second = torch.empty(batch * chunk, dtype=torch.uint8, device="cuda:0")
        except Exception as exc:
            errors.append(type(exc).__name__)
            raise
        return first.numel() + second.numel()

    started = time.perf_counter()
    _, batch = memory.fit_batch(step, 128)
    took = time.perf_counter() - started
    check("fit_batch finds a batch on real CUDA", 16 <= batch <= 32 and errors[:1] == ["OutOfMemoryError"],
          f"batch {batch} after {errors} in {took:.2f} s")
    check("nothing of the failed tries is left allocated", torch.cuda.memory_allocated(0) == 0)

    uuid = found[-1].uuid or ""
    only_last = in_child(LIST_GPUS.format(True), CUDA_VISIBLE_DEVICES=uuid)
    check("CUDA_VISIBLE_DEVICES=<uuid of the last GPU> makes it cuda:0", isinstance(only_last, dict)
          and [(g["device"], g["uuid"]) for g in only_last["gpus"]] == [("cuda:0", uuid)], str(only_last))
    hidden = in_child(LIST_GPUS.format(True), CUDA_VISIBLE_DEVICES="")
    check("CUDA_VISIBLE_DEVICES='' hides every GPU", isinstance(hidden, dict) and hidden["gpus"] == [], str(hidden))

    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
