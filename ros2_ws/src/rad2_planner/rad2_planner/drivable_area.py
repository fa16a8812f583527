"""Drivable-area check of the executed plan (a post-planning stage, rad2_planner.stages).

The ego's box is swept along the plan for the first ``horizon_s`` seconds: every ``sample_step_m`` of
the path (the plan's points are seconds apart) the box is placed with the heading of the path there,
and its four corners are looked up in the drivable-area
channel of the observation's BEV. The first point whose corner falls on a cell covered less than
``coverage_threshold`` is where the plan leaves the drivable area. Corners outside the BEV's extent are
unknown, not off-road: the check never fires on what it cannot see.

``action``:
- ``report``: the plan is executed as it is; the exit (distance along the path, time) is said in the
  cycle's ``PlanResult.info`` and on the planner node's ``/diagnostics``.
- ``stop``: the plan is also re-timed along its own path to stop ``stop_margin_m`` before the last
  sample whose whole box is on the drivable area, braking at ``comfort_decel`` or harder where the
  distance asks for it (traffic_rules.limit_progress).

Why a check after the stages and not a selection rule: the candidates are already filtered by the
learned discriminator and the safe set, and the stages before this one (stall recovery, traffic rules,
safety envelope, comfort limits) only re-time a plan along its path, so the path that is checked here
is the one the controller will track.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.bev import BevConfig, ego_to_pixel_affine


@dataclass(frozen=True)
class DrivableAreaParams:
    enabled: bool
    action: str  # report | stop (the choices of drivable_area.action in params/planner.schema.yaml)
    horizon_s: float  # s of the plan checked
    coverage_threshold: float  # a corner's cell needs at least this drivable-area coverage
    sample_step_m: float  # m, the box is checked this often along the path (between plan points too)
    stop_margin_m: float  # m, action stop: the plan stops this far before the exit
    comfort_decel: float  # m/s^2, action stop: braking used when the distance allows it

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> DrivableAreaParams:
        from rad2_core.config import require

        c = require(params, "drivable_area")
        return cls(bool(c["enabled"]), str(c["action"]), float(c["horizon_s"]),
                   float(c["coverage_threshold"]), float(c["sample_step_m"]), float(c["stop_margin_m"]),
                   float(c["comfort_decel"]))


@dataclass(frozen=True)
class DrivableExit:
    """Where a plan first leaves the drivable area."""

    index: int  # the plan point that ends the path segment where it happens (0: the point at plan_dt)
    time_s: float  # s from now
    distance_m: float  # m along the plan's path from the ego to that point
    inside_m: float  # m along the path to the sample before it, the last with the whole box on the area

    def note(self) -> str:
        return (f"plan leaves the drivable area in {self.distance_m:.1f} m "
                f"({self.time_s:.1f} s, point {self.index})")


def kinematic_headings(paths: np.ndarray, max_curvature: float = np.inf) -> np.ndarray:
    """[..., T] heading of the ego's box on each segment of ``paths`` [..., T+1, 2] (ego frame, starting
    at the ego with heading 0): the segment's direction, turned from the heading before it by no more
    than a car turning at ``max_curvature`` can over the arc between them (the chord of a circle of
    curvature k turns k·L/2 from the tangent at its start, consecutive chords k·(L1 + L2)/2). Why: from
    a standing ego the generator's points are centimetres apart and point in any direction; a box set on
    such a segment's direction stood sideways across a narrow turn lane, and the plan read as leaving the
    road the first 0.1 m (the ego waited 15 s on a free road). A segment that has not moved keeps the
    heading before it."""
    path = np.asarray(paths, np.float64)
    step = np.diff(path, axis=-2)
    length = np.hypot(step[..., 0], step[..., 1])
    direction = np.arctan2(step[..., 1], step[..., 0])
    out = np.empty(length.shape)
    last = np.zeros(length.shape[:-1])  # the ego's own heading in its frame
    previous = np.zeros(length.shape[:-1])  # the length of the segment before (none before the first)
    for k in range(length.shape[-1]):
        turn = np.angle(np.exp(1j * (direction[..., k] - last)))
        bound = max_curvature * 0.5 * (previous + length[..., k]) if np.isfinite(max_curvature) else np.inf
        moved = length[..., k] > 1e-3
        last = np.where(moved, last + np.clip(turn, -bound, bound), last)
        previous = np.where(moved, length[..., k], previous)
        out[..., k] = last
    return out


def path_headings(plan: np.ndarray, max_curvature: float = np.inf) -> np.ndarray:
    """Heading of the ego's box on the path to each point of ``plan`` [T, 2] (ego frame, points at
    (k+1)·dt, the ego at the origin before the first): :func:`kinematic_headings`."""
    pts = np.asarray(plan, np.float64)
    return kinematic_headings(np.vstack([np.zeros((1, 2)), pts]), max_curvature)


def footprint_corners(points: np.ndarray, yaw: np.ndarray, ego_size: tuple[float, float]) -> np.ndarray:
    """[N, 4, 2] corners of the ego box (length, width) centred on each of ``points`` [N, 2], heading
    ``yaw`` [N]."""
    length, width = ego_size
    c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
    dx = np.array([1, 1, -1, -1]) * 0.5 * length
    dy = np.array([1, -1, -1, 1]) * 0.5 * width
    pts = np.asarray(points, np.float64)
    return np.stack([pts[:, :1] + c * dx - s * dy, pts[:, 1:2] + s * dx + c * dy], axis=-1)


def swept_samples(plan: np.ndarray, plan_dt: float, step_m: float,
                  max_curvature: float = np.inf) -> tuple[np.ndarray, ...]:
    """The plan's path from the ego (the origin) through ``plan`` [T, 2], sampled at most ``step_m``
    apart: points [N, 2], headings [N], arc lengths [N], times [N] and the plan point each sample's
    segment ends at [N]. The plan's points are a plan_dt apart in time, metres apart in space; the box
    is checked between them as well."""
    path = np.vstack([np.zeros((1, 2)), np.asarray(plan, np.float64)])
    yaw = path_headings(plan, max_curvature)
    pts, hdg, arc, times, seg = [], [], [], [], []
    s0 = 0.0
    for k in range(len(path) - 1):
        a, b = path[k], path[k + 1]
        length = float(np.hypot(*(b - a)))
        n = max(int(np.ceil(length / step_m)), 1)
        f = np.arange(1, n + 1) / n
        pts.append(a + f[:, None] * (b - a))
        hdg.append(np.full(n, yaw[k]))
        arc.append(s0 + f * length)
        times.append((k + f) * plan_dt)
        seg.append(np.full(n, k))
        s0 += length
    return (np.concatenate(pts), np.concatenate(hdg), np.concatenate(arc), np.concatenate(times),
            np.concatenate(seg))


def _corners_covered(corners: np.ndarray, drivable: np.ndarray, cfg: BevConfig,
                     threshold: float) -> np.ndarray:
    """Per corner ``[..., 2]`` (ego frame), whether its cell of ``drivable`` [H, W] is covered at least
    ``threshold``; a corner outside the grid, or on its border cells, counts as covered (unknown is not
    off-road: the rasteriser's supersamples stop at the grid's edge, so a border cell of a road that runs
    on past it reads about half covered, and a plan at 15 m/s reaching it within the check's horizon
    was braked for a road that goes on)."""
    affine = ego_to_pixel_affine(cfg)
    pix = corners @ affine[:, :2].T + affine[:, 2]
    cols, rows = np.round(pix[..., 0]).astype(np.int64), np.round(pix[..., 1]).astype(np.int64)
    h, w = drivable.shape
    inside = (rows >= 1) & (rows < h - 1) & (cols >= 1) & (cols < w - 1)
    covered = np.ones(rows.shape, dtype=bool)
    covered[inside] = drivable[rows[inside], cols[inside]] >= threshold
    return covered


def first_exit(plan: np.ndarray, plan_dt: float, ego_size: tuple[float, float], drivable: np.ndarray,
               cfg: BevConfig, p: DrivableAreaParams, max_curvature: float = np.inf) -> DrivableExit | None:
    """Where, within ``p.horizon_s``, the ego box swept along ``plan`` [T, 2] first has a corner on a
    cell of ``drivable`` [H, W] (grid ``cfg``) covered less than ``p.coverage_threshold``; None when it
    never does (corners outside the grid are not looked at). The box turns along the path no faster
    than ``max_curvature`` allows (:func:`kinematic_headings`)."""
    n = min(len(plan), max(int(np.ceil(p.horizon_s / plan_dt - 1e-9)), 1))
    pts, yaw, arc, times, seg = swept_samples(np.asarray(plan, np.float64)[:n], plan_dt, p.sample_step_m,
                                              max_curvature)
    corners = footprint_corners(pts, yaw, ego_size)  # [N, 4, 2]
    bad = ~_corners_covered(corners, drivable, cfg, p.coverage_threshold).all(axis=1)
    if not bad.any():
        return None
    j = int(np.argmax(bad))
    return DrivableExit(int(seg[j]), float(times[j]), float(arc[j]), float(arc[j - 1]) if j else 0.0)


def candidate_exit_times(candidates: np.ndarray, plan_dt: float, ego_size: tuple[float, float],
                         drivable: np.ndarray, cfg: BevConfig, p: DrivableAreaParams,
                         samples_per_point: int = 8, max_curvature: float = np.inf) -> np.ndarray:
    """[M] time (s from now) at which the ego box swept along each of ``candidates`` [M, T, 2] first has
    a corner on a cell of ``drivable`` [H, W] covered less than ``p.coverage_threshold``, within
    ``p.horizon_s``; inf where it never does. The check of :func:`first_exit` for a whole candidate set
    in one pass (the selection's drivable-area preference, every cycle): each plan segment is sampled
    ``samples_per_point`` times (1.25 m apart at 20 m/s for 0.5 s points) instead of every
    ``sample_step_m``, with the box's heading of :func:`kinematic_headings` (``max_curvature``)."""
    c = np.asarray(candidates, np.float64)
    m = c.shape[0]
    n = min(c.shape[1], max(int(np.ceil(p.horizon_s / plan_dt - 1e-9)), 1))
    if m == 0:
        return np.zeros(0)
    path = np.concatenate([np.zeros((m, 1, 2)), c[:, :n]], axis=1)  # M n+1 2
    step = np.diff(path, axis=1)  # M n 2
    yaw = kinematic_headings(path, max_curvature)  # M n
    f = np.arange(1, samples_per_point + 1) / samples_per_point  # fractions along each segment
    pts = path[:, :-1, None, :] + f[None, None, :, None] * step[:, :, None, :]  # M n S 2
    times = (np.arange(n)[:, None] + f[None, :]) * plan_dt  # n S
    length, width = ego_size
    cy, sy = np.cos(yaw)[..., None, None], np.sin(yaw)[..., None, None]  # M n 1 1
    dx = np.array([1, 1, -1, -1]) * 0.5 * length
    dy = np.array([1, -1, -1, 1]) * 0.5 * width
    corners = np.stack([pts[..., :1] + cy * dx - sy * dy, pts[..., 1:] + sy * dx + cy * dy], -1)  # M n S 4 2
    bad = ~_corners_covered(corners, drivable, cfg, p.coverage_threshold).all(axis=-1)  # M n S
    bad = bad.reshape(m, -1)
    flat_times = np.broadcast_to(times, (m, n, samples_per_point)).reshape(m, -1)
    return np.where(bad.any(1), flat_times[np.arange(m), bad.argmax(1)], np.inf)


__all__ = ["DrivableAreaParams", "DrivableExit", "candidate_exit_times", "first_exit", "footprint_corners",
           "kinematic_headings", "path_headings", "swept_samples"]
