"""The headway humans keep in recorded clip datasets: for every logged vehicle (the ego and every agent
of type vehicle, each a human driver) and every step, the road user ahead in its path, and the time
gap, distance gap, closing speed, time to collision and required deceleration behind it, the
vehicle's own braking, and cut-ins (rad2_evaluation.headway). Vehicle steps logged in several clips of
one scene are counted once. Prints the percentiles per speed band of each dataset side by side, and
writes <out>/headway.json (every figure, per dataset) and a PNG (per dataset: time-gap histogram per
speed band, closing speed over time gap with its p95 / p99 envelope, braking distribution).

examples:
  rad2 data headway --data data/eval_real --out out/headway
  rad2 data headway --data /tmp/ngsim data/eval_real --label NGSIM eval_real --out out/headway \\
      --figure docs/figures/headway.png
  rad2 data headway --data out/interaction --max-clips 100 --out out/headway_interaction
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rad2_bringup.cli.common import dataset_dirs, verb_parser


def _parser():
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("data headway", __doc__)
    ap.add_argument("--data", nargs="+", required=True, metavar="DIR",
                    help="clip dataset directories (index.json, clips/*.npz), one column each")
    ap.add_argument("--label", nargs="+", metavar="NAME",
                    help="a name per dataset for the tables and the figure (default: directory names)")
    ap.add_argument("--out", type=Path, required=True,
                    help="output directory (headway.json, headway.png)")
    ap.add_argument("--figure", type=Path, help="write the PNG here instead of <out>/headway.png")
    ap.add_argument("--max-clips", type=int_at_least(1),
                    help="use at most N clips per dataset, evenly spread over its index (default: all)")
    ap.add_argument("--lane-half-width", type=float_in(0.5, 5.0),
                    help="largest lateral offset (m) of a leader's centre from the follower's path "
                         "(default: params/headway.yaml's)")
    ap.add_argument("--max-heading", type=float_in(1.0, 89.0),
                    help="largest heading difference (deg) of a leader from the follower's path "
                         "(default: params/headway.yaml's)")
    ap.add_argument("--min-speed", type=float_in(0.1, 20.0),
                    help="time gaps only at or above this follower speed, m/s "
                         "(default: params/headway.yaml's)")
    ap.add_argument("--accel-window", type=float_in(0.1, 5.0),
                    help="window (s) over which speeds are smoothed before braking is taken "
                         "(default: params/headway.yaml's)")
    ap.add_argument("--no-progress", action="store_true", help="no progress display")
    return ap


def _chosen_entries(directory: Path, max_clips: int | None) -> list[dict]:
    from rad2_core.storage import read_index

    entries = read_index(directory)["clips"]
    if max_clips is None or len(entries) <= max_clips:
        return entries
    step = len(entries) / max_clips
    return [entries[int(i * step)] for i in range(max_clips)]


def _fmt(v, digits: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _row(stats: dict, band: str) -> dict:
    """The figures of one speed band of a dataset's statistics (``all``: every speed)."""
    return stats["all"] if band == "all" else next(b for b in stats["bands"] if b["band"] == band)


