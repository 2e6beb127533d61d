"""Golden tests of tune's decisions (fastcopy.tune.decide): fixed synthetic measurement tables
and built-in choices in, the exact profile body (bands, non-temporal thresholds, pool) and
validation report out. No timing, no CPU dependence: the kernels are names in the tables."""
from __future__ import annotations

import copy

from fastcopy.tune import decide

KB, MB = 1 << 10, 1 << 20
SIZES = [1 * KB, 4 * KB, 64 * KB, 1 * MB, 64 * MB, 128 * MB]
L3 = 32 * MB
BUILTIN_BANDS = [{"from": 0, "kernel": "generic", "why": "small: the C library"},
                 {"from": 2048, "kernel": "avx2", "why": "from 2 KiB: AVX2"}]


def st(gbps, spread=0.01):
    return {"gbps": gbps, "spread": spread}


def builtin(sizes=SIZES, nt=16 * MB, pool=1 * MB, threads=2):
    """The built-in profile of the tables: generic below 2 KiB, avx2 from there; NT from 16 MiB;
    the pool from 1 MiB on 2 threads."""
    kernels = {r: {c: {s: "generic" if s < 2048 else "avx2" for s in sizes} for c in decide.CLASSES}
               for r in decide.REGIONS}
    bands = {r: {c: copy.deepcopy(BUILTIN_BANDS) for c in decide.CLASSES} for r in decide.REGIONS}
    return decide.Builtin(nt_threshold=nt, parallel_threshold=pool, threads=threads, kernels=kernels, bands=bands)


def measurements(sizes=SIZES):
    """The built-in kernel fastest everywhere (10 against 9 and 8 GB/s), except where a test says."""
    cells = {r: {c: {} for c in decide.CLASSES} for r in decide.REGIONS}
    for r in decide.REGIONS:
        for c in decide.CLASSES:
            for s in sizes:
                fast = "generic" if s < 2048 else "avx2"
                slow = "avx2" if fast == "generic" else "generic"
                cells[r][c][str(s)] = {fast: st(10.0), slow: st(9.0), "erms": st(8.0)}
    return {"sizes": list(sizes), "cells": cells, "wide": {r: {} for r in decide.REGIONS},
            "cache": {str(s): "cold" if s >= L3 else "hot" for s in sizes},
            "plain": ["generic", "avx2", "erms"], "streaming": ["avx2_nt"], "threads": [2],
            "l2": 2 * MB, "l3": L3, "repeats": 7, "min_time": 0.0002, "quick": True}


def the_table():
    m = measurements()
    cells = m["cells"]
    # private page_aligned 1 KiB: avx2 1.5x beyond both spreads: changes, and the validation keeps it
    cells["private"]["page_aligned"][str(KB)] = {"generic": st(10.0), "avx2": st(15.0), "erms": st(8.0)}
    # private near 1 KiB: avx2 1.2x, beyond its own spread (1 %) but within the built-in's (25 %): kept
    cells["private"]["near"][str(KB)] = {"generic": st(10.0, 0.25), "avx2": st(12.0), "erms": st(8.0)}
    # private far 4 KiB: generic 1.5x avx2: changes, and the validation off the grid reverts it
    cells["private"]["far"][str(4 * KB)] = {"generic": st(15.0), "avx2": st(10.0), "erms": st(8.0)}
    # to_shared backward 64 KiB: erms 1.02x, beyond both spreads but below MIN_GAIN: kept
    cells["to_shared"]["backward"][str(64 * KB)] = {"generic": st(9.0), "avx2": st(10.0, 0.005),
                                                   "erms": st(10.2, 0.005)}
    # from_shared near 1 MiB: erms 1.3x: changes; no size off the grid measured: kept
    cells["from_shared"]["near"][str(MB)] = {"generic": st(9.0), "avx2": st(10.0), "erms": st(13.0)}
    wide = m["wide"]
    # The pool (2 threads against one, private page-aligned): loses at 1 MiB, wins from 64 MiB.
    for s, one, many in ((MB, 10.0, 9.0), (64 * MB, 10.0, 16.0), (128 * MB, 10.0, 15.0)):
        wide["private"][f"{s}:avx2"] = st(one, 0.02)
        wide["private"][f"{s}:avx2@2"] = st(many, 0.02)
    # Non-temporal stores, cold: private (on the pool there) loses at 64 MiB and wins at 128 MiB;
    # the shared regions win from the first cold size.
    wide["private"][f"{64 * MB}:avx2_nt@2"] = st(12.0)
    wide["private"][f"{128 * MB}:avx2_nt@2"] = st(18.0)
    for r in ("to_shared", "from_shared"):
        for s in (64 * MB, 128 * MB):
            wide[r][f"{s}:avx2"] = st(6.0)
            wide[r][f"{s}:avx2_nt"] = st(8.0)
    return m


