"""Longitudinal comfort limits on the executed plan (no ROS, no networks).

The generator imitates drivers whose logged speed profiles are noisy, and each cycle's plan starts
from wherever the new sample puts it; the tracker then meets a plan that asks for 3 m/s^2 from a
standing start, or for a step in acceleration, with a step of its own. Like the velocity smoother that
sits between Autoware's planner and its controller, this stage re-times the executed plan along its
own path (the path is kept, only the timing changes) so that, starting from the ego's speed now:

- the acceleration never exceeds ``max_accel``;
- the acceleration builds up at most at ``max_jerk`` from the ego's present acceleration (from zero
  when the ego is braking, so the limiter never prolongs a braking manoeuvre);
- braking is never limited: where the plan is slower, the re-timed plan is as slow (safety first);
- the plan's speed it follows is the plan's interval means joined by straight lines through the
  intervals' middles, not a step at every point (see :func:`limit_acceleration`).

The re-timed speed is therefore never above the plan's, so the ego is never further along its path
than the plan was at any time: a plan that stops before an obstacle or a stop line still does. The
cost is progress lost to gentler starts.

Before that, :func:`limit_curve_speed` applies the lateral limit of the same smoother (off when
``max_lateral_accel`` is 0, the default): the generator imitates drivers who took junction turns of
4-6 m radius at 7 m/s (the SUMO expert), faster than a car whose steering builds up at
``vehicle.max_steer_rate`` can follow. The plan is slowed along its path wherever its curvature asks for
more than ``max_lateral_accel`` (braked into the curve at ``curve_decel``), never below
``min_curve_speed``. On the bundled turn clips it did not gain progress and cost comfort
(docs/results.md, "Inference-time stages"), hence off. Parameters: ``comfort_limits.*`` in
params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.route_path import RoutePath
from rad2_core.tokens import arc_lengths


@dataclass(frozen=True)
class ComfortLimitParams:
    enabled: bool
    max_accel: float  # m/s^2, largest acceleration of the executed plan
    max_jerk: float  # m/s^3, fastest build-up of acceleration
    step_s: float  # s, integration step of the re-timing
    # the lateral limit (limit_curve_speed); max_lateral_accel 0: no lateral limit
    max_lateral_accel: float = 0.0  # m/s^2, largest v^2 * curvature of the executed plan
    curve_decel: float = 2.0  # m/s^2, braking used to slow down before a curve
    curvature_chord_m: float = 2.0  # m, chord over which the path's heading is measured
    min_curve_speed: float = 2.0  # m/s, the lateral limit never asks for less
    # the generator's own braking (limit_plan_braking, before the rule stages); 0: not limited
    max_plan_decel: float = 0.0  # m/s^2
    # no softer plan corners harder than this (v^2 * curvature); 0: not checked
    plan_braking_curve_accel: float = 0.0  # m/s^2

    def __post_init__(self):
        for name in ("max_lateral_accel", "max_plan_decel", "plan_braking_curve_accel"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0.0:
                raise ValueError(f"comfort_limits.{name}: must be >= 0 (0: off), got {value!r}")
        for name in ("max_accel", "max_jerk", "step_s", "curve_decel", "curvature_chord_m",
                     "min_curve_speed"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"comfort_limits.{name}: must be a positive number, got {value!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ComfortLimitParams:
        from rad2_core.config import require

        c = require(params, "comfort_limits")
        return cls(bool(c["enabled"]), float(c["max_accel"]), float(c["max_jerk"]), float(c["step_s"]),
                   float(c["max_lateral_accel"]), float(c["curve_decel"]), float(c["curvature_chord_m"]),
                   float(c["min_curve_speed"]), float(c["max_plan_decel"]),
                   float(c["plan_braking_curve_accel"]))


def limit_plan_braking(plan: np.ndarray, plan_dt: float, ego_speed: float, max_decel: float,
                       route: np.ndarray | None = None, curve_accel: float = 0.0,
                       chord_m: float = 2.0) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed along its path so that it brakes
    at most at ``max_decel`` (m/s^2, > 0) from the ego's speed now: each interval's mean speed is at
    least the previous one's less ``max_decel``·dt (the first: the mean of braking at ``max_decel`` from
    now). Faster parts are kept. The plan itself when it already brakes within the limit.

    Beyond the plan's end the path goes on along ``route`` ([P >= 2, 2] ego-frame points, from the
    point of it nearest the plan's end), then straight; without a route, straight along the plan's last
    direction. With ``curve_accel`` > 0 no interval is made faster than its path's curvature allows at
    that lateral acceleration (``v^2 · kappa``, curvature over chords of ``chord_m``) unless the plan
    itself was, and none is faster than it can brake from at ``max_decel`` into the next; a plan that
    corners harder than that at its own speeds is kept as it is: the plan's braking for a curve is kept.

    Why: the generator imitates drivers whose logged speeds are noisy and sometimes brakes hard where
    nothing asks for it (where the mapped road ends, say); the tracker passes braking beyond
    ``controller.command.emergency_decel`` without its jerk limit, a jolt each time. This runs before
    the rule stages: the traffic rules and the safety envelope then brake as hard as a stop line or an
    agent needs, so an emergency stop is never softened."""
    if not np.isfinite(max_decel) or max_decel <= 0.0:
        raise ValueError(f"comfort_limits.max_plan_decel: must be a positive number here, got {max_decel!r}")
    pts = np.asarray(plan, np.float64)
    if len(pts) == 0:
        return pts.copy()
    v0 = max(float(ego_speed), 0.0) if np.isfinite(ego_speed) else 0.0
    cum = arc_lengths(np.vstack([np.zeros((1, 2)), pts]))
    own = np.diff(cum) / plan_dt
    step = max_decel * plan_dt
    first = v0 - 0.5 * step if v0 >= step else v0 * v0 / (2.0 * step)  # braking at max_decel from now
    lifted, floor = False, first
    for v in own:
        lifted |= floor > v + 1e-9
        floor = max(max(v, floor) - step, 0.0)
    if not lifted:
        return pts.copy()
    # the path, continued far enough for any re-timing (no interval is faster than v0 or the plan's own)
    path, knots = continued_path(pts, cum, route, max(v0, float(own.max())) * plan_dt * len(own) + 1.0)
    if curve_accel > 0.0:  # the straight tail has no curvature, and would stretch the chord
        stations, kappa = path_curvature(path[:-1] if len(path) > 2 else path, chord_m)
        # a plan that corners harder than curve_accel at its own speeds is braking for that curve:
        # replanned every cycle, even a small lift of its first interval carries the ego into the turn fast
        on_plan = stations < cum[-1]
        at = np.clip(np.searchsorted(cum, stations[on_plan], side="right") - 1, 0, len(own) - 1)
        if np.any(own[at] ** 2 * kappa[on_plan] > curve_accel):
            return pts.copy()
    speeds = own.copy()
    floor, done = first, 0.0
    for k in range(len(own)):
        want = max(own[k], floor)
        if want > own[k] and curve_accel > 0.0:
            near = (stations >= done - chord_m) & (stations <= done + want * plan_dt)
            bend = float(kappa[near].max(initial=0.0))
            if bend > 0.0:
                want = max(own[k], min(want, float(np.sqrt(curve_accel / bend))))
        speeds[k] = want
        done += want * plan_dt
        floor = max(want - step, 0.0)
    # into a curve the softer plan brakes at max_decel at most, or as the plan itself did (never slower)
    for k in range(len(own) - 2, -1, -1):
        speeds[k] = max(own[k], min(speeds[k], speeds[k + 1] + step))
    if np.all(speeds <= own + 1e-9):
        return pts.copy()
    out_s = np.cumsum(speeds) * plan_dt
    x = np.interp(out_s, knots, path[:, 0])
    y = np.interp(out_s, knots, path[:, 1])
    return np.stack([x, y], axis=-1)


