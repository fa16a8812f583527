"""Plausibility validators between the stages: impossible-but-finite input never reaches a command.

Message conversion (:mod:`rad2_ros.conversions`) already rejects NaN, infinities and wrong
shapes. These checks reject values that are finite but physically impossible for the vehicle or the
sensor — an odometry speed of 1e6 m/s, a pose 1 km from the previous one 0.1 s earlier, a BEV cell of
1e30, a trajectory with 1000 s between points or a point 1e6 m away — in the pattern of Autoware's
planning and control validators: each function returns the list of :class:`Violation` (empty when
the input is plausible), each naming the field, the offending value and the bound, so a node can
report it on its diagnostics, count it and answer with the safe behaviour (fallback plan or
minimal-risk stop). Bounds live in ``params/validators.yaml``; trajectory kinematics are multiples
of the vehicle's limits (``params/vehicle.yaml``).

Everything here is plain NumPy, no ROS: the nodes, the simulator and the replay tools call the same
functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

OCCUPANCY_CHANNELS_PREFIXES = ("drivable_area", "lane_centerline", "lane_boundary", "route", "agents_t",
                               "crosswalk", "traffic_signal")


@dataclass(frozen=True)
class Violation:
    """One implausible value: ``field`` (dotted, with an index where useful), its value and the bound."""

    field: str
    value: float
    bound: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value:.6g} violates {self.bound}"


class PlausibilityError(ValueError):
    """Raised by :func:`require_plausible` with every violation in the message."""

    def __init__(self, what: str, violations: Sequence[Violation]):
        self.violations = list(violations)
        super().__init__(f"{what}: " + "; ".join(str(v) for v in self.violations))


def require_plausible(what: str, violations: Sequence[Violation]) -> None:
    if violations:
        raise PlausibilityError(what, violations)


def load_limits(params: dict[str, Any]) -> dict[str, Any]:
    """The ``validators`` block of params/validators.yaml as the caller loaded it."""
    return params["validators"]


def _worst(field: str, values: np.ndarray, lo: float | None, hi: float | None, unit: str) -> list[Violation]:
    """At most one violation per field: the value farthest outside ``[lo, hi]`` (with its index)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return []
    excess = np.zeros(v.shape)
    if lo is not None:
        excess = np.maximum(excess, lo - v)
    if hi is not None:
        excess = np.maximum(excess, v - hi)
    if not (excess > 0).any():
        return []
    k = np.unravel_index(int(np.argmax(excess)), v.shape)
    where = f"{field}[{','.join(map(str, k))}]" if v.ndim else field
    bound = f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}] {unit}".strip()
    return [Violation(where, float(v[k]), bound)]


# ----------------------------------------------------------------------------------------------------
# odometry and perceived objects


def check_odometry(motion: Any, limits: dict[str, Any], previous: Any | None = None) -> list[Violation]:
    """An ego motion (``x, y, yaw, speed, yaw_rate, stamp_ns``) alone and against the previous accepted one.

    A sample whose stamp is not after the previous one is out of order; a speed change or a pose jump
    larger than the stamp gap allows is impossible (a localisation reset shows up here too).
    """
    c = limits["odometry"]
    out = _worst("speed", np.float64(motion.speed), float(c["min_speed_m_s"]), float(c["max_speed_m_s"]),
                 "m/s")
    out += _worst("yaw_rate", np.float64(motion.yaw_rate), -float(c["max_abs_yaw_rate"]),
                  float(c["max_abs_yaw_rate"]), "rad/s")
    lim = float(c["max_abs_position_m"])
    out += _worst("pose.x", np.float64(motion.x), -lim, lim, "m")
    out += _worst("pose.y", np.float64(motion.y), -lim, lim, "m")
    if int(motion.stamp_ns) <= 0:
        out.append(Violation("stamp_ns", float(motion.stamp_ns), "> 0 (an unset stamp)"))
    if previous is None or out:
        return out
    gap = (int(motion.stamp_ns) - int(previous.stamp_ns)) * 1e-9
    if gap <= 0.0:
        return out + [Violation("stamp_ns", float(motion.stamp_ns),
                                f"> previous stamp {int(previous.stamp_ns)} (out of order)")]
    accel = (float(motion.speed) - float(previous.speed)) / gap
    out += _worst("acceleration", np.float64(accel), -float(c["max_abs_accel"]), float(c["max_abs_accel"]),
                  "m/s^2 (speed change over the stamp gap)")
    jump = float(np.hypot(motion.x - previous.x, motion.y - previous.y))
    allowed = float(c["max_speed_m_s"]) * gap + float(c["jump_margin_m"])
    out += _worst("pose_jump", np.float64(jump), None, allowed, f"m in {gap:.3g} s")
    return out


