"""fastcopy.shm.Channel between real processes (spawn and fork): a 100,000-message stress
run with content checks, killed producers and consumers, corrupt and hostile segments
(in a subprocess, to prove there is no crash), cleanup of /dev/shm, no resource_tracker
warnings, and the example of docs/shm.md run as written.

Each scenario runs as a script in a fresh interpreter, so its exit status and stderr are its
own. FASTCOPY_NO_SUBPROCESS=1 skips them all."""

from __future__ import annotations

import os
import time
from pathlib import Path

import _child
from _child import shm_names
import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

ROOT = Path(__file__).resolve().parents[2]
# Children import the same fastcopy as this process: the installed package in CI, src/ with a
# developer build (a plain checkout's src/ has no compiled _core).
PREFIX = f"fctp-{os.getpid()}-"


_remove_this_runs_segments = _child.leftovers_fixture(PREFIX, fail=False)


def run_script(tmp_path: Path, code: str, *args: str, timeout: float = 120.0):
    # PYTHONWARNINGS=always: any resource_tracker warning or ResourceWarning shows.
    return _child.run_script(tmp_path, code, *args, timeout=timeout, env=_child.child_env(PYTHONWARNINGS="always"))


def assert_clean(proc, prefix: str):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for bad in ("resource_tracker", "leaked", "Traceback", "Warning"):
        assert bad not in proc.stderr, proc.stderr
    assert shm_names(prefix) == set(), "segments left in /dev/shm"


# ---- 100,000 messages of random sizes ---------------------------------------------------------
STRESS = r"""
import multiprocessing as mp
import sys
import time

import numpy as np

from fastcopy.shm import Channel, ChannelClosed

POOL_BYTES = 8 << 20

def plan(seed, n):
    rng = np.random.default_rng(seed)
    # Log-uniform sizes 1 B .. 64 KiB, 2% empty, and every 2000th message log-uniform
    # 64 KiB .. 6 MiB (the ring is 1 MiB, so those are split and reassembled).
    sizes = np.exp(rng.random(n) * np.log(65536.0)).astype(np.int64)
    sizes[rng.random(n) < 0.02] = 0
    big = (np.arange(n) % 2000) == 1999
    sizes[big] = np.exp(rng.uniform(np.log(65536.0), np.log(6 << 20), int(big.sum()))).astype(np.int64)
    kinds = rng.integers(0, 4, n)
    offsets = (rng.random(n) * (POOL_BYTES - sizes)).astype(np.int64)
    pool = np.random.default_rng(seed + 1).integers(0, 256, POOL_BYTES, dtype=np.uint8)
    return sizes.tolist(), kinds.tolist(), offsets.tolist(), pool

def message(pool, kind, size, off):
    raw = pool[off:off + size]
    if kind == 0:
        return raw                                   # uint8, 1-D
    if kind == 1:
        n8 = size // 8
        a = raw[:n8 * 8].view("<f8")
        return a.reshape(-1, 4) if n8 % 4 == 0 else a  # float64, 2-D when it can
    if kind == 2:
        return raw.tobytes()                         # bytes: comes back as uint8
    n2 = size // 2
    return raw[:n2 * 2].view(">i2")                  # big-endian int16

def producer(name, seed, n):
    sizes, kinds, offsets, pool = plan(seed, n)
    ch = Channel.attach(name)
    for i in range(n):
        ch.send(message(pool, kinds[i], sizes[i], offsets[i]), timeout=60)
    ch.close()

def main(method, n, name):
    seed = 1234
    ctx = mp.get_context(method)
    with Channel.create(name, capacity=1 << 20) as ch:
        p = ctx.Process(target=producer, args=(name, seed, n))
        p.start()
        sizes, kinds, offsets, pool = plan(seed, n)
        total = 0
        t0 = time.perf_counter()
        for i in range(n):
            exp = message(pool, kinds[i], sizes[i], offsets[i])
            if kinds[i] == 2:
                exp = pool[offsets[i]:offsets[i] + sizes[i]]
            if i % 5 == 0:
                got = ch.recv(out=np.empty(exp.shape, exp.dtype), timeout=60)
            else:
                got = ch.recv(timeout=60)
            if got.dtype != exp.dtype or got.shape != exp.shape:
                raise SystemExit(f"message {i}: got {got.dtype}{got.shape}, expected {exp.dtype}{exp.shape}")
            if not np.array_equal(got.reshape(-1).view(np.uint8), exp.reshape(-1).view(np.uint8)):
                raise SystemExit(f"message {i}: content differs (size {sizes[i]})")
            total += got.nbytes
        try:
            extra = ch.recv(timeout=60)
            raise SystemExit(f"an extra message arrived: {extra.dtype}{extra.shape}")
        except ChannelClosed:
            pass
        dt = time.perf_counter() - t0
        p.join(60)
        if p.exitcode != 0:
            raise SystemExit(f"producer exit code {p.exitcode}")
    print(f"OK {n} messages {total} bytes {dt:.2f} s")

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_100k_random_messages(tmp_path, method):
    prefix = PREFIX + "stress-"
    proc = run_script(tmp_path, STRESS, method, "100000", prefix + method, timeout=300)
    assert_clean(proc, prefix)
    assert proc.stdout.startswith("OK 100000 messages"), proc.stdout


# ---- two processes, every call, random timing ---------------------------------------------
# The model test (tests/shm/test_shm_model.py) drives both ends in one thread, so it cannot see
# timing. Here a producer process and this consumer make random calls at random moments with
# short timeouts: sends that fit; sends larger than the ring, cut half way when their timeout
# ends while the consumer is slow; loans published, discarded, dropped or left by an
# exception; recv, recv(out=) after peek, recv_view with up to eight views held and released in
# any order; receives that time out half way through a streamed message and resume in the next
# call (of any kind). Each message carries its number and a pattern derived from it. The
# consumer must receive exactly the messages whose call returned in the producer, in order,
# each whole; every view must keep its bytes until released.
MIX = r"""
import multiprocessing as mp
import random
import sys
import time
import zlib
from collections import Counter

