"""Arrays of other libraries through Channel and Topic: a torch tensor is sent as its numpy
view (dtype, shape, order), received into with recv(out=) and copied into a loan; a tensor
that cannot be read (requires grad, GPU memory) is refused by send and nothing is sent."""
from __future__ import annotations

import numpy as np
import pytest
from _fixtures import pair  # noqa: F401  (a fixture)

import fastcopy
from fastcopy import shm


class DeviceArray:
    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("a GPU array must be refused before its export is asked for")


def test_a_gpu_array_is_refused_by_send_and_recv_out_and_the_message_stays(pair):
    tx, rx = pair
    with pytest.raises(TypeError, match="CUDA"):
        tx.send(DeviceArray())
    assert rx.pending_bytes == 0
    tx.send(np.arange(3.0))
    with pytest.raises(TypeError, match="CUDA"):
        rx.recv(out=DeviceArray(), timeout=1)
    assert rx.recv(timeout=1).tolist() == [0, 1, 2]


def test_torch_tensors_through_a_channel(pair):
    torch = pytest.importorskip("torch")
    tx, rx = pair
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    tx.send(t)
    got = rx.recv(timeout=1)
    assert isinstance(got, np.ndarray) and got.dtype == np.int16 and np.array_equal(got, t.numpy())
    tx.send(t.t())                                   # non-contiguous: sent in C order
    out = torch.empty(4, 3, dtype=torch.int16)
    assert rx.recv(out=out, timeout=1) is out
    assert torch.equal(out, t.t())
    tx.send(t)
    wrong = torch.zeros(4, 3, dtype=torch.int16)
    with pytest.raises(ValueError, match="stays in the channel"):
        rx.recv(out=wrong, timeout=1)
    assert not wrong.any()
    assert rx.recv(timeout=1).shape == (3, 4)
    with pytest.raises(RuntimeError, match="requires grad"):
        tx.send(torch.ones(2, requires_grad=True))
    assert rx.pending_bytes == 0
    with tx.loan((3, 4), np.int16) as loan:
        fastcopy.copy(loan, t)
    assert np.array_equal(rx.recv(timeout=1), t.numpy())


def test_torch_tensors_through_a_topic():
    torch = pytest.importorskip("torch")
    with shm.Topic.create(slot_bytes=256, slots=4) as topic, shm.Topic.subscribe(topic.name) as sub:
        topic.send(torch.ones(5))
        out = torch.zeros(5)
        assert sub.recv(out=out, timeout=1) is out
        assert out.sum().item() == 5
