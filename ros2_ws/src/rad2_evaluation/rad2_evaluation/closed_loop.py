"""Closed-loop evaluation of a policy on a split (dataset directory): metrics, tables, JSON, GIFs.

Each clip is one episode from step 0 to its end (or ``sim.max_steps``), driven by the rollout engine
(:mod:`bev_warp_sim.rollout`): ``evaluation.batch_size`` clips step together, the learned policy is
loaded once and plans every clip of a step in one batched call; the policy replans every
``evaluation.h_reuse`` steps (1: every step, like the 10 Hz stack) and earlier when the safety check
fires. The paper's Table 1 layout takes the safety
columns (CR, AF-CR, Safety@1, Safety@2) from the safety-oriented split and the efficiency columns
(EP-Mean, EP@1.0, EP@0.9) from the efficiency-oriented split.

One module, a little over 600 lines: the split evaluation, its tables and its figures read the same
SplitEvaluation records; rollouts, metrics and the score live in bev_warp_sim.
"""

from __future__ import annotations

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
from bev_warp_sim.preflight import CheckedSplit, RefusedClip
from bev_warp_sim.reference_policies import PolicyError, make_policy
from bev_warp_sim.rollout import BatchedPolicy, PerRowPlanners, RolloutStats, RowSpec, chunk_rows, run_chunk
from bev_warp_sim.simulator import Simulator

from rad2_evaluation.episode_log import EpisodeLog, EpisodeRecord, episode_record


@dataclass
class SplitEvaluation:
    policy: str
    split: str
    metrics: dict[str, float]
    results: list[EpisodeResult]
    tracks: dict[str, np.ndarray] = field(default_factory=dict)  # clip_id -> [n, 6] ego track
    agent_tracks: dict[str, list[np.ndarray]] = field(default_factory=dict)  # reactive: per step [N, 3]
    stats: RolloutStats | None = None  # env steps, decisions and wall time per stage
    skipped: list[RefusedClip] = field(default_factory=list)  # clips the simulator refused, not driven
    # clip_id -> track and decisions of the worst episodes (``keep_worst`` of evaluate_split), for GIFs
    records: dict[str, EpisodeRecord] = field(default_factory=dict)
    resumed: int = 0  # episodes read back from an earlier run's episodes.jsonl instead of driven

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "split": self.split, "metrics": self.metrics,
                "skipped": [r.as_dict() for r in self.skipped],
                "episodes": [r.as_dict() for r in self.results]}


def split_kind(path: str | Path) -> str:
    """``safety`` / ``efficiency`` / ``other`` from the directory name."""
    name = Path(path).name.lower()
    if "safety" in name:
        return "safety"
    if "efficiency" in name:
        return "efficiency"
    return "other"


def make_decider(policy: str, params: dict[str, Any], **policy_kwargs: Any):
    """The decision maker of a registered policy: ``rad2`` is loaded ONCE and plans every row of a step in
    one batched call (deterministic deployment selection); reference policies get one instance per row.
    ``params``: every file of params/ as loaded, merged."""
    from bev_warp_sim.reference_policies import POLICIES

    if policy not in POLICIES:
        raise PolicyError(f"policy: {policy!r} is not one of {sorted(POLICIES)}")
    if policy == "rad2":
        return BatchedPolicy(make_policy("rad2", params, **policy_kwargs), selection="deterministic")
    return PerRowPlanners(lambda: make_policy(policy, params, **policy_kwargs))


def local_runner(sim: Simulator, decider):
    """The in-process counterpart of ``RolloutPool.run_chunks``: chunks run one after the other here,
    each handed to ``on_chunk(i, rollouts, stats)`` as it finishes."""

    def run(chunks, *, on_chunk, progress=None, **kwargs: Any) -> None:
        for i, chunk in enumerate(chunks):
            rollouts, stats = run_chunk(sim, decider, chunk, progress=progress, **kwargs)
            on_chunk(i, rollouts, stats)

    return run


