"""PDM-Closed as a reference policy ``pdm_closed`` (Dauner et al., "Parting with Misconceptions about
Learning-based Vehicle Motion Planning", CoRL 2023), on the planner observation (ego frame, no ROS).

Each planning cycle:

1. **Centreline**: the route polyline of the observation, resampled every ``path_spacing_m`` and
   continued straight past its end; one path per ``lateral_offsets_m`` (0 is the centreline itself,
   others are parallel to it, left positive).
2. **Proposals**: on every path, the Intelligent Driver Model for every target speed
   ``speed_limit_fractions × limit`` (the speed limit of the on-route lane the ego is on, from the map
   tokens; ``fallback_speed`` without one). The leader of a path at each step is the nearest object
   ahead whose forecast box reaches into the ego-wide corridor along the path (agents forecast at
   constant velocity; a red stop line on the route stands as a stopped object), with its velocity
   along the path. IDM is integrated at ``dt`` over the horizon.
3. **Simulation**: each proposal is driven from the ego's true state (speed, steering angle) by the
   kinematic bicycle model of the simulator (``rad2_core.bicycle``) under a pure-pursuit steering law
   on its path and the IDM acceleration plus a speed-error feedback, so what is scored is what a
   tracker can drive, including the move from the ego's position onto an offset path.
4. **Scoring** (nuPlan's closed-loop metrics over ``horizon_s``, as PDM re-implements them):
   ``Π (no at-fault collision, drivable area, driving direction) × weighted mean (progress, TTC,
   comfort)``. At fault: a collision with a stopped object, with the ego's front, or on the side while
   the ego straddles lanes or leaves the drivable area, and not while the ego stands; 0 for vehicles
   and vulnerable road users, 0.5 for other objects. Drivable area: every box corner on the drivable
   area channel of the BEV raster. Driving direction: the distance driven with the centre outside the
   route's lane, per stretch (below ``direction_ok_m`` 1, below ``direction_bad_m`` 0.5, else 0).
   Progress along the centreline, divided by the best proposal's (after the multipliers). TTC: 0 when
   the ego box projected at its speed ``ttc_offsets_s`` ahead meets an agent ahead (or one not behind
   while the ego straddles lanes or is off the drivable area). Comfort: the nuPlan bounds on the
   simulated acceleration, jerk, yaw rate and yaw acceleration.
5. **Output**: the best proposal (of the proposals within ``tie_tolerance`` of the best score, the one
   nearest the centreline); its simulated positions at the plan times (``PlanResult.candidates``
   holds every proposal and ``scores`` their scores). With an at-fault collision of the best proposal
   within ``brake_time_s`` at an ego speed of at most ``brake_max_speed``, an emergency stop along that
   path at ``brake_decel`` is executed instead (``PlanResult.executed``, ``info["emergency_brake"]``).

Differences from the paper's implementation, from what the observation holds: the route polyline
(lane centrelines of the route) stands for PDM's centreline search over the lane graph; lanes are
known only along the route, so "in several lanes" and "oncoming traffic" are judged from the lateral
offset to the centreline against ``lane_half_width_m`` instead of lane polygons; the drivable area is
the BEV raster's (``drivable_threshold`` coverage per cell, unknown outside the raster counts as
drivable); PDM's LQR tracker is replaced by pure pursuit; near-ties go to the centreline where PDM
takes the plain argmax; agents are the observation's nearest
``tokens.agents.num_agents``. Parameters: params/pdm_closed.yaml (:class:`PdmClosedConfig`).
Deterministic: no randomness anywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.bicycle import VehicleParams, clamp_controls, steer_for_curvature
from rad2_core.bicycle import step as bicycle_step
from rad2_core.geometry import boxes_overlap
from rad2_core.lane_map import SIGNAL_RED
from rad2_core.planning_interface import PlanResult
from rad2_core.route_path import RoutePath, observation_route
from rad2_core.stop_lines import NO_STOP_M

# agent token columns (rad2_core.tokens)
_AX, _AY, _ACOS, _ASIN, _AVX, _AVY, _ALEN, _AWID, _AVEH, _AVRU = range(10)
# map token columns
_MSPEED, _MROUTE = 4, 5


@dataclass(frozen=True)
class PdmClosedConfig:
    """The ``pdm_closed`` block of params/pdm_closed.yaml (see the schema for every key)."""

    dt: float
    horizon_s: float
    speed_limit_fractions: tuple[float, ...]
    lateral_offsets_m: tuple[float, ...]
    fallback_speed: float
    path_spacing_m: float
    corridor_margin_m: float
    idm_min_gap: float
    idm_time_headway: float
    idm_a_max: float
    idm_b_max: float
    idm_delta: float
    lookahead_time_s: float
    lookahead_min_m: float
    speed_gain: float
    weight_progress: float
    weight_ttc: float
    weight_comfort: float
    progress_min_m: float
    ttc_offsets_s: tuple[float, ...]
    stopped_speed_m_s: float
    lane_half_width_m: float
    direction_ok_m: float
    direction_bad_m: float
    ahead_angle_deg: float
    behind_angle_deg: float
    drivable_threshold: float
    tie_tolerance: float
    comfort_smoothing_steps: int
    max_lon_accel: float
    min_lon_accel: float
    max_abs_lat_accel: float
    max_abs_yaw_rate: float
    max_abs_yaw_accel: float
    max_abs_lon_jerk: float
    max_abs_jerk: float
    brake_time_s: float
    brake_max_speed: float
    brake_decel: float

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PdmClosedConfig:
        """From params/pdm_closed.yaml as loaded (checked against its schema there)."""
        from rad2_core.config import require

        p = require(params, "pdm_closed")
        idm, tr, sc, br = p["idm"], p["tracker"], p["scoring"], p["emergency_brake"]
        cf = sc["comfort"]
        cfg = cls(
            dt=float(p["dt"]), horizon_s=float(p["horizon_s"]),
            speed_limit_fractions=tuple(float(v) for v in p["speed_limit_fractions"]),
            lateral_offsets_m=tuple(float(v) for v in p["lateral_offsets_m"]),
            fallback_speed=float(p["fallback_speed"]), path_spacing_m=float(p["path_spacing_m"]),
            corridor_margin_m=float(p["corridor_margin_m"]),
            idm_min_gap=float(idm["min_gap"]), idm_time_headway=float(idm["time_headway"]),
            idm_a_max=float(idm["a_max"]), idm_b_max=float(idm["b_max"]), idm_delta=float(idm["delta"]),
            lookahead_time_s=float(tr["lookahead_time_s"]), lookahead_min_m=float(tr["lookahead_min_m"]),
            speed_gain=float(tr["speed_gain"]),
            weight_progress=float(sc["weight_progress"]), weight_ttc=float(sc["weight_ttc"]),
            weight_comfort=float(sc["weight_comfort"]), progress_min_m=float(sc["progress_min_m"]),
            ttc_offsets_s=tuple(float(v) for v in sc["ttc_offsets_s"]),
            stopped_speed_m_s=float(sc["stopped_speed_m_s"]),
            lane_half_width_m=float(sc["lane_half_width_m"]),
            direction_ok_m=float(sc["direction_ok_m"]), direction_bad_m=float(sc["direction_bad_m"]),
            ahead_angle_deg=float(sc["ahead_angle_deg"]), behind_angle_deg=float(sc["behind_angle_deg"]),
            drivable_threshold=float(sc["drivable_threshold"]), tie_tolerance=float(sc["tie_tolerance"]),
            comfort_smoothing_steps=int(cf["smoothing_steps"]),
            max_lon_accel=float(cf["max_lon_accel"]), min_lon_accel=float(cf["min_lon_accel"]),
            max_abs_lat_accel=float(cf["max_abs_lat_accel"]), max_abs_yaw_rate=float(cf["max_abs_yaw_rate"]),
            max_abs_yaw_accel=float(cf["max_abs_yaw_accel"]), max_abs_lon_jerk=float(cf["max_abs_lon_jerk"]),
            max_abs_jerk=float(cf["max_abs_jerk"]),
            brake_time_s=float(br["time_to_collision_s"]), brake_max_speed=float(br["max_speed"]),
            brake_decel=float(br["decel"]),
        )
        if 0.0 not in cfg.lateral_offsets_m:
            raise ValueError("pdm_closed.lateral_offsets_m: must contain 0 (the centreline, which progress "
                             f"is measured along), got {list(cfg.lateral_offsets_m)}")
        if cfg.direction_ok_m > cfg.direction_bad_m:
            raise ValueError(f"pdm_closed.scoring.direction_ok_m {cfg.direction_ok_m} exceeds "
                             f"direction_bad_m {cfg.direction_bad_m}")
        if cfg.ahead_angle_deg > cfg.behind_angle_deg:
            raise ValueError(f"pdm_closed.scoring.ahead_angle_deg {cfg.ahead_angle_deg} exceeds "
                             f"behind_angle_deg {cfg.behind_angle_deg}")
        return cfg

    @property
    def score_steps(self) -> int:
        return int(round(self.horizon_s / self.dt))


@dataclass(frozen=True)
class DrivableGrid:
    """Where the drivable-area channel of the BEV raster lies (from the ``bev`` block of params/bev.yaml)."""

    channel: int
    resolution: float
    origin_x: float
    origin_y: float

    @classmethod
    def from_bev_config(cls, cfg) -> DrivableGrid:
        if "drivable_area" not in cfg.channels:
            raise ValueError(f"bev.channels: pdm_closed needs a drivable_area channel, got "
                             f"{list(cfg.channels)}")
        return cls(cfg.channels.index("drivable_area"), float(cfg.resolution), float(cfg.origin_x),
                   float(cfg.origin_y))

    def drivable(self, bev: np.ndarray, xy: np.ndarray, threshold: float) -> np.ndarray:
        """``xy [..., 2]`` ego-frame points -> bool: on a cell of coverage >= threshold, or off the raster
        (unknown: not held against the ego)."""
        layer = bev[self.channel]
        j = np.floor((xy[..., 0] - self.origin_x) / self.resolution).astype(np.int64)
        i = np.floor((xy[..., 1] - self.origin_y) / self.resolution).astype(np.int64)
        inside = (i >= 0) & (i < layer.shape[0]) & (j >= 0) & (j < layer.shape[1])
        cover = layer[np.clip(i, 0, layer.shape[0] - 1), np.clip(j, 0, layer.shape[1] - 1)]
        return ~inside | (cover >= threshold)


def route_speed_limit(observation, fallback: float) -> float:
    """The speed limit of the on-route lane point nearest the ego (map tokens), else ``fallback``."""
    mp = np.asarray(observation.map_polylines, dtype=np.float64)
    mm = np.asarray(observation.map_mask, bool)
    if not mm.any():
        return fallback
    pts = mp[mm].reshape(-1, mp.shape[-1])
    on = pts[pts[:, _MROUTE] > 0.5]
    on = on if len(on) else pts
    near = on[np.argmin(np.hypot(on[:, 0], on[:, 1]))]
    return float(near[_MSPEED]) if near[_MSPEED] > 0 else fallback


def _points_at(path: RoutePath, s: np.ndarray) -> np.ndarray:
    """Points at arc lengths ``s`` (any shape) on ``path``, extrapolated along the first/last segment."""
    k = np.clip(np.searchsorted(path.s0, s, side="right") - 1, 0, len(path.seg_len) - 1)
    u = (s - path.s0[k]) / path.seg_len[k]
    return path.points[k] + u[..., None] * path.seg[k]


def _resampled(route: RoutePath, spacing: float, length: float) -> np.ndarray:
    """The route every ``spacing`` metres from its start to ``length`` (straight on past its end)."""
    s = np.arange(0.0, max(length, route.length) + spacing, spacing)
    return _points_at(route, s)


def _offset(points: np.ndarray, d: float) -> np.ndarray:
    """A polyline shifted ``d`` metres to its left (normals of the central-difference tangents)."""
    if d == 0.0:
        return points
    tang = np.gradient(points, axis=0)
    tang /= np.maximum(np.linalg.norm(tang, axis=1, keepdims=True), 1e-9)
    return points + d * np.stack([-tang[:, 1], tang[:, 0]], axis=1)


def _at_steps(xy: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``xy [M, K+1, 2]`` at fractional step indices ``steps [T]`` (linear between steps) -> ``[M, T, 2]``."""
    k = np.clip(np.floor(steps).astype(int), 0, xy.shape[1] - 2)
    f = np.clip(steps - k, 0.0, 1.0)[None, :, None]
    return xy[:, k] * (1.0 - f) + xy[:, k + 1] * f


