"""The ``python -m fastcopy tune`` command line: measure and write (the default), ``--show``,
``--reset``, ``--dry-run``. Each action is one function, and ``run_cli`` picks one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, List

from .. import _core
from ..bench.cli import MAX_REPEATS, int_at_least, positive_float, subparser, typed
from ..bench.paths import not_regular, output_problem
from ..bench.units import MAX_MIN_TIME, parse_sizes
from .profile import (check_words, default_output, format_profile, not_a_profile, profile_text, read_profile, tune,
                      write_profile)


def add_tune_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune", help="measure this machine and write a dispatch profile",
        description="Measures every usable kernel over a size grid, each address class and region (several buffer "
                    "placements per cell), the thread pool and non-temporal stores, checks the result at held-out "
                    "points; writes the profile to the user cache (docs/benchmarks.md, "
                    "docs/profile-format.md). Hot caches below the L3 size, cold at and above it.")
    p.add_argument("--quick", action="store_true", help="a coarser grid (powers of two, 256 B to 64 MiB), "
                                                        "4-6 placements of 0.5 ms loops, a 24-point held-out check")
    p.add_argument("--output", metavar="FILE",
                   help="write the profile here instead of the user cache: a regular file (replaced whole) or a "
                        "new name in an existing folder; --reset removes it only when it is a fastcopy profile")
    # One action at most; without one, tune measures and writes.
    act = p.add_mutually_exclusive_group()
    act.add_argument("--show", action="store_true",
                     help="print the cached profile (or --output FILE) and the active profile; measure nothing")
    act.add_argument("--reset", action="store_true", help="remove the cached profile (or --output FILE)")
    act.add_argument("--dry-run", action="store_true", dest="dry_run",
                     help="measure and print, write nothing")
    p.add_argument("--grid", type=typed(parse_sizes), metavar="LIST",
                   help="measure only these sizes (bench's syntax, e.g. '256,4K,64K' or '1K:1M:x4'): focused runs "
                        "and tests; the profile then holds decisions for these sizes only")
    p.add_argument("--repeats", type=typed(int_at_least(1)), metavar="N",
                   help=f"interleaved repeats per placement of a cell (at most {MAX_REPEATS})")
    p.add_argument("--min-time", type=typed(positive_float), metavar="SECONDS", dest="min_time",
                   help=f"shortest timed loop per sample for hot sizes, above 0 and at most {MAX_MIN_TIME:g} "
                        "seconds (default 0.001; --quick 0.0005)")
    p.add_argument("--no-progress", action="store_false", dest="progress", default=None,
                   help="no progress bar (it is shown on a terminal only)")
    from .check import add_check_arguments

    add_check_arguments(p)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="measure two profiles (files as tune writes them, or built-in names) against each other "
                        "where they plan copies differently: both plans forced at points drawn as --check draws "
                        "them, a tie where the interval of the ratio holds 1; writes no profile")
    return p


def _show(path: str) -> int:
    """The profile at ``path`` as a table (or why it cannot be used), then the active profile."""
    if os.path.exists(path):
        try:
            profile = read_profile(path)
        except ValueError as e:
            print(f"{path}: unusable profile: {e}")
        else:
            print(f"tuned profile {path}:")
            print(format_profile(profile))
            rec = (profile.get("provenance") or {}).get("check")
            if rec is not None:
                try:
                    print(check_words(rec))
                except (KeyError, TypeError, ValueError, IndexError):
                    print("held-out check: the record in the file is not in tune's format")
    else:
        print(f"no tuned profile at {path} (run python -m fastcopy tune)")
    print()
    print("active profile:")
    print(json.dumps(_core.active_profile(), indent=1, default=str))
    return 0


def _reset(p: argparse.ArgumentParser, args: argparse.Namespace, path: str) -> int:
    """Removes the profile at ``path``; a file named by --output only when it is a fastcopy profile."""
    if not os.path.lexists(path):
        print(f"no tuned profile at {path}: nothing to remove")
        return 0
    if args.output is not None:
        why = not_a_profile(path)
        if why:
            p.error(f"argument --output: {path} is not a fastcopy profile ({why}); --reset removes only profiles")
    try:
        os.remove(path)
    except OSError as e:
        p.error(f"argument --output: cannot remove {path}: {e.strerror or e}")
    print(f"removed {path}")
    return 0


def _measure(args: argparse.Namespace, path: str) -> int:
    """Measures, prints the profile and the changes, and writes it (not with --dry-run)."""
    command = "python -m fastcopy tune" + (" --quick" if args.quick else "")
    try:
        profile = tune(quick=args.quick, grid=args.grid, repeats=args.repeats, min_time=args.min_time,
                       progress=args.progress, write=False, verbose=True, command=command)
    except KeyboardInterrupt:
        print("interrupted; nothing written", file=sys.stderr)
        return 130
    except MemoryError:
        print("python -m fastcopy tune: not enough memory for the largest size (use --grid)", file=sys.stderr)
        return 1
    if args.dry_run:
        return 0
    # Written here rather than by tune(): should the write fail after the measurement (a full
    # disk), the profile goes to stdout instead of being lost.
    try:
        write_profile(path, profile)
    except OSError as e:
        print(profile_text(profile), end="")
        print(f"python -m fastcopy tune: cannot write {path}: {e.strerror or e}; the profile is on stdout above "
              f"(save it and load it with FASTCOPY_PROFILE=FILE)", file=sys.stderr)
        return 1
    print(f"profile written to {path}")
    return 0


def run_cli(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: List[str]) -> int:
    p = subparser(parser, "tune")
    if args.compare:
        from .compare import run_compare_cli

        return run_compare_cli(p, args, argv)
    if args.check:
        from .check import run_check_cli

        return run_check_cli(p, args, argv)
    from .check import refuse_check_options

    refuse_check_options(p, args)
    path = args.output if args.output is not None else default_output()
    # Checked before anything is read, removed or measured: a device, a FIFO (reading it hangs),
    # a directory or a folder such as /proc is refused, never replaced or written into.
    if args.output is not None:
        problem = not_regular(path) if args.show else output_problem(path)
        if problem:
            p.error(f"argument --output: {problem}")
    if args.show:
        return _show(path)
    if args.reset:
        return _reset(p, args, path)
    return _measure(args, path)
