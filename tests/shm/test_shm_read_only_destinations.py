"""A received view's pages are mapped read-only, so a write through a writable alias of them
(torch.from_numpy, ctypes, np.frombuffer of either) faults in the writing process. fastcopy's
own entry points refuse such a destination with ValueError before any byte moves, whichever
way the destination is given. A check that is missing ends the child with SIGSEGV, so each
case runs in a child process and the test asserts its exit status."""
from __future__ import annotations

import os

import pytest
from _child import explain, leftovers_fixture, run_script

from conftest import no_subprocess

pytestmark = [pytest.mark.sanitize, no_subprocess]

PREFIX = f"fcro-{os.getpid()}-"
_remove_this_runs_segments = leftovers_fixture(PREFIX, fail=True)

# The start of each child: a Channel or a Topic (argv: kind, name), its two ends tx and rx.
ENDS = """
import sys
import numpy as np
import fastcopy
from fastcopy import shm

kind, name = sys.argv[1], sys.argv[2]
if kind == "channel":
    tx = shm.Channel.create(name, capacity=1 << 20)
    rx = shm.Channel.attach(name)
else:
    tx = shm.Topic.create(name, slot_bytes=1 << 16, slots=4)
    rx = shm.Topic.subscribe(name)
"""

SCENARIO = ENDS + """
import ctypes, warnings
expected = np.arange(256, dtype=np.float32).reshape(16, 16)
tx.send(expected)
view = rx.recv_view()
# A writable alias of the read-only pages, as torch.from_numpy or ctypes give one.
alias = np.frombuffer((ctypes.c_char * view.nbytes).from_address(view.ctypes.data),
                      dtype=view.dtype).reshape(view.shape)
assert alias.flags.writeable
src = np.zeros_like(alias)
other = shm.Channel.create(name + "-other", capacity=1 << 20)
other_rx = shm.Channel.attach(name + "-other")

cases = {
    "copy": lambda: fastcopy.copy(alias, src),
    "copy-strided": lambda: fastcopy.copy(alias[:, ::2], src[:, ::2]),
    "copy-buffer": lambda: fastcopy.copy(memoryview(alias).cast("B"), bytes(alias.nbytes)),
    "copy-region": lambda: fastcopy._core.copy_region(alias, src, 2),
    "kernel": lambda: fastcopy.kernel("generic")(alias, src),
    "kernel-threads": lambda: fastcopy.kernel("generic", threads=2)(alias, src),
    "copy_many": lambda: fastcopy.copy_many([alias], [src]),
    "copyto": lambda: fastcopy.copyto(alias, src),
    "copyto-broadcast": lambda: fastcopy.copyto(alias, np.float32(1)),
    "copyto-cast": lambda: fastcopy.copyto(alias, src.astype(np.float64), casting="unsafe"),
    "stack-out": lambda: fastcopy.stack(list(src), out=alias),
    "concatenate-out": lambda: fastcopy.concatenate([src], out=alias),
    "recv-out": lambda: (other.send(src), other_rx.recv(out=alias, timeout=5)),
}
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor = torch.from_numpy(alias)
    cases["torch-copy"] = lambda: fastcopy.copy(tensor, torch.zeros(16, 16))
    cases["torch-copyto"] = lambda: fastcopy.copyto(tensor, torch.zeros(16, 16))
    cases["torch-copy-large"] = lambda: fastcopy.copy(tensor.view(-1), torch.zeros(256))
for case, run in cases.items():
    try:
        run()
        print(case, "COPIED", flush=True)
    except ValueError as exc:
        print(case, "refused" if "maps read-only" in str(exc) else f"other error: {exc}", flush=True)
print("view intact", np.array_equal(view, expected))
other_rx.close(); other.close(); other.unlink()
del view
rx.close(); tx.close(); tx.unlink()
"""


@pytest.mark.parametrize("kind", ["channel", "topic"])
def test_every_entry_point_refuses_a_destination_in_a_received_view(tmp_path, kind):
    proc = run_script(tmp_path, SCENARIO, kind, f"{PREFIX}{kind}", timeout=120)
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    assert lines[-1] == "view intact True", explain(proc)
    results = dict(line.split(" ", 1) for line in lines[:-1])
    assert len(results) >= 13, explain(proc)
    assert all(r == "refused" for r in results.values()), explain(proc)


@pytest.mark.parametrize("kind", ["channel", "topic"])
def test_a_copy_on_write_view_and_a_closed_consumer_take_copies_again(tmp_path, kind):
    """recv_view(cow=True) is private memory, and the pages of a closed consumer are no longer
    guarded: copies into both go ahead."""
    code = ENDS + """
tx.send(np.arange(256, dtype=np.float32))
cow = rx.recv_view(cow=True)
fastcopy.copy(cow, np.ones(256, np.float32))
fastcopy.copyto(cow, np.float32(2))
print("cow", float(cow.sum()))
del cow
rx.close(); tx.close(); tx.unlink()
plain = np.zeros(256, np.float32)
fastcopy.copy(plain, np.ones(256, np.float32))
print("plain", float(plain.sum()))
"""
    proc = run_script(tmp_path, code, kind, f"{PREFIX}cow-{kind}", timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.split() == ["cow", "512.0", "plain", "256.0"], explain(proc)
