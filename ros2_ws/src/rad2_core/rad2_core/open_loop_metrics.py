"""Open-loop planning metrics: a plan made at log time t is compared with what was logged after t.

All inputs are in the ego frame of time t, plans ``[M, T, 2]`` at times ``(k+1)·plan_dt``.

Definitions (per planning sample; rates are means over samples, reported in %):
- **minADE / minFDE** (best-of-M): ``min_m mean_k ‖c_mk − g_k‖`` and ``min_m ‖c_mK − g_K‖`` against the
  logged ego future g (metres).
- **ADE / FDE** (selected): the same for the candidate the policy selected.
- **CR** (collision rate): the selected plan's ego box (logged ego size, heading from the plan's finite
  differences, turning at most the vehicle's maximum curvature times the distance moved, so a
  standing plan's jitter does not spin the box; see :func:`plan_headings`) overlaps, at some plan
  time k, the box of a logged agent valid at that time (agents replay their logs, they do not
  react). ``CR = DCR ∪ SCR``.
- **DCR** (dynamic collision rate): CR restricted to agents that move (speed at t or at the
  collision time ≥ ``static_speed``).
- **SCR** (static collision rate): CR restricted to static obstacles: agents whose speed stays below
  ``static_speed`` over the horizon (parked cars, stopped queues, obstacles).
- **offroad**: some corner of the ego box (as for CR) of the selected plan falls in a BEV cell at most
  half covered by drivable area (cells outside the raster are not judged).
- **coll_any** (diagnostic): share of candidates (of all M) that collide.

Box overlap uses the separating-axis test on oriented rectangles. This module imports no ROS and is
shared by the IL validation, the bag-replay evaluator and the benchmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rad2_core.geometry import box_corners, boxes_overlap, world_to_ego, wrap_angle


def plan_headings(
    traj: np.ndarray,
    initial_heading: float = 0.0,
    min_step: float = 0.05,
    max_curvature: float = math.inf,
) -> np.ndarray:
    """Headings [.., T] of the ego box along ``traj [.., T, 2]`` (the origin precedes the first point).

    Unconstrained (``max_curvature`` infinite, the default kept for callers that want raw segment
    directions): each point takes the direction of the segment arriving at it when that is at least
    ``min_step`` long, else the previous heading.

    Kinematic (finite ``max_curvature``, 1/m), what the metrics use:
    - the direction at point k is that of the chord from point k-1 to point k+1: on a circular arc
      it is the tangent, whereas the arriving segment lags it by half the turn of one step and swings
      the rear corners towards the inside of a bend (the last point keeps the arriving segment:
      extrapolating would amplify the noise of plan tails);
    - a backward direction moves the box along its axis (reversing) instead of spinning it round;
    - from one point to the next the heading turns by at most ``max_curvature`` times the distance
      moved. A car cannot rotate in place, so the decimetre jitter of a plan that stands still or
      creeps (diffusion samples do that) does not swing the box sideways;
    - points that moved less than ``min_step`` keep the previous heading.
    """
    prev = np.concatenate([np.zeros_like(traj[..., :1, :]), traj[..., :-1, :]], axis=-2)
    d = traj - prev
    step = np.linalg.norm(d, axis=-1)
    short = step < min_step
    kinematic = np.isfinite(max_curvature)
    if kinematic:
        chord = np.concatenate([traj[..., 1:, :] - prev[..., :-1, :], d[..., -1:, :]], axis=-2)
        yaw = np.arctan2(chord[..., 1], chord[..., 0])
    else:
        yaw = np.arctan2(d[..., 1], d[..., 0])
    out = np.empty_like(yaw)
    last = np.full(yaw.shape[:-1], initial_heading, dtype=yaw.dtype)
    for k in range(yaw.shape[-1]):
        target = yaw[..., k]
        if kinematic:
            turn = wrap_angle(target - last)
            turn = np.where(np.abs(turn) > np.pi / 2, wrap_angle(turn - np.pi), turn)  # reversing
            lim = max_curvature * step[..., k]
            target = wrap_angle(last + np.clip(turn, -lim, lim))
        last = np.where(short[..., k], last, target)
        out[..., k] = last
    return out


def vehicle_max_curvature(vehicle_params: dict) -> float:
    """Largest path curvature (1/m) of the ego box centre at full steering (``vehicle_params``:
    params/vehicle.yaml as loaded)."""
    from rad2_core.bicycle import VehicleParams, slip_and_curvature

    vehicle = VehicleParams.from_params(vehicle_params)
    return float(slip_and_curvature(vehicle.max_steer, vehicle)[1])


@dataclass
class LoggedFuture:
    """What happened after time t, in the ego frame of t, at the plan times."""

    ego: np.ndarray  # [T, 2] logged ego positions
    ego_valid: np.ndarray  # [T] bool (False past the end of the log)
    agent_pose: np.ndarray  # [N, T, 3] x, y, yaw
    agent_size: np.ndarray  # [N, 2] length, width
    agent_speed: np.ndarray  # [N, T+1] speed at t and at the plan times
    agent_valid: np.ndarray  # [N, T] bool
    ego_size: tuple[float, float]


def logged_future(clip, t: int, plan_dt: float, plan_points: int) -> LoggedFuture:
    """Extract the logged future of ``clip`` after step ``t`` (needs rad2_core.clip.Clip fields)."""
    stride = int(round(plan_dt / clip.dt))
    if stride < 1 or abs(stride * clip.dt - plan_dt) > 1e-6:
        raise ValueError(f"plan_dt={plan_dt} is not a multiple of the clip dt={clip.dt}")
    steps = t + stride * (np.arange(plan_points) + 1)
    valid = steps < clip.num_steps
    idx = np.minimum(steps, clip.num_steps - 1)
    pose = np.array([clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t]])
    ego = world_to_ego(np.stack([clip.ego_x[idx], clip.ego_y[idx]], -1), pose)
    n = len(clip.agent_ids)
    if n:
        axy = world_to_ego(np.stack([clip.agent_x[:, idx], clip.agent_y[:, idx]], -1), pose)
        ayaw = wrap_angle(clip.agent_yaw[:, idx] - pose[2])
        apose = np.concatenate([axy, ayaw[..., None]], -1)
        all_idx = np.concatenate([[t], idx])
        spd = np.hypot(clip.agent_vx[:, all_idx], clip.agent_vy[:, all_idx])
        avalid = clip.agent_valid[:, idx] & valid[None]
        size = np.stack([clip.agent_length, clip.agent_width], -1)
    else:
        apose = np.zeros((0, plan_points, 3))
        spd = np.zeros((0, plan_points + 1))
        avalid = np.zeros((0, plan_points), bool)
        size = np.zeros((0, 2))
    return LoggedFuture(
        ego.astype(np.float64),
        valid,
        apose,
        size,
        spd,
        avalid,
        (float(clip.ego_length), float(clip.ego_width)),
    )


def displacement_errors(
    candidates: np.ndarray, selected: int, gt: np.ndarray, valid: np.ndarray | None = None
):
    """minADE, minFDE (best of M) and ADE, FDE of the selected candidate, over valid times."""
    valid = np.ones(gt.shape[0], bool) if valid is None else np.asarray(valid, bool)
    if not valid.any():
        return None
    err = np.linalg.norm(candidates[:, valid] - gt[None, valid], axis=-1)  # M Tv
    ade, fde = err.mean(-1), err[:, -1]
    return {
        "minADE": float(ade.min()),
        "minFDE": float(fde.min()),
        "ADE": float(ade[selected]),
        "FDE": float(fde[selected]),
    }


def plan_collisions(
    trajs: np.ndarray, fut: LoggedFuture, static_speed: float, max_curvature: float,
) -> dict[str, np.ndarray]:
    """Collision flags of plans ``[M, T, 2]`` with the logged agents -> dict of bool [M].

    Ego headings: :func:`plan_headings` limited to ``max_curvature`` (the vehicle's:
    :func:`vehicle_max_curvature`); ``static_speed`` (m/s, params/sim.yaml
    ``metrics.open_loop_static_speed``) splits static from dynamic agents."""
    m = trajs.shape[0]
    if fut.agent_pose.shape[0] == 0:
        z = np.zeros(m, bool)
        return {"collision": z, "dynamic": z.copy(), "static": z.copy()}
    yaw = plan_headings(trajs, max_curvature=float(max_curvature))
    ego = np.stack(np.broadcast_arrays(trajs[..., 0], trajs[..., 1], yaw, *fut.ego_size), -1)  # M T 5
    ag = np.concatenate(
        [fut.agent_pose, np.broadcast_to(fut.agent_size[:, None, :], fut.agent_pose.shape[:2] + (2,))], -1
    )  # N T 5
    hit = boxes_overlap(ego[:, None], ag[None]) & fut.agent_valid[None]  # M N T
    is_static = (fut.agent_speed < float(static_speed)).all(axis=1)  # N
    dyn = hit & ~is_static[None, :, None]
    sta = hit & is_static[None, :, None]
    return {"collision": hit.any((1, 2)), "dynamic": dyn.any((1, 2)), "static": sta.any((1, 2))}


def offroad(
    traj: np.ndarray,
    ego_size: tuple[float, float],
    drivable: np.ndarray,
    origin: tuple[float, float],
    resolution: float,
    max_curvature: float,
) -> bool:
    """Whether a corner of the ego box along ``traj [T, 2]`` lies on a non-drivable BEV cell (drivable
    coverage ≤ 0.5); headings as in :func:`plan_collisions`.

    ``drivable [H, W]`` uses the BEV convention: cell (i, j) covers x ∈ [ox + j·res, +res),
    y ∈ [oy + i·res, +res).
    """
    yaw = plan_headings(traj[None], max_curvature=float(max_curvature))[0]
    c = box_corners(traj[:, 0], traj[:, 1], yaw, *ego_size).reshape(-1, 2)
    j = np.floor((c[:, 0] - origin[0]) / resolution).astype(int)
    i = np.floor((c[:, 1] - origin[1]) / resolution).astype(int)
    h, w = drivable.shape
    inside = (i >= 0) & (i < h) & (j >= 0) & (j < w)
    return bool((drivable[i[inside], j[inside]] <= 0.5).any())


@dataclass
class OpenLoopAccumulator:
    """Collects per-sample results; :meth:`summary` gives the metric table (rates in %)."""

    static_speed: float  # m/s (params/sim.yaml metrics.open_loop_static_speed)
    max_curvature: float  # ego heading limit, 1/m (params/vehicle.yaml, :func:`vehicle_max_curvature`)
    rows: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def from_params(cls, sim_params: dict, vehicle_params: dict) -> OpenLoopAccumulator:
        """From params/sim.yaml and params/vehicle.yaml as loaded."""
        return cls(float(sim_params["metrics"]["open_loop_static_speed"]),
                   vehicle_max_curvature(vehicle_params))

    def add(
        self,
        candidates: np.ndarray,
        selected: int,
        fut: LoggedFuture,
        drivable: np.ndarray | None = None,
        bev_origin: tuple[float, float] | None = None,
        bev_resolution: float | None = None,
    ) -> dict[str, float]:
        row: dict[str, float] = {}
        de = displacement_errors(candidates, selected, fut.ego, fut.ego_valid)
        if de is None:
            return row
        row.update(de)
        col = plan_collisions(candidates, fut, self.static_speed, self.max_curvature)
        row["CR"] = float(col["collision"][selected])
        row["DCR"] = float(col["dynamic"][selected])
        row["SCR"] = float(col["static"][selected])
        row["coll_any"] = float(col["collision"].mean())
        if drivable is not None:
            row["offroad"] = float(
                offroad(
                    candidates[selected],
                    fut.ego_size,
                    drivable,
                    bev_origin,
                    bev_resolution,
                    self.max_curvature,
                )
            )
        self.rows.append(row)
        return row

    def summary(self) -> dict[str, float]:
        if not self.rows:
            return {}
        keys = sorted({k for r in self.rows for k in r})
        out = {"samples": float(len(self.rows))}
        for k in keys:
            vals = np.array([r[k] for r in self.rows if k in r])
            scale = 100.0 if k in ("CR", "DCR", "SCR", "coll_any", "offroad") else 1.0
            out[k] = float(vals.mean() * scale)
        return out
