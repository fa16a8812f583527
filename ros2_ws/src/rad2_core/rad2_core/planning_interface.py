"""The small planner interface every policy implements (learned or rule-based).

The simulator, the ROS planner node, the replay evaluator and the benchmarks all call ``plan`` the
same way, so a policy can be swapped without touching them (in the spirit of nuPlan's AbstractPlanner).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class PlanResult:
    """One planning cycle's output, everything in the ego frame of the observation.

    candidates: [M, T_plan, 2] (x, y) at times (k+1)*plan_dt; scores: [M] in [0, 1] (NaN when the
    policy does not score); selected: index of the trajectory to execute; timings: stage -> ms.

    Optional, filled by policies that can act stochastically (``Rad2Policy``; defaults elsewhere):
    logits: [M] discriminator logits, scores = sigmoid(logits) (NaN when not scored);
    log_prob: log-probability of ``selected`` under the distribution it was sampled from (NaN when
    selected deterministically); entropy: that distribution's entropy in nats (NaN likewise);
    probs: [M] that distribution; executed: see the field; discriminator_inputs: the unbatched arrays
    the discriminator
    consumed besides the candidates (map_polylines, map_mask, agents, agents_mask, ego_state,
    bev_tokens), so that a trainer can recompute the logits.
    """

    candidates: np.ndarray
    scores: np.ndarray
    selected: int
    plan_dt: float
    timings_ms: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    logits: np.ndarray | None = None
    log_prob: float = float("nan")
    entropy: float = float("nan")
    probs: np.ndarray | None = None
    discriminator_inputs: dict[str, np.ndarray] | None = None
    # [T_plan, 2] what is executed when a rule layer changed the selected candidate (e.g. re-timed to
    # stop at a red light, rad2_planner.traffic_rules); None: the selected candidate as generated
    executed: np.ndarray | None = None

    @property
    def trajectory(self) -> np.ndarray:
        """The [T_plan, 2] trajectory to execute: the selected candidate, as the rule layer left it."""
        return self.candidates[self.selected] if self.executed is None else self.executed


@runtime_checkable
class Planner(Protocol):
    """What a policy offers. ``reset`` is called at the start of each clip/episode.

    Privileged reference policies (expert replay) may read the clip passed to ``reset``; learned
    policies must use only the observation.
    """

    name: str

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None: ...

    def plan(self, observation: Any) -> PlanResult: ...
