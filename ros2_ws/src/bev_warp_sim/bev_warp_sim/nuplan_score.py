"""A nuPlan-style closed-loop score (CLS) of one episode, a pure function of its :class:`EpisodeTrace`.

nuPlan scores a driven scenario as ``Π multipliers × Σ_j w_j s_j / Σ_j w_j`` (nuplan-devkit,
``docs/nuplan_metrics_aggeregation.md`` and ``nuplan/planning/metrics/evaluation_metrics/common/``):

- multipliers: **no at-fault collisions** (0 after an at-fault collision with a vehicle or a vulnerable
  road user; with objects ``max(0, 1 − n / (max_object_collisions + 1))``, i.e. 0.5 for one, 0 for two),
  **drivable-area compliance** (0/1), **driving-direction compliance** (the worst movement against the
  driving direction within a ``direction_window_s`` window: below ``direction_ok_m`` 1, below
  ``direction_bad_m`` 0.5, else 0) and **making progress** (0 when the progress ratio below is under
  ``min_progress_ratio``);
- weighted terms: **ego progress** along the expert route (``min(1, max(p_ego, θ) / max(p_expert, θ))``,
  0 when the ego went back more than θ = ``score_progress_threshold_m``; weight 5), **TTC within bound**
  (1 when the time to collision never fell below ``least_min_ttc_s``; weight 5), **speed-limit
  compliance** (``max(0, 1 − ∫ overspeed dt / (max_overspeed_m_s · duration))``; weight 4) and
  **comfort** (1 when no nuPlan comfort bound of the ``comfort`` block is exceeded; weight 2).

What the episode records allow, and where this differs from nuPlan:

- at fault: the simulator's attribution (:func:`bev_warp_sim.safety.classify_collision`: contact
  zones, a stopped ego is never at fault, a red light makes the ego at fault) instead of nuPlan's
  collision types (front / stopped track / lateral while in several lanes); agent type ``other``
  counts as an object. An episode that ends at its first collision (``sim.terminate_on_collision``)
  records at most the collisions of that step;
- drivable area: the simulator's off-road flag, the box centre outside the drivable polygons by more
  than ``sim.offroad_margin_m``, where nuPlan checks the box corners with a 0.3 m tolerance;
- driving direction: the movement along the route polyline (the records hold the ego's arc length
  along the route, not the lane it occupies), where nuPlan measures along the baseline of the lane
  or connector the ego is in; leaving the route sideways is not seen;
- progress: arc length along the route polyline over the rollout against the log's over the planned
  window (an episode that ends early keeps what it made), where nuPlan follows the expert's roadblocks;
- TTC: the simulator's ``T_t`` (ego at constant speed and yaw rate against the logged agent futures,
  horizon ``ttc.t_max``, agents behind the ego left out, a stationary ego excluded), over the steps
  before the first collision (nuPlan drops collided tracks); nuPlan projects both at constant velocity
  over 3 s and counts lateral tracks only while the ego is in several lanes;
- speed limit: the map's limit at the ego position each step (none: no constraint);
- comfort: the per-step bounds of :func:`bev_warp_sim.rewards.episode_comfort` (finite differences
  of the driven path), where nuPlan filters the signals before comparing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE

from bev_warp_sim import rewards as rw
from bev_warp_sim.trace import EpisodeTrace

MULTIPLIER_TERMS = ("no_at_fault_collisions", "drivable_area", "driving_direction", "making_progress")
WEIGHTED_TERMS = ("progress", "ttc", "speed_limit", "comfort")
# Collisions with these are scored 0 at once; any other agent type is an object
_ROAD_USERS = (AGENT_VEHICLE, AGENT_PEDESTRIAN, AGENT_CYCLIST)


@dataclass(frozen=True)
class NuplanScoreConfig:
    """The ``nuplan_score`` block of params/sim.yaml."""

    weight_progress: float
    weight_ttc: float
    weight_speed_limit: float
    weight_comfort: float
    least_min_ttc_s: float
    max_overspeed_m_s: float
    direction_window_s: float
    direction_ok_m: float
    direction_bad_m: float
    score_progress_threshold_m: float
    min_progress_ratio: float
    max_object_collisions: int

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> NuplanScoreConfig:
        from rad2_core.config import require

        block = require(params, "nuplan_score")
        values = {}
        for name, kind in cls.__annotations__.items():
            if name not in block:
                raise ValueError(f"missing parameter nuplan_score.{name}")
            values[name] = int(block[name]) if kind == "int" else float(block[name])
        cfg = cls(**values)
        if cfg.direction_ok_m > cfg.direction_bad_m:
            raise ValueError(f"nuplan_score.direction_ok_m {cfg.direction_ok_m} exceeds direction_bad_m "
                             f"{cfg.direction_bad_m}")
        if cfg.weight_progress + cfg.weight_ttc + cfg.weight_speed_limit + cfg.weight_comfort <= 0.0:
            raise ValueError("nuplan_score: the weights sum to 0")
        return cfg

    @property
    def weights(self) -> dict[str, float]:
        return {"progress": self.weight_progress, "ttc": self.weight_ttc,
                "speed_limit": self.weight_speed_limit, "comfort": self.weight_comfort}


def at_fault_collision_multiplier(collisions, max_object_collisions: int) -> float:
    """0 after an at-fault collision with a vehicle, pedestrian or cyclist; otherwise
    ``max(0, 1 − n_objects / (max_object_collisions + 1))`` over the at-fault collisions with objects."""
    at_fault = [c for c in collisions if c.get("at_fault")]
    if any(int(c.get("agent_type", AGENT_VEHICLE)) in _ROAD_USERS for c in at_fault):
        return 0.0
    return float(max(0.0, 1.0 - len(at_fault) / (max_object_collisions + 1)))


def driving_direction_multiplier(route_s, dt: float, window_s: float, ok_m: float, bad_m: float) -> float:
    """nuPlan's driving-direction compliance: the most negative net movement along the driving direction
    over any window of ``window_s`` (the sum of per-step progress over the last n steps)."""
    s = np.asarray(route_s, dtype=np.float64)
    if len(s) < 2:
        return 1.0
    n = max(1, int(round(window_s / dt)))
    back = s[np.maximum(np.arange(len(s)) - n, 0)]  # the arc length n steps earlier
    worst = max(0.0, float(-np.min(s - back)))
    if worst < ok_m:
        return 1.0
    if worst < bad_m:
        return 0.5
    return 0.0


def progress_ratio(ego_m: float, expert_m: float, threshold_m: float) -> float:
    """nuPlan's ego-to-expert progress ratio along the route (see the module docstring)."""
    if ego_m < -threshold_m:
        return 0.0
    return float(min(1.0, max(ego_m, threshold_m) / max(expert_m, threshold_m)))


