"""Traffic signals as a rule layer between the planner and the tracker (no ROS, no networks).

The learned generator was trained on scenes without signal states, so it cannot know that a light is
red. Like Autoware's traffic-light module, which inserts a stop point into the path it is given, this
layer finds the stop line of a red (or stoppable yellow) signal on the ego's route and limits the
selected plan's progress so that the ego's front stays behind it; at green the limit is gone and the
plan is executed as generated.

- :func:`next_signal_stop` -- (perception side) the nearest red or yellow stop line ahead on the
  route: its distance from the ego's centre and the state, what ``Observation.signal_stop`` carries.
- :func:`allowed_distance` -- (planner side) how far the ego may still travel for it, or None.
- :func:`limit_progress` -- a plan re-timed along its own path so it stops within that distance
  (braking no harder than needed, at least ``comfort_decel``; the path is kept, only progress along it
  is clipped).
- :func:`stop_line_crossings` -- which red stop lines the ego's front crossed between two poses (the
  red-light violation the metrics count as at fault).

Signal states: :data:`rad2_planner.clip.SIGNAL_RED` etc. An unknown state is not a constraint (logs
without signal states keep today's behaviour); a yellow one is, when the ego can still stop for it
comfortably (otherwise it proceeds: the dilemma zone); a red one always is unless stopping would need
more than ``max_decel`` (then it is too late to stop, and braking hard in the junction is worse).
Parameters: ``traffic_rules.*`` in params/planner.yaml.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .clip import SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW, LaneMap
from .tokens import arc_lengths, project_onto_polyline

# Observation.stop_distance when no stop line applies (metres; beyond any planning horizon)
NO_STOP_M = 1.0e4


@dataclass(frozen=True)
class TrafficRuleParams:
    enabled: bool
    stop_margin_m: float  # the ego's front stops this far before the line
    comfort_decel: float  # m/s^2, a yellow is obeyed when stopping needs at most this
    max_decel: float  # m/s^2, a red is obeyed when stopping needs at most this

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrafficRuleParams:
        from .config import require

        c = require(params, "traffic_rules")
        return cls(bool(c["enabled"]), float(c["stop_margin_m"]), float(c["comfort_decel"]),
                   float(c["max_decel"]))


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


def allowed_distance(signal_stop: np.ndarray, ego_speed: float, ego_length: float,
                     p: TrafficRuleParams) -> float | None:
    """How far the ego's centre may still travel for the signal in ``signal_stop`` (see
    :func:`next_signal_stop`), or None when it proceeds: no red/yellow line ahead, a yellow that needs
    more than ``comfort_decel`` to stop for, a red that needs more than ``max_decel`` (too late: the
    ego is in the dilemma zone; both judged against the line itself), or a line the ego's front already
    crossed while moving. Inside the stop margin but before the line, the ego still stops before the
    line (a late stop is still a stop)."""
    if not p.enabled:
        return None
    line, state = float(signal_stop[0]), int(round(float(signal_stop[1])))
    if line >= NO_STOP_M or state not in (SIGNAL_RED, SIGNAL_YELLOW):
        return None
    v = max(float(ego_speed), 0.0)
    to_line = line - 0.5 * float(ego_length)  # the ego's front to the line itself
    target = to_line - p.stop_margin_m
    if target <= 0.0 and v <= 0.5:
        return 0.0  # standing at the line: stay
    if to_line <= 0.0:
        return None  # the front is over the line while moving: clear the junction
    limit = p.comfort_decel if state == SIGNAL_YELLOW else p.max_decel
    if target > 0.0 and v * v / (2.0 * target) <= limit:
        return target  # the normal case: stop with the margin
    # a stop that came late (inside the margin, or the margin no longer reachable within the limit):
    # whether a stop is still possible is judged against the line itself, not the margin (a slow ego
    # a few centimetres from the margin can stop, however large v^2 / (2 * those centimetres) is) ...
    if v * v / (2.0 * to_line) > limit:
        return None
    # ... and it stops as early as the limit allows, before the line
    return min(max(v * v / (2.0 * limit), target, 0.0), to_line)


def limit_progress(plan: np.ndarray, plan_dt: float, ego_speed: float, distance_m: float,
                   comfort_decel: float) -> np.ndarray:
    """``plan`` [T, 2] (ego frame, points at (k+1)·dt from the origin) re-timed so that its progress
    along its own path never exceeds ``distance_m``: at each step the speed is the plan's own or the
    speed from which the remaining distance can still be braked away with max(comfort_decel, the
    deceleration needed from the ego's speed now), whichever is lower."""
    pts = np.asarray(plan, np.float64)
    path = np.vstack([np.zeros((1, 2)), pts])
    cum = arc_lengths(path)
    if distance_m >= cum[-1]:
        return pts.copy()
    stop_at = max(float(distance_m), 0.0)
    decel = max(float(comfort_decel), max(float(ego_speed), 0.0) ** 2 / (2.0 * max(stop_at, 1e-3)))
    own_speed = np.diff(cum) / plan_dt
    s = 0.0
    out_s = np.empty(len(pts))
    for k, v_own in enumerate(own_speed):
        v_brake = np.sqrt(2.0 * decel * max(stop_at - s, 0.0))
        s = min(s + min(v_own, v_brake) * plan_dt, stop_at)
        out_s[k] = s
    x = np.interp(out_s, cum, path[:, 0])
    y = np.interp(out_s, cum, path[:, 1])
    return np.stack([x, y], axis=-1)


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


__all__ = ["NO_STOP_M", "TrafficRuleParams", "allowed_distance", "limit_progress", "next_signal_stop",
           "stop_line_crossings", "stop_lines_on_route"]
