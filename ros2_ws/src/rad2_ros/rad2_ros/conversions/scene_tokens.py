"""SceneTokens <-> the token part of an Observation (map polylines, agents, route, ego state and the
signal stop ahead), fixed-size arrays with masks on the numpy side and only the valid rows in the message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from geometry_msgs.msg import Point, Pose2D
from rad2_core.lane_map import SIGNAL_STATE_NAMES
from rad2_core.tokens import MAP_FEATURES, signal_features, signal_state_of_features
from rad2_datasets.bags import time_to_ns
from rad2_msgs.msg import AgentState, MapPolyline, SceneTokens

from rad2_ros.conversions.common import (
    EGO_FRAME,
    as_array,
    check_angles,
    check_finite,
    check_rows_finite,
    check_scalar,
    f32,
    fail,
    float32_array,
    headings_from_points,
    make_header,
)
from rad2_ros.conversions.objects import SIGNAL_STATES, AgentList, agent_list_to_states, agent_states_to_list

MAP_POLYLINE_TYPES = (MapPolyline.TYPE_CENTERLINE, MapPolyline.TYPE_BOUNDARY, MapPolyline.TYPE_CROSSWALK)


@dataclass(frozen=True)
class TokenSizes:
    """Fixed token counts the planner networks expect (the `tokens` block of params/bev.yaml)."""

    num_map_polylines: int
    points_per_polyline: int
    num_agents: int
    num_route_points: int

    @classmethod
    def from_params(cls, tokens_params: Mapping[str, Any]) -> TokenSizes:
        return cls(
            num_map_polylines=int(tokens_params["map"]["num_polylines"]),
            points_per_polyline=int(tokens_params["map"]["points_per_polyline"]),
            num_agents=int(tokens_params["agents"]["num_agents"]),
            num_route_points=int(tokens_params["route"]["num_points"]),
        )


@dataclass
class SceneTokenArrays:
    """The token part of an Observation (conventions.md), ego frame, float32, fixed sizes + masks."""

    # [N_map, P, 8]: x, y, cos h, sin h, speed limit, on_route, signal_stop, signal_go
    map_polylines: np.ndarray
    map_mask: np.ndarray  # [N_map] bool
    agents: np.ndarray  # [N_agents, 10]: x, y, cos, sin, vx, vy, length, width, is_vehicle, is_vru
    agents_mask: np.ndarray  # [N_agents] bool
    route: np.ndarray  # [N_route, 4]: x, y, cos h, sin h
    route_mask: np.ndarray  # [N_route] bool
    ego_state: np.ndarray  # [4]: speed, accel, yaw rate, steering
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME
    # Optional identities the fixed arrays do not carry (aligned with the rows; -1 / derived if None).
    lane_ids: np.ndarray | None = None
    agent_ids: np.ndarray | None = None
    agent_types: np.ndarray | None = None
    # [2] Observation.signal_stop: (distance to the nearest red/yellow stop line ahead, its state)
    signal_stop: np.ndarray | None = None

    @classmethod
    def from_observation(cls, obs: Any, stamp_ns: int = 0, frame_id: str = EGO_FRAME) -> SceneTokenArrays:
        return cls(
            obs.map_polylines,
            obs.map_mask,
            obs.agents,
            obs.agents_mask,
            obs.route,
            obs.route_mask,
            obs.ego_state,
            stamp_ns,
            frame_id,
            signal_stop=getattr(obs, "signal_stop", None),
        )

    @property
    def sizes(self) -> TokenSizes:
        return TokenSizes(
            self.map_polylines.shape[0],
            self.map_polylines.shape[1],
            self.agents.shape[0],
            self.route.shape[0],
        )


def scene_tokens_to_msg(tokens: SceneTokenArrays) -> SceneTokens:
    """Encode the valid (masked) rows; the fixed sizes are restored on decode with TokenSizes."""
    kind = "SceneTokens"
    polylines = as_array(kind, "map_polylines", tokens.map_polylines, (None, None, MAP_FEATURES))
    n_map = polylines.shape[0]
    map_mask = as_array(kind, "map_mask", tokens.map_mask, (n_map,), bool)
    agents = as_array(kind, "agents", tokens.agents, (None, 10))
    agents_mask = as_array(kind, "agents_mask", tokens.agents_mask, (agents.shape[0],), bool)
    route = as_array(kind, "route", tokens.route, (None, 4))
    route_mask = as_array(kind, "route_mask", tokens.route_mask, (route.shape[0],), bool)
    ego = as_array(kind, "ego_state", tokens.ego_state, (4,))

    msg = SceneTokens()
    msg.header = make_header(tokens.stamp_ns, tokens.frame_id)
    from rad2_core.stop_lines import NO_STOP_M

    stop = (np.array([NO_STOP_M, 0.0]) if tokens.signal_stop is None
            else as_array(kind, "signal_stop", tokens.signal_stop, (2,)))
    msg.signal_stop_distance = f32(min(float(stop[0]), NO_STOP_M))
    msg.signal_stop_state = int(round(float(stop[1])))
    lane_ids = (
        None if tokens.lane_ids is None else as_array(kind, "lane_ids", tokens.lane_ids, (n_map,), np.int64)
    )
    for m in np.flatnonzero(map_mask):
        rows = polylines[m]
        # Speed limit and route membership are per lane in the message; the arrays repeat them per
        # point, so a polyline that mixes values cannot be represented and is refused.
        for col, name in ((4, "speed limit"), (5, "on_route"), (6, "signal_stop"), (7, "signal_go")):
            if np.ptp(rows[:, col]) > 1e-6:
                raise fail(
                    kind,
                    f"map_polylines[{m}]",
                    f"has {name} varying along the polyline "
                    f"({rows[:, col].min()}..{rows[:, col].max()}); the message holds one per lane",
                )
        poly = MapPolyline()
        poly.type = MapPolyline.TYPE_CENTERLINE
        poly.lane_id = -1 if lane_ids is None else int(lane_ids[m])
        poly.speed_limit = f32(rows[0, 4])
        poly.on_route = bool(rows[0, 5] > 0.5)
        poly.signal_state = signal_state_of_features(float(rows[0, 6]), float(rows[0, 7]))
        poly.points = [Point(x=float(x), y=float(y), z=0.0) for x, y in rows[:, :2]]
        poly.headings = float32_array(np.arctan2(rows[:, 3], rows[:, 2]))
        msg.map_polylines.append(poly)

    valid_agents = np.flatnonzero(agents_mask)
    rows = agents[valid_agents]
    if tokens.agent_types is not None:
        types = as_array(kind, "agent_types", tokens.agent_types, (agents.shape[0],), np.int64)[valid_agents]
    else:
        types = np.where(
            rows[:, 8] > 0.5,
            AgentState.TYPE_VEHICLE,
            np.where(rows[:, 9] > 0.5, AgentState.TYPE_PEDESTRIAN, AgentState.TYPE_OTHER),
        )
    if tokens.agent_ids is not None:
        ids = as_array(kind, "agent_ids", tokens.agent_ids, (agents.shape[0],), np.int64)[valid_agents]
    else:
        ids = np.full(len(valid_agents), -1, dtype=np.int64)
    msg.agents = agent_list_to_states(
        kind,
        AgentList(
            ids=ids,
            types=types,
            x=rows[:, 0],
            y=rows[:, 1],
            yaw=np.arctan2(rows[:, 3], rows[:, 2]),
            length=rows[:, 6],
            width=rows[:, 7],
            vx=rows[:, 4],
            vy=rows[:, 5],
        ),
    )

    msg.route = [
        Pose2D(x=float(r[0]), y=float(r[1]), theta=float(math.atan2(r[3], r[2]))) for r in route[route_mask]
    ]
    msg.ego_speed, msg.ego_acceleration, msg.ego_yaw_rate, msg.ego_steering = (f32(v) for v in ego)
    return msg


def scene_tokens_from_msg(msg: SceneTokens, sizes: TokenSizes) -> SceneTokenArrays:
    """Decode into fixed-size arrays (valid rows first, then zero padding with mask False)."""
    kind = "SceneTokens"
    for field_name, count, limit in (
        ("map_polylines", len(msg.map_polylines), sizes.num_map_polylines),
        ("agents", len(msg.agents), sizes.num_agents),
        ("route", len(msg.route), sizes.num_route_points),
    ):
        if count > limit:
            raise fail(kind, field_name, f"has {count} entries, more than the {limit} the planner takes")

    polylines = np.zeros((sizes.num_map_polylines, sizes.points_per_polyline, MAP_FEATURES), dtype=np.float32)
    map_mask = np.zeros(sizes.num_map_polylines, dtype=bool)
    lane_ids = np.full(sizes.num_map_polylines, -1, dtype=np.int64)
    # Per polyline only the cheap checks (counts, enums); the values of all polylines are read and
    # checked as one array (a Python pass per polyline cost ~1 ms of the planner's cycle).
    n_poly = len(msg.map_polylines)
    per_point = sizes.points_per_polyline
    for m, poly in enumerate(msg.map_polylines):
        name = f"map_polylines[{m}]"
        if len(poly.points) != per_point:
            raise fail(kind, f"{name}.points", f"has {len(poly.points)} points, expected {per_point}")
        if len(poly.headings) not in (0, per_point):
            raise fail(kind, f"{name}.headings",
                        f"has {len(poly.headings)} values for {per_point} points (expected equal or 0)")
        if poly.type not in MAP_POLYLINE_TYPES:
            raise fail(kind, f"{name}.type", f"is {poly.type}, expected one of {MAP_POLYLINE_TYPES}")
        if poly.signal_state not in SIGNAL_STATE_NAMES:
            raise fail(kind, f"{name}.signal_state",
                        f"is {poly.signal_state}, expected one of {sorted(SIGNAL_STATE_NAMES)}")
    if n_poly:
        polys = msg.map_polylines
        xy = np.array([(p.x, p.y) for poly in polys for p in poly.points], dtype=np.float64)
        xy = xy.reshape(n_poly, per_point, 2)
        check_rows_finite(kind, "map_polylines[{}].points", xy)
        headings = np.zeros((n_poly, per_point), dtype=np.float64)
        for m, poly in enumerate(polys):
            if len(poly.headings):
                headings[m] = np.asarray(poly.headings, dtype=np.float32)
            else:
                headings[m] = headings_from_points(xy[m], start_xy=None)
        check_rows_finite(kind, "map_polylines[{}].headings", headings)
        check_angles(kind, "map_polylines[{}].headings", headings)
        speed_limits = np.array([poly.speed_limit for poly in polys], dtype=np.float64)
        check_rows_finite(kind, "map_polylines[{}].speed_limit", speed_limits)
        polylines[:n_poly, :, 0:2] = xy
        polylines[:n_poly, :, 2] = np.cos(headings)
        polylines[:n_poly, :, 3] = np.sin(headings)
        polylines[:n_poly, :, 4] = speed_limits[:, None]
        polylines[:n_poly, :, 5] = np.array([1.0 if poly.on_route else 0.0 for poly in polys])[:, None]
        polylines[:n_poly, :, 6:8] = np.array([signal_features(poly.signal_state) for poly in polys])[:, None]
        map_mask[:n_poly] = True
        lane_ids[:n_poly] = [poly.lane_id for poly in polys]

    agent_list = agent_states_to_list(kind, msg.agents)
    n = len(agent_list)
    agents = np.zeros((sizes.num_agents, 10), dtype=np.float32)
    agents_mask = np.zeros(sizes.num_agents, dtype=bool)
    agent_ids = np.full(sizes.num_agents, -1, dtype=np.int64)
    agent_types = np.full(sizes.num_agents, AgentState.TYPE_OTHER, dtype=np.uint8)
    if n:
        agents[:n] = np.stack(
            [
                agent_list.x,
                agent_list.y,
                np.cos(agent_list.yaw),
                np.sin(agent_list.yaw),
                agent_list.vx,
                agent_list.vy,
                agent_list.length,
                agent_list.width,
                agent_list.types == AgentState.TYPE_VEHICLE,
                (agent_list.types == AgentState.TYPE_PEDESTRIAN)
                | (agent_list.types == AgentState.TYPE_CYCLIST),
            ],
            axis=1,
        )
        agents_mask[:n] = True
        agent_ids[:n] = agent_list.ids
        agent_types[:n] = agent_list.types

    route = np.zeros((sizes.num_route_points, 4), dtype=np.float32)
    route_mask = np.zeros(sizes.num_route_points, dtype=bool)
    if msg.route:
        poses = np.array([(p.x, p.y, p.theta) for p in msg.route], dtype=np.float64)
        check_finite(kind, "route", poses)
        check_angles(kind, "route[{}].theta", poses[:, 2])
        k = len(poses)
        route[:k] = np.stack([poses[:, 0], poses[:, 1], np.cos(poses[:, 2]), np.sin(poses[:, 2])], axis=1)
        route_mask[:k] = True

    ego = np.array(
        [msg.ego_speed, msg.ego_acceleration, msg.ego_yaw_rate, msg.ego_steering], dtype=np.float32
    )
    for value, name in zip(ego, ("ego_speed", "ego_acceleration", "ego_yaw_rate", "ego_steering")):
        check_scalar(kind, name, value)
    stop_distance = check_scalar(kind, "signal_stop_distance", msg.signal_stop_distance)
    if int(msg.signal_stop_state) not in SIGNAL_STATES:
        raise fail(kind, "signal_stop_state", f"is {msg.signal_stop_state}, expected one of {SIGNAL_STATES}")
    if stop_distance < -10.0:  # the line is behind the ego: perception would not report it
        raise fail(kind, "signal_stop_distance", f"is {stop_distance} m, a stop line behind the ego")
    return SceneTokenArrays(
        polylines,
        map_mask,
        agents,
        agents_mask,
        route,
        route_mask,
        ego,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        lane_ids,
        agent_ids,
        agent_types,
        np.array([stop_distance, int(msg.signal_stop_state)], dtype=np.float32),
    )
