"""Longitudinal comfort limits on the executed plan (no ROS, no networks).

The generator imitates drivers whose logged speed profiles are noisy, and each cycle's plan starts
from wherever the new sample puts it; the tracker then meets a plan that asks for 3 m/s^2 from a
standing start, or for a step in acceleration, with a step of its own. Like the velocity smoother that
sits between Autoware's planner and its controller, this stage re-times the executed plan along its
own path (the path is kept, only the timing changes) so that, starting from the ego's speed now:

- the acceleration never exceeds ``max_accel``;
- the acceleration builds up at most at ``max_jerk`` from the ego's present acceleration (from zero
  when the ego is braking, so the limiter never prolongs a braking manoeuvre);
- braking is never limited: where the plan is slower, the re-timed plan is as slow (safety first).

The re-timed speed is therefore never above the plan's, so the ego is never further along its path
than the plan was at any time: a plan that stops before an obstacle or a stop line still does. The
cost is progress lost to gentler starts. Parameters: ``comfort_limits.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .tokens import arc_lengths


@dataclass(frozen=True)
class ComfortLimitParams:
    enabled: bool
    max_accel: float  # m/s^2, largest acceleration of the executed plan
    max_jerk: float  # m/s^3, fastest build-up of acceleration
    step_s: float  # s, integration step of the re-timing

    def __post_init__(self):
        for name in ("max_accel", "max_jerk", "step_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"comfort_limits.{name}: must be a positive number, got {value!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ComfortLimitParams:
        from .config import require

        c = require(params, "comfort_limits")
        return cls(bool(c["enabled"]), float(c["max_accel"]), float(c["max_jerk"]), float(c["step_s"]))


def limit_acceleration(plan: np.ndarray, plan_dt: float, ego_speed: float, ego_accel: float,
                       p: ComfortLimitParams) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt from the origin) re-timed along its own
    path within the limits of the module doc; the plan itself when it already is within them."""
    pts = np.asarray(plan, np.float64)
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)  # [T+1], the plan's own progress at the knots
    n_per = max(1, int(round(plan_dt / p.step_s)))
    h = plan_dt / n_per
    # the plan's own speed: constant over each interval, so its integral meets every knot exactly
    v_plan = np.repeat(np.diff(cum) / plan_dt, n_per)
    v = max(float(ego_speed), 0.0)
    a = min(max(float(ego_accel), 0.0), p.max_accel)
    s = np.empty(len(v_plan))
    travelled = 0.0
    changed = False
    for i, v_target in enumerate(v_plan):
        a_allowed = min(p.max_accel, a + p.max_jerk * h)
        v_next = v + a_allowed * h
        if v_target <= v_next:
            v_next = v_target
        else:
            changed = True
        a = max((v_next - v) / h, 0.0)
        travelled += 0.5 * (v + v_next) * h  # trapezoid: the speed ramps within the step
        v = v_next
        s[i] = travelled
    if not changed:
        return pts.copy()
    # never further along than the plan at the same time (the trapezoid may overshoot a drop)
    own = np.concatenate([[0.0], np.cumsum(v_plan * h)])[1:]
    knot_s = np.minimum(s, own)[n_per - 1 :: n_per]
    x = np.interp(knot_s, cum, path[:, 0])
    y = np.interp(knot_s, cum, path[:, 1])
    return np.stack([x, y], axis=-1)
