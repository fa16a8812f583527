"""Latency of one RAD-2 planning cycle per stage (rad2 bench planner is the CLI).

:func:`run_latency_benchmark` times ``Rad2Policy.plan`` for each M on real (or random) observations,
reports median / p90 / p99 / max per stage, the efficiency against the FLOP floor of the same run
(rad2_evaluation.benchmarking), the selection rule alone, and writes ``<out>.json`` / ``<out>.png``. No ROS.
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from rad2_ros.rosenv import REPO_ROOT

from rad2_evaluation.benchmarking import percentiles

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
    from rad2_planner.candidates import safe_medoid_index

    rng = np.random.default_rng(seed)
    out = {}
    for m in ms:
        scenes = [_selection_scene(rng, m, n_agents, policy.cfg.plan_points) for _ in range(16)]
        times = []
        for i in range(repeats + 10):
            cand, agents, mask = scenes[i % len(scenes)]
            t0 = time.perf_counter()
            safe_medoid_index(cand, agents, mask, policy.plan_dt, policy.ego_size, policy.max_curvature,
                              substeps=policy.collision_substeps)
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1e3)
        out[m] = percentiles(times)
    return out


def sample_observations(cfg, n: int, params: dict, data: str | Path | None = None) -> list:
    """``n`` observations: every 37th step of the clips of ``data`` (relative to the checkout; rendered
    with ``params``, every file of params/ as loaded, merged), or random scene inputs of the model
    config ``cfg`` when ``data`` is None."""
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs

    if data is None:
        return [
            {k: v[0] for k, v in example_inputs(cfg, 1, seed=i).items() if k in SCENE_INPUTS}
            for i in range(n)
        ]
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.config import resource_path
    from rad2_core.observation import build_observation
    from rad2_core.storage import iter_dataset

    obs = []
    for clip in iter_dataset(resource_path(data)):
        for t in range(0, clip.num_steps, 37):
            obs.append(build_observation(snapshot_from_clip(clip, t, params, params), params=params))
            if len(obs) >= n:
                return obs
    if not obs:
        raise SystemExit(f"--data {data}: no observations")
    return obs


def make_policy(params: dict, *, random_init: bool = False, checkpoint: str | None = None,
                **kw: Any) -> tuple[Any, str]:
    """The policy to time (discriminator always run) and a description of its weights; ``params``:
    every file of params/ as loaded, merged."""
    from rad2_planner.networks import ModelConfig, PlannerModel
    from rad2_planner.policy import Rad2Policy, resolve_path

    if random_init:
        model = PlannerModel(ModelConfig.from_params(params, params))
        onnx_dir = str(REPO_ROOT / "out" / "bench_random_onnx")
        return Rad2Policy(model, params=params, onnx_dir=onnx_dir, always_score=True, **kw), "random-init"
    ckpt = resolve_path(checkpoint or params["planner"]["checkpoint_dir"])
    return Rad2Policy.from_params(params, checkpoint_dir=ckpt, always_score=True, **kw), str(ckpt)


def time_cycles(policy, obs: list, m: int, warmup: int, cycles: int) -> dict[str, dict[str, float]]:
    """Per-stage percentiles of ``cycles`` planning cycles with M = ``m`` after ``warmup`` ones."""
    from tqdm import tqdm

    rows = []
    for i in tqdm(range(warmup + cycles), desc=f"M={m}", leave=False, mininterval=2.0):
        r = policy.plan(obs[i % len(obs)], num_candidates=m)
        if i >= warmup:
            rows.append(r.timings_ms)
    per = {s: np.array([row[s] for row in rows]) for s in STAGES}
    if "denoise_0" in rows[0]:  # step by step (runtime.fused_sampler false, or TensorRT)
        steps = np.array([[row[f"denoise_{j}"] for j in range(policy.num_steps)] for row in rows])
        per["denoise_step"] = steps.reshape(-1)
    return {s: percentiles(v) for s, v in per.items()}


def print_results(results: dict, selection: dict, ctx, flops: dict, agents: int) -> None:
    """The stage table, the efficiency against the FLOP floor (added to ``results``), the selection."""
    print(ctx.header())
    print(f"{'M':>4} {'stage':<14} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}  (ms)")
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
    print(f"\nselection alone (safe_medoid, {agents} agents, synthetic scenes):")
    for m, v in selection.items():
        print(f"{m:>4} select        {v['median']:8.2f} {v['p90']:8.2f} {v['p99']:8.2f} {v['max']:8.2f}")


def plot_results(results: dict, meta: dict, deadline: float, png: str) -> None:
    """Stacked median per stage, and the cycle total's percentiles against M."""
    import matplotlib
    import matplotlib.ticker

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
    axes[1].axhline(50.0, color="r", lw=0.8, label="50 ms target")
    axes[1].axhline(deadline, color="k", lw=0.8, label=f"deadline {deadline:.0f} ms")
    axes[1].set(xscale="log", xlabel="M (candidates)", ylabel="ms", title="planning cycle total")
    axes[1].set_xticks(ms, [str(m) for m in ms])
    axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[1].legend()
    fig.suptitle(f"{meta['backend']} on {meta.get('device', 'cpu')}, K={meta['K']}, "
                 f"{meta['cycles']} cycles/M, load {meta['load_avg'][0]:.2f} / {meta['load_avg'][1]:.2f}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def compare_runtime_setting(params: dict, key: str, values: tuple, ms: list[int], *, cycles: int = 200,
                            warmup: int = 20, data: str | None = "data/eval_efficiency",
                            checkpoint: str | None = None, out: str | None = None) -> dict[str, Any]:
    """An A/B of one ``runtime.*`` setting that the machine's drift between runs cannot bias: a policy
    per value in one process, their cycles alternated on the same observations (the order swapped
    every cycle). Prints and returns the cycle's percentiles (``total`` stage) per M and value, and
    writes them to ``<out>.json`` when ``out`` is given. ``params``: every file of params/ as loaded,
    merged."""
    from rad2_core.config import merge_runtime_overrides

    from rad2_evaluation.benchmarking import RunContext

    policies = []
    for value in values:
        runtime = dict(params["runtime"])
        merge_runtime_overrides(runtime, {key: value})
        policies.append(make_policy({**params, "runtime": runtime}, checkpoint=checkpoint,
                                    backend="onnxruntime")[0])
    obs = sample_observations(policies[0].cfg, 32, params, data)
    gc.collect()
    gc.freeze()
    ctx = RunContext.start(int(params["runtime"]["ort_intra_op_threads"]))
    results: dict[int, dict[str, dict[str, float]]] = {}
    for m in ms:
        for policy in policies:
            policy.warm_up(m)
        totals: list[list[float]] = [[] for _ in values]
        for i in range(warmup + cycles):
            order = range(len(values)) if i % 2 == 0 else reversed(range(len(values)))
            for j in order:
                r = policies[j].plan(obs[i % len(obs)], num_candidates=m)
                if i >= warmup:
                    totals[j].append(r.timings_ms["total"])
        results[m] = {repr(v): percentiles(t) for v, t in zip(values, totals)}
    ctx.finish()
    print(ctx.header())
    print(f"runtime.{key}, {cycles} alternated cycles per value and M (ms: median / p90 / p99)")
    for m, per in results.items():
        print(f"  M={m:4d}  " + "   ".join(f"{v}: {q['median']:.2f} / {q['p90']:.2f} / {q['p99']:.2f}"
                                            for v, q in per.items()))
    payload = {"key": key, "values": [repr(v) for v in values], "cycles": cycles, "run": ctx.to_dict(),
               "results": results}
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(str(out) + ".json").write_text(json.dumps(payload, indent=1))
        print(f"wrote {out}.json")
    return payload


