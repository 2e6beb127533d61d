"""Ctrl-C during one long copy: a strided copy() and a copy_many() batch of more than
_core.SIGNAL_CHECK_BYTES run Python's signal handlers between steps, so SIGINT raises
KeyboardInterrupt from inside the call with the destination partly written.

Each scenario runs in a child started with SIGINT ignored (as under nohup or `cmd &`), sets
Python's own handler itself, and sends SIGINT from a helper thread as soon as the first
destination byte changes (the copy is then running with the GIL released). The child catches
KeyboardInterrupt around the call only, checks that the last destination bytes are still
unwritten (the copy stopped early) and exits 3; any other ending exits otherwise.

Signal handlers run only where the copy checks for them, because the call runs no Python code
of its own: a handler run inside such code would raise its KeyboardInterrupt there, and the
copy would have to keep it instead of clearing it with the code's other errors."""

from __future__ import annotations

import os

import pytest

from _child import SIGINT_HANDLER, SIGINT_IGNORED, explain, run_script

pytestmark = pytest.mark.skipif(os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1",
                                reason="FASTCOPY_NO_SUBPROCESS=1: tests that start processes are skipped")

HELPER = SIGINT_HANDLER + r"""
import os, sys, threading
import numpy as np
import fastcopy
from fastcopy import _core

STEP = _core.SIGNAL_CHECK_BYTES


def interrupt_when_written(probe):
    # probe() reads a destination byte; SIGINT once the copy has written it.
    def run():
        while probe() == 0:
            pass
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=run, daemon=True).start()


def run_interrupted(call, untouched):
    try:
        call()
    except KeyboardInterrupt:
        if not untouched():
            print("interrupted, but the destination was written to the end")
            sys.exit(4)
        print("interrupted inside the call")
        sys.exit(3)
    print("the call ran to the end")
    sys.exit(5)
"""

STRIDED = HELPER + r"""
n = 12 * STEP                                    # 1-byte elements, every other destination byte
dst = np.zeros(2 * n, np.uint8)[::2]
src = np.broadcast_to(np.uint8(7), (n,))         # a zero-stride source: no memory
interrupt_when_written(lambda: dst[0])
run_interrupted(lambda: fastcopy.copy(dst, src), lambda: dst[-1] == 0)
"""

BATCH = HELPER + r"""
part = STEP // 2                                 # 24 contiguous pairs of 64 MiB, one shared source
src = np.full(part, 7, np.uint8)
dsts = [np.zeros(part, np.uint8) for _ in range(24)]
interrupt_when_written(lambda: dsts[0][0])
run_interrupted(lambda: fastcopy.copy_many(dsts, [src] * len(dsts)), lambda: dsts[-1][-1] == 0)
"""


@pytest.mark.parametrize("scenario", [STRIDED, BATCH], ids=["strided-copy", "copy-many-batch"])
def test_sigint_interrupts_a_long_copy(scenario, tmp_path):
    proc = run_script(tmp_path, scenario, timeout=120, prefix=SIGINT_IGNORED,
                      env=None)
    assert proc.returncode == 3, explain(proc)
    assert "interrupted inside the call" in proc.stdout, explain(proc)


FORKED_FROM_A_THREAD = HELPER + r"""
# os.fork() from a thread other than the main one: in the child that thread is the main thread,
# so the copy there runs the signal handlers between its steps.
n = 12 * STEP


def child():
    src = np.full(n, 7, np.uint8)
    dst = np.zeros(n, np.uint8)
    interrupt_when_written(lambda: dst[0])
    run_interrupted(lambda: fastcopy.copy(dst, src), lambda: dst[-1] == 0)


def fork_and_wait():
    pid = os.fork()
    if pid == 0:
        code = 6  # an exception other than run_interrupted's exit
        try:
            child()
        except SystemExit as e:
            code = e.code
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)


sys.stdout.flush()
t = threading.Thread(target=fork_and_wait)
t.start()
t.join()
"""


def test_sigint_interrupts_a_long_copy_in_a_child_forked_from_a_thread(tmp_path):
    proc = run_script(tmp_path, FORKED_FROM_A_THREAD, timeout=120, prefix=SIGINT_IGNORED, env=None)
    assert proc.returncode == 0, explain(proc)
    assert "interrupted inside the call" in proc.stdout and "child exit 3" in proc.stdout, explain(proc)


NO_PYTHON_CODE = r"""
import sys
import numpy as np
import fastcopy
from fastcopy import _core

n = _core.SIGNAL_CHECK_BYTES + 4096             # more than one step: the signal checks are on
src = np.ones(n, np.uint8)
dst = np.zeros(n, np.uint8)
half = n // 2
generic = fastcopy.kernel("generic", threads=2)
calls = {
    "copy": lambda: fastcopy.copy(dst, src),
    "kernel": lambda: generic(dst, src),
    "copyto": lambda: fastcopy.copyto(dst, src),
    "stack": lambda: fastcopy.stack([src], out=dst.reshape(1, -1)),
    "copy_many": lambda: fastcopy.copy_many([dst[:half], dst[half:]], [src[:half], src[half:]]),
}
call = calls[sys.argv[1]]
ran = []


def profile(frame, event, arg):
    if event == "call" and frame.f_code is not call.__code__:
        ran.append(frame.f_code.co_filename + ":" + frame.f_code.co_name)


sys.setprofile(profile)
call()                                           # the process's first copy: its set-up included
sys.setprofile(None)
assert dst[-1] == 1, "not copied"
print("python code run inside the call:", ran)
"""


@pytest.mark.parametrize("entry", ["copy", "kernel", "copyto", "stack", "copy_many"])
def test_a_long_copy_runs_no_python_code_inside_the_call(entry, tmp_path):
    proc = run_script(tmp_path, NO_PYTHON_CODE, entry, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "python code run inside the call: []" in proc.stdout, explain(proc)
