"""Child processes of the bridge tests: bridges (python -m fastcopy bridge) and Topic subscribers
that report over stdout, read by a thread per process so every wait is bounded."""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import List

from _child import child_env

# A subscriber of a local Topic: prints "subscribed", "probe" at the first probe (a 0-d int8 -1),
# then one checksum line per message, and "end <lost>" at the end marker (a 0-d int8 -2).
# argv: topic name, seconds to sleep before each recv (a stalled subscriber).
SUBSCRIBER = textwrap.dedent("""
    import sys, time, zlib
    import numpy as np
    from fastcopy.shm import Topic, MessagesLost
    sub = Topic.subscribe(sys.argv[1])
    stall = float(sys.argv[2])
    print("subscribed", flush=True)
    probed = False
    lost = 0
    while True:
        if stall:
            time.sleep(stall)
        try:
            arr = sub.recv_view(timeout=60)
        except MessagesLost as exc:
            lost += exc.count
            print("lost", exc.count, flush=True)
            continue
        if arr.ndim == 0 and arr.dtype == np.int8:
            if int(arr) == -1:
                if not probed:
                    probed = True
                    print("probe", flush=True)
                continue
            print("end", lost, flush=True)
            break
        print("msg", zlib.crc32(arr.tobytes(order="C")), arr.dtype.str, arr.shape, flush=True)
        del arr
""")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A child process whose stdout lines are queued as they come."""

    def __init__(self, argv: List[str]) -> None:
        self.argv = argv
        # SIGINT at its default action in the child, so that Python installs its handler there
        # and stop() ends it with KeyboardInterrupt, however pytest was started (under nohup
        # or as `cmd &` SIGINT is ignored, and an ignored signal is inherited across exec).
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env(), preexec_fn=_sigint_default)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.arrivals: List[float] = []  # time.monotonic() of each line, as it came
        self.stderr: List[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.arrivals.append(time.monotonic())
            self.lines.put(line.rstrip("\n"))
        self.lines.put("<eof>")

    def line(self, timeout: float = 60.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.argv}: no output within {timeout} s; stderr: {''.join(self.stderr)}")

    def expect(self, prefix: str, timeout: float = 60.0) -> str:
        line = self.line(timeout)
        assert line.startswith(prefix), f"{self.argv}: expected {prefix!r}, got {line!r}; stderr: {''.join(self.stderr)}"
        return line

    def stop(self, timeout: float = 20.0) -> int:
        """SIGINT, then SIGKILL if it has not exited within `timeout`; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def bridge(*args: str) -> Child:
    child = Child([sys.executable, "-m", "fastcopy", "bridge", *args])
    child.expect("bridge ")
    return child


def subscriber(topic: str, stall: float = 0.0) -> Child:
    child = Child([sys.executable, "-c", SUBSCRIBER, topic, str(stall)])
    child.expect("subscribed")
    return child
