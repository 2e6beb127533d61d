"""Private copies that learn their store mode (the profile's ``nt.learn_from``): both modes run
and copy correctly, the trial comes where the rule says, info() shows what was learned,
FASTCOPY_NT_LEARN_FROM moves it or turns it off, and a profile file states or inherits it.

The tests load a profile of their own (an NT rule with ``avx2_nt`` and a ``learn_from``) so that
they hold on every CPU with AVX2, whatever its built-in profile says."""
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

STREAMING = "avx2_nt"
needs_streaming = pytest.mark.skipif(STREAMING not in fastcopy.kernels(),
                                     reason=f"{STREAMING} is not usable on this CPU: nothing to choose from")
PAGE = 4096
MiB = 1 << 20


@pytest.fixture(autouse=True)
def builtin_policy():
    """Each test starts from the built-in profile, no overrides and a learner that has measured
    nothing, and leaves the same behind."""
    with builtin_policy_without("FASTCOPY_NT_LEARN_FROM", "FASTCOPY_KERNEL", "FASTCOPY_PROFILE"):
        _core.reset_private_store_modes()
        yield
    _core.reset_private_store_modes()


def learning_profile(learn_from, threshold=256 * MiB, region="private"):
    """The built-in profile in the file format, with an NT rule that learns from `learn_from`."""
    doc = json.loads(_core.active_profile_json())
    doc["name"] = "learning-test"
    for key in ("private", "to_shared", "from_shared"):
        nt = doc["regions"][key]["nt"]
        nt.update({"threshold": threshold, "kernel": STREAMING, "min_page_distance": 512,
                   "min_page_distance_below": None, "learn_from": None, "why": "test"})
    doc["regions"][region]["nt"]["learn_from"] = learn_from
    return doc


def load(doc):
    _core.load_profile(json.dumps(doc), "test")


def aligned_pair(n, distance=0):
    """(dst, src) of n bytes, src on a page boundary and dst `distance` bytes past one, far apart."""
    buf = np.empty(2 * n + 4 * PAGE, np.uint8)
    start = (-buf.ctypes.data) % PAGE
    src = buf[start:start + n]
    d0 = start + ((n + PAGE) // PAGE + 1) * PAGE + distance
    return buf[d0:d0 + n], src


@needs_streaming
def test_a_trial_of_streaming_stores_runs_third_and_every_copy_is_right():
    load(learning_profile(256 << 10))
    n = MiB + 4096
    dst, src = aligned_pair(n)
    cached = _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n)
    assert cached != STREAMING
    rng = np.random.default_rng(3)
    ran = []
    for i in range(6):
        src[...] = rng.integers(0, 256, n, dtype=np.uint8)
        _core.reset_last_kernel()
        fastcopy.copy(dst, src)
        ran.append(_core.last_kernel())
        assert np.array_equal(dst, src), f"copy {i}"
    # Copies 1-2 cached, 3-4 a trial of streaming stores: the count towards explore_min pauses
    # for the second copy (no trial is judged against the first copy's rate alone).
    rule = _core.private_store_mode_rule()
    first = rule["explore_min"]
    assert ran[:first] == [cached] * first, ran
    assert ran[first:first + rule["streaming_trial_copies"]] == [STREAMING] * rule["streaming_trial_copies"], ran
    modes = _core.private_store_modes()
    assert len(modes) == 1 and modes[0]["sizes"] == "1-2 MiB", modes
    m = modes[0]
    assert m["cached_writes"] + m["streaming_writes"] == 6, m
    assert m["cached_gbps"] > 0 and m["streaming_gbps"] > 0, m
    assert m["stores"] in ("cached", "streaming")


@needs_streaming
def test_copies_the_rule_streams_start_streaming_then_try_cached_stores():
    """Above the NT threshold a size class starts in the rule's streaming stores and tries the
    band's kernel (cached stores) after explore_first_while_streaming copies besides the first
    (no trial is judged against the first copy's rate alone); every copy is right."""
    n = 2 * MiB + 4096
    dst, src = aligned_pair(n)
    load(learning_profile(256 << 10))  # the NT threshold far above n: the band's kernel at n
    cached = _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n)
    assert cached != STREAMING
    load(learning_profile(256 << 10, threshold=MiB))
    assert _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n) == STREAMING
    rng = np.random.default_rng(4)
    ran = []
    rule = _core.private_store_mode_rule()
    first = rule["explore_first_while_streaming"]
    assert first > rule["explore_min"], rule
    copies = first + rule["cached_trial_copies"] + 1
    for i in range(copies):
        src[...] = rng.integers(0, 256, n, dtype=np.uint8)
        _core.reset_last_kernel()
        fastcopy.copy(dst, src)
        ran.append(_core.last_kernel())
        assert np.array_equal(dst, src), f"copy {i}"
    assert ran[:first] == [STREAMING] * first, ran
    assert ran[first:first + rule["cached_trial_copies"]] == [cached] * rule["cached_trial_copies"], ran
    modes = _core.private_store_modes()
    assert len(modes) == 1 and modes[0]["sizes"] == "2-4 MiB", modes
    # The copy after the trial runs whichever mode won it (timing decides).
    assert modes[0]["streaming_writes"] >= first and modes[0]["cached_writes"] >= rule["cached_trial_copies"], modes
    assert modes[0]["cached_writes"] + modes[0]["streaming_writes"] == copies, modes


