"""Tracking references for the iLQR controller, built from planner trajectories.

A plan is ``[T_plan, 2]`` (or batched ``[B, T_plan, 2]``) (x, y) points at times ``(k+1) * plan_dt``
after the plan's time origin, in the ego frame of the pose at that origin (the planner's convention)
or already in the world frame. The reference adds the ego position at time 0, interpolates the
positions with a shape-preserving cubic (Fritsch-Butland PCHIP per coordinate: a plan that stops does
not overshoot and creep backwards), samples it at ``age + (j+1) * dt`` for ``j < horizon``
(``age`` = seconds since the plan's origin) and derives:

- speed = norm of the spline velocity; heading = its direction where the speed exceeds
  ``min_heading_speed``, otherwise the last valid heading (initially the ego's yaw);
- no reversing: a sample whose velocity points backwards relative to the held heading gets speed 0
  and keeps the heading;
- heading unwrapped and shifted by a multiple of 2 pi to start near the ego's yaw, so the yaw error
  in the cost never jumps by 2 pi;
- steering from the heading rate (curvature = yaw rate / speed, 0 when slow) via the inverse of the
  bicycle's curvature map, clipped to the steering limit.

Beyond the last plan point the path is extended at the last segment's constant velocity. A single
point, all-equal points (a stop) and a plan shorter than the horizon are handled; NaN/inf or wrong
shapes raise ``ReferenceError`` naming the field and value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rad2_core.bicycle import NX, VehicleParams, steer_for_curvature
from rad2_core.geometry import ego_to_world


class ReferenceError(ValueError):
    """A plan cannot be turned into a tracking reference (bad shape or non-finite values)."""


@dataclass
class Reference:
    """Reference states ``[B, H, 5]`` (x, y, yaw, v, steer) at times ``(j+1) * dt`` from now."""

    states: np.ndarray
    dt: float

    @property
    def horizon(self) -> int:
        return self.states.shape[1]

    @property
    def batch_size(self) -> int:
        return self.states.shape[0]


def _check_finite(name: str, value: np.ndarray) -> None:
    bad = ~np.isfinite(value)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ReferenceError(f"{name}{list(idx)} is not finite ({value[idx]!r})")


def validate_plan(points, name: str = "points") -> np.ndarray:
    """Return ``points`` as float64 ``[B, T, 2]`` (T >= 1), or raise ``ReferenceError``."""
    try:
        arr = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ReferenceError(f"{name}: cannot be read as numbers ({exc})") from None
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[-1] != 2:
        raise ReferenceError(f"{name}: expected shape [T, 2] or [B, T, 2], got {tuple(np.shape(points))}")
    if arr.shape[1] < 1:
        raise ReferenceError(f"{name}: needs at least one point, got shape {arr.shape}")
    _check_finite(name, arr)
    return arr


def plan_to_world(points_ego, ego_pose) -> np.ndarray:
    """Ego-frame plan points ``[..., T, 2]`` -> world frame, given the ego pose(s) ``[..., 3]``."""
    return ego_to_world(points_ego, ego_pose)


def _pchip_slopes(y: np.ndarray, h: float) -> np.ndarray:
    """Fritsch-Butland slopes of uniformly spaced samples ``y[..., N, d]`` (N >= 2)."""
    sec = np.diff(y, axis=-2) / h
    d = np.empty_like(y)
    d[..., 0, :] = sec[..., 0, :]
    d[..., -1, :] = sec[..., -1, :]
    if y.shape[-2] > 2:
        s0, s1 = sec[..., :-1, :], sec[..., 1:, :]
        same = s0 * s1 > 0.0
        denom = np.where(same, s0 + s1, 1.0)
        d[..., 1:-1, :] = np.where(same, 2.0 * s0 * s1 / denom, 0.0)
    return d


def _hermite(y: np.ndarray, d: np.ndarray, h: float, t: np.ndarray):
    """Evaluate the cubic Hermite interpolant (knots at 0, h, 2h, ...) and its derivative at ``t``.

    ``y``/``d``: ``[B, N, 2]``; ``t``: ``[B, H]`` within ``[0, (N-1) h]``.
    """
    n = y.shape[1]
    idx = np.clip(np.floor(t / h).astype(np.int64), 0, n - 2)
    s = (t - idx * h) / h
    take = np.take_along_axis
    i0 = idx[..., None]
    y0, y1 = take(y, i0, axis=1), take(y, i0 + 1, axis=1)
    d0, d1 = take(d, i0, axis=1) * h, take(d, i0 + 1, axis=1) * h
    s = s[..., None]
    s2, s3 = s * s, s * s * s
    pos = (2 * s3 - 3 * s2 + 1) * y0 + (s3 - 2 * s2 + s) * d0 + (-2 * s3 + 3 * s2) * y1 + (s3 - s2) * d1
    vel = (
        (6 * s2 - 6 * s) * y0 + (3 * s2 - 4 * s + 1) * d0 + (-6 * s2 + 6 * s) * y1 + (3 * s2 - 2 * s) * d1
    ) / h
    return pos, vel


def _forward_fill(values: np.ndarray, valid: np.ndarray, initial: np.ndarray) -> np.ndarray:
    """Replace invalid entries along axis 1 by the last valid one (``initial`` before the first)."""
    b, n = values.shape
    idx = np.where(valid, np.arange(n)[None, :], -1)
    idx = np.maximum.accumulate(idx, axis=1)
    padded = np.concatenate([initial[:, None], values], axis=1)
    return np.take_along_axis(padded, idx + 1, axis=1)


def build_reference(
    points,
    plan_dt: float,
    start_pose,
    vehicle: VehicleParams,
    dt: float,
    horizon: int,
    age=0.0,
    *,
    min_heading_speed: float,
    frame: str = "world",
) -> Reference:
    """Tracking reference from plan(s).

    points: ``[T, 2]`` or ``[B, T, 2]``; plan_dt: s between points (point k at ``(k+1) plan_dt``);
    start_pose: ``[3]`` or ``[B, 3]`` ego pose (x, y, yaw) at the plan's time origin (world frame;
    its position is the path's first knot, its yaw the fallback heading); age: ``[B]`` or scalar s
    elapsed since that origin (the reference starts at ``age + dt``); frame: ``"world"`` or
    ``"ego"`` (points relative to ``start_pose``); min_heading_speed: m/s
    (params/controller.yaml ``controller.reference.min_heading_speed``).
    """
    pts = validate_plan(points)
    if not np.isfinite(plan_dt) or plan_dt <= 0.0:
        raise ReferenceError(f"plan_dt must be a positive number, got {plan_dt!r}")
    if not np.isfinite(dt) or dt <= 0.0:
        raise ReferenceError(f"dt must be a positive number, got {dt!r}")
    if int(horizon) < 1:
        raise ReferenceError(f"horizon must be >= 1, got {horizon!r}")
    b = pts.shape[0]
    pose = np.asarray(start_pose, dtype=np.float64)
    if pose.ndim == 1:
        pose = np.broadcast_to(pose, (b, 3))
    if pose.shape != (b, 3):
        raise ReferenceError(f"start_pose: expected shape [3] or [{b}, 3], got {tuple(pose.shape)}")
    _check_finite("start_pose", pose)
    age_arr = np.broadcast_to(np.asarray(age, dtype=np.float64), (b,))
    _check_finite("age", age_arr)
    if (age_arr < 0).any():
        raise ReferenceError(f"age must be >= 0, got {age_arr.min()!r}")
    if frame == "ego":
        pts = plan_to_world(pts, pose)
    elif frame != "world":
        raise ReferenceError(f"frame must be 'world' or 'ego', got {frame!r}")

    knots = np.concatenate([pose[:, None, :2], pts], axis=1)  # [B, T+1, 2], knot i at i * plan_dt
    n = knots.shape[1]
    slopes = _pchip_slopes(knots, plan_dt)
    t = age_arr[:, None] + dt * np.arange(1, int(horizon) + 1)[None, :]
    t_end = (n - 1) * plan_dt
    inside = np.minimum(t, t_end)
    pos, vel = _hermite(knots, slopes, plan_dt, inside)
    # Constant-velocity extension beyond the plan (last segment's average velocity).
    over = (t - inside)[..., None]
    last_vel = (knots[:, -1] - knots[:, -2]) / plan_dt
    pos = pos + over * last_vel[:, None, :]
    vel = np.where(over > 0.0, last_vel[:, None, :], vel)

    speed = np.hypot(vel[..., 0], vel[..., 1])
    raw_heading = np.arctan2(vel[..., 1], vel[..., 0])
    valid = speed > min_heading_speed
    yaw0 = pose[:, 2]
    heading = _forward_fill(raw_heading, valid, yaw0)
    # No reversing: moving against the previously held heading means "stopped" here.
    prev = np.concatenate([yaw0[:, None], heading[:, :-1]], axis=1)
    along = vel[..., 0] * np.cos(prev) + vel[..., 1] * np.sin(prev)
    backwards = valid & (along < 0.0)
    if backwards.any():
        valid = valid & ~backwards
        heading = _forward_fill(raw_heading, valid, yaw0)
    speed = np.where(backwards, 0.0, speed)
    # Continuous heading starting near the ego's yaw.
    seq = np.unwrap(np.concatenate([yaw0[:, None], heading], axis=1), axis=1)
    heading = seq[:, 1:]
    # Curvature from the heading rate; steering from the bicycle's curvature map.
    rate = np.gradient(seq, dt, axis=1)[:, 1:] if seq.shape[1] > 2 else (seq[:, 1:] - seq[:, :1]) / dt
    kappa = np.where(speed > min_heading_speed, rate / np.maximum(speed, min_heading_speed), 0.0)
    steer = steer_for_curvature(kappa, vehicle)
    speed = np.minimum(speed, vehicle.max_speed)

    states = np.empty((b, int(horizon), NX))
    states[..., 0:2] = pos
    states[..., 2] = heading
    states[..., 3] = speed
    states[..., 4] = steer
    return Reference(states=states, dt=float(dt))


def shift_controls(controls: np.ndarray, steps: int) -> np.ndarray:
    """Warm start: drop the first ``steps`` inputs and repeat the last one at the end."""
    controls = np.asarray(controls, dtype=np.float64)
    steps = int(max(0, steps))
    h = controls.shape[-2]
    if steps == 0:
        return controls.copy()
    if steps >= h:
        return np.repeat(controls[..., -1:, :], h, axis=-2)
    tail = np.repeat(controls[..., -1:, :], steps, axis=-2)
    return np.concatenate([controls[..., steps:, :], tail], axis=-2)
