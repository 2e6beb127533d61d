"""Zero-copy views on a Channel under hostile peers: headers rewritten under a view, the peer
dying while a view is held, Ctrl-C in recv_view and loan, a forked child dropping an inherited
view. Crash-prone cases run in a subprocess and assert its exit status.
"""
from __future__ import annotations

import gc
import os
import textwrap

import numpy as np
import pytest
from _child import SIGINT_HANDLER, SIGINT_IGNORED, run_script
from _fixtures import pair  # noqa: F401  (a fixture)
from conftest import no_subprocess

from fastcopy import _core

pytestmark = pytest.mark.sanitize

# Children import the same fastcopy as this process (CI installs it; src/ has no _core there).
PREFIX = f"fastcopy-test-zch-{os.getpid()}-"


# ---- hostile headers and peer death ----------------------------------------------------------
HOSTILE = r"""
import mmap, os, struct, sys
import numpy as np
from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, ChannelError

PREFIX = sys.argv[1]
LAYOUT = _core.shm_layout()
CH, MSG = LAYOUT["channel"], LAYOUT["message"]
H = CH["header_bytes"]          # the ring starts here: the first message's header
SHAPE = H + MSG["bytes"]        # its shape
CAP = 1 << 16

def put(m, part, name, value, base=0):  # a header word of _core.shm_layout(), machine byte order
    offset, size = part["fields"][name]
    struct.pack_into({4: "=I", 8: "=Q"}[size], m, base + offset, value)

def pad(m, header_len, payload_len, seq=0):  # a padding record in place of the first message
    for name, value in (("magic", MSG["pad_magic"]), ("header_len", header_len), ("payload_len", payload_len),
                        ("dtype_len", 0), ("ndim", 0), ("seq", seq)):
        put(m, MSG, name, value, H)
n = [0]

def fresh():
    n[0] += 1
    tx = Channel.create(PREFIX + str(n[0]), capacity=CAP)
    rx = Channel.attach(tx.name)
    fd = os.open("/dev/shm/" + tx.name, os.O_RDWR)
    m = mmap.mmap(fd, 0)
    os.close(fd)
    return tx, rx, m

def done(tx, rx, m):
    m.close()
    for c in (rx, tx):
        try:
            c.close()
        except ChannelError:
            pass
    tx.unlink()

def expect(exc, fn, what):
    try:
        r = fn()
    except exc:
        return
    except BaseException as e:
        raise AssertionError(f"{what}: {type(e).__name__}: {e}")
    raise AssertionError(f"{what}: no exception, got {r!r}")

cases = 0
# A message whose payload length claims more than the ring: never a view beyond it.
for plen in (CAP, CAP - 64, 1 << 40, (1 << 46)):
    tx, rx, m = fresh()
    tx.send(np.zeros(100, np.uint8))
    put(m, MSG, "payload_len", plen, H)
    struct.pack_into("=Q", m, SHAPE, plen)          # shape[0] (uint8: product == payload)
    # (recv() alike: a huge claimed message cannot be allocated for the copy path)
    expect((ChannelError, TimeoutError, MemoryError), lambda: rx.recv_view(timeout=0.2), f"payload_len {plen}")
    done(tx, rx, m); cases += 1

# A message claiming bytes that are not published yet: the view waits, then times out.
tx, rx, m = fresh()
tx.send(np.zeros(100, np.uint8))
put(m, MSG, "payload_len", 20000, H); struct.pack_into("=Q", m, SHAPE, 20000)
expect(TimeoutError, lambda: rx.recv_view(timeout=0.2), "unpublished payload")
done(tx, rx, m); cases += 1

# Forged padding records.
for what, patch in [
    ("pad too short", lambda m: pad(m, 64, 100)),
    ("pad to a page not published", lambda m: pad(m, 64, 4032)),
    ("pad beyond ring", lambda m: pad(m, 64, CAP)),
    ("pad bad header_len", lambda m: pad(m, 128, CAP - 64)),
    ("pad not published", lambda m: pad(m, 64, CAP - 64)),
    ("pad wrong seq", lambda m: pad(m, 64, CAP - 64, seq=7)),
]:
    tx, rx, m = fresh()
    tx.send(np.zeros(100, np.uint8))
    patch(m)
    expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), what)
    done(tx, rx, m); cases += 1

# A padding record whose length is not a multiple of 64, over a full ring: skipping it would
# leave the tail off a message boundary, 8 bytes before the ring's end.
tx, rx, m = fresh()
tx.send(np.zeros(CAP - 64, np.uint8))
pad(m, 64, CAP - 72)
expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), "pad not a multiple of 64")
done(tx, rx, m); cases += 1

# The tail moved by someone else while a view is held.
tx, rx, m = fresh()
tx.send(np.zeros(100, np.uint8)); tx.send(np.zeros(100, np.uint8))
v = rx.recv_view(timeout=1)
put(m, CH, "tail", 12345 * 64)
expect(ChannelCorrupted, lambda: rx.recv_view(timeout=0), "tail moved")
del v
done(tx, rx, m); cases += 1

# Fuzz the first messages while views are taken: only clean exceptions.
rng = np.random.default_rng(5)
ok = (ChannelError, ValueError, TimeoutError, TypeError, MemoryError)
for k in range(300):
    tx, rx, m = fresh()
    for j in range(3):
        with tx.loan(int(rng.integers(0, 2000)), rng.choice(["<f8", "|u1", ">i2"]), timeout=5) as a:
            a[...] = 1
    for _ in range(int(rng.integers(1, 6))):
        off = int(rng.integers(H, H + 12000))
        nb = int(rng.integers(1, 9))
        m[off:off + nb] = rng.integers(0, 256, nb, dtype=np.uint8).tobytes()
    held = []
    for op in range(4):
        try:
            held.append(rx.recv_view(timeout=0))
            _ = held[-1].sum()                      # reading a view never faults
        except ok:
            pass
    del held
    done(tx, rx, m); cases += 1
print("OK", cases)
"""


