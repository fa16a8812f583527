"""On-policy Generator Optimization (RAD-2 §3.3.3, Eq. 19): closed-loop feedback → longitudinal targets.

For a decision point at log step t of a finished rollout, the **raw segment** (``rl.ogo.segment``) is
either

- ``plan`` (the default): the plan the ego committed to at t — the selected candidate after the
  planner's post-processing, what the tracker was given — in the ego frame at t (the frame the
  generator plans in); or
- ``candidate``: the generator's selected candidate itself, before the planner's post-processing
  (safety envelope, comfort limits, signal rules), which only ever slows a plan down;
- ``executed``: what the ego actually drove next, its positions at the plan's times ``(k+1)·plan_dt``,
  k < T, in the same frame.

The executed drive stitches the plans of several decisions (a plan is replaced after ``h_reuse`` steps
or when the safety check breaks the latch), saturated braking of the tracker and, after a collision,
a constant-velocity continuation. In the pending targets of a full RAD-2 run its first 0.5 s differed
from the ego's speed at the decision by a median 3.1 m/s² of average acceleration (logged expert
futures: 0.5 m/s²). The committed plan is the generator's own proposal, as on-policy as a target can
be (median 1.9 m/s² in the pending targets of a run that used it). Measured on ``eval_rich``
(docs/results.md), the generator fine-tuned on executed segments made 0.33-0.36 comfort-violating steps,
on committed plans 0.26 (the IL generator: 0.20), and it collided less. The closed-loop outcome then
re-times the segment *along the same path*:

- **safety-driven deceleration**: when ``T_t`` (RAD-2 Eq. 12) is below ``γ_safe``, the distance
  travelled over the horizon is compressed by ``ρ ∈ (0, 1)``;
- **efficiency-driven acceleration**: when the ego lags the logged drive (its progress along the route
  is behind the log's by more than ``lag_m``) and ``T_t`` is above ``γ_safe``, the distance is extended
  by ``ρ' > 1`` (beyond the driven path's end, along its last heading);
- otherwise the segment is no target.

**Follower-aware decisions** (``rl.ogo.follower_gamma_s`` > 0; not in RAD-2, whose ``T_t`` ignores
vehicles behind): with the follower time to collision ``T^rear_t`` of the simulator's trace,

- a state whose follower is closer than ``follower_gamma_s`` is no deceleration target (slowing there
  is what a log-replayed follower drives into; the discriminator and the safety envelope keep the
  hazard ahead), and
- a state with the follower that close and ``T_t`` at least ``γ_safe`` is an acceleration target
  (keep ahead of it where the road ahead is clear), lagging the log or not.

``rl.ogo.kinds`` can keep one of the two kinds only. ``accelerate`` is for simulators whose agents
replay their logs: a follower does not brake for a slower ego, so a deceleration target can teach
the generator the very slowing that gets it rear-ended, while the planner's safety envelope and the
discriminator already slow it for a hazard ahead. Measured (docs/results.md): it drove further
held out but collided more with leaders, because the frozen discriminator then ranks candidates it was
not trained on.

As in RAD-2, the re-timing adds one constant offset to the segment's acceleration profile and
re-integrates: the start speed is kept (a target must begin at the speed the ego has), the distance at
the horizon's end becomes ρ times the driven one, and a deceleration that would reverse the ego stops
it instead (the sign-aware part). The path (the points in space) stays, only the timing changes.
Scaling every point's distance by ρ instead would change the start speed by (1 − ρ)·v at once: at
15 m/s and ρ = 0.8 that is a 12 m/s² brake over the first 0.5 s, and a generator fine-tuned on such
targets learns jerky plans. The targets, with the
state they start from, fine-tune the generator by the mean squared error of Eq. 19 (the trainer
renders the observation at that state and uses the imitation loss with the target as the expert).

**Imitation mix** (RAD-2 Table 4, row 3; ``rl.ogo_imitation_weight``): each OGO step can add the
imitation loss on logged (observation, expert future) pairs of the training clips. OGO only re-times
what the policy drove; the logged term keeps the generator's paths and speeds anchored to the
demonstrations it was trained on while the re-timing shifts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.geometry import world_to_ego

SEGMENTS = ("plan", "candidate", "executed")
TARGET_KINDS = ("both", "decelerate", "accelerate")


@dataclass(frozen=True)
class OGOConfig:
    gamma_safe_s: float = 2.0  # γ_safe: TTC below it -> decelerate
    decel_ratio: float = 0.8  # ρ ∈ (0, 1)
    accel_ratio: float = 1.15  # ρ' > 1
    lag_m: float = 2.0  # the ego counts as lagging when this far behind the log's progress
    segment: str = "plan"  # plan | executed: what is re-timed (module docstring)
    reject_new_collisions: bool = True  # drop a target that hits a logged agent its raw segment misses
    balance_kinds: bool = False  # each minibatch half decelerations, half accelerations (when both exist)
    # The scene encoder's BEV tokens are also the discriminator's input: updating it would move what a
    # frozen (or buffered) discriminator was trained on. Off: OGO fine-tunes the denoiser only.
    update_scene_encoder: bool = False
    # Which halves of Eq. 19 make targets: both (RAD-2), or only one kind. Why one: with log-replayed
    # agents that do not react, a deceleration target teaches the generator a slowing that a follower
    # replaying its log drives into (docs/results.md); ``accelerate`` keeps the efficiency half
    # and leaves slowing for a hazard to the discriminator and the planner's safety envelope.
    kinds: str = "both"
    # > 0: the follower time to collision T^rear_t enters the decision (module docstring); 0: RAD-2's rule
    follower_gamma_s: float = 0.0

    def __post_init__(self) -> None:
        if self.segment not in SEGMENTS:
            raise ValueError(f"segment: must be one of {SEGMENTS}, got {self.segment!r}")
        if self.kinds not in TARGET_KINDS:
            raise ValueError(f"kinds: must be one of {TARGET_KINDS}, got {self.kinds!r}")
        if not 0.0 < self.decel_ratio < 1.0:
            raise ValueError(f"decel_ratio: must lie in (0, 1), got {self.decel_ratio!r}")
        if not self.accel_ratio > 1.0:
            raise ValueError(f"accel_ratio: must be > 1, got {self.accel_ratio!r}")
        if not self.follower_gamma_s >= 0:
            raise ValueError(f"follower_gamma_s: must be >= 0 (0: off), got {self.follower_gamma_s!r}")
        if not (self.gamma_safe_s > 0 and self.lag_m >= 0):
            raise ValueError(f"gamma_safe_s > 0 and lag_m >= 0 required, got {self.gamma_safe_s}, "
                             f"{self.lag_m}")


@dataclass(frozen=True)
class OGOTarget:
    """A fine-tuning sample: the state a decision started from and the re-timed segment to imitate."""

    clip_id: str
    step: int
    ego_state: np.ndarray  # [5] bicycle state at the decision
    accel: float
    raw: np.ndarray  # [T, 2] what the ego drove, ego frame at the decision
    target: np.ndarray  # [T, 2] re-timed along the same path
    kind: str  # decelerate | accelerate


def retime(points: np.ndarray, ratio: float) -> np.ndarray:
    """Points ``[T, 2]`` at equal time steps (ego frame, the ego at the origin one step before the first)
    moved along their own path by a constant acceleration offset: the start speed is kept, the last
    point has travelled ``ratio`` × its arc length, and no point moves backwards (the ego stops instead).
    Past the path's end the points continue along its last segment."""
    pts = np.asarray(points, dtype=np.float64)
    path = np.vstack([np.zeros((1, 2)), pts])
    seg = np.diff(path, axis=0)
    length = np.hypot(seg[:, 0], seg[:, 1])
    cum = np.concatenate([[0.0], np.cumsum(length)])
    moving = np.flatnonzero(length > 1e-9)
    if len(moving) == 0:
        return pts.copy()  # standing still stays standing still
    # s'(t) = s(t) + ½·Δa·t² with s'(t_T) = ratio · s(t_T); t_k / t_T = k / T, so dt drops out
    frac = np.arange(1, len(pts) + 1) / len(pts)
    s = np.maximum.accumulate(np.maximum(cum[1:] + (ratio - 1.0) * cum[-1] * frac**2, 0.0))
    last = seg[moving[-1]] / length[moving[-1]]
    out = np.empty_like(pts)
    within = s <= cum[-1]
    out[within, 0] = np.interp(s[within], cum, path[:, 0])
    out[within, 1] = np.interp(s[within], cum, path[:, 1])
    out[~within] = path[-1] + (s[~within] - cum[-1])[:, None] * last
    return out