@needs_streaming
def test_smaller_overlapping_and_forced_copies_are_not_timed():
    load(learning_profile(MiB))
    n = 2 * MiB
    dst, src = aligned_pair(n)
    fastcopy.copy(dst[: MiB - 1], src[: MiB - 1])  # below learn_from
    buf = np.arange(3 * MiB, dtype=np.uint8)
    fastcopy.copy(buf[4096:4096 + n], buf[:n])  # overlapping: memmove semantics, no streaming
    expect = np.arange(3 * MiB, dtype=np.uint8)
    expect[4096:4096 + n] = np.arange(n, dtype=np.uint8)
    assert np.array_equal(buf, expect)
    fastcopy.kernel("generic")(dst, src)  # a forced kernel
    assert _core.private_store_modes() == []
    fastcopy.copy(dst, src)
    assert sum(m["cached_writes"] + m["streaming_writes"] for m in _core.private_store_modes()) == 1


@needs_streaming
def test_copies_at_a_page_distance_the_guard_excludes_learn_too():
    """The page-distance guard keeps static NT stores from small distances; timed copies see a
    streamed trial that 4K-aliases lose, so they learn there as well."""
    load(learning_profile(256 << 10, threshold=512 * MiB))
    n = MiB
    dst, src = aligned_pair(n, distance=100)
    assert _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n) != STREAMING
    ran = set()
    for _ in range(4):
        _core.reset_last_kernel()
        fastcopy.copy(dst, src)
        ran.add(_core.last_kernel())
        assert np.array_equal(dst, src)
    assert STREAMING in ran and len(ran) == 2, ran


@needs_streaming
def test_fastcopy_nt_learn_from_moves_and_turns_off_the_learning():
    load(learning_profile(256 << 10))
    base = json.loads(_core.active_profile_json())
    os.environ["FASTCOPY_NT_LEARN_FROM"] = "off"
    _core.init_policy()
    assert _core.active_profile()["regions"]["private"]["nt"]["learn_from"] is None
    assert _core.overrides()["FASTCOPY_NT_LEARN_FROM"] == "off"
    assert any("FASTCOPY_NT_LEARN_FROM=off" in o for o in _core.active_profile()["overrides"])
    dst, src = aligned_pair(2 * MiB)
    for _ in range(5):
        fastcopy.copy(dst, src)
    assert np.array_equal(dst, src)
    assert _core.private_store_modes() == []
    os.environ["FASTCOPY_NT_LEARN_FROM"] = "8M"
    _core.init_policy()
    assert _core.active_profile()["regions"]["private"]["nt"]["learn_from"] == 8 * MiB
    assert _core.overrides()["FASTCOPY_NT_LEARN_FROM"] == 8 * MiB
    assert json.loads(_core.base_profile_json()) == base  # the base profile is not edited
    # No NT rule: nothing to learn between, whatever the variable says.
    os.environ["FASTCOPY_NT_THRESHOLD"] = "off"
    try:
        _core.init_policy()
        assert _core.active_profile()["regions"]["private"]["nt"]["learn_from"] is None
    finally:
        os.environ.pop("FASTCOPY_NT_THRESHOLD")


@pytest.mark.parametrize("value", ["100K", "4Q", "-1", "1.5M"])
def test_bad_fastcopy_nt_learn_from_is_refused_and_changes_nothing(value):
    before = _core.active_profile_json()
    os.environ["FASTCOPY_NT_LEARN_FROM"] = value
    with pytest.raises(ValueError) as err:
        _core.init_policy()
    assert "FASTCOPY_NT_LEARN_FROM" in str(err.value) and value in str(err.value) and "256K" in str(err.value)
    assert _core.active_profile_json() == before


@needs_streaming
@pytest.mark.parametrize("change, message", [
    ({"region": "to_shared"}, "regions.to_shared.nt.learn_from"),
    ({"learn_from": 4096}, "regions.private.nt.learn_from"),
    ({"learn_from": "4M"}, "regions.private.nt.learn_from"),
    ({"threshold": None}, "regions.private.nt.learn_from"),
])
def test_a_profile_with_a_bad_learn_from_is_refused(change, message):
    args = {"learn_from": 4 * MiB, "threshold": 256 * MiB, "region": "private"}
    args.update(change)
    doc = learning_profile(args["learn_from"], args["threshold"], args["region"])
    if args["threshold"] is None:
        doc["regions"]["private"]["nt"]["kernel"] = None
    before = _core.active_profile_json()
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load(doc)
    assert _core.active_profile_json() == before


