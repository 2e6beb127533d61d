"""Private copies the profile splits across the thread pool learn whether splitting pays now:
each size class from 256 KiB starts split, runs on the caller alone once timed copies show the
caller alone faster, and comes back to splitting when a trial shows that faster again. The
learner is fed chosen rates (``_core.simulate_private_split_modes``), so every test holds on
every CPU whatever its copies' real timings; the copies that follow are real and checked."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fastcopy
from fastcopy import _core
from fastcopy._report import collect_info, format_info

from conftest import builtin_policy_without

pytestmark = pytest.mark.kernels

KiB, MiB = 1 << 10, 1 << 20
N = 384 * KiB  # in the learner's first size class (256-512 KiB)


def reached_pool() -> int:
    """Copies handed to the pool (split, or alone for one of the pool's own reasons)."""
    s = _core.pool_stats()
    return s["parallel_copies"] + s["busy_fallbacks"] + s["backoff_fallbacks"] + s["asleep_fallbacks"]


@pytest.fixture(autouse=True)
def pool_from_256k():
    """A profile of its own: the built-in bands, the pool from 256 KiB (copies into and out of
    shared memory too), learning split or alone from 256 KiB whatever the built-in profile
    says, no NT rule (so no copy learns its store mode instead); two threads; a learner that
    has measured nothing."""
    with builtin_policy_without("FASTCOPY_KERNEL", "FASTCOPY_PROFILE", "FASTCOPY_THREADS",
                                "FASTCOPY_PARALLEL_THRESHOLD", "FASTCOPY_SPLIT_LEARN_FROM"):
        doc = json.loads(_core.active_profile_json())
        doc["name"] = "split-test"
        for region in doc["regions"].values():
            region["nt"] = {"threshold": None, "kernel": None, "why": "test"}
        doc["parallel"] = {"threshold": 256 * KiB, "threads": 0, "learn_from": 256 * KiB,
                           "shared_from": 256 * KiB, "why": "test"}
        _core.load_profile(json.dumps(doc), "test")
        fastcopy.set_threads(2)
        _core.reset_private_split_modes()
        try:
            yield
        finally:
            fastcopy.set_threads(0)
    _core.reset_private_split_modes()


def arrays(n: int, seed: int):
    src = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return np.zeros_like(src), src


def test_a_class_starts_split_and_its_copies_reach_the_pool():
    dst, src = arrays(N, 1)
    assert _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    before = reached_pool()
    for _ in range(3):  # fewer than the first trial of the caller alone
        fastcopy.copy(dst, src)
    assert reached_pool() - before == 3
    assert np.array_equal(dst, src)
    # Recorded: those a worker took part in (a worker still waking took part in none).
    assert all(c["mode"] == "split" and c["split_copies"] <= 3 and c["alone_copies"] == 0
               for c in _core.private_split_modes())


def test_slower_split_copies_hand_over_to_the_caller_alone():
    """Split copies slower than the caller alone (the host has moved the CPUs apart): the class runs
    alone; its copies then never reach the pool (until the next trial of splitting) and copy
    right; a size class of its own (1 MiB) still splits."""
    # Split copies far slower than any real copy runs (even under an emulator): the real alone
    # copies below, timed too, never make splitting look faster.
    split = _core.simulate_private_split_modes(N, 50.0, 0.001, 40)
    assert split < 40
    dst, src = arrays(N, 2)
    assert not _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    rule = _core.private_split_rule()
    before = reached_pool()
    for _ in range(rule["explore_min"] - 1):  # before the next trial
        fastcopy.copy(dst, src)
        assert np.array_equal(dst, src)
        dst[:] = 0
    assert reached_pool() == before
    big_dst, big_src = arrays(MiB, 3)
    assert _core.learned_split(big_dst.ctypes.data, big_src.ctypes.data, MiB)
    fastcopy.copy(big_dst, big_src)
    assert reached_pool() == before + 1 and np.array_equal(big_dst, big_src)
    (c,) = [c for c in _core.private_split_modes() if c["sizes"] == "256-512 KiB"]
    assert c["mode"] == "alone" and c["switches"] == 1 and c["alone_gbps"] > c["split_gbps"] > 0


def test_splitting_comes_back_when_a_trial_shows_it_faster():
    _core.simulate_private_split_modes(N, 50.0, 30.0, 40)
    dst, src = arrays(N, 4)
    assert not _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    rule = _core.private_split_rule()
    longest = rule["explore_max_while_alone"] + rule["split_trial_copies"] + rule["judge_after"] + 2
    split = _core.simulate_private_split_modes(N, 50.0, 85.0, longest)
    assert split >= rule["split_trial_copies"]
    assert _core.learned_split(dst.ctypes.data, src.ctypes.data, N)


@pytest.mark.parametrize("case", ["below the learner", "forced kernel", "one thread", "overlap", "below the pool"])
def test_copies_the_learner_does_not_decide(case):
    """Below 256 KiB (the pool from 128 KiB here) a copy splits as the profile says; a forced
    kernel, one thread or overlapping ranges never split; below the threshold nothing splits.
    None of them is recorded."""
    doc = json.loads(_core.active_profile_json())
    doc["parallel"]["threshold"] = 128 * KiB
    _core.load_profile(json.dumps(doc), "test")
    n = {"below the learner": 200 * KiB, "below the pool": 100 * KiB}.get(case, N)
    buf = np.random.default_rng(5).integers(0, 256, 2 * n, dtype=np.uint8)
    dst, src = buf[n:], buf[:n]
    if case == "overlap":
        dst = buf[n // 2:n // 2 + n]
    if case == "forced kernel":
        os.environ["FASTCOPY_KERNEL"] = "generic"
        _core.init_policy()
    if case == "one thread":
        fastcopy.set_threads(1)
    want = case == "below the learner"
    assert _core.learned_split(dst.ctypes.data, src.ctypes.data, n) is want
    expect = src.copy()
    before = reached_pool()
    fastcopy.copy(dst, src)
    assert (reached_pool() - before == 1) is want
    assert np.array_equal(dst, expect)
    assert _core.private_split_modes() == []


def test_info_says_what_was_learned():
    _core.simulate_private_split_modes(N, 50.0, 30.0, 40)
    data = collect_info(brand=False)
    learned = data["private_split_modes"]
    assert learned["rule"]["min_bytes"] == 256 * KiB and learned["rule"]["why"]
    assert [(c["sizes"], c["mode"]) for c in learned["classes"]] == [("256-512 KiB", "alone")]
    text = format_info(data, verbose=True)
    flat = " ".join(text.split())
    assert "learned split: private copies from 256 KiB split or run alone" in flat and "256-512 KiB: alone now" in flat, text
    summary = " ".join(format_info(data).split())
    assert "private copies from 256 KiB split or run alone, whichever ran faster lately" in summary, summary


def test_simulate_refuses_bad_rates():
    with pytest.raises(ValueError, match="rates must be positive"):
        _core.simulate_private_split_modes(N, 0.0, 30.0, 1)
    with pytest.raises(ValueError, match="copies at least 0"):
        _core.simulate_private_split_modes(N, 50.0, 30.0, -1)


def test_a_split_copy_no_worker_took_part_in_is_not_recorded():
    """A copy that reaches the pool while its worker sleeps, more than 500 us after the last
    one (isolated, under 2 MiB), runs on the caller alone inside the pool: it says nothing about
    splitting and is not recorded; one that a worker took part in is."""
    import time

    dst, src = arrays(N, 6)
    k2 = fastcopy.kernel("generic", threads=2)
    k2(dst, src)  # starts the pool (a forced kernel: nothing learned)
    shown = 0
    give_up = time.perf_counter() + 20
    while not shown and time.perf_counter() < give_up:
        time.sleep(0.005)  # past the workers' spin: they sleep
        if _core.pool_sleeping_workers() != 1:
            continue
        before = _core.pool_stats()["asleep_fallbacks"]
        fastcopy.copy(dst, src)
        if _core.pool_stats()["asleep_fallbacks"] == before + 1:
            shown = 1
    assert shown, "no copy found the worker asleep in 20 s"
    assert np.array_equal(dst, src)
    assert _core.private_split_modes() == []  # nothing recorded
    # Copies back to back: the worker wakes and takes part in some (give it up to 5 s on a
    # loaded machine); those are recorded.
    give_up = time.perf_counter() + 5
    while not any(c["split_copies"] for c in _core.private_split_modes()) and time.perf_counter() < give_up:
        fastcopy.copy(dst, src)
    (c,) = _core.private_split_modes()
    assert c["split_copies"] >= 1


def test_a_shared_region_copy_is_not_decided_by_the_split_learner():
    """Copies into shared memory (region 1) split as the profile says, whatever private copies
    of their size learned."""
    _core.simulate_private_split_modes(N, 50.0, 30.0, 40)
    dst, src = arrays(N, 7)
    assert not _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    before = reached_pool()
    _core.copy_region(dst, src, 1)
    assert reached_pool() == before + 1
    assert np.array_equal(dst, src)


@pytest.mark.skipif("avx2_nt" not in fastcopy.kernels(), reason="avx2_nt is not usable on this CPU: no NT rule to learn")
def test_copies_that_learn_their_store_mode_always_split():
    """From nt.learn_from copies learn their store mode instead, on the pool: learned_split says
    so whatever the split learner holds for their size."""
    doc = json.loads(_core.active_profile_json())
    doc["regions"]["private"]["nt"] = {"threshold": 256 * MiB, "kernel": "avx2_nt", "min_page_distance": 512,
                                       "min_page_distance_below": None, "learn_from": 256 * KiB, "why": "test"}
    _core.load_profile(json.dumps(doc), "test")
    _core.simulate_private_split_modes(N, 50.0, 30.0, 40)
    dst, src = arrays(N, 8)
    assert _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    before = reached_pool()
    fastcopy.copy(dst, src)
    assert reached_pool() == before + 1 and np.array_equal(dst, src)
    _core.reset_private_store_modes()


def test_a_split_copy_that_woke_the_worker_is_not_recorded():
    """A copy that had to wake the sleeping worker times the wake-up (the worker joins late)
    as much as the split: not recorded even where the worker then took part."""
    import time

    n = 16 * MiB  # long enough (about 0.4 ms) for a woken worker to join
    dst, src = arrays(n, 9)
    fastcopy.kernel("generic", threads=2)(dst, src)  # starts the pool (a forced kernel: nothing learned)
    shown = 0
    give_up = time.perf_counter() + 20
    while not shown and time.perf_counter() < give_up:
        time.sleep(0.005)  # past the worker's spin: it sleeps
        if _core.pool_sleeping_workers() != 1:
            continue
        before = _core.pool_stats()
        fastcopy.copy(dst, src)
        after = _core.pool_stats()
        if after["parallel_copies"] > before["parallel_copies"] and after["chunks_by_workers"] > before["chunks_by_workers"]:
            shown = 1  # woke the worker, which then took part
        else:
            _core.reset_private_split_modes()
    assert shown, "no copy in 20 s woke the worker and had it take part"
    assert np.array_equal(dst, src)
    assert _core.private_split_modes() == []


def test_info_says_nothing_of_the_split_where_no_copy_learns_it():
    """One thread, or every pooled copy learning its store mode instead: info() names no split
    learning, in the summary or the verbose text."""
    fastcopy.set_threads(1)
    for text in (format_info(collect_info(brand=False)), format_info(collect_info(brand=False), verbose=True)):
        assert "split or run alone" not in " ".join(text.split())
    fastcopy.set_threads(2)
    if "avx2_nt" in fastcopy.kernels():
        doc = json.loads(_core.active_profile_json())
        doc["regions"]["private"]["nt"] = {"threshold": 256 * MiB, "kernel": "avx2_nt", "min_page_distance": 512,
                                           "min_page_distance_below": None, "learn_from": 256 * KiB, "why": "test"}
        _core.load_profile(json.dumps(doc), "test")
        for text in (format_info(collect_info(brand=False)), format_info(collect_info(brand=False), verbose=True)):
            assert "split or run alone" not in " ".join(text.split())


def load_learn_from(learn_from):
    doc = json.loads(_core.active_profile_json())
    doc["parallel"]["learn_from"] = learn_from
    _core.load_profile(json.dumps(doc), "test")


def test_a_profile_without_split_learning_always_splits():
    """parallel.learn_from null: split copies slower than the caller alone change nothing; every
    copy reaches the pool and none is recorded."""
    load_learn_from(None)
    assert _core.active_profile()["parallel"]["learn_from"] is None
    _core.simulate_private_split_modes(N, 50.0, 0.001, 40)  # the learner, were it asked, says alone
    _core.reset_private_split_modes()
    dst, src = arrays(N, 8)
    assert _core.learned_split(dst.ctypes.data, src.ctypes.data, N)
    before = reached_pool()
    for _ in range(20):  # more than the first trial of the caller alone
        fastcopy.copy(dst, src)
    assert reached_pool() - before == 20 and np.array_equal(dst, src)
    assert _core.private_split_modes() == []
    flat = " ".join(format_info(collect_info(brand=False), verbose=True).split())
    assert "learned split:" not in flat


def test_learning_starts_at_the_profile_s_learn_from():
    """parallel.learn_from 1 MiB: a 384 KiB copy always splits (not recorded), a 1 MiB copy
    learns; info says from where."""
    load_learn_from(MiB)
    small_dst, small_src = arrays(N, 9)
    dst, src = arrays(MiB, 10)
    assert _core.learned_split(small_dst.ctypes.data, small_src.ctypes.data, N)
    for _ in range(3):
        fastcopy.copy(small_dst, small_src)
    assert _core.private_split_modes() == []
    _core.simulate_private_split_modes(MiB, 50.0, 0.001, 40)
    assert not _core.learned_split(dst.ctypes.data, src.ctypes.data, MiB)
    fastcopy.copy(dst, src)
    assert np.array_equal(dst, src) and np.array_equal(small_dst, small_src)
    summary = " ".join(format_info(collect_info(brand=False)).split())
    assert "private copies from 1 MiB split or run alone" in summary, summary


@pytest.mark.parametrize("value, want", [("off", None), ("1M", MiB), (" 512K\n", 512 * KiB)])
def test_fastcopy_split_learn_from_moves_and_turns_off_the_learning(value, want):
    base = json.loads(_core.active_profile_json())
    os.environ["FASTCOPY_SPLIT_LEARN_FROM"] = value
    try:
        _core.init_policy()
        assert _core.active_profile()["parallel"]["learn_from"] == want
        assert _core.overrides()["FASTCOPY_SPLIT_LEARN_FROM"] == ("off" if want is None else want)
        assert any(o.startswith("FASTCOPY_SPLIT_LEARN_FROM=") for o in _core.active_profile()["overrides"])
        assert json.loads(_core.base_profile_json()) == base  # the base profile is not edited
        _core.simulate_private_split_modes(N, 50.0, 0.001, 40)
        _core.reset_private_split_modes()
        dst, src = arrays(N, 11)
        before = reached_pool()
        for _ in range(20):
            fastcopy.copy(dst, src)
        assert reached_pool() - before == 20 and np.array_equal(dst, src)
        assert _core.private_split_modes() == []  # 384 KiB is below each value
    finally:
        os.environ.pop("FASTCOPY_SPLIT_LEARN_FROM")
        _core.init_policy()


@pytest.mark.parametrize("value", ["100K", "4Q", "-1", "1.5M"])
def test_bad_fastcopy_split_learn_from_is_refused_and_changes_nothing(value):
    before = _core.active_profile_json()
    os.environ["FASTCOPY_SPLIT_LEARN_FROM"] = value
    try:
        with pytest.raises(ValueError) as err:
            _core.init_policy()
        assert "FASTCOPY_SPLIT_LEARN_FROM" in str(err.value) and value in str(err.value) and "256K" in str(err.value)
        assert _core.active_profile_json() == before
    finally:
        os.environ.pop("FASTCOPY_SPLIT_LEARN_FROM")


@pytest.mark.parametrize("learn_from", [0, 128 * KiB, _core.profile_limits()["min_split_learn_from"] - 1, "1M", -1])
def test_a_profile_s_learn_from_below_the_least_or_not_a_size_is_refused(learn_from):
    doc = json.loads(_core.active_profile_json())
    doc["parallel"]["learn_from"] = learn_from
    with pytest.raises(ValueError, match="parallel.learn_from"):
        _core.validate_profile(json.dumps(doc))


def test_a_profile_without_learn_from_takes_the_built_in_value():
    matched = max((b for b in _core.builtin_profiles() if b["matches"]), key=lambda b: b["specificity"])
    builtin = matched["profile"]["parallel"]["learn_from"]
    doc = json.loads(_core.active_profile_json())
    del doc["parallel"]["learn_from"]
    _core.load_profile(json.dumps(doc), "test")
    assert _core.active_profile()["parallel"]["learn_from"] == builtin
    assert json.loads(_core.active_profile_json())["parallel"]["learn_from"] == builtin