def check_objects(length, width, vx, vy, x, y, limits: dict[str, Any], ego_xy=(0.0, 0.0)) -> list[Violation]:
    """Perceived boxes (parallel arrays [N], one frame): count, size, speed and distance from the ego."""
    c = limits["objects"]
    n = len(np.atleast_1d(length))
    out = _worst("objects.count", np.float64(n), None, float(c["max_count"]), "")
    out += _worst("objects.length", length, float(c["min_size_m"]), float(c["max_length_m"]), "m")
    out += _worst("objects.width", width, float(c["min_size_m"]), float(c["max_width_m"]), "m")
    out += _worst("objects.speed", np.hypot(vx, vy), None, float(c["max_speed_m_s"]), "m/s")
    dist = np.hypot(np.asarray(x, np.float64) - ego_xy[0], np.asarray(y, np.float64) - ego_xy[1])
    return out + _worst("objects.distance", dist, None, float(c["max_range_m"]), "m from the ego")


def check_clip(clip: Any, limits: dict[str, Any]) -> list[Violation]:
    """A logged clip before the simulator replays it: the ego's speed, positions, step-to-step jumps and
    size, and the valid agent states' sizes, speeds and positions, against the bounds the live inputs
    get (``odometry`` and ``objects``). ``Clip.validate`` has already refused NaN and wrong shapes; this
    refuses a finite log of the impossible (a speed of 1e6 m/s, a pose 1e9 m out, a 1e5 m truck) that
    would otherwise be driven and scored. Only upper bounds of magnitude: a reversing ego (negative
    speed) and a noisy logged acceleration (CommonRoad's highway fixture reaches 18 m/s²) are real."""
    odo, obj = limits["odometry"], limits["objects"]
    vmax, pmax = float(odo["max_speed_m_s"]), float(odo["max_abs_position_m"])
    out = _worst("clip.ego_speed", clip.ego_speed, -vmax, vmax, "m/s")
    out += _worst("clip.ego_x", clip.ego_x, -pmax, pmax, "m")
    out += _worst("clip.ego_y", clip.ego_y, -pmax, pmax, "m")
    ego_x, ego_y = np.asarray(clip.ego_x, np.float64), np.asarray(clip.ego_y, np.float64)
    steps = np.hypot(np.diff(ego_x), np.diff(ego_y))
    out += _worst("clip.ego_step", steps, None, vmax * float(clip.dt) + float(odo["jump_margin_m"]),
                  f"m between consecutive steps ({float(clip.dt):g} s)")
    out += _worst("clip.ego_length", np.float64(clip.ego_length), None, float(obj["max_length_m"]), "m")
    out += _worst("clip.ego_width", np.float64(clip.ego_width), None, float(obj["max_width_m"]), "m")
    valid = np.asarray(clip.agent_valid, bool)
    seen = valid.any(axis=1)  # agents with at least one valid state
    for size, bound in (("length", "max_length_m"), ("width", "max_width_m")):
        out += _worst(f"clip.agent_{size}", np.asarray(getattr(clip, f"agent_{size}"))[seen], None,
                      float(obj[bound]), "m")
    speed = np.where(valid, np.hypot(clip.agent_vx, clip.agent_vy), 0.0)
    out += _worst("clip.agent_speed", speed, None, float(obj["max_speed_m_s"]), "m/s")
    for axis in ("x", "y"):
        pos = np.where(valid, np.asarray(getattr(clip, f"agent_{axis}"), np.float64), 0.0)
        out += _worst(f"clip.agent_{axis}", pos, -pmax, pmax, "m")
    return out


def invalidate_implausible_agent_states(clip: Any, limits: dict[str, Any]) -> tuple[Any, int]:
    """``clip`` with the agent states :func:`check_clip` would refuse marked invalid (a speed or a
    position out of bounds; every state of an agent whose box is out of bounds), and how many states
    that changed. For the log readers: a tracker's glitch on another road user is a property of the
    log, not of the world, and one such state must not cost the whole clip; an impossible ego is not
    repaired (check_clip still refuses it)."""
    from dataclasses import replace

    obj, pmax = limits["objects"], float(limits["odometry"]["max_abs_position_m"])
    valid = np.asarray(clip.agent_valid, bool)
    ok = np.hypot(clip.agent_vx, clip.agent_vy) <= float(obj["max_speed_m_s"])
    ok &= (np.abs(clip.agent_x) <= pmax) & (np.abs(clip.agent_y) <= pmax)
    sized = (np.asarray(clip.agent_length) <= float(obj["max_length_m"])) & (
        np.asarray(clip.agent_width) <= float(obj["max_width_m"]))
    keep = valid & ok & sized[:, None]
    changed = int((valid & ~keep).sum())
    return (replace(clip, agent_valid=keep) if changed else clip), changed


