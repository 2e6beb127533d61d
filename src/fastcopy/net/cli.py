"""``python -m fastcopy bridge``: runs one Bridge until interrupted (docs/net.md)."""
from __future__ import annotations

import argparse
from typing import Any


def add_bridge_parser(sub: Any) -> None:
    p = sub.add_parser("bridge", help="carry a local shm Topic over a Zenoh key (needs fastcopy[net])",
                       description="--out (default): publish the local Topic NAME to KEY. --into: subscribe to "
                                   "KEY and republish into a new local Topic NAME (needs --slot-bytes).")
    p.add_argument("--topic", required=True, metavar="NAME")
    p.add_argument("--key", required=True, metavar="KEY")
    way = p.add_mutually_exclusive_group()
    way.add_argument("--out", dest="direction", action="store_const", const="out", default="out")
    way.add_argument("--into", dest="direction", action="store_const", const="into")
    p.add_argument("--listen", action="append", default=[], metavar="ENDPOINT", help="e.g. tcp/0.0.0.0:7447")
    p.add_argument("--connect", action="append", default=[], metavar="ENDPOINT", help="e.g. tcp/hostA:7447")
    p.add_argument("--overflow", choices=("block", "drop"), default="block")
    p.add_argument("--slot-bytes", type=int, default=0, metavar="N")
    p.add_argument("--slots", type=int, default=None, metavar="N")


def run(args: argparse.Namespace) -> int:
    from . import Bridge, keep_freed_memory

    keep_freed_memory()  # a process of its own that receives or sends large messages
    try:
        bridge = Bridge(args.direction, args.topic, args.key, listen=args.listen, connect=args.connect,
                        overflow=args.overflow, slot_bytes=args.slot_bytes, slots=args.slots)
    except (ImportError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"python -m fastcopy bridge: {exc}")
        return 2
    print(f"bridge {args.direction} topic={args.topic} key={args.key} ready", flush=True)
    try:
        bridge.run()
    except KeyboardInterrupt:
        pass
    finally:
        bridge.close()
    return 0
