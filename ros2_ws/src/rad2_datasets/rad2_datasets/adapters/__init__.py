"""Real-dataset adapters into :class:`rad2_core.clip.Clip` plus the helpers they share.

- :mod:`rad2_datasets.adapters.av2`: Argoverse 2 motion forecasting (parquet + log map JSON).
- :mod:`rad2_datasets.adapters.commonroad`: CommonRoad XML (e.g. NGSIM-derived scenarios).

Shared here: logged-path-to-lane matching (a small Viterbi over lanes with successor-aware
transitions and, on maps with lane adjacency, lane changes), route construction (a route follows the
ego's lane changes where the map states adjacency; :func:`route_polyline` also draws mission routes),
speed/acceleration from logged tracks, and :func:`logged_clip`, which turns the arrays an adapter
read into a validated clip.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from rad2_core.clip import Clip
from rad2_core.config import require
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import NO_LANE, LaneMap
from rad2_core.route_path import RouteError, RouteLimits, check_route
from rad2_core.tokens import arc_lengths, clean_polyline, project_onto_polyline


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


# Maps with lane adjacency (LaneMap.has_adjacency) price a switch by what the map says about it: a
# change into a neighbour costs the lane-change penalty where the marking allows it and twice that
# across a solid line (the logged driver did cross it, but the permitted reading is the likelier
# one), any other switch (a map gap, an unmodelled connection) three times, so the matching explains
# a lane change by the stated adjacency before it reaches for a jump. Maps without adjacency keep
# one flat penalty for every switch, as before adjacency existed.
_FORBIDDEN_CHANGE_FACTOR = 2.0
_JUMP_FACTOR = 3.0
# A route polyline changes lanes over a smooth blend centred where the logged ego crossed the lane
# boundary: this many times the lateral distance between the two centrelines (about 21 m for a
# 3.5 m lane), clamped, sampled every _BLEND_STEP_M. Long enough that the ego's projection on the
# route keeps moving forward through its own (usually longer) manoeuvre, short enough to stay within
# the lanelets around the crossing.
_BLEND_PER_LATERAL = 6.0
_BLEND_MIN_M = 8.0
_BLEND_MAX_M = 30.0
_BLEND_STEP_M = 1.0


def _successor_indices(lane_map: LaneMap) -> list[list[int]]:
    index = lane_map.lane_index()
    return [[index[int(s)] for s in succ if int(s) in index] for succ in lane_map.successors]


def _neighbor_indices(lane_map: LaneMap, k: int, index: dict[int, int] | None = None) -> dict[int, bool]:
    """Lane index -> lane-change permission, for lane k's left and right neighbours (``index``: the
    map's lane_index(), passed by callers that loop over lanes)."""
    if not lane_map.has_adjacency:
        return {}
    index = lane_map.lane_index() if index is None else index
    out: dict[int, bool] = {}
    for nb, ok in ((lane_map.left_neighbors[k], lane_map.lane_change_left[k]),
                   (lane_map.right_neighbors[k], lane_map.lane_change_right[k])):
        j = index.get(int(nb))
        if int(nb) != NO_LANE and j is not None and j != k:
            out[j] = out.get(j, False) or bool(ok)
    return out


def _lane_change_links(lane_map: LaneMap) -> list[dict[int, bool]]:
    """Per lane index: {index of a lane one lane change away: permitted}. Besides the neighbours this
    holds the neighbours' successors and the successors' neighbours, since a path sampled every
    0.1 s may cross a lane boundary and a lanelet end between two poses."""
    succ = _successor_indices(lane_map)
    index = lane_map.lane_index()
    direct = [_neighbor_indices(lane_map, k, index) for k in range(lane_map.num_lanes)]
    links = [dict(d) for d in direct]
    for k in range(lane_map.num_lanes):
        for j, ok in direct[k].items():
            for s in succ[j]:
                links[k][s] = links[k].get(s, False) or ok
        for s in succ[k]:
            for j, ok in direct[s].items():
                links[k][j] = links[k].get(j, False) or ok
        links[k].pop(k, None)
        for s in succ[k]:  # a successor is free whatever else links it
            links[k].pop(s, None)
    return links


