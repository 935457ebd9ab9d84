"""fit_batch in a real memory cgroup (v1 here), where the kernel OOM-kills instead of raising ``MemoryError``.

A child process in a group of ``LIMIT`` runs a step whose batch does not fit, first under ``fit_batch``, then as the
plain loop a user writes (the step at the starting batch), in the same group. The step touches every page it
allocates (``np.ones``, a real PyTorch forward and backward), so the plain loop is killed by the group's OOM killer
(exit -9, a shell's 137): the control that shows the limit is enforced. Under ``fit_batch`` the address-space cap it
sets while the step runs (``RLIMIT_AS`` = VmSize + the group's free memory) turns the allocation that would have
been killed into a ``MemoryError`` (NumPy) or a ``DefaultCPUAllocator`` ``RuntimeError`` (PyTorch), so it halves and
finishes with no OOM kill; the child also checks the cap was set inside the step and lifted afterwards.

Each test prints its figure: limit, batch reached, halvings, outcome, the group's OOM kills."""

from __future__ import annotations

import pytest

from tests.real.fit_batch_job import MiB, check_capped_and_restored, fit_then_plain

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]


def test_a_numpy_step_is_halved_in_a_memory_cgroup_where_the_plain_loop_is_oom_killed() -> None:
    figures, kills_fit, _, kills_plain = fit_then_plain("numpy", 512 * MiB, 1024)
    assert kills_fit == 0 and kills_plain >= 1
    assert figures["tried"][0] == 1024 and 16 <= figures["batch"] <= 256
    assert figures["result"] == 2 * (figures["batch"] * MiB // 4096)
    check_capped_and_restored(figures)


@pytest.mark.torch
def test_a_pytorch_cpu_training_step_is_halved_in_a_memory_cgroup_where_the_plain_loop_is_oom_killed() -> None:
    pytest.importorskip("torch")
    figures, kills_fit, _, kills_plain = fit_then_plain("torch", 1024 * MiB, 16384)
    assert kills_fit == 0 and kills_plain >= 1
    assert figures["tried"][0] == 16384 and 64 <= figures["batch"] <= 4096
    assert figures["result"] > 0  # a real loss came back
    check_capped_and_restored(figures)
