"""Small synthetic clips for tests: a two-lane road, straight then a left curve, with a few agents."""

from __future__ import annotations

import numpy as np
from rad2_core.clip import AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap

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


def make_signal_clip(red_steps: int, num_steps: int = 160, stop_line_x: float = 70.0,
                     clip_id: str = "synthetic_signal") -> Clip:
    """The two-lane road with a traffic signal on the right lane (stop line across it at
    ``stop_line_x``), red for the first ``red_steps`` steps and green after; no other traffic. The
    logged ego behaves like a driver would: from 10 m/s it brakes at 2 m/s^2 to stop 1 m before the
    line, waits for green and pulls away at 1.5 m/s^2 (BEV-Warp renders the simulated ego's view from
    the logged one, so the log must stay near where a correct policy drives)."""
    from dataclasses import replace

    from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED

    base = make_map()
    m = LaneMap.build(
        lane_ids=base.lane_ids, centerlines=base.centerlines, left_boundaries=base.left_boundaries,
        right_boundaries=base.right_boundaries, speed_limits=base.speed_limits, successors=base.successors,
        drivable_areas=base.drivable_areas, crosswalks=[], signal_ids=[5], signal_lanes=[[1]],
        signal_stop_lines=[[[stop_line_x, -LANE_WIDTH / 2], [stop_line_x, LANE_WIDTH / 2]]])
    clip = make_clip(num_steps=num_steps, clip_id=clip_id, lane_map=m)
    states = np.full((1, num_steps), SIGNAL_GREEN, np.int8)
    states[0, :red_steps] = SIGNAL_RED
    dt, v0, brake, pull = clip.dt, 10.0, 2.0, 1.5
    s_stop = stop_line_x - 1.0 - clip.ego_length / 2 - 20.0  # centre's travel from x = 20 to its stop
    s, v, track, speed = 0.0, v0, [], []
    for k in range(num_steps):
        track.append(s)
        speed.append(v)
        if k < red_steps:
            need = v * v / (2.0 * max(s_stop - s, 1e-3))
            v = max(0.0, v - dt * (brake if need >= brake or s_stop - s < 0.5 else 0.0))
        else:
            v = min(v0, v + pull * dt)
        s = min(s + v * dt, s_stop) if k < red_steps else s + v * dt
    path = np.concatenate([m.centerlines[0], m.centerlines[1][1:]])
    ex, ey, eyaw = _along(path, 20.0 + np.asarray(track))
    ego = dict(ego_x=ex, ego_y=ey, ego_yaw=eyaw, ego_speed=np.asarray(speed),
               ego_accel=np.gradient(np.asarray(speed), dt))
    return replace(clip.select_agents(np.zeros(clip.num_agents, bool)), signal_states=states,
                   **ego).validate()


def empty_road_inputs(policy, bev_params: dict, speed: float) -> dict[str, np.ndarray]:
    """A batch of one model input for ``policy``: an ego at ``speed`` (wheels straight) on a BEV that is
    drivable everywhere, a straight route ahead (2.5 m spacing) and no agent: the scene a stage test
    then adds agents or an edge to."""
    from rad2_core.bev import get_config
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs

    cfg = get_config(bev_params)
    ex = example_inputs(policy.cfg, batch=1, seed=0)
    inputs = {k: np.array(ex[k]) for k in SCENE_INPUTS}
    inputs["ego_state"][:] = 0.0
    inputs["ego_state"][:, 0] = speed
    inputs["bev"][:] = 0.0
    inputs["bev"][:, cfg.channel_index("drivable_area")] = 1.0
    route = np.stack([np.arange(policy.cfg.n_route) * 2.5, np.zeros(policy.cfg.n_route)], axis=-1)
    inputs["route"][:] = 0.0
    inputs["route"][0, :, :2] = route
    inputs["route_mask"][:] = True
    inputs["agents"][:] = 0.0
    inputs["agents_mask"][:] = False
    return inputs