def raw_segment(trace: Any, step: int, plan_points: int, plan_dt: float) -> np.ndarray:
    """The executed positions after log step ``step`` at the plan's times, in the ego frame at ``step``.

    A rollout that ended inside the horizon (a collision, the clip's end) is continued at its last
    velocity: the steps just before a collision are where a deceleration target matters most."""
    stride = plan_dt / trace.dt
    idx = step - trace.start_step + np.arange(1, plan_points + 1) * stride
    last = len(trace.ego) - 1
    k = np.arange(len(trace.ego))
    xy = np.stack([np.interp(idx, k, trace.ego[:, 0]), np.interp(idx, k, trace.ego[:, 1])], -1)
    beyond = idx > last
    if beyond.any():
        x, y, yaw, v = trace.ego[last, :4]
        dt_beyond = (idx[beyond] - last) * trace.dt
        xy[beyond] = np.stack([x + v * np.cos(yaw) * dt_beyond, y + v * np.sin(yaw) * dt_beyond], -1)
    return world_to_ego(xy, trace.ego[step - trace.start_step, :3])


def segment(trace: Any, decision: Any, cfg: OGOConfig, plan_points: int, plan_dt: float) -> np.ndarray:
    """The raw segment ``[T, 2]`` of a decision point that ``cfg.segment`` names: ``plan``, the committed
    plan; ``candidate``, the generator's selected candidate before the planner's post-processing (the
    safety envelope and the comfort limits only ever slow a plan down, so targets built on the committed
    plan pull the generator slower at every update, and the post-processing then slows it again);
    ``executed``, the drive. A decision without a plan or candidates of the generator's shape (a
    controls action, another planner's horizon) or with a non-finite point falls back to the drive."""
    plan = getattr(decision, "trajectory", None)
    if cfg.segment == "candidate":
        candidates = getattr(decision, "candidates", None)
        selected = int(getattr(decision, "selected", 0))
        plan = (candidates[selected] if candidates is not None and np.ndim(candidates) == 3
                and 0 <= selected < len(candidates) else None)
    plan_dt_of = (getattr(decision, "info", None) or {}).get("plan_dt", plan_dt)
    if (cfg.segment != "executed" and plan is not None and np.shape(plan) == (plan_points, 2)
            and abs(float(plan_dt_of) - plan_dt) < 1e-9 and np.isfinite(plan).all()):
        return np.asarray(plan, dtype=np.float64)
    return raw_segment(trace, decision.step, plan_points, plan_dt)


