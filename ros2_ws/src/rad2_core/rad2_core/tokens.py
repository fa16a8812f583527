"""Token tensors the networks consume, all in the ego frame, float32, fixed sizes with masks.

- map polylines ``[N_map, P, 8]``: nearest lane centrelines (within ``tokens.map.range_m``), each
  cropped to ``tokens.map.max_length_m`` around its closest point and resampled to P points evenly
  in arc length; per point x, y, cos h, sin h, speed limit (m/s), on_route (0/1), signal_stop (the
  light controlling the lane: red 1, yellow 0.5, else 0), signal_go (green 1, else 0) — both 0 on a
  lane no known light controls;
- agents ``[N_agents, 10]``: nearest valid agents within ``tokens.agents.range_m``: x, y, cos yaw,
  sin yaw, vx, vy (ego frame), length, width, is_vehicle, is_vru;
- route ``[N_route, 4]``: points every ``tokens.route.spacing_m`` along the route polyline from the
  ego's projection onto it: x, y, cos h, sin h (masked past the route's end).
Padding rows are zero and masked False; valid rows come first, nearest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE
from rad2_core.config import cached_by_block, require
from rad2_core.geometry import rotate_vectors, world_to_ego
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW, LaneMap

MAP_FEATURES = 8
# Map-token features before the per-lane signal state was added (checkpoints trained then take these).
MAP_FEATURES_WITHOUT_SIGNALS = 6
# (signal_stop, signal_go) of a lane by the state of its light
_SIGNAL_FEATURES = {SIGNAL_RED: (1.0, 0.0), SIGNAL_YELLOW: (0.5, 0.0), SIGNAL_GREEN: (0.0, 1.0)}
AGENT_FEATURES = 10
ROUTE_FEATURES = 4


class TokenError(ValueError):
    """Bad token input or configuration."""


@dataclass(frozen=True)
class TokenConfig:
    n_map: int
    points: int
    map_range: float
    max_length: float
    n_agents: int
    agent_range: float
    n_route: int
    route_spacing: float

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TokenConfig:
        """From params/bev.yaml as loaded (its schema bounds the sizes: at least one row, two points)."""
        return cls(
            n_map=int(require(params, "tokens.map.num_polylines")),
            points=int(require(params, "tokens.map.points_per_polyline")),
            map_range=float(require(params, "tokens.map.range_m")),
            max_length=float(require(params, "tokens.map.max_length_m")),
            n_agents=int(require(params, "tokens.agents.num_agents")),
            agent_range=float(require(params, "tokens.agents.range_m")),
            n_route=int(require(params, "tokens.route.num_points")),
            route_spacing=float(require(params, "tokens.route.spacing_m")),
        )


_CACHE: dict[str, TokenConfig] = {}


def get_token_config(params: dict[str, Any] | TokenConfig) -> TokenConfig:
    """TokenConfig of a params dict (cached by the content of its ``tokens`` block)."""
    if isinstance(params, TokenConfig):
        return params
    return cached_by_block(_CACHE, params, "tokens", TokenConfig.from_params)


# ----------------------------------------------------------------------------------------------
# polyline helpers
# ----------------------------------------------------------------------------------------------
def arc_lengths(poly: np.ndarray) -> np.ndarray:
    """Cumulative arc length at each vertex of a [P, 2] polyline (0 at the first)."""
    seg = np.linalg.norm(np.diff(poly, axis=0), axis=1)
    return np.concatenate([[0.0], np.cumsum(seg)])


def clean_polyline(poly, min_step: float, pad: float | None = None) -> np.ndarray:
    """Drop vertices within ``min_step`` of their predecessor. A polyline left with one point gets a
    second one ``pad`` metres along +x (``pad`` None: returned as it is)."""
    pts = np.asarray(poly, np.float64)
    keep = np.concatenate([[True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > min_step])
    pts = pts[keep]
    if pad is not None and len(pts) < 2:
        pts = np.vstack([pts[:1], pts[:1] + [pad, 0.0]])
    return pts


def resample_polyline(poly: np.ndarray, s: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
    """Points at arc lengths ``s`` (clamped to the polyline) -> [len(s), 4] x, y, cos h, sin h."""
    poly = np.asarray(poly, np.float64)
    cum = arc_lengths(poly) if cum is None else cum
    s = np.clip(s, 0.0, cum[-1])
    x = np.interp(s, cum, poly[:, 0])
    y = np.interp(s, cum, poly[:, 1])
    d = np.diff(poly, axis=0)
    k = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(d) - 1)
    # skip zero-length segments for headings
    h = np.arctan2(d[k, 1], d[k, 0])
    return np.stack([x, y, np.cos(h), np.sin(h)], axis=-1)


def project_onto_polyline(poly: np.ndarray, point: np.ndarray, cum: np.ndarray | None = None):
    """(arc length of the closest point, distance) of ``point`` to the polyline."""
    poly = np.asarray(poly, np.float64)
    cum = arc_lengths(poly) if cum is None else cum
    a, d = poly[:-1], np.diff(poly, axis=0)
    l2 = np.maximum(np.sum(d * d, axis=1), 1e-12)
    u = np.clip(np.sum((point - a) * d, axis=1) / l2, 0.0, 1.0)
    proj = a + u[:, None] * d
    dist = np.linalg.norm(proj - point, axis=1)
    k = int(np.argmin(dist))
    return float(cum[k] + u[k] * np.sqrt(l2[k])), float(dist[k])


class PreparedLanes:
    """Per-map cache: deduplicated centrelines with arc lengths and bounding boxes."""

    def __init__(self, lane_map: LaneMap):
        self.map_id = lane_map.map_id
        self.lines, self.cums = [], []
        for cl in lane_map.centerlines:
            cl = clean_polyline(cl, 1e-6, pad=1e-3)
            self.lines.append(cl)
            self.cums.append(arc_lengths(cl))
        self.points = np.concatenate(self.lines)
        self.owner = np.concatenate([np.full(len(c), k) for k, c in enumerate(self.lines)])
        self.speed = np.asarray(lane_map.speed_limits, np.float64)
        self.lane_ids = np.asarray(lane_map.lane_ids, np.int64)
        # segments for distance queries
        self.seg_a = np.concatenate([c[:-1] for c in self.lines])
        self.seg_d = np.concatenate([np.diff(c, axis=0) for c in self.lines])
        self.seg_owner = np.concatenate([np.full(len(c) - 1, k) for k, c in enumerate(self.lines)])
        self.seg_s0 = np.concatenate([cu[:-1] for cu in self.cums])
        self.seg_l2 = np.maximum(np.sum(self.seg_d**2, axis=1), 1e-12)
        # All lanes on one arc-length axis, each shifted past the previous one's end by a metre, so that
        # one np.interp / np.searchsorted call resamples any set of lanes at once (map_tokens).
        self.total = np.array([cu[-1] for cu in self.cums])
        self.axis_offset = np.concatenate([[0.0], np.cumsum(self.total + 1.0)[:-1]])
        self.axis_s = np.concatenate([cu + off for cu, off in zip(self.cums, self.axis_offset)])
        sizes = np.array([len(c) for c in self.lines])
        self.point_start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.seg_start = self.point_start - np.arange(len(sizes))  # lane k's first segment
        self.point_dir = np.diff(self.points, axis=0)  # rows at a lane's last point are never used


_LANES_CACHE: dict[str, PreparedLanes] = {}


def prepare_lanes(lane_map: LaneMap) -> PreparedLanes:
    pl = _LANES_CACHE.get(lane_map.map_id)
    if pl is None:
        if len(_LANES_CACHE) > 32:
            _LANES_CACHE.clear()
        pl = PreparedLanes(lane_map)
        _LANES_CACHE[lane_map.map_id] = pl
    return pl


# ----------------------------------------------------------------------------------------------
# token builders
# ----------------------------------------------------------------------------------------------
def signal_features(state: int) -> tuple[float, float]:
    """(signal_stop, signal_go) map-token features of a lane whose light is in ``state`` (SIGNAL_*)."""
    return _SIGNAL_FEATURES.get(int(state), (0.0, 0.0))


def signal_state_of_features(stop: float, go: float) -> int:
    """The SIGNAL_* state whose :func:`signal_features` are nearest to (stop, go)."""
    candidates = {**_SIGNAL_FEATURES, SIGNAL_UNKNOWN: (0.0, 0.0)}
    return min(candidates, key=lambda s: (candidates[s][0] - stop) ** 2 + (candidates[s][1] - go) ** 2)


def map_tokens(
    lane_map: LaneMap,
    ego_pose,
    route_lane_ids=None,
    route_polyline=None,
    *,
    params: dict[str, Any] | TokenConfig,
    signal_states=None,
) -> tuple[np.ndarray, np.ndarray]:
    """([N_map, P, MAP_FEATURES] float32, [N_map] bool) nearest-lane polylines in the ego frame.

    ``signal_states`` ([S] SIGNAL_* of the map's signals now, None: not known) fill signal_stop/go.

    Vectorised over lanes (one pass over the map's segments, one resampling call for all chosen
    lanes): the simulator builds these for every logged frame it warps.
    """
    cfg = get_token_config(params)
    pose = np.asarray(ego_pose, np.float64)
    pl = prepare_lanes(lane_map)
    out = np.zeros((cfg.n_map, cfg.points, MAP_FEATURES), np.float32)
    mask = np.zeros(cfg.n_map, bool)
    p = pose[:2]
    u = np.clip(np.sum((p - pl.seg_a) * pl.seg_d, axis=1) / pl.seg_l2, 0.0, 1.0)
    dist = np.linalg.norm(pl.seg_a + u[:, None] * pl.seg_d - p, axis=1)
    # segments are stored lane after lane: per-lane minimum and its first segment (np.argmin's tie rule)
    lane_dist = np.minimum.reduceat(dist, pl.seg_start)
    order = np.argsort(lane_dist, kind="stable")
    order = order[lane_dist[order] <= cfg.map_range][: cfg.n_map]
    n = len(order)
    if n == 0:
        return out, mask
    at_min = np.flatnonzero(dist == lane_dist[pl.seg_owner])
    lanes_at_min, first = np.unique(pl.seg_owner[at_min], return_index=True)
    j = at_min[first][np.searchsorted(lanes_at_min, order)]
    s_closest = pl.seg_s0[j] + u[j] * np.sqrt(pl.seg_l2[j])  # arc length of the closest point
    on_route = _on_route(pl, order, route_lane_ids, route_polyline)
    # arc lengths of the P samples of each chosen lane: a window of max_length_m starting a quarter
    # of it behind the closest point (clamped to the lane), or the whole lane when it is shorter
    frac = np.linspace(0.0, 1.0, cfg.points)
    total = pl.total[order]
    start = np.minimum(np.maximum(s_closest - 0.25 * cfg.max_length, 0.0), total - cfg.max_length)
    long_lane = total > cfg.max_length
    s = np.where(long_lane[:, None], start[:, None] + frac * cfg.max_length, frac * total[:, None])
    s = np.clip(s, 0.0, total[:, None]) + pl.axis_offset[order][:, None]
    x = np.interp(s, pl.axis_s, pl.points[:, 0])
    y = np.interp(s, pl.axis_s, pl.points[:, 1])
    first_pt = pl.point_start[order][:, None]
    last_seg = first_pt + np.array([len(pl.lines[k]) for k in order])[:, None] - 2
    seg = np.clip(np.searchsorted(pl.axis_s, s, side="right") - 1, first_pt, last_seg)
    h = np.arctan2(pl.point_dir[seg, 1], pl.point_dir[seg, 0])
    out[:n, :, 0:2] = world_to_ego(np.stack([x, y], axis=-1), pose)
    out[:n, :, 2:4] = rotate_vectors(np.stack([np.cos(h), np.sin(h)], axis=-1), -pose[2])
    out[:n, :, 4] = pl.speed[order][:, None]
    out[:n, :, 5] = on_route[:, None]
    if signal_states is not None and lane_map.num_signals:
        lane_states = lane_map.lane_signal_states(signal_states)[order]
        for state, (stop, go) in _SIGNAL_FEATURES.items():
            hit = lane_states == state
            out[:n][hit, :, 6] = stop
            out[:n][hit, :, 7] = go
    mask[:n] = True
    return out, mask


def _on_route(pl: PreparedLanes, order: np.ndarray, route_lane_ids, route_polyline) -> np.ndarray:
    if route_lane_ids is not None and len(route_lane_ids):
        ids = set(int(v) for v in np.asarray(route_lane_ids).reshape(-1))
        return np.array([1.0 if int(pl.lane_ids[k]) in ids else 0.0 for k in order])
    if route_polyline is None or len(route_polyline) < 2:
        return np.zeros(len(order))
    rp = np.asarray(route_polyline, np.float64)
    flags = []
    for k in order:
        pts = pl.lines[k][:: max(1, len(pl.lines[k]) // 5)]
        d = [project_onto_polyline(rp, q)[1] for q in pts]
        flags.append(1.0 if np.mean(d) < 1.0 else 0.0)
    return np.array(flags)


def agent_tokens(agents, ego_pose, params: dict[str, Any] | TokenConfig):
    """([N_agents, 10] float32, [N_agents] bool) from an AgentFrame-like object (world frame)."""
    cfg = get_token_config(params)
    pose = np.asarray(ego_pose, np.float64)
    out = np.zeros((cfg.n_agents, AGENT_FEATURES), np.float32)
    mask = np.zeros(cfg.n_agents, bool)
    if len(agents.x) == 0:
        return out, mask
    xy = world_to_ego(np.stack([agents.x, agents.y], axis=-1), pose)
    d = np.linalg.norm(xy, axis=1)
    order = np.argsort(d, kind="stable")
    order = order[d[order] <= cfg.agent_range][: cfg.n_agents]
    n = len(order)
    if n == 0:
        return out, mask
    yaw = agents.yaw[order] - pose[2]
    vel = rotate_vectors(np.stack([agents.vx[order], agents.vy[order]], axis=-1), -pose[2])
    types = agents.types[order]
    out[:n, 0:2] = xy[order]
    out[:n, 2] = np.cos(yaw)
    out[:n, 3] = np.sin(yaw)
    out[:n, 4:6] = vel
    out[:n, 6] = agents.length[order]
    out[:n, 7] = agents.width[order]
    out[:n, 8] = types == AGENT_VEHICLE
    out[:n, 9] = (types == AGENT_PEDESTRIAN) | (types == AGENT_CYCLIST)
    mask[:n] = True
    return out, mask


def route_tokens(route_polyline, ego_pose, params: dict[str, Any] | TokenConfig):
    """([N_route, 4] float32, [N_route] bool): route points ahead of the ego's projection."""
    cfg = get_token_config(params)
    pose = np.asarray(ego_pose, np.float64)
    out = np.zeros((cfg.n_route, ROUTE_FEATURES), np.float32)
    mask = np.zeros(cfg.n_route, bool)
    rp = np.asarray(route_polyline, np.float64)
    if rp.ndim != 2 or rp.shape[0] < 2 or rp.shape[1] != 2:
        raise TokenError(f"route_polyline: shape {rp.shape} is not [Pr >= 2, 2]")
    rp = clean_polyline(rp, 1e-6)
    if len(rp) < 2:
        return out, mask
    cum = arc_lengths(rp)
    s0, _ = project_onto_polyline(rp, pose[:2], cum)
    s = s0 + np.arange(cfg.n_route) * cfg.route_spacing
    valid = s <= cum[-1] + 1e-9
    pts = resample_polyline(rp, s, cum)
    out[:, 0:2] = world_to_ego(pts[:, :2], pose)
    out[:, 2:4] = rotate_vectors(pts[:, 2:4], -pose[2])
    out[~valid] = 0.0
    mask[:] = valid
    return out, mask
