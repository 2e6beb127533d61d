"""Command line: ``python -m fastcopy info [--json]``."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastcopy")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="what was detected and which kernel each copy gets")
    p_info.add_argument("--json", action="store_true", help="print as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        from ._report import print_info

        print_info(as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
