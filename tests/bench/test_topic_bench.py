"""The Topic fan-out benchmark (``python -m fastcopy bench --ipc --variants topic``,
fastcopy.bench.topic): per-subscriber throughput, ratios against a Channel, the order of
repeats, and its table."""

from __future__ import annotations

import statistics

import pytest

from conftest import no_subprocess


@no_subprocess
def test_topic_benchmark_reports_per_subscriber_throughput_and_ratios(monkeypatch):
    from fastcopy.shm import Channel, Topic
    from fastcopy.bench.topic import BASELINES, CONFIGS, format_topic_table, run_topic_bench

    loans = []  # the view configurations fill loans; the others send copies
    for cls in (Channel, Topic):
        monkeypatch.setattr(cls, "loan", lambda self, *a, _loan=cls.loan, **k: loans.append(1) or _loan(self, *a, **k))
    from fastcopy.bench import topic as topic_bench

    orders = []  # each repeat runs the configurations in another order (engine.repeat_order)
    monkeypatch.setattr(topic_bench, "repeat_order",
                        lambda names, rep, _real=topic_bench.repeat_order: orders.append(_real(names, rep)) or orders[-1])
    r = run_topic_bench(sizes=[1 << 16], repeats=2, min_time=0.01)
    assert orders == [list(CONFIGS), list(reversed(CONFIGS))]
    assert len(loans) == 3 * 2 * r["rows"][0]["messages"]
    assert [(row["config"], row["size"]) for row in r["rows"]] == [(c, 1 << 16) for c in CONFIGS]
    assert all(row["gbps"] > 0 for row in r["rows"])
    assert [len(row["runs"]) for row in r["rows"]] == [2] * 6
    # Two subscribers: both measured, the slower one reported.
    assert [len(row["runs"][0]) for row in r["rows"]] == [1, 1, 2, 1, 1, 2]
    by = {row["config"]: row for row in r["rows"]}
    assert by["topic2_view"]["gbps"] == statistics.median(min(run) for run in by["topic2_view"]["runs"])
    assert set(r["ratios"][1 << 16]) == {"topic1", "topic2", "topic1_view", "topic2_view"}
    assert r["config"]["topic_slots"] == {1 << 16: 64}  # the default: 4 MiB of 64 KiB slots
    assert r["config"]["view_fill"] == "memmove"
    assert r["config"]["channel_view_capacity"] == {1 << 16: 8 << 20}  # the default ring
    assert len(r["cpu_distance"]["round_trip_ns"]) == 2  # one probe before each repeat of each size
    for c, base in BASELINES.items():
        # Each ratio is against the Channel that moves data the same way (copies, or views).
        assert r["ratios"][1 << 16][c] == pytest.approx(by[c]["gbps"] / by[base]["gbps"])
        # The paired spread: with two repeats, between the two per-repeat ratios.
        pairs = [min(t) / min(ch) for t, ch in zip(by[c]["runs"], by[base]["runs"])]
        lo, hi = r["spreads"][1 << 16][c]
        assert min(pairs) <= lo <= hi <= max(pairs)
    table = format_topic_table(r)
    assert f"| topic2_view   | {by['topic2_view']['gbps']:>7.2f} | channel_view |" in table
    assert f"{r['ratios'][1 << 16]['topic2']:.2f}x ({r['spreads'][1 << 16]['topic2'][0]:.2f}-" in table
    assert "loans filled with np.copyto" in table
    # Two repeats cannot balance the order of six configurations: the table says so.
    assert "6 configurations changed every repeat, but 2 repeats do not balance it" in table
    assert "--repeats 12" in table
    with pytest.raises(ValueError, match="configuration"):
        run_topic_bench(configs=["nope"])
    with pytest.raises(ValueError, match="view_fill"):
        run_topic_bench(view_fill="nope")


@no_subprocess
def test_topic_benchmark_gives_loans_larger_than_the_default_ring_room():
    # An 8 MiB loan does not fit the Channel's default 8 MiB ring: channel_view gets room for
    # four messages. With no Topic configuration there is no ratio.
    from fastcopy.bench.topic import run_topic_bench

    r = run_topic_bench(sizes=[8 << 20], repeats=1, min_time=0.01, configs=["channel_view"], view_fill="fastcopy")
    assert r["config"]["channel_view_capacity"] == {8 << 20: 4 * ((8 << 20) + 4096)}
    assert [row["config"] for row in r["rows"]] == ["channel_view"] and r["rows"][0]["gbps"] > 0
    assert r["ratios"] == {} and r["spreads"] == {}


def test_topic_table_marks_and_explains_a_ratio_outside_its_spread():
    from fastcopy.bench.engine import SPREAD_DISAGREES_NOTE
    from fastcopy.bench.topic import format_topic_table

    def table(topic2_ratio):
        rows = [{"config": c, "size": 1 << 20, "gbps": g} for c, g in (("channel", 20.0), ("topic2", 10.0))]
        return format_topic_table({"config": {"sizes": [1 << 20], "configs": ["channel", "topic2"], "repeats": 9},
                                   "rows": rows, "ratios": {1 << 20: {"topic2": topic2_ratio}},
                                   "spreads": {1 << 20: {"topic2": [0.45, 0.55]}}})

    assert "| channel      | 0.25x (0.45-0.55) !" in table(0.25) and SPREAD_DISAGREES_NOTE in table(0.25)  # fences: 0.30-0.70
    assert "| channel      | 0.50x (0.45-0.55)  " in table(0.50) and SPREAD_DISAGREES_NOTE not in table(0.50)
    assert "channel_view" not in table(0.50)  # no view configuration: no word about loans
