"""Real shared memory between real processes (spawn and fork), written and read with
fastcopy on both sides. Each scenario runs in a fresh interpreter so its stderr can be
checked for resource_tracker warnings (leaked or doubly-unlinked segments)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from multiprocessing import shared_memory
from pathlib import Path

import pytest

import fastcopy
from conftest import no_subprocess

SCENARIO = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys
    from multiprocessing import shared_memory

    import numpy as np

    import fastcopy

    N = (1 << 20) + 13  # above the GIL threshold, odd length

    def pattern(seed, n):
        return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)

    def child(name, n, q):
        try:
            shm = shared_memory.SharedMemory(name=name)
            try:
                got = np.empty(n, np.uint8)
                fastcopy.copy(got, shm.buf)                      # out of shared memory
                ok = got.tobytes() == pattern(1, n).tobytes()
                strided = np.empty(n // 2, np.uint8)
                fastcopy._core.copy_region(strided, np.ndarray((n // 2,), np.uint8, buffer=shm.buf, strides=(2,)), 2)
                ok = ok and strided.tobytes() == pattern(1, n)[: (n // 2) * 2 : 2].tobytes()
                fastcopy.copy(shm.buf, got ^ 0xFF)                # write back
                q.put("child ok" if ok else "child saw wrong bytes")
            finally:
                shm.close()
        except BaseException as e:
            q.put(f"child error {e!r}")
            raise

    def main(method):
        ctx = mp.get_context(method)
        shm = shared_memory.SharedMemory(create=True, size=N)
        try:
            fastcopy._core.copy_region(shm.buf, pattern(1, N), 1)  # into shared memory
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(shm.name, N, q))
            p.start()
            msg = q.get(timeout=120)
            p.join(120)
            assert p.exitcode == 0, p.exitcode
            assert msg == "child ok", msg
            back = np.empty(N, np.uint8)
            fastcopy.copy(back, shm.buf)
            assert back.tobytes() == (pattern(1, N) ^ 0xFF).tobytes(), "parent saw wrong bytes"
            print("NAME", shm.name)
        finally:
            shm.close()
            shm.unlink()
        print("OK", method)

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


def _env():
    env = dict(os.environ)
    src = str(Path(fastcopy.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@no_subprocess
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_shared_memory_between_processes(method, tmp_path):
    if method == "fork" and sys.platform == "win32":
        pytest.skip("no fork on Windows")
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=180,
                          env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"OK {method}" in proc.stdout
    assert "resource_tracker" not in proc.stderr, proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    # The segment is gone.
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("NAME"))
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
