"""Collision-critic data, training and warning statistics (no ROS).

**Labels come from the simulator.** :func:`collect_critic_dataset` drives a planner (the shipped
``Rad2Policy``) closed loop over clips with :func:`bev_warp_sim.rollout.run_rollouts`, keeping the
observation of every decision. Each of a decision's M candidates is then labelled by
:func:`label_candidates`: the candidate is executed open loop from the simulated ego pose of the
decision (its points interpolated to the clip's step, the box heading along the path as the open-loop
metrics turn it, the clip's ego size) against the clip's *logged* agent boxes at the same future
steps, and it collides when :func:`rad2_core.geometry.boxes_overlap` finds an overlap with a valid
agent at any step within the horizon ``k`` — the test the log-replay simulator applies to the ego
every step. The time of the first overlap is kept for lead times. Decisions whose horizon runs past
the end of the clip are dropped (their future is not logged, so a "safe" label would be a guess).

**Training** (:func:`train_critic`): class-balanced binary cross-entropy (each class weighs half of
the loss, whatever its share), AdamW with cosine decay, random left-right mirroring of whole scenes
(a mirrored scene collides exactly when the original does).

**Warnings** (:func:`warning_statistics`, in the spirit of the CorrectionPlanner paper's Table 6): at
each threshold, precision and recall of the critic's warnings (p ≥ threshold) over all candidates and
over the executed ones, the mean lead time of the true warnings (time from the warning, at the
decision, to the labelled collision), and per closed-loop collision of a rollout whether, and how
early, the executed plan was first flagged within the horizon before it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.geometry import ego_to_world, tracks_overlap
from rad2_core.open_loop_metrics import plan_headings

PER_DECISION = (
    "trajectories",
    "agents",
    "agents_mask",
    "ego_state",
    "collides",
    "ttc",
    "selected",
    "step",
    "rollout",
    "rollout_collision_step",
)
THRESHOLDS = (0.3, 0.5, 0.7, 0.9)


class CriticDataError(ValueError):
    """Bad input to the critic data pipeline (the message names the field and value)."""


# ----------------------------------------------------------------------------------------------------
# labels


def label_candidates(
    candidates: np.ndarray,
    plan_dt: float,
    ego_pose: np.ndarray,
    clip,
    step: int,
    horizon_s: float,
    max_curvature: float,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Execute candidates ``[M, T, 2]`` (ego frame of ``ego_pose`` = world x, y, yaw at log step
    ``step``, points at ``(k+1)·plan_dt``) open loop against the clip's logged agent boxes, the ego
    box turning at most ``max_curvature`` (1/m: the vehicle's,
    :func:`rad2_core.open_loop_metrics.vehicle_max_curvature`).

    Returns ``(collides [M] bool, time_to_collision [M] s (inf: none), complete)``; ``complete`` is
    False when the horizon runs past the clip's last step (those steps are not checked).
    """
    cand = np.asarray(candidates, dtype=np.float64)
    if cand.ndim != 3 or cand.shape[-1] != 2:
        raise CriticDataError(f"candidates: shape {cand.shape}, expected [M, T, 2]")
    m, t_plan = cand.shape[:2]
    dt = float(clip.dt)
    k = int(round(horizon_s / dt))
    if k < 1 or horizon_s > t_plan * plan_dt + 1e-9:
        raise CriticDataError(
            f"horizon_s: {horizon_s} s is not within (clip dt {dt} s, plan horizon {t_plan * plan_dt:g} s]"
        )
    # the candidate starts at the ego (origin) at time 0; linear interpolation between its points
    knots = np.concatenate([[0.0], (np.arange(t_plan) + 1.0) * plan_dt])
    pts = np.concatenate([np.zeros((m, 1, 2)), cand], axis=1)  # M T+1 2
    tau = np.arange(1, k + 1) * dt
    hi = np.clip(np.searchsorted(knots, tau, side="left"), 1, t_plan)
    w = ((tau - knots[hi - 1]) / (knots[hi] - knots[hi - 1]))[None, :, None]
    dense = pts[:, hi - 1] * (1.0 - w) + pts[:, hi] * w  # M K 2
    yaw = plan_headings(dense, max_curvature=float(max_curvature)) + float(ego_pose[2])
    xy = ego_to_world(dense.reshape(-1, 2), ego_pose).reshape(m, k, 2)
    ego = np.concatenate(
        [xy, yaw[..., None], np.broadcast_to([clip.ego_length, clip.ego_width], (m, k, 2))], axis=-1
    )  # M K 5
    steps = int(step) + np.arange(1, k + 1)
    avail = steps <= clip.num_steps - 1
    n = int(clip.num_agents)
    if n == 0:
        return np.zeros(m, bool), np.full(m, np.inf), bool(avail.all())
    idx = np.minimum(steps, clip.num_steps - 1)
    agents = np.stack(
        [
            clip.agent_x[:, idx],
            clip.agent_y[:, idx],
            clip.agent_yaw[:, idx],
            np.broadcast_to(clip.agent_length[:, None], (n, k)),
            np.broadcast_to(clip.agent_width[:, None], (n, k)),
        ],
        axis=-1,
    )  # N K 5
    valid = np.asarray(clip.agent_valid)[:, idx] & avail[None]
    hit = tracks_overlap(ego, agents, valid)  # M K
    collides = hit.any(axis=1)
    ttc = np.where(collides, (hit.argmax(axis=1) + 1) * dt, np.inf)
    return collides, ttc, bool(avail.all())


