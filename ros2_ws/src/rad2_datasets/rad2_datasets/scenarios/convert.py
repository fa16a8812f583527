"""Conversion of a SUMO run (:class:`runner.RawRecord`) and network into the project's Clip format."""

from __future__ import annotations

import re

import numpy as np
from rad2_core.clip import Clip
from rad2_core.lane_map import LaneMap
from rad2_core.tokens import arc_lengths, clean_polyline

from rad2_datasets.scenarios.networks import LaneGeometry
from rad2_datasets.scenarios.rich import CYCLIST_PREFIX, PARKED_PREFIX, PEDESTRIAN_PREFIX

ACTOR_ID_BASE = 10_000_000
_BG = re.compile(r"^bg(\d+)$")
_ACTOR = re.compile(r"^actor(\d+)$")
# rich-scene road users: (pattern, id block) -> block * ACTOR_ID_BASE + n
_RICH = tuple(
    (re.compile(rf"^{prefix}(\d+)$"), block)
    for prefix, block in ((PEDESTRIAN_PREFIX, 3), (CYCLIST_PREFIX, 4), (PARKED_PREFIX, 5))
)


def lane_map_from_geometry(geom: LaneGeometry) -> LaneMap:
    return LaneMap.build(
        lane_ids=geom.lane_ids,
        centerlines=geom.centerlines,
        left_boundaries=geom.left_boundaries,
        right_boundaries=geom.right_boundaries,
        speed_limits=geom.speed_limits,
        successors=geom.successors,
        drivable_areas=geom.drivable_areas,
        crosswalks=geom.crosswalks,
    )


def agent_int_id(sumo_id: str, fallback: int) -> int:
    """Stable integer id: background ``bg<n>`` -> n + 1, event actors ``actor<k>`` -> 10_000_000 + k;
    pedestrians ``ped<n>``, cyclists ``cyc<n>`` and parked cars ``parked<n>`` -> 30 / 40 / 50 million + n."""
    m = _BG.match(sumo_id)
    if m:
        return int(m.group(1)) + 1
    m = _ACTOR.match(sumo_id)
    if m:
        return ACTOR_ID_BASE + int(m.group(1))
    for pattern, block in _RICH:
        m = pattern.match(sumo_id)
        if m:
            return block * ACTOR_ID_BASE + int(m.group(1))
    return 2 * ACTOR_ID_BASE + fallback


def _edge_of(lane_id: str) -> str:
    return lane_id.rsplit("_", 1)[0]


def cut_polyline(poly: np.ndarray, s0: float, s1: float) -> np.ndarray:
    """Part of a polyline between arc lengths s0 < s1 (clamped to the polyline)."""
    s = arc_lengths(poly)
    s0, s1 = float(np.clip(s0, 0.0, s[-1])), float(np.clip(s1, 0.0, s[-1]))

    def at(v: float) -> np.ndarray:
        return np.array([np.interp(v, s, poly[:, 0]), np.interp(v, s, poly[:, 1])])

    if s1 - s0 < 1e-6:
        return np.stack([at(s0), at(s0)])
    inner = (s > s0) & (s < s1)
    return np.vstack([at(s0), poly[inner], at(s1)])


def route_from_lanes(
    geom: LaneGeometry,
    lanes: list[tuple[int, str, float]],
    remaining_edges: list[str],
    extension_m: float,
    behind_m: float = 20.0,
) -> tuple[list[int], np.ndarray]:
    """Route lane ids and polyline: the lanes the ego drove (in order), cut at its lane changes,
    continued along its planned route edges for ``extension_m`` past the last logged lane."""
    idx = geom.index()
    if not lanes:
        raise ValueError("route_from_lanes: the ego lane trace is empty")
    for _, lane, _ in lanes:
        if lane not in idx:
            raise ValueError(f"route_from_lanes: ego lane {lane!r} is not in the network's lane map")
    scale = {}

    def to_geom(i: int, pos: float) -> float:
        if i not in scale:
            scale[i] = arc_lengths(geom.centerlines[i])[-1] / max(geom.sumo_lengths[i], 1e-6)
        return pos * scale[i]

    ids: list[int] = []
    pieces: list[np.ndarray] = []
    for n, (_, lane, pos) in enumerate(lanes):
        i = idx[lane]
        start = max(to_geom(i, pos) - behind_m, 0.0) if n == 0 else to_geom(i, pos)
        if n + 1 < len(lanes) and _edge_of(lanes[n + 1][1]) == _edge_of(lane):
            end = to_geom(i, lanes[n + 1][2])  # a lane change: leave this lane where the ego switched
        else:
            end = arc_lengths(geom.centerlines[i])[-1]
        if n > 0 and _edge_of(lanes[n - 1][1]) != _edge_of(lane):
            start = 0.0  # entered through a connection: the lane from its start
        ids.append(i)
        pieces.append(cut_polyline(geom.centerlines[i], start, max(end, start)))
    # extension along the planned route
    cur = ids[-1]
    acc = 0.0  # counted from the end of the last driven lane
    normal = [e for e in remaining_edges if not e.startswith(":")]
    cur_edge = _edge_of(geom.sumo_lane_ids[cur])
    ptr = normal.index(cur_edge) + 1 if cur_edge in normal else (1 if normal else 0)
    while acc < extension_m and ptr < len(normal):
        want = normal[ptr]
        nxt = _successor_toward(geom, cur, want)
        if nxt is None:
            break
        ids.append(nxt)
        pieces.append(geom.centerlines[nxt])
        acc += float(arc_lengths(geom.centerlines[nxt])[-1])
        cur = nxt
        if _edge_of(geom.sumo_lane_ids[nxt]) == want:
            ptr += 1
    poly = clean_polyline(np.vstack(pieces), 1e-3, pad=1e-2)
    return [int(geom.lane_ids[i]) for i in ids], poly


