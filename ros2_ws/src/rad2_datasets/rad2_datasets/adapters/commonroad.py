"""CommonRoad XML scenarios -> :class:`Clip` (via ``commonroad-io``).

Lanelets become lanes (centre vertices, left/right vertices, successors); each lanelet's polygon
is a drivable-area polygon; speed limits come from MAX_SPEED traffic signs on the lanelet when
present, else a default by lanelet type (``adapters.commonroad_speed_limits`` in params/bev.yaml).

NGSIM-derived scenarios have no recorded ego: one dynamic obstacle is promoted to ego
(``ego_obstacle_id``). By default the choice is among the vehicles of passenger-car size that move
(``adapters.promoted_ego`` in params/bev.yaml: a parked car or a 10 m truck is never the ego): the one
with the longest trajectory, ties broken by the most central starting lane (most lanes on both sides),
then by the smallest id. :func:`rank_egos` gives that order for all of them, so one scene can give
several clips (``rad2 data convert --egos-per-scenario``).
The clip spans the ego's time steps; the other obstacles are valid where their states exist.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.config import require
from rad2_core.geometry import boxes_overlap, wrap_angle
from rad2_core.lane_map import NO_LANE, LaneMap

from rad2_datasets.adapters import lane_match_costs, logged_clip


class CommonRoadAdapterError(ValueError):
    """The scenario cannot be converted (unknown ego id, no dynamic obstacles, ...)."""


_TYPE_MAP = {
    "CAR": AGENT_VEHICLE,
    "TRUCK": AGENT_VEHICLE,
    "BUS": AGENT_VEHICLE,
    "PRIORITY_VEHICLE": AGENT_VEHICLE,
    "TAXI": AGENT_VEHICLE,
    "TRAIN": AGENT_VEHICLE,
    "PEDESTRIAN": AGENT_PEDESTRIAN,
    "BICYCLE": AGENT_CYCLIST,
    "MOTORCYCLE": AGENT_CYCLIST,
}


def box_size(shape) -> tuple[float, float]:
    if hasattr(shape, "length") and hasattr(shape, "width"):
        return float(shape.length), float(shape.width)
    if hasattr(shape, "radius"):
        return 2.0 * float(shape.radius), 2.0 * float(shape.radius)
    if hasattr(shape, "vertices"):
        v = np.asarray(shape.vertices)
        ext = v.max(axis=0) - v.min(axis=0)
        return float(max(ext)), float(min(ext))
    raise CommonRoadAdapterError(f"obstacle shape {type(shape).__name__} has no usable size")


def obstacle_states(obstacle) -> dict[int, Any]:
    """time_step -> state (initial state plus the predicted trajectory)."""
    out = {int(obstacle.initial_state.time_step): obstacle.initial_state}
    pred = getattr(obstacle, "prediction", None)
    traj = getattr(pred, "trajectory", None)
    if traj is not None:
        for s in traj.state_list:
            out[int(s.time_step)] = s
    return out


def _field(state, name: str):
    """A state's own field ``name`` (None when the state class has none or it is unset): commonroad-io
    2024 states also answer some names through derived properties (ExtendedPMState.velocity_y)."""
    fields = getattr(state, "attributes", None)
    if fields is not None and name not in fields:
        return None
    value = getattr(state, name, None)
    return None if value is None else float(value)


def _velocity(state) -> tuple[float, float]:
    """World-frame (vx, vy) of an obstacle state. ``velocity`` is the speed along ``orientation`` (plus
    ``slip_angle`` where the state has one); a ``velocity_y`` *field* beside an orientation is the lateral
    speed in the body frame (the multi-body model's states); a point-mass state (no orientation) holds
    world-frame ``velocity``, ``velocity_y``. The ExtendedPMState of commonroad-io 2024 (the recorded-
    traffic scenarios' states) has no such field but a ``velocity_y`` *property*, ``sin(orientation) ·
    velocity``, a world-frame component: read as a body lateral speed it turned a car driving 11 m/s along
    its lane into one at 15 m/s drifting 10 m/s across, and every check that extrapolates agents saw the
    car ahead leave the lane."""
    v = float(getattr(state, "velocity", 0.0) or 0.0)
    vy = _field(state, "velocity_y")
    yaw = _field(state, "orientation")
    if yaw is None:  # point mass: world components
        return v, (vy or 0.0)
    if vy is None:  # the velocity points along the heading turned by the slip angle
        yaw += _field(state, "slip_angle") or 0.0
    c, s = np.cos(yaw), np.sin(yaw)
    if vy is not None:
        return v * c - vy * s, v * s + vy * c
    return v * c, v * s


def _yaw(state) -> float:
    """A state's heading: its orientation, or (a point-mass state has none) its velocity's direction."""
    yaw = _field(state, "orientation")
    if yaw is not None:
        return yaw
    vx, vy = _velocity(state)
    return float(np.arctan2(vy, vx))


def _speed_limit(lanelet, network, limits: dict[str, float]) -> float:
    best = None
    for sid in getattr(lanelet, "traffic_signs", set()) or set():
        sign = network.find_traffic_sign_by_id(sid)
        for el in getattr(sign, "traffic_sign_elements", []) or []:
            name = getattr(el.traffic_sign_element_id, "name", "")
            if name == "MAX_SPEED" and el.additional_values:
                try:
                    v = float(el.additional_values[0])
                except (TypeError, ValueError):
                    continue
                best = v if best is None else min(best, v)
    if best is not None and best > 0:
        return best
    types = sorted(str(getattr(t, "value", t)).lower() for t in (lanelet.lanelet_type or ()))
    for t in types:
        if t in limits:
            return float(limits[t])
    return float(limits["default"])


# Line markings a lane change may cross. UNKNOWN and NO_MARKING count as crossable: the map does not
# forbid the change (Lankershim marks many of its boundaries UNKNOWN).
_CROSSABLE_MARKINGS = {"DASHED", "BROAD_DASHED", "UNKNOWN", "NO_MARKING"}


def _neighbour(lanelet, side: str, known: set[int]) -> tuple[int, bool]:
    """(lane id of the same-direction neighbour on ``side`` or NO_LANE, whether a change into it is
    allowed by the marking between them)."""
    nb = getattr(lanelet, f"adj_{side}")
    if nb is None or not getattr(lanelet, f"adj_{side}_same_direction") or int(nb) not in known:
        return NO_LANE, False
    if int(nb) == int(lanelet.lanelet_id):
        return NO_LANE, False
    marking = getattr(getattr(lanelet, f"line_marking_{side}_vertices"), "name", "UNKNOWN")
    return int(nb), marking in _CROSSABLE_MARKINGS


def lanelet_map(scenario, params: dict[str, Any]) -> LaneMap:
    """The scenario's lanelet network as a LaneMap, with adjacency: a neighbour of the same direction
    (``adj_left/right`` with ``*_same_direction``), a change into it allowed unless the marking between
    them is solid (so the route builder follows the ego's lane changes instead of stitching lanes)."""
    limits = require(params, "adapters.commonroad_speed_limits")
    network = scenario.lanelet_network
    lanelets = sorted(network.lanelets, key=lambda ll: ll.lanelet_id)
    if not lanelets:
        raise CommonRoadAdapterError("scenario has no lanelets")
    ids = [int(ll.lanelet_id) for ll in lanelets]
    known = set(ids)
    left = [_neighbour(ll, "left", known) for ll in lanelets]
    right = [_neighbour(ll, "right", known) for ll in lanelets]
    return LaneMap.build(
        lane_ids=ids,
        centerlines=[np.asarray(ll.center_vertices) for ll in lanelets],
        left_boundaries=[np.asarray(ll.left_vertices) for ll in lanelets],
        right_boundaries=[np.asarray(ll.right_vertices) for ll in lanelets],
        speed_limits=[_speed_limit(ll, network, limits) for ll in lanelets],
        successors=[[int(s) for s in ll.successor if int(s) in known] for ll in lanelets],
        drivable_areas=[
            np.concatenate([np.asarray(ll.right_vertices), np.asarray(ll.left_vertices)[::-1]])
            for ll in lanelets
        ],
        crosswalks=[],
        left_neighbors=[nb for nb, _ in left],
        right_neighbors=[nb for nb, _ in right],
        lane_change_left=[ok for _, ok in left],
        lane_change_right=[ok for _, ok in right],
    )


def _centrality(scenario, lane_map: LaneMap, obstacle, heading_weight: float) -> int:
    """min(lanes to the left, lanes to the right) of the obstacle's starting lanelet."""
    s = obstacle.initial_state
    costs = lane_match_costs(
        lane_map, np.asarray(s.position, float)[None], np.array([float(s.orientation)]), heading_weight
    )
    lanelet = scenario.lanelet_network.find_lanelet_by_id(int(lane_map.lane_ids[int(np.argmin(costs[0]))]))

    def count(ll, side: str) -> int:
        n = 0
        while (
            ll is not None
            and getattr(ll, f"adj_{side}") is not None
            and getattr(ll, f"adj_{side}_same_direction")
            and n < 32
        ):
            ll = scenario.lanelet_network.find_lanelet_by_id(getattr(ll, f"adj_{side}"))
            n += 1
        return n

    return min(count(lanelet, "left"), count(lanelet, "right"))


def _qualifies_as_ego(obstacle, criteria: dict[str, Any]) -> str | None:
    """Why ``obstacle`` cannot be promoted to ego under ``adapters.promoted_ego`` (None: it can)."""
    if _TYPE_MAP.get(obstacle.obstacle_type.name, AGENT_OTHER) != AGENT_VEHICLE:
        return f"type {obstacle.obstacle_type.name}"
    length, width = box_size(obstacle.obstacle_shape)
    lo, hi = (float(v) for v in criteria["length_m"])
    if not lo <= length <= hi:
        return f"length {length:.1f} m outside [{lo}, {hi}]"
    lo, hi = (float(v) for v in criteria["width_m"])
    if not lo <= width <= hi:
        return f"width {width:.1f} m outside [{lo}, {hi}]"
    states = obstacle_states(obstacle)
    first, last = states[min(states)], states[max(states)]
    travel = float(np.hypot(*(np.asarray(last.position, float) - np.asarray(first.position, float))))
    if travel < float(criteria["min_travel_m"]):
        return f"travels {travel:.1f} m < {float(criteria['min_travel_m'])} m"
    return None


def logged_overlap(scenario, obstacle) -> str | None:
    """Where the logged box of ``obstacle`` overlaps another obstacle's box at the same time step (an
    NGSIM queue whose boxes overlap: replayed as the ego, that is a collision before the planner acts)."""
    own = obstacle_states(obstacle)
    length, width = box_size(obstacle.obstacle_shape)
    for other in scenario.obstacles:
        if other.obstacle_id == obstacle.obstacle_id:
            continue
        o_len, o_wid = box_size(other.obstacle_shape)
        theirs = obstacle_states(other) if other in scenario.dynamic_obstacles else None
        steps = sorted(own) if theirs is None else sorted(set(own) & set(theirs))
        if not steps:
            continue
        a = np.array([[*own[k].position, float(own[k].orientation), length, width] for k in steps], float)
        ref = other.initial_state
        b = np.array([[*(theirs[k] if theirs is not None else ref).position,
                       float((theirs[k] if theirs is not None else ref).orientation), o_len, o_wid]
                      for k in steps], float)
        hit = np.flatnonzero(boxes_overlap(a, b))
        if len(hit):
            return f"its logged box overlaps obstacle {other.obstacle_id} at time step {steps[int(hit[0])]}"
    return None


def rank_egos(scenario, lane_map: LaneMap, params: dict[str, Any]) -> list[int]:
    """Ids of the dynamic obstacles that may be promoted to ego (``adapters.promoted_ego``: a vehicle
    of passenger-car size that moves, whose logged box overlaps no other), best first: longest
    trajectory, then most central starting lane, then smallest id. Raises naming every obstacle's
    reason when none qualifies."""
    criteria = require(params, "adapters.promoted_ego")
    heading_weight = float(require(params, "adapters.lane_match_heading_weight_m_per_rad"))
    reasons = {o.obstacle_id: _qualifies_as_ego(o, criteria) for o in scenario.dynamic_obstacles}
    for o in scenario.dynamic_obstacles:
        if reasons[o.obstacle_id] is None:
            reasons[o.obstacle_id] = logged_overlap(scenario, o)
    fit = [o for o in scenario.dynamic_obstacles if reasons[o.obstacle_id] is None]
    if not fit:
        why = "; ".join(f"{k}: {v}" for k, v in sorted(reasons.items())[:12]) or "no dynamic obstacles"
        raise CommonRoadAdapterError(
            f"no dynamic obstacle qualifies as ego under adapters.promoted_ego {dict(criteria)} ({why}); "
            "pass ego_obstacle_id to choose one"
        )
    ranked = sorted(fit, key=lambda o: (-len(obstacle_states(o)),
                                        -_centrality(scenario, lane_map, o, heading_weight), o.obstacle_id))
    return [int(o.obstacle_id) for o in ranked]


def _xml_reader():
    """The XML scenario reader of the installed commonroad-io. From 2022.2 on, ``CommonRoadFileReader``
    also imports the protobuf reader, whose generated modules (protobuf 3.20 style) do not load under
    the protobuf 7 that rad2 pins (the Waymo reader's runtime); its XML reader alone does. 2022.1 has
    only ``CommonRoadFileReader``, which reads XML."""
    try:
        from commonroad.common.reader.file_reader_xml import XMLFileReader
    except ImportError:
        from commonroad.common.file_reader import CommonRoadFileReader as XMLFileReader
    return XMLFileReader


def read_commonroad_file(path: str | os.PathLike):
    """(scenario, planning problem set) of the CommonRoad XML file ``path``; a missing, truncated or
    malformed file is a :class:`CommonRoadAdapterError` naming it (commonroad-io raises whatever its
    XML parser or object constructors meet)."""
    path = Path(path)
    if not path.is_file():
        raise CommonRoadAdapterError(f"CommonRoad file {path} does not exist")
    try:
        return _xml_reader()(str(path)).open()
    except Exception as exc:  # noqa: BLE001 - the reader's failures have no common base class
        raise CommonRoadAdapterError(
            f"{path}: not a readable CommonRoad scenario ({type(exc).__name__}: {exc})") from exc


def commonroad_ego_candidates(path: str | os.PathLike, params: dict[str, Any]) -> list[int]:
    """:func:`rank_egos` of the scenario in the CommonRoad file ``path`` (``params``: params/bev.yaml as
    loaded)."""
    scenario, _ = read_commonroad_file(path)
    return rank_egos(scenario, lanelet_map(scenario, params), params)


def load_commonroad_scenario(
    path: str | os.PathLike, ego_obstacle_id: int | None = None, *, params: dict[str, Any]
) -> Clip:
    """Read a CommonRoad XML file into a validated :class:`Clip`, promoting an obstacle to ego (None:
    the best of :func:`rank_egos`; ``params``: params/bev.yaml and sim.yaml as loaded, merged). A route
    that does not follow the ego is a :class:`rad2_core.route_path.RouteError` naming the reason."""
    scenario, planning = read_commonroad_file(path)
    return scenario_clip(scenario, planning, ego_obstacle_id, params)


def obstacle_arrays(scenario, others, t0: int, num_steps: int) -> tuple:
    """The agents' arrays of ``others`` (CommonRoad obstacles) over time steps ``t0 .. t0 + num_steps - 1``:
    x, y, yaw, vx, vy, valid ``[N, num_steps]`` and their types, lengths and widths. A static obstacle
    is valid at every step."""
    shape = (len(others), num_steps)
    ax, ay, ayaw, avx, avy = (np.zeros(shape) for _ in range(5))
    valid = np.zeros(shape, dtype=bool)
    types, lengths, widths = [], [], []
    for i, o in enumerate(others):
        states = obstacle_states(o)
        if o in scenario.static_obstacles:  # valid for the whole clip
            states = {t0 + k: o.initial_state for k in range(num_steps)}
        for k, st in states.items():
            j = k - t0
            if 0 <= j < num_steps:
                ax[i, j], ay[i, j] = float(st.position[0]), float(st.position[1])
                ayaw[i, j] = float(wrap_angle(_yaw(st)))
                avx[i, j], avy[i, j] = _velocity(st)
                valid[i, j] = True
        types.append(_TYPE_MAP.get(o.obstacle_type.name, AGENT_OTHER))
        ln, wd = box_size(o.obstacle_shape)
        lengths.append(ln)
        widths.append(wd)
    return ax, ay, ayaw, avx, avy, valid, types, lengths, widths


def scenario_clip(scenario, planning, ego_obstacle_id: int | None, params: dict[str, Any],
                  lane_map: LaneMap | None = None) -> Clip:
    """The clip of an opened CommonRoad scenario with obstacle ``ego_obstacle_id`` as the ego (None: the
    best of :func:`rank_egos`); ``lane_map``: :func:`lanelet_map` of the scenario when the caller has
    it already (several egos of one scenario share it)."""
    dt = float(scenario.dt)
    lane_map = lanelet_map(scenario, params) if lane_map is None else lane_map
    if ego_obstacle_id is None:
        ego_obstacle_id = rank_egos(scenario, lane_map, params)[0]
    ego = scenario.obstacle_by_id(int(ego_obstacle_id))
    if ego is None or ego not in scenario.dynamic_obstacles:
        have = sorted(o.obstacle_id for o in scenario.dynamic_obstacles)
        raise CommonRoadAdapterError(
            f"ego_obstacle_id: {ego_obstacle_id} is not a dynamic obstacle (have {have})"
        )
    ego_states = obstacle_states(ego)
    steps = sorted(ego_states)
    if steps != list(range(steps[0], steps[-1] + 1)):
        raise CommonRoadAdapterError(f"ego_obstacle_id: {ego_obstacle_id} has gaps in its time steps")
    t0, num_steps = steps[0], len(steps)
    ex = np.array([ego_states[k].position[0] for k in steps], dtype=np.float64)
    ey = np.array([ego_states[k].position[1] for k in steps], dtype=np.float64)
    eyaw = wrap_angle(np.array([float(ego_states[k].orientation) for k in steps]))
    espeed = np.array([float(getattr(ego_states[k], "velocity", 0.0) or 0.0) for k in steps])
    ego_len, ego_wid = box_size(ego.obstacle_shape)

    others = sorted(
        (o for o in scenario.obstacles if o.obstacle_id != ego.obstacle_id), key=lambda o: o.obstacle_id
    )
    ax, ay, ayaw, avx, avy, valid, types, lengths, widths = obstacle_arrays(scenario, others, t0, num_steps)
    keep = valid.any(axis=1)
    idx = np.flatnonzero(keep)
    scenario_id = str(scenario.scenario_id)
    metadata = {
        "ego_obstacle_id": int(ego.obstacle_id),
        "promoted_ego": True,
        "start_time_step": int(t0),
        "planning_problem_ids": sorted(int(k) for k in planning.planning_problem_dict),
    }
    safe_id = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in scenario_id)
    agent_fields = {
        "agent_ids": [others[i].obstacle_id for i in idx],
        "agent_types": [types[i] for i in idx],
        "agent_length": [lengths[i] for i in idx],
        "agent_width": [widths[i] for i in idx],
        "agent_x": ax[keep],
        "agent_y": ay[keep],
        "agent_yaw": ayaw[keep],
        "agent_vx": avx[keep],
        "agent_vy": avy[keep],
        "agent_valid": valid[keep],
    }
    return logged_clip(
        params,
        lane_map,
        clip_id=f"cr_{safe_id}_ego{ego.obstacle_id}",
        source="commonroad",
        scenario_id=scenario_id,
        dt=dt,
        ego_x=ex,
        ego_y=ey,
        ego_yaw=eyaw,
        ego_speed=espeed,
        ego_length=ego_len,
        ego_width=ego_wid,
        agents=agent_fields,
        metadata=metadata,
    )