# Off-grid validation: (region, class, index of the run's first point) -> [(size, new / built-in)]
RATIOS = {("private", "page_aligned", 0): [(1249, 1.2), (1873, 1.1)],
          ("private", "far", 1): [(4999, 1.01)]}

BELOW = {"from": 0, "kernel": "generic", "why": "below the measured grid, the built-in choice: small: the C library"}
# The built-in boundary at 2 KiB lies between the grid sizes 1 and 4 KiB: where the decision at
# 1 KiB is the built-in kernel, the boundary stays where the built-in profile has it.
KEPT_2K = {"from": 2048, "kernel": "avx2", "why": "between the grid sizes, the built-in choice: from 2 KiB: AVX2"}
NT_KEPT = {"threshold": 16 * MB, "kernel": "avx2_nt",
           "why": "built-in threshold kept (no loss beyond the spread): avx2_nt 1.33-1.33x the band kernel cold "
                  "from 64 MiB"}


def expected_body():
    regions = {r: {c: [BELOW, KEPT_2K] for c in decide.CLASSES} for r in decide.REGIONS}
    regions["private"]["page_aligned"] = [
        BELOW, {"from": 1024, "kernel": "avx2",
                "why": "1.50x generic at 1 KiB hot (spread 1 %); validated 1249 B 1.20x, 1873 B 1.10x"}]
    regions["from_shared"]["near"] = [
        BELOW, KEPT_2K, {"from": 1 * MB, "kernel": "erms", "why": "1.30x avx2 at 1 MiB hot (spread 1 %)"},
        {"from": 64 * MB, "kernel": "avx2", "why": "built-in choice kept: fastest at 64 MiB"}]
    regions["private"]["nt"] = {"threshold": 128 * MB, "kernel": "avx2_nt",
                                "why": "avx2_nt 1.20-1.20x the band kernel cold from 128 MiB"}
    regions["to_shared"]["nt"] = NT_KEPT
    regions["from_shared"]["nt"] = NT_KEPT
    return {"regions": regions,
            "parallel": {"threshold": 64 * MB, "threads": 0,
                         "why": "2 threads 1.50-1.60x one thread from 64 MiB (cold at the threshold)"}}


def test_the_table_gives_exactly_this_profile():
    d = decide.decide(the_table(), builtin(), RATIOS)
    assert d["body"] == expected_body()


def test_the_table_gives_exactly_this_report():
    d = decide.decide(the_table(), builtin(), RATIOS)
    got = [(c["region"], c["class"], c["from"], c["to"], c["builtin"], c["new"], round(c["grid_gain"], 6),
            None if c["validation_gain"] is None else round(c["validation_gain"], 6), c["kept"]) for c in d["report"]]
    assert got == [
        ("private", "page_aligned", 1024, 4096, "generic", "avx2", 1.5, round((1.2 * 1.1) ** 0.5, 6), True),
        ("private", "far", 4096, 65536, "avx2", "generic", 1.5, 1.01, False),
        ("from_shared", "near", 1 * MB, 64 * MB, "avx2", "erms", 1.3, None, True),
    ]
    assert d["parallel"]["changed"] and d["nt"]["private"]["changed"]
    assert not d["nt"]["to_shared"]["changed"] and not d["nt"]["from_shared"]["changed"]


