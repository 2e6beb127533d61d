"""Golden tests of tune's placement and held-out-check decisions (fastcopy.tune.decide): the sign
test over buffer placements (a kernel that wins at some placements only is a tie and changes
nothing) and ``apply_check`` (a band the held-out check contradicts falls back to the built-in
kernel). Fixed tables in, exact bands out; no timing, no CPU dependence."""
from __future__ import annotations

import copy

import pytest
from test_decide import BELOW, KB, KEPT_2K, builtin, measurements, st

from fastcopy.tune import decide

SIZES = [1 * KB, 4 * KB, 64 * KB]


def placed(per_placement, spread=0.01):
    """A cell entry measured at several placements: the geometric mean and the medians."""
    g = 1.0
    for x in per_placement:
        g *= x
    return {"gbps": g ** (1 / len(per_placement)), "spread": spread, "placements": list(per_placement)}


@pytest.mark.parametrize("n, k", [(1, None), (3, None), (4, 4), (5, 5), (6, 6), (7, 6), (8, 7), (10, 8)])
def test_sign_test_needs_these_wins_at_90_percent(n, k):
    assert decide.sign_needed(n) == k


@pytest.mark.parametrize("ratios, most, verdict", [
    ([1.2, 1.3, 1.1, 1.2], 8, "win"),        # 4 of 4 at 90 %: resolved
    ([1.2, 1.3, 1.1], 8, "open"),            # 3 placements decide nothing yet
    ([1.5, 1.5, 1.5, 0.8], 8, "open"),       # 3 of 4: 7 of 8 still reachable
    ([1.5, 1.5, 0.8, 0.8], 8, "tie"),        # 2 of 4: 7 of 8 no longer reachable
    ([1.5, 1.5, 1.5, 0.8, 0.8], 8, "tie"),   # 3 of 5: neither
    ([1.5, 1.5, 0.8, 0.8], 4, "tie"),        # no placements left
    ([1.2, 1.2, 1.2, 0.9, 1.2, 1.2, 1.2, 1.2], 8, "win"),  # 7 of 8
])
def test_placement_verdict(ratios, most, verdict):
    assert decide.placement_verdict(ratios, most) == verdict


def test_a_placement_dependent_cell_is_a_tie_and_changes_nothing():
    m = measurements(SIZES)
    cells = m["cells"]["private"]
    # near 4 KiB: erms 1.6x on the geometric mean (beyond every spread) but from two of four placements
    # (a fresh allocation where rep movsb collapsed): a tie, the built-in avx2 stays.
    cells["near"][str(4 * KB)] = {"avx2": placed([10.0, 10.0, 3.0, 3.0]), "generic": placed([5.0] * 4),
                                  "erms": placed([30.0, 30.0, 2.0, 2.0])}
    # far 4 KiB: erms faster at every placement: a win, the band changes.
    cells["far"][str(4 * KB)] = {"avx2": placed([10.0, 10.0, 3.0, 3.0]), "generic": placed([5.0] * 4),
                                 "erms": placed([15.0, 14.0, 5.0, 4.5])}
    body = decide.decide(m, builtin(SIZES), {})["body"]["regions"]["private"]
    assert body["near"] == [BELOW, KEPT_2K]
    near_4k = decide.decide_bands(m, builtin(SIZES))["private"]["near"][1]
    assert (near_4k["kernel"], near_4k["why"]) == (
        "avx2", "built-in choice kept: erms 1.41x but faster at 2 of 4 placements only (a tie by the sign test)")
    assert body["far"][-2:] == [
        {"from": 4096, "kernel": "erms", "why": "1.51x avx2 at 4 KiB hot (spread 1 %)"},
        {"from": 64 * KB, "kernel": "avx2", "why": "built-in choice kept: fastest at 64 KiB"}]