def _tables(labels: list[str], stats: list[dict], console) -> None:
    from rich.table import Table

    specs = [
        ("time gap (s), p1 / p5 / p10 / p50", "time_gap_s", ("p1", "p5", "p10", "p50")),
        ("distance gap (m), p1 / p5 / p50", "gap_m", ("p1", "p5", "p50")),
        ("time to collision (s), p1 / p5 / p10", "ttc_s", ("p1", "p5", "p10")),
        ("closing speed (m/s), p95 / p99 / p99.9", "closing_mps", ("p95", "p99", "p99.9")),
        ("required deceleration closing²/(2·gap) (m/s²), p99 / p99.9", "required_decel", ("p99", "p99.9")),
        ("braking, every moving vehicle step (m/s²), p95 / p99 / p99.9", "braking", ("p95", "p99", "p99.9")),
    ]
    bands = [b["band"] for b in stats[0]["bands"]] + ["all"]
    for title, key, qs in specs:
        table = Table(title=title)
        table.add_column("speed (m/s)", justify="left")
        for label in labels:
            table.add_column(label, justify="right")
        for band in bands:
            cells = []
            for s in stats:
                row = _row(s, band)
                cells.append(" / ".join(_fmt(row[key][q]) for q in qs) if row["samples"] else "–")
            table.add_row(band, *cells)
        console.print(table)
    table = Table(title="following samples (s) per speed band")
    table.add_column("speed (m/s)", justify="left")
    for label in labels:
        table.add_column(label, justify="right")
    for band in bands:
        table.add_row(band, *(f"{_row(s, band)['following_s']:.0f}" for s in stats))
    console.print(table)
    table = Table(title="envelope: closing speed (m/s) humans accept per time gap, p95 / p99")
    table.add_column("time gap (s)", justify="left")
    for label in labels:
        table.add_column(label, justify="right")
    for i, row in enumerate(stats[0]["envelope"]):
        cells = [f"{_fmt(s['envelope'][i]['p95'])} / {_fmt(s['envelope'][i]['p99'])} "
                 f"({s['envelope'][i]['samples']})" for s in stats]
        table.add_row(f"{row['time_gap_lo']:.2f}-{row['time_gap_hi']:.2f}", *cells)
    console.print(table)
    table = Table(title="cut-ins (a new leader nearer than the previous one)")
    table.add_column("", justify="left")
    for label in labels:
        table.add_column(label, justify="right")
    c = [s["cut_ins"] for s in stats]
    table.add_row("by the new leader / own lane change",
                  *(f"{x['by_leader']} / {x['own_lane_changes']}" for x in c))
    table.add_row("per following hour", *(_fmt(x["per_following_hour"], 1) for x in c))
    table.add_row("time gap at entry p5 / p50 (s)", *(f"{_fmt(x['time_gap_s']['p5'])} / "
                                                     f"{_fmt(x['time_gap_s']['p50'])}" for x in c))
    table.add_row("follower's braking after, p50 / p99 (m/s²)",
                  *(f"{_fmt(x['response_decel']['p50'])} / {_fmt(x['response_decel']['p99'])}" for x in c))
    console.print(table)


