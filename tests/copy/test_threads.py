"""Threads: many concurrent copies, and buffers stay exported while a copy runs."""

from __future__ import annotations

import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

import fastcopy
from conftest import no_subprocess, random_bytes

pytestmark = pytest.mark.kernels

SIZES = [0, 1, 7, 64, 4095, 65535, 65536, 65537, 300_000, (1 << 20) + 3, 3 << 20]


def test_many_threads_distinct_buffers():
    errors = []
    n_threads = 8
    barrier = threading.Barrier(n_threads)

    def worker(tid):
        try:
            barrier.wait()
            for rep in range(3):
                for k, n in enumerate(SIZES):
                    src = np.frombuffer(random_bytes(n, tid * 1000 + k), np.uint8)
                    dst = np.zeros(n, np.uint8)
                    fastcopy.copy(dst, src)
                    if dst.tobytes() != src.tobytes():
                        errors.append((tid, n, "contiguous"))
                    # Strided and raw-buffer variants.
                    if n >= 2:
                        d2 = np.zeros(n // 2, np.uint8)
                        fastcopy.copy(d2, src[1::2])
                        if d2.tobytes() != src[1::2].tobytes():
                            errors.append((tid, n, "strided"))
                    ba = bytearray(n)
                    fastcopy.copy(ba, memoryview(src))
                    if bytes(ba) != src.tobytes():
                        errors.append((tid, n, "bytearray"))
        except Exception as e:  # reported below, not swallowed
            errors.append((tid, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_threads_share_one_source():
    src = np.frombuffer(random_bytes(8 << 20, 1), np.uint8)
    outs = [np.zeros(8 << 20, np.uint8) for _ in range(6)]
    threads = [threading.Thread(target=fastcopy.copy, args=(o, src)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for o in outs:
        assert o.tobytes() == src.tobytes()


def _close_during_copy(size):
    """One attempt: a thread copies `size` bytes out of SharedMemory.buf while the main thread
    calls shm.close(). Returns "buffer_error" (close refused while the copy held the buffer),
    "after" (the copy had finished) or "before" (close won; the copy then refused the
    released buffer)."""
    shm = shared_memory.SharedMemory(create=True, size=size)
    try:
        pattern = np.frombuffer(random_bytes(4096, 2), np.uint8)
        shm_arr = np.ndarray((size,), np.uint8, buffer=shm.buf)
        shm_arr[:] = np.resize(pattern, size)
        expected_head = shm_arr[:4096].tobytes()
        expected_tail = shm_arr[-4096:].tobytes()
        del shm_arr  # drop our own export: only the copy may hold one now
        buf = shm.buf
        dst = np.zeros(size, np.uint8)
        started = threading.Event()
        result = {}

        def copier():
            started.set()
            try:
                fastcopy.copy(dst, buf)
                result["copy"] = "ok"
            except Exception as e:
                result["copy"] = e

        t = threading.Thread(target=copier)
        t.start()
        started.wait()
        time.sleep(0.002)  # let the copier get into the copy (it only needs the GIL briefly)
        try:
            shm.close()
            closed = True
        except BufferError:
            closed = False
        copy_done_at_close = not t.is_alive() and "copy" in result
        t.join(60)
        assert not t.is_alive()
        if not closed:
            # The copy held the export: it must have completed correctly.
            assert result["copy"] == "ok"
            assert dst[:4096].tobytes() == expected_head and dst[-4096:].tobytes() == expected_tail
            del buf
            shm.close()
            return "buffer_error"
        if result["copy"] == "ok":
            # close succeeded: only allowed if the copy was already over.
            assert dst[-4096:].tobytes() == expected_tail
            return "after" if copy_done_at_close else "after_race"
        assert isinstance(result["copy"], ValueError) and "src" in str(result["copy"])
        assert not dst.any()
        return "before"
    finally:
        try:
            shm.close()
        except BufferError:
            pass
        shm.unlink()


@no_subprocess  # SharedMemory starts the resource_tracker process, which dies under qemu
def test_shared_memory_close_during_copy_raises_buffer_error():
    # A 256 MiB copy (single-threaded kernel work takes tens of ms) gives close() a wide
    # window. Each attempt's outcome is checked for correctness; the GIL being released
    # and the buffer held is proven by at least one BufferError over a few attempts.
    fastcopy.set_threads(1)
    try:
        outcomes = []
        for _ in range(5):
            outcomes.append(_close_during_copy(256 << 20))
            if "buffer_error" in outcomes:
                break
    finally:
        fastcopy.set_threads(0)  # back to FASTCOPY_THREADS or the default
    assert "buffer_error" in outcomes, outcomes
