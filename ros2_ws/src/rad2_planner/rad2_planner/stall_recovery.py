"""Stall recovery: two ways an imitation planner stands still on a free road, and what this stage does
instead (no ROS, no networks).

1. **A start that never gets going.** From a standing or slow ego the generator proposes plans that
   hold the ego's speed (or wait) for a second or so and accelerate afterwards: what the SUMO drivers
   it imitates did at junctions and in queues, and what it also does behind parked cars in real logs.
   Replanned every cycle, such a plan is only ever executed in its first tenth of a second, so the ego
   creeps (an Argoverse 2 street with a parked row: 0.5 m/s for 4 s while the logged driver left at
   9 m/s) or never sets off. The same shape at speed makes it lag: leaving a corner at 3-8 m/s it
   took 6 s to reach the speed the logged driver reached in 3 s, and on the SUMO free-road clips of
   ``data/eval_efficiency`` that cost most of the progress it lost (docs/results.md).
   :func:`even_start` re-times the selected plan along its own path so that the ego accelerates evenly
   from now to the plan's speed at ``start_horizon_s`` (below ``start_speed``: by default at every
   speed of a street); the plan's later speeds follow, and it never goes past the plan's own end. A
   plan that is not faster at ``start_horizon_s`` than the ego now (cruising, braking) is left alone.
   Where the wait was for a reason the later stages know (a red signal, an agent in the path), they
   still stop it. (Skipping the initial dwell outright instead was measured to cost comfort: the start
   is sudden.)
2. **A plan that asks for reversing.** The generator also imitates drivers who take junction corners on
   4-6 m radii at 7 m/s. A car whose steering builds up at ``vehicle.max_steer_rate`` cannot follow such
   a corner; the tracker brakes, the ego comes to stand a few metres before the corner, and from there
   the candidates lead backwards (the outgoing road is beside or behind its shoulder). The vehicle has
   no reverse, so the ego stands still for good. Such a plan (a point more than
   ``reverse_tolerance_m`` behind the ego) is replaced by :func:`recovery_plan`: the route followed
   forwards by a kinematic bicycle within the vehicle's limits (steering angle and rate), steered by
   pure pursuit, its speed brought towards ``speed`` at ``accel`` (or braked towards it at ``decel``).
   Variants are tried in order, each first driving ``straight_m`` ahead with the wheels straightened
   (an ego standing before a corner it can no longer take on its tightest circle reaches it by pulling
   into the junction first), then pursuing the route at each look-ahead of ``lookahead_m`` (a short one
   keeps close to the route, a long one cuts the corner); the first plan whose every point lies on the
   drivable area of the observation's BEV is used. When none does, the plan stays as it was.

3. **A crawl on a clear road.** Trained on recorded traffic where a slow car beside the ego meant a
   slow lane for it too (NGSIM's congested freeway and arterial), the generator keeps a slow ego slow
   beside cars at the kerb: on an Argoverse 2 street, after braking for a car pulling out, it stayed at
   about 1 m/s with nothing ahead in its lane while the logged driver went on at 5-9 m/s.
   :func:`clear_road_start`: below ``clear_road_below``, a plan that gains less than the ego would by
   accelerating at ``accel`` towards ``clear_road_speed`` is re-timed to do so along its own path and
   then the route (never slower than the plan at any point, never faster in a bend than
   ``clear_road_curve_accel`` allows; with a bend ahead that the ego is already too fast for, the plan
   stays as it is: on the SUMO stress set a 5.5 m/s plan braking for a sharp turn was held at 5.5 m/s
   and left the road). The stage keeps it only where that plan, continued to
   ``clear_road_horizon_s``, overlaps no observed agent extrapolated at constant velocity and keeps
   every point on the BEV's drivable area, and the ego's box on it over the drivable-area check's
   horizon; else the plan stays as it was.

The later stages apply to the result as to any plan: a red signal still stops it, the safety envelope
stops it behind agents in its path, and the comfort limits slow it through the corner and soften its
start. Parameters: ``stall_recovery.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.bev import BevConfig, ego_to_pixel_affine
from rad2_core.bicycle import VehicleParams, clamp_controls, step
from rad2_core.route_path import RoutePath
from rad2_core.tokens import arc_lengths

from rad2_planner.comfort_limits import continued_path, path_curvature


@dataclass(frozen=True)
class StallRecoveryParams:
    enabled: bool
    reverse_tolerance_m: float  # a plan point further behind the ego's centre than this asks for reversing
    speed: float  # m/s, the speed the recovery plan drives at
    accel: float  # m/s^2, acceleration towards that speed
    decel: float  # m/s^2, braking towards it when the ego is faster
    lookahead_m: tuple[float, ...]  # m, pure-pursuit look-ahead distances, tried in this order
    straight_m: tuple[float, ...]  # m, distances driven straight before pursuing the route, in this order
    step_s: float  # s, integration step of the bicycle rollout
    start_speed: float  # m/s, below it the plan's start is evened out (even_start)
    start_horizon_s: float  # s, the plan's speed at this time is reached by accelerating evenly from now
    # the crawl on a clear road (clear_road_start); clear_road_below 0: off
    clear_road_below: float = 0.0  # m/s, below it a crawling plan is made to accelerate
    clear_road_speed: float = 5.0  # m/s, ... towards this speed at ``accel``
    clear_road_horizon_s: float = 6.0  # s, the faster plan must meet no agent until then
    clear_road_curve_accel: float = 1.5  # m/s^2, its largest v^2 * curvature
    clear_road_min_gain_m: float = 1.0  # m, less gained over the plan's horizon: the plan is kept

    def __post_init__(self):
        for name in ("reverse_tolerance_m", "speed", "accel", "decel", "step_s", "start_speed",
                     "start_horizon_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"stall_recovery.{name}: must be a positive number, got {value!r}")
        for name in ("clear_road_below", "clear_road_speed", "clear_road_horizon_s", "clear_road_curve_accel",
                     "clear_road_min_gain_m"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0.0:
                raise ValueError(f"stall_recovery.{name}: must be a number >= 0, got {value!r}")
        if self.clear_road_below > 0.0 and not (self.clear_road_speed > self.clear_road_below
                                                 and self.clear_road_horizon_s > 0.0
                                                 and self.clear_road_curve_accel > 0.0):
            raise ValueError(f"stall_recovery.clear_road_speed ({self.clear_road_speed!r}) must exceed "
                             f"clear_road_below ({self.clear_road_below!r}), with clear_road_horizon_s and "
                             f"clear_road_curve_accel positive")
        if not self.lookahead_m or not all(np.isfinite(v) and v > 0.0 for v in self.lookahead_m):
            raise ValueError(f"stall_recovery.lookahead_m: needs positive distances, got {self.lookahead_m}")
        if not self.straight_m or not all(np.isfinite(v) and v >= 0.0 for v in self.straight_m):
            raise ValueError(f"stall_recovery.straight_m: needs distances >= 0, got {self.straight_m}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> StallRecoveryParams:
        from rad2_core.config import require

        c = require(params, "stall_recovery")
        return cls(bool(c["enabled"]), float(c["reverse_tolerance_m"]), float(c["speed"]), float(c["accel"]),
                   float(c["decel"]), tuple(float(v) for v in c["lookahead_m"]),
                   tuple(float(v) for v in c["straight_m"]), float(c["step_s"]), float(c["start_speed"]),
                   float(c["start_horizon_s"]), float(c["clear_road_below"]), float(c["clear_road_speed"]),
                   float(c["clear_road_horizon_s"]), float(c["clear_road_curve_accel"]),
                   float(c["clear_road_min_gain_m"]))


def even_start(plan: np.ndarray, ego_speed: float, plan_dt: float, p: StallRecoveryParams
               ) -> np.ndarray | None:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed along its own path so that a slow
    ego (below ``start_speed``) reaches the plan's speed at ``start_horizon_s`` by accelerating evenly
    from now, instead of first holding its speed (or standing) and accelerating later; after
    ``start_horizon_s`` the plan's own speeds, shifted by the distance gained. Progress is clamped to the
    plan's own path, so a plan that stops still stops at the same place. None when there is nothing to
    even out: a fast ego, a plan that is not faster at ``start_horizon_s`` than the ego now, or one that
    already gains at least as much ground by then."""
    v0 = max(float(ego_speed), 0.0)
    pts = np.asarray(plan, np.float64)
    if not (np.isfinite(v0) and np.isfinite(pts).all()) or v0 >= p.start_speed:
        return None  # an undefined speed or plan is left to the validators and the later stages
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)  # cum[k]: the plan's progress at k·plan_dt
    n = min(max(1, int(round(p.start_horizon_s / plan_dt))), len(pts))
    horizon = n * plan_dt
    v_at = (cum[n] - cum[n - 1]) / plan_dt  # the plan's mean speed over its last interval before the horizon
    if v_at <= v0 + 1e-6:
        return None
    accel = (v_at - v0) / horizon
    t = np.arange(1, len(pts) + 1) * plan_dt
    early = v0 * t + 0.5 * accel * t**2
    gained = float(early[n - 1] - cum[n])
    if gained <= 1e-3:
        return None
    s_new = np.where(t <= horizon + 1e-9, early, cum[1:] + gained)
    s_new = np.minimum(np.maximum.accumulate(s_new), cum[-1])
    return np.stack([np.interp(s_new, cum, path[:, 0]), np.interp(s_new, cum, path[:, 1])], axis=-1)