def evaluate_split(
    policy: str,
    dataset_dir: str | Path,
    params: dict[str, Any],
    max_clips: int | None = None,
    batch_size: int | None = None,
    h_reuse: int | None = None,
    progress: bool = True,
    policy_kwargs: dict[str, Any] | None = None,
    simulator: Simulator | None = None,
    decider=None,
    seed: int = 0,
    runner=None,
    checked: CheckedSplit | None = None,
    log: EpisodeLog | None = None,
    run: str | None = None,
    keep_worst: int = 0,
) -> SplitEvaluation:
    """Run ``policy`` (a name in ``reference_policies.POLICIES``) on every clip of ``dataset_dir``;
    ``params``: every file of params/ as loaded (with the run's overrides), merged.

    ``decider`` reuses an already built decision maker (:func:`make_decider`) across splits; ``seed``
    is the evaluation seed (the learned policy's noise; reference policies are deterministic);
    ``runner`` replaces the in-process engine with one of the signature of
    ``rad2_training.workers.RolloutPool.run_chunks`` (:func:`local_runner` is this process's).

    ``checked``: the split's clips as :mod:`bev_warp_sim.preflight` accepted them (the refused ones are
    reported in ``skipped``); without it the first ``max_clips`` clips are checked here and
    RefusedClipsError names every refused one before any rollout. ``log``: each finished chunk's
    episodes go to it under the label ``run`` (default: ``policy``), and chunks whose episodes it
    already holds (a resumed run) are not driven again. ``keep_worst``: the track and decisions of
    that many worst episodes are kept in ``records`` (and in the log) for GIFs.
    """
    from bev_warp_sim.clip_registry import clip_key
    from bev_warp_sim.preflight import RefusedClipsError, check_split
    from tqdm import tqdm

    ev = params["evaluation"]
    batch_size = int(ev["batch_size"] if batch_size is None else batch_size)
    h_reuse = int(ev["h_reuse"] if h_reuse is None else h_reuse)
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    run = run or policy
    if runner is None:
        sim = simulator if simulator is not None else Simulator(params)
    if checked is None:
        checked = check_split(dataset_dir, sim if runner is None else Simulator(params), max_clips=max_clips)
        if checked.refused:
            raise RefusedClipsError(checked.refused)
    if not checked.clips:
        raise ValueError(f"dataset_dir: {dataset_dir} holds no clips the simulator accepts")
    split = str(dataset_dir)
    # a clip's rollout group is its dataset position: its seeds do not depend on which clips were refused
    rows = [RowSpec(c, 0, pos, 0) for c, pos in zip(checked.clips, checked.positions)]
    chunks = chunk_rows(rows, batch_size)
    keys = {id(c): clip_key(c) for c in checked.clips}
    done = log.done(run, split, seed) if log is not None else {}
    results: dict[str, EpisodeResult] = {keys[id(c)]: done[keys[id(c)]] for c in checked.clips
                                         if keys[id(c)] in done}
    out = SplitEvaluation(policy=policy, split=split, metrics={}, results=[], stats=RolloutStats(),
                          skipped=list(checked.refused), resumed=len(results))
    order = {keys[id(c)]: i for i, c in enumerate(checked.clips)}
    index_of = {pos: i for i, pos in enumerate(checked.positions)}
    todo = [ch for ch in chunks if not all(keys[id(r.clip)] in results for r in ch)]
    kept: set[str] = set()  # clip keys whose records are kept (the worst so far)

    def worst_keys() -> set[str]:
        known = sorted(results, key=order.__getitem__)
        by_result = {id(results[k]): k for k in known}
        return {by_result[id(r)] for r in worst_results([results[k] for k in known], keep_worst)}

    def on_chunk(_i: int, rollouts, stats: RolloutStats) -> None:
        out.stats.add(stats)
        fresh = {}
        for r in rollouts:
            c = checked.clips[index_of[r.group]]
            k = keys[id(c)]
            out.tracks[c.clip_id] = np.asarray(r.trace.ego)
            if r.agent_track:
                out.agent_tracks[c.clip_id] = list(r.agent_track)
            if k not in results:
                fresh[k] = (c, r)
                results[k] = r.result
        if keep_worst:
            worst = worst_keys()
            for k in worst & set(fresh):  # saved before its episode line: a done worst clip has its record
                c, r = fresh[k]
                out.records[c.clip_id] = episode_record(r)
                if log is not None:
                    log.save_record(run, split, seed, c.clip_id, out.records[c.clip_id])
            for k in kept - worst:
                cid = checked.clips[order[k]].clip_id
                out.records.pop(cid, None)
                if log is not None:
                    log.drop_record(run, split, seed, cid)
            kept.clear()
            kept.update(worst)
        if log is not None:
            for k, (_, r) in fresh.items():
                log.add(run, split, seed, k, r.result)
            log.flush()

    if keep_worst:
        kept.update(worst_keys())
    with tqdm(total=len(checked.clips), initial=len(results), desc=f"{run} @ {Path(dataset_dir).name}",
              unit="clip", disable=not progress) as bar:
        if todo:
            if runner is None:  # built only when there is something to drive (not for a finished resume)
                decider = decider if decider is not None else make_decider(policy, params,
                                                                           **(policy_kwargs or {}))
                runner = local_runner(sim, decider)
            runner(todo, on_chunk=on_chunk, progress=bar.update, seed=seed, h_reuse=h_reuse)
    out.results = [results[keys[id(c)]] for c in checked.clips]
    if keep_worst and log is not None:  # the worst episodes that finished before a resume
        for k in kept:
            cid = checked.clips[order[k]].clip_id
            if cid not in out.records:
                rec = log.load_record(run, split, seed, cid)
                if rec is not None:
                    out.records[cid] = rec
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