# ----------------------------------------------------------------------------------------------------
# features


def check_bev(features: np.ndarray, channels: Sequence[str], limits: dict[str, Any]) -> list[Violation]:
    """Value range per channel of a ``[C, H, W]`` BEV raster: occupancy-like channels in [0, 1],
    velocity channels and the speed limit within their physical bounds."""
    c = limits["bev"]
    feats = np.asarray(features)
    if feats.ndim != 3 or feats.shape[0] != len(channels):
        return [Violation("bev.shape", float(feats.shape[0] if feats.ndim else 0),
                          f"{len(channels)} channels of [C, H, W]")]
    tol = float(c["occupancy_tolerance"])
    out: list[Violation] = []
    for k, name in enumerate(channels):
        ch = feats[k]
        lo, hi = float(ch.min()), float(ch.max())
        if name.startswith(OCCUPANCY_CHANNELS_PREFIXES):
            bounds, unit = (-tol, 1.0 + tol), ""
        elif "velocity" in name:
            bounds, unit = (-float(c["max_abs_velocity_m_s"]), float(c["max_abs_velocity_m_s"])), "m/s"
        elif name == "speed_limit":
            bounds, unit = (0.0, float(c["max_speed_limit_m_s"])), "m/s"
        else:
            continue  # a channel this validator has no physical range for
        out += _worst(f"bev.{name}", np.array([lo, hi]), *bounds, unit)[:1]
    return out


def check_tokens(tokens: Any, limits: dict[str, Any]) -> list[Violation]:
    """Scene tokens (an Observation or SceneTokenArrays): valid rows only, positions, speeds, sizes and
    the ego state; a scene without map polylines or without a route (empty tokens) has nothing to plan
    on, and an ego reversing faster than ``max_reverse_speed_m_s`` is not a drive the planner knows."""
    c = limits["tokens"]
    pos, spd = float(c["max_abs_position_m"]), float(c["max_abs_speed_m_s"])
    es = np.asarray(tokens.ego_state, np.float64)
    map_mask = np.asarray(tokens.map_mask, bool)
    n_maps = int(map_mask.reshape(map_mask.shape[0], -1).any(axis=1).sum()) if map_mask.size else 0
    n_route = int(np.asarray(tokens.route_mask, bool).sum())
    out = _worst("map_polylines.count", np.float64(n_maps), float(c["min_map_polylines"]), None,
                 "valid polylines")
    out += _worst("route.count", np.float64(n_route), float(c["min_route_points"]), None,
                  "valid route points")
    out += _worst("ego_state.speed", es[0], -float(c["max_reverse_speed_m_s"]), spd,
                  "m/s (reverse limit tokens.max_reverse_speed_m_s)")
    out += _worst("ego_state.accel", es[1], -float(c["max_abs_accel"]), float(c["max_abs_accel"]), "m/s^2")
    out += _worst("ego_state.yaw_rate", es[2], -float(c["max_abs_yaw_rate"]), float(c["max_abs_yaw_rate"]),
                  "rad/s")
    maps = np.asarray(tokens.map_polylines, np.float64)[np.asarray(tokens.map_mask, bool)]
    out += _worst("map_polylines.xy", maps[..., :2], -pos, pos, "m")
    out += _worst("map_polylines.speed_limit", maps[..., 4], 0.0, spd, "m/s")
    ag = np.asarray(tokens.agents, np.float64)[np.asarray(tokens.agents_mask, bool)]
    out += _worst("agents.xy", ag[:, :2], -pos, pos, "m")
    out += _worst("agents.velocity", ag[:, 4:6], -spd, spd, "m/s")
    out += _worst("agents.length", ag[:, 6], 0.0, float(c["max_agent_length_m"]), "m")
    out += _worst("agents.width", ag[:, 7], 0.0, float(c["max_agent_width_m"]), "m")
    route = np.asarray(tokens.route, np.float64)[np.asarray(tokens.route_mask, bool)]
    return out + _worst("route.xy", route[:, :2], -pos, pos, "m")


# ----------------------------------------------------------------------------------------------------
# trajectories


