"""Command line: ``python -m fastcopy info [--json | --profile]``, ``bench [...]``, ``tune [...]``,
``compare BASE.json NEW.json``, ``shm --list`` / ``shm --clean`` / ``shm --doctor`` (fastcopy channel segments in /dev/shm).

See docs/benchmarks.md for the benchmark, the tune command and the comparison.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def _build_parser() -> argparse.ArgumentParser:
    from .bench import cli
    from .tune import cli as tune_cli

    parser = argparse.ArgumentParser(prog="python -m fastcopy")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="what was detected and which kernel each copy gets")
    p_info.add_argument("--json", action="store_true", help="print as JSON")
    p_info.add_argument("-v", "--verbose", action="store_true",
                        help="also the reason and the measurements behind each choice")
    p_info.add_argument("--profile", action="store_true",
                        help="print only the active dispatch profile, in the profile file format (to share it, "
                             "or to load it elsewhere with FASTCOPY_PROFILE=FILE)")

    cli.add_bench_parser(sub)
    tune_cli.add_tune_parser(sub)
    from .net.cli import add_bridge_parser

    add_bridge_parser(sub)

    p_cmp = sub.add_parser("compare", help="compare two bench --json files",
                           description="Per size and variant: change of the median in percent; '*' marks a "
                                       "change beyond the measured spread (the min-max ranges do not overlap).")
    p_cmp.add_argument("base", metavar="BASE.json")
    p_cmp.add_argument("new", metavar="NEW.json")
    p_cmp.add_argument("--plot", metavar="FILE.png", help="plot the change vs size (needs matplotlib)")

    p_shm = sub.add_parser("shm", help="list or remove fastcopy channel segments in /dev/shm",
                           description="Finds fastcopy.shm channel segments in /dev/shm by their header. "
                                       "A segment is stale when the process that created it is gone and no "
                                       "producer or consumer is running (e.g. its creator was killed with "
                                       "SIGKILL); --clean removes only those.")
    action = p_shm.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list every channel segment and whether it is stale")
    action.add_argument("--clean", action="store_true", help="remove the stale segments")
    action.add_argument("--doctor", action="store_true",
                        help="report /dev/shm's size and free space, live and stale segments and systemd-logind's "
                             "RemoveIPC; exit status 1 when a problem is found (stale segments, RemoveIPC that "
                             "applies to this user, /dev/shm unreadable)")
    p_shm.add_argument("--json", action="store_true", help="with --doctor: print the report as JSON")
    p_shm.add_argument("--prefix", default="", metavar="TEXT",
                       help="only segments whose name starts with TEXT (e.g. fastcopy-, the default names)")
    return parser


def _shm(args: argparse.Namespace) -> int:
    from . import shm

    if args.doctor:
        import json

        from .shm.space import doctor_report, format_doctor

        report = doctor_report()
        print(json.dumps(report, indent=2) if args.json else format_doctor(report))
        return 1 if report["problems"] else 0
    if args.clean:
        removed = shm.clean_segments(args.prefix)
        for name in removed:
            print(f"removed /dev/shm/{name}")
        print(f"{len(removed)} stale segment{'s' if len(removed) != 1 else ''} removed")
        return 0
    segments = shm.list_segments(args.prefix)
    if not segments:
        print("no fastcopy channel segments in /dev/shm")
        return 0
    print(f"{'name':<40} {'bytes':>12} {'creator':>16} {'producer':>9} {'consumer':>9}  state")
    for seg in segments:
        creator = (f"{seg['creator_pid']} ({'alive' if seg['creator_alive'] else 'gone'})"
                   if seg["creator_pid"] else "unknown")
        state = "stale" if seg["stale"] else ("in use" if seg["creator_alive"] or seg["ends_alive"] else "unknown")
        if seg.get("kind") == "topic":
            state += f" (topic, {len(seg['subscriber_pids'])} subscriber records)"
        elif seg.get("kind") == "unfinished":
            state += " (creation never finished)"
        print(f"{seg['name']:<40} {seg['bytes']:>12} {creator:>16} {seg['producer_pid'] or '-':>9} "
              f"{seg['consumer_pid'] or '-':>9}  {state}")
    return 0


def _compare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .bench.cli import check_outputs, need_matplotlib, subparser
    from .bench.compare import compare_files

    p = subparser(parser, "compare")
    check_outputs(p, args)
    if args.plot:
        need_matplotlib(p)
    try:
        text, rows = compare_files(args.base, args.new)
    except (OSError, ValueError) as e:
        p.error(str(e))
    print(text)
    if args.plot:
        from .bench.plot import plot_compare

        plot_compare(rows, args.plot, title=f"{os.path.basename(args.new)} vs {os.path.basename(args.base)}")
        print(f"plot written to {args.plot}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        from ._report import print_info

        if args.profile:
            from . import _core

            print(_core.active_profile_json(), end="")
        else:
            print_info(as_json=args.json, verbose=args.verbose)
        return 0
    if args.command == "bench":
        from .bench.cli import run

        return run(parser, args, argv)
    if args.command == "tune":
        from .tune.cli import run_cli

        return run_cli(parser, args, argv)
    if args.command == "compare":
        return _compare(parser, args)
    if args.command == "shm":
        return _shm(args)
    if args.command == "bridge":
        from .net.cli import run as run_bridge

        return run_bridge(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
