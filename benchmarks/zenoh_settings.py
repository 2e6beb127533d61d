"""Loopback throughput of plain Zenoh (fastcopy.net.bench.zenoh_plain: put of tobytes,
to_bytes at the receiver, two sessions in this process) under the Zenoh settings that could
matter for large arrays: the data queue's length, the receive buffer, QoS, and (reported as
failures when they cannot carry the message) small batches and the low-latency transport.
Each variant changes Zenoh's defaults at the paths it names. Medians of 5 interleaved rounds, GB/s.

    python benchmarks/zenoh_settings.py
"""
from __future__ import annotations

import statistics
import sys

from fastcopy.net.bench import zenoh_plain

SETTINGS = {
    "default": {},
    "data_queue_16": {"transport/link/tx/queue/size/data": 16},
    "rx_buffer_16M": {"transport/link/rx/buffer_size": 16 << 20},
    "qos_off": {"transport/unicast/qos/enabled": False},
    "rx_buffer_16M+qos_off": {"transport/link/rx/buffer_size": 16 << 20, "transport/unicast/qos/enabled": False},
    "batch_8K": {"transport/link/tx/batch_size": 8192},
    "lowlatency": {"transport/unicast/lowlatency": True, "transport/unicast/qos/enabled": False},
}


def main() -> None:
    for size, count in ((1 << 20, 60), (16 << 20, 12)):
        res = {k: [] for k in SETTINGS}
        errors = {}
        for _ in range(5):
            for name, settings in SETTINGS.items():
                if name in errors:  # failed once (each failure waits out a receive timeout)
                    continue
                try:
                    res[name].append(size * count / zenoh_plain(size, count, settings) / 1e9)
                except Exception as exc:  # noqa: BLE001 - a setting that cannot carry the message
                    errors[name] = f"{type(exc).__name__}: {exc}"
        cells = [f"{k} {statistics.median(v):.2f}" for k, v in res.items() if v]
        print(f"{size >> 20:>3} MiB  " + "  ".join(cells), flush=True)
        for name, why in errors.items():
            print(f"        {name}: failed ({why})", file=sys.stderr)


if __name__ == "__main__":
    main()