def clear_road_start(plan: np.ndarray, ego_speed: float, plan_dt: float, route: np.ndarray | None,
                     p: StallRecoveryParams) -> np.ndarray | None:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed so that a slow ego (below
    ``clear_road_below``) accelerates at ``accel`` towards ``clear_road_speed`` (:func:`retime_towards`);
    None when the ego is not slow, or as :func:`retime_towards` says."""
    v0 = max(float(ego_speed), 0.0) if np.isfinite(ego_speed) else np.nan
    if p.clear_road_below <= 0.0 or not np.isfinite(v0) or v0 >= p.clear_road_below:
        return None
    return retime_towards(plan, v0, plan_dt, route, p.clear_road_speed, p.accel, p.decel,
                          p.clear_road_horizon_s, p.clear_road_curve_accel, p.clear_road_min_gain_m)


def retime_towards(plan: np.ndarray, ego_speed: float, plan_dt: float, route: np.ndarray | None,
                   speed: float, accel: float, decel: float, horizon_s: float, curve_accel: float,
                   min_gain_m: float, join_margin_m: float = 0.0) -> np.ndarray | None:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed so that the ego's speed goes from
    ``ego_speed`` towards ``speed``: faster, at ``accel`` along the plan's path, then along ``route`` (ego
    frame, [P, 2]; straight on without one), never behind the plan itself at any point and within
    ``sqrt(curve_accel / curvature)`` of the path ahead (a bend the ego is already too fast for leaves
    the plan alone: it may be braking for it), returned continued to ``horizon_s`` (at least T points,
    for the caller's agent check); slower, braking at ``decel`` along the plan's own path, never ahead of
    the plan at any point (T points). None when the plan's end moves by less than ``min_gain_m``.
    ``join_margin_m``: the bends within this of where the plan's end joins the route are not looked at
    (a plan that ends beside the route joins it with a kink no car drives)."""
    v0 = float(ego_speed)
    pts = np.asarray(plan, np.float64)
    if not np.isfinite(v0) or not np.isfinite(speed) or len(pts) == 0 or not np.isfinite(pts).all():
        return None
    v0 = max(v0, 0.0)
    cum = arc_lengths(np.vstack([np.zeros((1, 2)), pts]))
    if speed < v0:  # slower: along the plan's own path only
        t = np.arange(1, len(pts) + 1) * plan_dt
        t_low = (v0 - speed) / decel
        profile = np.where(t <= t_low, v0 * t - 0.5 * decel * t**2,
                           v0 * t_low - 0.5 * decel * t_low**2 + speed * (t - t_low))
        s_new = np.minimum(profile, cum[1:])
        if cum[-1] - s_new[-1] < min_gain_m:
            return None
        path = np.vstack([np.zeros((1, 2)), pts])
        return np.stack([np.interp(s_new, cum, path[:, 0]), np.interp(s_new, cum, path[:, 1])], axis=-1)
    n = max(len(pts), int(np.ceil(horizon_s / plan_dt - 1e-9)))
    t = np.arange(1, n + 1) * plan_dt
    reach = v0 * t[-1] + 0.5 * accel * t[-1] ** 2  # no further than this, whatever the speed cap
    path, knots = continued_path(pts, cum, route, reach)
    stations, kappa = path_curvature(path[:-1] if len(path) > 2 else path, 2.0)  # a 2 m chord
    looked_at = (stations <= reach) & (np.abs(stations - cum[-1]) >= join_margin_m)
    bend = float(kappa[looked_at].max(initial=0.0))
    v_top = speed if bend <= 0.0 else min(speed, float(np.sqrt(curve_accel / bend)))
    if v_top <= v0 + 1e-6:
        return None  # a bend ahead that the ego is already too fast for: the plan may be braking for it
    t_top = (v_top - v0) / accel
    floor = np.where(t <= t_top, v0 * t + 0.5 * accel * t**2,
                     v0 * t_top + 0.5 * accel * t_top**2 + v_top * (t - t_top))
    own = np.concatenate([cum[1:], np.full(n - len(pts), cum[-1])])  # the plan stays at its end
    s_new = np.maximum(floor, own)
    if s_new[len(pts) - 1] < cum[-1] + min_gain_m:
        return None
    return np.stack([np.interp(s_new, knots, path[:, 0]), np.interp(s_new, knots, path[:, 1])], axis=-1)