def match_path_to_lanes(
    lane_map: LaneMap,
    xy: np.ndarray,
    yaw: np.ndarray,
    heading_weight: float,
    change_penalty: float,
    lane_allowed: np.ndarray | None = None,
) -> np.ndarray:
    """Most likely lane index per pose: Viterbi with free stay/successor transitions and a
    ``change_penalty`` (m) for any other switch (lane changes, map gaps). On maps with adjacency a
    change into a neighbour costs ``change_penalty`` where permitted, twice that where not, and any
    other switch three times (see _FORBIDDEN_CHANGE_FACTOR)."""
    costs = lane_match_costs(lane_map, xy, yaw, heading_weight)
    if lane_allowed is not None and np.any(lane_allowed):
        costs[:, ~np.asarray(lane_allowed, bool)] += 1e3
    n = lane_map.num_lanes
    index = lane_map.lane_index()
    trans = np.full((n, n), float(change_penalty))
    if lane_map.has_adjacency:
        trans[:] = _JUMP_FACTOR * float(change_penalty)
        for i, links in enumerate(_lane_change_links(lane_map)):
            for j, ok in links.items():
                trans[i, j] = float(change_penalty) * (1.0 if ok else _FORBIDDEN_CHANGE_FACTOR)
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


def _successor_reach(lane_map: LaneMap, a: int, max_depth: int = 4) -> list[list[int]]:
    """Paths a, a..x along successors to every lane x reachable within ``max_depth`` steps (BFS)."""
    succ = _successor_indices(lane_map)
    out = [[a]]
    queue = deque([[a]])
    seen = {a}
    while queue:
        path = queue.popleft()
        if len(path) > max_depth:
            continue
        for j in succ[path[-1]]:
            if j not in seen:
                seen.add(j)
                out.append(path + [j])
                queue.append(path + [j])
    return out


def _distance_to_lane(lane_map: LaneMap, k: int, point: np.ndarray) -> float:
    cl = lane_map.centerlines[k]
    return project_onto_polyline(cl, point)[1] if len(cl) > 1 else float(np.linalg.norm(cl[0] - point))


def _lane_change_bridge(lane_map: LaneMap, a: int, b: int, crossing: np.ndarray) -> list[int] | None:
    """Lane path a, ..., b joining two consecutively matched lanes on a map with adjacency: along
    successors if they connect, else with one lane change x -> y (a ->succ x, y ->succ b). Of the
    shortest such paths one with a permitted change wins, then the one whose change lies nearest
    ``crossing`` (where the ego switched: a jump to a lane one change and one lanelet away happens
    when the ego crosses a lane boundary near a lanelet end). None: no connection within reach."""
    mids = _successor_path(lane_map, a, b)
    if mids is not None:
        return [a, *mids, b]
    best: tuple[tuple[int, bool, float], list[int]] | None = None
    for pre in _successor_reach(lane_map, a):
        x = pre[-1]
        for y, permitted in _neighbor_indices(lane_map, x).items():
            if y == b:
                post: list[int] = []
            else:
                m = _successor_path(lane_map, y, b)
                if m is None:
                    continue
                post = [*m, b]
            path = [*pre, y, *post]
            if len(set(path)) < len(path):
                continue
            near = _distance_to_lane(lane_map, x, crossing) + _distance_to_lane(lane_map, y, crossing)
            key = (len(path), not permitted, near)
            if best is None or key < best[0]:
                best = (key, path)
    return None if best is None else best[1]


def _is_neighbor(lane_map: LaneMap, a: int, b: int) -> bool:
    return b in _neighbor_indices(lane_map, a)


def _is_successor(lane_map: LaneMap, a: int, b: int) -> bool:
    return b in _successor_indices(lane_map)[a]


