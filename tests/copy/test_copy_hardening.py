"""Regression tests for copy faults found by hostile testing: an operand resized or closed
under a copy that runs without the GIL, copies (and sends) in __del__ during interpreter
finalization, wrong argument types, environment values that are not UTF-8; and the "Failure
modes" table of docs/usage.md, row by row.

Crash-prone cases run as scripts in a fresh interpreter and assert their exit status.
FASTCOPY_NO_SUBPROCESS=1 skips those."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from _child import (check_failure_cell, child_env, explain, failure_table, leftovers_fixture, raised, run_script,
                    shm_names)

import fastcopy
from fastcopy import shm

pytestmark = pytest.mark.sanitize

subprocess_only = pytest.mark.skipif(
    os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
    reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped",
)

PREFIX = f"fcch-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=False)


# ---- 1. a buffer resized while a copy runs without the GIL -------------------------------------
# Another thread takes the last other reference to one operand and resizes it while the copy
# runs. The copy must hold both operands so that numpy refuses (ValueError), as it does for
# np.copyto; otherwise the resize frees the memory and the copy writes into it (SIGSEGV).
RESIZE = r"""
import sys, threading, time
import numpy as np
import fastcopy
from fastcopy import _core

N = 128 << 20
which, path = sys.argv[1], sys.argv[2]
src = np.arange(N, dtype=np.uint8)
dst = np.zeros(N, np.uint8)
L = [dst if which == "dst" else src]
if which == "dst":
    del dst
else:
    del src
outcome = []
done = False

def resizer():
    # Wait until the main thread holds L[0] on its stack (inside the copy, GIL released):
    # the count is then above L's reference plus getrefcount's argument.
    while sys.getrefcount(L[0]) <= 2:
        if done:
            outcome.append("late")
            return
        time.sleep(0.0001)
    try:
        L.pop().resize(4096)   # no local name: the copy's reference must be what numpy sees
        outcome.append("resized")
    except ValueError:
        outcome.append("refused")

# Operands are passed straight from L (no local names: those would be extra references).
k = fastcopy.kernel(fastcopy.kernels()[0])

def run_copy():
    if which == "dst":
        if path == "fast":
            fastcopy.copy(L[0], src)
        elif path == "general":            # src is not an ndarray: the general path
            fastcopy.copy(L[0], memoryview(src))
        elif path == "kernel":
            k(L[0], src)
        else:
            _core.copy_region(L[0], src, 1)
    else:
        if path == "fast":
            fastcopy.copy(dst, L[0])
        elif path == "general":            # dst is not an ndarray: the general path
            fastcopy.copy(memoryview(dst), L[0])
        elif path == "kernel":
            k(dst, L[0])
        else:
            _core.copy_region(dst, L[0], 1)

t = threading.Thread(target=resizer)
t.start()
try:
    run_copy()
except ValueError:   # the resize came before the call: a size mismatch, reported cleanly
    pass
done = True
t.join()
print(outcome[0])
"""


@subprocess_only
@pytest.mark.parametrize("which", ["dst", "src"])
@pytest.mark.parametrize("path", ["fast", "general", "kernel", "region"])
def test_operand_resized_during_copy_is_refused(tmp_path, which, path):
    proc = run_script(tmp_path, RESIZE, which, path)
    assert proc.returncode == 0, explain(proc)  # not -11 (SIGSEGV)
    # "resized": the main thread was switched out after loading L[0] and before the call, so
    # the resize came first and the copy saw the new size (a clean ValueError, or a copy).
    assert proc.stdout.split()[-1] in ("refused", "late", "resized"), explain(proc)

# ---- interpreter exit while a daemon thread is inside a large copy -----------------------------
EXIT_IN_COPY = r"""
import threading, time
import numpy as np
import fastcopy

def copy_loop():
    a = np.ones(64 << 20, np.uint8); b = np.zeros_like(a)
    while True:
        fastcopy.copy(b, a)

