"""The inter-process benchmark (``python -m fastcopy bench --ipc``, fastcopy.bench.ipc and its
transport registry) and the engine's words for ratios between transports: runs between two real
processes, the order of repeats, paired spreads, skipped transports."""

from __future__ import annotations

import collections
import dataclasses
import json
import os

import numpy as np
import pytest

from fastcopy.bench import ipc_transports

from _cli import NO_SUBPROCESS

needs_subprocess = pytest.mark.skipif(NO_SUBPROCESS, reason="FASTCOPY_NO_SUBPROCESS=1: the benchmark starts processes")


@needs_subprocess
def test_ipc_bench_smoke():
    from fastcopy.bench.ipc import format_ipc_table, run_ipc_bench

    res = run_ipc_bench(sizes=[64, 65536], repeats=1, min_time=0.02,
                        transports=["channel", "channel_alloc", "queue", "pipe"])
    json.dumps(res)
    assert {(r["transport"], r["size"]) for r in res["rows"]} == {
        (t, s) for t in ["channel", "channel_alloc", "queue", "pipe"] for s in [64, 65536]}
    for r in res["rows"]:
        assert r["msg_rate"] > 0 and r["bandwidth_gbps"] > 0 and r["rtt_median_us"] > 0
    assert set(res["ratios"]["64"]) == {"channel_vs_queue", "channel_vs_pipe"}
    table = format_ipc_table(res)
    assert "message rate" in table and "channel" in table and "pipe" in table
    # One repeat cannot balance the order of four transports, and the report says so.
    assert "1 repeats do not balance it" in table and "--repeats 8" in table


def test_repeat_order_balances_who_runs_first_and_who_runs_after_whom():
    from fastcopy.bench.engine import repeat_order

    orders = [repeat_order("ABC", r) for r in range(6)]
    assert ["".join(o) for o in orders] == ["ABC", "CBA", "BCA", "BAC", "CAB", "ACB"]
    firsts = collections.Counter(o[0] for o in orders)
    after = collections.Counter((o[i], o[i + 1]) for o in orders for i in range(2))
    assert firsts == {"A": 2, "B": 2, "C": 2}
    assert after == {(x, y): 2 for x in "ABC" for y in "ABC" if x != y}
    assert [repeat_order(["ch", "view"], r) for r in range(4)] == [
        ["ch", "view"], ["view", "ch"], ["view", "ch"], ["ch", "view"]]
    assert repeat_order([], 3) == [] and repeat_order(["x"], 5) == ["x"]
    five = [repeat_order(list(range(5)), r) for r in range(10)]
    assert all(sorted(o) == list(range(5)) for o in five)
    assert collections.Counter(o[0] for o in five) == {i: 2 for i in range(5)}


def test_reports_say_when_the_repeats_cannot_balance_the_order():
    from fastcopy.bench.engine import order_balance_words, repeat_order

    def balanced(k, repeats):  # every transport at every place in the order equally often
        orders = [repeat_order(list(range(k)), r) for r in range(repeats)]
        places = collections.Counter((name, i) for o in orders for i, name in enumerate(o))
        return len(places) == k * k and len(set(places.values())) == 1
    # The period the note names is the shortest over which the order is balanced.
    for k in range(2, 7):
        period = 2 if k == 2 else 2 * k
        assert balanced(k, period) and balanced(k, 2 * period)
        assert not any(balanced(k, r) for r in range(1, period))
        for repeats in range(1, 3 * period + 1):
            note = order_balance_words("transports", k, repeats)
            assert (note is None) == (repeats % period == 0), (k, repeats)
    assert order_balance_words("transports", 1, 5) is None
    note = order_balance_words("transports", 3, 7)
    assert note is not None and "3 transports" in note and "multiple of 6" in note and "--repeats 12" in note
    assert "--repeats 6" in order_balance_words("configurations", 3, 5)