def decide(trace: Any, step: int, cfg: OGOConfig) -> str | None:
    """``decelerate`` / ``accelerate`` / None for the state at log step ``step`` of ``trace``."""
    i = step - trace.start_step
    ttc = float(trace.ttc[i])
    follower_close = cfg.follower_gamma_s > 0 and float(trace.rear_ttc[i]) < cfg.follower_gamma_s
    if ttc < cfg.gamma_safe_s:
        return None if follower_close else "decelerate"
    behind = float(trace.expert_s[min(i, len(trace.expert_s) - 1)] - trace.route_s[i])
    if behind > cfg.lag_m or follower_close:
        return "accelerate"
    return None


def ogo_targets(rollouts: Sequence[Any], cfg: OGOConfig, plan_points: int, plan_dt: float) -> list[OGOTarget]:
    """The fine-tuning samples of a batch of rollouts: one per decision point that needs re-timing (of
    the kinds ``cfg.kinds`` asks for)."""
    out = []
    for r in rollouts:
        tr = r.trace
        for d in tr.decisions:
            kind = decide(tr, d.step, cfg)
            if kind is None or cfg.kinds not in ("both", kind):
                continue
            raw = segment(tr, d, cfg, plan_points, plan_dt)
            ratio = cfg.decel_ratio if kind == "decelerate" else cfg.accel_ratio
            out.append(OGOTarget(tr.clip_id, d.step, np.asarray(d.ego_state), float(d.accel), raw,
                                 retime(raw, ratio), kind))
    return out


