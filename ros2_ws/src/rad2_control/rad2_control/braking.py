"""How hard a tracking command may brake, and why: the plan's own demand against the tracking error.

The iLQR tracker brakes to put the vehicle back on its reference. Most of the time that is the plan's
own braking, but after a fault it is not: a pose that jumped forward when frozen odometry resumed, a
plan anchored at a stale pose, or a fallback stop timed while the vehicle did something else put the
vehicle ahead of (or faster than) a reference that itself asks for no braking at all, and the tracker
would stand on the brakes to let it catch up. That braking protects nothing: the plan was not made
for the state the vehicle is in, and the planner replans from the true state within one cycle.

So a command brakes beyond the comfort deceleration only as hard as the plan it tracks brakes itself
(:func:`plan_acceleration`, from the reference's own speed profile over a short window), and in the
recovery after a fault stop no harder than the minimal-risk stop did, unless a plan made after the
fault asks for more (a hazard the planner saw in the true state). Every command beyond the comfort
limit says which plan demands it; beyond ``emergency_decel`` it is flagged as an emergency. A
constant-speed plan therefore can never produce a command below ``-comfort_decel``.

Pure functions of numbers (no ROS); the controller node calls them on every tracking command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BrakingLimits:
    """``controller.node`` values: all decelerations positive, m/s^2."""

    comfort_decel: float  # beyond this a command carries the name of what demands it
    emergency_decel: float  # beyond this it is also flagged emergency_stop
    stop_decel: float  # the minimal-risk stop's braking: the bound of a recovery after a fault
    demand_window_s: float  # how far ahead the plan's own braking is read

    def __post_init__(self) -> None:
        for name in ("comfort_decel", "emergency_decel", "stop_decel", "demand_window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"BrakingLimits.{name} must be a positive number, got {value!r}")

    @classmethod
    def from_params(cls, node: dict) -> BrakingLimits:
        return cls(float(node["comfort_decel"]), float(node["emergency_decel"]), float(node["stop_decel"]),
                   float(node["plan_demand_window_s"]))


@dataclass(frozen=True)
class BrakingDecision:
    accel: float  # the command's acceleration, m/s^2
    reason: str  # "" within comfort; else what demands the braking
    emergency: bool  # emergency_stop flag
    bounded: bool  # the tracker asked for harder braking than this allows


def plan_acceleration(ref_speed: np.ndarray, dt: float, window_s: float) -> float:
    """The hardest acceleration (most negative, m/s^2; 0 for a plan that does not brake) the plan asks of
    itself over its first ``window_s``: step-to-step changes of the reference speed ``ref_speed`` [H]
    (samples ``dt`` apart, from the next step on). Read from the plan's speeds, never from the
    vehicle's: it is what the planner wants, not how far the vehicle is from it."""
    v = np.asarray(ref_speed, dtype=np.float64).reshape(-1)
    if not (math.isfinite(dt) and dt > 0.0):
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    steps = max(1, int(round(window_s / dt)))
    v = v[: steps + 1]
    if len(v) < 2 or not np.isfinite(v).all():
        return 0.0
    return float(min(0.0, np.min(np.diff(v)) / dt))


def bound_braking(accel: float, plan_accel: float, limits: BrakingLimits, *, plan_label: str,
                  recovering: str = "", plan_after_fault: bool = True) -> BrakingDecision:
    """The command for the tracker's ``accel`` given the plan's own ``plan_accel``
    (:func:`plan_acceleration`).

    ``recovering``: the fault whose stop this command follows ("" when none is recent); ``plan_after_fault``:
    whether the plan tracked was made after that stop ended (a plan from before it, or a fallback made
    during it, is no evidence of a hazard now). ``plan_label`` names the plan in the reason
    ("the plan stamped 12.300 s").
    """
    accel, plan_accel = float(accel), min(0.0, float(plan_accel))
    if not math.isfinite(accel):
        raise ValueError(f"accel must be finite, got {accel!r}")
    if not math.isfinite(plan_accel):
        plan_accel = 0.0
    hazard = not recovering or plan_after_fault
    base = limits.stop_decel if recovering else limits.comfort_decel
    floor = min(-base, plan_accel) if hazard else -base
    bounded = accel < floor
    accel = max(accel, floor)
    if accel >= -limits.comfort_decel and not (recovering and accel < -limits.stop_decel):
        return BrakingDecision(accel, "", False, bounded)
    braking = f"braking {accel:.2f} m/s^2"
    if recovering:
        # only a fresh plan's own braking goes below the minimal-risk stop here (what demands it first:
        # readers cut long reasons)
        why = (f"{braking}, harder than the minimal-risk stop's -{limits.stop_decel:g} m/s^2: {plan_label}, "
               f"made after the fault cleared, brakes at {plan_accel:.2f} m/s^2 itself (a hazard seen in the "
               f"state of now); recovering after a fault stop ({recovering[:300]})")
    else:
        why = (f"{braking} beyond the comfort limit -{limits.comfort_decel:g} m/s^2: {plan_label} "
               f"brakes at {plan_accel:.2f} m/s^2 itself")
    return BrakingDecision(accel, why, accel < -limits.emergency_decel, bounded)

