"""Every ```python block of README.md and of each docs/**/*.md page, and every ``.. code-block:: python`` of each
docs/**/*.rst page (the API reference's examples), runs and prints what its comments show.

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
* A block that imports dask (``import dask`` or ``from dask``) runs where the dask extra is installed; elsewhere it
  is only compiled, and the blocks after it must not need what it made.
* ``# prints: <line>`` is one line the block prints, in order: the block's whole output must be exactly those
  lines. The comment may end a statement's line or stand on its own line (several for a loop). In ``<line>``,
  ``…`` stands for any text (a path, a free-space figure that depends on the disk); everything else must match.
* A block with no ``# prints:`` comment must print nothing.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sim import tree as machines
from sim.tree import GiB, SimTree

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted(p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.parts),
         *sorted(p for p in (REPO / "docs").rglob("*.rst") if "_build" not in p.parts)]
API = REPO / "docs" / "reference" / "api.rst"
NOT_RUN = "# not run:"
NEEDS_DASK = re.compile(r"^\s*(?:import|from) dask\b", re.MULTILINE)
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
    def needs_dask(self) -> bool:
        return NEEDS_DASK.search(self.code) is not None

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


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def rst_python_blocks(text: str, page: str) -> list[Block]:
    """The ``.. code-block:: python`` directives of an rst page, at any indent (inside an autodoc entry too): the
    lines after its options and the blank line, as long as they are blank or indented deeper than the directive."""
    blocks: list[Block] = []
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if line.strip() != ".. code-block:: python":
            continue
        start = at + 1
        while start < len(lines) and lines[start].strip().startswith(":"):  # its options (:caption: ...)
            start += 1
        end = start
        while end < len(lines) and (not lines[end].strip() or indent(lines[end]) > indent(line)):
            end += 1
        body = lines[start:end]
        while body and not body[0].strip():
            body, start = body[1:], start + 1
        blocks.append(Block(start + 1, textwrap.dedent("\n".join(body).rstrip() + "\n"), page))
    return blocks


def page_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return (rst_python_blocks if path.suffix == ".rst" else python_blocks)(text, page_name(path))


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
    rst = rst_python_blocks(".. autofunction:: f\n\n   .. code-block:: python\n      :caption: c\n\n      x = 1\n\n"
                            "      print(x)  # prints: 1\n\n   after\n.. code-block:: python\n\n   import dask\n", "p.rst")
    assert [(b.line, b.code, b.expected, b.needs_dask) for b in rst] == [
        (6, "x = 1\n\nprint(x)  # prints: 1\n", ["1"], False), (13, "import dask\n", [], True)]


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
    blocks = page_blocks(page)
    if page in (README, API):
        assert blocks, f"{page_name(page)} shows the library in a python block"
    has_dask = importlib.util.find_spec("dask") is not None
    namespace: dict[str, object] = {"__name__": "page"}
    for block in blocks:
        compiled = compile(block.code, str(block), "exec")
        if not block.runs or block.program or (block.needs_dask and not has_dask):
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compiled, namespace)  # noqa: S102 - the page's own code, which is what is being tested
        check_output(block, out.getvalue().splitlines())


def reference_entries() -> dict[str, list[str]]:
    """Each ``.. autofunction::`` / ``autoclass`` / ``autoexception`` entry of the API reference: its name and the
    lines of its content (the indented lines under it, that the site shows after the docstring)."""
    lines = API.read_text(encoding="utf-8").splitlines()
    entries: dict[str, list[str]] = {}
    for at, line in enumerate(lines):
        if found := re.match(r"\.\. auto(?:function|class|exception):: (\S+)$", line):
            end = next((i for i in range(at + 1, len(lines)) if lines[i].strip() and not indent(lines[i])), len(lines))
            entries[found.group(1).rpartition(".")[2]] = lines[at + 1:end]
    return entries


def test_every_function_and_class_of_the_api_reference_shows_an_example_call() -> None:
    """Before, 14 of 25 functions had none: a reader of the reference saw signatures only. The errors share one
    example (catching ``ApsiMemoryError``); the examples' output is checked by the page test above."""
    import apsi_memory as memory

    entries = reference_entries()
    assert set(entries) == set(memory.__all__)  # the parse finds every entry
    errors = {name for name in memory.__all__ if isinstance(getattr(memory, name), type)
              and issubclass(getattr(memory, name), Warning | memory.ApsiMemoryError)}
    without = [name for name, content in entries.items() if name not in errors - {"ApsiMemoryError"}
               and not any(line.strip() == ".. code-block:: python" for line in content)]
    assert without == []


def test_the_thresholds_the_reference_states_are_the_code_s() -> None:
    """``Pressure``'s entry states when each level is entered and left, ``array``'s and ``free``'s the size under
    which an array stays in NumPy's memory (before, they named ``decide.LEVEL_TABLE`` and the module docstrings,
    which no page of the site shows): the numbers they state must be the code's."""
    from apsi_memory import Level, Pressure, array, free
    from apsi_memory.decide import SMALL_ARRAY_BYTES, levels, v2

    assert SMALL_ARRAY_BYTES % (1 << 20) == 0
    small = f"under {SMALL_ARRAY_BYTES >> 20} MiB"
    assert small in " ".join(inspect.getdoc(array).split()) and small in " ".join(inspect.getdoc(free).split())

    rows = [levels.LEVEL_TABLE[level] for level in (Level.MODERATE, Level.HIGH, Level.CRITICAL)]
    text = " ".join(inspect.getdoc(Pressure).split())
    assert f"free at or below {' / '.join(f'{r.enter_free * 100:g}' for r in rows)} % of usable" in text
    assert f"``some`` at or above {' / '.join(f'{r.enter_some:g}' for r in rows)} %" in text
    assert f"``full`` at or above {' / '.join(f'{r.enter_full:g}' for r in rows)} %" in text
    assert all(round(r.leave_free - r.enter_free, 6) == 0.05 and r.leave_some == r.enter_some / 2
               and r.leave_full == r.enter_full / 2 for r in rows), "5 points more free, half the stall share"
    assert f"more than {levels.HOST_SHORT_FREE * 100:g} % of its RAM free; {rows[0].leave_free * 100:g} %" in text
    assert f"for {v2.THROTTLE_WINDOW_S:g} s after each rise" in text


PROGRAMS = [pytest.param(block, id=str(block).split(": ")[0], marks=[pytest.mark.dask] if "dask" in block.code else [])
            for page in PAGES for block in page_blocks(page)
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