def run_latency_benchmark(params: dict, ms: list[int], *, backend: str | None = None,
                          device: str | None = None,
                          checkpoint: str | None = None, random_init: bool = False, k: int | None = None,
                          sampler: str | None = None, cycles: int = 200, warmup: int = 20,
                          data: str | None = "data/eval_efficiency", agents: int = 50,
                          out: str = "out/bench_latency",
                          runtime_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole benchmark (``data`` None: random inputs); returns what ``<out>.json`` holds.
    ``runtime_overrides``: ``runtime.*`` settings of params/planner.yaml to replace (checked);
    ``params``: every file of params/ as loaded, merged."""
    from rad2_core.config import merge_runtime_overrides

    from rad2_evaluation.benchmarking import RunContext, planning_cycle_flops

    params = {**params, "runtime": dict(params["runtime"])}
    merge_runtime_overrides(params["runtime"], runtime_overrides or {})
    policy, weights = make_policy(params, random_init=random_init, checkpoint=checkpoint, backend=backend,
                                  device=device, num_steps=k, sampler=sampler)
    obs = sample_observations(policy.cfg, 32, params, data)
    threads = int(params["runtime"]["ort_intra_op_threads"])
    if policy.backend_name == "openvino":
        threads = policy.backend.threads
    if policy.backend_name == "pytorch":
        import torch

        threads = torch.get_num_threads()
    flops = {m: planning_cycle_flops(policy.model, m, policy.num_steps) for m in ms}
    # As the planner node does after start-up (nodes/common.run_node): the start-up heap (torch, the
    # networks, the observations) leaves the collector's reach, so a collection during a timed cycle
    # scans only what the cycles allocate.
    gc.collect()
    gc.freeze()
    ctx = RunContext.start(threads, device=str(getattr(policy.backend, "device", "cpu")))
    print(
        f"backend {policy.backend_name}, K={policy.num_steps}, sampler {policy.sampler}, weights {weights}, "
        f"{cycles} cycles per M, fused sampler {bool(params['runtime'].get('fused_sampler'))}, "
        f"candidate shards {getattr(policy.backend, 'shards', 1)}"
        + (f", precision {policy.backend.precision}" if policy.backend_name == "openvino" else "")
    )
    results = {}
    for m in ms:
        results[m] = time_cycles(policy, obs, m, warmup, cycles)
        results[m]["gflop"] = {key: v / 1e9 for key, v in flops[m].items()}
    selection = bench_selection(policy, ms, agents, repeats=max(cycles, 100))
    ctx.finish()
    print_results(results, selection, ctx, flops, agents)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "backend": policy.backend_name, "K": policy.num_steps, "sampler": policy.sampler, "weights": weights,
        "cycles": cycles, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "run": ctx.to_dict(),
        "candidate_shards": getattr(policy.backend, "shards", 1),
        "load_avg": [ctx.load_before, ctx.load_after], "selection_agents": agents,
        "device": str(getattr(policy.backend, "device", "cpu")),
        "cuda_graphs": {k: {"captures": g.captures, "replays": g.replays, "disabled": g.disabled_reason}
                        for k, g in getattr(policy.backend, "graphs", {}).items()},
        "ort_providers": params["runtime"].get("ort_providers"),
        # the networks' arithmetic: OpenVINO's precision setting, TensorRT's FP16 engines, else FP32
        "precision": getattr(policy.backend, "precision", "fp16" if getattr(policy.backend, "fp16", False)
                             else "f32"),
    }
    payload = {"meta": meta, "results": results, "selection": selection}
    Path(str(out) + ".json").write_text(json.dumps(payload, indent=1))
    plot_results(results, meta, float(params["planner"]["deadline_ms"]), str(out) + ".png")
    print(f"wrote {out}.json and {out}.png")
    return payload


def run_operator_profile(params: dict, m: int, *, cycles: int = 50, data: str | None = "data/eval_efficiency",
                         checkpoint: str | None = None, out: str = "out/bench_latency") -> dict[str, Any]:
    """Where the networks' time goes: ``cycles`` planning cycles at M = ``m`` with ONNX Runtime's operator
    profiler on (``runtime.ort_profile_prefix``), summarised per graph and operator type against the
    matrix-product probe of the same run (:func:`rad2_evaluation.benchmarking.operator_profile`). Writes
    ``<out>_ops.json`` and ``<out>_ops.png``; the raw traces stay in ``<out>_ops/``. ``params``: every
    file of params/ as loaded, merged."""
    import shutil

    from rad2_evaluation.benchmarking import RunContext, operator_profile, print_operator_profile

    trace_dir = Path(f"{out}_ops")
    shutil.rmtree(trace_dir, ignore_errors=True)
    prefix = f"{trace_dir}{os.sep}"  # the files go inside trace_dir, named by graph
    plain, weights = make_policy(params, checkpoint=checkpoint, backend="onnxruntime")
    params = {**params, "runtime": {**params["runtime"], "ort_profile_prefix": prefix}}
    policy, _ = make_policy(params, checkpoint=checkpoint, backend="onnxruntime")
    obs = sample_observations(policy.cfg, 32, params, data)
    ctx = RunContext.start(int(params["runtime"]["ort_intra_op_threads"]))
    policy.warm_up(m)  # one call per session: operator_profile leaves each session's first run out
    plain.warm_up(m)
    # the profiler's own cost, from cycles without it alternated with the profiled ones
    totals: dict[str, list[float]] = {"profiled": [], "plain": []}
    for i in range(cycles):
        for name, p in (("profiled", policy), ("plain", plain)):
            totals[name].append(p.plan(obs[i % len(obs)], num_candidates=m).timings_ms["total"])
    traces = policy.backend.end_profiling()
    ctx.finish()
    profile = operator_profile(traces, cycles)
    profile["cycle_ms"] = {name: percentiles(v) for name, v in totals.items()}
    print(ctx.header())
    print(f"M = {m}, {weights}; cycle median {profile['cycle_ms']['profiled']['median']:.2f} ms profiled, "
          f"{profile['cycle_ms']['plain']['median']:.2f} ms without the profiler (alternated): the "
          "profiler's per-operator cost inflates the small operators' shares")
    print_operator_profile(profile, ctx.probe_gflops, ctx.threads)
    payload = {"num_candidates": m, "weights": weights, "run": ctx.to_dict(), "profile": profile}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}_ops.json").write_text(json.dumps(payload, indent=1))
    plot_operator_profile(profile, f"{out}_ops.png", f"M = {m}, {cycles} cycles, probe "
                          f"{ctx.probe_gflops:.0f} GFLOP/s on {ctx.threads} threads")
    print(f"wrote {out}_ops.json, {out}_ops.png (traces in {trace_dir}/)")
    return payload


def plot_operator_profile(profile: dict[str, Any], png: str, title: str, top: int = 7) -> None:
    """One stacked bar per graph: thread-ms per cycle by operator type (the ``top`` largest, the rest
    together), matrix products hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rad2_evaluation.benchmarking import MATRIX_OPS

    graphs = list(profile["graphs"])
    totals: dict[str, float] = {}
    for g in graphs:
        for op, r in profile["graphs"][g]["ops"].items():
            totals[op] = totals.get(op, 0.0) + r["ms_per_cycle"]
    shown = sorted(totals, key=lambda op: -totals[op])[:top]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(graphs) + 1.8))
    colours = plt.get_cmap("tab10")
    for gi, g in enumerate(graphs):
        ops = profile["graphs"][g]["ops"]
        left = 0.0
        for oi, op in enumerate(shown + ["other"]):
            ms = (sum(r["ms_per_cycle"] for o, r in ops.items() if o not in shown) if op == "other"
                  else ops.get(op, {}).get("ms_per_cycle", 0.0))
            ax.barh(gi, ms, left=left, color=colours(oi % 10), hatch="//" if op in MATRIX_OPS else None,
                    label=op if gi == 0 else None, edgecolor="white")
            left += ms
    ax.set_yticks(range(len(graphs)), graphs)
    ax.invert_yaxis()
    ax.set_xlabel("kernel thread-ms per planning cycle (hatched: matrix products)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