@needs_subprocess
def test_ipc_bench_changes_the_order_of_transports_every_repeat(monkeypatch):
    from fastcopy.bench import ipc as ipc_bench

    seen = []
    real = ipc_bench.repeat_order

    def spy(names, r):
        order = real(names, r)
        seen.append(order)
        return order

    monkeypatch.setattr(ipc_bench, "repeat_order", spy)
    res = ipc_bench.run_ipc_bench(sizes=[4096], repeats=2, min_time=0.01, transports=["channel", "queue"])
    assert {r["transport"] for r in res["rows"]} == {"channel", "queue"}
    # two throughput repeats, then two of round trips: each in both orders
    assert seen == [["channel", "queue"], ["queue", "channel"]] * 2


def test_ratio_words_mark_a_ratio_of_medians_outside_its_paired_spread():
    from fastcopy.bench.engine import ratio_words

    assert ratio_words(0.80, [0.69, 0.80]) == ("0.80x (0.69-0.80)", False)
    # Just outside the bracket is ordinary (a real run: 0.758 against 0.762-0.859)...
    assert ratio_words(0.758, [0.762, 0.859]) == ("0.76x (0.76-0.86)", False)
    # ...and so is anything within 1.5 bracket widths of it (Tukey's fences: 0.45-1.33 here).
    assert not ratio_words(0.46, [0.78, 1.00])[1] and not ratio_words(1.32, [0.78, 1.00])[1]
    # A run where the machine switched states: the pairs say 0.78-1.00, the medians 1.78.
    assert ratio_words(1.78, [0.78, 1.00]) == ("1.78x (0.78-1.00) !", True)
    assert ratio_words(0.40, [0.78, 1.00]) == ("0.40x (0.78-1.00) !", True)
    assert ratio_words(1.23, None) == ("1.23x", False)  # one repeat: no spread, nothing to disagree with


def test_ipc_table_marks_and_explains_a_ratio_outside_its_spread():
    from fastcopy.bench import ipc as ipc_bench
    from fastcopy.bench.engine import SPREAD_DISAGREES_NOTE

    def table(rtt_ratio):
        return ipc_bench.format_ipc_table({"rows": [], "ratios": {str(1 << 20): {
            "channel_view_vs_iceoryx2_view": 1.10, "channel_view_vs_iceoryx2_view_spread": [1.05, 1.17],
            "channel_view_vs_iceoryx2_view_rtt": rtt_ratio,
            "channel_view_vs_iceoryx2_view_rtt_spread": [0.78, 1.00]}}})

    bad = table(1.78)
    assert "channel_view / iceoryx2_view_rtt 1.78x (0.78-1.00) !" in bad
    assert "channel_view / iceoryx2_view 1.10x (1.05-1.17)," in bad  # the other ratio is unmarked
    assert SPREAD_DISAGREES_NOTE in bad
    good = table(0.90)
    assert "channel_view / iceoryx2_view_rtt 0.90x (0.78-1.00)" in good and " !" not in good
    assert SPREAD_DISAGREES_NOTE not in good


def test_paired_spread_is_the_middle_half_of_per_repeat_ratios():
    from fastcopy.bench.engine import paired_spread

    assert paired_spread([2.0], [1.0]) is None  # one pair: no spread
    # ratios 0.5, 1, 2, 4, 8 (pairs, not medians of each side): quartiles 1 and 4
    lo, hi = paired_spread([1, 2, 4, 8, 16], [2, 2, 2, 2, 2])
    assert (lo, hi) == (1.0, 4.0)
    # pairs, not sides: the same values paired the other way give another spread
    assert paired_spread([1, 2, 3], [1, 2, 3]) == [1.0, 1.0]
    assert paired_spread([1, 2], [2, 1]) == [0.875, 1.625]  # ratios 0.5 and 2
    assert paired_spread([1, 2], [0, 0]) is None  # a zero denominator is dropped


