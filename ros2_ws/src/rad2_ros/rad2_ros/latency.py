"""Planning-cycle latency summaries of rad2_msgs/PlanningDiagnostics records (no ROS).

A record is the plain dict :func:`diagnostics_record` makes of one message (from a bag, a live
subscription or a recorder callback); :func:`summarise` turns records into per-node, per-stage
statistics, which :func:`print_tables` and :func:`plot_histograms` present. Used by
rad2 eval latency-report, rad2 eval replay and rad2 demo.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from rad2_datasets import bags

DIAGNOSTICS_TYPE = "rad2_msgs/msg/PlanningDiagnostics"
DEFAULT_TOPIC = "/planning/diagnostics"
PERCENTILES = (50, 90, 99)


def diagnostics_record(msg: Any, receive_ns: int | None = None) -> dict[str, Any]:
    """A plain dict of one PlanningDiagnostics message (rosbags, rclpy or mcap_ros2 object) plus the
    time it was received."""
    return {**bags.planning_diagnostics_record(msg), "receive_ns": receive_ns}


def stats(values: Iterable[float]) -> dict[str, float]:
    """count, mean, p50/p90/p99 (linear interpolation), max of finite values (NaN when none)."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return {"count": 0, "mean": float("nan"), **{f"p{q}": float("nan") for q in PERCENTILES},
                "max": float("nan")}
    out = {"count": int(arr.size), "mean": float(arr.mean())}
    for q, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{q}"] = float(v)
    out["max"] = float(arr.max())
    return out


