"""``apsi-memory status | limits | pressure [--watch SECONDS]``, each with ``--json``; ``spill | stores | clean``
(``cli_files``); ``--version``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

from . import cli_files
from ._version import __version__
from .api import limits, pressure, status
from .errors import ApsiMemoryError

COMMANDS: dict[str, Callable[[], object]] = {"status": status, "limits": limits, "pressure": pressure}


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser that rejects a flag it does not know itself, with its own usage line (argparse
    otherwise hands unknown arguments back up, and the top-level usage is shown)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apsi-memory", description="The memory this program really has.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Subcommand)
    for name, help_text in (("status", "RAM, swap, SSD, cores and GPUs in one line"),
                            ("limits", "usable memory: the smaller of the host and the cgroup limit"),
                            ("pressure", "the pressure level, free memory and PSI stalls")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object per reading")
    watch = sub.choices["pressure"]
    watch.add_argument("--watch", type=float, metavar="SECONDS", help="print a reading every SECONDS until Ctrl-C")
    watch.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N readings")
    cli_files.add_commands(sub)
    return parser


def _show(reading: object, as_json: bool) -> None:
    print(json.dumps(reading.to_dict()) if as_json else reading, flush=True)  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in cli_files.COMMANDS:
        return cli_files.run(args)
    read = COMMANDS[args.command]
    watch = getattr(args, "watch", None)
    if watch is not None and watch <= 0:
        print("apsi-memory: --watch needs a number of seconds above 0", file=sys.stderr)
        return 2
    try:
        _show(read(), args.json)
        shown = 1
        while watch and (args.count is None or shown < args.count):
            time.sleep(watch)
            _show(read(), args.json)
            shown += 1
    except ApsiMemoryError as exc:
        print(f"apsi-memory: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `apsi-memory pressure --watch 1 | head -1`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