def _successor_toward(geom: LaneGeometry, lane: int, edge: str, depth: int = 5) -> int | None:
    """The first successor of ``lane`` that is on ``edge``, or an internal (junction) lane from which
    ``edge`` is reached through at most ``depth - 1`` further internal lanes; None if there is none."""
    for s in geom.successors[lane]:
        e = _edge_of(geom.sumo_lane_ids[s])
        if e == edge or (
            depth > 0 and e.startswith(":") and _successor_toward(geom, s, edge, depth - 1) is not None
        ):
            return s
    return None


def with_signals(lane_map: LaneMap, geom: LaneGeometry, via_lanes: list[str]) -> LaneMap:
    """``lane_map`` plus one signal per signalised link: it controls the link's junction lane, and its
    stop line runs across that lane's start (where SUMO stops vehicles: the end of the approach lane)."""
    index = geom.index()
    ids, lanes, lines = [], [], []
    for via in via_lanes:
        k = index.get(via)
        if k is None:  # a link of a mode the map leaves out (no passenger cars)
            continue
        ids.append(len(ids) + 1)
        lanes.append([int(geom.lane_ids[k])])
        lines.append(np.stack([geom.left_boundaries[k][0], geom.right_boundaries[k][0]]))
    if not ids:
        return lane_map
    return LaneMap.build(
        lane_ids=lane_map.lane_ids, centerlines=lane_map.centerlines,
        left_boundaries=lane_map.left_boundaries, right_boundaries=lane_map.right_boundaries,
        speed_limits=lane_map.speed_limits, successors=lane_map.successors,
        drivable_areas=lane_map.drivable_areas, crosswalks=lane_map.crosswalks,
        signal_ids=ids, signal_lanes=lanes, signal_stop_lines=lines)


def record_to_clip(
    raw, geom: LaneGeometry, lane_map: LaneMap, clip_id: str, metadata: dict, route_extension_m: float,
    signals: bool = False,
) -> Clip:
    """A clip of a SUMO run. ``signals``: export the traffic lights (the map gains one signal per
    signalised link, the clip their logged states), which changes the map's id; off, the clip is what
    the bundled sets were generated with."""
    n = len(raw.agents)
    t = raw.steps
    arr = {k: np.zeros((n, t)) for k in ("x", "y", "yaw", "vx", "vy")}
    valid = np.zeros((n, t), dtype=bool)
    ids = np.zeros(n, dtype=np.int64)
    length, width = np.zeros(n), np.zeros(n)
    for j, a in enumerate(raw.agents):
        ids[j] = agent_int_id(a.sumo_id, j)
        length[j], width[j] = a.length, a.width
        for k in arr:
            arr[k][j] = np.where(a.valid, getattr(a, k), 0.0)
        valid[j] = a.valid
    route_ids, route_poly = route_from_lanes(geom, raw.ego_lanes, raw.remaining_edges, route_extension_m)
    signal_states = None
    if signals and raw.signals:
        vias = [v for v in raw.signals if v in geom.index()]
        lane_map = with_signals(lane_map, geom, vias)
        if lane_map.num_signals:
            signal_states = np.stack([raw.signals[v] for v in vias]).astype(np.int8)
    meta = dict(metadata)
    meta["event"] = dict(raw.event)
    meta["event"]["actor_ids"] = [agent_int_id(a, 0) for a in raw.event.get("actors", [])]
    return Clip.build(
        clip_id=clip_id,
        dt=raw.dt,
        ego_x=raw.ego_x,
        ego_y=raw.ego_y,
        ego_yaw=raw.ego_yaw,
        ego_speed=raw.ego_speed,
        ego_accel=raw.ego_accel,
        ego_length=raw.ego_length,
        ego_width=raw.ego_width,
        agent_ids=ids,
        agent_types=np.array([a.agent_type for a in raw.agents], dtype=np.int8),
        agent_length=length,
        agent_width=width,
        agent_x=arr["x"],
        agent_y=arr["y"],
        agent_yaw=arr["yaw"],
        agent_vx=arr["vx"],
        agent_vy=arr["vy"],
        agent_valid=valid,
        map=lane_map,
        route_lane_ids=route_ids,
        route_polyline=route_poly,
        metadata=meta,
        signal_states=signal_states,
    )
