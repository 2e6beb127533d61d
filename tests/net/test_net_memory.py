"""fastcopy.net.keep_freed_memory: after it, a large block comes from the C library's heap instead
of a mapping of its own (glibc's mallinfo2: hblkhd, the bytes in mapped blocks); bad arguments
are clear errors; ``python -m fastcopy bridge`` calls it in its process."""
from __future__ import annotations

import argparse
import ctypes
import platform

import pytest

from _child import explain, run_script
from conftest import no_subprocess

pytestmark = [pytest.mark.net]

GLIBC_MALLINFO2 = platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")

MAPPED_BYTES_OF_AN_8_MIB_ARRAY = """
    import ctypes, sys
    import numpy as np
    import fastcopy.net as net

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "keep":
        assert net.keep_freed_memory() is True
    before = libc.mallinfo2().hblkhd
    block = np.empty(8 << 20, np.uint8)
    print(libc.mallinfo2().hblkhd - before)
"""


@no_subprocess
@pytest.mark.skipif(not GLIBC_MALLINFO2, reason="needs glibc's mallinfo2 (glibc 2.33 or later)")
def test_keep_freed_memory_serves_a_large_block_from_the_heap(tmp_path):
    mapped = {}
    for mode in ("default", "keep"):
        proc = run_script(tmp_path, MAPPED_BYTES_OF_AN_8_MIB_ARRAY, mode)
        assert proc.returncode == 0, explain(proc)
        mapped[mode] = int(proc.stdout.split()[-1])
    assert mapped["default"] >= 8 << 20, mapped  # glibc maps a block this large by default
    assert mapped["keep"] == 0, mapped


def test_keep_freed_memory_rejects_bad_sizes():
    import fastcopy.net as net

    for bad in (0, -1, 1 << 70):
        with pytest.raises(ValueError, match="positive and below"):
            net.keep_freed_memory(bad)
    with pytest.raises(ValueError, match="glibc's ceiling"):
        net.keep_freed_memory(1 << 40)
    for bad in ("1", 1.5, True):
        with pytest.raises(TypeError, match="must be an int"):
            net.keep_freed_memory(bad)


def test_bridge_command_keeps_freed_memory_in_its_process(monkeypatch):
    import fastcopy.net as net
    from fastcopy.net import cli

    calls = []

    def refuse(*args, **kw):
        raise ValueError("refused by the test")

    monkeypatch.setattr(net, "keep_freed_memory", lambda *args: calls.append(args) or True)
    monkeypatch.setattr(net, "Bridge", refuse)
    args = argparse.Namespace(direction="into", topic="t", key="k", listen=[], connect=[], overflow="block",
                              slot_bytes=1024, slots=None)
    assert cli.run(args) == 2
    assert calls == [()]
