"""`make demo` as a library: the simulation graph closed-loop on bundled clips, as separate processes.

Brings up graph "simulation" of launch/graphs.yaml with rad2_bringup.bringup (planner + controller
first, then the BEV-Warp sim node, which replaces the vehicle and the perception node), drives the clips
in real time while rad2_ros.nodes.monitor's Monitor records the bag and times arrivals, then builds
the report (closed-loop metrics, end-to-end latency, planner figures), prints its tables, writes
``demo.json`` and a GIF of the worst clip. :func:`run_demo` does it all; the CLI is rad2 demo.
rclpy is imported when the Monitor is made.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

# recorded real traffic (NGSIM US-101 and Lankershim Blvd; the SUMO sets are stress tests, not the demo)
DEFAULT_SPLITS = ["data/eval_real"]
# what `make demo` drives first for the side-by-side table: the default planner's generator with the
# discriminator RL trained for it (not the default: away from the roads it trained on it was less safe)
DEFAULT_BASELINE = "checkpoints/rad2_rl_real"
COMPARED_METRICS = ("CR", "AF-CR", "Safety@1", "EP-Mean", "EP@1.0", "offroad_rate", "comfort_violation_clips")


class DemoError(RuntimeError):
    pass


def bundle_clips(splits: list[str], n: int, clip_ids: list[str] | None, out_dir: Path) -> list[str]:
    """Write a dataset of ``n`` clips taken round-robin from ``splits`` (or the named ones). Within a
    split the clips are spread evenly over its index, so a split sorted by road or scenario kind
    shows each of them rather than its first few."""
    from rad2_core.config import resource_path
    from rad2_core.storage import load_clip, read_index, save_dataset

    per_split = []
    for split in splits:
        path = resource_path(split)  # the checkout's data/, else the installed package's
        index = read_index(path)
        entries = [e for e in index["clips"] if not clip_ids or e["clip_id"] in clip_ids]
        per_split.append((path, entries))
    wanted = len(clip_ids) if clip_ids else n
    quota = [0] * len(per_split)  # round-robin over the splits, none asked for more than it holds
    while sum(quota) < wanted and any(q < len(e) for q, (_, e) in zip(quota, per_split)):
        for i, (_, entries) in enumerate(per_split):
            if quota[i] < len(entries) and sum(quota) < wanted:
                quota[i] += 1
    chosen = []
    for q, (path, entries) in zip(quota, per_split):
        for j in range(q):
            entry = entries[j * len(entries) // q]  # evenly spaced: j * len / q
            chosen.append(load_clip(path / entry["file"], maps_dir=path / "maps"))
    if not chosen:
        raise DemoError(f"no clips selected from {splits} (clip ids {clip_ids})")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    save_dataset(chosen, out_dir, description="clips driven by rad2 demo")
    return [c.clip_id for c in chosen]


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


def demo_overrides(backend: str | None, sets: list[str], realtime_factor: float) -> dict[str, dict[str, Any]]:
    """Per-node parameter overrides: --backend, --set NODE.PARAM=VALUE and the sim's realtime factor."""
    from rad2_core.config import parse_node_overrides

    overrides: dict[str, dict[str, Any]] = {"planner": {}, "bev_warp_sim": {}}
    if backend:
        overrides["planner"]["planner.backend"] = backend
    for node, params in parse_node_overrides(sets).items():
        overrides.setdefault(node, {}).update(params)
    overrides["bev_warp_sim"]["node.realtime_factor"] = float(realtime_factor)
    return {k: v for k, v in overrides.items() if v}


def drive(stack: Any, sim: Any, monitor: Any, num_clips: int, timeout: float, ready_timeout: float,
          progress: bool = True) -> tuple[int, int]:
    """Start planner + controller, then the sim; spin the monitor until the sim reports its summary
    (DemoError after ``timeout`` s). Returns the wall-clock (start, end) of the driving in ns."""
    from tqdm import tqdm

    stack.start()
    took = stack.wait_ready(ready_timeout)
    print(f"[demo] planner + controller ready in {took:.1f} s (logs {stack.log_dir})", flush=True)
    sim.start()
    sim.wait_ready(ready_timeout)
    t_sim0 = time.time_ns()
    print(f"[demo] sim running {num_clips} clips in real time ...", flush=True)
    end = time.monotonic() + timeout
    shown = 0
    with tqdm(total=num_clips, desc="clips", unit="clip", disable=not progress) as bar:
        while monitor.summary is None and time.monotonic() < end:
            monitor.spin(0.5)
            stack.check_alive()
            sim.check_alive()
            bar.set_postfix(steps=len(monitor.t_input), plans=len(monitor.t_traj))
            while shown < len(monitor.results):
                r = monitor.results[shown]
                bar.write(f"[demo] clip {shown + 1}/{num_clips} {r['clip_id']}: {r['termination']}, "
                          f"collided={r['collided']}, min TTC {r['min_ttc']:.2f} s, rho {r['rho']:.3f}")
                bar.update(1)
                shown += 1
    t_sim1 = time.time_ns()
    if monitor.summary is None:
        raise DemoError(f"the sim did not finish {num_clips} clips in {timeout:.0f} s")
    monitor.spin(0.5)
    return t_sim0, t_sim1


