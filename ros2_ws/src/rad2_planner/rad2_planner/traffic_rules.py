"""Traffic signals as a rule layer between the planner and the tracker (no ROS, no networks).

The learned generator was trained on scenes without signal states, so it cannot know that a light is
red. Like Autoware's traffic-light module, which inserts a stop point into the path it is given, this
layer finds the stop line of a red (or stoppable yellow) signal on the ego's route and limits the
selected plan's progress so that the ego's front stays behind it; at green the limit is gone and the
plan is executed as generated.

- :func:`next_signal_stop` -- (perception side) the nearest red or yellow stop line ahead on the
  route: its distance from the ego's centre and the state, what ``Observation.signal_stop`` carries.
- :func:`allowed_distance` -- (planner side) how far the ego may still travel for it, or None.
- :func:`limit_progress` -- a plan re-timed along its own path so it stops within that distance
  (braking no harder than needed, at least ``comfort_decel``; the path is kept, only progress along it
  is clipped).
- :func:`stop_line_crossings` -- which red stop lines the ego's front crossed between two poses (the
  red-light violation the metrics count as at fault).

Signal states: :data:`rad2_core.lane_map.SIGNAL_RED` etc. An unknown state is not a constraint (logs
without signal states keep today's behaviour); a yellow one is, when the ego can still stop for it
comfortably (otherwise it proceeds: the dilemma zone); a red one always is unless stopping would need
more than ``max_decel`` (then it is too late to stop, and braking hard in the junction is worse).
Parameters: ``traffic_rules.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.lane_map import SIGNAL_RED, SIGNAL_YELLOW
from rad2_core.stop_lines import NO_STOP_M
from rad2_core.tokens import arc_lengths


@dataclass(frozen=True)
class TrafficRuleParams:
    enabled: bool
    stop_margin_m: float  # the ego's front stops this far before the line
    comfort_decel: float  # m/s^2, a yellow is obeyed when stopping needs at most this
    max_decel: float  # m/s^2, a red is obeyed when stopping needs at most this

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrafficRuleParams:
        from rad2_core.config import require

        c = require(params, "traffic_rules")
        return cls(bool(c["enabled"]), float(c["stop_margin_m"]), float(c["comfort_decel"]),
                   float(c["max_decel"]))


def allowed_distance(signal_stop: np.ndarray, ego_speed: float, ego_length: float,
                     p: TrafficRuleParams) -> float | None:
    """How far the ego's centre may still travel for the signal in ``signal_stop`` (see
    :func:`next_signal_stop`), or None when it proceeds: no red/yellow line ahead, a yellow that needs
    more than ``comfort_decel`` to stop for, a red that needs more than ``max_decel`` (too late: the
    ego is in the dilemma zone; both judged against the line itself), or a line the ego's front already
    crossed while moving. Inside the stop margin but before the line, the ego still stops before the
    line (a late stop is still a stop)."""
    if not p.enabled:
        return None
    line, state = float(signal_stop[0]), int(round(float(signal_stop[1])))
    if line >= NO_STOP_M or state not in (SIGNAL_RED, SIGNAL_YELLOW):
        return None
    v = max(float(ego_speed), 0.0)
    to_line = line - 0.5 * float(ego_length)  # the ego's front to the line itself
    target = to_line - p.stop_margin_m
    if target <= 0.0 and v <= 0.5:
        return 0.0  # standing at the line: stay
    if to_line <= 0.0:
        return None  # the front is over the line while moving: clear the junction
    limit = p.comfort_decel if state == SIGNAL_YELLOW else p.max_decel
    if target > 0.0 and v * v / (2.0 * target) <= limit:
        return target  # the normal case: stop with the margin
    # a stop that came late (inside the margin, or the margin no longer reachable within the limit):
    # whether a stop is still possible is judged against the line itself, not the margin (a slow ego
    # a few centimetres from the margin can stop, however large v^2 / (2 * those centimetres) is) ...
    if v * v / (2.0 * to_line) > limit:
        return None
    # ... and it stops as early as the limit allows, before the line
    return min(max(v * v / (2.0 * limit), target, 0.0), to_line)


def limit_progress(plan: np.ndarray, plan_dt: float, ego_speed: float, distance_m: float,
                   comfort_decel: float) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, points at (k+1)·dt from the origin) re-timed so that its progress
    along its own path never exceeds ``distance_m``: at each step the speed is the plan's own or the
    speed from which the remaining distance can still be braked away with max(comfort_decel, the
    deceleration needed from the ego's speed now), whichever is lower."""
    pts = np.asarray(plan, np.float64)
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)
    if distance_m >= cum[-1]:
        return pts.copy()
    stop_at = max(float(distance_m), 0.0)
    decel = max(float(comfort_decel), max(float(ego_speed), 0.0) ** 2 / (2.0 * max(stop_at, 1e-3)))
    own_speed = np.diff(cum) / plan_dt
    s = 0.0
    out_s = np.empty(len(pts))
    for k, v_own in enumerate(own_speed):
        v_brake = np.sqrt(2.0 * decel * max(stop_at - s, 0.0))
        s = min(s + min(v_own, v_brake) * plan_dt, stop_at)
        out_s[k] = s
    x = np.interp(out_s, cum, path[:, 0])
    y = np.interp(out_s, cum, path[:, 1])
    return np.stack([x, y], axis=-1)


__all__ = ["TrafficRuleParams", "allowed_distance", "limit_progress"]
