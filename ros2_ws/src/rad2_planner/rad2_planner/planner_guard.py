"""Input checks and the safe fallback of the online planner (no ROS; used by the planner node).

A planning cycle is rejected when its inputs are not finite or larger than the configured sizes
(the ``rad2_planner.ros_conversions`` decoders raise) or stale (``check_age``); the node then
republishes ``stopping_trajectory``: the previous plan's path, re-timed so the ego decelerates to a
stop along it (or a straight stop ahead when there is no previous plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