def skipped_clips(evals: list[SplitEvaluation]) -> list[RefusedClip]:
    """The clips the simulator refused, once each (every policy of a split skips the same)."""
    return list({(r.split, r.clip_id): r for e in evals for r in e.skipped}.values())


def skipped_note(evals: list[SplitEvaluation], width: int = 140) -> str:
    """One line per clip left out of the tables because the simulator refused it (reasons cut to
    ``width`` characters; results.json keeps them whole); empty when none was."""
    refused = skipped_clips(evals)
    if not refused:
        return ""
    lines = [f"Skipped {len(refused)} clip(s) the simulator refused:"]
    for r in refused:
        text = str(r)
        lines.append("  " + (text if len(text) <= width else text[: width - 1] + "…"))
    return "\n".join(lines)


def _title(title: str, evals: list[SplitEvaluation]) -> str:
    note = skipped_note(evals)
    return f"{title}\n{note}" if note else title


def paper_table(evals: list[SplitEvaluation]):
    """rich Table in the paper's Table 1 layout: one row per policy (the title names skipped clips)."""
    from rich.table import Table

    table = Table(title=_title("Closed-loop results (BEV-Warp)", evals))
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
    """Every metric on every split (the title names skipped clips)."""
    from rich.table import Table

    cols = list(SAFETY_COLUMNS + EFFICIENCY_COLUMNS) + ["score",
        "comfort_violation_clips", "offroad_rate", "mean_r_coll", "mean_r_eff", "mean_plan_r1", "num_clips"]
    table = Table(title=_title("All metrics per split", evals))
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

GIF_WIDTH_PX = 1000  # wide enough to tell the lanes apart around the ego


def _score_colouring(decisions):
    """(values of decision -> [M] or None, vmin, vmax, colour-bar label) of the candidates' scores: the
    logits the selection ranks where they are finite (a trained discriminator's sigmoid scores sit at 1.0
    and would all look alike), else the sigmoid scores on [0, 1]; None when nothing is scored."""
    def finite(v):
        return v is not None and len(v) and np.isfinite(v).all()

    decisions = [d for d in decisions or () if d.candidates is not None]
    logits = [d.logits for d in decisions if finite(getattr(d, "logits", None))]
    if logits:
        lo, hi = np.percentile(np.concatenate(logits), [2, 98])
        return (lambda d: d.logits if finite(d.logits) else None, float(lo), float(max(hi, lo + 1e-3)),
                "discriminator logit of each candidate")
    if any(finite(d.scores) for d in decisions):
        return (lambda d: d.scores if finite(d.scores) else None, 0.0, 1.0,
                "discriminator score of each candidate")
    return None