def _smooth(x: np.ndarray, n: int) -> np.ndarray:
    """Centred moving average over ``n`` samples along the last axis (edges padded with the end values)."""
    if n <= 1:
        return x
    lo, hi = (n - 1) // 2, n // 2
    pad = np.concatenate([np.repeat(x[..., :1], lo, -1), x, np.repeat(x[..., -1:], hi, -1)], -1)
    c = np.cumsum(np.concatenate([np.zeros(x.shape[:-1] + (1,)), pad], -1), -1)
    return (c[..., n:] - c[..., :-n]) / n


class PdmClosedPlanner:
    """PDM-Closed (see the module docstring); one instance per rollout, deterministic."""

    name = "pdm_closed"

    def __init__(self, config: PdmClosedConfig, vehicle: VehicleParams, grid: DrivableGrid, plan_dt: float,
                 plan_points: int):
        self.cfg = config
        self.vehicle = vehicle
        self.grid = grid
        self.plan_dt = float(plan_dt)
        self.points = int(plan_points)
        c = config
        self.fractions = np.asarray(c.speed_limit_fractions)
        # proposals: path-major (PDM's order), each path with every target speed
        self.path_of = np.repeat(np.arange(len(c.lateral_offsets_m)), len(self.fractions))
        self.fraction_of = np.tile(self.fractions, len(c.lateral_offsets_m))
        self.centre = int(c.lateral_offsets_m.index(0.0))
        # internal steps: the scored horizon, or the plan's when longer
        self.steps = max(c.score_steps, int(np.ceil(self.plan_dt * self.points / c.dt - 1e-9)))
        self.ttc_lags = np.rint(np.asarray(c.ttc_offsets_s) / c.dt).astype(int)
        self.weights = np.array([c.weight_progress, c.weight_ttc, c.weight_comfort])
        self.last_timings_ms: dict[str, float] = {}

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None:
        """Nothing carries over between cycles (PDM-Closed replans from scratch)."""

    # -- the cycle --------------------------------------------------------------------------------------
    def plan(self, observation: Any) -> PlanResult:
        t0 = time.perf_counter()
        c, veh = self.cfg, self.vehicle
        es = np.asarray(observation.ego_state, dtype=np.float64)
        v0, a0, steer0 = max(float(es[0]), 0.0), float(es[1]), float(es[3])
        limit = route_speed_limit(observation, c.fallback_speed)
        agents = self._forecast(observation)
        route = RoutePath(observation_route(observation.route, observation.route_mask))
        # resampled (and offset) as far as the fastest proposal's pure-pursuit target can reach; past
        # that, points are extrapolated along the last segment
        t_total = self.steps * c.dt
        v_max = max(v0, limit) + c.idm_a_max * t_total
        reach = v_max * t_total + max(c.lookahead_min_m, c.lookahead_time_s * v_max) + veh.length
        base = _resampled(route, c.path_spacing_m, reach)
        paths = [RoutePath(_offset(base, d)) for d in c.lateral_offsets_m]
        stop_s = self._red_stop(observation)
        s_idm, v_idm, a_idm = self._proposals(paths, agents, v0, limit, stop_s)
        states, accel = self._simulate(paths, s_idm, v_idm, a_idm, v0, steer0)
        t1 = time.perf_counter()
        scores, collide_k = self._score(observation, paths[self.centre], agents, states, accel, a0)
        best = self._select(scores)
        t2 = time.perf_counter()
        cands = _at_steps(states[..., :2], np.arange(1, self.points + 1) * self.plan_dt / c.dt)
        brake = collide_k[best] * c.dt <= c.brake_time_s and v0 <= c.brake_max_speed
        executed = self._brake_plan(states[best], v0) if brake else None
        self.last_timings_ms = {"propose": 1e3 * (t1 - t0), "score": 1e3 * (t2 - t1),
                                "total": 1e3 * (time.perf_counter() - t0)}
        return PlanResult(candidates=cands.astype(np.float32), scores=scores.astype(np.float32),
                          selected=best, plan_dt=self.plan_dt, timings_ms=dict(self.last_timings_ms),
                          executed=executed,
                          info={"policy": self.name, "emergency_brake": bool(brake), "speed_limit": limit,
                                "target_speed": float(self.fraction_of[best] * limit),
                                "lateral_offset_m": float(c.lateral_offsets_m[self.path_of[best]])})

    def _select(self, scores: np.ndarray) -> int:
        """The best proposal; of those within ``tie_tolerance`` of the best score, the one nearest the
        centreline (then the higher score, then the earlier). A proposal that has moved onto an offset
        path keeps its progress there, so plain argmax would stay beside the centreline for a
        difference of millimetres of progress."""
        offset = np.abs(np.asarray(self.cfg.lateral_offsets_m))[self.path_of]
        near = np.flatnonzero(scores >= scores.max() - self.cfg.tie_tolerance)
        return int(near[np.lexsort((-scores[near], offset[near]))[0]])

    # -- the scene ---------------------------------------------------------------------------------------
    def _forecast(self, obs) -> dict[str, np.ndarray]:
        """Agents at constant velocity over every internal step plus the TTC look-ahead:
        boxes ``[N, K, 5]``, speed ``[N]``, is_object ``[N]`` (neither vehicle nor VRU)."""
        ag = np.asarray(obs.agents, dtype=np.float64)[np.asarray(obs.agents_mask, bool)]
        k = self.steps + int(self.ttc_lags.max(initial=0)) + 1
        tau = np.arange(k) * self.cfg.dt
        boxes = np.zeros((len(ag), k, 5))
        boxes[..., 0] = ag[:, None, _AX] + ag[:, None, _AVX] * tau
        boxes[..., 1] = ag[:, None, _AY] + ag[:, None, _AVY] * tau
        boxes[..., 2] = np.arctan2(ag[:, _ASIN], ag[:, _ACOS])[:, None]
        boxes[..., 3] = ag[:, None, _ALEN]
        boxes[..., 4] = ag[:, None, _AWID]
        return {"boxes": boxes, "vel": ag[:, _AVX:_AVY + 1], "speed": np.hypot(ag[:, _AVX], ag[:, _AVY]),
                "is_object": (ag[:, _AVEH] < 0.5) & (ag[:, _AVRU] < 0.5)}

    def _red_stop(self, obs) -> float | None:
        """Distance along the route from the ego's centre to a red stop line the ego's front has not
        crossed (a stopped object for the proposals), or None."""
        ss = np.asarray(obs.signal_stop, dtype=np.float64)
        dist, state = float(ss[0]), int(round(float(ss[1])))
        if dist >= NO_STOP_M or state != SIGNAL_RED or dist - 0.5 * self.vehicle.length <= 0.0:
            return None
        return dist

    # -- proposals ----------------------------------------------------------------------------------------
    def _proposals(self, paths, agents, v0: float, limit: float, stop_s: float | None):
        """IDM along every path: arc length, speed and acceleration ``[M, K+1]`` (acceleration at k drives
        step k -> k+1)."""
        c = self.cfg
        n_paths, m, kk = len(paths), len(self.path_of), self.steps
        boxes = agents["boxes"][:, : kk + 1]
        n = len(boxes)
        s0 = np.array([float(p.project(np.zeros(2))[0]) for p in paths])
        # each agent's place on each path: arc length of its centre (inf: its box does not reach into
        # the ego-wide corridor), of its rear end, and its speed along the path
        lead_c = np.full((n_paths, n, kk + 1), np.inf)
        lead_rear = np.full((n_paths, n, kk + 1), np.inf)
        lead_v = np.zeros((n_paths, n, kk + 1))
        if n:
            ego_now = np.array([0.0, 0.0, 0.0, self.vehicle.length, self.vehicle.width])
            now = boxes_overlap(ego_now, boxes[:, 0])
            for p, path in enumerate(paths):
                s, lat, head = path.project(boxes[..., :2])
                rel = boxes[..., 2] - head
                half_lat = 0.5 * (boxes[..., 3] * np.abs(np.sin(rel)) + boxes[..., 4] * np.abs(np.cos(rel)))
                half_lon = 0.5 * (boxes[..., 3] * np.abs(np.cos(rel)) + boxes[..., 4] * np.abs(np.sin(rel)))
                inside = np.abs(lat) - half_lat < 0.5 * self.vehicle.width + c.corridor_margin_m
                inside &= ~now[:, None]  # an agent the ego already touches is not followed (nuPlan drops it)
                lead_c[p] = np.where(inside, s, np.inf)
                lead_rear[p] = s - half_lon
                vel = agents["vel"][:, None, :]
                lead_v[p] = np.maximum(vel[..., 0] * np.cos(head) + vel[..., 1] * np.sin(head), 0.0)
        target = np.maximum(self.fraction_of * limit, 0.1)
        s = np.empty((m, kk + 1))
        v = np.empty((m, kk + 1))
        a = np.zeros((m, kk + 1))
        s[:, 0], v[:, 0] = s0[self.path_of], v0
        half_ego = 0.5 * self.vehicle.length
        sqrt_ab = 2.0 * np.sqrt(c.idm_a_max * c.idm_b_max)
        rows = np.arange(m)
        for k in range(1, kk + 1):
            sk, vk = s[:, k - 1], v[:, k - 1]
            # leader at step k: of the agents in the corridor whose centre is ahead of the ego's, the one
            # whose rear end is nearest
            gap = np.full(m, np.inf)
            vl = np.zeros(m)
            if n:
                centre_s = lead_c[self.path_of, :, k]
                ahead = np.isfinite(centre_s) & (centre_s > sk[:, None])
                rear = np.where(ahead, lead_rear[self.path_of, :, k], np.inf)
                j = np.argmin(rear, axis=1)
                gap = rear[rows, j] - (sk + half_ego)
                vl = np.where(np.isfinite(gap), lead_v[self.path_of, j, k], 0.0)
            if stop_s is not None:
                g_stop = s0[self.path_of] + stop_s - (sk + half_ego)
                stop_first = g_stop < gap
                gap, vl = np.where(stop_first, g_stop, gap), np.where(stop_first, 0.0, vl)
            acc = c.idm_a_max * (1.0 - (vk / target) ** c.idm_delta)
            has = np.isfinite(gap)
            s_star = c.idm_min_gap + vk * c.idm_time_headway + vk * (vk - vl) / sqrt_ab
            acc = acc - np.where(has, c.idm_a_max * (s_star / np.maximum(gap, c.idm_min_gap)) ** 2, 0.0)
            acc = np.clip(acc, -c.idm_b_max, c.idm_a_max)
            v_new = np.maximum(vk + c.dt * acc, 0.0)
            a[:, k - 1] = (v_new - vk) / c.dt
            s[:, k] = sk + 0.5 * c.dt * (vk + v_new)
            v[:, k] = v_new
        return s, v, a

    def _simulate(self, paths, s_idm, v_idm, a_idm, v0: float, steer0: float):
        """Every proposal driven by the bicycle model from the ego's state: states ``[M, K+1, 5]`` (ego
        frame) and the applied accelerations ``[M, K]``."""
        c, veh = self.cfg, self.vehicle
        m, kk = s_idm.shape[0], self.steps
        x = np.zeros((m, 5))
        x[:, 3], x[:, 4] = v0, np.clip(steer0, -veh.max_steer, veh.max_steer)
        out = np.empty((m, kk + 1, 5))
        out[:, 0] = x
        accel = np.empty((m, kk))
        groups = [np.flatnonzero(self.path_of == p) for p in range(len(paths))]
        for k in range(kk):
            target = np.empty((m, 2))
            for p, rows in enumerate(groups):
                s_here = paths[p].project(x[rows, :2])[0]
                look = np.maximum(c.lookahead_min_m, c.lookahead_time_s * x[rows, 3])
                target[rows] = _points_at(paths[p], s_here + look)
            dx, dy = target[:, 0] - x[:, 0], target[:, 1] - x[:, 1]
            dist = np.maximum(np.hypot(dx, dy), 1e-3)
            alpha = np.arctan2(dy, dx) - x[:, 2]
            steer = steer_for_curvature(2.0 * np.sin(alpha) / dist, veh)
            u = np.stack([a_idm[:, k] + c.speed_gain * (v_idm[:, k] - x[:, 3]), (steer - x[:, 4]) / c.dt], -1)
            u = clamp_controls(x, u, veh, c.dt)
            accel[:, k] = u[:, 0]
            x = bicycle_step(x, u, veh, c.dt)
            out[:, k + 1] = x
        return out, accel

    # -- scoring -------------------------------------------------------------------------------------------
    def _score(self, obs, centre: RoutePath, agents, states, accel, a0: float):
        """Scores ``[M]`` in [0, 1] and the step of each proposal's first at-fault collision (inf: none)."""
        c, veh = self.cfg, self.vehicle
        kk = c.score_steps
        st = states[:, : kk + 1]
        m = len(st)
        sizes = np.broadcast_to([veh.length, veh.width], st.shape[:2] + (2,))
        ego_boxes = np.concatenate([st[..., :3], sizes], -1)
        # areas: corners on the drivable area; centre/corners within the route's lane
        cs, sn = np.cos(st[..., 2]), np.sin(st[..., 2])
        hl, hw = 0.5 * veh.length, 0.5 * veh.width
        lon = np.array([hl, hl, -hl, -hl])
        latc = np.array([hw, -hw, -hw, hw])
        corners = np.stack([st[..., None, 0] + cs[..., None] * lon - sn[..., None] * latc,
                            st[..., None, 1] + sn[..., None] * lon + cs[..., None] * latc], -1)
        off_drivable = ~self.grid.drivable(np.asarray(obs.bev), corners, c.drivable_threshold).all(-1)
        s_c, lat_c, _ = centre.project(st[..., :2])
        multi_lane = np.abs(lat_c) + hw > c.lane_half_width_m
        off_lane = np.abs(lat_c) > c.lane_half_width_m
        loose = multi_lane | off_drivable  # where a side contact is the ego's fault
        # multipliers
        no_collision, collide_k = self._at_fault(ego_boxes, st, agents, loose)
        drivable = np.where(off_drivable.any(1), 0.0, 1.0)
        step_len = np.linalg.norm(np.diff(st[..., :2], axis=1), axis=-1)
        step_len = np.concatenate([np.zeros((m, 1)), step_len], 1)
        direction = np.ones(m)
        for i in range(m):
            runs = np.split(np.where(off_lane[i], step_len[i], 0.0), np.flatnonzero(np.diff(off_lane[i])) + 1)
            worst = max(r.sum() for r in runs)
            direction[i] = 1.0 if worst < c.direction_ok_m else (0.5 if worst < c.direction_bad_m else 0.0)
        gate = no_collision * drivable * direction
        # weighted terms
        raw = (s_c[:, -1] - s_c[:, 0]) * gate
        best = raw.max(initial=0.0)
        progress = raw / best if best > c.progress_min_m else np.where(gate > 0.0, 1.0, 0.0)
        ttc = self._ttc(ego_boxes, st, agents, loose)
        comfort = self._comfortable(st, accel[:, :kk], a0)
        terms = np.stack([progress, ttc, comfort])
        return gate * (self.weights @ terms) / self.weights.sum(), collide_k

    def _relation(self, st, boxes_xy):
        """(ahead, behind) ``[M, K, N]``: the agent centre within ``ahead_angle_deg`` of the ego's heading /
        beyond ``behind_angle_deg`` from it, seen from the rear axle."""
        c = self.cfg
        heading = np.stack([np.cos(st[..., 2]), np.sin(st[..., 2])], -1)
        rear = st[..., :2] - self.vehicle.rear_axle_to_center * heading
        d = boxes_xy.transpose(1, 0, 2)[None] - rear[:, :, None, :]  # [M, K, N, 2]
        ang = np.abs(np.angle(np.exp(1j * (np.arctan2(d[..., 1], d[..., 0]) - st[..., 2][..., None]))))
        return ang <= np.deg2rad(c.ahead_angle_deg), ang >= np.deg2rad(c.behind_angle_deg)

    def _at_fault(self, ego_boxes, st, agents, loose):
        """nuPlan's at-fault collision multiplier per proposal and its first step (inf: none)."""
        c = self.cfg
        m, k1 = st.shape[:2]
        boxes = agents["boxes"][:, :k1]
        n = len(boxes)
        score = np.ones(m)
        first = np.full(m, np.inf)
        if not n:
            return score, first
        hit = boxes_overlap(ego_boxes[:, :, None, :], boxes.transpose(1, 0, 2)[None])  # [M, K, N]
        hit &= ~hit[:, :1]  # agents touching the ego now are out of its hands (nuPlan drops them)
        if not hit.any():
            return score, first
        # only the first contact with each agent counts
        first_contact = hit & (np.cumsum(hit, axis=1) == 1)
        ego_stopped = st[..., 3] < c.stopped_speed_m_s
        agent_stopped = agents["speed"] < c.stopped_speed_m_s
        _, behind = self._relation(st, boxes[..., :2])
        front = ego_boxes.copy()
        strip = 0.1
        front[..., 0] += (0.5 * self.vehicle.length - 0.5 * strip) * np.cos(st[..., 2])
        front[..., 1] += (0.5 * self.vehicle.length - 0.5 * strip) * np.sin(st[..., 2])
        front[..., 3] = strip
        front_hit = boxes_overlap(front[:, :, None, :], boxes.transpose(1, 0, 2)[None])
        fault = ~ego_stopped[..., None] & (agent_stopped[None, None] | (
            ~behind & (front_hit | loose[..., None])))
        fault &= first_contact
        for i, kx, j in zip(*np.nonzero(fault)):
            score[i] = min(score[i], 0.5 if agents["is_object"][j] else 0.0)
            first[i] = min(first[i], kx)
        return score, first

    def _ttc(self, ego_boxes, st, agents, loose):
        """1 unless the ego box, moved on at its speed by a TTC offset, meets an agent ahead (or one not
        behind while the ego is loose) at that later time; a standing ego has no TTC."""
        c = self.cfg
        m, k1 = st.shape[:2]
        out = np.ones(m)
        boxes = agents["boxes"]
        if not len(boxes):
            return out
        now = boxes_overlap(ego_boxes[:, :, None, :], boxes[:, :k1].transpose(1, 0, 2)[None])
        ahead, behind = self._relation(st, boxes[:, :k1, :2])
        counts = (ahead | (loose[..., None] & ~behind)) & ~now & ~now[:, :1]
        counts &= (st[..., 3] >= c.stopped_speed_m_s)[..., None]
        heading = np.stack([np.cos(st[..., 2]), np.sin(st[..., 2])], -1)
        for lag in self.ttc_lags:
            moved = ego_boxes.copy()
            moved[..., :2] += heading * (st[..., 3:4] * lag * c.dt)
            later = boxes[:, lag: lag + k1].transpose(1, 0, 2)[None]
            meet = boxes_overlap(moved[:, :, None, :], later) & counts
            out[meet.any(axis=(1, 2))] = 0.0
        return out

    def _comfortable(self, st, accel, a0: float):
        """1 where the simulated proposal keeps every nuPlan comfort bound (signals smoothed over
        ``comfort_smoothing_steps`` like nuPlan's filtered derivatives), else 0."""
        c = self.cfg
        dt = c.dt
        lon = _smooth(np.concatenate([np.full((len(st), 1), a0), accel], 1), c.comfort_smoothing_steps)
        yaw_rate = _smooth(np.diff(np.unwrap(st[..., 2], axis=1), axis=1) / dt, c.comfort_smoothing_steps)
        v_mid = 0.5 * (st[:, 1:, 3] + st[:, :-1, 3])
        lat = v_mid * yaw_rate
        lon_jerk = np.diff(lon, axis=1) / dt
        lat_jerk = np.diff(lat, axis=1) / dt
        ok = (lon.max(1) <= c.max_lon_accel) & (lon.min(1) >= c.min_lon_accel)
        ok &= np.abs(lat).max(1) <= c.max_abs_lat_accel
        ok &= np.abs(yaw_rate).max(1) <= c.max_abs_yaw_rate
        ok &= np.abs(np.diff(yaw_rate, axis=1) / dt).max(1, initial=0.0) <= c.max_abs_yaw_accel
        ok &= np.abs(lon_jerk).max(1) <= c.max_abs_lon_jerk
        ok &= np.hypot(lon_jerk[:, 1:], lat_jerk).max(1, initial=0.0) <= c.max_abs_jerk
        return ok.astype(np.float64)

    # -- emergency stop ---------------------------------------------------------------------------------
    def _brake_plan(self, states, v0: float) -> np.ndarray:
        """A stop at ``brake_decel`` along the positions of ``states`` (its driven path), at plan times."""
        path_xy = np.vstack([states[:, :2], states[-1:, :2] + 1e-3])
        cum = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(path_xy, axis=0).T))])
        t = np.arange(1, self.points + 1) * self.plan_dt
        t_stop = v0 / self.cfg.brake_decel
        tc = np.minimum(t, t_stop)
        s = v0 * tc - 0.5 * self.cfg.brake_decel * tc**2
        return np.stack([np.interp(s, cum, path_xy[:, 0]), np.interp(s, cum, path_xy[:, 1])], -1)


def make_pdm_closed(params: dict[str, Any], **_: Any) -> PdmClosedPlanner:
    """The registered factory: ``params`` holds params/{planner,pdm_closed,vehicle,bev}.yaml as the
    entry point loaded them, merged."""
    from rad2_core.bev import get_config

    cfg = PdmClosedConfig.from_params(params)
    vehicle = VehicleParams.from_params(params)
    grid = DrivableGrid.from_bev_config(get_config(params))
    return PdmClosedPlanner(cfg, vehicle, grid, float(params["planner"]["plan_dt"]),
                            int(params["planner"]["plan_points"]))
