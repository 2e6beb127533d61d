"""The probe of how far apart two CPUs are (printed under the IPC and Topic benchmark tables)."""

from __future__ import annotations

import os

import pytest

from fastcopy import _core
from fastcopy.bench import system

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs in the affinity mask")


@two_cpus
def test_round_trip_between_two_cpus_is_measured_without_moving_the_caller():
    before = os.sched_getaffinity(0)
    ns = _core.cache_line_round_trip_ns(CPUS[0], CPUS[1], rounds=256)
    assert 0 < ns < 1e6  # a cache line's trip, not a scheduler's time slice
    assert os.sched_getaffinity(0) == before  # the probe pins its own threads only
    assert system.cpu_pair() == (CPUS[0], CPUS[1])
    assert system.cache_line_round_trip(system.cpu_pair()) > 0


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="must differ"):
        _core.cache_line_round_trip_ns(CPUS[0], CPUS[0])
    outside = max(CPUS) + 1
    with pytest.raises(ValueError, match=f"CPU {outside} is not in this process's affinity mask"):
        _core.cache_line_round_trip_ns(CPUS[0], outside)
    with pytest.raises(ValueError, match="CPU -1 is not"):
        _core.cache_line_round_trip_ns(-1, CPUS[0])
    with pytest.raises(ValueError, match="limit_s"):
        _core.cache_line_round_trip_ns(CPUS[0], outside, limit_s=0)
    if len(CPUS) >= 2:
        with pytest.raises(ValueError, match="rounds must be 1 to 16777216, got 0"):
            _core.cache_line_round_trip_ns(CPUS[0], CPUS[1], rounds=0)
        with pytest.raises(ValueError, match="rounds must be 1 to 16777216, got 4294967295"):
            _core.cache_line_round_trip_ns(CPUS[0], CPUS[1], rounds=2**32 - 1)
    # The benchmarks' helper turns a probe that cannot run into "no figure".
    assert system.cache_line_round_trip((CPUS[0], CPUS[0])) is None
    assert system.cache_line_round_trip(None) is None


def test_distance_words_count_the_far_probes():
    words = system.cpu_distance_words(system.cpu_distance_record((0, 1), [110.0, None, 450.0, 100.0]))
    assert words.startswith("cache-line round trip between CPUs 0 and 1, before each repeat: 100-450 ns (median 110)")
    assert "1 of 3 above 2x the lowest: the host had moved the two CPUs apart" in words
    near = system.cpu_distance_words(system.cpu_distance_record((2, 5), [110.0, 120.0, 199.0]))
    assert near == "cache-line round trip between CPUs 2 and 5, before each repeat: 110-199 ns (median 120)"
    assert system.cpu_distance_words(system.cpu_distance_record(None, [])) is None
    assert system.cpu_distance_words(system.cpu_distance_record((0, 1), [None, None])) is None
    assert system.cpu_distance_words(None) is None