def _distances(candidates: np.ndarray) -> np.ndarray:
    """[M, T + 1] distance travelled along each ego-frame candidate, from the ego (0) on."""
    pts = np.concatenate([np.zeros((len(candidates), 1, 2)), candidates], axis=1)
    return np.concatenate([np.zeros((len(candidates), 1)),
                           np.cumsum(np.hypot(*np.diff(pts, axis=1).transpose(2, 0, 1)), axis=1)], axis=1)


def _candidate_profiles(decisions):
    """(plan horizon in s, largest planned distance in m) over an episode's candidates, the fixed
    axes of the distance-over-time panel; None when no decision has candidates."""
    spans = [(d.candidates.shape[1] * (d.plan_dt if np.isfinite(d.plan_dt) else 1.0),
              float(_distances(d.candidates).max())) for d in decisions or () if d.candidates is not None
             and len(d.candidates)]
    if not spans:
        return None
    return max(s for s, _ in spans), max(1.0, 1.05 * max(m for _, m in spans))


def _active_decision(decisions, t: int):
    """The decision whose plan the ego follows at log step ``t`` (the last one made at or before it)."""
    current = None
    for d in decisions or ():
        if d.step > t:
            break
        current = d
    return current


def render_episode_gif(clip, track: np.ndarray, result: EpisodeResult, path: str | Path, fps: float = 10.0,
                       stride: int = 2, view_radius: float = 35.0, agent_track=None, decisions=None,
                       label: str | None = None) -> Path:
    """GIF of a closed-loop episode, :data:`GIF_WIDTH_PX` wide.

    Left: the map, agents, the logged ego (dashed outline) and the simulated ego (red) with its trail;
    with ``decisions`` (:class:`rad2_evaluation.episode_log.DecisionView`, e.g. an ``EpisodeRecord``'s)
    the candidate trajectories of the decision being followed, coloured by discriminator score (colour
    bar; the logits where finite, since the sigmoid scores of a trained discriminator saturate), their
    waypoints as dots (the candidates often share a path and differ in speed), and the chosen one
    underlaid in thick red. Right: the ego's speed and acceleration against the
    logged driver's over the episode, a cursor at the frame's time."""
    import imageio.v2 as imageio
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Polygon
    from rad2_core.geometry import box_corners, ego_to_world

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    track = np.asarray(track)
    start = int(result.start_step)
    dt = float(clip.dt)
    hit_steps = sorted(int(c["step"]) for c in result.collisions)
    colouring = _score_colouring(decisions)
    dpi = 80
    fig = plt.figure(figsize=(GIF_WIDTH_PX / dpi, 0.55 * GIF_WIDTH_PX / dpi), dpi=dpi)
    grid = fig.add_gridspec(3, 4, width_ratios=[1.3, 0.04, 0.2, 1.0], wspace=0.05, hspace=0.5,
                            left=0.05, right=0.98, top=0.9, bottom=0.08)
    ax = fig.add_subplot(grid[:, 0])
    ax_v, ax_a, ax_c = (fig.add_subplot(grid[i, 3]) for i in range(3))
    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.Normalize(*(colouring[1:3] if colouring else (0.0, 1.0)))
    if colouring:
        cbar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap),
                            cax=fig.add_subplot(grid[:, 1]))
        cbar.set_label(colouring[3], fontsize=9)
        cbar.ax.tick_params(labelsize=7)
    # static layers: map and route, speed and acceleration curves
    m = clip.map
    for poly in m.drivable_areas:
        ax.add_patch(Polygon(poly, closed=True, facecolor="0.92", edgecolor="none", zorder=0))
    for lb, rb in zip(m.left_boundaries, m.right_boundaries):
        ax.plot(lb[:, 0], lb[:, 1], color="0.55", lw=0.7, zorder=1)
        ax.plot(rb[:, 0], rb[:, 1], color="0.55", lw=0.7, zorder=1)
    rp = clip.route_polyline
    ax.plot(rp[:, 0], rp[:, 1], color="tab:purple", lw=2.0, alpha=0.35, zorder=2)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=7)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor="tab:red", edgecolor="k", label="ego (simulated)"),
                       Patch(fill=False, edgecolor="tab:green", ls="--", label="ego (log)"),
                       Patch(facecolor="tab:blue", edgecolor="k", label="agents"),
                       Line2D([], [], color="tab:red", lw=5, alpha=0.55, label="chosen plan"),
                       Line2D([], [], color="tab:purple", lw=2, alpha=0.35, label="route")],
              loc="upper left", fontsize=7, framealpha=0.85)
    t_ego = (start + np.arange(len(track))) * dt
    t_log = np.arange(int(clip.num_steps)) * dt
    ax_v.plot(t_log, clip.ego_speed, color="tab:green", ls="--", lw=1.2, label="log")
    ax_v.plot(t_ego, track[:, 3], color="tab:red", lw=1.5, label="ego")
    ax_a.plot(t_log, clip.ego_accel, color="tab:green", ls="--", lw=1.2, label="log")
    # a track of x, y, yaw, v only (the ROS demo's odometry): the acceleration from the speed
    if track.shape[1] > 5:
        accel = track[:, 5]
    else:
        accel = np.gradient(track[:, 3], dt) if len(track) > 1 else np.zeros(len(track))
    ax_a.plot(t_ego, accel, color="tab:red", lw=1.5, label="ego")
    for a, ylabel in ((ax_v, "speed [m/s]"), (ax_a, "acceleration [m/s²]")):
        a.set_ylabel(ylabel, fontsize=9)
        a.set_xlim(t_ego[0], max(t_ego[-1], t_ego[0] + dt))
        a.grid(alpha=0.3)
        a.tick_params(labelsize=7)
        for s in hit_steps:
            a.axvline(s * dt, color="k", lw=1.0, ls=":")
    ax_v.legend(fontsize=8, loc="best")
    ax_a.set_xlabel("time [s]", fontsize=9)
    # the candidates' distance over plan time: where they share a path, this is how they differ
    profiles = _candidate_profiles(decisions)
    if profiles is not None:
        ax_c.set_xlim(0.0, profiles[0])
        ax_c.set_ylim(0.0, profiles[1])
    else:
        ax_c.text(0.5, 0.5, "no candidates recorded (one plan per decision)", ha="center", va="center",
                  transform=ax_c.transAxes, fontsize=8, color="0.4")
    ax_c.set_xlabel("plan time [s]", fontsize=9)
    ax_c.set_ylabel("planned distance [m]", fontsize=9)
    ax_c.grid(alpha=0.3)
    ax_c.tick_params(labelsize=7)
    cursors = [a.axvline(t_ego[0], color="0.3", lw=1.0) for a in (ax_v, ax_a)]
    frames = []
    dynamic: list = []
    for k in range(0, len(track), max(1, stride)):
        for artist in dynamic:
            artist.remove()
        dynamic = []
        t = start + k
        for j in range(clip.num_agents):
            if not clip.agent_valid[j, t]:
                continue
            x, y, yaw = (agent_track[k][j] if agent_track is not None
                         else (clip.agent_x[j, t], clip.agent_y[j, t], clip.agent_yaw[j, t]))
            corners = box_corners(x, y, yaw, clip.agent_length[j], clip.agent_width[j])
            dynamic.append(ax.add_patch(Polygon(corners, closed=True, facecolor="tab:blue", edgecolor="k",
                                                lw=0.5, zorder=3)))
        log = box_corners(clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t], clip.ego_length, clip.ego_width)
        dynamic.append(ax.add_patch(Polygon(log, closed=True, fill=False, edgecolor="tab:green", lw=1.2,
                                            ls="--", zorder=4)))
        d = _active_decision(decisions, t)
        if d is not None:
            chosen = None
            if d.candidates is not None and len(d.candidates):
                cand = np.concatenate([np.zeros((len(d.candidates), 1, 2)), d.candidates], axis=1)
                world = ego_to_world(cand, d.pose)
                values = colouring[0](d) if colouring else None
                if values is not None:
                    order = np.argsort(values)  # the best drawn on top
                    rgba = cmap(norm(values))[order]
                else:
                    order, rgba = np.arange(len(world)), np.tile(matplotlib.colors.to_rgba("0.45"),
                                                                 (len(world), 1))
                dynamic.append(ax.add_collection(LineCollection(world[order], colors=rgba, lw=1.0,
                                                                alpha=0.9, zorder=6)))
                pts = world[order, 1:]
                dynamic.append(ax.scatter(pts[..., 0].ravel(), pts[..., 1].ravel(), s=9,
                                          c=np.repeat(rgba, pts.shape[1], axis=0), zorder=6, linewidths=0))
                if 0 <= int(d.selected) < len(world):
                    chosen = world[int(d.selected)]
            elif len(d.trajectory):
                chosen = ego_to_world(np.concatenate([np.zeros((1, 2)), d.trajectory]), d.pose)
            if profiles is not None and d.candidates is not None and len(d.candidates):
                dist = _distances(d.candidates)
                times = np.arange(dist.shape[1]) * (d.plan_dt if np.isfinite(d.plan_dt) else 1.0)
                lines = np.stack([np.broadcast_to(times, dist.shape), dist], -1)
                dynamic.append(ax_c.add_collection(LineCollection(lines[order], colors=rgba, lw=1.0,
                                                                  alpha=0.9, zorder=3)))
                if 0 <= int(d.selected) < len(lines):
                    (hl,) = ax_c.plot(*lines[int(d.selected)].T, color="tab:red", lw=5.0, alpha=0.55,
                                      zorder=2)
                    dynamic.append(hl)
            if chosen is not None:  # underneath: the candidates stay readable where they overlap it
                (line,) = ax.plot(chosen[:, 0], chosen[:, 1], color="tab:red", lw=5.0, alpha=0.55,
                                  zorder=5, solid_capstyle="round")
                dynamic.append(line)
        ego = box_corners(track[k, 0], track[k, 1], track[k, 2], clip.ego_length, clip.ego_width)
        dynamic.append(ax.add_patch(Polygon(ego, closed=True, facecolor="tab:red", edgecolor="k", lw=0.7,
                                            zorder=7)))
        (trail,) = ax.plot(track[: k + 1, 0], track[: k + 1, 1], color="tab:red", lw=1.0, zorder=4)
        dynamic.append(trail)
        ax.set_xlim(track[k, 0] - view_radius, track[k, 0] + view_radius)
        ax.set_ylim(track[k, 1] - view_radius, track[k, 1] + view_radius)
        for c in cursors:
            c.set_xdata([t * dt, t * dt])
        mark = "   COLLISION" if any(s <= t for s in hit_steps) else ""
        head = f"{label}: " if label else ""
        fig.suptitle(f"{head}{clip.clip_id} ({result.scenario_kind})   t = {t * dt:.1f} s   "
                     f"v = {track[k, 3]:.1f} m/s{mark}", fontsize=11, color="darkred" if mark else "k")
        fig.canvas.draw()
        frames.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
    plt.close(fig)
    imageio.mimsave(path, frames, duration=stride / fps, loop=0)
    return path