def check_point(size, offset, picked, old, ratio, lo, hi):
    return {"size": size, "offset": offset, "picked": picked,
            "vs_builtin": {"kernel": old, "ratio": ratio, "ci": [lo, hi]}}


def tuned_bands():
    """private page_aligned and far: erms won 4 KiB (a band 4 KiB..64 KiB over the built-in avx2)."""
    m = measurements(SIZES)
    for cls in ("page_aligned", "far"):
        m["cells"]["private"][cls][str(4 * KB)] = {"avx2": st(10.0), "generic": st(9.0), "erms": st(15.0)}
    return m, decide.decide_bands(m, builtin(SIZES))


def test_a_band_the_held_out_check_contradicts_is_dropped():
    m, bands = tuned_bands()
    points = [
        # page_aligned 5000 B: the profile's erms 0.80x of avx2 forced, beyond the interval: dropped
        check_point(5000, 0, "erms", "avx2", 0.80, 0.75, 0.85),
        # far 9000 B: erms 0.97x, but the interval reaches 1: a tie, the band stays
        check_point(9000, 700, "erms", "avx2", 0.97, 0.90, 1.02),
        # far 100 KiB: outside the band (the built-in avx2 there): no say about it
        check_point(100 * KB, 700, "avx2", "avx2", 0.50, 0.40, 0.60),
        # near: no changed band at all
        check_point(5000, 16, "avx2", "avx2", 0.70, 0.60, 0.80),
    ]
    dropped = decide.apply_check(bands, points)
    assert dropped == [{"region": "private", "class": "page_aligned", "from": 4096, "to": 64 * KB, "builtin": "avx2",
                        "new": "erms", "points": [(5000, 0, 0.80)], "by": "check"}]
    body = decide.profile_body(m, bands, {r: {"threshold": None, "kernel": None, "why": "-"} for r in decide.REGIONS},
                               {"threshold": None, "threads": 0, "why": "-"}, builtin(SIZES))["regions"]["private"]
    assert body["page_aligned"] == [BELOW, KEPT_2K]
    assert bands["private"]["page_aligned"][1]["why"] == (
        "built-in choice kept: erms lost the held-out check to avx2 at 5000 B @ 0 0.80x [0.75, 0.85]")
    assert [b["kernel"] for b in body["far"]] == ["generic", "avx2", "erms", "avx2"]


def test_an_overlapping_point_judges_the_backward_class_only():
    """A held-out point of an overlapping copy (dst = src + offset) judges the backward class's
    band, never the forward class its offset would name."""
    m = measurements(SIZES)
    for cls in ("far", "backward"):
        m["cells"]["private"][cls][str(4 * KB)] = {"avx2": st(10.0), "generic": st(9.0), "erms": st(15.0)}
    bands = decide.decide_bands(m, builtin(SIZES))
    overlapping = dict(check_point(5000, 700, "erms", "avx2", 0.80, 0.75, 0.85), overlap=True)
    assert decide.point_class(overlapping) == "backward"
    assert decide.point_class(check_point(5000, 700, "erms", "avx2", 0.8, 0.7, 0.9)) == "far"
    far_before = copy.deepcopy(bands["private"]["far"])
    dropped = decide.apply_check(bands, [overlapping])
    assert [(d["class"], d["new"], d["builtin"]) for d in dropped] == [("backward", "erms", "avx2")]
    assert bands["private"]["far"] == far_before


def test_the_check_judges_only_points_where_the_profile_picked_the_bands_kernel():
    _, bands = tuned_bands()
    before = copy.deepcopy(bands)
    # inside the page-aligned band, but the profile ran avx2 there (the pick came from elsewhere)
    # and the pool's pick "erms x2" is judged as erms: against a different built-in kernel, no say.
    points = [check_point(5000, 0, "avx2", "avx2", 0.5, 0.4, 0.6),
              check_point(6000, 0, "erms x2", "generic", 0.5, 0.4, 0.6)]
    assert decide.apply_check(bands, points) == []
    assert bands == before
