"""The measurement engine shared by every benchmark (``fastcopy.bench.copy``, ``batch``, ``ipc``,
``topic``) and by ``python -m fastcopy tune``.

Buffers (page-aligned, at chosen ``(dst - src) mod 4096`` offsets, in private memory or in a
real POSIX shared-memory mapping, per size or cut from one arena per run), the two cache modes,
calibrated timing loops, interleaved repeats, the order of repeats, medians, spreads and the
words for a ratio of medians.

Cache modes:

- ``hot``: the same source and destination every iteration, so after the first copy both sit
  in the caches that hold them. What a loop that copies one buffer over and over sees, and
  what users of small copies see.
- ``cold``: each iteration copies a different source into a different destination, walking a
  rotation of buffers whose sources together hold at least twice the L3 size, so every source
  has been evicted from the caches by the time it is read again. What a copy of data that was
  not touched recently sees. For small sizes the rotation is capped at
  ``COLD_MAX_BUFFERS`` buffers; results say when the rotation was smaller than the L3
  (the source may then still be cached in L3).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .units import PAGE

CACHE_MODES = ("hot", "cold")
# A cold rotation's sources hold at least this many times the L3 size.
COLD_L3_FACTOR = 2
# At most this many buffers in one cold rotation (small sizes: a million numpy views would take
# seconds to build; the rotation then holds less than the L3 and says so).
COLD_MAX_BUFFERS = 16384
# When the L3 size is unknown: a typical server L3 slice.
DEFAULT_L3_BYTES = 32 << 20

Timer = Callable[[int], float]


# ----------------------------------------------------------------------------- caches

def cache_sizes() -> Tuple[int, int]:
    """(L2, L3) sizes in bytes from fastcopy's CPU detection; defaults when unknown."""
    from .. import _core

    facts = _core.cpu_facts()
    l2 = int(facts.get("l2_bytes") or 0) or 512 << 10
    l3 = int(facts.get("l3_bytes") or 0) or DEFAULT_L3_BYTES
    return l2, l3


def cold_rotation_count(size: int, l3: Optional[int] = None) -> int:
    """Buffers in a cold rotation for copies of ``size`` bytes: sources of >= 2x the L3, capped."""
    l3 = l3 or cache_sizes()[1]
    return max(1, min(COLD_MAX_BUFFERS, math.ceil(COLD_L3_FACTOR * l3 / max(size, 1))))


# ----------------------------------------------------------------------------- buffers

def aligned_buffer(nbytes: int, align: int = PAGE) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose first byte is ``align``-aligned (numpy over-allocation)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes]


def _fill_pattern(a: np.ndarray) -> None:
    if a.size <= 1 << 16:
        a[:] = (np.arange(a.size, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8)
    else:
        a[:] = np.resize(np.arange(251, dtype=np.uint8), a.size)


class SharedBuffer:
    """``nbytes`` of a real POSIX shared-memory mapping (shm_open + mmap: the memory fastcopy.shm
    rings live in), page-aligned, as a uint8 array.

    The segment's name is removed as soon as it is mapped (the memory stays until ``close()``
    unmaps it): nothing is left in /dev/shm if the process dies, and no resource-tracker
    process is started, as ``multiprocessing.shared_memory`` would start one (under qemu-user
    such a tracker died in the middle of a CI run). Views handed out must be dropped before
    ``close()``, else the mapping goes with the process.
    """

    def __init__(self, nbytes: int):
        import _posixshmem  # type: ignore[import-not-found,unused-ignore]
        import mmap
        import secrets

        size = max(nbytes, 1)
        self.name = f"/fastcopy-measure-{os.getpid()}-{secrets.token_hex(6)}"
        fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            _posixshmem.shm_unlink(self.name)
            os.ftruncate(fd, size)
            self._map: Optional[mmap.mmap] = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array: Optional[np.ndarray] = np.frombuffer(self._map, dtype=np.uint8, count=nbytes)

    def close(self) -> None:
        if self._map is None:
            return
        self.array = None
        mapping, self._map = self._map, None
        try:
            mapping.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass

    def __enter__(self) -> "SharedBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Buffers:
    """A page-aligned source and a destination placed at each requested (dst - src) mod 4096.

    ``cache='hot'``: one source ``src`` and one destination per offset in ``dst``.
    ``cache='cold'``: a rotation of ``count`` sources ``srcs`` and destinations ``dsts[offset]``
    (``src``/``dst`` are the first of each) cut from two arenas at the same stride, so every pair
    keeps the offset. ``rotation_bytes``: bytes of source the rotation walks through.
    """

    def __init__(self, size: int, offsets: Sequence[int], cache: str = "hot", l3: Optional[int] = None):
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}, got '{cache}'")
        self.size, self.cache = size, cache
        self.count = cold_rotation_count(size, l3) if cache == "cold" else 1
        stride = -(-size // 64) * 64 if self.count > 1 else size
        self.stride = stride
        self._src_raw = aligned_buffer(stride * (self.count - 1) + size)
        _fill_pattern(self._src_raw)
        self._dst_raw = aligned_buffer(stride * (self.count - 1) + size + PAGE)
        self._dst_raw.fill(0)  # fault the pages in before timing
        self.srcs = [self._src_raw[i * stride:i * stride + size] for i in range(self.count)]
        self.src = self.srcs[0]
        self.dsts = {off: [self._dst_raw[off + i * stride:off + i * stride + size] for i in range(self.count)]
                     for off in sorted(set(offsets))}
        self.dst = {off: d[0] for off, d in self.dsts.items()}
        self.rotation_bytes = self.count * size

    def pairs(self, offset: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.dsts[offset], self.srcs))




