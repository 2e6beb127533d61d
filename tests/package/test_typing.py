"""The type stubs work for users: mypy accepts typical calls and rejects wrong ones."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

def run_mypy(tmp_path: Path, code: str):
    path = tmp_path / "user_code.py"
    path.write_text(textwrap.dedent(code))
    # MYPYPATH-free: mypy finds fastcopy where the test process imported it from.
    out, err, status = mypy_api.run([str(path), "--cache-dir", str(tmp_path / ".mypy_cache")])
    return out + err, status


def test_typical_calls_type_check(tmp_path):
    out, status = run_mypy(tmp_path, """
        import mmap
        import numpy as np
        import fastcopy
        from fastcopy.shm import Channel

        a = np.zeros((4, 4))
        b = np.ones((4, 4))
        fastcopy.copy(a, b)
        fastcopy.copy(bytearray(8), b"abcdefgh")
        fastcopy.copy(memoryview(bytearray(8)), b"abcdefgh")
        fastcopy.kernel("generic")(a, b)
        names: list[str] = fastcopy.kernels()
        info: dict = fastcopy.info()
        fastcopy.set_threads(1)
        n: int = fastcopy.get_threads()

        def produce(ch: Channel) -> None:
            ch.send(a, timeout=1.0)
            ch.recv(out=b)

        def zero_copy(tx: Channel, rx: Channel) -> None:
            from fastcopy.shm import LoanedArray
            loan: LoanedArray = tx.loan((4, 4), np.float64, timeout=1.0)
            loan[...] = 1
            tx.publish(loan)
            with tx.loan(16) as frame:
                frame[:] = 0
            tx.discard(tx.loan([2, 2], "u1"))
            view: np.ndarray = rx.recv_view(timeout=0.5)
            held: int = rx.held_bytes + rx.held_views
    """)
    assert status == 0, out


def test_wrong_calls_are_reported(tmp_path):
    out, status = run_mypy(tmp_path, """
        import fastcopy
        fastcopy.copy(1, "text")
        fastcopy.set_threads("two")
    """)
    assert status == 1
    assert "user_code.py:3: error" in out  # fastcopy.copy(1, "text")
    assert "user_code.py:4: error" in out and "set_threads" in out


def test_numpy_drop_ins_and_batched_calls_type_check(tmp_path):
    out, status = run_mypy(tmp_path, """
        import numpy as np
        import numpy.typing as npt
        import fastcopy

        a = np.zeros((4, 4))
        b = np.ones((4, 4))
        fastcopy.copyto(a, b)
        fastcopy.copyto(a, 1.0, casting="unsafe", where=a > 0)
        fastcopy.copyto(a, [[1, 2, 3, 4]] * 4, "same_kind")
        s: npt.NDArray[np.float64] = fastcopy.stack([a, b], axis=1, out=np.empty((4, 2, 4)))
        t = fastcopy.stack((a, b), dtype=None)
        c = fastcopy.concatenate([a, b], axis=None)
        d = fastcopy.concatenate([a, b], 0, np.empty((8, 4)), dtype=np.float64, casting="no")
        fastcopy.copy_many([a, bytearray(8)], [b, b"abcdefgh"])
        shape: tuple[int, ...] = t.shape + c.shape + d.shape
    """)
    assert status == 0, out


def test_wrong_drop_in_calls_are_reported(tmp_path):
    out, status = run_mypy(tmp_path, """
        import numpy as np
        import fastcopy
        a = np.zeros(4)
        fastcopy.copyto(a, a, casting="sometimes")
        fastcopy.copy_many(a, a)
        fastcopy.stack(a, axis="0")
    """)
    assert status == 1
    assert "user_code.py:5: error" in out  # casting is not a casting rule
    assert "user_code.py:6: error" in out  # copy_many takes sequences of buffers
    assert "user_code.py:7: error" in out  # axis is an int


def test_topic_calls_type_check(tmp_path):
    out, status = run_mypy(tmp_path, """
        import numpy as np
        from fastcopy.shm import MessagesLost, Subscriber, Topic

        def fan_out(name: str) -> None:
            t: Topic = Topic.create(name, slot_bytes=1 << 20, slots=8, history=2, overflow="drop")
            t.send(np.zeros(4), timeout=1.0)
            with t.loan((2, 2), np.float32) as a:
                a[:] = 1
            n: int = t.subscribers + t.published
            s: Subscriber = Topic.subscribe(name)
            try:
                x = s.recv(timeout=0.5)
                s.recv(out=np.empty(4))
                v: np.ndarray = s.recv_view()
            except MessagesLost as e:
                lost: int = e.count + s.lost
            held: int = s.held_views + s.held_bytes
            s.close()
            t.close()
            t.unlink()
    """)
    assert status == 0, out
    out, status = run_mypy(tmp_path, """
        from fastcopy.shm import Topic
        Topic.create("x", slot_bytes="big")
        Topic.create("x")
    """)
    assert status == 1
    assert "user_code.py:3: error" in out and "user_code.py:4: error" in out


# The optional extras' modules may be missing where the tests run (mypy then has nothing to read
# for them); torch is read as Any, since type-checking against torch's own annotations takes
# minutes.
PACKAGE_CONFIG = """
[mypy]
[mypy-zenoh.*,zmq.*,pyarrow.*,cpuinfo.*,matplotlib.*]
ignore_missing_imports = True
[mypy-torch.*]
ignore_missing_imports = True
follow_imports = skip
"""


def test_the_package_itself_type_checks(tmp_path):
    """The package's own code agrees with its annotations and with the stubs of _core."""
    config = tmp_path / "mypy.ini"
    config.write_text(PACKAGE_CONFIG)
    out, err, status = mypy_api.run(["--config-file", str(config), "--cache-dir", str(tmp_path / ".mypy_cache"),
                                     "-p", "fastcopy"])
    assert status == 0, out + err
    assert "Success" in out
