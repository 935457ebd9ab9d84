"""Every ```python block of README.md runs, in order, in one namespace, and prints what its comments show.

The conventions (for whoever writes a README block):

* A block runs as written, after all blocks before it, in one namespace (``import apsi_memory as memory`` in the
  first block serves them all). It runs in a fresh temporary folder as the working directory, with ``HOME`` there
  too (so ``~/.apsi`` is fresh), on a simulated container: a cgroup v1 memory limit of 4 GB with 1 GB in use, 2
  cores, no GPU (``sim.tree.docker_v1``; the README says so where it shows numbers).
* A block whose first line is ``# not run: <why>`` is only compiled (it must still be valid Python).
* ``# prints: <line>`` is one line the block prints, in order: the block's whole output must be exactly those
  lines. The comment may end a statement's line or stand on its own line (several for a loop). In ``<line>``,
  ``…`` stands for any text (a path, a free-space figure that depends on the disk); everything else must match.
* A block with no ``# prints:`` comment must print nothing.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim import tree as machines
from sim.tree import GiB, SimTree

README = Path(__file__).resolve().parent.parent / "README.md"
NOT_RUN = "# not run:"
PRINTS = re.compile(r"#\s*prints:\s?(.*)$")


@dataclass(frozen=True)
class Block:
    line: int  # where it starts in README.md (1-based, the line after the fence)
    code: str

    @property
    def expected(self) -> list[str]:
        return [m.group(1).rstrip() for m in map(PRINTS.search, self.code.splitlines()) if m]

    @property
    def runs(self) -> bool:
        return not self.code.lstrip().startswith(NOT_RUN)

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.code.strip().splitlines()[0]}"


def python_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    at = 0
    while at < len(lines):
        if lines[at].strip() == "```python":
            end = next(i for i in range(at + 1, len(lines)) if lines[i].strip() == "```")
            blocks.append(Block(at + 2, "\n".join(lines[at + 1:end]) + "\n"))
            at = end
        at += 1
    return blocks


def test_ci_runs_the_test_command_the_readme_gives() -> None:
    """One command, in a venv (not the system's Python): the README's, less the PYENV_VERSION that .ci/run works
    out from the interpreters pyenv has."""
    shown = next(line.strip() for line in README.read_text(encoding="utf-8").splitlines() if "bin/tox" in line)
    assert shown.startswith("python3 -m venv ") and " pip install" not in shown.split("&&")[0]
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.sub(r"PYENV_VERSION=\S+ ", "", shown) in ci.splitlines()


def matches(pattern: str, line: str) -> bool:
    regex = ".*?".join(re.escape(part) for part in pattern.split("…"))
    return re.fullmatch(regex, line.rstrip()) is not None


def test_the_conventions_are_applied() -> None:
    """The harness itself: blocks are found, ``…`` is a wildcard and nothing else is."""
    blocks = python_blocks("text\n```python\nprint(1)  # prints: 1\n# prints: a…c\n```\n```python\n# not run: x\n```\n")
    assert [(b.line, b.expected, b.runs) for b in blocks] == [(3, ["1", "a…c"], True), (7, [], False)]
    assert matches("a…c", "abbbc") and not matches("a…c", "abd") and not matches("1.0 GB", "1x0 GB")


def test_every_python_block_of_the_readme_runs_and_prints_what_it_shows(
        sim_machine: Callable[..., SimTree], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("APSI_HOME", raising=False)
    monkeypatch.chdir(home)
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        compiled = compile(block.code, str(block), "exec")
        if not block.runs:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compiled, namespace)  # noqa: S102 - the README's own code, which is what is being tested
        printed = out.getvalue().splitlines()
        assert len(printed) == len(block.expected), f"{block}\nprinted {printed}\nthe README shows {block.expected}"
        for shown, line in zip(block.expected, printed):
            assert matches(shown, line), f"{block}\nprinted   {line!r}\nREADME shows {shown!r}"
