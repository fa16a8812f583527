"""The safety-layer evaluation (rad2 eval safety-layer): RAD-2 without the layer, with rejection
sampling, with candidate selection and with self-correction (params/planner.yaml ``safety_layer``),
closed loop on the evaluation splits, plus the planning latency of single-observation cycles.

The closed-loop runs use no round budget (``round_budget_ms`` None), so their metrics do not depend on
the machine's speed; the latency is measured twice, without a budget and with the file's
``safety_layer.round_budget_ms`` (the deployed setting).

:func:`evaluate_safety_layer` drives every mode x split x seed (bev_warp_sim.rollout, deterministic
selection), records the layer's corrections per cycle, times the modes on observations met in the
runs, and writes ``results.json``, ``table.md`` and ``safety_layer.png``. No ROS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from bev_warp_sim.rollout import BatchedPolicy

LABELS = {
    "off": "RAD-2 (no safety layer)",
    "rejection_sampling": "+ rejection sampling",
    "candidate_selection": "+ candidate selection",
    "self_correction": "+ self-correction",
}


def recording_decider(policy, keep_every: int, keep_max: int):
    """A BatchedPolicy that also records the safety layer's corrections of every cycle and keeps every
    ``keep_every``-th observation (up to ``keep_max``) for the latency measurement."""
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
    if n is None or n >= len(clips):
        return list(clips)
    return [clips[i] for i in np.unique(np.linspace(0, len(clips) - 1, n).round().astype(int))]


def planning_latency(policy, observations, warmup: int = 5) -> dict:
    """Wall-clock ms of single-observation planning cycles (each its own seed) and the stage means."""
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
    """Mean and standard deviation (0 for one run) of ``metric`` over ``runs``."""
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
            ("p99_budget_ms", "p99 planning latency (round budget), ms ↓"),
        ),
    ):
        means = [r[key][0] for r in rows]
        stds = [r[key][1] for r in rows]
        a.bar(
            range(len(rows)),
            means,
            yerr=stds,
            color=["0.6", "tab:orange", "tab:blue", "tab:green"][: len(rows)],
            capsize=3,
        )
        a.set_xticks(range(len(rows)), names, fontsize=7, rotation=12)
        a.set_title(title, fontsize=9)
        a.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def safety_layers(modes, planner_params: dict, threshold: float | None = None, max_rounds: int | None = None,
                  critic: str | None = None, correction: str | None = None) -> dict[str, Any]:
    """mode -> SafetyLayerParams, unset values from params/planner.yaml (ValueError on a bad value). The
    closed-loop runs have no round budget: every mode gets its rounds, and the latency table measures
    the budget's effect separately."""
    from rad2_planner.policy import resolve_path
    from rad2_planner.safety_layer import SafetyLayerParams

    sl = planner_params["safety_layer"]
    critic = str(critic or sl["critic_checkpoint"])
    correction = str(correction or sl["correction_checkpoint"])
    # the checkpoints a mode loads, checked before any clip is driven (they load when the mode's turn comes)
    needed = {"critic": (critic, "critic.safetensors")} if set(modes) - {"off"} else {}
    if "self_correction" in modes:
        needed["correction"] = (correction, "generator.safetensors")
    for option, (directory, weights) in needed.items():
        for name in ("config.json", weights):
            if not (resolve_path(directory) / name).is_file():
                raise ValueError(f"safety_layer.{option}_checkpoint (--{option}): {directory} holds no "
                                 f"{name} (modes {sorted(modes)})")
    return {
        m: SafetyLayerParams(
            m,
            float(sl["threshold"] if threshold is None else threshold),
            int(sl["max_rounds"] if max_rounds is None else max_rounds),
            critic,
            correction,
            None,
        )
        for m in modes
    }


def drive(sim, decider, clips: list, *, seed: int, batch_size: int, h_reuse: int, sim_params: dict,
          desc: str, progress: bool = True) -> tuple[dict[str, Any], float]:
    """One closed-loop run of ``clips`` (one rollout each); returns (aggregate metrics, wall seconds)."""
    from bev_warp_sim.metrics import aggregate
    from bev_warp_sim.rollout import run_rollouts
    from tqdm import tqdm

    t0 = time.perf_counter()
    with tqdm(total=len(clips), desc=desc, unit="clip", disable=not progress) as bar:
        rollouts, _ = run_rollouts(sim, decider, clips, 1, batch_size=batch_size, seed=seed, h_reuse=h_reuse,
                                   progress=bar.update)
    return aggregate([r.result for r in rollouts], sim_params), time.perf_counter() - t0


