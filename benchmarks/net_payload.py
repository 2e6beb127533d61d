"""What fastcopy.net's publisher pays to hand a message to Zenoh: zenoh.ZBytes of a bytes object
against a bytearray of the same size, and building the message (_core.net_encode: header plus
the array, one copy) against numpy's tobytes(). Medians of 7 interleaved repeats.

    PYTHONPATH=src python benchmarks/net_payload.py
"""
from __future__ import annotations

import os
import statistics
import timeit

import numpy as np

from fastcopy import _core


def main() -> None:
    import zenoh

    print(f"load average {os.getloadavg()[0]:.2f}; microseconds per call")
    for n in (64 << 10, 1 << 20, 16 << 20):
        env = {"zenoh": zenoh, "_core": _core, "a": np.ones(n, np.uint8), "b": bytes(n), "ba": bytearray(n)}
        stmts = {"ZBytes(bytes)": "zenoh.ZBytes(b)", "ZBytes(bytearray)": "zenoh.ZBytes(ba)",
                 "net_encode": "_core.net_encode(a, b'|u1', 0, 0, a.nbytes)", "tobytes": "a.tobytes()"}
        number = max(5, (64 << 20) // n // 8)
        times = {k: [] for k in stmts}
        for _ in range(7):
            for k, v in stmts.items():
                times[k].append(timeit.timeit(v, globals=env, number=number) / number * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{n >> 10:>6} KiB  " + "  ".join(f"{k} {v:.1f}" for k, v in med.items()) +
              f"  bytearray/bytes {med['ZBytes(bytearray)'] / med['ZBytes(bytes)']:.2f}x")


if __name__ == "__main__":
    main()