def render_worst(evaluation: SplitEvaluation, out_dir: str | Path, n: int, fps: float = 10.0,
                 progress=None) -> list[Path]:
    """GIFs of the ``n`` worst episodes (:func:`bev_warp_sim.metrics.worst_results`), with their
    candidates where ``evaluation.records`` kept them (evaluate_split's ``keep_worst``); ``progress(1)``
    after each (a GIF takes seconds)."""
    from rad2_core.storage import load_clip, read_index

    worst = worst_results(evaluation.results, n)
    if not worst:
        return []
    # only the clips rendered are loaded: a split driven with --skip-bad holds clips that do not load
    split = Path(evaluation.split)
    files = {e["clip_id"]: e["file"] for e in read_index(split)["clips"]}
    cache: dict = {}
    clips = {r.clip_id: load_clip(split / files[r.clip_id], maps_dir=split / "maps", map_cache=cache)
             for r in worst}
    paths = []
    for r in worst:
        name = f"{evaluation.policy}_{Path(evaluation.split).name}_{r.clip_id}.gif"
        record = evaluation.records.get(r.clip_id)
        track = record.track if record is not None else evaluation.tracks.get(r.clip_id)
        if track is None:  # resumed without its record (an episodes/ file removed by hand)
            continue
        agents = record.agent_track if record is not None else evaluation.agent_tracks.get(r.clip_id)
        paths.append(render_episode_gif(
            clips[r.clip_id], track, r, Path(out_dir) / name, fps=fps, agent_track=agents,
            decisions=record.decisions if record is not None else None, label=evaluation.policy))
        if progress is not None:
            progress(1)
    return paths


