"""fastcopy.shm.Channel segments that are corrupt or hostile (in a subprocess, to prove there is
no crash), the example of docs/shm.md run as written, and a Channel passed to a spawned process.

Each scenario runs as a script in a fresh interpreter. FASTCOPY_NO_SUBPROCESS=1 skips them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


# ---- corrupt and hostile segments ---------------------------------------------------------
CORRUPT = r"""
import mmap
import os
import struct
import sys

import numpy as np

from fastcopy import _core
from fastcopy.shm import Channel, ChannelCorrupted, ChannelError

PREFIX = sys.argv[1]
counter = [0]
LAYOUT = _core.shm_layout()
CH, MSG = LAYOUT["channel"], LAYOUT["message"]
H = CH["header_bytes"]      # the ring starts here: the first message's header
SHAPE = H + MSG["bytes"]    # its shape (ndim 1), then its dtype text
DTYPE = SHAPE + 8

def put(m, part, name, value, base=0):  # a header word of _core.shm_layout(), machine byte order
    offset, size = part["fields"][name]
    struct.pack_into({4: "=I", 8: "=Q"}[size], m, base + offset, value)

def fresh(cap=1 << 16):
    counter[0] += 1
    tx = Channel.create(PREFIX + str(counter[0]), capacity=cap)
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
        fn()
    except exc as e:
        return
    except BaseException as e:
        raise AssertionError(f"{what}: {type(e).__name__}: {e}")
    raise AssertionError(f"{what}: no exception")

cases = 0

# 1. Shared header fields.
for what, field, value, side in [
    ("wrong magic", "magic", 0xDEADBEEF, "both"),
    ("wrong version", "version", 99, "both"),
    ("wrong capacity", "capacity", 1 << 40, "both"),
    ("huge head", "head", 1 << 62, "rx"),
    ("head beyond tail + capacity", "head", (1 << 16) + 4096, "rx"),
    ("tail beyond head", "tail", 1 << 50, "tx"),
]:
    tx, rx, m = fresh()
    tx.send(np.arange(100))
    put(m, CH, field, value)
    if side in ("both", "rx"):
        expect(ChannelCorrupted, lambda: rx.recv(timeout=0), what + " (recv)")
        expect(ChannelCorrupted, lambda: rx.recv(timeout=0), what + " (recv again)")
    if side in ("both", "tx"):
        # The producer reads the tail when its cached view says the ring is full: keep sending.
        def fill():
            for _ in range(20):
                tx.send(np.zeros(10000, np.uint8), timeout=0)
        expect(ChannelCorrupted, fill, what + " (send)")
    if side == "both":
        expect(ChannelCorrupted, lambda: Channel.attach(tx.name), what + " (attach)")
    done(tx, rx, m)
    cases += 1

# 2. Message header fields of the first message (at offset H of the file).
def msg_case(what, patch, exc=ChannelCorrupted, payload=None):
    global cases
    tx, rx, m = fresh()
    tx.send(np.arange(10, dtype="<f8") if payload is None else payload)
    patch(m)
    expect(exc, lambda: rx.recv(timeout=0), what)
    expect(exc, lambda: rx.recv(out=np.empty(10), timeout=0), what + " (out=)")
    done(tx, rx, m)
    cases += 1