def planner_figures(diags: list[dict[str, Any]], stages: dict[str, Any]) -> dict[str, Any]:
    """Cycles, deadline misses (by the node's counters), fallbacks, rejected inputs, backends."""
    return {
        "cycles": len(diags),
        "deadline_misses": int(diags[-1]["deadline_miss_count"]) if diags else 0,
        "deadline_miss_rate": (diags[-1]["deadline_miss_count"] / max(diags[-1]["cycle_count"], 1)
                               if diags else float("nan")),
        "fallback_cycles": int(sum(d["fallback_active"] for d in diags)),
        "rejected_inputs": int(diags[-1]["rejected_input_count"]) if diags else 0,
        "backend": sorted({d["backend"] for d in diags}),
        "stages": stages,
    }


def demo_report(monitor: Any, clip_ids: list[str], deadline_ms: float, summary: dict[str, Any],
                t_sim: tuple[int | None, int | None]) -> dict[str, Any]:
    """The report of a finished run from the monitor (everything but exit codes, bag and logs)."""
    from rad2_ros.latency import stats

    lat = monitor.latencies()
    diags = monitor.planner_diags
    t_sim0, t_sim1 = t_sim
    return {
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
        "planner": planner_figures(diags, summary.get("planner", {}).get("stages", {})),
        "control_rate_hz": monitor.control_rate(t_sim0, t_sim1) if t_sim0 and t_sim1 else float("nan"),
        "emergency_stops": int(sum(e for _, e, _ in monitor.commands)),
    }


def run_demo(
    out: str | Path,
    *,
    splits: list[str] | None = None,
    num_clips: int = 4,
    clip_ids: list[str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    domain_id: int | None = None,
    timeout: float = 600.0,
    ready_timeout: float = 120.0,
    bag: bool = True,
    record_bev: bool = False,
    gif: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """The whole demo (see the module doc); returns the report also written to ``<out>/demo.json``."""
    from rad2_core.config import load_params
    from rad2_ros.latency import print_tables, summarise
    from rad2_ros.nodes.monitor import Monitor

    from rad2_bringup.bringup import Bringup

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    clip_ids = bundle_clips(splits or DEFAULT_SPLITS, num_clips, clip_ids, out / "clips")
    print(f"[demo] {len(clip_ids)} clips: {', '.join(clip_ids)}", flush=True)
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0")) if domain_id is None else domain_id
    overrides = overrides or {}
    common = {"graph": "simulation", "args": {"dataset": str(out / "clips"), "max_clips": str(len(clip_ids))},
              "domain_id": domain, "log_dir": out / "logs"}
    stack = Bringup(**common, overrides=overrides, only=["planner", "controller"])
    sim = Bringup(**common, overrides={k: v for k, v in overrides.items() if k == "bev_warp_sim"},
                  only=["bev_warp_sim"])
    deadline_ms = float(load_params("planner")["planner"]["deadline_ms"])
    monitor = Monitor(out / "bag" if bag else None, record_bev)
    t_sim: tuple[int | None, int | None] = (None, None)
    try:
        t_sim = drive(stack, sim, monitor, len(clip_ids), timeout, ready_timeout, progress)
    finally:
        codes = {**sim.stop(), **stack.stop()}
        monitor.close()
    print(f"[demo] nodes stopped: {codes}", flush=True)
    records = monitor.planner_diags + monitor.control_diags
    summary = summarise(records) if records else {}
    report = demo_report(monitor, clip_ids, deadline_ms, summary, t_sim)
    report.update({
        "exit_codes": codes, "bag": str(out / "bag") if bag else None,
        "bag_counts": dict(monitor.writer.counts) if monitor.writer is not None else {},
        "logs": str(stack.log_dir),
    })
    if summary:
        print_tables(summary, deadline_ms, "Stage timings (planning/diagnostics, control/diagnostics)")
    print_report(report)
    if gif and monitor.results:
        report["gif"] = str(render_gif(monitor, out))
        print(f"[demo] GIF: {report['gif']}")
    if report["bag"]:
        print(f"[demo] MCAP bag: {report['bag']} ({sum(report['bag_counts'].values())} messages)")
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=float))
    print(f"[demo] report: {out / 'demo.json'}")
    return report