def _chain_lanes(lane_map: LaneMap, per_pose: np.ndarray, xy: np.ndarray
                 ) -> tuple[list[int], dict[int, np.ndarray]]:
    """Route lanes of a matched path in the order the ego drove them, and where it moved sideways
    between them: ``{i: point}`` for a change from route lane i to route lane i + 1 (the midpoint of
    the two poses between which the matched lane switched).

    A switch the map connects through successors inserts the lanes between. On a map with adjacency
    a lane change is bridged through the stated neighbours (the lanes on both sides of the change
    are on the route). Any other switch (a lane change on a map without adjacency, a ramp merging
    where the map states no relation, overlapping lanelets in a junction) is joined sideways at the
    point where it happened, like a lane change, instead of appending the whole next lane (whose
    start may lie far behind the ego: the route would double back). A lane left by a change may be
    entered again later (an overtake)."""
    chained = [int(per_pose[0])]
    crossings: dict[int, np.ndarray] = {}
    for t in range(1, len(per_pose)):
        a, b = chained[-1], int(per_pose[t])
        if b == a:
            continue
        crossing = 0.5 * (xy[t - 1] + xy[t])
        if lane_map.has_adjacency:
            bridge = _lane_change_bridge(lane_map, a, b, crossing)
        else:
            mids = _successor_path(lane_map, a, b)
            bridge = None if mids is None else [a, *mids, b]
        for k in (bridge[1:] if bridge is not None else [b]):
            if not _is_successor(lane_map, chained[-1], k):
                crossings[len(chained) - 1] = crossing
            chained.append(k)
    return chained, crossings


def _straightest_successors(lane_map: LaneMap, lane: int, ahead: float, extension_m: float,
                            avoid: list[int]) -> list[int]:
    """Lanes continuing from ``lane`` along the successor that turns least, until ``extension_m`` is
    covered (``ahead``: what ``lane`` itself still has beyond the point of interest) or the map ends."""
    out: list[int] = []
    cur = lane
    while ahead < extension_m and len(out) < 64:
        options = [o for o in _successor_indices(lane_map)[cur] if o not in avoid and o not in out]
        if not options:
            break
        h = _heading_at(lane_map.centerlines[cur], end=True)
        cur = min(options, key=lambda o: abs(wrap_angle(_heading_at(lane_map.centerlines[o], False) - h)))
        out.append(cur)
        ahead += polyline_length(lane_map.centerlines[cur])
    return out


def _heading_at(poly: np.ndarray, end: bool) -> float:
    d = poly[-1] - poly[-2] if end else poly[1] - poly[0]
    return float(np.arctan2(d[1], d[0]))


def _concat_centerlines(lane_map: LaneMap, lanes: list[int]) -> np.ndarray:
    pts: list[np.ndarray] = []
    for k in lanes:
        cl = lane_map.centerlines[k]
        if pts and np.linalg.norm(pts[-1][-1] - cl[0]) < 1e-3:
            cl = cl[1:]
        if len(cl):
            pts.append(cl)
    return clean_polyline(np.concatenate(pts), 1e-6)


