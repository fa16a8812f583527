#!/usr/bin/env python3
"""Summarise planning-cycle latency from rad2_msgs/PlanningDiagnostics: a live run or a bag.

For every stage the planner reports (preprocess, encode, denoise_0..K-1, score, select, publish, ...)
plus the whole cycle (``total``), the sum of the denoising steps (``denoise_all``) and the end-to-end
latency (input stamp -> publication): count, mean, p50, p90, p99 and max in milliseconds, the
deadline-miss rate (cycles flagged ``deadline_missed``, and from the node's own cumulative counters,
which also count cycles whose diagnostics were dropped), fallbacks and rejected inputs. Prints a rich
table; optionally writes JSON and a histogram PNG.

  latency_report.py --bag runs/replay_bag            # from a recorded bag
  latency_report.py --duration 20                    # live: subscribe for 20 s (needs the colcon build)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_p = str(ROOT / "ros2_ws" / "src" / "rad2_planner")
if _p not in sys.path:
    sys.path.insert(0, _p)

from rad2_planner import bags  # noqa: E402

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
    """Pipeline order: preprocess, encode, denoise_0.., score, select, publish, then the rest."""
    first = ["preprocess", "encode"]
    last = ["score", "select", "publish"]
    names = set(names)

    def key(n: str) -> tuple:
        if n in first:
            return (0, first.index(n), 0)
        if n.startswith("denoise_") and n[8:].isdigit():
            return (1, 0, int(n[8:]))
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
            den = [v for k, v in rec["stages"].items() if k.startswith("denoise_")]
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


def records_live(topic: str, duration_s: float, domain_id: int | None = None) -> list[dict[str, Any]]:
    """Subscribe to ``topic`` for ``duration_s`` seconds (rclpy; needs the built rad2_msgs)."""
    import os

    if domain_id is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    try:
        from rad2_msgs.msg import PlanningDiagnostics
    except ImportError as exc:
        raise RuntimeError("rad2_msgs is not importable: build the workspace (tools/bootstrap.sh) and "
                           "source tools/env.sh") from exc
    from rich.progress import Progress

    records: list[dict[str, Any]] = []
    rclpy.init()
    node = rclpy.create_node("latency_report")
    try:
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(
            PlanningDiagnostics, topic,
            lambda msg: records.append(diagnostics_record(msg, time.time_ns())), qos)
        end = time.monotonic() + duration_s
        with Progress() as progress:
            task = progress.add_task(f"listening on {topic}", total=duration_s)
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
                progress.update(task, completed=duration_s - max(end - time.monotonic(), 0.0),
                                description=f"listening on {topic}: {len(records)} msgs")
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return records


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


def _default_deadline() -> float | None:
    try:
        from rad2_planner.config import load_params, require

        return float(require(load_params("planner"), "planner.deadline_ms"))
    except Exception:
        return None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--bag", help="rosbag2 directory holding PlanningDiagnostics")
    src.add_argument("--duration", type=float, help="live mode: subscribe for this many seconds")
    parser.add_argument("--topic",
                        help=f"diagnostics topic (live default {DEFAULT_TOPIC}; bag: all of that type)")
    parser.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID for live mode (default: environment)")
    parser.add_argument("--deadline-ms", type=float, default=None,
                        help="deadline drawn in the plot (default: planner.deadline_ms, params/planner.yaml)")
    parser.add_argument("--json", help="write the summary as JSON here")
    parser.add_argument("--png", help="write the latency histogram here")
    args = parser.parse_args(argv)
    deadline = args.deadline_ms if args.deadline_ms is not None else _default_deadline()
    try:
        if args.bag:
            records = records_from_bag(args.bag, args.topic)
            title = f"latency from {args.bag}"
        else:
            if args.duration <= 0:
                raise ValueError("--duration must be positive")
            records = records_live(args.topic or DEFAULT_TOPIC, args.duration, args.domain_id)
            title = f"latency, live {args.duration:.0f} s on {args.topic or DEFAULT_TOPIC}"
    except (bags.BagError, RuntimeError, ValueError) as exc:
        print(f"latency_report: error: {exc}", file=sys.stderr)
        return 2
    if not records:
        print("latency_report: error: no PlanningDiagnostics messages received", file=sys.stderr)
        return 3
    summary = summarise(records)
    print_tables(summary, deadline, title)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = _jsonable({"deadline_ms": deadline, "nodes": summary})
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.png:
        plot_histograms(records, args.png, deadline, title)
        print(f"histogram: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