def check_trajectory(points: np.ndarray, dt: float, limits: dict[str, Any], vehicle: Any,
                     ego_speed: float | None = None) -> list[Violation]:
    """An ego-frame plan ``[T, 2]`` at times ``(k+1)·dt`` from the ego at the origin heading +x.

    Implied speed, acceleration (from ``ego_speed`` when given), curvature, lateral acceleration and
    lateral jerk within multiples of ``vehicle`` (:class:`~rad2_core.bicycle.VehicleParams`);
    no segment running backwards along the plan's heading; the first point near the ego's lane.
    """
    from rad2_core.bicycle import slip_and_curvature

    c = limits["trajectory"]
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2 or not int(c["min_points"]) <= len(pts) <= int(c["max_points"]):
        return [Violation("trajectory.points", float(len(pts)) if pts.ndim else 0.0,
                          f"[{int(c['min_points'])}, {int(c['max_points'])}] points of [T, 2]")]
    out = _worst("trajectory.dt", np.float64(dt), float(c["min_dt_s"]), float(c["max_dt_s"]), "s")
    if out:
        return out  # the kinematics below would divide by an impossible dt
    path = np.vstack([np.zeros((1, 2)), pts])
    seg = np.diff(path, axis=0)
    seg_len = np.hypot(seg[:, 0], seg[:, 1])
    speed = seg_len / dt  # mean speed over each interval
    out += _worst("trajectory.speed", speed, None, float(c["speed_factor"]) * vehicle.max_speed, "m/s")
    out += _worst("trajectory.start_offset", np.abs(pts[0, 1]), None, float(c["max_start_offset_m"]),
                  "m lateral from the ego")
    v = speed if ego_speed is None else np.concatenate([[float(ego_speed)], speed])
    f = float(c["accel_factor"])
    # speeds are interval means, so consecutive ones are dt apart (the first, from the ego, dt / 2)
    gaps = np.full(len(v) - 1, dt)
    if ego_speed is not None and len(gaps):
        gaps[0] = dt / 2.0
    accel = np.diff(v) / gaps
    if ego_speed is not None and len(gaps):
        # From the ego's own speed to the plan's first interval only braking is judged: a plan that starts
        # faster than the ego (the generator's start offset; 2-2.5 m/s seen in the soak) is caught up with
        # by the tracker within the vehicle's acceleration, while one far slower (an all-zero plan at
        # speed) demands braking no vehicle has.
        accel[0] = min(accel[0], 0.0)
    out += _worst("trajectory.accel", accel, f * vehicle.min_accel, f * vehicle.max_accel, "m/s^2")
    heading = np.arctan2(seg[:, 1], seg[:, 0])
    moving = speed >= float(c["curvature_min_speed_m_s"])
    ref = np.concatenate([[0.0], heading[:-1]])  # the ego heads +x before the first segment
    along = seg[:, 0] * np.cos(ref) + seg[:, 1] * np.sin(ref)
    out += _worst("trajectory.backward", -along, None, float(c["max_backward_m"]), "m against the heading")
    turn = np.angle(np.exp(1j * np.diff(np.concatenate([[0.0], heading]))))
    # The turn at point k is between segments k-1 and k: judged only where both move (a near-standing
    # segment's heading is noise, so a plan that slows to a stop or starts off would show kinks of
    # several rad), over the mean of the two chords (the ego's own heading precedes the first one).
    moving_pair = moving & np.concatenate([[True], moving[:-1]])
    chord = np.concatenate([seg_len[:1], 0.5 * (seg_len[1:] + seg_len[:-1])])
    kappa = np.where(moving_pair, turn / np.maximum(chord, 1e-9), 0.0)
    kmax = float(c["curvature_factor"]) * float(slip_and_curvature(vehicle.max_steer, vehicle)[1])
    out += _worst("trajectory.curvature", np.abs(kappa), None, kmax, "1/m")
    lat = speed**2 * kappa
    out += _worst("trajectory.lateral_accel", np.abs(lat), None, float(c["max_lateral_accel"]), "m/s^2")
    if len(lat) > 1:
        out += _worst("trajectory.lateral_jerk", np.abs(np.diff(lat)) / dt, None,
                      float(c["max_lateral_jerk"]), "m/s^3")
    return out


def check_plan_deviation(points: np.ndarray, t0_s: float, dt: float, previous: np.ndarray, prev_t0_s: float,
                         prev_dt: float, limits: dict[str, Any]) -> list[Violation]:
    """Largest distance between a plan and the previous one at their common times (both in one frame;
    point ``k`` of a plan is at ``t0 + (k+1)·dt``). A plan that jumps far from its predecessor within
    one cycle is not a replanning but a fault."""
    pts, prev = np.asarray(points, np.float64), np.asarray(previous, np.float64)
    t = t0_s + (np.arange(len(pts)) + 1) * dt
    tp = prev_t0_s + (np.arange(len(prev)) + 1) * prev_dt
    common = (t >= tp[0]) & (t <= tp[-1])
    if not common.any():
        return []
    px = np.interp(t[common], tp, prev[:, 0])
    py = np.interp(t[common], tp, prev[:, 1])
    dev = np.hypot(pts[common, 0] - px, pts[common, 1] - py)
    return _worst("trajectory.deviation_from_previous", dev, None,
                  float(limits["trajectory"]["max_deviation_m"]), "m")
