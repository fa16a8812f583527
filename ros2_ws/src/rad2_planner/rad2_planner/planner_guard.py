"""Input checks and the safe fallback of the online planner (no ROS; used by the planner node).

A planning cycle is rejected when its inputs are not finite or larger than the configured sizes
(the ``rad2_ros.conversions`` decoders raise), implausible (``rad2_core.validators``) or
stale (``check_age``); its own output is rejected when ``check_plan_output`` finds a violation. The
node then republishes ``stopping_trajectory``: the previous plan's path, re-timed so the ego
decelerates to a stop along it (or a straight stop ahead when there is no previous plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rad2_core.validators import Violation, check_plan_deviation, check_trajectory


@dataclass(frozen=True)
class AgeLimits:
    """How old (or how far in the future) an input stamp may be (params/nodes.yaml planner_node.*)."""

    max_age_s: float
    max_stamp_skew_s: float


def check_age(stamp_s: float, now_s: float, limits: AgeLimits) -> str | None:
    """Reason the input is stale (older than max_age_s) or from the future beyond the skew, or None."""
    age = now_s - stamp_s
    if not math.isfinite(age):
        return "input stamp is not a finite time"
    if age > limits.max_age_s:
        return f"stale input: {age * 1e3:.0f} ms old > {limits.max_age_s * 1e3:.0f} ms"
    if age < -limits.max_stamp_skew_s:
        return f"input stamp {-age * 1e3:.0f} ms in the future"
    return None


def future_tolerance_s(use_sim_time: bool, system_skew_s: float, sim_skew_s: float) -> float:
    """How far in the future an input stamp may lie on the node's clock.

    On the system clock only clock skew between hosts separates a publisher's stamp from ``now``. On
    simulated time the node's clock is the last ``/clock`` message it processed, which trails the
    publisher's clock by the delivery of that message (more under CPU load), so a valid stamp can read
    ahead of ``now``; ``sim_skew_s`` covers that lag.
    """
    return float(sim_skew_s if use_sim_time else system_skew_s)


@dataclass(frozen=True)
class DeviationCheck:
    """When a plan is compared with the previous one (params/nodes.yaml ``planner_node.deviation_*``).

    Only over the first ``horizon_s`` (further out, a legitimate change of speed separates two plans by
    more than any fixed bound), only against the plan of the previous cycle (stamps at most
    ``max_gap_s`` apart), and only while the ego's speed agrees with the speed the previous plan had
    at the new stamp within ``max_speed_gap_m_s`` (otherwise the ego is not where that plan put it:
    after a stop, a relocalisation, a new episode).
    """

    horizon_s: float
    max_gap_s: float
    max_speed_gap_m_s: float


def previous_plan_in_current_frame(previous: np.ndarray, plan_dt: float, elapsed_s: float
                                   ) -> tuple[np.ndarray, float]:
    """The previous plan (ego frame of its stamp) in the frame of an ego that followed it for
    ``elapsed_s``, and the previous plan's speed there."""
    path = np.vstack([[0.0, 0.0], np.asarray(previous, dtype=float)])
    t = np.arange(len(path)) * plan_dt
    e = float(np.clip(elapsed_s, 0.0, t[-1]))
    k = min(int(e // plan_dt), len(path) - 2)
    seg = path[k + 1] - path[k]
    speed = float(np.hypot(*seg)) / plan_dt
    heading = float(np.arctan2(seg[1], seg[0])) if np.hypot(*seg) > 1e-6 else 0.0
    pos = np.array([np.interp(e, t, path[:, 0]), np.interp(e, t, path[:, 1])])
    c, s = np.cos(heading), np.sin(heading)
    rel = np.asarray(previous, dtype=float) - pos
    return np.stack([c * rel[:, 0] + s * rel[:, 1], -s * rel[:, 0] + c * rel[:, 1]], axis=1), speed


WHOLE_PLAN_FIELDS = ("trajectory.points", "trajectory.dt", "trajectory.speed", "trajectory.start_offset")


def check_plan_kinematics(points: np.ndarray, dt: float, limits: dict, vehicle,
                          ego_speed: float | None) -> list[Violation]:
    """``validators.check_trajectory`` as the nodes apply it: time step, implied speed and start offset
    over the whole plan (a point at 1e6 m anywhere is a fault); acceleration, curvature, lateral
    acceleration and jerk and backward segments over its first ``trajectory.kinematics_horizon_s``,
    the part the controller tracks before it has replanned many times."""
    pts = np.asarray(points, dtype=float)
    whole = check_trajectory(pts, dt, limits, vehicle, ego_speed=ego_speed)
    if not whole or not (math.isfinite(dt) and dt > 0):
        return whole
    n = max(int(limits["trajectory"]["min_points"]),
            int(math.floor(float(limits["trajectory"]["kinematics_horizon_s"]) / dt + 1e-9)))
    if n >= len(pts):
        return whole
    near = check_trajectory(pts[:n], dt, limits, vehicle, ego_speed=ego_speed)
    out = [v for v in whole if v.field.startswith(WHOLE_PLAN_FIELDS)]
    seen = {v.field.split("[")[0] for v in out}
    return out + [v for v in near if v.field.split("[")[0] not in seen]


def check_plan_output(points: np.ndarray, plan_dt: float, ego_speed: float, limits: dict, vehicle,
                      stamp_ns: int, previous: tuple[int, np.ndarray] | None,
                      deviation: DeviationCheck) -> list[Violation]:
    """Violations of a selected plan ``[T, 2]`` (ego frame at ``stamp_ns``) before it is published:
    ``check_plan_kinematics`` of the plan in itself, and the deviation from the previous cycle's plan
    (``previous``: its stamp and points) where ``deviation`` applies.

    The step from the ego's own speed to the plan's first interval is not judged here: the IL
    generator often starts a little faster or slower than the ego (the controller absorbs it within
    the vehicle's limits), and rejecting such plans stops the ego, which widens the gap to the next
    plan (a feedback measured in the soak). The controller judges it from its odometry; an all-zero
    plan at speed is caught there and by the deviation from the previous plan here."""
    out = check_plan_kinematics(points, plan_dt, limits, vehicle, None)
    if out or previous is None:
        return out
    prev_stamp, prev = previous
    elapsed = (stamp_ns - prev_stamp) / 1e9
    if not 0.0 < elapsed <= deviation.max_gap_s:
        return out
    prev_now, prev_speed = previous_plan_in_current_frame(prev, plan_dt, elapsed)
    if abs(prev_speed - float(ego_speed)) > deviation.max_speed_gap_m_s:
        return out
    n = max(1, int(math.floor(deviation.horizon_s / plan_dt + 1e-9)))
    return out + check_plan_deviation(np.asarray(points)[:n], 0.0, plan_dt, prev_now, -elapsed, plan_dt,
                                      limits)


def point_speeds(points: np.ndarray, dt: float) -> np.ndarray:
    """Speed (m/s) at each point of an ego-frame trajectory [T, 2] that starts at the origin: the
    distance from the previous point (the origin for the first) over ``dt``."""
    pts = np.asarray(points, dtype=float)
    prev = np.vstack([[0.0, 0.0], pts[:-1]])
    return np.linalg.norm(pts - prev, axis=1) / dt


def _arc_length(points: np.ndarray) -> np.ndarray:
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    return np.concatenate([[0.0], np.cumsum(seg)])


def stopping_trajectory(
    previous: np.ndarray | None,
    plan_dt: float,
    num_points: int,
    elapsed_s: float,
    speed: float,
    decel: float,
) -> np.ndarray:
    """``[num_points, 2]`` positions at ``(k+1)*plan_dt`` after the previous plan's stamp that follow
    the previous plan's path and brake with ``decel`` from ``elapsed_s`` on (the time since that stamp,
    the moment the fallback takes over); before that they follow the previous plan as it was.

    ``previous`` is the previous selected trajectory ``[T, 2]`` in the ego frame of its own stamp, with
    the ego at the origin at time 0. Without one (``None``), the path is the straight line ahead, the
    stamp is the fallback's own (``elapsed_s`` = 0) and the ego starts at ``speed``.
    """
    if decel <= 0:
        raise ValueError(f"decel must be > 0, got {decel}")
    speed = max(0.0, float(speed)) if math.isfinite(speed) else 0.0
    t = (np.arange(num_points) + 1) * plan_dt
    if previous is None or len(previous) < 1 or not np.isfinite(previous).all():
        s = speed * t - 0.5 * decel * t**2
        s = np.where(t <= speed / decel, s, speed**2 / (2 * decel))
        return np.stack([s, np.zeros_like(s)], axis=1)
    path = np.vstack([[0.0, 0.0], np.asarray(previous, dtype=float)])
    s_path = _arc_length(path)
    t_path = np.arange(len(path)) * plan_dt
    # progress of the previous plan at the takeover time and its speed there
    elapsed = float(np.clip(elapsed_s, 0.0, t_path[-1]))
    s0 = float(np.interp(elapsed, t_path, s_path))
    k = min(int(elapsed // plan_dt), len(path) - 2) if len(path) > 1 else 0
    v_plan = (s_path[k + 1] - s_path[k]) / plan_dt if len(path) > 1 else 0.0
    v0 = max(0.0, v_plan)
    tau = np.maximum(t - elapsed, 0.0)
    brake = v0 * tau - 0.5 * decel * tau**2
    brake = np.where(tau <= v0 / decel, brake, v0**2 / (2 * decel))
    s = np.where(t <= elapsed, np.interp(t, t_path, s_path), s0 + brake)
    # positions along the path; beyond its end, continue straight along the last heading
    end_dir = path[-1] - path[-2] if len(path) > 1 else np.array([1.0, 0.0])
    norm = np.linalg.norm(end_dir)
    end_dir = end_dir / norm if norm > 1e-9 else np.array([1.0, 0.0])
    out = np.empty((num_points, 2))
    for i, si in enumerate(s):
        if si <= s_path[-1]:
            out[i, 0] = np.interp(si, s_path, path[:, 0])
            out[i, 1] = np.interp(si, s_path, path[:, 1])
        else:
            out[i] = path[-1] + (si - s_path[-1]) * end_dir
    return out