def minibatch(targets: Sequence[OGOTarget], size: int, rng: np.random.Generator,
              balance_kinds: bool) -> np.ndarray:
    """Indices of one generator minibatch of at most ``size`` targets, drawn without replacement.

    Uniform draws follow the targets' mix. In dense log-replayed traffic most decision points are
    below γ_safe, so most targets are decelerations (56-74 % in OGO runs on the shipped planner) and the
    generator learns to be slower everywhere, which there means rear-ends by followers that do not
    react. ``balance_kinds`` draws half of each minibatch from each kind, so the update shifts the
    speed where the closed loop asked for it without a net pull in one direction."""
    n = len(targets)
    size = min(size, n)
    if not balance_kinds:
        return rng.choice(n, size=size, replace=False)
    kinds = np.array([t.kind for t in targets])
    pools = [np.flatnonzero(kinds == k) for k in ("decelerate", "accelerate")]
    if min(len(p) for p in pools) == 0:
        return rng.choice(n, size=size, replace=False)
    half = size // 2
    take = [min(half, len(pools[0])), min(size - half, len(pools[1]))]
    return np.concatenate([rng.choice(p, size=k, replace=False) for p, k in zip(pools, take)])


def _segment_boxes(points: np.ndarray, ego_state: np.ndarray, length: float, width: float) -> np.ndarray:
    """Ego boxes ``[T, 5]`` (world frame) along ego-frame points ``[T, 2]`` driven from ``ego_state``:
    each heading is that of the step into the point, and a standing step keeps the heading before it."""
    from rad2_core.geometry import ego_to_world

    pose = np.asarray(ego_state[:3], dtype=np.float64)
    xy = ego_to_world(np.asarray(points, dtype=np.float64), pose)
    step = np.diff(np.vstack([pose[None, :2], xy]), axis=0)
    moving = np.hypot(step[:, 0], step[:, 1]) > 1e-6
    yaw = np.where(moving, np.arctan2(step[:, 1], step[:, 0]), np.nan)
    yaw = np.concatenate([[pose[2]], yaw])
    for k in range(1, len(yaw)):  # carry the last heading over standing steps
        if np.isnan(yaw[k]):
            yaw[k] = yaw[k - 1]
    n = len(xy)
    return np.column_stack([xy, yaw[1:], np.full(n, length), np.full(n, width)])


def agents_hit(points: np.ndarray, ego_state: np.ndarray, clip: Any, step: int, plan_dt: float) -> np.ndarray:
    """Which logged agents ``[N]`` (bool) the ego would overlap driving ``points`` (ego frame at log step
    ``step``, at times ``(k+1)·plan_dt``), against the agents as logged at those times."""
    from bev_warp_sim.safety import agent_future_boxes
    from rad2_core.geometry import boxes_overlap

    stride = plan_dt / float(clip.dt)
    offsets = np.rint(np.arange(1, len(points) + 1) * stride).astype(int)
    boxes, valid = agent_future_boxes(clip, int(step), int(offsets[-1]))
    ego = _segment_boxes(points, ego_state, float(clip.ego_length), float(clip.ego_width))
    if not len(boxes):
        return np.zeros(0, dtype=bool)
    hit = boxes_overlap(ego[None], boxes[:, offsets]) & valid[:, offsets]
    return hit.any(axis=1)


def reject_new_collisions(targets: Sequence[OGOTarget], clips: dict[str, Any],
                          plan_dt: float) -> tuple[list[OGOTarget], int]:
    """The targets whose re-timing hits no logged agent that the raw segment misses, and how many were
    dropped. Why: the re-timing is a fixed rule, blind to the agents. Compressing a plan with a
    follower close behind moves the ego into it (the log-replayed follower does not brake), and
    extending one can run it into a leader. Such a target would teach the generator a collision; the
    agents' logged futures say which ones do. A target that hits only agents its raw segment already
    hits is kept: a deceleration that does not yet clear a braking leader still points the right way."""
    kept = []
    for t in targets:
        clip = clips[t.clip_id]
        before = agents_hit(t.raw, t.ego_state, clip, t.step, plan_dt)
        after = agents_hit(t.target, t.ego_state, clip, t.step, plan_dt)
        if not (after & ~before).any():
            kept.append(t)
    return kept, len(targets) - len(kept)