def test_decisions_do_not_depend_on_what_the_table_holds_elsewhere():
    # The same table twice gives the same body (no state kept between calls), and the inputs
    # other than the bands' points are left as they were.
    m, b = the_table(), builtin()
    before = copy.deepcopy((m, b.kernels, b.bands, RATIOS))
    first = decide.decide(m, b, RATIOS)["body"]
    assert decide.decide(the_table(), builtin(), RATIOS)["body"] == first
    assert (m, b.kernels, b.bands, RATIOS) == before


def test_a_band_faster_at_some_validation_placements_only_is_a_tie():
    """The validation's ratio per placement, pooled over its sizes, must pass the sign test
    (decide.placement_verdict) besides the mean gain: a kernel 1.05x on the mean but faster at 5
    of 8 placements goes back to the built-in one; faster at 8 of 8 it stays. Cold sizes (no
    ratio per placement) are judged by the mean alone."""
    m = measurements()
    m["cells"]["to_shared"]["page_aligned"][str(KB)] = {"generic": st(10.0), "avx2": st(15.0), "erms": st(8.0)}
    key = ("to_shared", "page_aligned", 0)
    split = {key: [decide.Validation(1249, 1.05, (1.2, 1.2, 0.98, 1.1)),
                   decide.Validation(1873, 1.05, (0.99, 1.1, 0.97, 1.01))]}
    d = decide.decide(m, builtin(), split)
    (c,) = d["report"]
    assert (c["region"], c["class"], c["kept"], c["validation_placements"]) == ("to_shared", "page_aligned", False,
                                                                                (5, 8))
    band = d["body"]["regions"]["to_shared"]["page_aligned"]
    assert [b["kernel"] for b in band] == ["generic", "avx2"]  # the built-in bands again
    assert decide.decide(m, builtin(), split)["bands"]["to_shared"]["page_aligned"][0]["why"] == (
        "built-in choice kept: avx2 1249 B 1.05x, 1873 B 1.05x (faster at 5 of 8 placements): a tie by the sign test")
    every = {key: [decide.Validation(1249, 1.05, (1.04,) * 4), decide.Validation(1873, 1.05, (1.06,) * 4)]}
    d = decide.decide(m, builtin(), every)
    assert d["report"][0]["kept"] and d["report"][0]["validation_placements"] == (8, 8)
    assert d["body"]["regions"]["to_shared"]["page_aligned"][1] == {
        "from": 1024, "kernel": "avx2",
        "why": "1.50x generic at 1 KiB hot (spread 1 %); validated 1249 B 1.05x, 1873 B 1.05x "
               "(faster at 8 of 8 placements)"}
    cold = {key: [decide.Validation(1249, 1.05)]}
    assert decide.decide(m, builtin(), cold)["report"][0]["kept"]


def test_below_the_l3_and_the_pool_grid_the_builtin_rules_stand():
    sizes = [256, 4 * KB, 64 * KB]
    d = decide.decide(measurements(sizes), builtin(sizes), {})
    body = d["body"]
    for r in decide.REGIONS:
        assert body["regions"][r]["nt"] == {
            "threshold": 16 * MB, "kernel": "avx2_nt",
            "why": "not measured cold (grid below the L3 size): the built-in threshold"}
        for c in decide.CLASSES:
            assert body["regions"][r][c] == [
                {"from": 0, "kernel": "generic", "why": "below the measured grid, the built-in choice: small: the C library"},
                KEPT_2K]
    assert body["parallel"] == {"threshold": 1 * MB, "threads": 0,
                                "why": "not measured (grid below 256 KiB or one CPU): the built-in rule"}
    assert d["report"] == []


