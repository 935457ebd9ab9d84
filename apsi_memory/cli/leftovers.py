"""``apsi-memory spill | stores | clean``: the files the library keeps (see ``inventory``; the reservation ledgers'
files: ``machinery.ledgers``); ``siblings``: who the ledger of this memory group lists; each with ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ..errors import ApsiMemoryError
from ..machinery import ledgers
from ..machinery.machines import machine
from ..machinery.reader import MemoryReading
from ..system import paths
from ..units import fmt_size
from . import inventory


def counted(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 spill files``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def add_json_commands(sub: Any, commands: tuple[tuple[str, str], ...], json_help: str) -> None:
    """Add each ``(name, help)`` command to the main parser's subparsers, each with a ``--json`` flag; ``help`` is
    its line in ``apsi-memory --help`` and the description its own ``--help`` shows."""
    for name, help_text in commands:
        command = sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".")
        command.add_argument("--json", action="store_true", help=json_help + "; errors too, as "
                             '{"error": message, "type": kind}')


def fail(who: str, error: BaseException, as_json: bool) -> int:
    """Say why a command failed, and its exit status (1): ``who: error`` on stderr, or with ``--json`` one object
    on stdout of the same shape for every command, ``{"error": message, "type": the error's class name}``."""
    if as_json:
        print(json.dumps({"error": str(error), "type": type(error).__name__}), flush=True)
    else:
        print(f"{who}: {error}", file=sys.stderr)
    return 1


def add_commands(sub: Any) -> None:
    """Add the four commands to the main parser's subparsers."""
    spill = "spill files: owner pid, alive or not, size, age, total; ledger files: group, live slots, size"
    clean = "remove this user's spill files whose owner is dead and ledger files no live process holds"
    siblings = ("this user's other processes in this memory group that use the library: pid, RAM arrays held, "
                "reserved, RSS; those that each hold about the same (one dataset loaded once per process?)")
    add_json_commands(sub, (("spill", spill),
                            ("stores", "each store under the store folder: entries, bytes on the SSD, path"),
                            ("clean", clean), ("siblings", siblings)), "print one JSON object")
    cleaning = sub.choices["clean"]
    cleaning.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    cleaning.add_argument("--store", metavar="NAME", help="also remove every entry of the store NAME")


def _spill(args: argparse.Namespace) -> dict[str, Any]:
    files = inventory.spill_files()
    if not args.json:
        for f in files:
            print(f)
        dead = sum(not f.alive for f in files)
        print(f"{counted(len(files), 'spill file')}, {fmt_size(sum(f.size_bytes for f in files))} in total, {dead} of dead "
              f"owners, in {paths.display(paths.spill_dir())}")
    found = ledgers.ledger_files(_own_reading())
    if not args.json:
        for ledger in found:
            print(ledger)
        print(f"{counted(len(found), 'ledger file')}, {sum(f.live_slots == 0 for f in found)} with no live slot")
    return {"folder": paths.spill_dir(), "files": [inventory.as_dict(f) for f in files],
            "total_bytes": sum(f.size_bytes for f in files), "ledgers": [asdict(f) for f in found]}


def _own_reading() -> MemoryReading | None:
    """This process's memory reading, to name the ledgers' groups; None where it cannot be read (the groups are
    then unnamed, and the files are still listed and cleaned)."""
    try:
        return machine().memory()
    except ApsiMemoryError:
        return None


def _stores(args: argparse.Namespace) -> dict[str, Any]:
    found = inventory.stores()
    if not args.json:
        for s in found:
            print(s)
        print(f"{counted(len(found), 'store')}, {fmt_size(sum(s.bytes_on_ssd for s in found))} on the SSD, in "
              f"{paths.display(paths.store_dir())}")
    return {"folder": paths.store_dir(), "stores": [inventory.as_dict(s) for s in found]}


def _clean(args: argparse.Namespace) -> dict[str, Any]:
    verb = "would remove" if args.dry_run else "removed"
    # the store first: a name that is not one (even '') is an error before anything is removed
    cleared = None if args.store is None else inventory.clear_store(args.store, dry_run=args.dry_run)
    removed = inventory.clean_spill(dry_run=args.dry_run)
    gone = ledgers.clean_ledgers(_own_reading(), dry_run=args.dry_run)
    if not args.json:
        for f in removed:
            print(f"{verb} {paths.display(f.path)} ({fmt_size(f.size_bytes)}, pid {f.pid} dead)")
        print(f"{verb} {counted(len(removed), 'spill file')} of dead owners ({fmt_size(sum(f.size_bytes for f in removed))})")
        for ledger in gone:
            print(f"{verb} {paths.display(ledger.path)} (ledger of {ledger.group}, no live slot)")
        print(f"{verb} {counted(len(gone), 'ledger file')} with no live slot")
        if cleared is not None:
            print(f"{'would clear' if args.dry_run else 'cleared'} store {cleared.name}: "
                  f"{counted(cleared.entries or 0, 'entry')}")
    return {"dry_run": args.dry_run, "spill_files": [inventory.as_dict(f) for f in removed],
            "store": None if cleared is None else inventory.as_dict(cleared), "ledgers": [asdict(f) for f in gone]}


def _siblings(args: argparse.Namespace) -> dict[str, Any]:
    found = machine().join()
    alike = found.alike
    if not args.json:
        for s in found.each:
            print(f"pid {s.pid}: {fmt_size(s.held_bytes)} of RAM arrays, {fmt_size(s.reserved_bytes)} reserved, "
                  f"RSS {fmt_size(s.rss_bytes)}")
        if alike:
            print(f"{len(alike)} processes (pids {', '.join(str(s.pid) for s in alike)}) each hold about "
                  f"{fmt_size(alike[0].held_bytes)} of RAM arrays: if that is one dataset loaded once per process, "
                  "one file that every process maps holds it once (memory.array(..., path=) or memory.keep, then "
                  "np.load(path, mmap_mode='r') in each)")
        print(f"{counted(found.processes, 'sibling')}, {fmt_size(found.held_bytes)} of RAM arrays, "
              f"{fmt_size(found.reserved_bytes)} reserved; ledger {found.ledger or 'none (no safe folder)'}")
    return {**found.to_dict(), "each": [s._asdict() for s in found.each], "alike": [s.pid for s in alike]}


COMMANDS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "spill": _spill, "stores": _stores, "clean": _clean, "siblings": _siblings}


def run(args: argparse.Namespace) -> int:
    """Run one of the commands; a store name that is not one is a one-line error (exit 1)."""
    try:
        result = COMMANDS[args.command](args)
    except (ValueError, PermissionError) as exc:
        return fail(f"apsi-memory {args.command}", exc, args.json)
    if args.json:
        print(json.dumps(result))
    return 0
