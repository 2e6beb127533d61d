"""Copies into and out of shared memory go to the thread pool from parallel.shared_from (or the
parallel threshold, whichever is larger); private copies from the threshold. Each test loads a
profile of its own with two threads, so that it holds whatever the CPU's built-in profile says."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fastcopy
from fastcopy import _core
from fastcopy.shm import Channel, Topic
from conftest import builtin_policy_without

KiB, MiB = 1 << 10, 1 << 20
PRIVATE, TO_SHARED, FROM_SHARED = 0, 1, 2


def profile_doc(**parallel) -> dict:
    """The built-in profile in the file format, without NT rules (no copy learns its store mode),
    with ``parallel`` as given."""
    doc = json.loads(_core.active_profile_json())
    doc["name"] = "shared-pool-test"
    for region in doc["regions"].values():
        region["nt"] = {"threshold": None, "kernel": None, "why": "test"}
    doc["parallel"] = dict({"threads": 0, "learn_from": None, "why": "test"}, **parallel)
    return doc


@pytest.fixture(autouse=True)
def two_threads():
    with builtin_policy_without("FASTCOPY_KERNEL", "FASTCOPY_PROFILE", "FASTCOPY_THREADS",
                                "FASTCOPY_SPLIT_LEARN_FROM"):
        fastcopy.set_threads(2)
        try:
            yield
        finally:
            fastcopy.set_threads(0)


def threads_planned(doc: dict, n: int, region: int) -> int:
    """The threads the profile plans for a copy of n bytes in `region` (addresses far apart)."""
    return _core.copy_plans(json.dumps(doc), [(1 << 40, 1 << 36, n, region)])[0][1]


def test_shared_copies_go_to_the_pool_from_shared_from_private_ones_from_the_threshold():
    doc = profile_doc(threshold=256 * KiB, shared_from=MiB)
    for region in (TO_SHARED, FROM_SHARED):
        assert threads_planned(doc, 512 * KiB, region) == 1
        assert threads_planned(doc, MiB - 1, region) == 1
        assert threads_planned(doc, MiB, region) == 2
    assert threads_planned(doc, 256 * KiB - 1, PRIVATE) == 1
    assert threads_planned(doc, 256 * KiB, PRIVATE) == 2
    assert threads_planned(doc, 512 * KiB, PRIVATE) == 2


def test_shared_from_below_the_threshold_changes_nothing():
    doc = profile_doc(threshold=MiB, shared_from=256 * KiB)
    for region in (PRIVATE, TO_SHARED, FROM_SHARED):
        assert threads_planned(doc, 512 * KiB, region) == 1
        assert threads_planned(doc, MiB, region) == 2
    _core.load_profile(json.dumps(doc), "test")
    assert _core.active_profile()["parallel"]["shared_from"] == MiB  # the size that applies


def test_shared_from_null_keeps_shared_copies_off_the_pool():
    doc = profile_doc(threshold=256 * KiB, shared_from=None)
    assert threads_planned(doc, 64 * MiB, TO_SHARED) == 1
    assert threads_planned(doc, 64 * MiB, FROM_SHARED) == 1
    assert threads_planned(doc, 64 * MiB, PRIVATE) == 2


def test_a_profile_without_shared_from_takes_the_built_in_value_and_writes_it_out():
    builtin = _core.active_profile()["parallel"]["shared_from"]
    doc = profile_doc(threshold=256 * KiB)
    _core.load_profile(json.dumps(doc), "test")
    want = builtin if builtin is None else max(builtin, 256 * KiB)
    assert _core.active_profile()["parallel"]["shared_from"] == want
    assert json.loads(_core.active_profile_json())["parallel"]["shared_from"] == want


@pytest.mark.parametrize("value", [0, 64 * KiB - 1, "1M", -1, 1.5])
def test_a_shared_from_below_the_least_or_not_a_size_is_refused(value):
    doc = profile_doc(threshold=256 * KiB, shared_from=value)
    with pytest.raises(ValueError, match="parallel.shared_from"):
        _core.load_profile(json.dumps(doc), "test")


def pool_handled() -> int:
    pool = fastcopy.info()["threads"]["pool"]
    return pool["parallel_copies"] + pool["busy_fallbacks"] + pool["backoff_fallbacks"] + pool["asleep_fallbacks"]


def test_topic_and_channel_copies_split_from_shared_from_and_private_copies_from_the_threshold():
    """Under threshold 256 KiB and shared_from 1 MiB: a Topic's send and recv(out=) of 1 MiB go to
    the pool (one copy each way); a Channel's send of 384 KiB (one copy into the ring: below
    pipelined_send_bytes) and a Topic's of 512 KiB do not; a private copy of 512 KiB does."""
    _core.load_profile(json.dumps(profile_doc(threshold=256 * KiB, shared_from=MiB)), "test")
    topic = Topic.create(f"fcsharedpool-{os.getpid()}", slot_bytes=2 * MiB, slots=2)
    sub = Topic.subscribe(topic.name)
    tx = Channel.create(f"fcsharedpool-ch-{os.getpid()}", capacity=4 * MiB)
    rx = Channel.attach(tx.name)
    try:
        for n, want in ((512 * KiB, 0), (MiB, 2)):
            src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
            out = np.zeros_like(src)
            before = pool_handled()
            topic.send(src)
            sub.recv(out=out)
            assert pool_handled() - before == want
            assert np.array_equal(out, src)
        src = np.random.default_rng(1).integers(0, 256, 384 * KiB, dtype=np.uint8)
        out = np.zeros_like(src)
        before = pool_handled()
        tx.send(src)
        rx.recv(out=out)
        assert pool_handled() - before == 0
        assert np.array_equal(out, src)
        dst = np.zeros(512 * KiB, np.uint8)
        before = pool_handled()
        fastcopy.copy(dst, np.ones(512 * KiB, np.uint8))
        assert pool_handled() - before == 1
    finally:
        sub.close()
        topic.close()
        rx.close()
        tx.close()
        tx.unlink()


def test_info_says_when_shared_copies_go_to_the_pool_only_where_it_differs():
    from fastcopy._report import collect_info, format_info

    def words(doc: dict) -> list:
        _core.load_profile(json.dumps(doc), "test")
        data = collect_info(brand=False)
        return [data["thresholds"]["parallel_shared_bytes"]] + [
            " ".join(format_info(data, verbose=v).split()) for v in (False, True)]

    shared, short, long = words(profile_doc(threshold=256 * KiB, shared_from=MiB))
    assert shared == MiB
    assert "copies into and out of shared memory from 1 MiB" in short
    assert "copies into and out of shared memory: on the thread pool from 1 MiB" in long
    shared, short, long = words(profile_doc(threshold=256 * KiB, shared_from=None))
    assert shared is None
    assert "copies into and out of shared memory never" in short
    shared, short, long = words(profile_doc(threshold=256 * KiB, shared_from=256 * KiB))
    assert shared == 256 * KiB
    assert "copies into and out of shared memory from" not in short
    assert "copies into and out of shared memory: on the thread pool" not in long
