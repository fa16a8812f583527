"""Small synthetic clips for tests: a two-lane road, straight then a left curve, with a few agents."""

from __future__ import annotations

import numpy as np
from rad2_planner.clip import AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip, LaneMap
from rad2_planner.geometry import wrap_angle

LANE_WIDTH = 3.5


def _offset(poly: np.ndarray, d: float) -> np.ndarray:
    """Polyline shifted ``d`` metres to its left."""
    tang = np.gradient(poly, axis=0)
    tang /= np.linalg.norm(tang, axis=1, keepdims=True)
    normal = np.stack([-tang[:, 1], tang[:, 0]], axis=1)
    return poly + d * normal


def _straight(x0: float, x1: float, y: float, n: int = 21) -> np.ndarray:
    return np.stack([np.linspace(x0, x1, n), np.full(n, y)], axis=1)


def _arc(start_x: float, radius: float, angle: float, y: float, n: int = 31) -> np.ndarray:
    """Left-turning arc starting at (start_x, y) heading +x; centre at (start_x, y + radius)."""
    th = np.linspace(0.0, angle, n)
    return np.stack([start_x + radius * np.sin(th), y + radius - radius * np.cos(th)], axis=1)


def make_map() -> LaneMap:
    """Lanes 1->2 (right lane: straight 100 m then a 90 deg left curve, R=60 m), 3->4 the left lane."""
    cl = [
        _straight(0.0, 100.0, 0.0),
        _arc(100.0, 60.0, np.pi / 2, 0.0),
        _straight(0.0, 100.0, LANE_WIDTH),
        _arc(100.0, 60.0 - LANE_WIDTH, np.pi / 2, LANE_WIDTH),
    ]
    left = [_offset(c, LANE_WIDTH / 2) for c in cl]
    right = [_offset(c, -LANE_WIDTH / 2) for c in cl]
    drivable = [np.concatenate([right[k], left[k][::-1]]) for k in range(4)]
    crosswalk = [np.array([[60.0, -2.0], [63.0, -2.0], [63.0, 5.5], [60.0, 5.5]])]
    return LaneMap.build(
        lane_ids=[1, 2, 3, 4],
        centerlines=cl,
        left_boundaries=left,
        right_boundaries=right,
        speed_limits=[13.9, 11.1, 13.9, 11.1],
        successors=[[2], [], [4], []],
        drivable_areas=drivable,
        crosswalks=crosswalk,
    )


def _along(poly: np.ndarray, s: np.ndarray):
    seg = np.diff(poly, axis=0)
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(seg, axis=1))])
    s = np.clip(s, 0.0, cum[-1])
    x = np.interp(s, cum, poly[:, 0])
    y = np.interp(s, cum, poly[:, 1])
    k = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(seg) - 1)
    yaw = np.arctan2(seg[k, 1], seg[k, 0])
    return x, y, yaw


def make_clip(
    num_steps: int = 121,
    dt: float = 0.1,
    clip_id: str = "synthetic_0",
    ego_speed: float = 10.0,
    lane_map: LaneMap | None = None,
) -> Clip:
    m = lane_map if lane_map is not None else make_map()
    t = np.arange(num_steps) * dt
    right_path = np.concatenate([m.centerlines[0], m.centerlines[1][1:]])
    left_path = np.concatenate([m.centerlines[2], m.centerlines[3][1:]])
    ex, ey, eyaw = _along(right_path, 20.0 + ego_speed * t)
    # agents: leader in the ego lane, a faster car in the left lane, a pedestrian crossing late,
    # and a car that appears half way through (validity mask)
    specs = [
        (right_path, 45.0, 8.0, AGENT_VEHICLE, 4.6, 1.9, 0),
        (left_path, 10.0, 13.0, AGENT_VEHICLE, 5.0, 2.0, 0),
        (left_path, 70.0, 9.0, AGENT_VEHICLE, 4.2, 1.8, num_steps // 2),
    ]
    n = len(specs) + 1
    ax = np.zeros((n, num_steps))
    ay = np.zeros_like(ax)
    ayaw = np.zeros_like(ax)
    avx = np.zeros_like(ax)
    avy = np.zeros_like(ax)
    valid = np.zeros((n, num_steps), dtype=bool)
    lengths, widths, types = [], [], []
    for i, (path, s0, v, typ, ln, wd, first) in enumerate(specs):
        x, y, yaw = _along(path, s0 + v * t)
        ax[i], ay[i], ayaw[i] = x, y, yaw
        avx[i], avy[i] = v * np.cos(yaw), v * np.sin(yaw)
        valid[i, first:] = True
        lengths.append(ln)
        widths.append(wd)
        types.append(typ)
    # pedestrian walking north across the crosswalk at 1.4 m/s
    ax[-1] = 61.5
    ay[-1] = -4.0 + 1.4 * t
    ayaw[-1] = np.pi / 2
    avy[-1] = 1.4
    valid[-1] = True
    lengths.append(0.6)
    widths.append(0.6)
    types.append(AGENT_PEDESTRIAN)
    for arr in (ax, ay, ayaw, avx, avy):
        arr[~valid] = 0.0
    speed = np.full(num_steps, ego_speed)
    return Clip.build(
        clip_id=clip_id,
        dt=dt,
        ego_x=ex,
        ego_y=ey,
        ego_yaw=wrap_angle(eyaw),
        ego_speed=speed,
        ego_accel=np.zeros(num_steps),
        ego_length=4.8,
        ego_width=1.9,
        agent_ids=np.arange(100, 100 + n),
        agent_types=types,
        agent_length=lengths,
        agent_width=widths,
        agent_x=ax,
        agent_y=ay,
        agent_yaw=wrap_angle(ayaw),
        agent_vx=avx,
        agent_vy=avy,
        agent_valid=valid,
        map=m,
        route_lane_ids=[1, 2],
        route_polyline=right_path,
        metadata={"source": "synthetic", "scenario_kind": "slow_leader", "seed": 0},
    )