def continued_path(pts: np.ndarray, cum: np.ndarray, route: np.ndarray | None,
                    beyond_m: float) -> tuple[np.ndarray, np.ndarray]:
    """(path [P, 2] from the ego's origin through ``pts`` and on, its arc lengths): past the plan's end
    along ``route`` from the point of it nearest that end, then straight for what ``beyond_m`` (m past
    the plan's end) still asks."""
    path = np.vstack([np.zeros((1, 2)), pts])
    keep = np.concatenate([[True], np.diff(cum) > 1e-6])
    path = path[keep]
    route = None if route is None else np.asarray(route, np.float64)
    # a route of coinciding points (a malformed observation) gives no direction: straight on instead
    usable = (route is not None and len(route) >= 2 and bool(np.isfinite(route).all())
              and float(np.ptp(route, axis=0).max()) > 1e-9)
    if usable:
        line = RoutePath(route)
        s_end = float(line.project(path[-1])[0])
        ahead = line.points[line.s0 > s_end + 1.0]
        path = np.vstack([path, ahead])
    knots = arc_lengths(path)
    d = path[-1] - path[-2] if len(path) >= 2 else np.array([1.0, 0.0])
    d = d / max(float(np.linalg.norm(d)), 1e-12)
    extra = max(float(cum[-1] + beyond_m - knots[-1]), 0.0) + 1.0
    path = np.vstack([path, path[-1] + extra * d])
    return path, np.concatenate([knots, [knots[-1] + extra]])