class Arena:
    """Private and POSIX shared memory of ``nbytes`` each, faulted in once and lent to every
    SizeMemory of a run (mapping a gigabyte afresh for each large size costs more system time
    than the copies measured there)."""

    def __init__(self, nbytes: int, shared: bool = True):
        self.private = aligned_buffer(nbytes)
        self.private.fill(0x5A)  # faults the pages in (content does not change a copy's speed)
        head = min(nbytes, 1 << 16)
        self.private[:head] = np.resize(np.arange(251, dtype=np.uint8), head)
        self.shm: Optional[SharedBuffer] = SharedBuffer(nbytes) if shared else None
        self.shared: Optional[np.ndarray] = self.shm.array if self.shm is not None else None
        if self.shared is not None:
            self.shared.fill(7)

    def close(self) -> None:
        self.shared = None
        if self.shm is not None:
            self.shm.close()


# Backward overlap in SizeMemory: dst = src + this many bytes (at most half the size).
BACKWARD_SHIFT = 4096 + 64


def slot_bytes(size: int) -> int:
    """Bytes of one SizeMemory slot for copies of ``size`` bytes: the source and the destination
    each at most a page past where a page-rounded ``size`` plus a page starts, and a page more
    for a source that starts inside its first page."""
    return 2 * (-(-size // PAGE) * PAGE + PAGE) + PAGE


class SizeMemory:
    """Buffers for copies of ``size`` bytes in each region (``"private"``: private memory;
    ``"to_shared"``/``"from_shared"``: the destination or the source in a POSIX shared-memory
    mapping): ``count`` slots (cold rotations
    use several), from ``arena`` when it is large enough, else its own. A slot holds a source
    ``start`` bytes into its first page and a destination one page-rounded size plus a page
    later, so every offset keeps its (dst - src) mod 4096; backward copies run inside one slot
    (dst = src + shift)."""

    def __init__(self, size: int, count: int, shared: bool, arena: Optional[Arena] = None):
        self.size, self.count = size, count
        self.dst_at = -(-size // PAGE) * PAGE + PAGE
        self.slot = slot_bytes(size)
        need = self.slot * count
        self._own: Optional[Arena] = None
        if arena is None or arena.private.size < need or (shared and arena.shared is None):
            arena = self._own = Arena(need, shared)
        self.private = arena.private[:need]
        self.shared: Optional[np.ndarray] = arena.shared[:need] if shared and arena.shared is not None else None

    def pairs(self, region: str, offset: int, backward: bool = False, start: int = 0
              ) -> List[Tuple[np.ndarray, np.ndarray]]:
        """(dst, src) per slot, src ``start`` bytes (0 to PAGE - 1) into the slot: dst at
        ``offset`` from src mod 4096, or, ``backward``, overlapping with dst above src by
        ``offset`` bytes (0 < offset < size; else by BACKWARD_SHIFT, at most half the size)."""
        if not 0 <= start < PAGE:
            raise ValueError(f"SizeMemory.pairs: start must be 0 to {PAGE - 1}, got {start}")
        n, out = self.size, []
        for i in range(self.count):
            base = i * self.slot + start
            if backward:
                mem = self.private if region == "private" else self.shared
                assert mem is not None
                shift = offset if 0 < offset < n else max(1, min(BACKWARD_SHIFT, n // 2))
                out.append((mem[base + shift:base + shift + n], mem[base:base + n]))
                continue
            dst_mem = self.shared if region == "to_shared" else self.private
            src_mem = self.shared if region == "from_shared" else self.private
            assert dst_mem is not None and src_mem is not None
            d0 = base + self.dst_at + offset
            out.append((dst_mem[d0:d0 + n], src_mem[base:base + n]))
        return out

    def close(self) -> None:
        self.shared = None
        if self._own is not None:
            self._own.close()


# ----------------------------------------------------------------------------- timers

def rotating_timer(copy_one: Callable[[Any, Any], Any]) -> Callable[[List[Tuple[Any, Any]]], Timer]:
    def make(pairs: List[Tuple[Any, Any]]) -> Timer:
        pc = time.perf_counter
        cycle, islice = itertools.cycle, itertools.islice

        def run(n: int) -> float:
            it = islice(cycle(pairs), n)
            t0 = pc()
            for d, s in it:
                copy_one(d, s)
            return pc() - t0
        return run
    return make


def loop_timer(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], Callable[[int], float]]:
    def make(dst: np.ndarray, src: np.ndarray) -> Callable[[int], float]:
        pc = time.perf_counter

        def run(n: int) -> float:
            r = range(n)
            t0 = pc()
            for _ in r:
                f(dst, src)
            return pc() - t0
        return run
    return make


def torch_module() -> Optional[Any]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    # Idle OpenMP workers of torch spin for a while after each parallel copy; interleaved with the
    # other variants that spinning steals their CPU time. Passive waiting keeps the comparison fair
    # (an explicit OMP_WAIT_POLICY is respected). Only effective before torch's OpenMP starts.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch  # type: ignore[import-not-found]

        return torch
    except Exception:  # a broken torch install must not break the benchmark
        return None


# ----------------------------------------------------------------------------- measurement

class Progress:
    """A one-line bar on stderr, shown only on a terminal and only once a run has taken ~2 s."""

    def __init__(self, total: int, enabled: Optional[bool] = None, delay: float = 2.0):
        self.total, self.done = max(total, 1), 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start, self.delay, self.shown = time.monotonic(), delay, False

    def step(self, label: str, n: int = 1) -> None:
        self.done += n
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return
        width = 30
        fill = int(width * self.done / self.total)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * self.done // self.total:3d}% {label:<24}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 64 + "\r")
            sys.stderr.flush()


def calibrate(run: Callable[[int], float], min_time: float) -> int:
    """Loop length n with run(n) >= min_time (the first call doubles as the warm-up)."""
    run(1)
    n = 1
    while True:
        t = run(n)
        if t >= min_time:
            return n
        n = max(n * 2, int(math.ceil(n * min_time * 1.2 / max(t, 1e-9))))
        n = min(n, 1 << 30)


# ----------------------------------------------------------------------------- interleaved timing

def spread(samples: Sequence[float]) -> float:
    """Relative spread of samples around their median: the interquartile range over the median
    with 4 or more samples, else half the range over the median (0 for one sample)."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    if len(samples) >= 4:
        q = statistics.quantiles(samples, n=4, method="inclusive")
        return (q[2] - q[0]) / med
    return (max(samples) - min(samples)) / 2 / med


def paired_spread(a: Sequence[float], b: Sequence[float]) -> Optional[List[float]]:
    """The middle half (25th to 75th percentile) of the ratios a[k] / b[k] of two transports'
    measurements in the same repeat k (repeats are interleaved, so each pair saw the same
    machine load); None with fewer than two pairs. A spread that contains 1.0 means the two
    transports are not told apart in this run."""
    pairs = [x / y for x, y in zip(a, b) if y > 0]
    if len(pairs) < 2:
        return None
    q = statistics.quantiles(pairs, n=4, method="inclusive")
    return [q[0], q[2]]


# Printed under a table in which some ratio carries the mark of ratio_words().
SPREAD_DISAGREES_NOTE = (
    "! the ratio of medians lies far outside the middle half of the paired ratios: the machine changed speed "
    "during the run (some repeats were much slower for every variant), so the two medians came from different "
    "states; read the bracket, or rerun on a quieter machine")


def ratio_words(ratio: float, spread_pair: Optional[Sequence[float]]) -> Tuple[str, bool]:
    """A ratio of medians as printed, ``"1.23x (1.10-1.30)"``, with its paired spread in brackets,
    and whether the two disagree; then the words end in ``" !"`` (see SPREAD_DISAGREES_NOTE).

    They disagree when the ratio of medians lies beyond Tukey's fences of the paired ratios:
    more than 1.5 times the bracket's width below or above it. That happens when the machine
    switches between a fast and a slow state for seconds at a time: the repeats still pair up,
    but each side's median can land in a different state (evidence: bench-ratio-outside-bracket).
    A ratio just outside its bracket is ordinary (the round-trip median is over all round trips,
    the bracket over each repeat's median), hence the fences.
    """
    words = f"{ratio:.2f}x"
    if not spread_pair:
        return words, False
    lo, hi = spread_pair
    fence = 1.5 * (hi - lo)
    outside = not lo - fence <= ratio <= hi + fence
    return words + f" ({lo:.2f}-{hi:.2f})" + (" !" if outside else ""), outside


def repeat_order(names: Sequence[Any], repeat: int) -> List[Any]:
    """The order in which repeat number ``repeat`` runs ``names``: the list rotated by one place
    every two repeats, every other repeat reversed (for three names: ABC, CBA, BCA, BAC, CAB,
    ACB). Over ``2 * len(names)`` repeats each name goes first equally often, and runs right
    after its neighbour on either side of the list equally often (after every other name, for up
    to three names). Benchmarks between processes need it: with one fixed order, the transport
    that runs right after another can lose a few per cent, so a ratio follows the order, not the
    transports (evidence: bench-fixed-order-bias)."""
    k = len(names)
    if k == 0:
        return []
    base = list(names) if repeat % 2 == 0 else list(reversed(names))
    shift = (repeat // 2) % k
    return base[shift:] + base[:shift]


def order_balance_words(what: str, count: int, repeats: int) -> Optional[str]:
    """A note for a report whose ``repeats`` ran ``count`` ``what`` in :func:`repeat_order`, when
    they cannot have been balanced: each runs at each place in the order equally often only
    over a multiple of ``2 * count`` repeats (of 2 for two things, whose two orders alternate).
    None when balanced, or with one thing."""
    period = 2 if count == 2 else 2 * count
    if count < 2 or repeats % period == 0:
        return None
    return (f"the order of the {count} {what} changed every repeat, but {repeats} repeats do not balance it "
            f"(each at each place equally often takes a multiple of {period}): ratios between them may "
            f"follow the order; use --repeats {period * -(-repeats // period)} where they matter")


def time_interleaved(timers: Dict[str, Timer], iterations: int, repeats: int,
                     rng: Optional[random.Random] = None) -> Dict[str, List[float]]:
    """Seconds per copy of each timer, ``repeats`` samples each: every repeat runs each timer once
    for ``iterations`` copies, in a new random order, so drift and neighbours hit all alike."""
    rng = rng or random.Random(12345)
    names = list(timers)
    out: Dict[str, List[float]] = {k: [] for k in names}
    for _ in range(repeats):
        rng.shuffle(names)
        for k in names:
            out[k].append(timers[k](iterations) / iterations)
    return out


def exit_with_parent(poll: float = 0.5) -> None:
    """In a benchmark's child process: ends the process (exit status 3) once its parent is gone.
    A parent killed outright never says stop, and a child blocked in a transport's receive (a
    pyzmq or Zenoh socket waiting for the next message) would otherwise wait for ever. A daemon
    thread looks every ``poll`` seconds whether the parent has changed (Linux gives an orphan a
    new parent)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(3)

    threading.Thread(target=watch, name="exit with parent", daemon=True).start()

