"""Import cost of fastcopy on top of numpy, in fresh interpreters, interleaved.

Target: `import fastcopy` adds at most 10 % to the time of `import numpy`.
Run: python benchmarks/import_time.py [--runs 21]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python": "pass",
    "numpy": "import numpy",
    "numpy+fastcopy": "import numpy, fastcopy",
}


def one(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    samples = {k: [] for k in CASES}
    for _ in range(args.runs):  # interleaved, so drift hits every case alike
        for name, code in CASES.items():
            samples[name].append(one(code))
    med = {k: statistics.median(v) for k, v in samples.items()}
    for name, value in med.items():
        print(f"{name:<16} median {value * 1e3:7.1f} ms  (min {min(samples[name]) * 1e3:.1f}, max {max(samples[name]) * 1e3:.1f})")
    numpy_cost = med["numpy"] - med["python"]
    extra = med["numpy+fastcopy"] - med["numpy"]
    print(f"import numpy costs {numpy_cost * 1e3:.1f} ms; fastcopy adds {extra * 1e3:.1f} ms "
          f"= {100 * extra / numpy_cost:+.1f} % of import numpy (target <= 10 %)")


if __name__ == "__main__":
    main()