def path_curvature(path: np.ndarray, chord_m: float) -> tuple[np.ndarray, np.ndarray]:
    """``(s, kappa)``: unsigned curvature (1/m) of a path [P, 2] that starts at the ego's origin heading
    along +x, at stations ``s`` along it. The heading is measured over chords of ``chord_m`` or of the
    path's longest segment if that is longer: the generator's point noise makes a per-point curvature
    meaningless, and between a fast plan's points (12 m apart at 25 m/s) the heading is only known at
    the points, so a shorter chord would pile a whole segment's turn onto one station. The first chord's
    heading is compared with the ego's own (a plan that leaves at an angle is a turn too)."""
    cum = arc_lengths(path)
    chord_m = max(float(chord_m), float(np.diff(cum).max(initial=0.0)))
    n = int(cum[-1] // chord_m)
    if n < 1:
        return np.zeros(1), np.zeros(1)
    s = np.arange(n + 1) * chord_m
    x, y = np.interp(s, cum, path[:, 0]), np.interp(s, cum, path[:, 1])
    heading = np.unwrap(np.concatenate([[0.0], np.arctan2(np.diff(y), np.diff(x))]))
    # the turn between consecutive chords, attributed to the station between them
    kappa = np.abs(np.diff(heading)) / chord_m
    return s[:-1], kappa


def limit_curve_speed(plan: np.ndarray, plan_dt: float, p: ComfortLimitParams) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed along its own path so that its
    speed stays within sqrt(max_lateral_accel / curvature) at every station (at least
    ``min_curve_speed``), reached by braking at ``curve_decel`` from further back; elsewhere the plan's
    own speed. The plan itself when the limit never binds or is off (``max_lateral_accel`` 0)."""
    pts = np.asarray(plan, np.float64)
    if p.max_lateral_accel == 0.0:
        return pts.copy()
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)
    stations, kappa = path_curvature(path, p.curvature_chord_m)
    cap = np.sqrt(p.max_lateral_accel / np.maximum(kappa, 1e-9))
    cap = np.maximum(cap, p.min_curve_speed)
    # backwards: the speed from which each later cap can still be reached braking at curve_decel
    for j in range(len(cap) - 2, -1, -1):
        cap[j] = min(cap[j], np.sqrt(cap[j + 1] ** 2 + 2.0 * p.curve_decel * (stations[j + 1] - stations[j])))
    n_per = max(1, int(round(plan_dt / p.step_s)))
    h = plan_dt / n_per
    v_plan = np.repeat(np.diff(cum) / plan_dt, n_per)
    if np.all(v_plan <= np.interp(np.cumsum(v_plan * h), stations, cap, right=cap[-1]) + 1e-9):
        return pts.copy()
    s = np.empty(len(v_plan))
    travelled = 0.0
    for i, v_target in enumerate(v_plan):
        # the cap where the ego is now (stations between chords take the next chord's cap: no overshoot
        # of the braking point by more than one integration step)
        v = min(v_target, float(np.interp(travelled, stations, cap, right=cap[-1])))
        travelled += v * h
        s[i] = travelled
    knot_s = np.minimum(s, np.cumsum(v_plan * h))[n_per - 1 :: n_per]
    x = np.interp(knot_s, cum, path[:, 0])
    y = np.interp(knot_s, cum, path[:, 1])
    return np.stack([x, y], axis=-1)


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
    v_mean = np.diff(cum) / plan_dt
    v_plan = np.repeat(v_mean, n_per)
    # the speed the limiter follows: each interval's mean speed placed at the interval's middle, joined
    # by straight lines, and held before the first middle and after the last (a plan of constant
    # acceleration is followed from its first middle on). Chasing the step of each interval's mean
    # instead drops the acceleration to zero at every knot and rebuilds it at max_jerk, so a plan that
    # accelerates evenly was executed at about half its acceleration. Holding the first mean from the
    # start (rather than extending the line back to it) aims at the first point's speed at once; on the
    # real validation clips and the stress set it lost fewer clips (docs/results.md).
    t_mid = (np.arange(len(v_mean)) + 0.5) * plan_dt
    v_follow = np.interp((np.arange(len(v_plan)) + 1.0) * h, t_mid, v_mean)
    v = max(float(ego_speed), 0.0)
    a = min(max(float(ego_accel), 0.0), p.max_accel)
    s = np.empty(len(v_plan))
    travelled = 0.0
    changed = False
    for i, v_target in enumerate(v_follow):
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