# per-clip value of each summary metric (its mean over the clips is the split's metric)
SUMMARY_METRICS = (
    ("CR", "CR ↓", lambda r: float(r.collided)),
    ("AF-CR", "AF-CR ↓", lambda r: float(r.at_fault)),
    ("offroad_rate", "off-road ↓", lambda r: float(r.offroad)),
    ("EP-Mean", "EP-Mean ↑", lambda r: float(np.clip(r.rho, 0.0, 1.0))),
    ("comfort_violation_steps", "comfort-violating steps ↓", lambda r: float(r.comfort_violation_rate)),
    ("score", "score ↑", lambda r: float(r.score)),
)


def plot_summary(values: dict[str, dict[str, list[float]]], path: str | Path, title: str,
                 spread: str) -> Path:
    """Bars of each metric per policy (mean) with whiskers (±1 standard error over the ``spread`` units:
    clips or seeds) and every unit's value as a dot; ``values``: ``{policy: {metric: [value per unit]}}``
    with metric names of :data:`SUMMARY_METRICS` (a metric no policy has a finite value of is left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(values)
    shown = [(key, label) for key, label, _ in SUMMARY_METRICS
             if any(np.isfinite(values[p].get(key, [])).any() for p in policies)]
    fig, axes = plt.subplots(1, len(shown), figsize=(max(2.6 * len(shown), 8), 4.2), squeeze=False)
    colors = plt.get_cmap("tab10")
    rng = np.random.default_rng(0)  # dot jitter only
    for ax, (key, label) in zip(axes[0], shown):
        for i, p in enumerate(policies):
            v = np.asarray(values[p].get(key, []), float)
            v = v[np.isfinite(v)]
            if not len(v):
                continue
            mean = float(v.mean())
            se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
            ax.bar(i, mean, color=colors(i % 10), alpha=0.75, yerr=se, capsize=4)
            ax.scatter(i + rng.uniform(-0.25, 0.25, len(v)), v, s=9, color="k", alpha=0.45, zorder=3,
                       linewidths=0)
            ax.annotate(f"{mean:.3f}", (i, mean), textcoords="offset points", xytext=(0, 3), ha="center",
                        fontsize=7)
        ax.set_xticks(range(len(policies)), policies, rotation=25, ha="right", fontsize=8)
        # every metric here is a fraction or a score in [0, 1]: a shared floor keeps bars comparable
        top = max((float(np.nanmax(values[p].get(key, [0.0]) or [0.0])) for p in policies), default=0.0)
        ax.set_ylim(0.0, max(0.1, 1.1 * top))
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"{title}\nbars: mean; whiskers: ±1 standard error over {spread}; dots: one per "
                 f"{spread.rstrip('s')}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_split_summary(evals: list[SplitEvaluation], path: str | Path) -> Path:
    """``summary_<split>.png``: each policy's metrics on one split, spread over its clips."""
    values = {e.policy: {key: [f(r) for r in e.results] for key, _, f in SUMMARY_METRICS} for e in evals}
    n = max((len(e.results) for e in evals), default=0)
    skipped = skipped_clips(evals)
    extra = f", {len(skipped)} refused clip(s) skipped" if skipped else ""
    return plot_summary(values, path, f"{Path(evals[0].split).name}: {n} clips{extra}", "clips")


def write_json(evals: list[SplitEvaluation], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([e.as_dict() for e in evals], indent=1))
    return path
