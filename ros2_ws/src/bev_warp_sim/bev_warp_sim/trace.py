"""Immutable records of a closed-loop rollout: decision points and the finished episode's trace.

The simulator writes nothing into these after creating them (Waymax habit): a :class:`DecisionPoint` is
fixed when its plan is committed, and an :class:`EpisodeTrace` is read off a finished state by
:meth:`bev_warp_sim.simulator.Simulator.trace`. Everything derived from a finished rollout — the
episode outcome (:func:`bev_warp_sim.metrics.episode_outcome`), the rewards
(:data:`bev_warp_sim.rewards.REWARDS`) and the latch intervals of the decision points
(:func:`decision_intervals`) — is a pure function of the trace, so two continuations branched from one
state can never see each other's decisions, results or rewards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def frozen_array(a, dtype=None) -> np.ndarray:
    """A read-only copy-free view (a copy when ``dtype`` converts) so no caller can write into a state."""
    out = np.asarray(a, dtype=dtype)
    if out.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out


@dataclass(frozen=True)
class DecisionPoint:
    """A step where a new plan started a latch interval (a member of the TC-GRPO decision set K_i).

    What RL needs is kept compactly: the candidates, the executed index, its log-probability under the
    behaviour policy and the distribution's entropy, the discriminator's logits and its inputs (map,
    agents, ego state and BEV tokens, tens of kB instead of the 655 kB BEV raster); the ego state and
    acceleration at the decision are enough to re-render the full observation when a trainer needs it.
    """

    step: int
    ego_state: np.ndarray  # [5] bicycle state x, y, yaw, v, delta at the decision
    accel: float  # m/s², last applied acceleration (part of the observed ego state)
    reason: str  # start | latch_done | safety
    selected: int = 0
    trajectory: np.ndarray | None = None  # [T, 2] executed plan, ego frame
    candidates: np.ndarray | None = None  # [M, T, 2]
    scores: np.ndarray | None = None  # [M] sigmoid scores (NaN when not scored)
    # [M] logits selection used (NaN when not scored): the discriminator's, plus κ·consensus prior
    # with planner.discriminator_prior_weight κ > 0
    logits: np.ndarray | None = None
    probs: np.ndarray | None = None  # [M] sampling distribution (None: deterministic selection)
    log_prob: float = float("nan")  # log π_old(selected) of the behaviour policy (NaN: deterministic)
    entropy: float = float("nan")  # entropy of the sampling distribution
    seed: int | None = None  # the planning cycle's seed (noise and sampling)
    discriminator_inputs: dict[str, np.ndarray] | None = None
    observation: Any = None  # the full observation, only when the caller asked to keep it
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeTrace:
    """Everything the outcome, metric and reward functions read about one finished rollout.

    Index ``k`` of the per-step arrays is log step ``start_step + k`` (``k = 0``: the start state).
    ``expert_*`` cover the rollout's planned window ``start_step .. window_end`` of the log.
    """

    clip_id: str
    scenario_kind: str
    dt: float
    t_max: float  # s, T_max of RAD-2 Eq. 12
    start_step: int
    end_step: int  # last simulated log step
    window_end: int  # last log step of the planned window (clip end or max_steps)
    termination: str  # clip_end | route_end | max_steps | collision | offroad
    ego: np.ndarray  # [n, 6] x, y, yaw, v, delta, accel
    ttc: np.ndarray  # [n] T_t
    rear_ttc: np.ndarray  # [n] T^rear_t: the follower's time to collision (safety module)
    route_s: np.ndarray  # [n] ego arc length along the route
    speed_limits: np.ndarray  # [n] m/s at the ego position (inf where the map has none)
    expert_s: np.ndarray  # [w] logged ego arc length along the route over the window
    expert_xy: np.ndarray  # [w, 2] logged ego positions over the window
    collided: bool
    at_fault: bool
    offroad: bool
    collisions: tuple[dict[str, Any], ...] = ()
    decisions: tuple[DecisionPoint, ...] = ()
    # (log step, signal id) of every red stop line on the route the ego's front crossed
    red_light_crossings: tuple[tuple[int, int], ...] = ()

    @property
    def num_steps(self) -> int:
        return int(self.end_step - self.start_step)


@dataclass(frozen=True)
class LatchInterval:
    """The steps a decision's plan was executed for: log steps ``start_step + 1 .. end_step``."""

    start_step: int
    end_step: int
    min_ttc: float  # min T_t over the interval (T_max when it is empty)


def decision_intervals(trace: EpisodeTrace) -> list[LatchInterval]:
    """The latch interval of every decision point: until the next decision, or the end of the rollout."""
    out = []
    steps = [d.step for d in trace.decisions]
    for k, s in enumerate(steps):
        end = steps[k + 1] if k + 1 < len(steps) else trace.end_step
        lo, hi = s + 1 - trace.start_step, end - trace.start_step + 1
        window = trace.ttc[lo:hi]
        min_ttc = float(window.min()) if len(window) else trace.t_max
        out.append(LatchInterval(int(s), int(end), min(min_ttc, trace.t_max)))
    return out