@no_subprocess
def test_hostile_headers_under_views(tmp_path):
    proc = run_script(tmp_path, HOSTILE, PREFIX + "hostile-", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK"), proc.stdout
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX + "hostile-")]


PEER_DEATH = r"""
import multiprocessing as mp, os, signal, sys, time
import numpy as np
from fastcopy.shm import Channel, PeerDied

def producer(name):
    ch = Channel.attach(name)
    with ch.loan(30000, np.uint8) as a:
        a[:] = 1
    ch.send(np.full(30000, 2, np.uint8))
    while True:
        time.sleep(1)

def consumer(name, ready):
    ch = Channel.attach(name)
    v = ch.recv_view(timeout=10)     # held: the producer cannot reuse its slot
    ready.set()
    while True:
        time.sleep(1)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    # 1. The producer dies while the consumer holds a view: the view stays intact.
    with Channel.create(capacity=1 << 16) as ch:
        p = ctx.Process(target=producer, args=(ch.name,))
        p.start()
        v = ch.recv_view(timeout=30)
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        assert (v == 1).all() and not v.flags.writeable
        w = ch.recv_view(timeout=10)            # published before the death: still delivered
        assert (w == 2).all()
        try:
            ch.recv_view(timeout=10)
            raise SystemExit("no PeerDied")
        except PeerDied:
            pass
        assert (v == 1).all() and ch.held_views == 2
        del v, w
    # 2. The consumer dies holding a view while the producer waits for space.
    with Channel.create(capacity=1 << 16) as ch:
        ready = ctx.Event()
        c = ctx.Process(target=consumer, args=(ch.name, ready))
        c.start()
        ch.send(np.ones(40000, np.uint8))
        assert ready.wait(30)
        killer = __import__("threading").Timer(0.3, lambda: os.kill(c.pid, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        try:
            with ch.loan(40000, np.uint8, timeout=20) as a:
                a[:] = 1
            raise SystemExit("no PeerDied")
        except PeerDied:
            pass
        assert time.monotonic() - t0 < 10
        c.join()
    print("OK")
"""


@no_subprocess
def test_peer_death_while_a_view_is_held(tmp_path):
    proc = run_script(tmp_path, PEER_DEATH, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


@no_subprocess
def test_ctrl_c_interrupts_recv_view_and_loan(tmp_path):
    code = SIGINT_HANDLER + textwrap.dedent(r"""
    import os, signal, threading, time
    import numpy as np
    from fastcopy.shm import Channel
    tx = Channel.create(capacity=1 << 16)
    rx = Channel.attach(tx.name)
    def full_then_loan():
        tx.send(np.zeros(30000, np.uint8))
        tx.loan(60000)
    for fn in (rx.recv_view, full_then_loan):
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            fn()
            raise SystemExit("not interrupted")
        except KeyboardInterrupt:
            dt = time.monotonic() - t0
            assert dt < 2.0, dt
    print("OK")
    """)
    proc = run_script(tmp_path, code, prefix=SIGINT_IGNORED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


def test_forked_child_dropping_inherited_view_does_not_move_tail(pair):
    tx, rx = pair
    tx.send(np.ones(40000, np.uint8))
    v = rx.recv_view(timeout=5)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            del v
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert rx.held_views == 1
    with pytest.raises(TimeoutError):
        tx.send(np.ones(40000, np.uint8), timeout=0.2)  # still held by the parent
    del v
    tx.send(np.ones(40000, np.uint8), timeout=5)


def test_slot_type_is_internal():
    assert hasattr(_core, "ShmSlot")
