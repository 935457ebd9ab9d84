"""Every ```python block of README.md and of each docs/**/*.md page runs and prints what its comments show.

The conventions (for whoever writes a block in the README or a docs page):

* A block runs as written, after all blocks before it on the same page, in one namespace per page (``import
  apsi_memory as memory`` in a page's first block serves them all). Each page runs in a fresh temporary folder as
  the working directory, with ``HOME`` there too (so ``~/.apsi`` is fresh), on a simulated container: a cgroup v1
  memory limit of 4 GB with 1 GB in use, 2 cores, no GPU (``sim.tree.docker_v1``; a page says so where it shows
  numbers).
* A block with an ``if __name__ == "__main__":`` guard (one that starts processes, such as a Dask cluster) is a
  whole program: it runs alone, as a file pasted from the page, in a subprocess; one that imports dask is marked
  ``dask`` and skipped without the extra.
* A block whose first line is ``# not run: <why>`` is only compiled (it must still be valid Python).
* ``# prints: <line>`` is one line the block prints, in order: the block's whole output must be exactly those
  lines. The comment may end a statement's line or stand on its own line (several for a loop). In ``<line>``,
  ``…`` stands for any text (a path, a free-space figure that depends on the disk); everything else must match.
* A block with no ``# prints:`` comment must print nothing.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim import tree as machines
from sim.tree import GiB, SimTree

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted(p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.parts)]
NOT_RUN = "# not run:"
MAIN = 'if __name__ == "__main__":'
PRINTS = re.compile(r"#\s*prints:\s?(.*)$")


@dataclass(frozen=True)
class Block:
    line: int  # where it starts in its page (1-based, the line after the fence)
    code: str
    page: str = "README.md"

    @property
    def expected(self) -> list[str]:
        return [m.group(1).rstrip() for m in map(PRINTS.search, self.code.splitlines()) if m]

    @property
    def runs(self) -> bool:
        return not self.code.lstrip().startswith(NOT_RUN)

    @property
    def program(self) -> bool:
        """A whole program, run as a file (its guard keeps process-starting code out of the workers' imports)."""
        return MAIN in self.code

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.code.strip().splitlines()[0]}"


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO))


def python_blocks(text: str, page: str = "README.md") -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    at = 0
    while at < len(lines):
        if lines[at].strip() == "```python":
            end = next(i for i in range(at + 1, len(lines)) if lines[i].strip() == "```")
            blocks.append(Block(at + 2, "\n".join(lines[at + 1:end]) + "\n", page))
            at = end
        at += 1
    return blocks


def test_ci_runs_the_test_command_the_readme_gives() -> None:
    """One command, in a venv (not the system's Python): the README's, word for word (toxfile.py finds pyenv's
    interpreters, so nothing needs setting first)."""
    shown = next(line.strip() for line in README.read_text(encoding="utf-8").splitlines() if "bin/tox" in line)
    assert shown.startswith("python3 -m venv ") and " pip install" not in shown.split("&&")[0]
    ci = (README.parent / ".ci" / "run").read_text()
    assert shown in ci.splitlines()


def test_no_interpreter_patch_version_is_written_into_the_test_command() -> None:
    """Before, the README named PYENV_VERSION=3.10.13:3.11.7:...: a fresh machine with other patch releases failed."""
    for text in (README.read_text(encoding="utf-8"), (REPO / ".ci" / "run").read_text(), (REPO / "tox.ini").read_text()):
        assert re.findall(r"\b3\.1[0-9]\.[0-9]+\b", text) == []


def matches(pattern: str, line: str) -> bool:
    regex = ".*?".join(re.escape(part) for part in pattern.split("…"))
    return re.fullmatch(regex, line.rstrip()) is not None


def test_the_conventions_are_applied() -> None:
    """The harness itself: blocks are found, ``…`` is a wildcard and nothing else is."""
    blocks = python_blocks("text\n```python\nprint(1)  # prints: 1\n# prints: a…c\n```\n```python\n# not run: x\n```\n")
    assert [(b.line, b.expected, b.runs) for b in blocks] == [(3, ["1", "a…c"], True), (7, [], False)]
    assert matches("a…c", "abbbc") and not matches("a…c", "abd") and not matches("1.0 GB", "1x0 GB")


def check_output(block: Block, printed: list[str]) -> None:
    assert len(printed) == len(block.expected), f"{block}\nprinted {printed}\nthe page shows {block.expected}"
    for shown, line in zip(block.expected, printed):
        assert matches(shown, line), f"{block}\nprinted   {line!r}\nthe page shows {shown!r}"


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_python_block_of_the_readme_and_the_docs_runs_and_prints_what_it_shows(
        page: Path, sim_machine: Callable[..., SimTree], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("APSI_HOME", raising=False)
    monkeypatch.chdir(home)
    gc.collect()  # arrays a page before this one left to the collector are not in this page's report()
    blocks = python_blocks(page.read_text(encoding="utf-8"), page_name(page))
    if page == README:
        assert blocks, "the README shows the library in a python block"
    namespace: dict[str, object] = {"__name__": "page"}
    for block in blocks:
        compiled = compile(block.code, str(block), "exec")
        if not block.runs or block.program:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compiled, namespace)  # noqa: S102 - the page's own code, which is what is being tested
        check_output(block, out.getvalue().splitlines())


PROGRAMS = [pytest.param(block, id=str(block).split(": ")[0], marks=[pytest.mark.dask] if "dask" in block.code else [])
            for page in PAGES for block in python_blocks(page.read_text(encoding="utf-8"), page_name(page))
            if block.runs and block.program]


@pytest.mark.parametrize("block", PROGRAMS)
def test_every_program_block_runs_when_pasted_into_a_file(block: Block, tmp_path: Path) -> None:
    """Before, the README's Dask block had no ``__main__`` guard: pasted into a file, each worker process that
    imports it would start a cluster of its own."""
    if "dask" in block.code:
        pytest.importorskip("distributed", reason="the dask extra is not installed: pip install '.[dask]'")
    (tmp_path / "pasted.py").write_text(block.code, encoding="utf-8")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("APSI_HOME", None)
    done = subprocess.run([sys.executable, "pasted.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"{block}\n{done.stderr}"
    check_output(block, done.stdout.splitlines())


def test_the_program_blocks_are_found() -> None:
    """The Dask guide's cluster block, at least: a page losing its guard must not make the test above vanish."""
    assert any(block.page == "docs/guides/dask.md" for block in (p.values[0] for p in PROGRAMS))
