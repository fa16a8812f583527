#!/usr/bin/env python3
"""Latency of one RAD-2 planning cycle per stage: encode, K denoising steps for M candidates, score, select.

For each M it runs --warmup + --cycles full cycles (``Rad2Policy.plan``, discriminator always run) and
prints median / p90 / p99 / max per stage, writes a JSON with the raw figures and a PNG plot.
Observations: real ones built from a dataset (--data, default the efficiency evaluation set) so the
masks are realistic; ``--random-inputs`` uses random tensors instead.

Reproducibility: it prints the machine, the threads, the load before and after, and the efficiency
of the cycle: the median (and p99) cycle time divided by the FLOP floor, the time the cycle's network
FLOPs take at the throughput of a matrix-product probe run in the same process
(rad2_planner.benchmarking). It also times the selection rule alone (``safe_medoid``: every candidate
against every agent over the plan) on synthetic scenes with --agents agents.

Example:
    .venv/bin/python tools/bench_planner_latency.py --backend onnxruntime --out out/bench_latency
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from rad2_planner.benchmarking import percentiles

ROOT = Path(__file__).resolve().parents[1]


STAGES = ("encode", "denoise_total", "score", "select", "total")


def _selection_scene(rng, m: int, n_agents: int, t_plan: int):
    """Candidates fanning out ahead of the ego and agents scattered within 40 m (ego frame)."""
    speed = rng.uniform(5, 15)
    t = (np.arange(t_plan) + 1.0) * 0.5
    heading = rng.normal(0.0, 0.08, (m, 1))
    cand = np.stack([speed * t * np.cos(heading), speed * t * np.sin(heading)], -1).astype(np.float32)
    agents = np.zeros((n_agents, 10), np.float32)
    agents[:, 0:2] = rng.uniform(-40, 40, (n_agents, 2))
    yaw = rng.uniform(-np.pi, np.pi, n_agents)
    agents[:, 2], agents[:, 3] = np.cos(yaw), np.sin(yaw)
    agents[:, 4:6] = rng.normal(0, 5, (n_agents, 2))
    agents[:, 6], agents[:, 7] = 4.5, 1.9
    return cand, agents, np.ones(n_agents, bool)


def bench_selection(policy, ms, n_agents: int, repeats: int, seed: int = 0) -> dict:
    """Timings (ms) of the deployment fallback rule alone, per M, on synthetic scenes."""
    from rad2_planner.policy import safe_medoid_index

    rng = np.random.default_rng(seed)
    out = {}
    for m in ms:
        scenes = [_selection_scene(rng, m, n_agents, policy.cfg.plan_points) for _ in range(16)]
        times = []
        for i in range(repeats + 10):
            cand, agents, mask = scenes[i % len(scenes)]
            t0 = time.perf_counter()
            safe_medoid_index(cand, agents, mask, policy.plan_dt, policy.ego_size, policy.max_curvature)
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1e3)
        out[m] = percentiles(times)
    return out


def _observations(args, cfg, n: int):
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs

    if args.random_inputs:
        return [
            {k: v[0] for k, v in example_inputs(cfg, 1, seed=i).items() if k in SCENE_INPUTS}
            for i in range(n)
        ]
    from rad2_planner.bev import snapshot_from_clip
    from rad2_planner.clip import iter_dataset
    from rad2_planner.observation import build_observation

    obs = []
    for clip in iter_dataset(ROOT / args.data if not Path(args.data).is_absolute() else args.data):
        for t in range(0, clip.num_steps, 37):
            obs.append(build_observation(snapshot_from_clip(clip, t)))
            if len(obs) >= n:
                return obs
    if not obs:
        raise SystemExit(f"--data {args.data}: no observations")
    return obs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--backend", default=None, help="pytorch | onnxruntime | tensorrt (default: planner.backend)"
    )
    ap.add_argument("--device", default=None, help="torch device for --backend pytorch (cpu | cuda)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint dir (default: planner.checkpoint_dir)")
    ap.add_argument(
        "--random-init", action="store_true", help="random weights (latency does not depend on them)"
    )
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="candidate counts M")
    ap.add_argument(
        "--k", type=int, default=None, help="denoising steps K (default: planner.num_denoise_steps)"
    )
    ap.add_argument("--sampler", default=None, help="ddim | dpmpp_2m (default: planner.sampler)")
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--data", default="data/eval_efficiency", help="dataset for realistic observations")
    ap.add_argument("--random-inputs", action="store_true")
    ap.add_argument("--agents", type=int, default=50, help="agents in the selection-only timing")
    ap.add_argument("--out", default="out/bench_latency", help="output prefix (.json, .png)")
    args = ap.parse_args(argv)

    from rad2_planner.benchmarking import RunContext, planning_cycle_flops
    from rad2_planner.config import load_params
    from rad2_planner.networks import ModelConfig, PlannerModel
    from rad2_planner.policy import Rad2Policy, resolve_path
    from tqdm import tqdm

    params = load_params("planner")
    kw = dict(
        backend=args.backend, device=args.device, num_steps=args.k, sampler=args.sampler, always_score=True
    )
    if args.random_init:
        model = PlannerModel(ModelConfig.from_params(params, load_params("bev")))
        policy = Rad2Policy(model, params=params, onnx_dir=str(ROOT / "out" / "bench_random_onnx"), **kw)
        weights = "random-init"
    else:
        ckpt = resolve_path(args.checkpoint or params["planner"]["checkpoint_dir"])
        policy = Rad2Policy.from_params(params, checkpoint_dir=ckpt, **kw)
        weights = str(ckpt)
    obs = _observations(args, policy.cfg, 32)
    threads = int(params["runtime"]["ort_intra_op_threads"])
    if policy.backend_name == "pytorch":
        import torch

        threads = torch.get_num_threads()
    ctx = RunContext.start(threads)
    flops = {m: planning_cycle_flops(policy.model, m, policy.num_steps) for m in args.m}
    results = {}
    print(
        f"backend {policy.backend_name}, K={policy.num_steps}, sampler {policy.sampler}, weights {weights}, "
        f"{args.cycles} cycles per M, fused sampler {bool(params['runtime'].get('fused_sampler'))}"
    )
    for m in args.m:
        rows = []
        for i in tqdm(range(args.warmup + args.cycles), desc=f"M={m}", leave=False, mininterval=2.0):
            r = policy.plan(obs[i % len(obs)], num_candidates=m)
            if i >= args.warmup:
                rows.append(r.timings_ms)
        per = {s: np.array([row[s] for row in rows]) for s in STAGES}
        if "denoise_0" in rows[0]:  # step by step (runtime.fused_sampler false, or TensorRT)
            steps = np.array([[row[f"denoise_{j}"] for j in range(policy.num_steps)] for row in rows])
            per["denoise_step"] = steps.reshape(-1)
        results[m] = {s: percentiles(v) for s, v in per.items()}
        results[m]["gflop"] = {k: v / 1e9 for k, v in flops[m].items()}
    selection = bench_selection(policy, args.m, args.agents, repeats=max(args.cycles, 100))
    ctx.finish()
    print(ctx.header())
    hdr = f"{'M':>4} {'stage':<14} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}  (ms)"
    print(hdr)
    for m, res in results.items():
        for s in ("encode", "denoise_step", "denoise_total", "score", "select", "total"):
            if s in res:
                v = res[s]
                print(f"{m:>4} {s:<14} {v['median']:8.2f} {v['p90']:8.2f} {v['p99']:8.2f} {v['max']:8.2f}")
    print(f"\n{'M':>4} {'GFLOP':>7} {'floor ms':>9} {'median/floor':>13} {'p99/floor':>10}")
    for m, res in results.items():
        floor = ctx.floor_ms(flops[m]["total"])
        res["floor_ms"] = floor
        res["efficiency"] = {"median": res["total"]["median"] / floor, "p99": res["total"]["p99"] / floor}
        print(f"{m:>4} {flops[m]['total'] / 1e9:7.2f} {floor:9.2f} {res['efficiency']['median']:13.2f} "
              f"{res['efficiency']['p99']:10.2f}")
    print(f"\nselection alone (safe_medoid, {args.agents} agents, synthetic scenes):")
    for m, v in selection.items():
        print(f"{m:>4} select        {v['median']:8.2f} {v['p90']:8.2f} {v['p99']:8.2f} {v['max']:8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "backend": policy.backend_name,
        "K": policy.num_steps,
        "sampler": policy.sampler,
        "weights": weights,
        "cycles": args.cycles,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "run": ctx.to_dict(),
        "load_avg": [ctx.load_before, ctx.load_after],
        "selection_agents": args.agents,
    }
    payload = {"meta": meta, "results": results, "selection": selection}
    Path(str(out) + ".json").write_text(json.dumps(payload, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bottom = np.zeros(len(ms))
    for s in ("encode", "denoise_total", "score", "select"):
        vals = np.array([results[m][s]["median"] for m in ms])
        axes[0].bar([str(m) for m in ms], vals, bottom=bottom, label=s)
        bottom += vals
    axes[0].set(xlabel="M (candidates)", ylabel="median ms", title="median per stage")
    axes[0].legend()
    for q, style in (("median", "-o"), ("p90", "--s"), ("p99", "-^"), ("max", ":x")):
        axes[1].plot(ms, [results[m]["total"][q] for m in ms], style, label=q)
    deadline = float(params["planner"]["deadline_ms"])
    axes[1].axhline(50.0, color="r", lw=0.8, label="50 ms target")
    axes[1].axhline(deadline, color="k", lw=0.8, label=f"deadline {deadline:.0f} ms")
    axes[1].set(xscale="log", xlabel="M (candidates)", ylabel="ms", title="planning cycle total")
    axes[1].set_xticks(ms, [str(m) for m in ms])
    axes[1].legend()
    fig.suptitle(
        f"{policy.backend_name}, K={policy.num_steps}, {args.cycles} cycles/M, load {meta['load_avg']}"
    )
    fig.tight_layout()
    fig.savefig(str(out) + ".png", dpi=110)
    print(f"wrote {out}.json and {out}.png")
    return 0


if __name__ == "__main__":
    from rad2_planner.runtime.base import BackendUnavailableError

    try:
        raise SystemExit(main())
    except BackendUnavailableError as e:
        print(f"bench_planner_latency: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
