"""Longitudinal comfort limits on the executed plan (no ROS, no networks).

The generator imitates drivers whose logged speed profiles are noisy, and each cycle's plan starts
from wherever the new sample puts it; the tracker then meets a plan that asks for 3 m/s^2 from a
standing start, or for a step in acceleration, with a step of its own. Like the velocity smoother that
sits between Autoware's planner and its controller, this stage re-times the executed plan along its
own path (the path is kept, only the timing changes). The plan's speed over time is the derivative of
the monotone cubic through its progress at its points (the curve the tracker's reference follows),
starting from the ego's speed now; the re-timed speed follows it, except that:

- the acceleration never exceeds ``max_accel``;
- the acceleration builds up at most at ``max_jerk`` from the ego's present acceleration (from zero
  when the ego is braking, so the limiter never prolongs a braking manoeuvre); accelerations up to
  ``free_accel`` are allowed at once. Without that allowance the stage would follow every small dip
  of a noisy plan at once (braking is never limited) but every small rise only slowly, and the ego
  would drift below the plan's speed cycle after cycle;
- braking is never limited: where the plan is slower, the re-timed plan is as slow (safety first).

The re-timed speed is therefore never above the plan's, and the re-timed points are never further
along the path than the plan's points at the same times (clamped there): a plan that stops before an
obstacle or a stop line still does. The cost is progress lost to gentler starts.
Parameters: ``comfort_limits.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .control.reference import _hermite, _pchip_slopes
from .tokens import arc_lengths


@dataclass(frozen=True)
class ComfortLimitParams:
    enabled: bool
    max_accel: float  # m/s^2, largest acceleration of the executed plan
    max_jerk: float  # m/s^3, fastest build-up of acceleration
    step_s: float  # s, integration step of the re-timing
    free_accel: float = 0.0  # m/s^2, acceleration allowed at once (no build-up), at most max_accel

    def __post_init__(self):
        if not np.isfinite(self.free_accel) or not 0.0 <= self.free_accel <= self.max_accel:
            raise ValueError(f"comfort_limits.free_accel: must be within [0, max_accel={self.max_accel}], "
                             f"got {self.free_accel!r}")
        for name in ("max_accel", "max_jerk", "step_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"comfort_limits.{name}: must be a positive number, got {value!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ComfortLimitParams:
        from .config import require

        c = require(params, "comfort_limits")
        return cls(bool(c["enabled"]), float(c["max_accel"]), float(c["max_jerk"]), float(c["step_s"]),
                   float(c["free_accel"]))


def limit_acceleration(plan: np.ndarray, plan_dt: float, ego_speed: float, ego_accel: float,
                       p: ComfortLimitParams) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt from the origin) re-timed along its own
    path within the limits of the module doc; the plan itself when it already is within them."""
    pts = np.asarray(plan, np.float64)
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)  # [T+1], the plan's own progress at the knots
    n_per = max(1, int(round(plan_dt / p.step_s)))
    h = plan_dt / n_per
    v0 = max(float(ego_speed), 0.0)
    # the plan's own speed over time: the derivative of the monotone cubic through its progress at the
    # knots (as the tracker's reference interpolates the points), starting from the ego's speed
    knots = cum[None, :, None]
    slopes = _pchip_slopes(knots, plan_dt)
    slopes[0, 0, 0] = v0
    t = (np.arange(len(pts) * n_per) + 1.0) * h
    v_plan = np.maximum(_hermite(knots, slopes, plan_dt, t[None])[1][0, :, 0], 0.0)
    v = v0
    a = min(max(float(ego_accel), 0.0), p.max_accel)
    s = np.empty(len(v_plan))
    travelled = 0.0
    changed = False
    for i, v_target in enumerate(v_plan):
        a_allowed = min(p.max_accel, max(a + p.max_jerk * h, p.free_accel))
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
    # never further along than the plan at its knots
    knot_s = np.minimum(s[n_per - 1 :: n_per], cum[1:])
    x = np.interp(knot_s, cum, path[:, 0])
    y = np.interp(knot_s, cum, path[:, 1])
    return np.stack([x, y], axis=-1)
