#!/usr/bin/env python3
"""`make demo`: the full ROS 2 graph closed-loop on bundled evaluation clips, as separate processes.

Brings up graph "simulation" of launch/graphs.yaml with tools/bringup.py (planner + controller first,
then the BEV-Warp sim node, which replaces the vehicle and the perception node), drives a handful of
clips from data/eval_efficiency and data/eval_safety in real time (10 Hz), and meanwhile
  - records the run into an MCAP bag (rosbag2 layout, opens in Foxglove) with rad2_planner.nodes.monitor's
    Monitor: odometry, scene tokens, candidates, trajectory, path, markers, diagnostics, commands,
    episode results, /clock (BEV rasters only with --record-bev: ~0.65 MB each);
  - measures end-to-end latency on this process's wall clock: arrival of a step's odometry (the sim
    publishes odometry, BEV, tokens of one step together) -> arrival of the trajectory planned from
    that stamp, and -> the first controller cycle that used that trajectory (control/diagnostics
    input_stamp), plus the planner's own per-stage timings from planning/diagnostics.
Then prints the closed-loop metric table (bev_warp_sim.metrics) and the latency tables, writes
<out>/demo.json and a GIF of the worst clip (bev_warp_sim.evaluate.render_episode_gif).

  python tools/demo.py                      # 4 clips (2 + 2), outputs in runs/demo
  python tools/demo.py --clips 2 --no-gif --out /tmp/demo
  python tools/demo.py --dataset data/eval_safety --clip-ids sumo_cut_in_20250102
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rad2_planner.nodes.monitor import Monitor

ROOT = Path(__file__).resolve().parents[1]


DEFAULT_SPLITS = ["data/eval_efficiency", "data/eval_safety"]


class DemoError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------
# clip selection
# --------------------------------------------------------------------------------------------------


def bundle_clips(splits: list[str], n: int, clip_ids: list[str] | None, out_dir: Path) -> list[str]:
    """Write a dataset of ``n`` clips taken round-robin from ``splits`` (or the named ones)."""
    from rad2_planner.clip import load_clip, read_index, save_dataset

    per_split = []
    for split in splits:
        path = ROOT / split if not Path(split).is_absolute() else Path(split)
        index = read_index(path)
        entries = [e for e in index["clips"] if not clip_ids or e["clip_id"] in clip_ids]
        per_split.append((path, entries))
    chosen = []
    k = 0
    while len(chosen) < (n if not clip_ids else len(clip_ids)) and any(k < len(e) for _, e in per_split):
        for path, entries in per_split:
            if k < len(entries) and len(chosen) < (n if not clip_ids else len(clip_ids)):
                chosen.append(load_clip(path / entries[k]["file"], maps_dir=path / "maps"))
        k += 1
    if not chosen:
        raise DemoError(f"no clips selected from {splits} (clip ids {clip_ids})")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    save_dataset(chosen, out_dir, description="clips driven by tools/demo.py")
    return [c.clip_id for c in chosen]


# --------------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    m = report["metrics"]
    t = Table(title=f"Closed-loop metrics over {len(report['results'])} clips (ROS graph, real time)")
    cols = ["CR", "AF-CR", "Safety@1", "Safety@2", "EP-Mean", "EP@1.0", "EP@0.9", "offroad_rate",
            "comfort_violation_clips"]
    for c in cols:
        t.add_column(c, justify="right")
    t.add_row(*[f"{m.get(c, float('nan')):.3f}" for c in cols])
    console.print(t)
    t = Table(title="Per clip")
    for c in ("clip", "kind", "termination", "collided", "at fault", "min TTC s", "rho", "steps"):
        t.add_column(c, justify="left" if c in ("clip", "kind", "termination") else "right")
    for r in report["results"]:
        t.add_row(r["clip_id"], r["scenario_kind"], r["termination"], str(r["collided"]), str(r["at_fault"]),
                  f"{r['min_ttc']:.2f}", f"{r['rho']:.3f}", str(r["num_steps"]))
    console.print(t)
    t = Table(title=f"End-to-end latency, ms (wall clock; deadline {report['deadline_ms']:.0f} ms)")
    for c in ("path", "count", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="left" if c == "path" else "right")
    for name, st in report["latency"].items():
        t.add_row(name, str(st["count"]), *[f"{st[k]:.1f}" for k in ("p50", "p90", "p99", "max")])
    console.print(t)
    p = report["planner"]
    console.print(
        f"planner: {p['cycles']} cycles, deadline misses {p['deadline_misses']} "
        f"({100 * p['deadline_miss_rate']:.1f}%), fallbacks {p['fallback_cycles']}, rejected inputs "
        f"{p['rejected_inputs']}; controller: {report['control_rate_hz']:.1f} Hz commands, "
        f"{report['emergency_stops']} emergency-stop commands")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rad2_planner.bringup import Bringup
    from rad2_planner.config import load_params, parse_node_overrides
    from rad2_planner.latency import print_tables, stats, summarise

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    splits = args.dataset or DEFAULT_SPLITS
    clip_ids = bundle_clips(splits, args.clips, args.clip_ids, out / "clips")
    print(f"[demo] {len(clip_ids)} clips: {', '.join(clip_ids)}", flush=True)
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0")) if args.domain_id is None else args.domain_id
    overrides: dict[str, dict[str, Any]] = {"planner": {}, "bev_warp_sim": {}}
    if args.backend:
        overrides["planner"]["planner.backend"] = args.backend
    for node, params in parse_node_overrides(args.set).items():
        overrides.setdefault(node, {}).update(params)
    overrides["bev_warp_sim"]["node.realtime_factor"] = float(args.realtime_factor)
    graph_args = {"dataset": str(out / "clips"), "max_clips": str(len(clip_ids))}
    common = {"graph": "simulation", "args": graph_args, "domain_id": domain, "log_dir": out / "logs",
              "overrides": {k: v for k, v in overrides.items() if v}}
    stack = Bringup(**common, only=["planner", "controller"])
    sim = Bringup(**{**common, "overrides": {k: v for k, v in common["overrides"].items()
                                            if k == "bev_warp_sim"}}, only=["bev_warp_sim"])
    deadline_ms = float(load_params("planner")["planner"]["deadline_ms"])
    monitor = Monitor(None if args.no_bag else out / "bag", args.record_bev)
    t_sim0 = t_sim1 = None
    try:
        stack.start()
        took = stack.wait_ready(args.ready_timeout)
        print(f"[demo] planner + controller ready in {took:.1f} s (logs {stack.log_dir})", flush=True)
        sim.start()
        sim.wait_ready(args.ready_timeout)
        t_sim0 = time.time_ns()
        print(f"[demo] sim running {len(clip_ids)} clips in real time ...", flush=True)
        end = time.monotonic() + args.timeout
        shown = 0
        from tqdm import tqdm

        with tqdm(total=len(clip_ids), desc="clips", unit="clip", disable=args.no_progress) as bar:
            while monitor.summary is None and time.monotonic() < end:
                monitor.spin(0.5)
                stack.check_alive()
                sim.check_alive()
                bar.set_postfix(steps=len(monitor.t_input), plans=len(monitor.t_traj))
                while shown < len(monitor.results):
                    r = monitor.results[shown]
                    bar.write(f"[demo] clip {shown + 1}/{len(clip_ids)} {r['clip_id']}: {r['termination']}, "
                              f"collided={r['collided']}, min TTC {r['min_ttc']:.2f} s, rho {r['rho']:.3f}")
                    bar.update(1)
                    shown += 1
        t_sim1 = time.time_ns()
        if monitor.summary is None:
            raise DemoError(f"the sim did not finish {len(clip_ids)} clips in {args.timeout:.0f} s")
        monitor.spin(0.5)
    finally:
        codes = {**sim.stop(), **stack.stop()}
        monitor.close()
    print(f"[demo] nodes stopped: {codes}", flush=True)

    lat = monitor.latencies()
    records = monitor.planner_diags + monitor.control_diags
    summary = summarise(records) if records else {}
    planner_summary = summary.get("planner", {})
    diags = monitor.planner_diags
    report = {
        "clips": clip_ids,
        "results": monitor.results,
        "metrics": monitor.summary.get("metrics", {}),
        "deadline_ms": deadline_ms,
        "latency": {
            "input -> trajectory (monitor)": stats(lat["input_to_trajectory_ms"]),
            "input -> control command (monitor)": stats(lat["input_to_control_ms"]),
            "planner end_to_end (diagnostics)": stats(d["end_to_end_ms"] for d in diags),
            "planner cycle total (diagnostics)": stats(d["total_ms"] for d in diags),
        },
        "planner": {
            "cycles": len(diags),
            "deadline_misses": int(diags[-1]["deadline_miss_count"]) if diags else 0,
            "deadline_miss_rate": (diags[-1]["deadline_miss_count"] / max(diags[-1]["cycle_count"], 1)
                                   if diags else float("nan")),
            "fallback_cycles": int(sum(d["fallback_active"] for d in diags)),
            "rejected_inputs": int(diags[-1]["rejected_input_count"]) if diags else 0,
            "backend": sorted({d["backend"] for d in diags}),
            "stages": planner_summary.get("stages", {}),
        },
        "control_rate_hz": monitor.control_rate(t_sim0, t_sim1) if t_sim0 and t_sim1 else float("nan"),
        "emergency_stops": int(sum(e for _, e, _ in monitor.commands)),
        "exit_codes": codes,
        "bag": None if args.no_bag else str(out / "bag"),
        "bag_counts": dict(monitor.writer.counts) if monitor.writer is not None else {},
        "logs": str(stack.log_dir),
    }
    if summary:
        print_tables(summary, deadline_ms, "Stage timings (planning/diagnostics, control/diagnostics)")
    print_report(report)
    if not args.no_gif and monitor.results:
        report["gif"] = str(render_gif(monitor, out, args))
        print(f"[demo] GIF: {report['gif']}")
    if report["bag"]:
        print(f"[demo] MCAP bag: {report['bag']} ({sum(report['bag_counts'].values())} messages)")
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=float))
    print(f"[demo] report: {out / 'demo.json'}")
    return report


def render_gif(monitor: Monitor, out: Path, args: argparse.Namespace) -> Path:
    from bev_warp_sim.evaluate import render_episode_gif
    from bev_warp_sim.metrics import EpisodeResult, worst_results
    from rad2_planner.clip import load_dataset

    clips = {c.clip_id: c for c in load_dataset(out / "clips")}
    fields = set(EpisodeResult.__dataclass_fields__)
    results = [EpisodeResult(**{k: v for k, v in r.items() if k in fields}) for r in monitor.results]
    worst = worst_results(results, 1)[0]
    index = next(i for i, r in enumerate(monitor.results) if r["clip_id"] == worst.clip_id)
    track = monitor.tracks().get(index)
    n = worst.end_step - worst.start_step + 1
    track = track[-n:] if track is not None and len(track) >= n else track
    return render_episode_gif(clips[worst.clip_id], track, worst, out / f"demo_{worst.clip_id}.gif", stride=3)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=4, help="number of clips, round-robin over the datasets")
    ap.add_argument("--dataset", nargs="+", default=None,
                    help=f"dataset directories (default: {' '.join(DEFAULT_SPLITS)})")
    ap.add_argument("--clip-ids", nargs="+", default=None, help="drive these clips (from --dataset)")
    ap.add_argument("--out", default="runs/demo", help="output directory (bag, GIF, demo.json, logs)")
    ap.add_argument("--backend", default=None, help="override planner.backend (pytorch | onnxruntime)")
    ap.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                    help="parameter override, e.g. planner.planner.num_candidates=16")
    ap.add_argument("--realtime-factor", type=float, default=1.0, help="simulated seconds per wall second")
    ap.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: environment or 0)")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds of driving")
    ap.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for the nodes")
    ap.add_argument("--no-bag", action="store_true", help="do not write the MCAP bag")
    ap.add_argument("--record-bev", action="store_true", help="also record perception/bev_features")
    ap.add_argument("--no-gif", action="store_true", help="do not render the GIF")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    from rad2_planner.rosenv import RosEnvironmentError, ensure_ros_environment

    try:
        ensure_ros_environment(__file__, argv, args.domain_id)
    except RosEnvironmentError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    from rad2_planner.bringup import BringupError
    from rad2_planner.config import ParameterError

    try:
        run(args)
    except (DemoError, BringupError, ParameterError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
