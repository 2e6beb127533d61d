"""A benchmark's child process ends once its parent is gone (fastcopy.bench.engine.exit_with_parent):
a parent killed outright never says stop, and a child blocked in a transport's receive would
otherwise wait for ever."""
from __future__ import annotations

import os
import time

from _child import explain, run_script
from conftest import no_subprocess


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


@no_subprocess
def test_a_child_blocked_for_ever_ends_when_its_parent_is_killed(tmp_path):
    """The parent starts a child that calls exit_with_parent and then blocks with no timeout,
    prints the child's pid and kills itself (SIGKILL); the child is gone within a few seconds.
    The child holds none of the parent's output pipes, so the parent's run ends with it."""
    code = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import threading; from fastcopy.bench.engine import exit_with_parent; "
    "exit_with_parent(0.05); print('watching', flush=True); threading.Event().wait()"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
assert child.stdout.readline().strip() == "watching"
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = run_script(tmp_path, code, timeout=60)
    assert proc.returncode == -9, explain(proc)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = _gone(pid)
    if not gone:
        os.kill(pid, 9)
    assert gone, "the child outlived its parent"