def episode_min_ttc_before_collision(trace: EpisodeTrace) -> float:
    """``min T_t`` over steps 1.. up to (not including) the first collision (``ttc.t_max`` when none)."""
    end = len(trace.ttc)
    if trace.collisions:
        end = min(end, min(int(c["step"]) for c in trace.collisions) - trace.start_step)
    window = np.asarray(trace.ttc[1:end], dtype=np.float64)
    return float(window.min()) if len(window) else float(trace.t_max)


def nuplan_score_terms(trace: EpisodeTrace, params: dict[str, Any]) -> dict[str, float]:
    """Every multiplier and weighted term of the episode, and ``score`` (see the module docstring)."""
    cfg = NuplanScoreConfig.from_params(params)
    ego_m, expert_m, _ = rw.episode_progress(trace, params)
    ratio = progress_ratio(ego_m, expert_m, cfg.score_progress_threshold_m)
    comfort_any, _ = rw.episode_comfort(trace, params)
    multipliers = {
        "no_at_fault_collisions": at_fault_collision_multiplier(trace.collisions, cfg.max_object_collisions),
        "drivable_area": 0.0 if trace.offroad else 1.0,
        "driving_direction": driving_direction_multiplier(
            trace.route_s, trace.dt, cfg.direction_window_s, cfg.direction_ok_m, cfg.direction_bad_m),
        "making_progress": 1.0 if ratio >= cfg.min_progress_ratio else 0.0,
    }
    terms = {
        "progress": ratio,
        "ttc": 1.0 if episode_min_ttc_before_collision(trace) >= cfg.least_min_ttc_s else 0.0,
        "speed_limit": rw.speed_limit_score(trace.ego[:, 3], trace.speed_limits, trace.dt,
                                            {"max_overspeed_m_s": cfg.max_overspeed_m_s}),
        "comfort": 0.0 if comfort_any.any() else 1.0,
    }
    return {**multipliers, **terms, "score": combine(multipliers, terms, cfg.weights)}


def combine(multipliers: dict[str, float], terms: dict[str, float], weights: dict[str, float]) -> float:
    """``Π multipliers × Σ w_j s_j / Σ w_j``."""
    gate = float(np.prod([multipliers[k] for k in MULTIPLIER_TERMS]))
    total_w = sum(weights[k] for k in WEIGHTED_TERMS)
    return gate * sum(weights[k] * terms[k] for k in WEIGHTED_TERMS) / total_w