def run_record(mode: str, split: str, seed: int, clips: list, metrics: dict, corrections: list[int],
               wall: float) -> dict[str, Any]:
    """One row of ``runs``: the metrics plus the layer's corrections per cycle."""
    from rad2_evaluation.closed_loop import split_kind

    corr = np.asarray(corrections)
    return {
        "mode": mode,
        "split": split,
        "kind": split_kind(split),
        "seed": seed,
        "clip_ids": [c.clip_id for c in clips],
        **metrics,
        "corrections_per_cycle": float(corr.mean()) if len(corr) else 0.0,
        "cycles_corrected": float((corr > 0).mean()) if len(corr) else 0.0,
        "decisions": int(len(corr)),
        "wall_s": wall,
    }


def summary_rows(runs: list[dict], modes, n_seeds: int, latencies: dict[str, dict]) -> list[dict]:
    """Per mode: CR, AF-CR, Safety@1 of the safety split, EP-Mean of the efficiency split (mean, std),
    corrections per cycle and the p99 latency."""
    rows = []
    nan2 = (float("nan"), 0.0)
    for mode in modes:
        saf = [r for r in runs if r["mode"] == mode and r["kind"] == "safety"]
        eff = [r for r in runs if r["mode"] == mode and r["kind"] == "efficiency"]
        rows.append({
            "mode": mode,
            "seeds": n_seeds,
            "CR": summarise(saf, "CR") if saf else nan2,
            "AF-CR": summarise(saf, "AF-CR") if saf else nan2,
            "Safety@1": summarise(saf, "Safety@1") if saf else nan2,
            "EP-Mean": summarise(eff, "EP-Mean") if eff else nan2,
            "corrections": summarise([r for r in runs if r["mode"] == mode], "corrections_per_cycle"),
            "p99_ms": (latencies[mode]["p99_ms"], 0.0) if mode in latencies else nan2,
            "p99_budget_ms": (latencies[mode]["budget"]["p99_ms"], 0.0) if mode in latencies else nan2,
        })
    return rows


def table_lines(rows: list[dict], runs: list[dict], modes, splits, n: int) -> list[str]:
    """The paper-layout table and the per-split table, as markdown lines."""
    head = (
        "| Method | CR ↓ (safety) | AF-CR ↓ (safety) | Safety@1 ↑ (safety) | EP-Mean ↑ (efficiency) | "
        "corrections / cycle | p99 ms (B=1, no budget) | p99 ms (B=1, round budget) |"
    )
    lines = [head, "|" + " --- |" * 8]
    for row in rows:
        lat = " | ".join("-" if np.isnan(row[k][0]) else f"{row[k][0]:.1f}"
                         for k in ("p99_ms", "p99_budget_ms"))
        lines.append(
            f"| {LABELS[row['mode']]} | "
            + " | ".join(fmt(*row[k], n) for k in ("CR", "AF-CR", "Safety@1", "EP-Mean", "corrections"))
            + f" | {lat} |"
        )
    lines += [
        "",
        "Per split (every metric on both splits):",
        "",
        "| Method | split | CR ↓ | AF-CR ↓ | Safety@1 ↑ | EP-Mean ↑ | cycles corrected "
        "| corrections / cycle |",
        "|" + " --- |" * 8,
    ]
    keys = ("CR", "AF-CR", "Safety@1", "EP-Mean", "cycles_corrected", "corrections_per_cycle")
    for mode in modes:
        for split in splits:
            mine = [r for r in runs if r["mode"] == mode and r["split"] == split]
            lines.append(f"| {LABELS[mode]} | {Path(split).name} | "
                         + " | ".join(fmt(*summarise(mine, k), n) for k in keys) + " |")
    return lines


def measure_latencies(policy, layers: dict[str, Any], modes, observations: list,
                      round_budget_ms: float | None) -> dict[str, dict]:
    """Per mode, the single-observation planning latency on ``observations`` without a round budget,
    and under ``round_budget_ms`` in ``["budget"]`` (printed as it goes)."""
    from dataclasses import replace

    latencies = {}
    for mode in modes:
        for budget in (None, round_budget_ms):
            policy.set_safety_layer(replace(layers[mode], round_budget_ms=budget))
            policy.budget_stop_count = 0
            lat = planning_latency(policy, observations)
            lat["budget_stops"] = policy.budget_stop_count
            if budget is None:
                latencies[mode] = lat
            else:
                latencies[mode]["budget"] = {**lat, "round_budget_ms": budget}
            print(
                f"latency {mode} (round budget {budget} ms): p50 {lat['p50_ms']:.1f} ms, p99 "
                f"{lat['p99_ms']:.1f} ms over {lat['cycles']} cycles (critic "
                f"{lat['critic_mean_ms']:.2f} ms, extra rounds {lat['corrections_mean_ms']:.2f} ms mean, "
                f"{lat['budget_stops']} stopped by the budget)",
                flush=True,
            )
    return latencies


