"""Fixtures shared by the shm tests; a test module imports the ones it uses (pytest finds a
fixture among the module's names)."""
from __future__ import annotations

import itertools
import os

import pytest

from fastcopy.shm import Channel, ChannelError

_names = itertools.count(1)


@pytest.fixture
def pair():
    """(producer, consumer) of a fresh 64 KiB Channel, both closed and the name removed after
    the test (closing an end the test already broke or closed is not an error here)."""
    tx = Channel.create(f"fcpair-{os.getpid()}-{next(_names)}", capacity=1 << 16)
    rx = Channel.attach(tx.name)
    yield tx, rx
    for end in (rx, tx):
        try:
            end.close()
        except ChannelError:
            pass
    tx.unlink()
