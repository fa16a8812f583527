"""Signal stop lines along a route (no ROS): where the route crosses the stop line of a signal that
controls one of its lanes, the nearest red or yellow one ahead of the ego, and the red lines a move
crossed. The observation (what the planner is told), the planner's traffic-rule stage and the
simulator's red-light check all read signals through these."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from rad2_core.lane_map import SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW, LaneMap
from rad2_core.tokens import arc_lengths, project_onto_polyline

# Observation.stop_distance when no stop line applies (metres; beyond any planning horizon)
NO_STOP_M = 1.0e4


def _segment_crossings(poly: np.ndarray, cum: np.ndarray, line: np.ndarray) -> list[float]:
    """Arc lengths along ``poly`` where it crosses the polyline ``line``."""
    out = []
    a, d = poly[:-1], np.diff(poly, axis=0)
    for p, q in zip(line[:-1], line[1:]):
        e = q - p
        denom = d[:, 0] * e[1] - d[:, 1] * e[0]
        ok = np.abs(denom) > 1e-12
        w = p - a
        t = np.where(ok, (w[:, 0] * e[1] - w[:, 1] * e[0]) / np.where(ok, denom, 1.0), -1.0)
        u = np.where(ok, (w[:, 0] * d[:, 1] - w[:, 1] * d[:, 0]) / np.where(ok, denom, 1.0), -1.0)
        hit = ok & (t >= 0.0) & (t <= 1.0) & (u >= 0.0) & (u <= 1.0)
        seg_len = np.linalg.norm(d, axis=1)
        out.extend((cum[:-1] + t * seg_len)[hit].tolist())
    # a line through a vertex hits both segments that meet there: one crossing
    out.sort()
    return [x for i, x in enumerate(out) if i == 0 or x - out[i - 1] > 1e-3]


_LINES_CACHE: OrderedDict[tuple, list[tuple[int, float]]] = OrderedDict()
_LINES_CACHE_SIZE = 64


def stop_lines_on_route(lane_map: LaneMap, route_lane_ids: np.ndarray, route_polyline: np.ndarray
                        ) -> list[tuple[int, float]]:
    """(signal index, arc length along the route) of every signal stop line the route crosses and
    whose controlled lanes include a route lane (a crossing street's line is not the ego's). A route
    is fixed for a clip or a mission while this runs every cycle, so results are cached by content."""
    if lane_map.num_signals == 0 or len(route_polyline) < 2:
        return []
    key = (lane_map.map_id, np.asarray(route_lane_ids, np.int64).tobytes(),
           np.asarray(route_polyline, np.float64).tobytes())
    hit = _LINES_CACHE.get(key)
    if hit is None:
        hit = _LINES_CACHE[key] = _stop_lines_on_route(lane_map, route_lane_ids, route_polyline)
        while len(_LINES_CACHE) > _LINES_CACHE_SIZE:
            _LINES_CACHE.popitem(last=False)
    else:
        _LINES_CACHE.move_to_end(key)
    return list(hit)


def _stop_lines_on_route(lane_map: LaneMap, route_lane_ids: np.ndarray, route_polyline: np.ndarray
                         ) -> list[tuple[int, float]]:
    route = np.asarray(route_polyline, np.float64)
    cum = arc_lengths(route)
    on_route = {int(v) for v in np.asarray(route_lane_ids).reshape(-1)}
    out = []
    for k, (lanes, line) in enumerate(zip(lane_map.signal_lanes, lane_map.signal_stop_lines)):
        if on_route and not on_route.intersection(int(v) for v in lanes):
            continue
        for s in _segment_crossings(route, cum, np.asarray(line, np.float64)):
            out.append((k, float(s)))
    return sorted(out, key=lambda x: x[1])


def next_signal_stop(lane_map: LaneMap, states: np.ndarray, route_lane_ids: np.ndarray,
                     route_polyline: np.ndarray, ego_pose: np.ndarray, ego_length: float,
                     lines: list[tuple[int, float]] | None = None) -> np.ndarray:
    """What the planner is told about signals (``Observation.signal_stop``, float32 [2]): the distance
    along the route from the ego's centre to the nearest stop line ahead whose signal is red or yellow,
    and that state; (NO_STOP_M, SIGNAL_UNKNOWN) when there is none. A line the ego's front has already
    passed (by more than half a metre) is behind it. ``states``: [S] (rows of ``map.signal_ids``);
    ``lines``: precomputed :func:`stop_lines_on_route` (the route is fixed for a clip)."""
    out = np.array([NO_STOP_M, SIGNAL_UNKNOWN], np.float32)
    if lane_map.num_signals == 0 or states is None or len(states) == 0:
        return out
    lines = stop_lines_on_route(lane_map, route_lane_ids, route_polyline) if lines is None else lines
    if not lines:
        return out
    s_ego, _ = project_onto_polyline(np.asarray(route_polyline, np.float64),
                                     np.asarray(ego_pose[:2], np.float64))
    front = 0.5 * float(ego_length)
    for k, s_line in lines:
        state = int(states[k]) if k < len(states) else SIGNAL_UNKNOWN
        ahead = s_line - s_ego
        if ahead < front - 0.5 or state not in (SIGNAL_RED, SIGNAL_YELLOW):
            continue
        out[:] = (min(ahead, NO_STOP_M), state)
        return out
    return out


def stop_line_crossings(lane_map: LaneMap, states: np.ndarray, route_lane_ids: np.ndarray,
                        front_before: np.ndarray, front_after: np.ndarray) -> list[int]:
    """Signal ids whose stop line, red at this step, the ego's front point crossed moving from
    ``front_before`` to ``front_after`` (world xy), for signals controlling a route lane."""
    out = []
    if lane_map.num_signals == 0:
        return out
    on_route = {int(v) for v in np.asarray(route_lane_ids).reshape(-1)}
    move = np.vstack([front_before, front_after]).astype(np.float64)
    cum = arc_lengths(move)
    if cum[-1] < 1e-6:
        return out
    for k, (lanes, line) in enumerate(zip(lane_map.signal_lanes, lane_map.signal_stop_lines)):
        if k >= len(states) or int(states[k]) != SIGNAL_RED:
            continue
        if on_route and not on_route.intersection(int(v) for v in lanes):
            continue
        if _segment_crossings(move, cum, np.asarray(line, np.float64)):
            out.append(int(lane_map.signal_ids[k]))
    return out
