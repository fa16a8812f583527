"""Rollout rewards as a registry of pure functions of a finished rollout (:class:`EpisodeTrace`).

:data:`REWARDS` maps a name (the ``rewards.rl_reward`` parameter, or a trainer's choice) to
``fn(trace, params) -> float``; nothing here reads or writes simulator state, so a new reward is a new
function, never an edit of the simulator.

- ``rad2_collision``: RAD-2 Eq. 12–13, ``r_coll = min_t (T_t − T_max)`` (``−T_max`` after a collision);
- ``rad2_efficiency``: RAD-2 Eq. 14, ``r_eff`` of the ego progress ρ;
- ``rad2``: ``w_coll · r_coll + w_eff · r_eff`` (``rewards.rad2`` weights);
- ``follower_margin``: ``r_follow`` (below);
- ``rad2_follow``: ``rad2 + w_follow · r_follow`` (``rewards.rad2_follow.weight_follower``);
- ``plan_r1``: Plan-R1's rule-based reward (gates × weighted soft terms, below);
- ``correction_planner``: CorrectionPlanner's ``min(ρ, 1) · 1[no collision] − 1[collision]``;
- ``laviplan``: LaViPlan's planning reward ``−log(1 + ADE) − log(1 + FDE)`` of the driven ego positions
  against the logged ones over the executed steps;
- ``safe_score``: the nuPlan-style closed-loop score rebuilt so that no progress can pay for an at-fault
  collision (below).

Definitions:

- ``r_coll = min_t (T_t − T_max)`` over the rollout (≤ 0; 0 when T_t never dropped below T_max).
- ``r_follow = min_t (T^rear_t − T_max)``: the same margin against vehicles behind the ego (the
  follower time to collision of ``bev_warp_sim.safety``), which ``T_t`` leaves out. RAD-2's reward has
  no such term; in a log replay, where a follower cannot brake for an ego slower than the logged one,
  it prices the gap that rear-end collisions use up before one happens.
- Ego progress ``ρ``: the ego's arc-length progress along the route polyline over the rollout window
  divided by the expert's (the log's) progress over the same window; 1 when the expert moved less than
  ``rewards.min_expert_progress_m`` (nothing to compare against).
- ``r_eff = min(ρ − ρ_low, 0) + min(ρ_high − ρ, 0) + 1`` with the window ``[ρ_low, ρ_high]`` from params.
- Plan-R1 (its Appendix C, nuPlan thresholds): ``R = Π gates × Σ w_j r_j / Σ w_j`` with the gates no
  collision, drivable area (box corners or centre inside the drivable polygons) and driving direction
  (nuPlan: the largest backwards progress along the route within a ``direction_window_s`` window;
  below ``direction_ok_m`` → 1, below ``direction_bad_m`` → 0.5, else 0), and the soft terms comfort
  (0/1 from the nuPlan comfort thresholds), TTC (1 when min T_t ≥ ``ttc_threshold_s``), speed-limit
  compliance (``max(0, 1 − ∫ overspeed dt / (max_overspeed · duration))``, the nuPlan form) and
  progress (``min(ρ, 1)``).
- ``safe_score`` (``rewards.safe_score``), from the pieces of :mod:`bev_warp_sim.nuplan_score`::

      R = −1                                                  at-fault collision or off the drivable area
      R = f_nf^[collided] · f_ttc^[TTC < τ] · D · P · (w_p p + w_s s + w_c c) / (w_p + w_s + w_c)   otherwise

  with the at-fault verdict of :func:`bev_warp_sim.safety.classify_collision` (any at-fault collision,
  objects included), ``f_nf`` (``not_at_fault_collision_factor``) after a collision that was not the
  ego's fault, ``f_ttc`` (``near_miss_factor``) when the TTC before the first collision fell below
  τ = ``near_miss_ttc_s``, ``D`` and ``P`` nuPlan's driving-direction and making-progress multipliers,
  ``p`` nuPlan's progress ratio ``min(1, max(p_ego, θ) / max(p_expert, θ))`` (capped at the human's:
  driving farther than the log earns nothing), ``s`` speed-limit compliance and ``c`` comfort (0/1).
  Every factor and term lies in [0, 1], so an episode without an at-fault collision scores in [0, 1]
  and one with it at −1, below all of them whatever its progress. An additive reward (``rad2``: r_coll +
  r_eff) lets enough progress outweigh a collision margin, and RL found that trade.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bev_warp_sim.trace import EpisodeTrace


def r_coll(ttc_series, t_max: float) -> float:
    """RAD-2 Eq. 13: the worst temporal margin ``min_t (T_t − T_max)`` (0 for an empty rollout)."""
    ttc = np.asarray(ttc_series, dtype=np.float64)
    if ttc.size == 0:
        return 0.0
    return float(np.min(ttc) - t_max)


def progress_ratio(ego_progress_m: float, expert_progress_m: float, min_expert_progress_m: float) -> float:
    """Ego progress ρ relative to the expert over the same window (1 when the expert barely moved)."""
    if expert_progress_m < min_expert_progress_m:
        return 1.0
    return float(ego_progress_m / expert_progress_m)


def r_eff(rho: float, rho_low: float, rho_high: float) -> float:
    """RAD-2 Eq. 14: ``min(ρ − ρ_low, 0) + min(ρ_high − ρ, 0) + 1``."""
    if rho_low > rho_high:
        raise ValueError(f"rewards.rho_low: {rho_low} exceeds rho_high {rho_high}")
    return float(min(rho - rho_low, 0.0) + min(rho_high - rho, 0.0) + 1.0)


# ----------------------------------------------------------------------------------------------------
# Comfort (shared with metrics)

COMFORT_TERMS = ("lon_accel", "lat_accel", "yaw_rate", "yaw_accel", "lon_jerk", "jerk")


def comfort_signals(poses, speeds, dt: float) -> dict[str, np.ndarray]:
    """Kinematic signals of a driven path: poses ``[T, 3]``, speeds ``[T]`` -> dict of ``[T]`` arrays."""
    poses = np.asarray(poses, dtype=np.float64)
    v = np.asarray(speeds, dtype=np.float64)
    t = len(v)
    if t < 3:
        zeros = np.zeros(t)
        return {k: zeros.copy() for k in COMFORT_TERMS}
    yaw = np.unwrap(poses[:, 2])
    yaw_rate = np.gradient(yaw, dt)
    yaw_accel = np.gradient(yaw_rate, dt)
    lon_accel = np.gradient(v, dt)
    lat_accel = v * yaw_rate
    lon_jerk = np.gradient(lon_accel, dt)
    lat_jerk = np.gradient(lat_accel, dt)
    return {
        "lon_accel": lon_accel,
        "lat_accel": lat_accel,
        "yaw_rate": yaw_rate,
        "yaw_accel": yaw_accel,
        "lon_jerk": lon_jerk,
        "jerk": np.hypot(lon_jerk, lat_jerk),
    }


def comfort_violations(signals: dict[str, np.ndarray], cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-step bool violations of the nuPlan comfort thresholds (``comfort`` block of sim.yaml)."""
    return {
        "lon_accel": (signals["lon_accel"] > float(cfg["max_lon_accel"]))
        | (signals["lon_accel"] < float(cfg["min_lon_accel"])),
        "lat_accel": np.abs(signals["lat_accel"]) > float(cfg["max_abs_lat_accel"]),
        "yaw_rate": np.abs(signals["yaw_rate"]) > float(cfg["max_abs_yaw_rate"]),
        "yaw_accel": np.abs(signals["yaw_accel"]) > float(cfg["max_abs_yaw_accel"]),
        "lon_jerk": np.abs(signals["lon_jerk"]) > float(cfg["max_abs_lon_jerk"]),
        "jerk": np.abs(signals["jerk"]) > float(cfg["max_abs_jerk"]),
    }


