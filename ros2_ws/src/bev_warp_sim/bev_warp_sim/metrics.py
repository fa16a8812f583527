"""Closed-loop metrics over a split (RAD-2 §4 Metrics), computed from per-episode results.

Per clip (episode):
- collided / at_fault: any ego-agent box overlap during the episode / any attributed to the ego
  (:func:`bev_warp_sim.safety.classify_collision`);
- min_ttc: ``min_t T_t`` (RAD-2 Eq. 12, capped at ``ttc.t_max``; 0 on a collision);
- rho: ego progress along the route over the episode's *planned* window (start step to the clip end
  or ``sim.max_steps``) relative to the expert's progress over the same window — an episode that
  ends early (collision, off-road) keeps the progress it made, so it falls short of 1;
- comfort: per-step nuPlan comfort violations of the driven path;
- score: a nuPlan-style closed-loop score (:mod:`bev_warp_sim.nuplan_score`; its terms in score_terms).

Over a split:
- **CR**: fraction of clips with a collision; **AF-CR**: fraction with an at-fault collision;
- **Safety@1 / Safety@2**: fraction of clips whose min TTC stays above 1 s / 2 s (strictly);
- **EP-Mean**: mean of ``min(ρ, 1)``; **EP@1.0 / EP@0.9**: fraction of clips with
  ``ρ ≥ 1.0 − tol`` / ``ρ ≥ 0.9 − tol`` (``metrics.ep_complete_tolerance`` absorbs the tracking error
  of a replay that completes the route);
- comfort: fraction of clips with any violation, and mean fraction of violating steps;
- red_light_rate: fraction of clips where the ego's front crossed a red stop line on its route;
- score: the mean per-clip nuPlan-style score (nuPlan's final score is this mean);
- plan_speed_change_m_s: plan-to-plan consistency, the mean change of the planned speed profile
  between consecutive planning cycles at the times both cover.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bev_warp_sim import rewards as rw
from bev_warp_sim.nuplan_score import nuplan_score_terms
from bev_warp_sim.trace import EpisodeTrace

SAFETY_COLUMNS = ("CR", "AF-CR", "Safety@1", "Safety@2")
EFFICIENCY_COLUMNS = ("EP-Mean", "EP@1.0", "EP@0.9")
PAPER_COLUMNS = SAFETY_COLUMNS + EFFICIENCY_COLUMNS


@dataclass
class EpisodeResult:
    """Outcome of one closed-loop episode (JSON-able through :meth:`as_dict`)."""

    clip_id: str
    scenario_kind: str
    start_step: int
    end_step: int
    num_steps: int
    termination: str  # clip_end | route_end | collision | offroad | max_steps
    collided: bool
    at_fault: bool
    offroad: bool
    min_ttc: float
    rho: float
    ego_progress_m: float
    expert_progress_m: float
    comfort_violation_rate: float
    comfort_any: bool
    r_coll: float
    r_eff: float
    plan_r1: float
    collisions: list[dict[str, Any]] = field(default_factory=list)
    comfort_by_term: dict[str, float] = field(default_factory=dict)
    num_decisions: int = 0
    red_light_violations: int = 0  # red stop lines on the route the ego's front crossed
    plan_speed_change: float = float("nan")  # m/s, mean change of the planned speed between cycles
    score: float = float("nan")  # nuPlan-style closed-loop score (NaN: not computed)
    score_terms: dict[str, float] = field(default_factory=dict)  # its multipliers and weighted terms

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in d.items()}


def episode_outcome(trace: EpisodeTrace, params: dict[str, Any]) -> EpisodeResult:
    """The :class:`EpisodeResult` of a finished rollout: a pure function of its trace."""
    ego_prog, exp_prog, rho = rw.episode_progress(trace, params)
    any_step, viol = rw.episode_comfort(trace, params)
    terms = nuplan_score_terms(trace, params)
    return EpisodeResult(
        clip_id=trace.clip_id, scenario_kind=trace.scenario_kind, start_step=trace.start_step,
        end_step=trace.end_step, num_steps=trace.num_steps, termination=trace.termination,
        collided=trace.collided, at_fault=trace.at_fault, offroad=trace.offroad,
        min_ttc=rw.episode_min_ttc(trace), rho=float(rho), ego_progress_m=ego_prog,
        expert_progress_m=exp_prog,
        comfort_violation_rate=float(any_step.mean()) if len(any_step) else 0.0,
        comfort_any=bool(any_step.any()), r_coll=rw.reward_rad2_collision(trace, params),
        r_eff=rw.reward_rad2_efficiency(trace, params), plan_r1=rw.reward_plan_r1(trace, params),
        collisions=[dict(c) for c in trace.collisions],
        comfort_by_term={k: float(v.mean()) for k, v in viol.items()},
        num_decisions=len(trace.decisions),
        red_light_violations=len(trace.red_light_crossings),
        plan_speed_change=rw.episode_plan_consistency(trace),
        score=terms["score"], score_terms=terms,
    )


def _nanmean(values: list[float]) -> float:
    arr = np.asarray(values, dtype=float)
    return float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")


def aggregate(results: list[EpisodeResult], params: dict[str, Any]) -> dict[str, float]:
    """The paper's metrics (plus comfort) over a list of episode results."""
    if not results:
        raise ValueError("results: no episodes to aggregate")
    cfg = params["metrics"]
    tol = float(cfg["ep_complete_tolerance"])
    s1, s2 = (float(v) for v in cfg["safety_thresholds_s"])
    e1, e2 = (float(v) for v in cfg["ep_thresholds"])
    collided = np.array([r.collided for r in results], dtype=float)
    at_fault = np.array([r.at_fault for r in results], dtype=float)
    ttc = np.array([r.min_ttc for r in results], dtype=float)
    rho = np.array([r.rho for r in results], dtype=float)
    out = {
        "CR": float(collided.mean()),
        "AF-CR": float(at_fault.mean()),
        "Safety@1": float((ttc > s1).mean()),
        "Safety@2": float((ttc > s2).mean()),
        "EP-Mean": float(np.clip(rho, 0.0, 1.0).mean()),
        "EP@1.0": float((rho >= e1 - tol).mean()),
        "EP@0.9": float((rho >= e2 - tol).mean()),
        "comfort_violation_clips": float(np.mean([r.comfort_any for r in results])),
        "comfort_violation_steps": float(np.mean([r.comfort_violation_rate for r in results])),
        "offroad_rate": float(np.mean([r.offroad for r in results])),
        "red_light_rate": float(np.mean([r.red_light_violations > 0 for r in results])),
        # NaN for results read back from before the score existed
        "score": _nanmean([r.score for r in results]),
        # NaN for policies without plans (log replay): nanmean over those that have them
        "plan_speed_change_m_s": _nanmean([r.plan_speed_change for r in results]),
        "mean_r_coll": float(np.mean([r.r_coll for r in results])),
        "mean_r_eff": float(np.mean([r.r_eff for r in results])),
        "mean_plan_r1": float(np.mean([r.plan_r1 for r in results])),
        "num_clips": float(len(results)),
    }
    return out


def worst_results(results: list[EpisodeResult], n: int) -> list[EpisodeResult]:
    """The ``n`` worst episodes: at-fault collisions first, then collisions, then lowest TTC and ρ."""
    def key(r: EpisodeResult):
        return (not r.at_fault, not r.collided, not r.offroad, r.min_ttc, min(r.rho, 1.0))

    return sorted(results, key=key)[: max(0, int(n))]