threading.Thread(target=copy_loop, daemon=True).start()
time.sleep(0.3)
print("exiting")
"""


# ---- copies in __del__ during interpreter finalization -----------------------------------------
# The thread that runs the finalization itself must not be parked: __del__ methods that copy
# or send (GIL released) while module globals are cleared. A check of Py_IsFinalizing() before
# re-taking the GIL hung here.
DEL_AT_EXIT = r"""
import sys
import numpy as np
import fastcopy
from fastcopy.shm import Channel

class Holder:
    def __init__(self):
        self.a = np.ones(8 << 20, np.uint8)
        self.b = np.zeros_like(self.a)
        self.tx = Channel.create(sys.argv[1], capacity=4 << 20)
        self.rx = Channel.attach(self.tx.name)
        self.tx.send(self.a[:8])       # first use before the exit (pybind11 imports numpy's API lazily)
        self.rx.recv(timeout=5)

    def __del__(self):
        fastcopy.copy(self.b, self.a)               # 8 MiB: without the GIL
        self.tx.send(self.a[: 1 << 20])             # 1 MiB: without the GIL
        got = self.rx.recv(timeout=5)
        print("del", int(self.b[-1]), got.nbytes, flush=True)
        self.tx.close(); self.rx.close(); self.tx.unlink()

