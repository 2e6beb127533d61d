"""``python -m fastcopy bench``: its arguments and the run, handed to the copy benchmark
(copy.py), ``--batch`` (batch.py) or ``--ipc`` (ipc.py, topic.py); the formatting is in
report.py. See docs/benchmarks.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, List

from . import copy, engine, report, system, units
from .ipc_transports import VIEW_FILLS
from .paths import output_problem, write_whole


def typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so its ValueError becomes an argparse error naming the argument."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


# Most timed repeats one run may ask for: more is a typo (a run of days), not a measurement.
MAX_REPEATS = 100000
# Most threads --threads and --torch-threads may ask for (fastcopy.set_threads' own bound).
MAX_THREADS = 1024


def int_at_least(minimum: int, maximum: int = MAX_REPEATS) -> Callable[[str], int]:
    """A parser for whole numbers from minimum (1 for counts, 0 where 0 means "the default") to
    maximum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"cannot parse '{text}' (expected a whole number)") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise ValueError(f"must be at most {maximum}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def positive_float(text: str) -> float:
    """Seconds for --min-time: a finite number above 0 and at most units.MAX_MIN_TIME."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"cannot parse '{text}' (expected seconds, e.g. 0.02)") from None
    if not value > 0:
        raise ValueError(f"must be positive, got {text}")
    if not value <= units.MAX_MIN_TIME:
        raise ValueError(f"must be at most {units.MAX_MIN_TIME:g} seconds, got {text}")
    return value


def offset_value(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"cannot parse '{text}' (expected 0-4095)") from None
    if not 0 <= value < 4096:
        raise ValueError(f"{value} is not in 0..4095")
    return value



def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds the ``bench`` subcommand to ``sub`` (argparse subparsers) and returns its parser."""
    p = sub.add_parser(
        "bench", help="measure copy bandwidth against numpy (and torch)",
        description="Copy bandwidth of fastcopy's automatic choice, each usable kernel, np.copyto, "
                    "dst[...] = src and torch's copy_ (when importable). GB/s count each byte once per copy "
                    "(STREAM counts it twice). See docs/benchmarks.md.")
    p.add_argument("--sizes", type=typed(units.parse_sizes), metavar="LIST",
                   help=f"sizes and ranges, e.g. '4K,1M' or '64:256M:x2' (default {units.DEFAULT_SIZES}; "
                        f"K/M/G are powers of 1024; a factor is finite and above 1; at most {units.MAX_SIZES} sizes)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run (sizes {units.QUICK_SIZES}, 3 repeats, 10 ms loops): under 30 s")
    p.add_argument("--repeats", type=typed(int_at_least(1)), metavar="N",
                   help=f"timed repeats per size, 1 to at most {MAX_REPEATS} (default 5)")
    p.add_argument("--min-time", type=typed(positive_float), metavar="SECONDS", dest="min_time",
                   help=f"shortest timed loop per repeat, above 0 and at most {units.MAX_MIN_TIME:g} seconds "
                        "(default 0.02)")
    p.add_argument("--variants", metavar="LIST",
                   help="comma list of variants: fastcopy, a kernel name (avx2 ...), kernels, np.copyto (copyto), "
                        "dst[...]=src (slice), torch.copy_ (torch), all (default: all); with --ipc: transports (channel, channel_alloc, channel_view, iceoryx2_view, iceoryx2_copy, faster_fifo, zmq, shared_memory, queue, pipe; missing packages are skipped), or 'topic' alone: Topic fan-out with 1 and 2 subscribers against Channel (default sizes 64K,1M,16M)")
    place = p.add_mutually_exclusive_group()
    place.add_argument("--offset", type=typed(offset_value), metavar="N",
                       help="place the destination so (dst - src) mod 4096 = N (default 0: both page-aligned)")
    place.add_argument("--offsets", type=typed(units.parse_offsets), metavar="mixed|LIST",
                       help=f"cycle (dst - src) mod 4096 per repeat: 'mixed' = {','.join(map(str, units.MIXED_OFFSETS))} "
                            "(includes 4K-aliasing cases) or a comma list")
    p.add_argument("--threads", type=typed(int_at_least(0, MAX_THREADS)), metavar="N",
                   help=f"fastcopy thread pool size (fastcopy.set_threads; 0 = default, at most {MAX_THREADS})")
    p.add_argument("--cpus", type=typed(units.parse_cpus), metavar="LIST",
                   help="pin this process to these CPUs, e.g. '0,2-3' (os.sched_setaffinity)")
    p.add_argument("--torch-threads", type=typed(int_at_least(0, MAX_THREADS)), metavar="N", dest="torch_threads",
                   help="torch.set_num_threads(N) for the torch variant (default: fastcopy's thread count, "
                        f"the same budget; 0 = torch's own default; at most {MAX_THREADS})")
    p.add_argument("--json", metavar="FILE",
                   help="save every sample with metadata as JSON (a regular file or a new name in an existing "
                        "folder, checked before the run; should the write fail, the JSON goes to stdout)")
    p.add_argument("--plot", metavar="FILE.png", help="plot bandwidth vs size (needs matplotlib: fastcopy[plot]; "
                                                      "a regular file or a new name)")
    p.add_argument("--format", choices=["table", "ucx"], default="table",
                   help="stdout format: the table (default) or ucx_info's '# Memcpy bandwidth:' block "
                        "for the automatic choice (then default sizes 4K:256M:x2)")
    p.add_argument("--batch", action="store_true",
                   help="measure batched copies instead: fastcopy.stack/concatenate/copy_many against numpy "
                        "and torch (fastcopy.bench.batch; repeats, min-time, threads, torch-threads, json apply)")
    p.add_argument("--ipc", action="store_true",
                   help="measure copies between two processes through fastcopy.shm.Channel instead "
                        "(against multiprocessing Queue and Pipe; sizes, repeats, min-time, variants apply)")
    p.add_argument("--loader", action="store_true",
                   help="measure fastcopy.torch.Loader against torch.utils.data.DataLoader instead (batches per "
                        "second, 2 workers; fastcopy.bench.loader; repeats, quick, json apply; needs torch)")
    p.add_argument("--view-fill", choices=list(VIEW_FILLS), default=None,
                   help="--ipc: how the zero-copy transports (channel_view, iceoryx2; with --variants topic the "
                        "*_view configurations) fill a loaned slot, the same for all: memmove (glibc memmove: ctypes.memmove or np.copyto; default) or fastcopy (fastcopy.copy)")
    p.add_argument("--net", action="store_true",
                   help="--ipc: also the network transports of fastcopy.net.bench over loopback tcp (net: "
                        "fastcopy.net, zenoh_plain: Zenoh put of tobytes, zmq_pubsub: pyzmq PUB/SUB copy=False), "
                        "then the bridge fan-out rows (one Bridge.into feeding 1 and 3 local Topic subscribers); "
                        "needs the net extra (eclipse-zenoh) and pyzmq")
    p.add_argument("--net-path", choices=("network", "host"), default="network",
                   help="--ipc --net: how Zenoh carries the payloads between the benchmark's peers: network "
                        "(default): its shared-memory transport off, every payload through TCP as between hosts; "
                        "host: Zenoh's defaults, payloads of 3 KiB and more through its shared memory, as between "
                        "peers of one host")
    p.add_argument("--cache", choices=list(engine.CACHE_MODES), default="hot",
                   help="hot: the same buffers every iteration (default); cold: each copy reads a different source "
                        "from a rotation of buffers holding at least twice the L3, so the source is not cached")
    return p


def need_matplotlib(p: argparse.ArgumentParser) -> None:
    from .plot import have_matplotlib

    if not have_matplotlib():
        p.error("argument --plot: needs matplotlib, which is not installed "
                "(pip install 'fastcopy[plot]' or pip install matplotlib)")


def check_outputs(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fail before a long run, not after it, when an output file cannot be written: an output is
    a regular file or a new name in a folder where files can be made (paths.output_problem)."""
    for option in ("json", "plot"):
        path = getattr(args, option, None)
        if path is not None:
            problem = output_problem(path)
            if problem:
                p.error(f"argument --{option}: {problem}")


def save_json(path: str, doc: Any, what: str) -> int:
    """Writes ``doc`` to ``path`` (whole or not at all) and says so; when that fails at the end of
    a run, prints the JSON to stdout instead, so the results are not lost, says why on stderr and
    returns 1 (else 0)."""
    text = json.dumps(doc, indent=1, default=str)
    try:
        write_whole(path, text)
    except OSError as e:
        print(text)
        print(f"python -m fastcopy bench: cannot write {path}: {e.strerror or e}; the JSON is on stdout above",
              file=sys.stderr)
        return 1
    print(f"\nsaved {what} to {path}")
    return 0


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: List[str]) -> int:
    """Runs ``bench`` with parsed ``args`` (``parser``: the whole command line's, for errors)."""
    p = subparser(parser, "bench")
    check_outputs(p, args)
    if args.plot:
        need_matplotlib(p)
    if args.cpus is not None:
        usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        present = os.cpu_count() or 0
        bad = [c for c in args.cpus if c >= present]
        if bad or not hasattr(os, "sched_setaffinity"):
            p.error(f"argument --cpus: CPU {bad[0] if bad else args.cpus[0]} is not available "
                    f"(this process may use {units.format_cpus(usable)})")
        try:
            os.sched_setaffinity(0, args.cpus)
        except OSError as e:
            p.error(f"argument --cpus: cannot pin to {units.format_cpus(args.cpus)}: {e.strerror}")
    import fastcopy

    if args.threads is not None:
        try:
            fastcopy.set_threads(args.threads)
        except (ValueError, RuntimeError) as e:
            p.error(f"argument --threads: {e}")

    quick = args.quick
    default_sizes = units.UCX_SIZES if args.format == "ucx" else (units.QUICK_SIZES if quick else units.DEFAULT_SIZES)
    sizes = args.sizes or units.parse_sizes(default_sizes)
    repeats = args.repeats or (3 if quick else 5)
    min_time = args.min_time or (0.01 if quick else 0.02)
    offsets = [args.offset] if args.offset is not None else (args.offsets or [0])

    if args.view_fill and not args.ipc:
        p.error("argument --view-fill: applies only to --ipc")
    if args.net and not args.ipc:
        p.error("argument --net: applies only to --ipc")
    if args.net_path != "network" and not args.ipc:
        p.error("argument --net-path: applies only to --ipc (its net transports)")
    if args.loader:
        from .loader import run_cli as run_loader

        return run_loader(p, args, argv)
    if args.ipc:
        return _ipc(p, args, argv)
    if args.batch:
        from .batch import run_cli

        return run_cli(p, args, argv)

    if args.variants is None:
        want_torch = args.format != "ucx"
    else:
        want_torch = any(w.strip() in ("torch", "torch.copy_", "all") for w in args.variants.split(","))
    all_variants, notes = copy.available_variants(with_torch=want_torch, torch_threads=args.torch_threads)
    if args.format == "ucx" and args.variants is None:
        variants = copy.select_variants(all_variants, "fastcopy")
    else:
        try:
            variants = copy.select_variants(all_variants, args.variants)
        except ValueError as e:
            p.error(f"argument --variants: {e}")

    energy = system.Rapl()
    meta = system.metadata([sys.executable, "-m", "fastcopy"] + argv)
    l2_bytes, l3_bytes = engine.cache_sizes()
    config = {"sizes": sizes, "repeats": repeats, "min_time": min_time, "offsets": offsets,
              "cache": args.cache, "l3_bytes": l3_bytes, "cold_l3_factor": engine.COLD_L3_FACTOR,
              "cold_max_buffers": engine.COLD_MAX_BUFFERS,
              "offset_mode": "mixed" if args.offsets == units.MIXED_OFFSETS else ("fixed" if len(offsets) == 1 else "list"),
              "variants": [v.name for v in variants],
              "variant_descriptions": {v.name: v.description for v in variants},
              "bytes_counted": "once per copy (STREAM counts twice)", "format": args.format}
    numa = system.numa_report()
    if args.format == "table":
        for line in report.header_lines(meta, config, energy.describe(), numa, notes):
            print(line)
        print(flush=True)
    progress = engine.Progress(len(sizes) * repeats)
    try:
        results = copy.run_bench(sizes, variants, repeats=repeats, min_time=min_time, offsets=offsets,
                                     energy=energy, progress=progress, cache=args.cache)
    except KeyboardInterrupt:
        progress.close()
        print("interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        progress.close()
        what = "a cold rotation" if args.cache == "cold" else "two buffers"
        print(f"python -m fastcopy bench: not enough memory for {what} of {units.human_size(max(sizes))}",
              file=sys.stderr)
        return 1
    progress.close()
    if args.format == "ucx":
        print(report.format_ucx(results))
    else:
        print(report.format_table(results, with_energy=energy.available))
    if args.json:
        doc = dict(meta)
        doc["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        doc.update({"kind": "bench", "config": config, "repeats": repeats, "offsets": offsets,
                    "energy": energy.describe(), "numa": numa, "variant_notes": notes, "results": results})
        status = save_json(args.json, doc, f"{len(results)} results with every sample")
    else:
        status = 0
    if args.plot:
        from .plot import plot_bench

        plot_bench(results, args.plot, title=f"fastcopy {meta['fastcopy_version']} on {meta.get('cpu_brand') or '?'}")
        print(f"plot written to {args.plot}")
    return status


def _topic(p: argparse.ArgumentParser, args: argparse.Namespace, argv: List[str], kwargs: dict) -> int:
    """``bench --ipc --variants topic``: Topic with 1 and 2 subscribers against Channel, with copies and
    with zero copy (fastcopy.bench.topic)."""
    from .topic import format_topic_table, run_topic_bench

    kwargs = {k: v for k, v in kwargs.items() if k != "transports"}
    try:
        results = run_topic_bench(**kwargs)
    except ValueError as e:
        p.error(f"argument --ipc: {e}")
    print(format_topic_table(results))
    if args.json:
        doc = system.metadata([sys.executable, "-m", "fastcopy"] + argv)
        doc.update({"kind": "ipc_topic", "config": results["config"], "topic": results, "results": results["rows"]})
        return save_json(args.json, doc, f"{len(doc['results'])} results")
    return 0


def _net_fanout(kwargs: dict) -> dict:
    """``bench --ipc --net``: the bridge fan-out rows (fastcopy.net.bench.run_fanout: one bridge
    feeding 1 and 3 local Topic subscribers) at the --sizes and --repeats given, printed after the
    table; a setup that fails is reported as skipped, as a transport's is."""
    from ..net import bench as net_bench

    try:
        res = net_bench.run_fanout(**{k: kwargs[k] for k in ("sizes", "repeats") if k in kwargs})
    except (RuntimeError, ValueError, OSError) as e:
        print(f"skipped net fan-out: {type(e).__name__}: {e}")
        return {"skipped": f"{type(e).__name__}: {e}"}
    print(net_bench.format_fanout(res))
    return res


def _ipc(p: argparse.ArgumentParser, args: argparse.Namespace, argv: List[str]) -> int:
    """``bench --ipc``: fastcopy.shm.Channel (copy and zero copy) against the alternatives (fastcopy.bench.ipc)."""
    for option, given in (("--offset", args.offset is not None), ("--offsets", args.offsets is not None),
                          ("--plot", bool(args.plot)), ("--format ucx", args.format == "ucx"),
                          ("--torch-threads", args.torch_threads is not None),
                          ("--cache cold", args.cache == "cold")):
        if given:
            p.error(f"argument --ipc: {option} does not apply to the inter-process benchmark")
    from .ipc import format_ipc_table, run_ipc_bench

    kwargs: dict = {}
    if args.sizes:
        kwargs["sizes"] = args.sizes
    if args.repeats or args.quick:
        kwargs["repeats"] = args.repeats or 3
    if args.min_time or args.quick:
        kwargs["min_time"] = args.min_time or 0.05
    if args.variants:
        kwargs["transports"] = [w.strip() for w in args.variants.split(",") if w.strip()]
    if args.view_fill:
        kwargs["view_fill"] = args.view_fill
    if kwargs.get("transports") == ["topic"]:
        if args.net:
            p.error("argument --net: does not apply to --variants topic")
        return _topic(p, args, argv, kwargs)
    from .ipc_transports import DEFAULT_TRANSPORTS, NET_TRANSPORTS

    if args.net:
        import importlib

        for _name, module, pip, _words in NET_TRANSPORTS:
            try:
                importlib.import_module(module)
            except ImportError:
                p.error(f"argument --net: {module} is not installed: pip install 'fastcopy[net]' "
                        f"(the net extra) or pip install {pip.split()[0]}")
        names = kwargs.get("transports", list(DEFAULT_TRANSPORTS))
        kwargs["transports"] = names + [n for n, *_ in NET_TRANSPORTS if n not in names]
    zenoh_rows = [n for n, module, *_ in NET_TRANSPORTS if module == "zenoh" and n in kwargs.get("transports", [])]
    if zenoh_rows:
        from ..net import bench as net_bench

        net_bench.path = args.net_path
    try:
        results = run_ipc_bench(**kwargs)
    except ValueError as e:
        p.error(f"argument --{'variants' if 'transport' in str(e) else 'ipc'}: {e}")
    print(format_ipc_table(results))
    if zenoh_rows:
        print(f"{', '.join(zenoh_rows)}: {net_bench.path_note()}")
    fanout = _net_fanout(kwargs) if args.net else None
    if args.json:
        doc = system.metadata([sys.executable, "-m", "fastcopy"] + argv)
        config = {k: v for k, v in kwargs.items()}
        if zenoh_rows:
            config["net_path"] = args.net_path
        doc.update({"kind": "ipc", "config": config, "ipc": results,
                    "results": results.get("rows", []) if isinstance(results, dict) else list(results)})
        if fanout is not None:
            doc["net_fanout"] = fanout
        return save_json(args.json, doc, f"{len(doc['results'])} results")
    return 0