def _figure(labels: list[str], stats: list[dict], arrays: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(labels)
    fig, axes = plt.subplots(n, 3, figsize=(14.0, 3.6 * n), squeeze=False)
    tg_bins = np.linspace(0.0, 5.0, 51)
    for r, (label, s, a) in enumerate(zip(labels, stats, arrays, strict=True)):
        ax = axes[r, 0]
        for band in s["bands"]:
            hi = math.inf if band["hi"] is None else band["hi"]
            sel = (a["speed"] >= band["lo"]) & (a["speed"] < hi) & np.isfinite(a["time_gap_s"])
            if sel.sum() < 30:
                continue
            ax.hist(a["time_gap_s"][sel], bins=tg_bins, density=True, histtype="step", linewidth=1.4,
                    label=f"{band['band']} m/s ({band['following_s'] / 60:.0f} min)")
        ax.set_xlabel("time gap to the leader (s)")
        ax.set_ylabel("density")
        ax.set_title(f"{label}: time gap per speed band", fontsize=10)
        ax.legend(fontsize=7)
        ax = axes[r, 1]
        ok = np.isfinite(a["time_gap_s"]) & np.isfinite(a["closing_mps"])
        ax.hist2d(a["time_gap_s"][ok], a["closing_mps"][ok], cmap="Greys", norm=matplotlib.colors.LogNorm(),
                  bins=[np.linspace(0.0, 4.0, 41), np.linspace(-6.0, 10.0, 65)])
        env = s["envelope"]
        mid = [0.5 * (e["time_gap_lo"] + e["time_gap_hi"]) for e in env]
        for q, style in (("p99", "r-"), ("p95", "r--")):
            ax.plot(mid, [np.nan if e[q] is None else e[q] for e in env], style, linewidth=1.6, label=q)
        ax.axhline(0.0, color="0.6", linewidth=0.6)
        ax.set_xlim(0, 4)
        ax.set_xlabel("time gap (s)")
        ax.set_ylabel("closing speed (m/s)")
        ax.set_title(f"{label}: closing speed over time gap", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax = axes[r, 2]
        b = a["braking"][np.isfinite(a["braking"])]
        d = a["decel"][np.isfinite(a["decel"])]
        bins = np.linspace(-4.0, 8.0, 97)
        ax.hist(b, bins=bins, density=True, histtype="step", linewidth=1.4, label="every moving step")
        ax.hist(d, bins=bins, density=True, histtype="step", linewidth=1.4, label="following a leader")
        for q, style in (("p99", "k--"), ("p99.9", "k:")):
            v = s["all"]["braking"][q]
            if v is not None:
                ax.axvline(v, linestyle=style[1:], color="k", linewidth=1.0, label=f"{q} {v:.1f} m/s²")
        ax.set_yscale("log")
        ax.set_xlabel("deceleration (m/s², > 0 braking)")
        ax.set_ylabel("density")
        ax.set_title(f"{label}: braking", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    dirs = dataset_dirs(ap, "--data", args.data)
    if args.label is not None and len(args.label) != len(dirs):
        ap.error(f"--label: {len(args.label)} names ({' '.join(args.label)}) for {len(dirs)} datasets")
    labels = list(args.label) if args.label else [d.name for d in dirs]
    if len(set(labels)) != len(labels):
        ap.error(f"--label: names must differ, got {' '.join(labels)}")

    from rad2_core.lane_map import LaneMap
    from rad2_core.storage import load_clip
    from rad2_evaluation.headway import HeadwayAccumulator, HeadwayParams, summarize
    from rich.console import Console
    from rich.progress import track

    console = Console(width=max(Console().width, 120))
    from dataclasses import replace

    from rad2_core.config import load_params

    # params/headway.yaml, with what the command line overrides
    given = {"lane_half_width": args.lane_half_width, "max_heading_deg": args.max_heading,
             "min_speed": args.min_speed, "accel_window_s": args.accel_window}
    params = replace(HeadwayParams.from_params(load_params("headway")),
                     **{k: v for k, v in given.items() if v is not None}).validate()
    stats, arrays = [], []
    for label, directory in zip(labels, dirs, strict=True):
        entries = _chosen_entries(directory, args.max_clips)
        acc = HeadwayAccumulator(params=params)
        cache: dict[str, LaneMap] = {}
        for entry in track(entries, description=f"{label}: {len(entries)} clips", console=console,
                           disable=args.no_progress):
            acc.add(load_clip(directory / entry["file"], maps_dir=directory / "maps", map_cache=cache))
        summary = summarize(acc)
        if summary["following_samples"] == 0:
            print(f"rad2 data headway: error: --data {directory}: no vehicle follows another in its "
                  f"{len(entries)} clips", file=sys.stderr)
            return 1
        summary["dataset"] = str(directory)
        summary["label"] = label
        stats.append(summary)
        arrays.append(acc.arrays())
        console.print(f"{label}: {summary['clips']} clips, {summary['vehicle_steps']} vehicle steps, "
                      f"{summary['following_hours']:.2f} h following a leader "
                      f"({summary['duplicate_steps_skipped']} repeated steps counted once)")
    _tables(labels, stats, console)
    args.out.mkdir(parents=True, exist_ok=True)
    out_json = args.out / "headway.json"
    with out_json.open("w") as f:
        json.dump({"command": "rad2 data headway " + " ".join(argv), "datasets": stats}, f, indent=1)
    figure = args.figure or args.out / "headway.png"
    _figure(labels, stats, arrays, figure)
    console.print(f"rad2 data headway: wrote {out_json} and {figure}")
    return 0
