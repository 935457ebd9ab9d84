"""``.. apsi-cli::``: the command-line reference, generated from the argparse parser at build time (so every
subcommand and flag is there, in the words ``--help`` prints)."""

from __future__ import annotations

import argparse
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

from apsi_memory.cli import commands as cli


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_of(parser: argparse.ArgumentParser, name: str) -> str:
    """The one-line help the top-level parser shows for a subcommand."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((c.help or "" for c in action._choices_actions if c.dest == name), "")


def literal(text: str) -> list[str]:
    return ["", ".. code-block:: text", ""] + ["   " + line for line in text.rstrip().splitlines()] + [""]


def reference(parser: argparse.ArgumentParser) -> list[str]:
    lines = literal(parser.format_help())
    for name, sub in subcommands(parser).items():
        title = f"apsi-memory {name}"
        lines += ["", title, "-" * len(title), "", help_of(parser, name) or sub.description or ""]
        lines += literal(sub.format_help())
    return lines


class ApsiCli(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        container = nodes.section()
        nested_parse_with_titles(self.state, StringList(reference(cli._parser()), source="apsi_memory/cli/commands.py"),
                                 container)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("apsi-cli", ApsiCli)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