# ----------------------------------------------------------------------------------------------------
# Plan-R1


def driving_direction_score(route_s, dt: float, cfg: dict[str, Any]) -> float:
    """nuPlan driving-direction compliance from the arc-length track ``route_s [T]``."""
    s = np.asarray(route_s, dtype=np.float64)
    if len(s) < 2:
        return 1.0
    w = max(1, int(round(float(cfg["direction_window_s"]) / dt)))
    worst = 0.0
    for k in range(1, len(s)):
        j0 = max(0, k - w)
        worst = max(worst, float(np.max(s[j0:k]) - s[k]))  # backwards motion within the window
    if worst < float(cfg["direction_ok_m"]):
        return 1.0
    if worst < float(cfg["direction_bad_m"]):
        return 0.5
    return 0.0


def speed_limit_score(speeds, speed_limits, dt: float, cfg: dict[str, Any]) -> float:
    """nuPlan speed-limit compliance: ``max(0, 1 − ∫ overspeed dt / (max_overspeed · duration))``."""
    v = np.asarray(speeds, dtype=np.float64)
    lim = np.asarray(speed_limits, dtype=np.float64)
    if len(v) == 0:
        return 1.0
    over = np.maximum(v - lim, 0.0)
    duration = max(len(v) * dt, dt)
    return float(max(0.0, 1.0 - over.sum() * dt / (float(cfg["max_overspeed_m_s"]) * duration)))