def drive_all(policy, sim, layers: dict, clips: dict[str, list], seeds, *, batch_size: int, h_reuse: int,
              sim_params: dict, latency_cycles: int, progress: bool = True) -> tuple[list[dict], list]:
    """Every mode x split x seed; returns (runs, observations kept for the latency measurement: those the
    first mode met with the first seed, spread over all splits)."""
    modes = list(layers)
    total_decisions = sum(c.num_steps for cs in clips.values() for c in cs) // h_reuse
    keep_every = max(1, total_decisions // max(latency_cycles, 1)) if latency_cycles else 0
    runs: list[dict] = []
    latency_obs: list = []
    for mode in modes:
        policy.set_safety_layer(layers[mode])
        for split, split_clips in clips.items():
            for seed in seeds:
                keep = keep_every if (mode == modes[0] and seed == seeds[0]) else 0
                decider = recording_decider(policy, keep, latency_cycles - len(latency_obs))
                metrics, wall = drive(sim, decider, split_clips, seed=seed, batch_size=batch_size,
                                      h_reuse=h_reuse, sim_params=sim_params,
                                      desc=f"{mode} @ {Path(split).name} seed {seed}", progress=progress)
                latency_obs += decider.observations
                r = run_record(mode, split, seed, split_clips, metrics, decider.corrections, wall)
                runs.append(r)
                print(
                    f"{mode} @ {Path(split).name} seed {seed}: CR {r['CR']:.3f} AF-CR {r['AF-CR']:.3f} "
                    f"Safety@1 {r['Safety@1']:.3f} EP-Mean {r['EP-Mean']:.3f}, "
                    f"{r['corrections_per_cycle']:.3f} corrections/cycle over {r['decisions']} cycles, "
                    f"{wall:.0f} s",
                    flush=True,
                )
    return runs, latency_obs


def write_outputs(out: str | Path, table: str, results: dict[str, Any], rows: list[dict]) -> None:
    """``table.md``, ``results.json`` and ``safety_layer.png`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot(rows, out / "safety_layer.png")
    print(f"wrote {out / 'table.md'}, {out / 'results.json'} and {out / 'safety_layer.png'}")


def evaluate_safety_layer(
    splits: list[str],
    seeds: list[int],
    layers: dict[str, Any],
    params: dict[str, Any],
    *,
    out: str | Path,
    command: str,
    max_clips: int | None = None,
    num_candidates: int | None = None,
    backend: str = "onnxruntime",
    batch_size: int | None = None,
    latency_cycles: int = 120,
    progress: bool = True,
    skip_bad: bool = False,
) -> dict[str, Any]:
    """The whole evaluation (see the module doc); returns what results.json holds. ``params``: every
    file of params/ as loaded, merged. Every picked clip is checked before the first rollout
    (bev_warp_sim.preflight): RefusedClipsError names the refused ones, or with ``skip_bad`` they are
    left out and named in the table and results.json."""
    from dataclasses import replace

    from bev_warp_sim.preflight import check_splits
    from bev_warp_sim.simulator import Simulator
    from rad2_core.machine import hardware_record
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.safety_layer import SafetyLayerParams

    sim_params = params
    sim = Simulator(sim_params)
    checked = check_splits(splits, sim, skip_bad=skip_bad, progress=progress,
                           select=lambda entries: spread(list(range(len(entries))), max_clips))
    skipped = [r for c in checked for r in c.refused]
    t_start = time.perf_counter()
    load_before = hardware_record()["load_average"]
    policy = Rad2Policy.from_params(params, backend=backend, num_candidates=num_candidates,
                                    safety_layer=replace(SafetyLayerParams.from_params(params), mode="off"))
    h_reuse = int(sim_params["evaluation"]["h_reuse"])
    batch_size = int(sim_params["evaluation"]["batch_size"] if batch_size is None else batch_size)
    clips = {split: c.clips for split, c in zip(splits, checked)}
    runs, latency_obs = drive_all(policy, sim, layers, clips, seeds, batch_size=batch_size,
                                  h_reuse=h_reuse, sim_params=sim_params, latency_cycles=latency_cycles,
                                  progress=progress)
    obs = latency_obs[:latency_cycles]
    budget = float(params["safety_layer"]["round_budget_ms"])
    latencies = measure_latencies(policy, layers, layers, obs, budget) if latency_cycles and obs else {}
    rows = summary_rows(runs, layers, len(seeds), latencies)
    hw = hardware_record()
    last = layers[list(layers)[-1]]
    n_clips = {split: len(c) for split, c in clips.items()}
    note = (
        f"\nM = {policy.num_candidates}, K = {policy.num_steps}, backend {backend}, threshold "
        f"{last.threshold}, max_rounds {last.max_rounds}; seeds {seeds}; "
        f"clips per split {n_clips}; evaluation.h_reuse {h_reuse}. Latency: "
        f"{len(obs)} single-observation cycles on observations of the closed-loop "
        f"runs, {hw['cpu']} ({hw['logical_cpus']} logical CPUs, load average {load_before[0]:.2f} before, "
        f"{hw['load_average'][0]:.2f} after). Wall time {time.perf_counter() - t_start:.0f} s."
    )
    if skipped:
        note += (f"\nSkipped {len(skipped)} clip(s) the simulator refused:\n"
                 + "\n".join(f"- {r}" for r in skipped))
    table = "\n".join(table_lines(rows, runs, layers, splits, len(seeds))) + "\n" + note
    print("\n" + table)
    results = {
        "command": command, "rows": rows, "runs": runs, "latency": latencies, "hardware": hw,
        "load_before": load_before, "num_candidates": policy.num_candidates,
        "safety_layers": {k: asdict(v) for k, v in layers.items()}, "wall_s": time.perf_counter() - t_start,
        "skipped": [r.as_dict() for r in skipped],
    }
    write_outputs(out, table, results, rows)
    return results


def merge_results(result_dirs: list[str | Path], out: str | Path, mode_order: Sequence[str]
                  ) -> dict[str, Any]:
    """One table from runs of the same evaluation split by mode over several processes (e.g. one per
    core: ``--modes off self_correction`` and ``--modes rejection_sampling candidate_selection``), its
    rows in ``mode_order`` (the choices of safety_layer.mode). Refuses runs that differ in seeds, clips
    or M, so the rows stay comparable."""
    parts = []
    for d in result_dirs:
        path = Path(d) / "results.json"
        try:
            part = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable ({exc})") from exc
        missing = [k for k in ("runs", "latency", "num_candidates", "command", "wall_s", "safety_layers")
                   if not isinstance(part, dict) or k not in part]
        if missing:
            raise ValueError(f"{path}: not the results of rad2 eval safety-layer "
                             f"(no {', '.join(missing)})")
        parts.append(part)

    def setting(part):
        runs = part["runs"]
        return (sorted({r["seed"] for r in runs}), sorted({(r["split"], tuple(r["clip_ids"])) for r in runs}),
                part["num_candidates"])

    first = setting(parts[0])
    for d, part in zip(result_dirs, parts):
        if setting(part) != first:
            raise ValueError(f"{d}: other seeds, clips or M than {result_dirs[0]}; not one evaluation")
    # a mode evaluated in several directories keeps the last one's runs (re-evaluate one mode, e.g. after
    # retraining its network, and merge it over the earlier table)
    owner = {m: i for i, part in enumerate(parts) for m in dict.fromkeys(r["mode"] for r in part["runs"])}
    runs = [r for i, part in enumerate(parts) for r in part["runs"] if owner[r["mode"]] == i]
    latencies = {m: lat for i, part in enumerate(parts) for m, lat in part["latency"].items()
                 if owner.get(m) == i}
    modes = [m for m in mode_order if any(r["mode"] == m for r in runs)]
    splits = list(dict.fromkeys(r["split"] for r in runs))
    seeds = first[0]
    rows = summary_rows(runs, modes, len(seeds), latencies)
    note = "\nMerged from " + ", ".join(
        f"{d} ({', '.join(m for m in p['safety_layers'] if owner.get(m) == i) or 'nothing kept'}; "
        f"{p['command']}; {p['wall_s']:.0f} s)"
        for i, (d, p) in enumerate(zip(result_dirs, parts))) + "."
    table = "\n".join(table_lines(rows, runs, modes, splits, len(seeds))) + "\n" + note
    print("\n" + table)
    results = {"merged_from": [str(d) for d in result_dirs], "rows": rows, "runs": runs, "latency": latencies,
               "parts": [{k: p[k] for k in ("command", "hardware", "load_before", "wall_s", "safety_layers")}
                         for p in parts]}
    write_outputs(out, table, results, rows)
    return results