def _stage_order(names: Iterable[str]) -> list[str]:
    """Pipeline order: preprocess, encode, denoise_0.. (or denoise_total: the fused sampler), score,
    select, the safety layer (critic, corrections), stall_recovery, mission_pace, plan_braking, traffic_rules,
    safety_envelope, comfort_limits, drivable_area, validate_output, publish, then the rest."""
    first = ["preprocess", "encode"]
    last = ["score", "select", "critic", "corrections", "stall_recovery", "mission_pace", "plan_braking",
            "traffic_rules", "safety_envelope", "comfort_limits", "drivable_area", "validate_output",
            "publish"]
    names = set(names)

    def key(n: str) -> tuple:
        if n in first:
            return (0, first.index(n), 0)
        if n.startswith("denoise_") and n[8:].isdigit():
            return (1, 0, int(n[8:]))
        if n == "denoise_total":
            return (1, 1, 0)
        if n in last:
            return (2, last.index(n), 0)
        return (3, 0, n)

    return sorted(names, key=key)


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Latency statistics of diagnostics records, per reporting node."""
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by_node[rec["node"] or "?"].append(rec)
    out: dict[str, Any] = {}
    for node, recs in sorted(by_node.items()):
        stage_values: dict[str, list[float]] = defaultdict(list)
        denoise_all = []
        for rec in recs:
            # the sum of the per-step timings; the fused sampler reports only denoise_total
            den = [v for k, v in rec["stages"].items() if k.startswith("denoise_") and k[8:].isdigit()]
            for name, ms in rec["stages"].items():
                stage_values[name].append(ms)
            if den:
                denoise_all.append(float(sum(den)))
        rows = {name: stats(stage_values[name]) for name in _stage_order(stage_values)}
        if denoise_all:
            rows["denoise_all"] = stats(denoise_all)
        rows["total"] = stats(r["total_ms"] for r in recs)
        rows["end_to_end"] = stats(r["end_to_end_ms"] for r in recs)
        n = len(recs)
        missed = sum(r["deadline_missed"] for r in recs)
        cycles = recs[-1]["cycle_count"] - recs[0]["cycle_count"] + 1 if n else 0
        counter_misses = recs[-1]["deadline_miss_count"] - recs[0]["deadline_miss_count"] + int(
            recs[0]["deadline_missed"]) if n else 0
        out[node] = {
            "backend": sorted({r["backend"] for r in recs}),
            "messages": n,
            "stages": rows,
            "deadline_missed": int(missed),
            "deadline_miss_rate": missed / n if n else float("nan"),
            "cycles_by_counter": int(cycles),
            "deadline_misses_by_counter": int(counter_misses),
            "deadline_miss_rate_by_counter": counter_misses / cycles if cycles > 0 else float("nan"),
            "dropped_diagnostics": int(max(cycles - n, 0)),
            "fallback_cycles": int(sum(r["fallback_active"] for r in recs)),
            "fallback_reasons": sorted({r["fallback_reason"] for r in recs if r["fallback_reason"]}),
            "rejected_inputs": int(recs[-1]["rejected_input_count"] - recs[0]["rejected_input_count"]),
        }
    return out


# --------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------


def records_from_bag(path: str | Path, topic: str | None = None) -> list[dict[str, Any]]:
    """Diagnostics records from every PlanningDiagnostics topic of a bag (or only ``topic``)."""
    with bags.BagReader(path) as reader:
        topics = reader.topics
        if topic is not None:
            reader.check_topics([topic])
            if topics[topic].msgtype != DIAGNOSTICS_TYPE:
                raise bags.BagError(
                    f"topic {topic} in {path} is {topics[topic].msgtype}, not {DIAGNOSTICS_TYPE}")
            wanted = [topic]
        else:
            wanted = [t for t, info in topics.items() if info.msgtype == DIAGNOSTICS_TYPE]
            if not wanted:
                raise bags.BagError(
                    f"bag {path} holds no {DIAGNOSTICS_TYPE} topic (topics: {sorted(topics)})")
        return [diagnostics_record(m.msg, m.log_time_ns) for m in reader.messages(wanted)]


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def print_tables(summary: dict[str, Any], deadline_ms: float | None, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for node, s in summary.items():
        table = Table(title=f"{title}: {node} ({', '.join(s['backend'])}), {s['messages']} cycles")
        for col in ("stage", "count", "mean", "p50", "p90", "p99", "max"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        for name, st in s["stages"].items():
            style = "bold" if name in ("total", "end_to_end") else None
            cells = [f"{st[k]:.2f}" for k in ("mean", "p50", "p90", "p99", "max")]
            table.add_row(name, str(st["count"]), *cells, style=style)
        console.print(table)
        dl = f" (deadline {deadline_ms:.0f} ms)" if deadline_ms else ""
        console.print(
            f"deadline misses{dl}: {s['deadline_missed']}/{s['messages']} = "
            f"{100 * s['deadline_miss_rate']:.1f}% "
            f"of reported cycles; by the node's counters {s['deadline_misses_by_counter']}/"
            f"{s['cycles_by_counter']} ({s['dropped_diagnostics']} diagnostics not received); "
            f"fallbacks {s['fallback_cycles']}; rejected inputs {s['rejected_inputs']}"
        )


def plot_histograms(records: list[dict[str, Any]], png: str | Path, deadline_ms: float | None,
                    title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = sorted({r["node"] for r in records})
    fig, axes = plt.subplots(len(nodes), 2, figsize=(12, 3.8 * len(nodes)), squeeze=False)
    for row, node in enumerate(nodes):
        recs = [r for r in records if r["node"] == node]
        ax = axes[row, 0]
        e2e = np.array([r["end_to_end_ms"] for r in recs])
        tot = np.array([r["total_ms"] for r in recs])
        hi = float(np.nanmax(np.concatenate([e2e, tot, [deadline_ms or 0.0]]))) * 1.05 + 1e-6
        bins = np.linspace(0.0, hi, 40)
        ax.hist(tot[np.isfinite(tot)], bins=bins, alpha=0.6, label="cycle (total)")
        ax.hist(e2e[np.isfinite(e2e)], bins=bins, alpha=0.6, label="end-to-end")
        if deadline_ms:
            ax.axvline(deadline_ms, color="red", linestyle="--", label=f"deadline {deadline_ms:.0f} ms")
        for q in PERCENTILES:
            if np.isfinite(e2e).any():
                ax.axvline(np.nanpercentile(e2e, q), color="k", linewidth=0.8, alpha=0.5)
        ax.set_xlabel("ms")
        ax.set_ylabel("cycles")
        ax.set_title(f"{node}: cycle and end-to-end latency (black: e2e p50/p90/p99)")
        ax.legend()
        ax = axes[row, 1]
        stage_values: dict[str, list[float]] = defaultdict(list)
        for r in recs:
            for k, v in r["stages"].items():
                stage_values[k].append(v)
        names = _stage_order(stage_values)
        if names:
            ax.boxplot([stage_values[n] for n in names], vert=False, tick_labels=names, showfliers=True)
        ax.set_xlabel("ms")
        ax.set_title(f"{node}: per-stage latency")
    fig.suptitle(title)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy of a summary or report: numpy scalars as Python numbers, tuples as lists,
    non-finite floats as None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


