"""The built-in ``intel-erms-avx512`` table as written (``builtin_profile_table``: before it is
resolved for a CPU), so nothing here depends on the CPU the tests run on. The figures behind
each rule are in docs/evidence/intel.md; these tests hold the rules to what those figures show."""
from __future__ import annotations

import pytest

from fastcopy import _core

from _builtin_tables import kernel_at, table

FORWARD = ("page_aligned", "near", "far")
KiB, MiB = 1 << 10, 1 << 20


def test_avx512_where_glibc_runs_rep_movsb_and_the_copy_fits_the_l1d():
    """evidence: intel-avx512-band. avx512 ran 1.15-1.2x glibc at 2.3-12 KiB in every forward
    class (glibc runs rep movsb there) and lost from about 20 KiB, where source and destination
    together outgrow the 48 KiB L1d: every region and forward class names avx512 at 3 and 12 KiB
    and the C library or rep movsb at 24 KiB and in the L2 range."""
    for region, classes in table("intel-erms-avx512")["regions"].items():
        for cls in FORWARD:
            bands = classes[cls]
            assert kernel_at(bands, 3 * KiB) == "avx512" and kernel_at(bands, 12 * KiB) == "avx512", (region, cls)
            for size in (24 * KiB, 64 * KiB, 400 * KiB):
                assert kernel_at(bands, size) in ("generic", "erms"), (region, cls, size)
            # a CPU or build without the AVX-512 kernel runs the C library in its place
            assert all(b["fallback"] == "generic" for b in bands if b["kernel"] == "avx512")
            assert all("evidence: intel-" in b["why"] for b in bands)


def test_overlapping_copies_run_avx512_from_4_b_to_1_25_kib():
    """evidence: intel-avx512-small, intel-backward-avx512. avx512 ran 1.01-1.07x the C library
    for overlapping copies of 4-250 B and 1.01-1.09x at 314 B-1.17 KiB in every region, tied it
    to 5 KiB and lost at 6.3-7.9 KiB."""
    for region, classes in table("intel-erms-avx512")["regions"].items():
        back = classes["backward"]
        assert [kernel_at(back, n) for n in (3, 4, 100, 256, 1000, 1279, 1280, 7 * KiB)] == \
            ["generic", "avx512", "avx512", "avx512", "avx512", "avx512", "generic", "generic"], region
        assert all("evidence: intel-backward-avx512" in b["why"] for b in back), region


def test_small_forward_copies_run_avx512_from_4_b():
    """evidence: intel-avx512-small. Through Python avx512 ran 1.02-1.07x the C library at
    4 B-384 B in every region and forward class; at 1-2 B the C library was 0-2 % faster."""
    for region, classes in table("intel-erms-avx512")["regions"].items():
        for cls in FORWARD:
            bands = classes[cls]
            assert [kernel_at(bands, n) for n in (1, 3, 4, 64, 255, 383)] == \
                ["generic", "generic", "avx512", "avx512", "avx512", "avx512"], (region, cls)
            assert "evidence: intel-avx512-small" in bands[0]["why"], (region, cls)


def test_copies_split_over_threads_from_384_kib():
    """evidence: intel-parallel-from-512kib, intel-parallel-from-384kib. Split copies ran 1.07-1.8x
    one thread at 770 KiB-1 MiB and were faster at 100 of 118 points of 512-784 KiB; at 384-512 KiB
    the held-out check put auto at 0.957-0.961 splitting and 0.904-0.921 on one thread. The
    ERMS-only table keeps 1 MiB, as measured on another Intel CPU."""
    par = table("intel-erms-avx512")["parallel"]
    assert par["threshold"] == 384 * KiB
    assert "evidence: intel-parallel-from-512kib" in par["why"]
    assert "evidence: intel-parallel-from-384kib" in par["why"]
    assert table("intel-erms")["parallel"]["threshold"] == 1 * MiB


def test_rep_movsb_follows_avx512_in_the_far_class_only():
    """evidence: intel-avx512-band, intel-l2-range. After the avx512 band the far class runs rep
    movsb (as glibc does there); the near class never does (4K aliasing)."""
    for classes in table("intel-erms-avx512")["regions"].values():
        assert kernel_at(classes["far"], 64 * KiB) == "erms"
        assert all(b["kernel"] != "erms" for b in classes["near"])


def test_streams_with_the_avx512_twin_from_about_12_mib():
    """evidence: intel-nt-threshold. With the pool, avx512_nt ran 0.91-0.94x at 4 MiB, tied at
    8 MiB and won from 12 MiB; avx2_nt ran 0.5-0.7x avx512_nt at 4-32 MiB: the NT kernel is the
    streaming twin of avx512, from above 4 MiB to at most 16 MiB whatever the L3 (a VM may
    report the host's 480 MiB L3)."""
    twins = {k["name"]: k["twin"] for k in _core.kernel_table()}
    if "avx512" not in twins:
        pytest.skip("this build has no AVX-512 kernels (not x86-64)")
    nt = table("intel-erms-avx512")["nt"]
    assert nt["kernel"] == twins["avx512"]
    for example in nt["examples"]:
        assert 4 * MiB < example["threshold"] <= 16 * MiB, example
        assert "evidence: intel-nt-threshold" in example["why"]


def test_private_copies_learn_their_store_mode_from_4_mib():
    """evidence: intel-nt-learn. Cold copies of 4.4-12 MB ran 0.60-0.64x streamed when they ran
    cached, hot ones of 20-42 MB 0.69-0.83x cached when they streamed: no static threshold
    serves both, so private copies from 4 MiB time themselves and keep the faster store mode."""
    nt = table("intel-erms-avx512")["nt"]
    assert nt["learn_from"] == 4 * MiB
    assert table("intel-erms")["nt"]["learn_from"] is None


def test_the_plain_intel_table_is_unchanged_by_the_avx512_one():
    """The ERMS-only Intel table (no AVX-512 measured there) keeps the C library and rep movsb."""
    for classes in table("intel-erms")["regions"].values():
        assert all(b["kernel"] in ("generic", "erms") for cls in FORWARD for b in classes[cls])


def test_shared_memory_keeps_the_64_mib_nt_cap():
    """evidence: intel-nt-shared. Copies into and out of shared memory run while the peer
    process holds the other CPU, so the pool does not help them, and a Channel's 16-32 MiB
    messages ran 1.05-1.06x without NT stores: there the threshold is half the L3 capped at
    64 MiB, not the private copies' 12 MiB."""
    nt = table("intel-erms-avx512")["nt"]
    by_l3 = {e["l3"]: e for e in nt["shared_examples"]}
    assert by_l3[512 * MiB]["threshold"] == 64 * MiB
    assert by_l3[32 * MiB]["threshold"] == 16 * MiB
    for e in nt["shared_examples"]:
        assert "evidence: intel-nt-shared" in e["why"]
    assert [e["threshold"] for e in nt["examples"]] != [e["threshold"] for e in nt["shared_examples"]]


def test_other_tables_use_one_nt_rule_everywhere():
    """Only a table that says why has a shared-memory NT rule of its own."""
    for t in _core.builtin_profile_table():
        if t["name"] != "intel-erms-avx512":
            assert t["nt"]["shared_examples"] == t["nt"]["examples"], t["name"]
