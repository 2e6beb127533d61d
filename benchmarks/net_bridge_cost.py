"""What a receiving bridge costs as built, against each of its two savings turned off: a
fastcopy.net.Publisher (this process) -> tcp/127.0.0.1 -> Bridge.into (a child process) -> a local
Topic -> one subscriber (a child process) reading recv_view, as fastcopy.net.bench.run_fanout
measures it. Variants, alternated RUNS times:
  built            keep_freed_memory() in the bridge's process, messages in pieces assembled
                   in a loan of its Topic (what ``python -m fastcopy bridge`` runs);
  default-memory   without keep_freed_memory();
  apart            Bridge.into(in_place=False): assembled apart, then sent (one more copy).
Per size and variant: the medians over the runs of the throughput and of the bridge's and the
publisher's CPU microseconds per message.

    python benchmarks/net_bridge_cost.py [SIZES_KIB [RUNS]]     (default 256,1024,4096,16384 and 4)
"""
from __future__ import annotations

import statistics
import sys

VARIANTS = {"built": (True, True), "default-memory": (False, True), "apart": (True, False)}


def main(argv) -> None:
    from fastcopy.net.bench import run_fanout

    sizes = [int(x) << 10 for x in (argv[0] if argv else "256,1024,4096,16384").split(",")]
    runs = int(argv[1]) if len(argv) > 1 else 4
    got = {name: {s: [] for s in sizes} for name in VARIANTS}
    for _ in range(runs):
        for name, (keep, in_place) in VARIANTS.items():
            res = run_fanout(sizes=sizes, subscribers=(1,), repeats=5, total=256 << 20, keep_memory=keep,
                             in_place=in_place)
            for row in res["rows"]:
                cpu = row["cpu_us"][1]
                got[name][row["size"]].append((row["gbps"][1][0], cpu["bridge"], cpu["publisher"]))
    for s in sizes:
        built = statistics.median(x[0] for x in got["built"][s])
        for name in VARIANTS:
            med = [statistics.median(x[i] for x in got[name][s]) for i in range(3)]
            print(f"{s >> 10:>6} KiB  {name:15s} {med[0]:5.2f} GB/s (built / this {built / med[0]:.2f}x)  "
                  f"bridge {med[1]:6.0f} us  publisher {med[2]:6.0f} us per message")


if __name__ == "__main__":
    main(sys.argv[1:])
