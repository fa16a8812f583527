"""Closed-loop evaluation of a policy on a split (dataset directory): metrics, tables, JSON, GIFs.

Each clip is one episode from step 0 to its end (or ``sim.max_steps``), driven by the rollout engine
(:mod:`bev_warp_sim.rollout`): ``evaluation.batch_size`` clips step together, the learned policy is
loaded once and plans every clip of a step in one batched call; the policy replans every
``evaluation.h_reuse`` steps (1: every step, like the 10 Hz stack) and earlier when the safety check
fires. The paper's Table 1 layout takes the safety
columns (CR, AF-CR, Safety@1, Safety@2) from the safety-oriented split and the efficiency columns
(EP-Mean, EP@1.0, EP@0.9) from the efficiency-oriented split.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bev_warp_sim.metrics import (
    EFFICIENCY_COLUMNS,
    SAFETY_COLUMNS,
    EpisodeResult,
    aggregate,
    worst_results,
)
from bev_warp_sim.reference_policies import PolicyError, make_policy
from bev_warp_sim.rollout import BatchedPolicy, PerRowPlanners, RolloutStats, run_rollouts
from bev_warp_sim.simulator import Simulator
from rad2_core.config import load_params


@dataclass
class SplitEvaluation:
    policy: str
    split: str
    metrics: dict[str, float]
    results: list[EpisodeResult]
    tracks: dict[str, np.ndarray] = field(default_factory=dict)  # clip_id -> [n, 6] ego track
    agent_tracks: dict[str, list[np.ndarray]] = field(default_factory=dict)  # reactive: per step [N, 3]
    stats: RolloutStats | None = None  # env steps, decisions and wall time per stage

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "split": self.split, "metrics": self.metrics,
                "episodes": [r.as_dict() for r in self.results]}


def split_kind(path: str | Path) -> str:
    """``safety`` / ``efficiency`` / ``other`` from the directory name."""
    name = Path(path).name.lower()
    if "safety" in name:
        return "safety"
    if "efficiency" in name:
        return "efficiency"
    return "other"


def make_decider(policy: str, **policy_kwargs: Any):
    """The decision maker of a registered policy: ``rad2`` is loaded ONCE and plans every row of a step in
    one batched call (deterministic deployment selection); reference policies get one instance per row."""
    from bev_warp_sim.reference_policies import POLICIES

    if policy not in POLICIES:
        raise PolicyError(f"policy: {policy!r} is not one of {sorted(POLICIES)}")
    if policy == "rad2":
        return BatchedPolicy(make_policy("rad2", **policy_kwargs), selection="deterministic")
    return PerRowPlanners(lambda: make_policy(policy, **policy_kwargs))


def evaluate_split(
    policy: str,
    dataset_dir: str | Path,
    params: dict[str, Any] | None = None,
    max_clips: int | None = None,
    batch_size: int | None = None,
    h_reuse: int | None = None,
    progress: bool = True,
    policy_kwargs: dict[str, Any] | None = None,
    simulator: Simulator | None = None,
    decider=None,
    seed: int = 0,
    runner=None,
) -> SplitEvaluation:
    """Run ``policy`` (a name in ``reference_policies.POLICIES``) on every clip of ``dataset_dir``.

    ``decider`` reuses an already built decision maker (:func:`make_decider`) across splits; ``seed``
    is the evaluation seed (the learned policy's noise; reference policies are deterministic);
    ``runner`` replaces the in-process engine with one of the same signature as
    ``run_rollouts`` without its first two arguments (e.g. ``rad2_training.workers.RolloutPool.run``).
    """
    from rad2_core.storage import load_dataset
    from tqdm import tqdm

    params = params if params is not None else load_params("sim")
    ev = params["evaluation"]
    batch_size = int(ev["batch_size"] if batch_size is None else batch_size)
    h_reuse = int(ev["h_reuse"] if h_reuse is None else h_reuse)
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    clips = load_dataset(dataset_dir)
    if max_clips is not None:
        clips = clips[: int(max_clips)]
    if not clips:
        raise ValueError(f"dataset_dir: {dataset_dir} holds no clips")
    if runner is None:
        sim = simulator if simulator is not None else Simulator(params)
        decider = decider if decider is not None else make_decider(policy, **(policy_kwargs or {}))
        runner = functools.partial(run_rollouts, sim, decider)
    out = SplitEvaluation(policy=policy, split=str(dataset_dir), metrics={}, results=[])
    with tqdm(total=len(clips), desc=f"{policy} @ {Path(dataset_dir).name}", unit="clip",
              disable=not progress) as bar:
        rollouts, out.stats = runner(clips, 1, batch_size=batch_size, seed=seed, h_reuse=h_reuse,
                                     progress=bar.update)
    for c, r in zip(clips, rollouts):
        out.results.append(r.result)
        out.tracks[c.clip_id] = np.asarray(r.trace.ego)
        if r.agent_track:
            out.agent_tracks[c.clip_id] = list(r.agent_track)
    out.metrics = aggregate(out.results, params)
    return out


# ----------------------------------------------------------------------------------------------------
# tables


def _fmt(v: float) -> str:
    return f"{v:.3f}"


def policy_score(evals: list[SplitEvaluation]) -> float:
    """The nuPlan-style score of a policy over all its clips (every split, weighted by clips), as nuPlan
    averages its scenario scores; NaN when no evaluation has it (read back from before it existed)."""
    pairs = [(e.metrics.get("score", float("nan")), e.metrics["num_clips"]) for e in evals]
    pairs = [(s, n) for s, n in pairs if np.isfinite(s)]
    return float(sum(s * n for s, n in pairs) / sum(n for _, n in pairs)) if pairs else float("nan")


def paper_table(evals: list[SplitEvaluation]):
    """rich Table in the paper's Table 1 layout: one row per policy."""
    from rich.table import Table

    table = Table(title="Closed-loop results (BEV-Warp)")
    table.add_column("Method")
    for c in SAFETY_COLUMNS:
        table.add_column(f"{c} {'↓' if 'CR' in c else '↑'}\n(safety)", justify="right")
    for c in EFFICIENCY_COLUMNS:
        table.add_column(f"{c} ↑\n(efficiency)", justify="right")
    policies = list(dict.fromkeys(e.policy for e in evals))
    for p in policies:
        mine = [e for e in evals if e.policy == p]
        saf = next((e for e in mine if split_kind(e.split) == "safety"), None)
        eff = next((e for e in mine if split_kind(e.split) == "efficiency"), None)
        row = [p]
        row += [_fmt(saf.metrics[c]) if saf else "-" for c in SAFETY_COLUMNS]
        row += [_fmt(eff.metrics[c]) if eff else "-" for c in EFFICIENCY_COLUMNS]
        table.add_row(*row)
    return table


def full_table(evals: list[SplitEvaluation]):
    """Every metric on every split."""
    from rich.table import Table

    cols = list(SAFETY_COLUMNS + EFFICIENCY_COLUMNS) + ["score",
        "comfort_violation_clips", "offroad_rate", "mean_r_coll", "mean_r_eff", "mean_plan_r1", "num_clips"]
    table = Table(title="All metrics per split")
    table.add_column("Method")
    table.add_column("Split")
    for c in cols:
        table.add_column(c.replace("comfort_violation_clips", "comfort✗").replace("_", " "), justify="right")
    for e in evals:
        table.add_row(e.policy, Path(e.split).name,
                      *[str(int(e.metrics[c])) if c == "num_clips" else _fmt(e.metrics.get(c, float("nan")))
                        for c in cols])
    return table


def markdown_tables(evals: list[SplitEvaluation]) -> str:
    """The paper-layout table as Markdown (for the README), with the nuPlan-style ``score`` over all the
    policy's clips."""
    head = "| Method | " + " | ".join(SAFETY_COLUMNS + EFFICIENCY_COLUMNS + ("score",)) + " |"
    lines = [head, "|" + " --- |" * (2 + len(SAFETY_COLUMNS) + len(EFFICIENCY_COLUMNS))]
    for p in dict.fromkeys(e.policy for e in evals):
        mine = [e for e in evals if e.policy == p]
        saf = next((e for e in mine if split_kind(e.split) == "safety"), None)
        eff = next((e for e in mine if split_kind(e.split) == "efficiency"), None)
        vals = [_fmt(saf.metrics[c]) if saf else "-" for c in SAFETY_COLUMNS]
        vals += [_fmt(eff.metrics[c]) if eff else "-" for c in EFFICIENCY_COLUMNS]
        vals.append(_fmt(policy_score(mine)))
        lines.append(f"| {p} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# pictures


def render_episode_gif(clip, track: np.ndarray, result: EpisodeResult, path: str | Path, fps: float = 10.0,
                       stride: int = 2, view_radius: float = 35.0, agent_track=None) -> Path:
    """GIF of a closed-loop episode: map, agents, the logged ego (outline) and the simulated ego (red)."""
    import imageio.v2 as imageio
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon
    from rad2_core.geometry import box_corners

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = []
    start = result.start_step
    hit_steps = {c["step"] for c in result.collisions}
    for k in range(0, len(track), max(1, stride)):
        t = start + k
        fig, ax = plt.subplots(figsize=(5, 5), dpi=80)
        m = clip.map
        for poly in m.drivable_areas:
            ax.add_patch(Polygon(poly, closed=True, facecolor="0.92", edgecolor="none", zorder=0))
        for lb, rb in zip(m.left_boundaries, m.right_boundaries):
            ax.plot(lb[:, 0], lb[:, 1], color="0.6", lw=0.5, zorder=1)
            ax.plot(rb[:, 0], rb[:, 1], color="0.6", lw=0.5, zorder=1)
        rp = clip.route_polyline
        ax.plot(rp[:, 0], rp[:, 1], color="tab:purple", lw=1.5, alpha=0.4, zorder=2)
        for j in range(clip.num_agents):
            if agent_track is not None:
                x, y, yaw = agent_track[k][j]
                ok = clip.agent_valid[j, t]
            else:
                x, y, yaw = clip.agent_x[j, t], clip.agent_y[j, t], clip.agent_yaw[j, t]
                ok = clip.agent_valid[j, t]
            if not ok:
                continue
            corners = box_corners(x, y, yaw, clip.agent_length[j], clip.agent_width[j])
            ax.add_patch(Polygon(corners, closed=True, facecolor="tab:blue", edgecolor="k", lw=0.4, zorder=3))
        log = box_corners(clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t], clip.ego_length, clip.ego_width)
        ax.add_patch(Polygon(log, closed=True, fill=False, edgecolor="tab:green", lw=1.0, ls="--", zorder=4))
        ego = box_corners(track[k, 0], track[k, 1], track[k, 2], clip.ego_length, clip.ego_width)
        ax.add_patch(Polygon(ego, closed=True, facecolor="tab:red", edgecolor="k", lw=0.6, zorder=5))
        ax.plot(track[: k + 1, 0], track[: k + 1, 1], color="tab:red", lw=0.8, zorder=4)
        ax.set_xlim(track[k, 0] - view_radius, track[k, 0] + view_radius)
        ax.set_ylim(track[k, 1] - view_radius, track[k, 1] + view_radius)
        ax.set_aspect("equal")
        mark = "  COLLISION" if any(s <= t for s in hit_steps) else ""
        ax.set_title(f"{clip.clip_id} t={t * clip.dt:.1f}s v={track[k, 3]:.1f} m/s{mark}", fontsize=8)
        ax.tick_params(labelsize=6)
        fig.tight_layout()
        fig.canvas.draw()
        frames.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
        plt.close(fig)
    imageio.mimsave(path, frames, duration=stride / fps, loop=0)
    return path


def render_worst(evaluation: SplitEvaluation, out_dir: str | Path, n: int, fps: float = 10.0) -> list[Path]:
    from rad2_core.storage import load_dataset

    worst = worst_results(evaluation.results, n)
    if not worst:
        return []
    clips = {c.clip_id: c for c in load_dataset(evaluation.split)}
    paths = []
    for r in worst:
        name = f"{evaluation.policy}_{Path(evaluation.split).name}_{r.clip_id}.gif"
        paths.append(render_episode_gif(
            clips[r.clip_id], evaluation.tracks[r.clip_id], r, Path(out_dir) / name, fps=fps,
            agent_track=evaluation.agent_tracks.get(r.clip_id)))
    return paths


def write_json(evals: list[SplitEvaluation], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([e.as_dict() for e in evals], indent=1))
    return path
