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
