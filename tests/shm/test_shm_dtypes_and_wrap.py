"""Dtypes in message headers, and sent messages at the ring's end.

Every dtype a Channel or a Topic accepts arrives exactly as it was sent: field names and
titles in any script, offsets and itemsize padding, nested structures, sub-arrays, metadata,
record types. A dtype whose description cannot cross (metadata or a title that is not a
Python literal, a scalar type the header cannot name) is refused by ``send`` and ``loan``
with TypeError, nothing is sent, and the channel goes on. A sent message that would wrap
around the ring's end goes to its start, so ``recv_view`` returns it in place.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from _shm_layout import CHANNEL, peek

from fastcopy.shm import Channel, ChannelError, Topic

ENDS = ["channel", "topic"]
WAYS = ["send", "loan"]


@pytest.fixture(params=ENDS)
def ends(request):
    """(producer, consumer) of a Channel or of a Topic."""
    if request.param == "channel":
        tx = Channel.create(capacity=1 << 16)
        rx = Channel.attach(tx.name)
    else:
        tx = Topic.create(slot_bytes=1 << 14, slots=4)
        rx = Topic.subscribe(tx.name)
    yield tx, rx
    for c in (rx, tx):
        try:
            c.close()
        except ChannelError:
            pass
    tx.unlink()


def exact(dt: np.dtype):
    """Everything that describes a dtype, recursively: stricter than ``==``, which ignores
    metadata and the scalar type of a structure."""
    meta = None if dt.metadata is None else dict(dt.metadata)
    key = [type(dt), dt.type, dt.str, dt.itemsize, dt.alignment, dt.isalignedstruct, meta]
    if dt.subdtype is not None:
        key.append((exact(dt.subdtype[0]), dt.subdtype[1]))
    if dt.fields is not None:
        key.append([(n, exact(dt.fields[n][0]), dt.fields[n][1], dt.fields[n][2:]) for n in dt.names])
    return key


def put(tx, way: str, a: np.ndarray) -> None:
    if way == "send":
        tx.send(a, timeout=5)
    else:
        with tx.loan(a.shape, a.dtype, timeout=5) as slot:
            slot.view(np.uint8)[...] = a.view(np.uint8)   # padding bytes too


def filled(dt: np.dtype, shape=(3,)) -> np.ndarray:
    raw = np.random.default_rng(7).integers(0, 256, dt.itemsize * int(np.prod(shape)), dtype=np.uint8)
    return np.frombuffer(raw.tobytes(), dt).reshape(shape)


def nothing_pending(rx) -> bool:
    if isinstance(rx, Channel):
        return rx.peek(timeout=0) is None
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0)
    return True


# ---- every dtype arrives exactly ------------------------------------------------------------
POINT = np.dtype([("x", "<f4"), ("y", "<f4")])
TITLED = np.dtype({"names": ["a", "b"], "formats": ["<f8", "<i2"], "titles": ["Alpha", None]})
CARRIED = {
    "non-ascii-names": np.dtype([("\u00e9t\u00e9", "<f4"), ("\u65e5\u672c", "<i2"), ("\U0001f600", "u1")]),
    "names-with-quotes-and-controls": np.dtype([("a'b\"c\\d", "<f4"), ("tab\there\nnewline", "<i8")]),
    "titles": TITLED,
    "non-ascii-titles": np.dtype({"names": ["t"], "formats": ["<f8"], "titles": ["\u00c9t\u00e9 \u2103"]}),
    "int-title": np.dtype({"names": ["a"], "formats": ["<u4"], "titles": [3]}),
    "offsets-and-itemsize-padding": np.dtype({"names": ["a", "b"], "formats": ["u1", "<f8"],
                                              "offsets": [3, 16], "itemsize": 40}),
    "offsets-out-of-order": np.dtype({"names": ["late", "early"], "formats": ["<i4", "<i4"], "offsets": [8, 0]}),
    "aligned": np.dtype([("c", "u1"), ("d", "<f8")], align=True),
    "nested": np.dtype([("p", POINT), ("q", [("r", ">i2"), ("s", TITLED)], (2,))]),
    "subarray-of-struct": np.dtype([("grid", POINT, (2, 3))]),
    "subarray-field": np.dtype([("m", "<f8", (2, 2)), ("v", "S3", (4,))]),
    "metadata": np.dtype("<f8", metadata={"unit": "m/s", "scale": 0.5, "tags": ["a", 1, (2, b"x")]}),
    "empty-metadata": np.dtype("<i4", metadata={}),
    "non-ascii-metadata": np.dtype("<i2", metadata={"\u00e9": "\u00e9t\u00e9", "set": {1, 2}}),
    "struct-metadata": np.dtype(POINT, metadata={"frame": "world"}),
    "field-metadata": np.dtype([("a", np.dtype("<u2", metadata={"enum": {"RED": 0, "BLUE": 1}})), ("b", "<f4")]),
    "subarray-metadata": np.dtype([("s", np.dtype(("<f4", (2,)), metadata={"k": None}))]),
    "record": np.dtype((np.record, [("a", "<i8"), ("b", "S2")])),
    "record-with-metadata": np.dtype(np.dtype((np.record, POINT)), metadata={"x": True}),
    "plain": np.dtype(">c16"),
    "longlong": np.dtype("q"),           # '<i8' like np.int64, but its own scalar type on Linux
    "ulonglong-big-endian-field": np.dtype([("u", ">Q"), ("i", np.intc)]),
    "datetime": np.dtype("<M8[ns]"),
    "unicode": np.dtype("<U5"),
}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", sorted(CARRIED))
def test_every_dtype_arrives_exactly_as_sent(ends, way, name):
    tx, rx = ends
    dt = CARRIED[name]
    a = filled(dt)
    put(tx, way, a)
    got = rx.recv(timeout=5)
    assert exact(got.dtype) == exact(dt)
    assert got.shape == a.shape and got.tobytes() == a.tobytes()
    put(tx, way, a)
    out = np.zeros_like(a)
    assert rx.recv(out, timeout=5) is out          # recv(out=) with the sender's own dtype
    assert out.tobytes() == a.tobytes()
    put(tx, way, a)
    v = rx.recv_view(timeout=5)
    assert exact(v.dtype) == exact(dt) and v.tobytes() == a.tobytes()
    del v


@pytest.mark.parametrize("way", WAYS)
def test_a_non_ascii_field_name_loses_no_message(ends, way):
    """The name crosses (escaped in the header); the messages after it arrive too."""
    tx, rx = ends
    a = np.zeros(2, [("\u00e9t\u00e9", "f4")])
    a["\u00e9t\u00e9"] = [1.5, -2.0]
    put(tx, way, a)
    put(tx, way, np.arange(5, dtype=np.int64))
    got = rx.recv(timeout=5)
    assert got.dtype.names == ("\u00e9t\u00e9",) and got["\u00e9t\u00e9"].tolist() == [1.5, -2.0]
    assert rx.recv(timeout=5).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("way", WAYS)
def test_titles_cross_and_name_their_fields(ends, way):
    tx, rx = ends
    a = np.zeros(3, TITLED)
    a["Alpha"] = [1.0, 2.0, 3.0]
    put(tx, way, a)
    got = rx.recv(timeout=5)
    assert got.dtype == TITLED and got.dtype.fields["a"][2] == "Alpha"
    assert got["Alpha"].tolist() == [1.0, 2.0, 3.0] and got["a"].tolist() == [1.0, 2.0, 3.0]


# ---- what cannot cross is refused, and nothing is sent --------------------------------------
class Opaque:
    def __repr__(self) -> str:
        return "1"


class MyVoid(np.void):
    pass


REFUSED = {
    "metadata-holding-a-type": (np.dtype("<f8", metadata={"vlen": str}), "metadata"),
    "metadata-holding-nan": (np.dtype("<f8", metadata={"fill": float("nan")}), "metadata"),
    "metadata-holding-an-object": (np.dtype("<f8", metadata={"o": Opaque()}), "metadata"),
    "field-metadata-holding-an-array": (np.dtype([("a", np.dtype("<i4", metadata={"arr": np.zeros(2)}))]),
                                        "metadata"),
    "object-title": (np.dtype({"names": ["a"], "formats": ["<f8"], "titles": [Opaque()]}), "title"),
    "void-subclass": (np.dtype((MyVoid, [("a", "<f8")])), "MyVoid"),
}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_dtype_that_cannot_cross_is_refused_and_nothing_is_sent(ends, way, name):
    tx, rx = ends
    dt, word = REFUSED[name]
    a = np.zeros(2, dt)
    with pytest.raises(TypeError, match=word) as err:
        put(tx, way, a)
    assert str(err.value).startswith("send:" if way == "send" else "loan:")
    assert "cannot" in str(err.value)
    assert nothing_pending(rx)
    put(tx, way, np.arange(3, dtype=np.uint16))   # the channel goes on
    assert rx.recv(timeout=5).tolist() == [0, 1, 2]


@pytest.mark.parametrize("way", WAYS)
def test_a_dtype_description_longer_than_the_header_allows_is_refused(ends, way):
    """The header holds 1024 characters of dtype text; characters outside ASCII take 4 to 10
    there (escaped). A longer description raises ValueError (a size limit, like ndim > 64)."""
    tx, rx = ends
    fits = np.dtype([("\u00e9" * 20 + str(i), "<f4") for i in range(8)])      # 80 characters a name
    too_long = np.dtype([("\u00e9" * 20 + str(i), "<f4") for i in range(12)])
    put(tx, way, np.zeros(1, fits))
    assert rx.recv(timeout=5).dtype == fits
    with pytest.raises(ValueError, match="1024"):
        put(tx, way, np.zeros(1, too_long))
    assert nothing_pending(rx)
    put(tx, way, np.arange(3, dtype=np.uint16))
    assert rx.recv(timeout=5).tolist() == [0, 1, 2]


# ---- a sent message that would wrap goes to the ring's start, in place ----------------------
def _segment_ranges(name: str):
    """The address ranges at which this process maps /dev/shm/<name>."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == f"/dev/shm/{name}":
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    assert ranges, f"/dev/shm/{name} is not mapped"
    return ranges