def test_a_pool_that_never_wins_is_switched_off_and_no_streaming_kernel_means_no_nt():
    sizes = [1 * MB, 64 * MB]
    m = measurements(sizes)
    m["streaming"] = []
    for s in sizes:
        m["wide"]["private"][f"{s}:avx2"] = st(10.0, 0.02)
        m["wide"]["private"][f"{s}:avx2@2"] = st(9.0, 0.02)
    body = decide.decide(m, builtin(sizes), {})["body"]
    assert body["parallel"] == {"threshold": None, "threads": 0, "why": "the pool never beat one thread beyond the "
                                "spread (2 threads: 1 MiB 0.90x, 64 MiB 0.90x)"}
    for r in decide.REGIONS:
        assert body["regions"][r]["nt"] == {"threshold": None, "kernel": None, "why": "no streaming kernel on this CPU"}


def test_an_unusable_builtin_kernel_gives_way_to_the_fastest_and_a_gap_is_filled():
    sizes = [256, 384, 512, 768]
    m = measurements(sizes)
    cells = m["cells"]["private"]
    # page_aligned: the built-in generic failed its check at 256 B (absent from the table)
    cells["page_aligned"]["256"] = {"avx2": st(9.0), "erms": st(12.0)}
    # near: erms wins beyond the spread at 256 and 512 B; at 384 B it is fastest within the spread: one band
    for s, erms in ((256, 15.0), (384, 10.5), (512, 15.0)):
        cells["near"][str(s)] = {"generic": st(10.0, 0.1), "avx2": st(9.0), "erms": st(erms)}
    body = decide.decide(m, builtin(sizes), {})["body"]["regions"]["private"]
    assert body["page_aligned"] == [
        {"from": 0, "kernel": "generic", "why": "below the measured grid, the built-in choice: small: the C library"},
        {"from": 256, "kernel": "erms", "why": "fastest measured; built-in generic unusable here"},
        {"from": 384, "kernel": "generic", "why": "built-in choice kept: fastest at 384 B"}, KEPT_2K]
    assert body["near"] == [
        {"from": 0, "kernel": "generic", "why": "below the measured grid, the built-in choice: small: the C library"},
        {"from": 256, "kernel": "erms", "why": "1.50x generic at 256 B hot (spread 10 %)"},
        {"from": 768, "kernel": "generic", "why": "built-in choice kept: fastest at 768 B"}, KEPT_2K]


def test_below_the_grid_every_builtin_band_stands():
    # The built-in profile has a band from 128 B, below the first grid size (256 B): it stays,
    # with its own start and reason, and the first measured size joins it.
    sizes = [256, 4 * KB]
    bands = [{"from": 0, "kernel": "generic", "why": "tiny"}, {"from": 128, "kernel": "erms", "why": "short"},
             {"from": 2048, "kernel": "avx2", "why": "long"}]
    kernels = {r: {c: {256: "erms", 4 * KB: "avx2"} for c in decide.CLASSES} for r in decide.REGIONS}
    b = decide.Builtin(nt_threshold=None, parallel_threshold=None, threads=1, kernels=kernels,
                       bands={r: {c: copy.deepcopy(bands) for c in decide.CLASSES} for r in decide.REGIONS})
    m = measurements(sizes)
    for r in decide.REGIONS:
        for c in decide.CLASSES:
            m["cells"][r][c]["256"] = {"generic": st(9.0), "avx2": st(9.0), "erms": st(10.0)}
    body = decide.decide(m, b, {})["body"]
    for r in decide.REGIONS:
        for c in decide.CLASSES:
            assert body["regions"][r][c] == [
                {"from": 0, "kernel": "generic", "why": "below the measured grid, the built-in choice: tiny"},
                {"from": 128, "kernel": "erms", "why": "below the measured grid, the built-in choice: short"},
                {"from": 2048, "kernel": "avx2", "why": "between the grid sizes, the built-in choice: long"}]
