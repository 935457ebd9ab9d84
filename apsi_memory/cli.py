"""``apsi-memory status | limits | pressure [--watch SECONDS] | dask-limit [--workers N]``, each with ``--json``;
``spill | stores | clean`` (``cli_files``); ``--version``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from . import _version, cli_files
from .api import cores, limits, pressure
from .decide import chunk_bytes, worker_memory_limit
from .errors import ApsiMemoryError, ArgumentError
from .machinery import machine
from .status import status
from .units import seconds

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


class _Version(argparse.Action):
    """``--version``, read only when asked for (the package metadata costs more than a ``status`` call)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog} {_version.version()}")  # on stdout, as argparse's own version action prints
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apsi-memory", description="The memory this program really has.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Subcommand)
    cli_files.add_json_commands(sub, (("status", "RAM, swap, SSD, cores and GPUs in one line"),
                                      ("limits", "usable memory: the smaller of the host and the cgroup limit"),
                                      ("pressure", "the pressure level, free memory and PSI stalls")),
                                "print one JSON object per reading")
    watch = sub.choices["pressure"]
    watch.add_argument("--watch", type=_seconds, metavar="SECONDS", help="print a reading every SECONDS until Ctrl-C")
    watch.add_argument("--count", type=_at_least_one("readings"), metavar="N", help="with --watch: stop after N readings")
    dask = sub.add_parser("dask-limit", help="memory limit and chunk size per dask worker, for a deployment script")
    dask.add_argument("--workers", type=_at_least_one("workers"), metavar="N", help="workers sharing this machine (default: its cores)")
    dask.add_argument("--json", action="store_true", help="print one JSON object")
    cli_files.add_commands(sub)
    return parser


def _seconds(text: str) -> float:
    """``--watch``: a number of seconds above 0 that the platform can wait (not nan, inf or 1e300)."""
    try:
        return seconds(float(text), "SECONDS")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least_one(what: str) -> Callable[[str], int]:
    """An argparse type for a count of ``what``: a whole number, at least 1."""
    def parse(text: str) -> int:
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1:
            raise argparse.ArgumentTypeError(f"N must be a whole number of {what}, at least 1, not {text!r}")
        return count
    return parse


class DaskLimit:
    """What ``dask-limit`` prints: ``--memory-limit`` for each ``dask worker``, and the chunk size to use."""

    def __init__(self, workers: int | None) -> None:
        self.workers = cores() if workers is None else workers
        self.usable_bytes = limits().usable_bytes
        self.memory_limit_bytes = worker_memory_limit(self.usable_bytes, self.workers)
        self.chunk_bytes = chunk_bytes(self.memory_limit_bytes)

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))

    def __str__(self) -> str:
        return (f"--memory-limit {self.memory_limit_bytes} per worker ({self.memory_limit_bytes / 2**30:.2f} GiB, "
                f"{self.workers} workers sharing {self.usable_bytes / 2**30:.1f} GiB), chunks of "
                f"{self.chunk_bytes >> 20} MiB")


def _show(reading: object, as_json: bool) -> None:
    print(json.dumps(reading.to_dict()) if as_json else reading, flush=True)  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "dask-limit":
        return _dask_limit(args.workers, args.json)
    if args.command in cli_files.COMMANDS:
        return cli_files.run(args)
    read = COMMANDS[args.command]
    watch = getattr(args, "watch", None)
    if getattr(args, "count", None) is not None and watch is None:
        parser.error("--count counts the readings of --watch: give --watch SECONDS too")
    try:
        _show(read(), args.json)
        shown = 1
        while watch and (args.count is None or shown < args.count):
            machine().clock.wait(watch)
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


def _dask_limit(workers: int | None, as_json: bool) -> int:
    try:
        _show(DaskLimit(workers), as_json)
    except ArgumentError as exc:  # too many workers for this memory
        print(f"apsi-memory: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