holder = Holder()
print("main done", flush=True)
"""


@subprocess_only
def test_copies_in_del_during_finalization_complete(tmp_path):
    proc = run_script(tmp_path, DEL_AT_EXIT, f"{PREFIX}del", timeout=30)  # bounded: a parked finalizing thread would hang
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split() == ["main", "done", "del", "1", str(1 << 20)], explain(proc)
    assert shm_names(PREFIX) == set()

# ---- wrong argument types: TypeError naming the argument ---------------------------------------
def _channel_pair():
    ch = shm.Channel.create(f"{PREFIX}types-{time.monotonic_ns()}", capacity=1 << 16)
    return ch, shm.Channel.attach(ch.name)


@pytest.mark.parametrize("call, words", [
    (lambda tx, rx: rx.recv(timeout="1"), "recv: timeout must be None or a number of seconds, got str"),
    (lambda tx, rx: rx.recv(timeout=[1]), "recv: timeout must be None or a number of seconds, got list"),
    (lambda tx, rx: rx.recv(timeout=True), "recv: timeout must be None or a number of seconds, got bool"),
    (lambda tx, rx: rx.peek(timeout=b"1"), "peek: timeout must be None or a number of seconds, got bytes"),
    (lambda tx, rx: tx.send(b"x", timeout="1"), "send: timeout must be None or a number of seconds, got str"),
    (lambda tx, rx: tx.send("text"), "send: expected a numpy array or a C-contiguous buffer, got str"),
    (lambda tx, rx: tx.send(None), "send: expected a numpy array or a C-contiguous buffer, got NoneType"),
    (lambda tx, rx: rx.recv(out=5), "recv: out must be None, a numpy array, a writable C-contiguous buffer or a CPU array exporting DLPack (torch, JAX), got int"),
    (lambda tx, rx: shm.Channel.create(5), "Channel.create: name must be a str, got int"),
    (lambda tx, rx: shm.Channel.create(capacity="65536"), "Channel.create: capacity must be an int number of bytes, got str"),
    (lambda tx, rx: shm.Channel.create(capacity=1e6), "Channel.create: capacity must be an int number of bytes, got float"),
    (lambda tx, rx: shm.Channel.create(capacity=None), "Channel.create: capacity must be an int number of bytes, got NoneType"),
    (lambda tx, rx: shm.Channel.attach(5), "Channel.attach: name must be a str, got int"),
    (lambda tx, rx: shm.Channel.attach(b"x"), "Channel.attach: name must be a str, got bytes"),
    (lambda tx, rx: fastcopy.kernel(3), "fastcopy.kernel: name must be a str"),
    (lambda tx, rx: fastcopy.set_threads("2"), "fastcopy.set_threads: n must be an int"),
    (lambda tx, rx: fastcopy.set_threads(2.5), "fastcopy.set_threads: n must be an int"),
    (lambda tx, rx: fastcopy.set_threads(None), "fastcopy.set_threads: n must be an int"),
    (lambda tx, rx: fastcopy.set_threads(True), "fastcopy.set_threads: n must be an int"),
    (lambda tx, rx: fastcopy._core.copy_region(bytearray(2), b"ab", "1"), "copy_region: region must be an int"),
    (lambda tx, rx: fastcopy.copy(None, b"x"), "fastcopy.copy: dst must be an array or a buffer"),
    (lambda tx, rx: fastcopy.copy(bytearray(1), "x"), "fastcopy.copy: src must be an array or a buffer"),
])
def test_wrong_argument_types_raise_type_error_naming_the_argument(call, words):
    tx, rx = _channel_pair()
    threads = fastcopy.get_threads()
    try:
        with pytest.raises(TypeError) as info:
            call(tx, rx)
        assert words in str(info.value)
        assert not tx.closed and not rx.closed and tx.pending_bytes == 0  # nothing happened
    finally:
        fastcopy.set_threads(0 if threads == fastcopy._core.default_threads() else threads)
        tx.close(); rx.close(); tx.unlink()


class _InterruptedOnce:
    """A number whose first conversion is interrupted (a signal handler's KeyboardInterrupt
    raised while Python code of the argument runs); later conversions give 0."""

    def __init__(self) -> None:
        self.calls = 0

    def _value(self) -> int:
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt
        return 0

    def __float__(self) -> float:
        return float(self._value())

    def __index__(self) -> int:
        return self._value()


@pytest.mark.parametrize("call", [
    lambda tx, rx, arg: rx.recv(timeout=arg),
    lambda tx, rx, arg: rx.peek(timeout=arg),
    lambda tx, rx, arg: tx.send(b"x", timeout=arg),
    lambda tx, rx, arg: fastcopy.stack([np.zeros(4), np.ones(4)], axis=arg),
    lambda tx, rx, arg: fastcopy.concatenate([np.zeros(4), np.ones(4)], axis=arg),
], ids=["recv-timeout", "peek-timeout", "send-timeout", "stack-axis", "concatenate-axis"])
def test_an_interrupt_inside_an_argument_conversion_reaches_the_caller(call):
    tx, rx = _channel_pair()
    try:
        arg = _InterruptedOnce()
        with pytest.raises(KeyboardInterrupt):
            call(tx, rx, arg)
        assert arg.calls == 1  # not converted again after the interrupt (the numpy fallback)
        assert tx.pending_bytes == 0
    finally:
        tx.close(); rx.close(); tx.unlink()


def test_an_ordinary_error_in_a_timeout_conversion_is_still_a_type_error():
    class Bad:
        def __float__(self) -> float:
            raise ValueError("no")

    tx, rx = _channel_pair()
    try:
        with pytest.raises(TypeError, match="recv: timeout must be None or a number of seconds, got Bad"):
            rx.recv(timeout=Bad())
    finally:
        tx.close(); rx.close(); tx.unlink()


@subprocess_only
@pytest.mark.parametrize("key, value", [(b"FASTCOPY_KERNEL", b"avx2\xff"), (b"FASTCOPY_NT_THRESHOLD", b"\xfe1M")])
def test_non_utf8_environment_value_names_the_variable(key, value):
    env = {k.encode(): v.encode() for k, v in child_env().items() if not k.startswith("FASTCOPY_")}
    env[key] = value
    proc = subprocess.run([sys.executable, "-c", "import fastcopy"], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 1
    err = proc.stderr.decode(errors="replace")
    assert "ImportError" in err and key.decode() in err and "not valid UTF-8" in err, err


# ---- the "Failure modes" table of docs/usage.md, row by row ------------------------------------
COPY_MMAP_CLOSE = r"""
import mmap, threading, time
import numpy as np
import fastcopy
for attempt in range(5):
    mm = mmap.mmap(-1, 256 << 20)
    src = np.ones(256 << 20, np.uint8)
    seen, started = [], []
    def closer():
        while not started:
            time.sleep(0.0001)
        time.sleep(0.002)
        try:
            mm.close(); seen.append("closed")
        except BufferError:
            seen.append("BufferError")
    t = threading.Thread(target=closer); t.start()
    started.append(1)
    fastcopy.copy(mm, src)
    t.join()
    if seen == ["BufferError"]:
        assert mm[:4] == b"\x01\x01\x01\x01"
        break
