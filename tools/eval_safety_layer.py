#!/usr/bin/env python3
"""One command for the safety-layer table: RAD-2 without the layer, with rejection sampling and with
candidate selection (params/planner.yaml ``safety_layer``), closed loop on the evaluation splits.

For every mode, split and evaluation seed the planner drives the clips (bev_warp_sim.rollout, the
deterministic deployment selection, evaluation.h_reuse of params/sim.yaml; --max-clips N takes N clips
spread evenly over each split's index, which lists the clips kind by kind, so every scenario kind is
represented). The table takes CR, AF-CR
and Safety@1 from the safety split and EP-Mean from the efficiency split (the paper's layout; the
full per-split metrics are in the JSON), mean ± standard deviation over the seeds, plus the safety
layer's corrections per planning cycle (resampling rounds, or changed selections) and the planning
latency of single-observation cycles (B = 1, M candidates) on this CPU with the planner's backend
(ONNX Runtime by default), measured on observations the planner met in the closed-loop runs.

Self-correction (the generator conditioned on the rejected trajectories) needs a retrained generator
and is not part of this table.

Writes --out/results.json, --out/table.md and --out/safety_layer.png.

Example (about 10 minutes on 2 shared cores):
    python tools/eval_safety_layer.py --max-clips 12 --seeds 0
    python tools/eval_safety_layer.py --seeds 0 1 2            # the full splits, three seeds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

MODES = ("off", "rejection_sampling", "candidate_selection")
LABELS = {
    "off": "RAD-2 (no safety layer)",
    "rejection_sampling": "+ rejection sampling",
    "candidate_selection": "+ candidate selection",
}


def recording_decider(policy, keep_every: int, keep_max: int):
    """A BatchedPolicy that also records the safety layer's corrections of every cycle and keeps every
    ``keep_every``-th observation (up to ``keep_max``) for the latency measurement."""
    from bev_warp_sim.rollout import BatchedPolicy

    class Recording(BatchedPolicy):
        def __init__(self):
            super().__init__(policy, selection="deterministic")
            self.corrections: list[int] = []
            self.observations: list = []
            self.seen = 0

        def decide(self, sim, state, indices, observations, seeds):
            plans = super().decide(sim, state, indices, observations, seeds)
            for obs, plan in zip(observations, plans):
                self.corrections.append(int(plan.info.get("corrections", 0)))
                if keep_every and self.seen % keep_every == 0 and len(self.observations) < keep_max:
                    self.observations.append(obs)
                self.seen += 1
            return plans

    return Recording()


def spread(clips: list, n: int | None) -> list:
    """``n`` clips evenly spaced over ``clips`` (all when ``n`` is None or not smaller)."""
    import numpy as np

    if n is None or n >= len(clips):
        return list(clips)
    return [clips[i] for i in np.unique(np.linspace(0, len(clips) - 1, n).round().astype(int))]


def latency(policy, observations, warmup: int = 5) -> dict:
    """Wall-clock ms of single-observation planning cycles (each its own seed) and the stage means."""
    import numpy as np

    for i, obs in enumerate(observations[:warmup]):
        policy.plan(obs, seed=10_000 + i)
    totals, critic, corr, rounds = [], [], [], []
    for i, obs in enumerate(observations):
        t0 = time.perf_counter()
        r = policy.plan(obs, seed=i)
        totals.append((time.perf_counter() - t0) * 1e3)
        critic.append(r.timings_ms.get("critic", 0.0))
        corr.append(r.timings_ms.get("corrections", 0.0))
        rounds.append(int(r.info.get("corrections", 0)))
    t = np.asarray(totals)
    return {
        "cycles": len(t),
        "p50_ms": float(np.percentile(t, 50)),
        "p99_ms": float(np.percentile(t, 99)),
        "mean_ms": float(t.mean()),
        "max_ms": float(t.max()),
        "critic_mean_ms": float(np.mean(critic)),
        "corrections_mean_ms": float(np.mean(corr)),
        "corrections_per_cycle": float(np.mean(rounds)),
    }


def summarise(runs: list[dict], metric: str) -> tuple[float, float]:
    import numpy as np

    v = np.array([r[metric] for r in runs], dtype=float)
    return float(v.mean()), float(v.std()) if len(v) > 1 else 0.0


def fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if n > 1 else "")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [LABELS[r["mode"]].replace(" (no safety layer)", "") for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(11, 3.3))
    for a, (key, title) in zip(
        ax,
        (
            ("CR", "collision rate (safety split) ↓"),
            ("EP-Mean", "EP-Mean (efficiency split) ↑"),
            ("p99_ms", "p99 planning latency, ms ↓"),
        ),
    ):
        means = [r[key][0] for r in rows]
        stds = [r[key][1] for r in rows]
        a.bar(
            range(len(rows)),
            means,
            yerr=stds,
            color=["0.6", "tab:orange", "tab:blue"][: len(rows)],
            capsize=3,
        )
        a.set_xticks(range(len(rows)), names, fontsize=7, rotation=12)
        a.set_title(title, fontsize=9)
        a.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--splits",
        nargs="+",
        default=["data/eval_safety", "data/eval_efficiency"],
        help="dataset directories (a name with 'safety' / 'efficiency' picks the table's columns)",
    )
    ap.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="evaluation seeds (planner noise)"
    )
    ap.add_argument(
        "--max-clips",
        type=int,
        default=None,
        help="N clips of each split, spread evenly over its scenario kinds (default: all)",
    )
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="safety_layer.mode values")
    ap.add_argument(
        "--threshold", type=float, default=None, help="safety_layer.threshold (default: planner.yaml)"
    )
    ap.add_argument(
        "--max-rounds", type=int, default=None, help="safety_layer.max_rounds (default: planner.yaml)"
    )
    ap.add_argument(
        "--critic", default=None, help="critic checkpoint (default: safety_layer.critic_checkpoint)"
    )
    ap.add_argument("--num-candidates", type=int, default=None, help="M (default: planner.num_candidates)")
    ap.add_argument(
        "--backend",
        default="onnxruntime",
        choices=["onnxruntime", "pytorch", "tensorrt"],
        help="planner backend (default: onnxruntime, the CPU deployment runtime)",
    )
    ap.add_argument(
        "--batch-size", type=int, default=None, help="clips stepped together (evaluation.batch_size)"
    )
    ap.add_argument(
        "--latency-cycles",
        type=int,
        default=120,
        help="single-observation cycles timed per mode (0: no latency measurement)",
    )
    ap.add_argument("--out", default="out/safety_layer", help="output directory")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = ap.parse_args(argv)
    if args.max_clips is not None and args.max_clips < 1:
        ap.error(f"--max-clips: must be >= 1, got {args.max_clips}")
    if args.latency_cycles < 0:
        ap.error(f"--latency-cycles: must be >= 0, got {args.latency_cycles}")
    if any(s < 0 for s in args.seeds):
        ap.error(f"--seeds: must be non-negative, got {args.seeds}")
    for split in args.splits:
        if not (Path(split) / "index.json").is_file():
            ap.error(f"--splits: {split} is not a dataset directory (no index.json)")

    import numpy as np
    from bev_warp_sim.evaluate import split_kind
    from bev_warp_sim.metrics import aggregate
    from bev_warp_sim.rollout import run_rollouts
    from bev_warp_sim.simulator import Simulator
    from rad2_planner.clip import load_dataset
    from rad2_planner.config import load_params
    from rad2_planner.policy import Rad2Policy, SafetyLayerParams
    from tqdm import tqdm
    from train_critic import hardware

    params = load_params("planner")
    sl = params["safety_layer"]
    try:
        layers = {
            m: SafetyLayerParams(
                m,
                float(sl["threshold"] if args.threshold is None else args.threshold),
                int(sl["max_rounds"] if args.max_rounds is None else args.max_rounds),
                str(args.critic or sl["critic_checkpoint"]),
            )
            for m in args.modes
        }
    except ValueError as exc:
        ap.error(str(exc))
    sim_params = load_params("sim")
    t_start = time.perf_counter()
    load_before = hardware()["load_average"]
    policy = Rad2Policy.from_params(
        params,
        backend=args.backend,
        num_candidates=args.num_candidates,
        safety_layer=SafetyLayerParams(mode="off"),
    )
    m = policy.num_candidates
    sim = Simulator(sim_params)
    h_reuse = int(sim_params["evaluation"]["h_reuse"])
    batch_size = int(sim_params["evaluation"]["batch_size"] if args.batch_size is None else args.batch_size)
    clips = {split: spread(load_dataset(split), args.max_clips) for split in args.splits}
    n_clips = {split: len(c) for split, c in clips.items()}
    total_decisions = sum(c.num_steps for cs in clips.values() for c in cs) // h_reuse
    keep_every = max(1, total_decisions // max(args.latency_cycles, 1)) if args.latency_cycles else 0
    runs: list[dict] = []
    latency_obs: list = []
    latencies: dict[str, dict] = {}
    for mode in args.modes:
        policy.set_safety_layer(layers[mode])
        for split in args.splits:
            for seed in args.seeds:
                # the latency set: observations the planner without the layer met, on every split
                keep = keep_every if (mode == args.modes[0] and seed == args.seeds[0]) else 0
                decider = recording_decider(policy, keep, args.latency_cycles - len(latency_obs))
                t0 = time.perf_counter()
                with tqdm(
                    total=len(clips[split]),
                    desc=f"{mode} @ {Path(split).name} seed {seed}",
                    unit="clip",
                    disable=args.no_progress,
                ) as bar:
                    rollouts, _ = run_rollouts(
                        sim,
                        decider,
                        clips[split],
                        1,
                        batch_size=batch_size,
                        seed=seed,
                        h_reuse=h_reuse,
                        progress=bar.update,
                    )
                wall = time.perf_counter() - t0
                metrics = aggregate([r.result for r in rollouts], sim_params)
                latency_obs += decider.observations
                corr = np.asarray(decider.corrections)
                runs.append(
                    {
                        "mode": mode,
                        "split": split,
                        "kind": split_kind(split),
                        "seed": seed,
                        "clip_ids": [c.clip_id for c in clips[split]],
                        **metrics,
                        "corrections_per_cycle": float(corr.mean()) if len(corr) else 0.0,
                        "cycles_corrected": float((corr > 0).mean()) if len(corr) else 0.0,
                        "decisions": int(len(corr)),
                        "wall_s": wall,
                    }
                )
                r = runs[-1]
                print(
                    f"{mode} @ {Path(split).name} seed {seed}: CR {r['CR']:.3f} AF-CR {r['AF-CR']:.3f} "
                    f"Safety@1 {r['Safety@1']:.3f} EP-Mean {r['EP-Mean']:.3f}, "
                    f"{r['corrections_per_cycle']:.3f} "
                    f"corrections/cycle over {r['decisions']} cycles, {wall:.0f} s",
                    flush=True,
                )
    if args.latency_cycles and latency_obs:
        obs = latency_obs[: args.latency_cycles]
        for mode in args.modes:
            policy.set_safety_layer(layers[mode])
            latencies[mode] = latency(policy, obs)
            lat = latencies[mode]
            print(
                f"latency {mode}: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms over "
                f"{lat['cycles']} cycles (critic {lat['critic_mean_ms']:.2f} ms, extra rounds "
                f"{lat['corrections_mean_ms']:.2f} ms "
                "mean)",
                flush=True,
            )

    rows = []
    for mode in args.modes:
        saf = [r for r in runs if r["mode"] == mode and r["kind"] == "safety"]
        eff = [r for r in runs if r["mode"] == mode and r["kind"] == "efficiency"]
        mine = [r for r in runs if r["mode"] == mode]
        nan2 = (float("nan"), 0.0)
        row = {
            "mode": mode,
            "seeds": len(args.seeds),
            "CR": summarise(saf, "CR") if saf else nan2,
            "AF-CR": summarise(saf, "AF-CR") if saf else nan2,
            "Safety@1": summarise(saf, "Safety@1") if saf else nan2,
            "EP-Mean": summarise(eff, "EP-Mean") if eff else nan2,
            "corrections": summarise(mine, "corrections_per_cycle"),
            "p99_ms": (latencies[mode]["p99_ms"], 0.0) if mode in latencies else nan2,
        }
        rows.append(row)
    n = len(args.seeds)
    head = (
        "| Method | CR ↓ (safety) | AF-CR ↓ (safety) | Safety@1 ↑ (safety) | EP-Mean ↑ (efficiency) | "
        "corrections / cycle | p99 latency ms (B=1) |"
    )
    lines = [head, "|" + " --- |" * 7]
    for row in rows:
        lat = "-" if np.isnan(row["p99_ms"][0]) else f"{row['p99_ms'][0]:.1f}"
        lines.append(
            f"| {LABELS[row['mode']]} | "
            + " | ".join(fmt(*row[k], n) for k in ("CR", "AF-CR", "Safety@1", "EP-Mean", "corrections"))
            + f" | {lat} |"
        )
    lines.append(
        "| + self-correction | not run: needs the generator retrained with correction traces | | | | | |"
    )
    lines += [
        "",
        "Per split (every metric on both splits):",
        "",
        "| Method | split | CR ↓ | AF-CR ↓ | Safety@1 ↑ | EP-Mean ↑ | cycles corrected "
        "| corrections / cycle |",
        "|" + " --- |" * 8,
    ]
    for mode in args.modes:
        for split in args.splits:
            mine = [r for r in runs if r["mode"] == mode and r["split"] == split]
            lines.append(
                f"| {LABELS[mode]} | {Path(split).name} | "
                + " | ".join(
                    fmt(*summarise(mine, k), n)
                    for k in (
                        "CR",
                        "AF-CR",
                        "Safety@1",
                        "EP-Mean",
                        "cycles_corrected",
                        "corrections_per_cycle",
                    )
                )
                + " |"
            )
    hw = hardware()
    note = (
        f"\nM = {m}, K = {policy.num_steps}, backend {args.backend}, threshold "
        f"{layers[args.modes[-1]].threshold}, max_rounds {layers[args.modes[-1]].max_rounds}; "
        f"seeds {args.seeds}; "
        f"clips per split {n_clips}; evaluation.h_reuse {h_reuse}. Latency: "
        f"{len(latency_obs[: args.latency_cycles])} single-observation cycles on observations of the "
        "closed-loop "
        f"runs, {hw['cpu']} ({hw['logical_cpus']} logical CPUs, load average {load_before[0]:.2f} before, "
        f"{hw['load_average'][0]:.2f} after). Wall time {time.perf_counter() - t_start:.0f} s."
    )
    table = "\n".join(lines) + "\n" + note
    print("\n" + table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    cmd = " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv)))
    (out / "results.json").write_text(
        json.dumps(
            {
                "command": cmd,
                "rows": rows,
                "runs": runs,
                "latency": latencies,
                "hardware": hw,
                "load_before": load_before,
                "num_candidates": m,
                "safety_layers": {k: asdict(v) for k, v in layers.items()},
                "wall_s": time.perf_counter() - t_start,
            },
            indent=1,
            default=str,
        )
    )
    plot(rows, out / "safety_layer.png")
    print(f"wrote {out / 'table.md'}, {out / 'results.json'} and {out / 'safety_layer.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