@needs_streaming
def test_a_profile_without_learn_from_takes_the_builtin_value():
    builtin = _core.active_profile()["regions"]["private"]["nt"]
    doc = learning_profile(None)
    del doc["regions"]["private"]["nt"]["learn_from"]
    load(doc)
    got = _core.active_profile()["regions"]["private"]["nt"]["learn_from"]
    assert got == builtin["learn_from"]
    # Written back out, the value is stated (a tuned file read again means the same).
    assert json.loads(_core.active_profile_json())["regions"]["private"]["nt"]["learn_from"] == got
    doc["regions"]["private"]["nt"]["learn_from"] = None
    load(doc)
    assert _core.active_profile()["regions"]["private"]["nt"]["learn_from"] is None


def test_the_zen4_profile_learns_from_4_mib_and_only_in_private_copies():
    _core.use_builtin_profile("amd-zen4")
    regions = _core.active_profile()["regions"]
    if regions["private"]["nt"]["threshold"] is None:
        pytest.skip("no NT kernel on this CPU: the Zen 4 table resolves without an NT rule")
    assert regions["private"]["nt"]["learn_from"] == 4 * MiB
    assert regions["to_shared"]["nt"]["learn_from"] is None and regions["from_shared"]["nt"]["learn_from"] is None


@needs_streaming
def test_info_says_what_was_learned():
    load(learning_profile(256 << 10))
    dst, src = aligned_pair(MiB)
    for _ in range(5):
        fastcopy.copy(dst, src)
    data = collect_info(brand=False)
    learned = data["private_store_modes"]
    assert learned["rule"]["explore_min"] >= 1 and learned["rule"]["cached_trial_copies"] >= 1
    assert [c["sizes"] for c in learned["classes"]] == ["1-2 MiB"]
    text = format_info(data, verbose=True)
    assert "learned store modes" in text and "1-2 MiB:" in text, text
    first = learned["rule"]["explore_first_while_streaming"]
    assert f"({first} in a size class that starts or switches to streaming)" in text, text
    summary = format_info(data)
    assert "whichever ran faster lately" in summary


@needs_streaming
def test_learned_kernel_names_the_kernel_of_the_mode_learned():
    """_core.learned_kernel (what the dispatch check reports auto ran): the profile's kernel
    before a class's first copy and where copies do not learn; then the band's kernel once
    cached stores took over (hot) and the NT kernel while streaming stores stay (cold). The
    learner is fed chosen rates, so the modes do not depend on this CPU's timings."""
    n = 2 * MiB + 4096
    dst, src = aligned_pair(n)
    load(learning_profile(256 << 10))
    cached = _core.chosen_kernel(dst.ctypes.data, src.ctypes.data, n)
    assert cached != STREAMING
    load(learning_profile(256 << 10, threshold=MiB))  # the rule streams n
    d, s = dst.ctypes.data, src.ctypes.data
    assert _core.learned_kernel(d, s, n) == _core.chosen_kernel(d, s, n) == STREAMING
    assert _core.private_store_modes() == []  # the query starts nothing
    small = 128 << 10  # below learn_from: the profile's kernel
    assert _core.learned_kernel(d, s, small) == _core.chosen_kernel(d, s, small)

    _core.simulate_private_store_modes(n, True, 60.0, 25.0, 40)  # hot
    assert [m["stores"] for m in _core.private_store_modes()] == ["cached"]
    assert _core.learned_kernel(d, s, n) == cached
    fastcopy.copy(dst, src)  # a real copy runs the learned mode's kernel (no trial is due yet)
    assert _core.last_kernel() == cached and np.array_equal(dst, src)
    # Overlapping copies and forced kernels run as the profile says.
    assert _core.learned_kernel(s + 4096, s, n) == _core.chosen_kernel(s + 4096, s, n)

    _core.reset_private_store_modes()
    _core.simulate_private_store_modes(n, True, 17.0, 21.0, 40)  # cold
    assert [m["stores"] for m in _core.private_store_modes()] == ["streaming"]
    assert _core.learned_kernel(d, s, n) == STREAMING
    os.environ["FASTCOPY_KERNEL"] = "generic"
    _core.init_policy()
    assert _core.learned_kernel(d, s, n) == "generic"


def test_simulated_copies_need_positive_rates():
    with pytest.raises(ValueError, match="rates must be positive"):
        _core.simulate_private_store_modes(MiB, False, 0.0, 20.0, 3)