def _head(name: str) -> int:
    with open(f"/dev/shm/{name}", "rb") as f:
        return peek(f.read(CHANNEL["header_bytes"]), CHANNEL, "head")  # bytes ever written


def test_a_sent_message_that_would_wrap_is_received_as_a_view_into_the_segment():
    """A send whose message would cross the ring's end pads to the ring's start (as a loan
    does): recv_view's array lies inside the consumer's mapping of the segment and holds its
    slot, where a copy would lie in the process heap."""
    with Channel.create(capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        wrapped = 0
        for i, size in enumerate([20000, 20000, 30000, 30000, 12345, 25000, 31000, 8000, 30000]):
            m = (np.arange(size) * (i + 1)).astype(np.uint8)
            before = _head(tx.name)
            tx.send(m, timeout=5)
            padded = _head(tx.name) - before != 64 + (size + 63) // 64 * 64
            wrapped += padded
            v = rx.recv_view(timeout=5)
            addr = v.__array_interface__["data"][0]
            inside = [lo <= addr and addr + v.nbytes <= hi for lo, hi in _segment_ranges(rx.name)]
            assert any(inside), (i, size, padded)
            assert rx.held_views == 1 and not v.flags.writeable
            assert np.array_equal(v, m)
            del v
        assert wrapped >= 3


def test_a_message_larger_than_the_ring_still_streams_and_comes_back_as_a_copy():
    with Channel.create(capacity=1 << 16) as tx, Channel.attach(tx.name) as rx:
        m = (np.arange(200_000) % 251).astype(np.uint8)
        sender = threading.Thread(target=tx.send, args=(m,), kwargs={"timeout": 30})
        sender.start()
        v = rx.recv_view(timeout=30)
        sender.join(30)
        assert not sender.is_alive()
        assert np.array_equal(v, m) and not v.flags.writeable and rx.held_views == 0
        addr = v.__array_interface__["data"][0]
        assert not any(lo <= addr < hi for lo, hi in _segment_ranges(rx.name))