def render_gif(monitor: Any, out: Path) -> Path:
    """A GIF of the worst clip of the run (rad2_evaluation.closed_loop.render_episode_gif)."""
    from bev_warp_sim.metrics import EpisodeResult, worst_results
    from rad2_core.storage import load_dataset
    from rad2_evaluation.closed_loop import render_episode_gif

    clips = {c.clip_id: c for c in load_dataset(out / "clips")}
    fields = set(EpisodeResult.__dataclass_fields__)
    results = [EpisodeResult(**{k: v for k, v in r.items() if k in fields}) for r in monitor.results]
    worst = worst_results(results, 1)[0]
    index = next(i for i, r in enumerate(monitor.results) if r["clip_id"] == worst.clip_id)
    track = monitor.tracks().get(index)
    n = worst.end_step - worst.start_step + 1
    track = track[-n:] if track is not None and len(track) >= n else track
    return render_episode_gif(clips[worst.clip_id], track, worst, out / f"demo_{worst.clip_id}.gif", stride=3)


def run_comparison(out: str | Path, baseline_checkpoint: str, **kwargs: Any) -> dict[str, Any]:
    """The same clips driven twice through the same graph: first with ``baseline_checkpoint`` as
    planner.checkpoint_dir (no separate discriminator; an untrained discriminator means the fallback
    rule selects), then as configured. Prints both runs, then the side-by-side table; writes
    ``<out>/comparison.json`` and ``comparison.png``; returns ``{"baseline": .., "configured": ..}``
    (only "configured" when the baseline is the configured planner: it is driven once)."""
    from rad2_core.config import load_params, resource_path

    out = Path(out).resolve()
    planner = load_params("planner")["planner"]
    overrides = {k: dict(v) for k, v in (kwargs.pop("overrides", None) or {}).items()}
    configured = overrides.get("planner", {}).get("planner.checkpoint_dir", planner["checkpoint_dir"])
    base = resource_path(baseline_checkpoint)
    if base == resource_path(configured) and not planner["discriminator_checkpoint"]:
        print(f"[demo] the baseline {baseline_checkpoint} is the configured planner: driving it once",
              flush=True)
        return {"configured": run_demo(out, overrides=overrides, **kwargs)}
    base_overrides = {**overrides, "planner": {**overrides.get("planner", {}),
                                               "planner.checkpoint_dir": str(base),
                                               "planner.discriminator_checkpoint": ""}}
    print(f"[demo] 1/2 baseline: {baseline_checkpoint}", flush=True)
    baseline = run_demo(out / "baseline", **{**kwargs, "overrides": base_overrides, "bag": False,
                                               "gif": False})
    kwargs["clip_ids"] = baseline["clips"]  # the very same clips
    print(f"[demo] 2/2 configured planner: {configured}", flush=True)
    main = run_demo(out, **{**kwargs, "overrides": overrides})
    runs = {f"baseline ({Path(str(baseline_checkpoint)).name})": baseline,
            f"configured ({Path(str(configured)).name})": main}
    rows = comparison_rows(runs)
    print_comparison(rows, list(runs))
    plot_comparison(rows, list(runs), out / "comparison.png")
    (out / "comparison.json").write_text(json.dumps({"runs": list(runs), "rows": rows}, indent=1,
                                                    default=float))
    print(f"[demo] side by side: {out / 'comparison.json'}, {out / 'comparison.png'}")
    return {"baseline": baseline, "configured": main}


def comparison_rows(runs: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Metric -> one value per run (closed-loop metrics, latency p50/p99, deadline misses per cycle run:
    input periods skipped while a cycle ran late count as misses too, so it can exceed 1)."""
    rows: dict[str, list[float]] = {}
    for name in COMPARED_METRICS:
        rows[name] = [float(r["metrics"].get(name, float("nan"))) for r in runs.values()]
    key = "input -> trajectory (monitor)"
    for q in ("p50", "p99"):
        rows[f"input->trajectory {q} (ms)"] = [float(r["latency"].get(key, {}).get(q, float("nan")))
                                              for r in runs.values()]
    rows["deadline misses per cycle run"] = [float(r["planner"]["deadline_miss_rate"]) for r in runs.values()]
    return rows


def print_comparison(rows: dict[str, list[float]], names: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Side by side: the same clips, the same graph")
    t.add_column("metric")
    for n in names:
        t.add_column(n, justify="right")
    for metric, values in rows.items():
        t.add_row(metric, *[f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}" for v in values])
    Console().print(t)


def plot_comparison(rows: dict[str, list[float]], names: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metrics = [m for m in COMPARED_METRICS if m in rows]
    x = np.arange(len(metrics))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for i, n in enumerate(names):
        ax.bar(x + (i - (len(names) - 1) / 2) * width, [rows[m][i] for m in metrics], width, label=n)
    ax.set_xticks(x, metrics, rotation=20)
    ax.set_ylim(0, 1.05)
    ax.set_title("make demo: closed-loop metrics, baseline vs configured planner")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
