"""``apsi-memory status | limits | pressure [--watch SECONDS]``, each with ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

from .api import limits, pressure, status
from .errors import ApsiMemoryError
from .units import seconds

COMMANDS: dict[str, Callable[[], object]] = {"status": status, "limits": limits, "pressure": pressure}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apsi-memory", description="The memory this program really has.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("status", "RAM, swap, SSD, cores and GPUs in one line"),
                            ("limits", "usable memory: the smaller of the host and the cgroup limit"),
                            ("pressure", "the pressure level, free memory and PSI stalls")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object per reading")
    watch = sub.choices["pressure"]
    watch.add_argument("--watch", type=_seconds, metavar="SECONDS", help="print a reading every SECONDS until Ctrl-C")
    watch.add_argument("--count", type=_count, metavar="N", help="with --watch: stop after N readings")
    return parser


def _seconds(text: str) -> float:
    """``--watch``: a number of seconds above 0 that the platform can wait (not nan, inf or 1e300)."""
    try:
        return seconds(float(text), "SECONDS")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"N must be a whole number of readings, at least 1, not {text!r}")
    return count


def _show(reading: object, as_json: bool) -> None:
    print(json.dumps(reading.to_dict()) if as_json else reading, flush=True)  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    read = COMMANDS[args.command]
    watch = getattr(args, "watch", None)
    if getattr(args, "count", None) is not None and watch is None:
        parser.error("--count counts the readings of --watch: give --watch SECONDS too")
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