print(seen[0])
"""


def usage_scenarios(tmp_path):
    def resize():
        outcomes = set()
        for attempt in range(3):
            proc = run_script(tmp_path, RESIZE, "dst", "fast")
            assert proc.returncode == 0, explain(proc)
            outcomes.add(proc.stdout.split()[-1])
            if "refused" in outcomes:
                return "ValueError the copy completes"
        return str(outcomes)

    def mmap_close():
        proc = run_script(tmp_path, COPY_MMAP_CLOSE)
        assert proc.returncode == 0, explain(proc)
        return proc.stdout.split()[-1] + " the copy completes"

    def wrong_type():
        outcomes = {raised(lambda: fastcopy.copy(None, b"x")), raised(lambda: fastcopy.kernel(3)),
                    raised(lambda: fastcopy.set_threads("2"))}
        return outcomes.pop() if len(outcomes) == 1 else str(outcomes)

    def mismatch():
        dst = np.zeros(3)
        outcomes = {raised(lambda: fastcopy.copy(dst, np.ones(4))),
                    raised(lambda: fastcopy.copy(dst, np.ones(3, np.float32))),
                    raised(lambda: fastcopy.copy(bytearray(3), b"1234")),
                    raised(lambda: fastcopy.copy(b"abc", b"123"))}
        assert (dst == 0).all()
        return " or ".join(sorted(outcomes)) + " unchanged"

    def bad_env():
        env = {k.encode(): v.encode() for k, v in child_env().items() if not k.startswith("FASTCOPY_")}
        env[b"FASTCOPY_THREADS"] = b"\xff"
        proc = subprocess.run([sys.executable, "-c", "import fastcopy"], capture_output=True, env=env, timeout=60)
        err = proc.stderr.decode(errors="replace")
        return "ImportError naming the variable" if "ImportError" in err and "FASTCOPY_THREADS" in err else err

    def exit_copy():
        proc = run_script(tmp_path, EXIT_IN_COPY)
        return f"exit status {proc.returncode}"

    return {
        "another thread resizes `dst` or `src` (`ndarray.resize`) while a copy runs without the GIL": resize,
        "another thread closes the `mmap` that `dst` or `src` is while a copy runs without the GIL": mmap_close,
        "a wrong argument type (`copy(None, b)`, `kernel(3)`, `set_threads(\"2\")`)": wrong_type,
        "shapes, dtypes or byte counts differ, or `dst` is read-only": mismatch,
        "a `FASTCOPY_*` environment variable that is not valid UTF-8": bad_env,
        "the interpreter exits while a daemon thread is inside a large copy": exit_copy,
    }


@subprocess_only
@pytest.mark.parametrize("doc, scenarios", [("usage.md", usage_scenarios)])
def test_failure_modes_table_matches_behaviour(tmp_path, doc, scenarios):
    table = failure_table(doc)
    runs = scenarios(tmp_path)
    assert set(table) == set(runs), (sorted(set(table) ^ set(runs)))  # one scenario per row, no more
    for fault, cell in table.items():
        outcome = runs[fault]()
        if outcome is None:  # a scenario that cannot run in this build says so
            warnings.warn(f"failure-modes row not checked in this build: {fault}")
            continue
        check_failure_cell(outcome, cell)
    assert shm_names(PREFIX) == set()