msg_case("message magic", lambda m: put(m, MSG, "magic", 0x12345678, H))
msg_case("header_len", lambda m: put(m, MSG, "header_len", 1 << 30, H))
msg_case("payload_len huge", lambda m: put(m, MSG, "payload_len", 1 << 62, H))
msg_case("payload_len mismatch", lambda m: put(m, MSG, "payload_len", 88, H))
msg_case("dtype_len huge", lambda m: put(m, MSG, "dtype_len", 1 << 31, H))
msg_case("dtype_len zero", lambda m: put(m, MSG, "dtype_len", 0, H))
msg_case("ndim huge", lambda m: put(m, MSG, "ndim", 1 << 20, H))
msg_case("sequence number", lambda m: put(m, MSG, "seq", 5, H))
msg_case("shape product overflow", lambda m: struct.pack_into("=Q", m, SHAPE, 1 << 63))
msg_case("shape product mismatch", lambda m: struct.pack_into("=Q", m, SHAPE, 11))
msg_case("dtype not printable", lambda m: m.__setitem__(slice(DTYPE, DTYPE + 3), b"\x00\xff\x01"))
msg_case("dtype unknown", lambda m: m.__setitem__(slice(DTYPE, DTYPE + 3), b"zz9"))
msg_case("dtype object", lambda m: m.__setitem__(slice(DTYPE, DTYPE + 3), b"|O8"))
# A structured dtype travels as a literal: replace it by code, by deep nesting, by junk.
st = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
def set_dtype(text):
    def patch(m):
        put(m, MSG, "dtype_len", len(text), H)
        # ndim 1: the shape, then the dtype text; header_len must cover it
        align = MSG["align"]
        put(m, MSG, "header_len", (DTYPE - H + len(text) + align - 1) // align * align, H)
        m[DTYPE:DTYPE + len(text)] = text
    return patch
for text in (b"lit:__import__('os').system('echo pwned')", b"lit:" + b"[" * 900, b"lit:['struct', 1, 2, 3, 4, 5]",
             b"lit:['sub', '<f8', [-1]]", b"lit:['struct', ['a'], ['<O'], [0], 8, False]"):
    msg_case("dtype literal " + text[:20].decode(), set_dtype(text), payload=st)

# 3. Random bytes over the whole header: attach and both ends fail cleanly.
rng = np.random.default_rng(0)
for k in range(50):
    tx, rx, m = fresh()
    tx.send(np.arange(5))
    m[0:H] = rng.integers(0, 256, H, dtype=np.uint8).tobytes()
    expect(ChannelCorrupted, lambda: Channel.attach(tx.name), "random header (attach)")
    expect(ChannelCorrupted, lambda: rx.recv(timeout=0), "random header (recv)")
    expect(ChannelCorrupted, lambda: tx.send(b"x", timeout=0), "random header (send)")
    done(tx, rx, m)
    cases += 1

# 4. Fuzz: random bytes at random places of the header and the first messages. Each call
# ends in one of the documented outcomes: send returns None or raises TimeoutError (ring
# full), ChannelClosed (a closed flag was hit), PeerDied or ChannelError "already has a"
# (a pid field now names a dead or another live process: the role cannot be claimed),
# ChannelError "gave up a message" (only when the random bytes hit the abandoned-message word
# of the header) or ChannelCorrupted; recv the same, or returns an array. Once an end
# raised ChannelCorrupted, every later call on it raises ChannelCorrupted. A recv that returns gives the next message
# sent, byte for byte, unless the random bytes landed in that message's record (there is no
# payload checksum: a changed payload or an equally sized dtype is delivered as written).
from fastcopy.shm import ChannelClosed, PeerDied
outcomes = {}
for k in range(400):
    tx, rx, m = fresh()
    sent = []
    for j in range(3):
        a = np.arange(int(rng.integers(0, 50)), dtype=rng.choice(["<f8", "|u1", ">i2"]))
        tx.send(a)
        sent.append(a)
    records = []  # [start, end) of each message record in the file
    pos = H
    for a in sent:
        align = MSG["align"]
        hdr = (MSG["bytes"] + 8 * a.ndim + len(a.dtype.str) + align - 1) // align * align
        end = pos + hdr + (a.nbytes + align - 1) // align * align
        records.append((pos, end))
        pos = end
    touched = set()
    for _ in range(int(rng.integers(1, 8))):
        off = int(rng.choice([rng.integers(0, H), rng.integers(H, H + 512), rng.integers(0, 2048)]))
        n = int(rng.integers(1, 9))
        new = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        if m[off:off + n] != new:
            touched.update(i for i in range(off, off + n) if m[i] != new[i - off])
        m[off:off + n] = new
    header_touched = any(i < H for i in touched)
    # The abandoned-message word: a nonzero value there reads as "the peer gave up a message",
    # a documented ChannelError.
    abandoned_at, abandoned_size = CH["fields"]["abandoned"]
    abandoned_touched = any(abandoned_at <= i < abandoned_at + abandoned_size for i in touched)
    corrupt = {"tx": False, "rx": False}
    received = 0
    for op in range(4):
        side = "tx" if op % 2 else "rx"
        try:
            if side == "tx":
                result = tx.send(np.arange(3), timeout=0)
                assert result is None, f"fuzz {k}: send returned {result!r}"
                kind = "ok"
            else:
                got = rx.recv(timeout=0)
                assert isinstance(got, np.ndarray), f"fuzz {k}: recv returned {type(got)}"
                if received < len(sent):
                    lo, hi = records[received]
                    if not header_touched and not any(lo <= i < hi for i in touched):
                        want = sent[received]
                        assert got.dtype == want.dtype and got.shape == want.shape and \
                            got.tobytes() == want.tobytes(), f"fuzz {k}: message {received} changed"
                received += 1
                kind = "ok"
        except ChannelCorrupted:
            kind = "ChannelCorrupted"
            corrupt[side] = True
        except (TimeoutError, ChannelClosed, PeerDied) as e:
            assert not corrupt[side], f"fuzz {k}: {side} raised {type(e).__name__} after ChannelCorrupted"
            kind = type(e).__name__
        except ChannelError as e:
            assert type(e) is ChannelError and ("already has a" in str(e) or (
                abandoned_touched and "gave up a message" in str(e))), f"fuzz {k}: {side}: {e}"
            assert not corrupt[side], f"fuzz {k}: {side} raised {e} after ChannelCorrupted"
            kind = "role taken" if "already has a" in str(e) else "given up"
        except BaseException as e:
            raise AssertionError(f"fuzz {k}: {side}: undocumented outcome {type(e).__name__}: {e}")
        if kind == "ok":
            assert not corrupt[side], f"fuzz {k}: {side} succeeded after ChannelCorrupted"
        outcomes[side + " " + kind] = outcomes.get(side + " " + kind, 0) + 1
    done(tx, rx, m)
    cases += 1
# The loop reaches each kind of outcome (it would not test much otherwise).
for needed in ("rx ok", "rx ChannelCorrupted", "tx ok", "tx ChannelCorrupted"):
    assert outcomes.get(needed, 0) > 0, (needed, outcomes)
print("fuzz outcomes", sorted(outcomes.items()), file=sys.stderr)

# 5. Segments that are not channels.
name = PREFIX + "short"
with open("/dev/shm/" + name, "wb") as f:
    f.write(b"\xff" * 5000)
expect(ChannelCorrupted, lambda: Channel.attach(name), "short segment")
os.unlink("/dev/shm/" + name)
print("OK", cases, "cases")
"""


def test_corrupt_segments_raise_and_never_crash(tmp_path):
    prefix = PREFIX + "corrupt-"
    proc = run_script(tmp_path, CORRUPT, prefix, timeout=120)
    assert_clean(proc, prefix)
    assert proc.stdout.startswith("OK"), proc.stdout


# ---- the documented example ---------------------------------------------------------------
def test_docs_example_runs_as_written(tmp_path):
    text = (ROOT / "docs" / "shm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = [b for b in blocks if "__main__" in b]
    assert example, "docs/shm.md has no complete example"
    script = tmp_path / "example.py"
    script.write_text(example[0])
    env = _child.child_env(PYTHONWARNINGS="always")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(tmp_path))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "resource_tracker" not in err and "Warning" not in err and err.strip() == "", err
    assert "consumer received" in out, out
    assert shm_names(f"fastcopy-{proc.pid}-") == set()


# ---- a Channel passed to a spawned process pickles as its name --------------------------------
PICKLED = r"""
import multiprocessing as mp
import sys

import numpy as np

from fastcopy.shm import Channel

def child(ch):                      # arrives attached (unpickled by name)
    ch.send(np.arange(5))
    ch.close()

if __name__ == "__main__":
    with Channel.create(sys.argv[1], capacity=1 << 16) as ch:
        p = mp.get_context(sys.argv[2]).Process(target=child, args=(ch,))
        p.start()
        assert (ch.recv(timeout=30) == np.arange(5)).all()
        p.join(30)
        assert p.exitcode == 0
    print("OK")
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_channel_passed_to_child(tmp_path, method):
    prefix = PREFIX + "pickle-"
    proc = run_script(tmp_path, PICKLED, prefix + method, method, timeout=60)
    assert_clean(proc, prefix)
    assert proc.stdout.startswith("OK"), proc.stdout
