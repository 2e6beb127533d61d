"""Shared helpers of the fastcopy.net tests: free loopback ports, the skip when zenoh is missing."""
from __future__ import annotations

import importlib.util
import socket

import pytest

HAVE_ZENOH = importlib.util.find_spec("zenoh") is not None
needs_zenoh = pytest.mark.skipif(not HAVE_ZENOH, reason="eclipse-zenoh is not installed (pip install 'fastcopy[net]')")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint(port: int) -> str:
    return f"tcp/127.0.0.1:{port}"


def _put_field(buf: bytearray, fields: dict, name: str, value) -> None:
    offset, size = fields[name]
    buf[offset:offset + size] = value if isinstance(value, bytes) else int(value).to_bytes(size, "little")


def wire_head(kind: bytes = b"M", order: bytes = b"C", shape=(), dtype: bytes = b"<f4", source: int = 0,
              seq: int = 0, nbytes: int = 0, version=None) -> bytes:
    """A fastcopy.net head written field by field where _core.net_wire_layout() puts each field
    (little-endian), then its shape and dtype text: what a test needs to forge a payload."""
    from fastcopy import _core

    layout = _core.net_wire_layout()
    fields = layout["head_fields"]
    buf = bytearray(layout["head_bytes"])
    for name, value in (("magic", layout["magic"]), ("version", layout["version"] if version is None else version),
                        ("kind", kind), ("order", order), ("ndim", len(shape)), ("dtype_len", len(dtype)),
                        ("source", source), ("seq", seq), ("nbytes", nbytes)):
        _put_field(buf, fields, name, value)
    return bytes(buf) + b"".join(int(x).to_bytes(8, "little") for x in shape) + dtype


def piece_head(source: int, seq: int, offset: int) -> bytes:
    """A fastcopy.net piece's head, as wire_head writes a head."""
    from fastcopy import _core

    layout = _core.net_wire_layout()
    buf = bytearray(layout["piece_head_bytes"])
    for name, value in (("magic", layout["magic"]), ("version", layout["version"]), ("kind", layout["piece"]),
                        ("source", source), ("seq", seq), ("offset", offset)):
        _put_field(buf, layout["piece_fields"], name, value)
    return bytes(buf)
