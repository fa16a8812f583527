"""Mission pace: the speed a mission asks the ego to keep, and the plan re-timed towards it (no ROS, no
networks).

A mission can ask for more than a destination: a benchmark's planning problem (CommonRoad) gives a goal
region with a time window and a speed interval, a fleet operator an arrival time, a driver a set speed.
The learned planner knows none of these: it proposes what the drivers it imitates did in such a scene,
and on the recorded freeway it trained on they mostly drove in slow traffic. Given a free lane it kept
12 m/s where the recorded driver, and the goal, asked for 15-17 m/s: the goal window passed before it
arrived, and recorded vehicles that followed the human's pace ran into it from behind.

:func:`arrival_speed` is the pace that covers the distance left along the route in the time left to
the middle of the goal window. The stage (:class:`rad2_planner.stages.MissionPaceStage`) re-times the
selected plan towards that speed: faster along its path and the route (at ``accel``, no faster in a bend
than ``curve_accel`` allows) only where the faster plan, continued to ``horizon_s``, meets no agent
ahead extrapolated at constant velocity and stays on the drivable area; slower along the plan's own
path (at ``decel``). Within ``tolerance_m_s`` of the pace nothing changes. The later stages apply as to
any plan: a red signal still stops it, the safety envelope still keeps it behind a vehicle ahead, the
comfort limits still bound it. Without a mission speed (NaN) the stage does nothing. Parameters:
``mission_pace.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MissionPaceParams:
    enabled: bool
    accel: float  # m/s^2, towards a faster pace
    decel: float  # m/s^2, towards a slower one
    curve_accel: float  # m/s^2, the faster plan's largest v^2 * curvature
    horizon_s: float  # s, the faster plan must meet no agent ahead until then
    tolerance_m_s: float  # m/s, an ego and a plan this close to the pace are left alone
    min_gain_m: float  # m, a plan whose end moves by less than this is kept
    min_time_s: float  # s, with less time left to the goal window's middle, hold the goal's speed instead
    join_margin_m: float  # m, bends this close to where the plan's end joins the route are not looked at

    def __post_init__(self):
        for name in ("accel", "decel", "curve_accel", "horizon_s", "min_time_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"mission_pace.{name}: must be a positive number, got {value!r}")
        for name in ("tolerance_m_s", "min_gain_m", "join_margin_m"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0.0:
                raise ValueError(f"mission_pace.{name}: must be a number >= 0, got {value!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MissionPaceParams:
        from rad2_core.config import require

        c = require(params, "mission_pace")
        return cls(bool(c["enabled"]), float(c["accel"]), float(c["decel"]), float(c["curve_accel"]),
                   float(c["horizon_s"]), float(c["tolerance_m_s"]), float(c["min_gain_m"]),
                   float(c["min_time_s"]), float(c["join_margin_m"]))


def mission_speed_fault(value: float, max_speed: float = float("inf")) -> str | None:
    """Why ``value`` cannot be a mission speed (None: it can; NaN means "no mission speed" and is fine):
    the planner never drives towards a negative, infinite or faster-than-the-vehicle speed."""
    v = float(value)
    if np.isnan(v):
        return None
    if not np.isfinite(v) or v < 0.0:
        return f"value {v!r} is not a speed >= 0 (NaN: none)"
    if v > max_speed:
        return f"value {v!r} is above the vehicle's top speed {max_speed:g} m/s"
    return None


def arrival_speed(distance_m: float, time_left_s: float, goal_speed: tuple[float, float] | None,
                  max_speed: float, min_time_s: float) -> float:
    """The speed (m/s) that covers ``distance_m`` along the route in ``time_left_s`` (to the middle of
    the goal's time window), within [0, ``max_speed``]. With less than ``min_time_s`` left (or the window
    passed) the middle of ``goal_speed`` (lo, hi) when the goal has one, else NaN (no pace: the planner
    drives as it would)."""
    if not (np.isfinite(distance_m) and np.isfinite(time_left_s)):
        return float("nan")
    if time_left_s < min_time_s:
        if goal_speed is None or not all(np.isfinite(goal_speed)):
            return float("nan")
        return float(np.clip(0.5 * (goal_speed[0] + goal_speed[1]), 0.0, max_speed))
    return float(np.clip(max(distance_m, 0.0) / time_left_s, 0.0, max_speed))