import numpy as np

from fastcopy.shm import Channel, ChannelClosed

def payload(number, size):
    a = ((np.arange(size, dtype=np.uint32) * 7 + number) % 251).astype(np.uint8)
    a[:8] = np.frombuffer(np.int64(number).tobytes(), np.uint8)
    return a

def producer(name, capacity, seed, seconds, conn):
    ch = Channel.attach(name)
    rng = random.Random(seed)
    sent, stats = [], Counter()
    deadline = time.monotonic() + seconds
    number = 0
    while time.monotonic() < deadline:
        number += 1
        r = rng.random()
        fits = rng.choice([rng.randint(8, 256), rng.randint(8, capacity // 3)])
        try:
            if r < 0.15:
                ch.send(payload(number, rng.randint(capacity + 1, 3 * capacity)),
                        timeout=rng.choice([0.0005, 0.002, 0.02, 1.0]))
                stats["large sent"] += 1
            elif r < 0.5:
                ch.send(payload(number, fits), timeout=rng.choice([0.0, 0.01, 1.0]))
                stats["sent"] += 1
            elif r < 0.95:
                a = ch.loan(fits, timeout=rng.choice([0.0, 0.01, 1.0]))
                a[...] = payload(number, fits)
                end = rng.random()
                if end < 0.1:
                    ch.discard(a)
                    stats["discarded"] += 1
                    continue
                if end < 0.2:
                    del a  # abandoned: sends nothing
                    stats["dropped"] += 1
                    continue
                if end < 0.3:
                    try:
                        with a:
                            raise KeyError("the producer failed")
                    except KeyError:
                        stats["raised"] += 1
                        continue
                ch.publish(a)
                stats["published"] += 1
            else:
                time.sleep(rng.random() * 0.002)
                continue
        except TimeoutError:
            stats["timeouts (large: cut or nothing sent)" if r < 0.15 else "timeouts"] += 1
            continue
        sent.append(number)
    ch.close()
    conn.send((sent, dict(stats)))

def main(name, capacity, seconds, seed):
    capacity, seconds, seed = int(capacity), float(seconds), int(seed)
    ctx = mp.get_context("spawn")
    with Channel.create(name, capacity=capacity) as ch:
        results, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=producer, args=(name, capacity, seed, seconds, child_end))
        p.start()
        rng = random.Random(seed + 1)
        received, views, stats = [], [], Counter()

        def release(count):
            for _ in range(min(count, len(views))):
                view, number, crc = views.pop(rng.randrange(len(views)))
                assert zlib.crc32(view) == crc, f"view of message {number} changed while held"
                del view

        while True:
            r = rng.random()
            t = rng.choice([0.0, 0.0005, 0.005, 0.05])
            try:
                if r < 0.3:
                    got = ch.recv(timeout=t)
                    stats["recv"] += 1
                elif r < 0.5:
                    info = ch.peek(timeout=t)
                    if info is None:
                        raise TimeoutError
                    out = np.full(info[1], 0xEE, info[0])
                    try:
                        got = ch.recv(out=out, timeout=t)
                    except ValueError as e:  # the peeked message was cut meanwhile
                        assert "stays" in str(e), e
                        stats["peeked, then cut"] += 1
                        continue
                    assert got is out
                    stats["recv(out=)"] += 1
                elif r < 0.8 and len(views) < 8:
                    got = ch.recv_view(timeout=t)
                    assert not got.flags.writeable
                    stats["recv_view"] += 1
                else:
                    release(rng.randint(1, 3))
                    if rng.random() < 0.2:
                        time.sleep(rng.random() * 0.003)  # a slow consumer: large sends get cut
                    continue
            except TimeoutError:
                stats["timeouts"] += 1
                release(rng.randint(0, len(views)))
                continue
            except ChannelClosed:
                break
            number = int(np.frombuffer(got[:8].tobytes(), "<i8")[0])
            assert got.dtype == np.uint8 and got.ndim == 1, (got.dtype, got.shape)
            assert np.array_equal(got, payload(number, got.size)), f"message {number} is not whole"
            assert not received or number > received[-1], (received[-1], number)
            received.append(number)
            if not got.flags.writeable and got.base is not None:
                views.append((got, number, zlib.crc32(got)))
            del got
        release(len(views))
        sent, producer_stats = results.recv()
        p.join(30)
        assert p.exitcode == 0, p.exitcode
        missing = sorted(set(sent) - set(received))
        extra = sorted(set(received) - set(sent))
        assert received == sent, f"missing {missing[:5]}, not sent but received {extra[:5]}"
        stats["cut messages skipped"] = ch.cut_messages
    print("OK", len(sent), "messages;", dict(stats), producer_stats)

if __name__ == "__main__":
    main(*sys.argv[1:])
"""


@pytest.mark.parametrize("capacity", [64 << 10, (64 << 10) + 64])
def test_two_processes_every_call_random_timing(tmp_path, capacity):
    prefix = PREFIX + "mix-"
    seconds = os.environ.get("FASTCOPY_STRESS_SECONDS", "3")
    proc = run_script(tmp_path, MIX, f"{prefix}{capacity}", str(capacity), seconds, str(capacity), timeout=180)
    assert_clean(proc, prefix)
    assert proc.stdout.startswith("OK"), proc.stdout
    print(proc.stdout)


# ---- killed peers --------------------------------------------------------------------------
KILL = r"""
import multiprocessing as mp
import os
import signal
import sys
import time

import numpy as np

from fastcopy.shm import Channel, PeerDied

def endless_producer(name):
    ch = Channel.attach(name)
    rng = np.random.default_rng(5)
    i = 0
    while True:
        size = int(np.exp(rng.random() * np.log(3 << 20)))   # up to 3 MiB, ring is 256 KiB
        a = np.full(size, i % 251, np.uint8)
        ch.send(a)
        i += 1

def stuck_producer(name):
    ch = Channel.attach(name)
    ch.send(np.full(100, 7, np.uint8))
    ch.send(np.full(4 << 20, 9, np.uint8))  # larger than the ring: blocks half way
    time.sleep(600)

def quiet_producer(name):
    ch = Channel.attach(name)
    for i in range(3):
        ch.send(np.full(10, i, np.uint8))
    time.sleep(600)

def slow_consumer(name, started):
    ch = Channel.attach(name)
    ch.recv()
    started.set()
    time.sleep(600)

def expect_peer_died(fn, limit=10.0):
    t0 = time.monotonic()
    try:
        fn()
    except PeerDied as e:
        dt = time.monotonic() - t0
        assert dt < limit, dt
        return str(e)
    raise AssertionError("no PeerDied")

def main(method, scenario, name):
    ctx = mp.get_context(method)
    with Channel.create(name, capacity=256 << 10) as ch:
        target = {"endless": endless_producer, "stuck": stuck_producer, "quiet": quiet_producer,
                  "consumer": slow_consumer}[scenario]
        started = ctx.Event()
        p = ctx.Process(target=target, args=(name, started) if scenario == "consumer" else (name,))
        p.start()
        if scenario == "endless":
            # Receive for a while, verifying every message, then SIGKILL the producer at a
            # random moment; every message delivered before the error must be intact.
            t_end = time.monotonic() + 0.5
            i = 0
            while time.monotonic() < t_end:
                a = ch.recv(timeout=30)
                assert (a == i % 251).all(), i
                i += 1
            os.kill(p.pid, signal.SIGKILL)
            def drain():
                nonlocal i
                while True:
                    a = ch.recv(timeout=30)   # a timeout here would fail the test
                    assert (a == i % 251).all(), i
                    i += 1
            msg = expect_peer_died(drain)
        elif scenario == "stuck":
            assert (ch.recv(timeout=30) == 7).all()
            time.sleep(0.5)                      # the producer is now blocked mid-message
            os.kill(p.pid, signal.SIGKILL)
            msg = expect_peer_died(lambda: ch.recv(timeout=30))
        elif scenario == "quiet":
            for i in range(3):
                assert (ch.recv(timeout=30) == i).all()
            os.kill(p.pid, signal.SIGKILL)
            msg = expect_peer_died(lambda: ch.recv())   # no timeout at all: must not hang
        else:
            ch.send(np.zeros(10, np.uint8))
            assert started.wait(30)              # the consumer has claimed its end
            while True:                            # fill the ring
                try:
                    ch.send(np.zeros(10000, np.uint8), timeout=0.2)
                except TimeoutError:
                    break
            os.kill(p.pid, signal.SIGKILL)
            msg = expect_peer_died(lambda: ch.send(np.zeros(10000, np.uint8), timeout=30))
        p.join(10)
    assert "died" in msg, msg
    print("OK", scenario, msg)

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
"""


@pytest.mark.parametrize("scenario", ["endless", "stuck", "quiet", "consumer"])
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_killed_peer_raises_not_hangs(tmp_path, method, scenario):
    prefix = PREFIX + "kill-"
    t0 = time.monotonic()
    proc = run_script(tmp_path, KILL, method, scenario, prefix + scenario, timeout=120)
    assert_clean(proc, prefix)
    assert proc.stdout.startswith("OK"), proc.stdout
    assert time.monotonic() - t0 < 60