def generator_batch(sim: Any, clips: dict[str, Any], targets: Sequence[OGOTarget],
                    model_cfg: Any) -> dict[str, np.ndarray]:
    """The imitation-loss batch of a list of targets: each observation rendered again at its decision
    state (``Simulator.observation_at``) with the re-timed segment as the trajectory to imitate.
    ``model_cfg`` (the generator's ModelConfig): feed it the BEV channels and map features it takes."""
    from rad2_core.observation import stack_observations
    from rad2_planner.candidates import observation_inputs

    obs = [sim.observation_at(clips[t.clip_id], t.step, t.ego_state, t.accel) for t in targets]
    batch = observation_inputs(stack_observations(obs), model_cfg, sim.observation_channels)
    batch["target"] = np.stack([t.target for t in targets]).astype(np.float32)
    return batch


def imitation_samples(clips: Sequence[Any], rng: np.random.Generator, n: int, plan_dt: float,
                      plan_points: int) -> list[tuple[int, int]]:
    """``n`` (clip index, log step) pairs drawn uniformly over the clips, then over the steps whose whole
    plan horizon is logged (the expert future to imitate must exist). ValueError when no clip has one."""
    from rad2_training.imitation import sample_steps

    steps = [sample_steps(c.num_steps, c.dt, plan_dt, plan_points, 1) for c in clips]
    usable = [i for i, s in enumerate(steps) if s]
    if not usable:
        raise ValueError(
            f"imitation mix: no clip is longer than the plan horizon ({plan_points} x {plan_dt} s)")
    picks = rng.choice(usable, size=int(n))
    return [(int(i), int(steps[i][rng.integers(len(steps[i]))])) for i in picks]


def imitation_batch(sim: Any, clips: Sequence[Any], samples: Sequence[tuple[int, int]],
                    model_cfg: Any) -> dict[str, np.ndarray]:
    """The imitation-loss batch of logged samples: the logged observation at step t (the simulator's,
    so the BEV is the one the rollouts warp) and the logged ego future after t in the ego frame of t."""
    from rad2_core.observation import stack_observations
    from rad2_core.open_loop_metrics import logged_future
    from rad2_planner.candidates import observation_inputs

    obs = [sim.logged_observation(clips[i], t) for i, t in samples]
    batch = observation_inputs(stack_observations(obs), model_cfg, sim.observation_channels)
    batch["target"] = np.stack([logged_future(clips[i], t, model_cfg.plan_dt, model_cfg.plan_points).ego
                                for i, t in samples]).astype(np.float32)
    return batch


def generator_step(model: Any, optimizer: Any, batch: dict[str, np.ndarray], schedule: Any, draws: int,
                   gen: Any, imitation_batch: dict[str, np.ndarray] | None = None,
                   imitation_weight: float = 0.0, update_scene_encoder: bool = False) -> float:
    """One fine-tuning step of the generator on Eq. 19 — the x0-prediction MSE of the diffusion model
    with the OGO targets as the clean trajectories — optionally mixed with the imitation loss on logged
    targets (RAD-2 Table 4, row 3). The scene encoder takes part only with ``update_scene_encoder``
    (:class:`OGOConfig`). Returns the loss."""
    import torch

    from rad2_training.imitation import diffusion_loss, to_torch

    model.encoder.requires_grad_(update_scene_encoder)
    model.encoder.train(update_scene_encoder)
    model.denoiser.train()
    try:
        loss = diffusion_loss(model, to_torch(batch, torch.device("cpu")), schedule, draws, gen)
        if imitation_batch is not None and imitation_weight > 0:
            logged = to_torch(imitation_batch, torch.device("cpu"))
            loss = loss + imitation_weight * diffusion_loss(model, logged, schedule, draws, gen)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    finally:
        model.encoder.requires_grad_(True)
        model.encoder.eval()
        model.denoiser.eval()
    return float(loss.detach())
