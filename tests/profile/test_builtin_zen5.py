"""The built-in ``amd-zen5`` table as written (``builtin_profile_table``: before it is resolved
for a CPU), so nothing here depends on the CPU the tests run on. The figures behind each rule are
in docs/evidence/dispatch.md; these tests hold the rules to what those figures show."""
from __future__ import annotations

from _builtin_tables import kernel_at, table

KiB, MiB = 1 << 10, 1 << 20


def test_near_copies_run_avx512_from_2_kib_while_they_fit_the_l1d():
    """evidence: zen5-near-avx512. At (dst - src) mod 4096 in 1..63 the AVX-512 loop ran
    1.2-1.45x the AVX2 loop and 1.2-2.2x glibc at 2-26 KiB, and lost to glibc from 27-28 KiB:
    every region's near class names avx512 at 2, 3, 16 and 26 KiB and the C library below 2 KiB
    and from 27 KiB; where the AVX-512 kernel is missing the AVX2 loop runs, not glibc (which
    runs rep movsb there from 2112 B)."""
    for region, classes in table("amd-zen5")["regions"].items():
        near = classes["near"]
        assert [kernel_at(near, n) for n in (2047, 2 * KiB, 3 * KiB, 16 * KiB, 26 * KiB, 27 * KiB, 1 * MiB)] == \
            ["generic", "avx512", "avx512", "avx512", "avx512", "generic", "generic"], region
        assert all(b["fallback"] == "avx2" for b in near if b["kernel"] == "avx512"), region
        assert all("evidence: zen5-near-avx512" in b["why"] for b in near[1:]), region


def test_far_copies_keep_avx512_to_24_kib_then_rep_movsb():
    """evidence: zen5-avx512-2k-24k, zen5-near-avx512. In the far and page-aligned classes
    `rep movsb` tied the AVX-512 loop at 25 KiB and won from 26 KiB, so their band ends at
    24 KiB, before the near class's."""
    for region, classes in table("amd-zen5")["regions"].items():
        for cls in ("far", "page_aligned"):
            assert [kernel_at(classes[cls], n) for n in (2 * KiB, 24 * KiB - 1, 24 * KiB, 1 * MiB)] == \
                ["avx512", "avx512", "erms", "erms"], (region, cls)


def test_private_copies_split_over_threads_from_256_kib_shared_ones_from_1_mib():
    """evidence: zen5-parallel-from-256kib. With the pool from 1 MiB the held-out check put auto
    at 0.64-0.80 of two threads at 256 KiB-1.2 MB, from 256 KiB at 0.98-1.02; private copies
    learn split or alone from there. Copies into and out of shared memory keep 1 MiB, where a
    peer process needs the other vCPU."""
    par = table("amd-zen5")["parallel"]
    assert par["threshold"] == 256 * KiB
    assert par["learn_from"] == 256 * KiB
    assert par["shared_from"] == 1 * MiB
    assert "evidence: zen5-parallel-from-256kib" in par["why"]