def plan_r1_reward(
    *,
    collided: bool,
    drivable_ok: bool,
    route_s,
    speeds,
    speed_limits,
    comfort_ok: bool,
    min_ttc: float,
    rho: float,
    dt: float,
    params: dict[str, Any],
) -> dict[str, float]:
    """Plan-R1 rule-based reward of one rollout; returns the total and every component."""
    cfg = params["rewards"]["plan_r1"]
    direction = driving_direction_score(route_s, dt, cfg)
    gates = (0.0 if collided else 1.0) * (1.0 if drivable_ok else 0.0) * direction
    terms = {
        "comfort": 1.0 if comfort_ok else 0.0,
        "ttc": 1.0 if min_ttc >= float(cfg["ttc_threshold_s"]) else 0.0,
        "speed_limit": speed_limit_score(speeds, speed_limits, dt, cfg),
        "progress": float(min(max(rho, 0.0), 1.0)),
    }
    weights = {
        "comfort": float(cfg["weight_comfort"]),
        "ttc": float(cfg["weight_ttc"]),
        "speed_limit": float(cfg["weight_speed_limit"]),
        "progress": float(cfg["weight_progress"]),
    }
    soft = sum(weights[k] * terms[k] for k in terms) / sum(weights.values())
    return {"total": float(gates * soft), "gates": float(gates), "direction": direction, **terms}


# ----------------------------------------------------------------------------------------------------
# Quantities of a finished rollout (shared by the outcome, the metrics and the rewards)


def episode_progress(trace: EpisodeTrace, params: dict[str, Any]) -> tuple[float, float, float]:
    """(ego progress m, expert progress m, ρ) along the route over the rollout's planned window."""
    ego = float(trace.route_s[-1] - trace.route_s[0])
    expert = float(trace.expert_s[-1] - trace.expert_s[0])
    rho = progress_ratio(ego, expert, float(params["rewards"]["min_expert_progress_m"]))
    return ego, expert, rho


def plan_speed_profile(trajectory: np.ndarray, plan_dt: float) -> np.ndarray:
    """Mean speed over each interval of an ego-frame plan ``[T, 2]`` (point k at (k+1)·dt, from the
    origin): ``[T]`` m/s, interval k centred at (k + 0.5)·dt after the decision."""
    path = np.vstack([np.zeros((1, 2)), np.asarray(trajectory, dtype=np.float64)])
    return np.linalg.norm(np.diff(path, axis=0), axis=1) / float(plan_dt)