# ----------------------------------------------------------------------------------------------------
# dataset


@dataclass
class CriticDataset:
    """Labelled decisions: per decision (index d) its M candidates and the observation tensors the
    critic reads; ``rollout`` indexes ``clip_ids`` (one rollout per clip)."""

    trajectories: np.ndarray  # [D, M, T, 2] float32, ego frame
    agents: np.ndarray  # [D, N, 10] float32
    agents_mask: np.ndarray  # [D, N] bool
    ego_state: np.ndarray  # [D, 4] float32
    collides: np.ndarray  # [D, M] bool: collides within horizon_s (simulator label)
    ttc: np.ndarray  # [D, M] float32 s to the first labelled overlap (inf: none)
    selected: np.ndarray  # [D] int: the candidate the planner executed
    step: np.ndarray  # [D] int: log step of the decision
    rollout: np.ndarray  # [D] int: index into clip_ids
    rollout_collision_step: np.ndarray  # [D] int: first collision step of that rollout (-1: none)
    clip_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.trajectories.shape[0])

    def subset(self, rows: np.ndarray) -> CriticDataset:
        return CriticDataset(
            **{k: getattr(self, k)[rows] for k in PER_DECISION},
            clip_ids=list(self.clip_ids),
            meta=dict(self.meta),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "decisions": len(self),
            "candidates": int(self.collides.size),
            "positive_rate": float(self.collides.mean()) if self.collides.size else float("nan"),
            "executed_positive_rate": float(self.collides[np.arange(len(self)), self.selected].mean())
            if len(self)
            else float("nan"),
            "rollouts": len(self.clip_ids),
            "rollouts_with_collision": int(len(np.unique(self.rollout[self.rollout_collision_step >= 0]))),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.tmp.npz")
        np.savez_compressed(
            tmp,
            **{k: getattr(self, k) for k in PER_DECISION},
            clip_ids=np.array(self.clip_ids),
            meta=np.array(json.dumps(self.meta)),
        )
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> CriticDataset:
        path = Path(path)
        if not path.is_file():
            raise CriticDataError(
                f"critic dataset {path} does not exist (build it with rad2 train critic)"
            )
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in (*PER_DECISION, "clip_ids", "meta") if k not in z.files]
            if missing:
                raise CriticDataError(f"critic dataset {path}: missing arrays {missing}")
            return cls(
                **{k: z[k] for k in PER_DECISION},
                clip_ids=[str(c) for c in z["clip_ids"]],
                meta=json.loads(str(z["meta"])),
            )

    @classmethod
    def concatenate(cls, parts: Sequence[CriticDataset]) -> CriticDataset:
        """One dataset of several; a part without decisions still contributes its clips (rollouts)."""
        if not any(len(p) for p in parts):
            raise CriticDataError("concatenate: no decisions in any part")
        clip_ids, arrays = [], {k: [] for k in PER_DECISION}
        for p in parts:
            if len(p):
                for k in PER_DECISION:
                    v = getattr(p, k)
                    arrays[k].append(v + len(clip_ids) if k == "rollout" else v)
            clip_ids += p.clip_ids
        return cls(
            **{k: np.concatenate(v) for k, v in arrays.items()}, clip_ids=clip_ids, meta=dict(parts[0].meta)
        )


