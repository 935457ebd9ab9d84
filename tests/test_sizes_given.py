"""Issue 28 item 8: sizes a user passes mean the same everywhere. ``memory.store(ram_mb="1GB")`` was refused while
``budget`` and ``pool`` take size strings; ``budget(3)`` above what is usable warned without saying that a number
means GB."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

import apsi_memory as memory
from apsi_memory.store import byte_limits
from sim import tree as machines
from sim.tree import GiB, MiB, SimTree

BuildMachine = Callable[..., SimTree]


@pytest.mark.parametrize(("ram", "disk", "expected"), [
    ("1GB", "500MB", (GiB, 500 * MiB)),
    ("512 MB", 2, (512 * MiB, 2 * GiB)),
    (256, "1.5GiB", (256 * MiB, int(1.5 * GiB))),
])
def test_ram_mb_and_disk_gb_take_size_strings_as_budget_does(ram: float | str, disk: float | str,
                                                            expected: tuple[int, int]) -> None:
    assert byte_limits(ram, disk) == expected


def test_a_store_opened_with_size_strings_keeps_to_that_disk_size(tmp_path_factory: pytest.TempPathFactory,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_STORE_DIR", str(tmp_path_factory.mktemp("stores")))
    evictions = {}
    for disk in ("1MB", "1GB"):
        with memory.store(f"sized-{disk}", ram_mb="1MB", disk_gb=disk) as s:
            for i in range(8):  # 2 MB of values
                s[i] = b"x" * (256 * 1024)
            assert s[7] == b"x" * (256 * 1024)
            evictions[disk] = s.stats().evictions
    assert evictions["1MB"] > 0 and evictions["1GB"] == 0, evictions


@pytest.mark.parametrize(("what", "value", "words"), [
    ("ram_mb", "512", "ram_mb='512' has no unit; write ram_mb='512MB' or '512GB', or a number (ram_mb as a number is MB)"),
    ("disk_gb", "10", "disk_gb='10' has no unit"),
    ("ram_mb", "12 parsecs", "ram_mb: unknown unit 'parsecs'"),
    ("disk_gb", "-1GB", "disk_gb: cannot read '-1GB' as a size"),
])
def test_a_size_string_that_cannot_mean_one_size_is_refused_naming_the_parameter(what: str, value: str,
                                                                                 words: str) -> None:
    sizes = {"ram_mb": 256.0, "disk_gb": 10.0, what: value}
    with pytest.raises(memory.SizeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        byte_limits(sizes["ram_mb"], sizes["disk_gb"])


def test_a_number_given_to_budget_is_said_to_be_gb_in_the_warning(sim_machine: BuildMachine) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=0)
    with pytest.warns(memory.BudgetWarning, match=r"budget 3\.0 GB \(budget\(3\): a number is GB\) is more than"):
        memory.budget(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memory.budget("3GB")
    assert [str(w.message) for w in caught] == [
        "budget 3.0 GB is more than the 1.0 GB usable here; arrays are still placed by what is free"]
