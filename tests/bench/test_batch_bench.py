"""``python -m fastcopy bench --batch``: runs, prints every case with ratios, saves JSON."""
from __future__ import annotations

import json

import pytest

from fastcopy.bench import batch as batch_bench

from _cli import cli


def test_run_batch_bench_times_every_variant():
    r = batch_bench.run_batch_bench(cases=["stack_1000x1K", "copy_many_1000x1K"], repeats=2, min_time=0.001,
                                    with_torch=False)
    for name in ("stack_1000x1K", "copy_many_1000x1K"):
        seconds = r["cases"][name]["seconds"]
        assert set(seconds) == {"fastcopy", "numpy"}
        assert all(len(v) == 2 and all(t > 0 for t in v) for v in seconds.values())
    table = batch_bench.format_batch_table(r)
    assert "stack_1000x1K" in table and "vs numpy" in table
    assert "stack_64x256K_out vs torch: not measured" in table
    with pytest.raises(ValueError, match="unknown batch case"):
        batch_bench.run_batch_bench(cases=["nope"])


def test_cli_batch_quick_json(tmp_path):
    path = tmp_path / "batch.json"
    r = cli("bench", "--batch", "--quick", "--min-time", "0.002", "--json", str(path), timeout=300)
    assert r.returncode == 0, r.stderr
    for name in batch_bench.CASES:
        assert name in r.stdout
    doc = json.loads(path.read_text())
    assert doc["kind"] == "batch" and set(doc["results"]["cases"]) == set(batch_bench.CASES)
    assert doc["cpu"]["arch"]


def test_cli_batch_refuses_options_that_do_not_apply():
    r = cli("bench", "--batch", "--sizes", "4K")
    assert r.returncode == 2 and "--sizes does not apply" in r.stderr
