"""Real-dataset adapters into :class:`rad2_planner.clip.Clip` plus the helpers they share.

- :mod:`rad2_planner.adapters.av2`: Argoverse 2 motion forecasting (parquet + log map JSON).
- :mod:`rad2_planner.adapters.commonroad`: CommonRoad XML (e.g. NGSIM-derived scenarios).

Shared here: logged-path-to-lane matching (a small Viterbi over lanes with successor-aware
transitions), route construction, speed/acceleration from logged tracks, and :func:`logged_clip`,
which turns the arrays an adapter read into a validated clip.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..clip import Clip, LaneMap
from ..config import load_params, require
from ..geometry import wrap_angle
from ..tokens import arc_lengths, clean_polyline


def polyline_length(poly: np.ndarray) -> float:
    poly = np.asarray(poly, dtype=np.float64)
    return float(arc_lengths(poly)[-1]) if len(poly) > 1 else 0.0


def accel_from_speed(speed: np.ndarray, dt: float) -> np.ndarray:
    """Longitudinal acceleration (m/s^2) by central differences of the logged speed."""
    speed = np.asarray(speed, dtype=np.float64)
    if len(speed) < 2:
        return np.zeros_like(speed)
    return np.gradient(speed, dt)


def _lane_segments(lane_map: LaneMap):
    """All centreline segments: start points, vectors, lengths, headings, owning lane index."""
    starts, vecs, owner = [], [], []
    for k, cl in enumerate(lane_map.centerlines):
        d = np.diff(cl, axis=0)
        keep = np.linalg.norm(d, axis=1) > 1e-6
        if not keep.any():
            continue
        starts.append(cl[:-1][keep])
        vecs.append(d[keep])
        owner.append(np.full(int(keep.sum()), k))
    starts = np.concatenate(starts)
    vecs = np.concatenate(vecs)
    owner = np.concatenate(owner)
    return starts, vecs, owner


def lane_match_costs(lane_map: LaneMap, xy: np.ndarray, yaw: np.ndarray, heading_weight: float) -> np.ndarray:
    """[T, L] cost of each pose lying on each lane: distance to the centreline (m) plus
    ``heading_weight`` x heading difference (rad) to the closest segment."""
    xy = np.asarray(xy, dtype=np.float64)
    starts, vecs, owner = _lane_segments(lane_map)
    seg_len2 = np.sum(vecs**2, axis=1)
    rel = xy[:, None, :] - starts[None]
    u = np.clip(np.sum(rel * vecs[None], axis=-1) / seg_len2[None], 0.0, 1.0)
    proj = starts[None] + u[..., None] * vecs[None]
    dist = np.linalg.norm(xy[:, None, :] - proj, axis=-1)
    seg_heading = np.arctan2(vecs[:, 1], vecs[:, 0])
    dh = np.abs(wrap_angle(np.asarray(yaw)[:, None] - seg_heading[None]))
    cost_seg = dist + heading_weight * dh
    costs = np.full((len(xy), lane_map.num_lanes), np.inf)
    for k in range(lane_map.num_lanes):
        sel = owner == k
        if sel.any():
            costs[:, k] = cost_seg[:, sel].min(axis=1)
    return costs


def match_path_to_lanes(
    lane_map: LaneMap,
    xy: np.ndarray,
    yaw: np.ndarray,
    heading_weight: float,
    change_penalty: float,
    lane_allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Most likely lane index per pose: Viterbi with free stay/successor transitions and a
    ``change_penalty`` (m) for any other switch (lane changes, map gaps)."""
    costs = lane_match_costs(lane_map, xy, yaw, heading_weight)
    if lane_allowed is not None and np.any(lane_allowed):
        costs[:, ~np.asarray(lane_allowed, bool)] += 1e3
    n = lane_map.num_lanes
    index = lane_map.lane_index()
    trans = np.full((n, n), float(change_penalty))
    np.fill_diagonal(trans, 0.0)
    for i, succ in enumerate(lane_map.successors):
        for s in succ:
            if int(s) in index:
                trans[i, index[int(s)]] = 0.0
    acc = costs[0].copy()
    back = np.zeros((len(xy), n), dtype=np.int64)
    for t in range(1, len(xy)):
        total = acc[:, None] + trans
        back[t] = np.argmin(total, axis=0)
        acc = total[back[t], np.arange(n)] + costs[t]
    path = np.zeros(len(xy), dtype=np.int64)
    path[-1] = int(np.argmin(acc))
    for t in range(len(xy) - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


def _successor_path(lane_map: LaneMap, a: int, b: int, max_depth: int = 4) -> list[int] | None:
    """Lane indices strictly between a and b along successors (BFS), or None."""
    index = lane_map.lane_index()
    queue = deque([(a, [])])
    seen = {a}
    while queue:
        k, mids = queue.popleft()
        if len(mids) > max_depth:
            continue
        for s in lane_map.successors[k]:
            j = index.get(int(s))
            if j is None:
                continue
            if j == b:
                return mids
            if j not in seen:
                seen.add(j)
                queue.append((j, mids + [j]))
    return None


def _heading_at(poly: np.ndarray, end: bool) -> float:
    d = poly[-1] - poly[-2] if end else poly[1] - poly[0]
    return float(np.arctan2(d[1], d[0]))


def build_route(
    lane_map: LaneMap,
    xy: np.ndarray,
    yaw: np.ndarray,
    extension_m: float,
    heading_weight: float,
    change_penalty: float,
    lane_allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The route a logged ego path follows: (route_lane_ids [R], route_polyline [Pr, 2]).

    Lanes traversed by the path (gaps bridged through successors), then extended along the
    straightest successors until ``extension_m`` beyond the last pose's lane end is covered.
    """
    per_pose = match_path_to_lanes(lane_map, xy, yaw, heading_weight, change_penalty, lane_allowed)
    seq: list[int] = []
    for k in per_pose.tolist():
        if not seq or seq[-1] != k:
            seq.append(k)
    chained: list[int] = [seq[0]]
    for k in seq[1:]:
        mids = _successor_path(lane_map, chained[-1], k)
        if mids:
            chained.extend(m for m in mids if m not in chained)
        if k not in chained:
            chained.append(k)
    index = lane_map.lane_index()
    # how far the last lane continues past the last pose
    last = lane_map.centerlines[chained[-1]]
    d = np.linalg.norm(last - xy[-1], axis=1)
    ahead = polyline_length(last[int(np.argmin(d)) :])
    while ahead < extension_m and len(chained) < 64:
        cur = chained[-1]
        options = [index[int(s)] for s in lane_map.successors[cur] if int(s) in index]
        options = [o for o in options if o not in chained]
        if not options:
            break
        h = _heading_at(lane_map.centerlines[cur], end=True)
        nxt = min(options, key=lambda o: abs(wrap_angle(_heading_at(lane_map.centerlines[o], False) - h)))
        chained.append(nxt)
        ahead += polyline_length(lane_map.centerlines[nxt])
    pts: list[np.ndarray] = []
    for k in chained:
        cl = lane_map.centerlines[k]
        if pts and np.linalg.norm(pts[-1][-1] - cl[0]) < 1e-3:
            cl = cl[1:]
        if len(cl):
            pts.append(cl)
    return lane_map.lane_ids[chained].astype(np.int64), clean_polyline(np.concatenate(pts), 1e-6)


def logged_clip(
    params: dict[str, Any],
    lane_map: LaneMap,
    *,
    clip_id: str,
    source: str,
    scenario_id: str,
    dt: float,
    ego_x: np.ndarray,
    ego_y: np.ndarray,
    ego_yaw: np.ndarray,
    ego_speed: np.ndarray,
    ego_length: float,
    ego_width: float,
    agents: dict[str, Any],
    metadata: dict[str, Any],
    lane_allowed: np.ndarray | None = None,
) -> Clip:
    """A validated clip of a real log: the route matched to the ego path (``adapters.*`` in ``params``),
    acceleration from the logged speed, metadata of a logged scene plus the adapter's ``metadata``,
    resampled from the log's ``dt`` to the simulator's step ``sim.dt`` (params/sim.yaml) so a replay
    runs at the logged speed. ``agents`` holds the ``agent_*`` fields of :meth:`Clip.build`."""
    route_ids, route_poly = build_route(
        lane_map,
        np.stack([ego_x, ego_y], axis=1),
        ego_yaw,
        extension_m=float(require(params, "adapters.route_extension_m")),
        heading_weight=float(require(params, "adapters.lane_match_heading_weight_m_per_rad")),
        change_penalty=float(require(params, "adapters.lane_change_penalty_m")),
        lane_allowed=lane_allowed,
    )
    meta = {"source": source, "scenario_kind": "logged", "seed": None, "network_kind": "real",
            "scenario_id": scenario_id, **metadata}
    return Clip.build(
        clip_id=clip_id,
        dt=dt,
        ego_x=ego_x,
        ego_y=ego_y,
        ego_yaw=ego_yaw,
        ego_speed=ego_speed,
        ego_accel=accel_from_speed(ego_speed, dt),
        ego_length=ego_length,
        ego_width=ego_width,
        **agents,
        map=lane_map,
        route_lane_ids=route_ids,
        route_polyline=route_poly,
        metadata=meta,
    ).validate().resample(float(load_params("sim")["sim"]["dt"]))


__all__ = [
    "accel_from_speed",
    "build_route",
    "lane_match_costs",
    "logged_clip",
    "match_path_to_lanes",
    "polyline_length",
]