def collect_critic_dataset(
    policy,
    clips: Sequence[Any],
    horizon_s: float,
    *,
    sim,
    h_reuse: int = 1,
    chunk_clips: int = 8,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> CriticDataset:
    """Drive ``policy`` (``Rad2Policy``, deterministic selection) closed loop over ``clips`` (one rollout
    each, log-replayed agents) and label every decision's candidates (:func:`label_candidates`).

    Rollouts run ``chunk_clips`` at a time and keep their observations only until their decisions are
    labelled (a kept observation carries its 0.65 MB BEV raster). ``sim``: the
    :class:`~bev_warp_sim.simulator.Simulator` that drives them.
    """
    from bev_warp_sim.rollout import BatchedPolicy, run_rollouts

    if chunk_clips < 1:
        raise CriticDataError(f"chunk_clips: must be >= 1, got {chunk_clips}")
    if sim.reactive:
        raise CriticDataError(
            "sim.reactive_agents: true; the labels replay the logged agents, so the rollouts must too"
        )
    decider = BatchedPolicy(policy, selection="deterministic")
    parts = []
    for lo in range(0, len(clips), chunk_clips):
        chunk = list(clips[lo : lo + chunk_clips])
        rollouts, _ = run_rollouts(
            sim,
            decider,
            chunk,
            1,
            batch_size=len(chunk),
            seed=seed,
            h_reuse=h_reuse,
            keep_observations=True,
            progress=progress,
        )
        parts.append(_label_rollouts(rollouts, chunk, horizon_s, float(policy.plan_dt), policy.max_curvature))
    data = CriticDataset.concatenate(parts)
    data.meta = {
        "horizon_s": float(horizon_s),
        "clip_dt": float(clips[0].dt),
        "plan_dt": float(policy.plan_dt),
        "h_reuse": int(h_reuse),
        "seed": int(seed),
        "num_candidates": int(data.trajectories.shape[1]),
        "clips": len(clips),
        "dropped_incomplete_horizon": int(sum(p.meta["dropped"] for p in parts)),
    }
    return data


def _label_rollouts(rollouts, clips, horizon_s: float, plan_dt: float, max_curvature: float) -> CriticDataset:
    rows: dict[str, list] = {k: [] for k in PER_DECISION}
    dropped = 0  # decisions whose horizon runs past the clip's end
    for r, (ro, clip) in enumerate(zip(rollouts, clips)):
        hits = [c["step"] for c in ro.trace.collisions]
        coll_step = int(min(hits)) if hits else -1
        for dp in ro.trace.decisions:
            if dp.candidates is None or dp.observation is None:
                raise CriticDataError(
                    f"clip {clip.clip_id!r} step {dp.step}: the decision kept no candidates "
                    "or observation (plan with a Rad2Policy, keep_observations=True)"
                )
            collides, ttc, complete = label_candidates(
                dp.candidates, plan_dt, dp.ego_state[:3], clip, dp.step, horizon_s, max_curvature
            )
            if not complete:
                dropped += 1
                continue
            obs = dp.observation
            for k, v in (
                ("trajectories", dp.candidates),
                ("agents", obs.agents),
                ("agents_mask", obs.agents_mask),
                ("ego_state", obs.ego_state),
                ("collides", collides),
                ("ttc", ttc),
                ("selected", dp.selected),
                ("step", dp.step),
                ("rollout", r),
                ("rollout_collision_step", coll_step),
            ):
                rows[k].append(v)
    dtypes = {
        "trajectories": np.float32,
        "agents": np.float32,
        "agents_mask": bool,
        "ego_state": np.float32,
        "collides": bool,
        "ttc": np.float32,
        "selected": np.int32,
        "step": np.int32,
        "rollout": np.int32,
        "rollout_collision_step": np.int32,
    }
    if not rows["step"]:  # every decision ran past the clip's end: an empty part
        return CriticDataset(
            **{k: np.zeros((0,), dtypes[k]) for k in PER_DECISION},
            clip_ids=[c.clip_id for c in clips],
            meta={"dropped": dropped},
        )
    return CriticDataset(
        **{k: np.asarray(np.stack(v), dtype=dtypes[k]) for k, v in rows.items()},
        clip_ids=[c.clip_id for c in clips],
        meta={"dropped": dropped},
    )


# ----------------------------------------------------------------------------------------------------
# training


def mirror(trajectories, agents, ego_state):
    """The left-right mirror image of a scene (y -> -y): positions, headings, velocities, yaw rate and
    steering change sign; a mirrored candidate collides exactly when the original does."""
    traj = trajectories.clone()
    traj[..., 1] = -traj[..., 1]
    ag = agents.clone()
    ag[..., 1], ag[..., 3], ag[..., 5] = -ag[..., 1], -ag[..., 3], -ag[..., 5]
    es = ego_state.clone()
    es[..., 2:4] = -es[..., 2:4]
    return traj, ag, es


def balanced_bce(logits, labels, pos_fraction: float):
    """Binary cross-entropy where positives and negatives each carry half the weight (``pos_fraction``
    is the positives' share in the training set)."""
    import torch

    pf = min(max(float(pos_fraction), 1e-6), 1.0 - 1e-6)
    w = torch.where(labels > 0.5, 0.5 / pf, 0.5 / (1.0 - pf))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (w * loss).sum() / w.sum()


def predict(critic, data: CriticDataset, batch_size: int = 256) -> np.ndarray:
    """Critic probabilities [D, M] for a dataset (PyTorch, no gradients)."""
    import torch

    out = []
    critic.eval()
    with torch.inference_mode():
        for lo in range(0, len(data), batch_size):
            sl = slice(lo, lo + batch_size)
            _, p = critic(
                *(
                    torch.from_numpy(np.ascontiguousarray(a[sl]))
                    for a in (data.trajectories, data.agents, data.agents_mask, data.ego_state)
                )
            )
            out.append(p.numpy())
    return np.concatenate(out) if out else np.zeros((0, data.collides.shape[1]), np.float32)


def train_critic(
    train: CriticDataset,
    val: CriticDataset | None,
    cfg,
    *,
    epochs: int = 12,
    batch_size: int = 32,
    candidates_per_decision: int = 16,
    lr: float = 2e-3,
    weight_decay: float = 1e-4,
    seed: int = 0,
    progress: Callable[[dict[str, float]], None] | None = None,
):
    """Train a :class:`~rad2_planner.networks.critic.CollisionCritic` of config ``cfg``; returns
    ``(critic, history)`` with one history row per epoch (train loss, val loss, val AP, seconds); with
    ``val`` the returned weights are those of the epoch with the best validation AP (the small training
    sets overfit within a few epochs), else the last epoch's.

    Each batch holds ``batch_size`` decisions with ``candidates_per_decision`` of their candidates drawn
    at random (positives first when there are any, so the rare colliding candidates are always seen).
    """
    import torch
    from rad2_planner.networks.critic import CollisionCritic

    if len(train) == 0:
        raise CriticDataError("train: no decisions")
    pos_fraction = float(train.collides.mean())
    if not 0.0 < pos_fraction < 1.0:
        raise CriticDataError(f"train: positive fraction {pos_fraction}: both classes are needed")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    critic = CollisionCritic(cfg)
    opt = torch.optim.AdamW(critic.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = max(1, math.ceil(len(train) / batch_size))
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.1
    )
    m = train.collides.shape[1]
    c = min(int(candidates_per_decision), m)
    history = []
    best = (-math.inf, None)  # (validation AP, weights): the epoch that generalises best is kept
    for epoch in range(epochs):
        t0 = time.perf_counter()
        critic.train()
        order = rng.permutation(len(train))
        losses = []
        for lo in range(0, len(order), batch_size):
            rows = order[lo : lo + batch_size]
            # per decision: its positives first (random order), then random negatives, c in all
            key = rng.random((len(rows), m)) - train.collides[rows].astype(np.float64)
            cols = np.argsort(key, axis=1)[:, :c]
            pick = (rows[:, None], cols)
            traj = torch.from_numpy(train.trajectories[pick])
            labels = torch.from_numpy(train.collides[pick].astype(np.float32))
            agents = torch.from_numpy(train.agents[rows])
            mask = torch.from_numpy(train.agents_mask[rows])
            es = torch.from_numpy(train.ego_state[rows])
            if rng.random() < 0.5:
                traj, agents, es = mirror(traj, agents, es)
            logits, _ = critic(traj, agents, mask, es)
            # the sampled batch over-represents positives; weight by the full set's share instead
            loss = balanced_bce(logits, labels, pos_fraction)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
        row = {"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "seconds": time.perf_counter() - t0}
        if val is not None and len(val):
            p = predict(critic, val)
            with torch.no_grad():
                row["val_loss"] = float(
                    balanced_bce(
                        torch.logit(torch.from_numpy(p).clamp(1e-6, 1 - 1e-6)),
                        torch.from_numpy(val.collides.astype(np.float32)),
                        pos_fraction,
                    )
                )
            row["val_ap"] = average_precision(p.ravel(), val.collides.ravel())
            if row["val_ap"] > best[0]:
                best = (row["val_ap"], {k: v.detach().clone() for k, v in critic.state_dict().items()})
        history.append(row)
        if progress is not None:
            progress(row)
    if best[1] is not None:
        critic.load_state_dict(best[1])
    return critic.eval(), history


# ----------------------------------------------------------------------------------------------------
# warning statistics


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the precision-recall curve (step-wise, as scikit-learn's average_precision_score)."""
    labels = np.asarray(labels, bool).ravel()
    if not labels.any():
        return float("nan")
    order = np.argsort(-np.asarray(scores, np.float64).ravel(), kind="stable")
    hits = labels[order]
    tp = np.cumsum(hits)
    precision = tp / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


def warning_statistics(
    probs: np.ndarray, data: CriticDataset, thresholds: Sequence[float] = THRESHOLDS
) -> dict[str, Any]:
    """Precision, recall and lead time of the critic's warnings at each threshold (see the module doc).

    ``probs [D, M]``: the critic's probabilities for ``data``'s candidates.
    """
    probs = np.asarray(probs, np.float64)
    if probs.shape != data.collides.shape:
        raise CriticDataError(
            f"probs: shape {probs.shape} does not match the dataset's {data.collides.shape}"
        )
    dt = float(data.meta.get("clip_dt", 0.1))
    horizon_steps = int(round(float(data.meta.get("horizon_s", 4.0)) / dt))
    rows = np.arange(len(data))
    p_exec, y_exec = probs[rows, data.selected], data.collides[rows, data.selected]
    ttc_exec = data.ttc[rows, data.selected]
    events = sorted({int(r) for r in data.rollout[data.rollout_collision_step >= 0]})
    out: dict[str, Any] = {
        "average_precision": average_precision(probs, data.collides),
        "average_precision_executed": average_precision(p_exec, y_exec),
        "positives": int(data.collides.sum()),
        "candidates": int(data.collides.size),
        "executed_positives": int(y_exec.sum()),
        "decisions": len(data),
        "collision_events": len(events),
        "thresholds": {},
    }
    for thr in thresholds:
        row: dict[str, Any] = {}
        for name, p, y, ttc in (
            ("candidates", probs.ravel(), data.collides.ravel(), data.ttc.ravel()),
            ("executed", p_exec, y_exec, ttc_exec),
        ):
            warn = p >= thr
            tp = warn & y
            row[name] = {
                "precision": float(tp.sum() / warn.sum()) if warn.any() else float("nan"),
                "recall": float(tp.sum() / y.sum()) if y.any() else float("nan"),
                "warning_rate": float(warn.mean()) if len(warn) else float("nan"),
                "mean_lead_s": float(ttc[tp].mean()) if tp.any() else float("nan"),
            }
        leads = []
        for r in events:
            mine = np.flatnonzero(data.rollout == r)
            s_c = int(data.rollout_collision_step[mine[0]])
            window = mine[(data.step[mine] < s_c) & (data.step[mine] >= s_c - horizon_steps)]
            flagged = window[p_exec[window] >= thr]
            if len(flagged):
                leads.append((s_c - int(data.step[flagged].min())) * dt)
        row["events"] = {
            "detected": len(leads),
            "of": len(events),
            "recall": len(leads) / len(events) if events else float("nan"),
            "mean_first_warning_lead_s": float(np.mean(leads)) if leads else float("nan"),
        }
        out["thresholds"][f"{thr:g}"] = row
    return out


def warning_table(stats: dict[str, Any]) -> str:
    """Markdown table of :func:`warning_statistics` (one column per threshold)."""
    thr = list(stats["thresholds"])
    lines = ["| threshold | " + " | ".join(thr) + " |", "| --- |" + " --- |" * len(thr)]

    def fmt(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"

    for label, path in (
        ("precision (all candidates)", ("candidates", "precision")),
        ("recall (all candidates)", ("candidates", "recall")),
        ("mean lead time s (true warnings)", ("candidates", "mean_lead_s")),
        ("precision (executed)", ("executed", "precision")),
        ("recall (executed)", ("executed", "recall")),
        ("mean lead time s (executed)", ("executed", "mean_lead_s")),
        ("closed-loop collisions warned", ("events", "recall")),
        ("first-warning lead s (closed loop)", ("events", "mean_first_warning_lead_s")),
    ):
        vals = [fmt(stats["thresholds"][t][path[0]][path[1]]) for t in thr]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    ev = stats["thresholds"][thr[0]]["events"]["of"]
    lines.append(
        f"\nAP {stats['average_precision']:.3f} (all candidates, {stats['positives']} positive of "
        f"{stats['candidates']}), AP {stats['average_precision_executed']:.3f} (executed, "
        f"{stats['executed_positives']} of {stats['decisions']}); {ev} closed-loop collisions"
    )
    return "\n".join(lines)