def asks_for_reversing(plan: np.ndarray, p: StallRecoveryParams) -> bool:
    """Whether a plan [T, 2] (ego frame) has a point more than ``reverse_tolerance_m`` behind the ego."""
    return bool(np.min(np.asarray(plan)[:, 0]) < -p.reverse_tolerance_m)


def follow_route(route: np.ndarray, ego_speed: float, ego_steer: float, plan_dt: float, num_points: int,
                 vehicle: VehicleParams, p: StallRecoveryParams, lookahead_m: float,
                 straight_m: float = 0.0) -> np.ndarray:
    """[num_points, 2] ego-frame positions at (k+1)·plan_dt of a bicycle starting at the origin (heading
    +x, speed ``ego_speed``, steering ``ego_steer``) that pure-pursues the route polyline ``route``
    [P >= 2, 2] (ego frame; extended straight past its end) ``lookahead_m`` ahead of its own
    projection, after first driving ``straight_m`` with the wheels straightened, within the vehicle's
    limits."""
    path = RoutePath(route)
    end_dir = np.array([np.cos(path.heading[-1]), np.sin(path.heading[-1])])
    n_per = max(1, int(round(plan_dt / p.step_s)))
    h = plan_dt / n_per
    v0 = min(max(float(ego_speed), 0.0), vehicle.max_speed)
    steer0 = float(np.clip(ego_steer, -vehicle.max_steer, vehicle.max_steer))
    state = np.array([0.0, 0.0, 0.0, v0, steer0])
    out = np.empty((num_points, 2))
    travelled = 0.0
    for k in range(num_points * n_per):
        v = state[3]
        # progress along the route: at its nearest vertex (the route tokens are 2.5 m apart)
        nearest = int(np.argmin(np.hypot(path.points[:, 0] - state[0], path.points[:, 1] - state[1])))
        ahead = float(path.s0[nearest]) + lookahead_m
        if ahead <= path.length:
            target = np.array([np.interp(ahead, path.s0, path.points[:, 0]),
                               np.interp(ahead, path.s0, path.points[:, 1])])
        else:
            target = path.points[-1] + (ahead - path.length) * end_dir
        dx, dy = target - state[:2]
        alpha = np.arctan2(dy, dx) - state[2]
        alpha = (alpha + np.pi) % (2.0 * np.pi) - np.pi
        dist = max(float(np.hypot(dx, dy)), 1e-6)
        steer_cmd = np.arctan(2.0 * vehicle.wheelbase * np.sin(alpha) / dist)
        if travelled < straight_m:
            steer_cmd = 0.0
        accel = np.clip((p.speed - v) / h, -p.decel, p.accel)
        u = clamp_controls(state, np.array([accel, (steer_cmd - state[4]) / h]), vehicle, h)
        before = state[:2]
        state = step(state, u, vehicle, h)
        travelled += float(np.hypot(*(state[:2] - before)))
        if (k + 1) % n_per == 0:
            out[(k + 1) // n_per - 1] = state[:2]
    return out


def on_drivable_area(plan: np.ndarray, drivable: np.ndarray, cfg: BevConfig) -> bool:
    """Whether every point of ``plan`` [T, 2] (ego frame) falls in a cell of the BEV channel ``drivable``
    [H, W] (grid ``cfg``) that is covered at least half."""
    pix = np.asarray(plan, np.float64) @ ego_to_pixel_affine(cfg)[:, :2].T + ego_to_pixel_affine(cfg)[:, 2]
    cols, rows = np.round(pix).astype(np.int64).T  # pixel centres sit at integer (u, v)
    h, w = drivable.shape
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    if not inside.all():
        return False
    return bool(np.all(drivable[rows, cols] >= 0.5))


def recovery_plan(route: np.ndarray, ego_speed: float, ego_steer: float, plan_dt: float, num_points: int,
                  vehicle: VehicleParams, p: StallRecoveryParams, drivable: np.ndarray, cfg: BevConfig
                  ) -> tuple[np.ndarray | None, float, float]:
    """The first :func:`follow_route` plan (over ``p.straight_m``, then ``p.lookahead_m``) that stays on
    the drivable area, with its straight distance and look-ahead; ``(None, nan, nan)`` when none does."""
    for straight in p.straight_m:
        for lookahead in p.lookahead_m:
            plan = follow_route(route, ego_speed, ego_steer, plan_dt, num_points, vehicle, p, lookahead,
                                straight)
            if on_drivable_area(plan, drivable, cfg):
                return plan, straight, lookahead
    return None, float("nan"), float("nan")


__all__ = ["StallRecoveryParams", "asks_for_reversing", "clear_road_start", "even_start", "follow_route",
           "on_drivable_area", "recovery_plan"]