def episode_plan_consistency(trace: EpisodeTrace) -> float:
    """Plan-to-plan consistency: mean |change| (m/s) of the planned speed profile between consecutive
    decisions, compared at the absolute times both plans cover (NaN with fewer than two plans). A
    planner that changes its mind every cycle makes the tracker accelerate and brake in turn."""
    changes = []
    prev = None
    for d in trace.decisions:
        plan_dt = d.info.get("plan_dt") if d.info else None
        if d.trajectory is None or plan_dt is None:
            prev = None
            continue
        v = plan_speed_profile(d.trajectory, plan_dt)
        t = d.step * trace.dt + (np.arange(len(v)) + 0.5) * plan_dt
        if prev is not None:
            pt, pv = prev
            both = (t >= pt[0]) & (t <= pt[-1])
            if both.any():
                changes.append(np.abs(v[both] - np.interp(t[both], pt, pv)))
        prev = (t, v)
    return float(np.concatenate(changes).mean()) if changes else float("nan")


def episode_comfort(trace: EpisodeTrace, params: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-step "any comfort term violated" ``[n]`` and the violations per term."""
    sig = comfort_signals(trace.ego[:, :3], trace.ego[:, 3], trace.dt)
    viol = comfort_violations(sig, params["comfort"])
    any_step = np.zeros(len(trace.ego), bool)
    for v in viol.values():
        any_step |= v
    return any_step, viol


def episode_min_ttc(trace: EpisodeTrace) -> float:
    """``min_t T_t`` over steps 1..L (the start state is the log's); 0 after a collision."""
    if trace.collided:
        return 0.0
    return float(trace.ttc[1:].min()) if len(trace.ttc) > 1 else trace.t_max


# ----------------------------------------------------------------------------------------------------
# The registry

RewardFn = Callable[[EpisodeTrace, dict[str, Any]], float]


def reward_rad2_collision(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """RAD-2 Eq. 13 over the rollout; a collision is the worst margin, ``−T_max``."""
    if trace.collided:
        return -trace.t_max
    return r_coll(trace.ttc[1:], trace.t_max)


def reward_rad2_efficiency(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """RAD-2 Eq. 14 of the rollout's ego progress ρ."""
    cfg = params["rewards"]
    return r_eff(episode_progress(trace, params)[2], float(cfg["rho_low"]), float(cfg["rho_high"]))


def reward_follower_margin(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """``r_follow``: the worst follower margin ``min_t (T^rear_t − T_max)``; ``−T_max`` after a
    collision, as Eq. 13."""
    if trace.collided:
        return -trace.t_max
    return r_coll(trace.rear_ttc[1:], trace.t_max)


def reward_rad2(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """RAD-2's two sequence-level rewards combined with the ``rewards.rad2`` weights."""
    w = params["rewards"]["rad2"]
    return float(w["weight_collision"]) * reward_rad2_collision(trace, params) + float(
        w["weight_efficiency"]) * reward_rad2_efficiency(trace, params)


def reward_rad2_follow(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """RAD-2's reward plus the follower margin, ``rad2 + w_follow · r_follow``."""
    w = float(params["rewards"]["rad2_follow"]["weight_follower"])
    return reward_rad2(trace, params) + w * reward_follower_margin(trace, params)


def plan_r1_terms(trace: EpisodeTrace, params: dict[str, Any]) -> dict[str, float]:
    """Plan-R1's reward of the rollout with every gate and term."""
    any_step, _ = episode_comfort(trace, params)
    return plan_r1_reward(
        collided=trace.collided, drivable_ok=not trace.offroad, route_s=trace.route_s, speeds=trace.ego[:, 3],
        speed_limits=trace.speed_limits, comfort_ok=not any_step.any(), min_ttc=episode_min_ttc(trace),
        rho=episode_progress(trace, params)[2], dt=trace.dt, params=params)


def reward_plan_r1(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    return plan_r1_terms(trace, params)["total"]


def reward_correction_planner(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """CorrectionPlanner's rule reward: progress (capped at 1) without a collision, −1 with one."""
    if trace.collided:
        return -1.0
    return float(min(max(episode_progress(trace, params)[2], 0.0), 1.0))


def reward_laviplan(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """LaViPlan's planning reward: ``−log(1 + ADE) − log(1 + FDE)`` against the log (executed steps)."""
    n = min(len(trace.ego), len(trace.expert_xy))
    if n < 2:
        return 0.0
    err = np.hypot(*(trace.ego[1:n, :2] - trace.expert_xy[1:n]).T)
    return float(-np.log1p(err.mean()) - np.log1p(err[-1]))


# The reward of an episode with an at-fault collision or off the drivable area: below the [0, 1] of every
# other episode of safe_score
SAFE_SCORE_FLOOR = -1.0


def safe_score_terms(trace: EpisodeTrace, params: dict[str, Any]) -> dict[str, float]:
    """``safe_score`` of the rollout with its parts (module docstring): the nuPlan-style score's
    multipliers and terms (:func:`bev_warp_sim.nuplan_score.nuplan_score_terms`) recombined with the TTC
    taken out of the weighted average and made a multiplier, the safety gates as the floor."""
    from bev_warp_sim import nuplan_score as ns  # it imports this module

    cfg = params["rewards"]["safe_score"]
    weights = {"progress": float(cfg["weight_progress"]), "ttc": 0.0,
               "speed_limit": float(cfg["weight_speed_limit"]), "comfort": float(cfg["weight_comfort"])}
    if sum(weights.values()) <= 0.0:
        raise ValueError("rewards.safe_score: the weights sum to 0")
    nu = ns.nuplan_score_terms(trace, params)
    at_fault = bool(trace.at_fault) or nu["no_at_fault_collisions"] < 1.0
    offroad = nu["drivable_area"] < 1.0
    not_at_fault = bool(trace.collided) and not at_fault
    near_miss = ns.episode_min_ttc_before_collision(trace) < float(cfg["near_miss_ttc_s"])
    factor = ((float(cfg["not_at_fault_collision_factor"]) if not_at_fault else 1.0)
              * (float(cfg["near_miss_factor"]) if near_miss else 1.0))
    rest = ns.combine({k: nu[k] for k in ns.MULTIPLIER_TERMS}, nu, weights)
    total = SAFE_SCORE_FLOOR if (at_fault or offroad) else factor * rest
    return {"total": float(total), "at_fault": float(at_fault), "offroad": float(offroad),
            "not_at_fault_collision": float(not_at_fault), "near_miss": float(near_miss),
            "factor": float(factor), "rest": float(rest), "progress": float(nu["progress"]),
            "speed_limit": float(nu["speed_limit"]), "comfort": float(nu["comfort"])}


def reward_safe_score(trace: EpisodeTrace, params: dict[str, Any]) -> float:
    """nuPlan-style gates where no progress outweighs an at-fault collision (module docstring)."""
    return safe_score_terms(trace, params)["total"]


REWARDS: dict[str, RewardFn] = {
    "rad2_collision": reward_rad2_collision,
    "rad2_efficiency": reward_rad2_efficiency,
    "follower_margin": reward_follower_margin,
    "rad2": reward_rad2,
    "rad2_follow": reward_rad2_follow,
    "plan_r1": reward_plan_r1,
    "correction_planner": reward_correction_planner,
    "laviplan": reward_laviplan,
    "safe_score": reward_safe_score,
}


def compute_rewards(trace: EpisodeTrace, params: dict[str, Any], names=None) -> dict[str, float]:
    """Rewards ``names`` (default: every registered one) of a finished rollout."""
    names = list(REWARDS) if names is None else list(names)
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise ValueError(f"rewards: unknown reward(s) {unknown} (choose from {sorted(REWARDS)})")
    return {n: float(REWARDS[n](trace, params)) for n in names}