@needs_subprocess
def test_ipc_bench_zero_copy_and_alternatives(monkeypatch):
    from fastcopy.bench import ipc as ipc_bench

    # A transport whose package is missing is listed as skipped with the reason, not an error.
    monkeypatch.setitem(ipc_transports.TRANSPORTS, "zmq",
                        dataclasses.replace(ipc_transports.TRANSPORTS["zmq"], package=("fastcopy_no_such_module", "x")))
    transports = ["channel", "channel_view", "shared_memory", "zmq"]
    res = ipc_bench.run_ipc_bench(sizes=[4096, 200000], repeats=2, min_time=0.02, transports=transports)
    json.dumps(res)
    assert set(res["skipped"]) == {"zmq"} and "not installed" in res["skipped"]["zmq"]
    assert {(r["transport"], r["size"]) for r in res["rows"]} == {
        (t, s) for t in ["channel", "channel_view", "shared_memory"] for s in [4096, 200000]}
    for r in res["rows"]:
        assert r["msg_rate"] > 0 and r["rtt_median_us"] > 0
    ratios = res["ratios"]["200000"]
    assert {"channel_view_vs_channel", "channel_view_vs_channel_rtt"} <= set(ratios)
    for key in ("channel_view_vs_channel", "channel_view_vs_channel_rtt"):
        lo, hi = ratios[key + "_spread"]  # two repeats: between the two paired ratios
        assert 0 < lo <= hi
    for r in res["rows"]:
        assert len(r["rtt_runs_us"]) == 2 and min(r["rtt_runs_us"]) > 0
    table = ipc_bench.format_ipc_table(res)
    assert "skipped zmq" in table and "channel_view" in table
    # One probe of the two CPUs' distance before each throughput repeat, printed under the table.
    distance = res["cpu_distance"]
    assert len(distance["round_trip_ns"]) == 2 * 2
    if len(os.sched_getaffinity(0)) >= 2:
        assert distance["cpus"] == sorted(os.sched_getaffinity(0))[:2]
        assert all(p is None or p > 0 for p in distance["round_trip_ns"])
        if any(distance["round_trip_ns"]):
            assert f"cache-line round trip between CPUs {distance['cpus'][0]} and {distance['cpus'][1]}" in table
    assert f"channel_view / channel {ratios['channel_view_vs_channel']:.2f}x (" in table
    with pytest.raises(ValueError, match="unknown transport"):
        ipc_bench.run_ipc_bench(sizes=[64], transports=["carrier_pigeon"])


@pytest.mark.parametrize("fill", ["memmove", "fastcopy"])
def test_ipc_bench_view_fill_writes_the_message(monkeypatch, fill):
    # Both zero-copy transports fill their loaned slot through these two functions.
    monkeypatch.setattr(ipc_transports, "_view_fill", fill)
    msg = np.random.default_rng(1).integers(0, 256, 300001, dtype=np.uint8)
    dst = np.zeros(msg.size + 2, np.uint8)
    ipc_transports._fill_array(dst[1:-1], msg)
    assert np.array_equal(dst[1:-1], msg) and dst[0] == 0 and dst[-1] == 0
    dst[:] = 0
    ipc_transports._fill_address(dst[1:-1].__array_interface__["data"][0], msg)
    assert np.array_equal(dst[1:-1], msg) and dst[0] == 0 and dst[-1] == 0


@needs_subprocess
def test_ipc_bench_view_fill_is_recorded_and_checked():
    from fastcopy.bench import ipc as ipc_bench

    res = ipc_bench.run_ipc_bench(sizes=[4096], repeats=1, min_time=0.01, latency=False,
                                  transports=["channel_view"], view_fill="fastcopy")
    assert res["config"]["view_fill"] == "fastcopy"
    assert [r["transport"] for r in res["rows"]] == ["channel_view"] and res["rows"][0]["msg_rate"] > 0
    with pytest.raises(ValueError, match="view_fill"):
        ipc_bench.run_ipc_bench(sizes=[64], transports=["channel"], view_fill="carrier_pigeon")


@needs_subprocess
def test_ipc_bench_transport_that_fails_to_set_up_is_skipped(monkeypatch):
    from fastcopy.bench import ipc as ipc_bench

    def broken(*args, **kwargs):
        raise OSError("no room")

    monkeypatch.setattr(ipc_transports._ShmSlot, "__init__", broken)
    res = ipc_bench.run_ipc_bench(sizes=[64], repeats=1, min_time=0.01, latency=False,
                                  transports=["channel", "shared_memory"])
    assert "no room" in res["skipped"]["shared_memory"]
    assert {r["transport"] for r in res["rows"]} == {"channel"}
