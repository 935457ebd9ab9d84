"""``apsi-memory status | limits | pressure [--watch SECONDS] | dask-limit [--workers N] [--nthreads N]``, each
with ``--json``; ``spill | stores | clean`` (``leftovers``); ``--version``.

With ``--json``, an error is JSON on stdout too, ``{"error": message, "type": kind}`` (``leftovers.fail``; a usage
error's kind is ``UsageError``, exit 2). Sizes in text follow ``units``: binary KB/MB/GB."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .. import _version
from ..decide import dask_settings, worker_memory_limit
from ..errors import ApsiMemoryError
from ..machinery.machines import cores, limits, machine, pressure
from ..status import status
from ..units import fmt_size, seconds
from . import leftovers

COMMANDS: dict[str, Callable[[], object]] = {"status": status, "limits": limits, "pressure": pressure}


class _Parser(argparse.ArgumentParser):
    """With ``json_errors`` (``--json`` was given), a usage error is printed as JSON on stdout too."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            print(json.dumps({"error": message, "type": "UsageError"}), flush=True)
            self.exit(2)
        super().error(message)


class _Subcommand(_Parser):
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


def _parser(json_errors: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(prog="apsi-memory", description="The memory this program really has.",
                     epilog="Sizes are binary: 1 KB = 1024 bytes, 1 MB = 1024 KB, 1 GB = 1024 MB.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Subcommand)
    leftovers.add_json_commands(sub, (("status", "RAM, swap, SSD, cores and GPUs in one line"),
                                      ("limits", "usable memory: the smaller of the host and the cgroup limit"),
                                      ("pressure", "the pressure level, free memory and PSI stalls")),
                                "print one JSON object per reading")
    watch = sub.choices["pressure"]
    watch.add_argument("--watch", type=_seconds, metavar="SECONDS", help="print a reading every SECONDS until Ctrl-C")
    watch.add_argument("--count", type=_at_least_one("readings"), metavar="N", help="with --watch: stop after N readings")
    dask_help = "memory limit, chunk size, rechunk method and p2p buffers per dask worker, for a deployment script"
    leftovers.add_json_commands(sub, (("dask-limit", dask_help),), "print one JSON object")
    sub.choices["dask-limit"].add_argument("--workers", type=_at_least_one("workers"), metavar="N",
                                           help="workers sharing this machine (default: its cores / --nthreads)")
    sub.choices["dask-limit"].add_argument("--nthreads", type=_at_least_one("threads"), metavar="N", default=1,
                                           help="threads per worker (default: 1); the chunk size is per thread")
    leftovers.add_commands(sub)
    for command in (parser, *sub.choices.values()):
        if isinstance(command, _Parser):
            command.json_errors = json_errors
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
    """What ``dask-limit`` prints: ``--memory-limit`` for each ``dask worker`` of ``nthreads`` threads, and what
    ``cluster()`` would set from it (``decide.dask_settings``: chunk size, rechunk method, p2p buffers)."""

    def __init__(self, workers: int | None, nthreads: int = 1) -> None:
        self.workers = max(1, cores() // nthreads) if workers is None else workers  # as cluster() counts them
        self.usable_bytes = limits().usable_bytes
        self.memory_limit_bytes = worker_memory_limit(self.usable_bytes, self.workers, nthreads)
        settings = dask_settings(self.memory_limit_bytes, nthreads)
        self.chunk_bytes = int(settings["array.chunk-size"])
        self.nthreads = nthreads
        self.rechunk_method = str(settings["array.rechunk.method"])
        self.p2p_comm_buffer_bytes = int(settings["distributed.p2p.comm.buffer"])
        self.p2p_storage_buffer_bytes = int(settings["distributed.p2p.storage.buffer"])

    def to_dict(self) -> dict[str, int | str]:
        return dict(vars(self))

    def __str__(self) -> str:
        threads = f"{self.nthreads} thread{'s' if self.nthreads > 1 else ''}"
        return (f"--memory-limit {self.memory_limit_bytes} per worker ({fmt_size(self.memory_limit_bytes, 2)}, "
                f"{self.workers} workers of {threads} sharing {fmt_size(self.usable_bytes)}), chunks of "
                f"{fmt_size(self.chunk_bytes, 0)}\nrechunk method {self.rechunk_method}, p2p buffers "
                f"{fmt_size(self.p2p_comm_buffer_bytes)} (comm) and {fmt_size(self.p2p_storage_buffer_bytes)} "
                "(storage) per worker")


def _show(reading: object, as_json: bool) -> None:
    print(json.dumps(reading.to_dict()) if as_json else reading, flush=True)  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The library's loggers print nothing unconfigured (a NullHandler); the command line shows their warnings as
    # bare lines on stderr, as Python's last-resort handler did (a program that configured logging keeps its own).
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    parser = _parser(json_errors="--json" in argv)
    args = parser.parse_args(argv)
    if args.command == "dask-limit":
        return _dask_limit(args.workers, args.nthreads, args.json)
    if args.command in leftovers.COMMANDS:
        return leftovers.run(args)
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
        return leftovers.fail("apsi-memory", exc, args.json)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `apsi-memory pressure --watch 1 | head -1`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 141
    return 0


def _dask_limit(workers: int | None, nthreads: int, as_json: bool) -> int:
    try:
        _show(DaskLimit(workers, nthreads), as_json)
    except ApsiMemoryError as exc:  # too many workers for this memory, a kernel file that cannot be read
        return leftovers.fail("apsi-memory", exc, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
