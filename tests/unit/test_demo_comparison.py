"""The side-by-side table of `make demo` (rad2_bringup.demo): one value per run and metric, as
measured, and its figure."""

from __future__ import annotations

import math

from rad2_bringup.demo import COMPARED_METRICS, comparison_rows, plot_comparison


def _report(cr: float, ep: float, p50: float, misses: float) -> dict:
    metrics = {name: 0.5 for name in COMPARED_METRICS} | {"CR": cr, "EP-Mean": ep}
    metrics.pop("AF-CR")  # a metric a run did not report is NaN in the table, not 0
    return {"metrics": metrics, "planner": {"deadline_miss_rate": misses},
            "latency": {"input -> trajectory (monitor)": {"p50": p50, "p99": 2 * p50}}}


def test_comparison_rows_keep_each_runs_value_in_order(tmp_path):
    rows = comparison_rows({"baseline": _report(0.25, 0.90, 60.0, 0.01),
                            "configured": _report(0.0, 0.97, 70.0, 0.02)})
    assert rows["CR"] == [0.25, 0.0] and rows["EP-Mean"] == [0.90, 0.97]
    assert rows["input->trajectory p99 (ms)"] == [120.0, 140.0]
    assert rows["deadline misses per cycle run"] == [0.01, 0.02]
    assert all(math.isnan(v) for v in rows["AF-CR"])
    png = plot_comparison(rows, ["baseline", "configured"], tmp_path / "comparison.png")
    assert png.stat().st_size > 5_000


def test_demo_clips_are_spread_over_the_split_and_round_robin_over_splits(tmp_path):
    """The demo's clips come evenly spaced from each split's index (eval_real lists one road's clips
    after the other's, so its first clips alone would show one road), a split at a time in turn."""
    from rad2_bringup.demo import DEFAULT_SPLITS, bundle_clips
    from rad2_core.storage import load_dataset

    ids = bundle_clips(DEFAULT_SPLITS, 4, None, tmp_path / "a")
    assert len(ids) == 4 and len(set(ids)) == 4
    assert {"Lanker" in i for i in ids} == {True, False}  # both roads of eval_real
    assert [c.clip_id for c in load_dataset(tmp_path / "a")] == ids
    mixed = bundle_clips(["data/eval_real", "data/eval_safety"], 3, None, tmp_path / "b")
    assert sum(i.startswith("sumo_") for i in mixed) == 1  # 2 + 1 in turn
    named = bundle_clips(["data/eval_safety"], 4, ["sumo_cut_in_20250102"], tmp_path / "c")
    assert named == ["sumo_cut_in_20250102"]
