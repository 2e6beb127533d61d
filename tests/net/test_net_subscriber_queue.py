"""fastcopy.net.Subscriber's queue without Zenoh: samples handed to it in a fixed order (as
Zenoh's thread would), then received. Drop mode keeps the newest messages, counts every loss
exactly, and never delivers a torn message."""
from __future__ import annotations

import numpy as np
import pytest

from fastcopy.net import Subscriber
from fastcopy.net._wire import encode_parts
from fastcopy.shm import MessagesLost

pytestmark = pytest.mark.net


class _Payload:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def to_bytes(self) -> bytes:
        return self.data


class _Sample:
    def __init__(self, data: bytes, piece: bool) -> None:
        self.payload = _Payload(data)
        self.attachment = b"P" if piece else None


class _Session:
    def declare_subscriber(self, key, callback):
        return self

    def undeclare(self) -> None:
        pass


def _feed(sub, parts) -> None:
    for k, buf in enumerate(parts):
        sub._on_sample(_Sample(buf, k > 0))


def _drain(sub):
    """(values of the messages received, messages counted lost)."""
    got, lost = [], 0
    while True:
        try:
            arr = sub.recv(timeout=0)
        except MessagesLost as exc:
            lost += exc.count
            continue
        except TimeoutError:
            return got, lost
        assert (arr == arr.flat[0]).all(), "torn message"
        got.append(int(arr.flat[0]))


def _started(capacity: int, pieces_held: int) -> Subscriber:
    """A drop-mode subscriber that has received publisher 7's message 0 (its count starts there)."""
    sub = Subscriber("k", _Session(), capacity=capacity, overflow="drop")
    sub.PIECES_HELD = pieces_held
    _feed(sub, list(encode_parts(np.full(4, 0, np.int32), 0, 7)))
    assert sub.recv(timeout=0).tolist() == [0] * 4
    return sub


@pytest.mark.parametrize("pieces_held", [3, 5, 8])
def test_drop_mode_with_few_pieces_held_keeps_the_newest_messages_whole(pieces_held):
    """Messages of a head and three pieces, 20 of them, none read: the pieces held bound the
    queue, older messages make room, and the newest ones arrive whole; received + lost == 20."""
    sub = _started(8, pieces_held)
    n = 20
    for k in range(1, n + 1):
        _feed(sub, list(encode_parts(np.full(400, k, np.int32), k, 7, 400)))
        assert sub._pieces <= pieces_held and sub._heads <= 8
    got, lost = _drain(sub)
    assert got[-1] == n and got == sorted(got) and len(got) >= 1
    assert len(got) + lost == n and sub.lost == lost
    sub.close()


def test_drop_mode_drops_leftover_pieces_before_newer_messages():
    """Pieces of a message recv has begun make room before the pieces of the newest message;
    the begun message is then counted lost, the newest arrives whole."""
    sub = _started(8, 3)
    first = list(encode_parts(np.full(300, 1, np.int32), 1, 7, 400))   # head + 2 pieces
    second = list(encode_parts(np.full(300, 2, np.int32), 2, 7, 400))
    _feed(sub, first[:1])
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0)           # takes the head, waits for its pieces
    for buf in first[1:] + second[:1]:
        sub._on_sample(_Sample(buf, buf is not second[0]))
    for buf in second[1:]:            # the third piece queued: one of the first's pieces goes
        sub._on_sample(_Sample(buf, True))
        assert sub._pieces <= 3
    got, lost = _drain(sub)
    assert got == [2] and lost == 1
    sub.close()
