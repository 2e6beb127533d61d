"""The bridge fan-out measurement of fastcopy.net.bench: fastcopy.net.Publisher -> Zenoh
(loopback) -> Bridge.into -> local Topic -> 1 and 3 subscribers, the bridge and the subscribers
child processes. Checks what the figures are made of (every subscriber got every message, each
figure is its own subscriber's, the ratio is the slowest over the single one); no timed
assertions."""
from __future__ import annotations

import math
import statistics

import pytest

from _net import needs_zenoh
from conftest import no_subprocess

pytestmark = [pytest.mark.net, needs_zenoh, no_subprocess]

SIZE = 64 << 10
COUNT = 24
REPEATS = 2


def test_bridge_fanout_every_subscriber_gets_every_message_and_its_own_figure():
    from fastcopy.net.bench import format_fanout, run_fanout

    res = run_fanout(sizes=[SIZE], repeats=REPEATS, count=COUNT)
    assert res["subscribers"] == [1, 3] and res["counts"] == {SIZE: COUNT}
    (row,) = res["rows"]
    assert row["size"] == SIZE
    for n in (1, 3):
        reps = row["runs"][n]
        assert len(reps) == REPEATS
        for rep in reps:
            assert [sub["messages"] for sub in rep] == [COUNT] * n  # every subscriber, every message
            assert all(sub["seconds"] > 0 and sub["cpu_seconds"] > 0 for sub in rep)
        # CPU per message: the publisher's and the bridge's of each round, each subscriber's own.
        rounds = row["cpu"][n]
        assert len(rounds) == REPEATS and all(r["publisher"] > 0 and r["bridge"] > 0 for r in rounds)
        cpu = row["cpu_us"][n]
        assert cpu["publisher"] == pytest.approx(statistics.median(1e6 * r["publisher"] / COUNT for r in rounds))
        assert cpu["bridge"] == pytest.approx(statistics.median(1e6 * r["bridge"] / COUNT for r in rounds))
        alls = [1e6 * (r["publisher"] + r["bridge"] + sum(sub["cpu_seconds"] for sub in rep)) / COUNT
                for r, rep in zip(rounds, reps)]
        assert cpu["all"] == pytest.approx(statistics.median(alls))
        assert cpu["subscriber"] > 0
        # Each subscriber's figure: the median over the repeats of its own rounds.
        own = [statistics.median(SIZE * rep[i]["messages"] / rep[i]["seconds"] / 1e9 for rep in reps)
               for i in range(n)]
        assert row["gbps"][n] == pytest.approx(own, rel=1e-12)
        assert all(math.isfinite(g) and g > 0 for g in row["gbps"][n])
    assert row["ratio"] == {3: pytest.approx(min(row["gbps"][3]) / row["gbps"][1][0], rel=1e-12)}
    # The ratio within each repeat: the slowest of 3 in that repeat's round over the single one's.
    per_repeat = [min(SIZE * sub["messages"] / sub["seconds"] / 1e9 for sub in three)
                  / (SIZE * one[0]["messages"] / one[0]["seconds"] / 1e9)
                  for three, one in zip(row["runs"][3], row["runs"][1])]
    assert row["ratio_range"] == {3: (pytest.approx(min(per_repeat)), pytest.approx(max(per_repeat)))}
    # One warm-up round with 3 subscribers, then each subscriber count once per repeat: the
    # bridge forwarded all of those messages (and probes and end markers), lost none.
    assert res["bridge"]["lost"] == 0
    assert (1 + 2 * REPEATS) * COUNT <= res["bridge"]["forwarded"] <= res["published"]
    text = format_fanout(res)
    assert "3 subscribers: " + ", ".join(f"{g:.2f}" for g in row["gbps"][3]) in text
    lo, hi = row["ratio_range"][3]
    assert f"min of 3 / single {row['ratio'][3]:.2f}x (rounds {lo:.2f}-{hi:.2f})" in text
    c = row["cpu_us"][3]
    assert (f"3 subscribers: publisher {c['publisher']:.0f}, bridge {c['bridge']:.0f}, subscriber "
            f"{c['subscriber']:.0f} ({c['all']:.0f} in all)") in text
    assert res["cpus"] >= 1 and f"on {res['cpus']} usable CPUs" in text