def _points_at(poly: np.ndarray, cum: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Points at arc lengths ``s``, continued straight along the end segments beyond the ends (a
    blend may reach a little past the lanes it joins)."""
    s = np.atleast_1d(np.asarray(s, np.float64))
    out = np.stack([np.interp(s, cum, poly[:, 0]), np.interp(s, cum, poly[:, 1])], axis=-1)
    d0 = (poly[1] - poly[0]) / max(cum[1] - cum[0], 1e-12)
    d1 = (poly[-1] - poly[-2]) / max(cum[-1] - cum[-2], 1e-12)
    before, after = s < 0.0, s > cum[-1]
    out[before] = poly[0] + s[before, None] * d0
    out[after] = poly[-1] + (s[after] - cum[-1])[:, None] * d1
    return out


def _slice(poly: np.ndarray, cum: np.ndarray, lo: float, hi: float) -> np.ndarray:
    inner = (cum > lo) & (cum < hi)
    return np.concatenate([_points_at(poly, cum, lo), poly[inner], _points_at(poly, cum, hi)])


def _route_polyline(lane_map: LaneMap, chained: list[int], crossings: dict[int, np.ndarray]) -> np.ndarray:
    """Centrelines of the route lanes joined end to end; at each lane change (``crossings``: route
    position i -> point) the polyline leaves lane i's run and joins lane i + 1's with a cosine blend
    centred on the point, instead of jumping sideways."""
    runs: list[list[int]] = [[chained[0]]]
    points: list[np.ndarray] = []
    for i in range(len(chained) - 1):
        if i in crossings:
            runs.append([chained[i + 1]])
            points.append(np.asarray(crossings[i], np.float64))
        else:
            runs[-1].append(chained[i + 1])
    polys = [_concat_centerlines(lane_map, run) for run in runs]
    if len(polys) == 1:
        return polys[0]
    cums = [arc_lengths(p) for p in polys]
    if any(len(p) < 2 or c[-1] < 1e-6 for p, c in zip(polys, cums)):
        return clean_polyline(np.concatenate(polys), 1e-6)  # a degenerate lane: nothing to blend along
    moves = []  # [s on the run left, s on the run entered, half blend length]
    for k, c in enumerate(points):
        s_out = project_onto_polyline(polys[k], c, cums[k])[0]
        s_in = project_onto_polyline(polys[k + 1], c, cums[k + 1])[0]
        p_out = _points_at(polys[k], cums[k], s_out)
        p_in = _points_at(polys[k + 1], cums[k + 1], s_in)
        length = np.clip(_BLEND_PER_LATERAL * float(np.linalg.norm(p_out - p_in)), _BLEND_MIN_M, _BLEND_MAX_M)
        moves.append([s_out, s_in, 0.5 * float(length)])
    # two changes closer than their blends share the run between them (shrinking only, so the
    # earlier pairs stay apart)
    for k in range(1, len(moves)):
        room = max(moves[k][0] - moves[k - 1][1], 0.0)
        both = moves[k - 1][2] + moves[k][2]
        if both > room:
            moves[k - 1][2] *= room / both
            moves[k][2] *= room / both
    pieces: list[np.ndarray] = []
    for k, poly in enumerate(polys):
        lo = 0.0 if k == 0 else moves[k - 1][1] + moves[k - 1][2]
        hi = cums[k][-1] if k == len(polys) - 1 else moves[k][0] - moves[k][2]
        if hi > lo:
            pieces.append(_slice(poly, cums[k], lo, hi))
        if k < len(moves):
            s_out, s_in, half = moves[k]
            if half < 1e-6:
                pieces.append(np.concatenate([_points_at(poly, cums[k], s_out),
                                              _points_at(polys[k + 1], cums[k + 1], s_in)]))
                continue
            u = np.linspace(-half, half, max(int(np.ceil(2.0 * half / _BLEND_STEP_M)), 2) + 1)
            w = (0.5 - 0.5 * np.cos(np.pi * (u + half) / (2.0 * half)))[:, None]
            pieces.append((1.0 - w) * _points_at(poly, cums[k], s_out + u)
                          + w * _points_at(polys[k + 1], cums[k + 1], s_in + u))
    return clean_polyline(np.concatenate(pieces), 1e-6)


def route_polyline(
    lane_map: LaneMap, route_lane_ids, crossings: dict[int, np.ndarray] | None = None
) -> np.ndarray:
    """The polyline of a lane route (e.g. a mission from a routing graph) whose consecutive lanes are
    successors or neighbours. A change from route lane i to its neighbour i + 1 is blended around
    ``crossings[i]`` (a world point) or, if not given, around the middle of lane i."""
    index = lane_map.lane_index()
    chained = []
    for lid in np.asarray(route_lane_ids, np.int64).reshape(-1).tolist():
        if lid not in index:
            raise KeyError(f"route lane id {lid} is not in map {lane_map.map_id}")
        chained.append(index[lid])
    if not chained:
        raise ValueError("route_lane_ids: the route is empty")
    points: dict[int, np.ndarray] = {}
    for i in range(len(chained) - 1):
        if _is_neighbor(lane_map, chained[i], chained[i + 1]):
            if crossings is not None and i in crossings:
                points[i] = np.asarray(crossings[i], np.float64)
            else:
                cl = lane_map.centerlines[chained[i]]
                cum = arc_lengths(cl)
                points[i] = _points_at(cl, cum, 0.5 * cum[-1])[0]
    return _route_polyline(lane_map, chained, points)


# The logged path as route geometry (when no lane route follows the driver): poses thinned to at least
# this spacing, so that a standing car's position noise makes no zigzag; the lane continuation past the
# last pose joins this far ahead of it (at least), so the join turns gently; a continuation heading
# more than _PATH_JOIN_MAX_TURN_DEG away from the ego's last heading is not the way it was going, and
# the route then continues straight instead.
_PATH_STEP_M = 2.0
_PATH_JOIN_LEAD_M = 8.0
_PATH_JOIN_MAX_TURN_DEG = 45.0


def _lane_route(lane_map: LaneMap, per_pose: np.ndarray, xy: np.ndarray, extension_m: float
                ) -> tuple[list[int], np.ndarray]:
    """Lane indices and polyline of the route through the matched lanes (centrelines joined by blends
    at the lane changes), extended along the straightest successors past the last pose."""
    chained, crossings = _chain_lanes(lane_map, per_pose, xy)
    last = lane_map.centerlines[chained[-1]]
    ahead = polyline_length(last) - project_onto_polyline(last, xy[-1])[0] if len(last) > 1 else 0.0
    chained += _straightest_successors(lane_map, chained[-1], ahead, extension_m, chained)
    return chained, _route_polyline(lane_map, chained, crossings)


def _thin_path(xy: np.ndarray, step: float) -> np.ndarray:
    kept = [xy[0]]
    for p in xy[1:]:
        if np.linalg.norm(p - kept[-1]) >= step:
            kept.append(p)
    if len(kept) > 1 and np.linalg.norm(xy[-1] - kept[-1]) > 1e-6:
        kept[-1] = xy[-1]  # end at the last pose (the last kept point is within one step of it)
    return np.asarray(kept)


def _path_route(lane_map: LaneMap, per_pose: np.ndarray, xy: np.ndarray, yaw: np.ndarray,
                extension_m: float) -> tuple[list[int], np.ndarray]:
    """Lane indices and polyline of the route that is the logged path itself (thinned), continued past
    the last pose along its last matched lane and that lane's straightest successors (or straight on,
    where that lane does not go the ego's way or the map ends within the join, as far as the road
    goes). The lanes are those the ego occupied, in time order, then the continuation."""
    path = _thin_path(xy, _PATH_STEP_M)
    if len(path) < 2:  # the ego hardly moved: a stub along its heading
        path = np.stack([xy[0], xy[0] + _PATH_STEP_M * np.array([np.cos(yaw[-1]), np.sin(yaw[-1])])])
    heading = float(np.arctan2(*(path[-1] - path[-2])[::-1]))
    lanes: list[int] = []
    for k in per_pose.tolist():
        if k not in lanes:
            lanes.append(int(k))
    last = int(per_pose[-1])
    cl = lane_map.centerlines[last]
    tail = np.zeros((0, 2))
    cont: list[int] = []
    if len(cl) > 1:
        cum = arc_lengths(cl)
        s_last, offset = project_onto_polyline(cl, xy[-1], cum)
        lead = max(_PATH_JOIN_LEAD_M, _BLEND_PER_LATERAL * float(offset))
        cont = _straightest_successors(lane_map, last, float(cum[-1] - s_last), extension_m + lead, lanes)
        ahead = _concat_centerlines(lane_map, [last, *cont])
        ahead_cum = arc_lengths(ahead)
        if ahead_cum[-1] > s_last + lead:
            tail = _slice(ahead, ahead_cum, s_last + lead, min(ahead_cum[-1], s_last + lead + extension_m))
            join = np.arctan2(*(tail[0] - path[-1])[::-1])
            if abs(wrap_angle(join - heading)) > np.deg2rad(_PATH_JOIN_MAX_TURN_DEG):
                tail, cont = np.zeros((0, 2)), []
    if not len(tail):
        tail = path[-1] + np.outer(np.arange(1.0, 1.0 + extension_m / _PATH_STEP_M) * _PATH_STEP_M,
                                   [np.cos(heading), np.sin(heading)])
        # straight on only as far as the road goes: a logged route ends where the recorded map does
        # (the simulator's route_end), not in unmapped space past it, where an ego ahead of the logged
        # driver would be counted off the road before reaching the route's end
        road = lane_map.drivable_geometry()
        if road is not None:
            import shapely

            off = ~shapely.contains_xy(road, tail[:, 0], tail[:, 1])
            tail = tail[: int(np.argmax(off))] if off.any() else tail
    return [*lanes, *cont], clean_polyline(np.concatenate([path, tail]), 1e-6)


def build_route(
    lane_map: LaneMap,
    xy: np.ndarray,
    yaw: np.ndarray,
    extension_m: float,
    heading_weight: float,
    change_penalty: float,
    lane_allowed: np.ndarray | None = None,
    *,
    limits: RouteLimits,
) -> tuple[np.ndarray, np.ndarray]:
    """The route a logged ego path follows: (route_lane_ids [R], route_polyline [Pr, 2]), one that
    passes :func:`rad2_core.route_path.check_route` against the path (``limits``:
    :meth:`RouteLimits.from_params` of params/sim.yaml), else :class:`RouteError` with the reason.

    First choice, the lanes the path traverses in time order (matched by :func:`match_path_to_lanes`,
    gaps bridged through successors and, on maps with adjacency, through the neighbours of a lane
    change), the polyline blending from one centreline to the next around the point where the ego
    moved across, then extended along the straightest successors until ``extension_m`` past the last
    pose or the map's end. When that route does not follow the driver (a junction whose lanelets
    overlap, a lane the match got wrong), the logged path itself is the route, continued past the last
    pose along the lane the ego was on; the route lanes are then the lanes it occupied.
    """
    xy = np.asarray(xy, np.float64)
    yaw = np.asarray(yaw, np.float64)
    per_pose = match_path_to_lanes(lane_map, xy, yaw, heading_weight, change_penalty, lane_allowed)
    failures = []
    for name, make in (("lanes", _lane_route), ("logged path", None)):
        if make is not None:
            lanes, poly = make(lane_map, per_pose, xy, extension_m)
        else:
            lanes, poly = _path_route(lane_map, per_pose, xy, yaw, extension_m)
        try:
            check_route(poly, xy, limits)
        except RouteError as exc:
            failures.append((name, exc))
            continue
        return lane_map.lane_ids[lanes].astype(np.int64), poly
    reason = failures[-1][1].reason
    raise RouteError(reason, "no route follows the logged ego: " + "; ".join(f"along the {n}: {e}"
                                                                              for n, e in failures))


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
    signal_states: np.ndarray | None = None,
) -> Clip:
    """A validated clip of a real log: the route matched to the ego path (``adapters.*`` in ``params``)
    and checked against ``metrics.route_*``, acceleration from the logged speed, metadata of a logged
    scene plus the adapter's ``metadata``, resampled from the log's ``dt`` to the simulator's step
    ``sim.dt`` so a replay runs at the logged speed. ``params``: params/bev.yaml and sim.yaml as
    loaded, merged (:func:`rad2_core.config.merged`). ``agents`` holds the ``agent_*`` fields of
    :meth:`Clip.build`; ``signal_states`` [S, T] the logged states of ``lane_map``'s signals (held, not
    blended, when resampled)."""
    route_ids, route_poly = build_route(
        lane_map,
        np.stack([ego_x, ego_y], axis=1),
        ego_yaw,
        extension_m=float(require(params, "adapters.route_extension_m")),
        heading_weight=float(require(params, "adapters.lane_match_heading_weight_m_per_rad")),
        change_penalty=float(require(params, "adapters.lane_change_penalty_m")),
        lane_allowed=lane_allowed,
        limits=RouteLimits.from_params(params),
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
        signal_states=signal_states,
    ).validate().resample(float(require(params, "sim.dt")))


__all__ = [
    "accel_from_speed",
    "build_route",
    "lane_match_costs",
    "logged_clip",
    "match_path_to_lanes",
    "polyline_length",
    "route_polyline",
]
