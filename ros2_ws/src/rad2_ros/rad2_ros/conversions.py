"""The one place where rad2_msgs / standard ROS messages are converted to and from numpy arrays.

Encoders take the arrays the core produces (conventions.md: Observation, planner output) and return
messages; decoders validate a received message before returning arrays and raise
``MessageValidationError`` naming the message type, the field and the offending value or sizes, so a
node can reject the input (and count it) instead of feeding garbage to the planner.

Large float arrays (the BEV tensor) are assigned through ``array.array`` built from the numpy buffer
and read back with ``np.frombuffer``: building a Python list element by element costs ~30x more.
Times are integer nanoseconds (``stamp_ns``) on the numpy side.
"""

from __future__ import annotations

import array
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, Pose2D, PoseStamped
from nav_msgs.msg import Odometry, Path
from rad2_core.geometry import quaternion_to_yaw, yaw_to_quaternion
from rad2_core.lane_map import SIGNAL_STATE_NAMES
from rad2_core.tokens import MAP_FEATURES, signal_features, signal_state_of_features
from rad2_datasets.bags import planning_diagnostics_record, time_to_ns
from rad2_msgs.msg import (
    AgentState,
    BevFeatures,
    CandidateSet,
    ControlCommand,
    MapPolyline,
    PerceptionInputs,
    PlanningDiagnostics,
    SceneTokens,
    StageLatency,
    TrafficSignal,
    Trajectory,
)
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

EGO_FRAME = "base_link"
WORLD_FRAME = "map"
_NS_PER_S = 1_000_000_000
# Points closer than this give no usable direction; the previous heading is kept.
_MIN_HEADING_STEP_M = 1e-3

AGENT_TYPES = (
    AgentState.TYPE_VEHICLE,
    AgentState.TYPE_PEDESTRIAN,
    AgentState.TYPE_CYCLIST,
    AgentState.TYPE_OTHER,
)
MAP_POLYLINE_TYPES = (MapPolyline.TYPE_CENTERLINE, MapPolyline.TYPE_BOUNDARY, MapPolyline.TYPE_CROSSWALK)


class MessageValidationError(ValueError):
    """A message (or the arrays to encode into one) violates the rad2 interface contract."""


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


def _fail(message_type: str, field_name: str, detail: str) -> MessageValidationError:
    return MessageValidationError(f"{message_type}.{field_name} {detail}")


def _check_finite(message_type: str, field_name: str, values: np.ndarray) -> None:
    values = np.asarray(values)
    if values.size and not np.all(np.isfinite(values)):
        bad = np.argwhere(~np.isfinite(values))
        first = tuple(int(i) for i in bad[0])
        raise _fail(
            message_type,
            field_name,
            f"has {len(bad)} non-finite values (first {values[first]!r} at index {first})",
        )


def _check_rows_finite(message_type: str, field_pattern: str, values: np.ndarray) -> None:
    """Like ``_check_finite`` for values stacked from many sub-messages (axis 0): the error names the
    first bad one (``field_pattern`` formatted with its index) and the index within it."""
    finite = np.isfinite(values)
    if finite.all():
        return
    row = int(np.argwhere(~finite.reshape(len(values), -1).all(axis=1))[0, 0])
    if values.ndim == 1:
        _check_scalar(message_type, field_pattern.format(row), values[row])
    _check_finite(message_type, field_pattern.format(row), values[row])


def _check_scalar(message_type: str, field_name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise _fail(message_type, field_name, f"is {value!r}, expected a finite number")
    return value


def _as_array(message_type: str, field_name: str, value: Any, shape: tuple, dtype=np.float32) -> np.ndarray:
    """`value` as an array of `shape` (None = any size on that axis), finite if floating."""
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise _fail(message_type, field_name, f"cannot be read as {np.dtype(dtype).name}: {err}") from err
    if arr.ndim != len(shape) or any(want is not None and got != want for got, want in zip(arr.shape, shape)):
        expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise _fail(message_type, field_name, f"has shape {list(arr.shape)}, expected {expected}")
    if np.issubdtype(arr.dtype, np.floating):
        _check_finite(message_type, field_name, arr)
    return arr


def _f32(value: float) -> float:
    """A value for a float32 field, rounded now so that an unserialized message (intra-process
    delivery, composed nodes) decodes to exactly what one that crossed DDS does."""
    return float(np.float32(value))


def _float32_array(values: np.ndarray) -> array.array:
    out = array.array("f")
    out.frombytes(np.ascontiguousarray(values, dtype=np.float32).tobytes())
    return out


def ns_to_time(stamp_ns: int) -> Time:
    stamp_ns = int(stamp_ns)
    if stamp_ns < 0:
        raise MessageValidationError(f"builtin_interfaces/Time: stamp_ns {stamp_ns} is negative")
    return Time(sec=stamp_ns // _NS_PER_S, nanosec=stamp_ns % _NS_PER_S)


def make_header(stamp_ns: int, frame_id: str) -> Header:
    return Header(stamp=ns_to_time(stamp_ns), frame_id=str(frame_id))


def headings_from_points(
    points: np.ndarray, start_xy: Sequence[float] | None = (0.0, 0.0), start_yaw: float = 0.0
) -> np.ndarray:
    """Heading (rad) at each of `points` [T, 2] by central finite differences.

    `start_xy` is the position before the first point (the ego origin for an ego-frame plan; None
    when unknown: forward difference at the first point). Where consecutive points nearly coincide
    (a stop) the previous heading is held, starting from `start_yaw`.
    """
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if len(pts) == 0:
        return np.zeros(0)
    padded = pts if start_xy is None else np.vstack([np.asarray(start_xy, dtype=np.float64)[None], pts])
    offset = 0 if start_xy is None else 1
    headings = np.empty(len(pts))
    previous = float(start_yaw)
    for k in range(len(pts)):
        i = k + offset
        before = padded[max(i - 1, 0)]
        after = padded[min(i + 1, len(padded) - 1)]
        delta = after - before
        if math.hypot(delta[0], delta[1]) >= _MIN_HEADING_STEP_M:
            previous = math.atan2(delta[1], delta[0])
        headings[k] = previous
    return headings


# --------------------------------------------------------------------------------------------------
# BEV features
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BevGrid:
    """Grid geometry of a BEV raster (BevFeatures.msg convention, ego frame, metres)."""

    resolution: float
    height: int
    width: int
    origin_x: float
    origin_y: float

    def as_float32(self) -> BevGrid:
        """The geometry as a BevFeatures message carries it (float32 resolution and origin)."""
        return BevGrid(
            _f32(self.resolution), self.height, self.width, _f32(self.origin_x), _f32(self.origin_y)
        )

    @classmethod
    def from_params(cls, bev_params: Mapping[str, Any]) -> BevGrid:
        """From the `bev` block of params/bev.yaml (load_params("bev")["bev"])."""
        return cls(
            resolution=float(bev_params["resolution_m"]),
            height=int(bev_params["height"]),
            width=int(bev_params["width"]),
            origin_x=float(bev_params["origin_x"]),
            origin_y=float(bev_params["origin_y"]),
        )


@dataclass
class BevFrame:
    """A decoded BevFeatures message."""

    features: np.ndarray  # [C, H, W] float32
    grid: BevGrid
    channel_names: tuple[str, ...]
    stamp_ns: int
    frame_id: str


def _check_grid(message_type: str, grid: BevGrid) -> None:
    if not (math.isfinite(grid.resolution) and grid.resolution > 0):
        raise _fail(message_type, "resolution", f"is {grid.resolution!r}, expected a positive finite number")
    if grid.height <= 0 or grid.width <= 0:
        raise _fail(message_type, "height/width", f"are {grid.height}x{grid.width}, expected positive sizes")
    for name in ("origin_x", "origin_y"):
        _check_scalar(message_type, name, getattr(grid, name))


def bev_to_msg(
    features: np.ndarray,
    grid: BevGrid,
    channel_names: Sequence[str],
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
) -> BevFeatures:
    """Encode a [C, H, W] raster with its grid geometry and channel names."""
    kind = "BevFeatures"
    _check_grid(kind, grid)
    names = [str(n) for n in channel_names]
    feats = _as_array(kind, "data", features, (len(names), grid.height, grid.width))
    msg = BevFeatures()
    msg.header = make_header(stamp_ns, frame_id)
    msg.resolution = _f32(grid.resolution)
    msg.height = int(grid.height)
    msg.width = int(grid.width)
    msg.origin_x = _f32(grid.origin_x)
    msg.origin_y = _f32(grid.origin_y)
    msg.channel_names = names
    msg.data = _float32_array(feats)
    return msg


def bev_from_msg(
    msg: BevFeatures, expected_channels: Sequence[str] | None = None, expected_grid: BevGrid | None = None
) -> BevFrame:
    """Decode and validate: data size against the declared grid and channels, finiteness, and (when
    given) the channel names and grid the consumer was configured for."""
    kind = "BevFeatures"
    grid = BevGrid(
        float(msg.resolution), int(msg.height), int(msg.width), float(msg.origin_x), float(msg.origin_y)
    )
    _check_grid(kind, grid)
    names = tuple(str(n) for n in msg.channel_names)
    if not names:
        raise _fail(kind, "channel_names", "is empty, expected at least one channel")
    if len(set(names)) != len(names):
        raise _fail(kind, "channel_names", f"has duplicates: {list(names)}")
    if expected_channels is not None and tuple(expected_channels) != names:
        raise _fail(
            kind,
            "channel_names",
            f"has {len(names)} channels {list(names)}, expected {len(expected_channels)} "
            f"{list(expected_channels)}",
        )
    # The message carries float32 geometry: compare with the configured grid at that precision.
    if expected_grid is not None and grid != expected_grid.as_float32():
        raise _fail(kind, "grid", f"is {grid}, expected {expected_grid}")
    num_values = len(msg.data)
    expected = len(names) * grid.height * grid.width
    if num_values != expected:
        raise _fail(
            kind,
            "data",
            f"has {num_values} values, expected {len(names)}*{grid.height}*{grid.width}={expected} "
            f"for the declared grid and {len(names)} channel names",
        )
    data = msg.data
    if not isinstance(data, array.array) or data.typecode != "f":
        data = array.array("f", data)
    features = np.frombuffer(data, dtype=np.float32).reshape(len(names), grid.height, grid.width)
    if not np.all(np.isfinite(features)):
        bad = np.argwhere(~np.isfinite(features))
        c, i, j = (int(v) for v in bad[0])
        raise _fail(
            kind,
            "data",
            f"has {len(bad)} non-finite values (first {features[c, i, j]!r} in channel '{names[c]}' "
            f"at row {i}, column {j})",
        )
    return BevFrame(features, grid, names, time_to_ns(msg.header.stamp), str(msg.header.frame_id))


# --------------------------------------------------------------------------------------------------
# Agents (shared by SceneTokens and PerceptionInputs)
# --------------------------------------------------------------------------------------------------


@dataclass
class AgentList:
    """Agents as parallel arrays [N]: box centre pose, box size, velocity, id and type."""

    ids: np.ndarray  # int64
    types: np.ndarray  # uint8, AgentState.TYPE_*
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    length: np.ndarray
    width: np.ndarray
    vx: np.ndarray
    vy: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def _agent_list_to_states(kind: str, agents: AgentList) -> list[AgentState]:
    n = len(agents.ids)
    cols = {}
    for name in ("x", "y", "yaw", "length", "width", "vx", "vy"):
        cols[name] = _as_array(kind, f"agents.{name}", getattr(agents, name), (n,), np.float64)
    types = _as_array(kind, "agents.types", agents.types, (n,), np.int64)
    bad_types = [int(t) for t in types if int(t) not in AGENT_TYPES]
    if bad_types:
        raise _fail(kind, "agents.type", f"has unknown values {bad_types[:5]}, expected one of {AGENT_TYPES}")
    ids = _as_array(kind, "agents.id", agents.ids, (n,), np.int64)
    states = []
    for k in range(n):
        states.append(
            AgentState(
                id=int(ids[k]),
                type=int(types[k]),
                pose=Pose2D(x=float(cols["x"][k]), y=float(cols["y"][k]), theta=float(cols["yaw"][k])),
                length=_f32(cols["length"][k]),
                width=_f32(cols["width"][k]),
                velocity_x=_f32(cols["vx"][k]),
                velocity_y=_f32(cols["vy"][k]),
            )
        )
    return states


def _agent_states_to_list(kind: str, states: Sequence[AgentState]) -> AgentList:
    n = len(states)
    out = AgentList(
        ids=np.array([s.id for s in states], dtype=np.int64),
        types=np.array([s.type for s in states], dtype=np.uint8),
        x=np.array([s.pose.x for s in states], dtype=np.float64),
        y=np.array([s.pose.y for s in states], dtype=np.float64),
        yaw=np.array([s.pose.theta for s in states], dtype=np.float64),
        length=np.array([s.length for s in states], dtype=np.float64),
        width=np.array([s.width for s in states], dtype=np.float64),
        vx=np.array([s.velocity_x for s in states], dtype=np.float64),
        vy=np.array([s.velocity_y for s in states], dtype=np.float64),
    )
    for name in ("x", "y", "yaw", "length", "width", "vx", "vy"):
        _check_finite(kind, f"agents.{name}", getattr(out, name))
    bad = [int(t) for t in out.types if int(t) not in AGENT_TYPES]
    if bad:
        raise _fail(kind, "agents.type", f"has unknown values {bad[:5]}, expected one of {AGENT_TYPES}")
    if n and (np.any(out.length <= 0) or np.any(out.width <= 0)):
        k = int(np.argmax((out.length <= 0) | (out.width <= 0)))
        raise _fail(
            kind, f"agents[{k}]", f"has box {out.length[k]}x{out.width[k]} m, expected positive sizes"
        )
    return out


def perception_inputs_to_msg(
    agents: AgentList, stamp_ns: int = 0, frame_id: str = WORLD_FRAME,
    signals: Mapping[int, int] | None = None,
) -> PerceptionInputs:
    """``signals``: map signal id -> state (clip.SIGNAL_*, = TrafficSignal.STATE_*)."""
    msg = PerceptionInputs()
    msg.header = make_header(stamp_ns, frame_id)
    msg.agents = _agent_list_to_states("PerceptionInputs", agents)
    msg.signals = [TrafficSignal(signal_id=int(k), state=int(v)) for k, v in (signals or {}).items()]
    return msg


SIGNAL_STATES = (TrafficSignal.STATE_UNKNOWN, TrafficSignal.STATE_RED, TrafficSignal.STATE_YELLOW,
                 TrafficSignal.STATE_GREEN)


def perception_signals_from_msg(msg: PerceptionInputs) -> dict[int, int]:
    """signal id -> state of the message's traffic signals (a bad state or a repeated id is an error
    naming the entry)."""
    out: dict[int, int] = {}
    for k, sig in enumerate(msg.signals):
        if int(sig.state) not in SIGNAL_STATES:
            raise _fail("PerceptionInputs", f"signals[{k}].state",
                        f"is {sig.state}, expected one of {SIGNAL_STATES}")
        if int(sig.signal_id) in out:
            raise _fail("PerceptionInputs", f"signals[{k}].signal_id", f"repeats signal {sig.signal_id}")
        out[int(sig.signal_id)] = int(sig.state)
    return out


def perception_inputs_from_msg(msg: PerceptionInputs) -> tuple[AgentList, int, str]:
    """-> (agents, stamp_ns, frame_id)."""
    agents = _agent_states_to_list("PerceptionInputs", msg.agents)
    ids = agents.ids.tolist()
    if len(set(ids)) != len(ids):
        raise _fail("PerceptionInputs", "agents.id", f"has duplicate ids {sorted(ids)}")
    return agents, time_to_ns(msg.header.stamp), str(msg.header.frame_id)


# --------------------------------------------------------------------------------------------------
# Scene tokens
# --------------------------------------------------------------------------------------------------


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
    polylines = _as_array(kind, "map_polylines", tokens.map_polylines, (None, None, MAP_FEATURES))
    n_map = polylines.shape[0]
    map_mask = _as_array(kind, "map_mask", tokens.map_mask, (n_map,), bool)
    agents = _as_array(kind, "agents", tokens.agents, (None, 10))
    agents_mask = _as_array(kind, "agents_mask", tokens.agents_mask, (agents.shape[0],), bool)
    route = _as_array(kind, "route", tokens.route, (None, 4))
    route_mask = _as_array(kind, "route_mask", tokens.route_mask, (route.shape[0],), bool)
    ego = _as_array(kind, "ego_state", tokens.ego_state, (4,))

    msg = SceneTokens()
    msg.header = make_header(tokens.stamp_ns, tokens.frame_id)
    from rad2_core.stop_lines import NO_STOP_M

    stop = (np.array([NO_STOP_M, 0.0]) if tokens.signal_stop is None
            else _as_array(kind, "signal_stop", tokens.signal_stop, (2,)))
    msg.signal_stop_distance = _f32(min(float(stop[0]), NO_STOP_M))
    msg.signal_stop_state = int(round(float(stop[1])))
    lane_ids = (
        None if tokens.lane_ids is None else _as_array(kind, "lane_ids", tokens.lane_ids, (n_map,), np.int64)
    )
    for m in np.flatnonzero(map_mask):
        rows = polylines[m]
        # Speed limit and route membership are per lane in the message; the arrays repeat them per
        # point, so a polyline that mixes values cannot be represented and is refused.
        for col, name in ((4, "speed limit"), (5, "on_route"), (6, "signal_stop"), (7, "signal_go")):
            if np.ptp(rows[:, col]) > 1e-6:
                raise _fail(
                    kind,
                    f"map_polylines[{m}]",
                    f"has {name} varying along the polyline "
                    f"({rows[:, col].min()}..{rows[:, col].max()}); the message holds one per lane",
                )
        poly = MapPolyline()
        poly.type = MapPolyline.TYPE_CENTERLINE
        poly.lane_id = -1 if lane_ids is None else int(lane_ids[m])
        poly.speed_limit = _f32(rows[0, 4])
        poly.on_route = bool(rows[0, 5] > 0.5)
        poly.signal_state = signal_state_of_features(float(rows[0, 6]), float(rows[0, 7]))
        poly.points = [Point(x=float(x), y=float(y), z=0.0) for x, y in rows[:, :2]]
        poly.headings = _float32_array(np.arctan2(rows[:, 3], rows[:, 2]))
        msg.map_polylines.append(poly)

    valid_agents = np.flatnonzero(agents_mask)
    rows = agents[valid_agents]
    if tokens.agent_types is not None:
        types = _as_array(kind, "agent_types", tokens.agent_types, (agents.shape[0],), np.int64)[valid_agents]
    else:
        types = np.where(
            rows[:, 8] > 0.5,
            AgentState.TYPE_VEHICLE,
            np.where(rows[:, 9] > 0.5, AgentState.TYPE_PEDESTRIAN, AgentState.TYPE_OTHER),
        )
    if tokens.agent_ids is not None:
        ids = _as_array(kind, "agent_ids", tokens.agent_ids, (agents.shape[0],), np.int64)[valid_agents]
    else:
        ids = np.full(len(valid_agents), -1, dtype=np.int64)
    msg.agents = _agent_list_to_states(
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
    msg.ego_speed, msg.ego_acceleration, msg.ego_yaw_rate, msg.ego_steering = (_f32(v) for v in ego)
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
            raise _fail(kind, field_name, f"has {count} entries, more than the {limit} the planner takes")

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
            raise _fail(kind, f"{name}.points", f"has {len(poly.points)} points, expected {per_point}")
        if len(poly.headings) not in (0, per_point):
            raise _fail(kind, f"{name}.headings",
                        f"has {len(poly.headings)} values for {per_point} points (expected equal or 0)")
        if poly.type not in MAP_POLYLINE_TYPES:
            raise _fail(kind, f"{name}.type", f"is {poly.type}, expected one of {MAP_POLYLINE_TYPES}")
        if poly.signal_state not in SIGNAL_STATE_NAMES:
            raise _fail(kind, f"{name}.signal_state",
                        f"is {poly.signal_state}, expected one of {sorted(SIGNAL_STATE_NAMES)}")
    if n_poly:
        polys = msg.map_polylines
        xy = np.array([(p.x, p.y) for poly in polys for p in poly.points], dtype=np.float64)
        xy = xy.reshape(n_poly, per_point, 2)
        _check_rows_finite(kind, "map_polylines[{}].points", xy)
        headings = np.zeros((n_poly, per_point), dtype=np.float64)
        for m, poly in enumerate(polys):
            if len(poly.headings):
                headings[m] = np.asarray(poly.headings, dtype=np.float32)
            else:
                headings[m] = headings_from_points(xy[m], start_xy=None)
        _check_rows_finite(kind, "map_polylines[{}].headings", headings)
        speed_limits = np.array([poly.speed_limit for poly in polys], dtype=np.float64)
        _check_rows_finite(kind, "map_polylines[{}].speed_limit", speed_limits)
        polylines[:n_poly, :, 0:2] = xy
        polylines[:n_poly, :, 2] = np.cos(headings)
        polylines[:n_poly, :, 3] = np.sin(headings)
        polylines[:n_poly, :, 4] = speed_limits[:, None]
        polylines[:n_poly, :, 5] = np.array([1.0 if poly.on_route else 0.0 for poly in polys])[:, None]
        polylines[:n_poly, :, 6:8] = np.array([signal_features(poly.signal_state) for poly in polys])[:, None]
        map_mask[:n_poly] = True
        lane_ids[:n_poly] = [poly.lane_id for poly in polys]

    agent_list = _agent_states_to_list(kind, msg.agents)
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
        _check_finite(kind, "route", poses)
        k = len(poses)
        route[:k] = np.stack([poses[:, 0], poses[:, 1], np.cos(poses[:, 2]), np.sin(poses[:, 2])], axis=1)
        route_mask[:k] = True

    ego = np.array(
        [msg.ego_speed, msg.ego_acceleration, msg.ego_yaw_rate, msg.ego_steering], dtype=np.float32
    )
    for value, name in zip(ego, ("ego_speed", "ego_acceleration", "ego_yaw_rate", "ego_steering")):
        _check_scalar(kind, name, value)
    stop_distance = _check_scalar(kind, "signal_stop_distance", msg.signal_stop_distance)
    if int(msg.signal_stop_state) not in SIGNAL_STATES:
        raise _fail(kind, "signal_stop_state", f"is {msg.signal_stop_state}, expected one of {SIGNAL_STATES}")
    if stop_distance < -10.0:  # the line is behind the ego: perception would not report it
        raise _fail(kind, "signal_stop_distance", f"is {stop_distance} m, a stop line behind the ego")
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


# --------------------------------------------------------------------------------------------------
# Trajectories, candidate sets, paths
# --------------------------------------------------------------------------------------------------


@dataclass
class TrajectoryArrays:
    """A decoded Trajectory: points [T, 2] at stamp + (k+1)*dt; yaw/speed [T] or None when absent."""

    points: np.ndarray
    dt: float
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME
    yaw: np.ndarray | None = None
    speed: np.ndarray | None = None
    score: float = float("nan")


def _check_dt(kind: str, dt: float) -> float:
    dt = _check_scalar(kind, "dt", dt)
    if dt <= 0:
        raise _fail(kind, "dt", f"is {dt}, expected > 0 s")
    return dt


def _check_score(kind: str, field_name: str, score: float) -> float:
    score = float(score)
    if not (math.isnan(score) or 0.0 <= score <= 1.0):
        raise _fail(kind, field_name, f"is {score}, expected a value in [0, 1] or NaN (not scored)")
    return score


def trajectory_to_msg(
    points: np.ndarray,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    yaw: np.ndarray | None = None,
    speed: np.ndarray | None = None,
    score: float = float("nan"),
) -> Trajectory:
    kind = "Trajectory"
    pts = _as_array(kind, "points", points, (None, 2), np.float64)
    msg = Trajectory()
    msg.header = make_header(stamp_ns, frame_id)
    msg.dt = _f32(_check_dt(kind, dt))
    msg.points = [Point(x=float(x), y=float(y), z=0.0) for x, y in pts]
    if yaw is not None:
        msg.yaw = _float32_array(_as_array(kind, "yaw", yaw, (len(pts),)))
    if speed is not None:
        msg.speed = _float32_array(_as_array(kind, "speed", speed, (len(pts),)))
    msg.score = _f32(_check_score(kind, "score", score))
    return msg


def trajectory_from_msg(msg: Trajectory, kind: str = "Trajectory") -> TrajectoryArrays:
    dt = _check_dt(kind, msg.dt)
    pts = np.array([(p.x, p.y) for p in msg.points], dtype=np.float64).reshape(-1, 2)
    _check_finite(kind, "points", pts)
    optional = {}
    for name in ("yaw", "speed"):
        values = getattr(msg, name)
        if len(values) == 0:
            optional[name] = None
            continue
        if len(values) != len(pts):
            raise _fail(kind, name, f"has {len(values)} values for {len(pts)} points (expected equal or 0)")
        arr = np.asarray(values, dtype=np.float32)
        _check_finite(kind, name, arr)
        optional[name] = arr
    score = _check_score(kind, "score", msg.score)
    return TrajectoryArrays(
        pts,
        dt,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        optional["yaw"],
        optional["speed"],
        score,
    )


@dataclass
class CandidateSetArrays:
    """A planning cycle's candidates [M, T, 2], scores [M], selected index (-1: fallback), dt."""

    candidates: np.ndarray
    scores: np.ndarray
    selected: int
    dt: float
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME
    denoising_steps: int = 0


def _candidate_set_fields(candidates, scores, selected,
                          denoising_steps) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated (candidates [M, T, 2] float64, scores [M] float64, selected) of a CandidateSet."""
    kind = "CandidateSet"
    cands = _as_array(kind, "candidates", candidates, (None, None, 2), np.float64)
    num = cands.shape[0]
    score_arr = np.asarray(scores, dtype=np.float64)
    if score_arr.shape != (num,):
        raise _fail(
            kind, "scores", f"has shape {list(score_arr.shape)}, expected [{num}] (one per candidate)"
        )
    for m, score in enumerate(score_arr):
        _check_score(kind, f"candidates[{m}].score", float(score))
    selected = int(selected)
    if not -1 <= selected < num:
        raise _fail(kind, "selected_index", f"is {selected}, expected -1..{num - 1}")
    if int(denoising_steps) < 0:
        raise _fail(kind, "denoising_steps", f"is {denoising_steps}, expected >= 0")
    return cands, score_arr, selected


def candidate_set_to_msg(
    candidates: np.ndarray,
    scores: np.ndarray,
    selected: int,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    denoising_steps: int = 0,
) -> CandidateSet:
    cands, score_arr, selected = _candidate_set_fields(candidates, scores, selected, denoising_steps)
    msg = CandidateSet()
    msg.header = make_header(stamp_ns, frame_id)
    msg.candidates = [
        trajectory_to_msg(cands[m], dt, stamp_ns, frame_id, score=float(score_arr[m]))
        for m in range(cands.shape[0])
    ]
    msg.selected_index = selected
    msg.denoising_steps = int(denoising_steps)
    return msg


class _CdrWriter:
    """Little-endian plain CDR (the encapsulation ROS 2's rmw uses), alignment relative to the data
    after the 4-byte encapsulation header, as Fast CDR writes it."""

    def __init__(self) -> None:
        self.buf = bytearray(b"\x00\x01\x00\x00")

    def _align(self, size: int) -> None:
        self.buf += b"\x00" * (-(len(self.buf) - 4) % size)

    def pack(self, fmt: str, *values) -> None:
        """Primitives of one size (``fmt`` a struct code repeated, e.g. "II"), aligned to it."""
        self._align(struct.calcsize("<" + fmt[0]))
        self.buf += struct.pack("<" + fmt, *values)

    def string(self, text: str) -> None:
        data = text.encode("utf-8") + b"\x00"
        self.pack("I", len(data))
        self.buf += data

    def header(self, stamp_ns: int, frame_id: str) -> None:
        stamp = ns_to_time(stamp_ns)
        self.pack("iI", stamp.sec, stamp.nanosec)
        self.string(frame_id)

    def array(self, values: np.ndarray, dtype: str) -> None:
        """The elements of a primitive array (the sequence length written by the caller)."""
        data = np.ascontiguousarray(values, dtype=dtype)
        if data.size:
            self._align(data.itemsize)
            self.buf += data.tobytes()


def _trajectory_record_prefix(start: int, stamp_ns: int, frame_id: str, dt32: float, length: int) -> bytes:
    """A candidate ``Trajectory``'s bytes up to its points, for a record that begins ``start`` bytes
    (mod 8) after the encapsulation header: header, dt, the points' count and the padding that aligns
    the float64 points."""
    w = _CdrWriter()
    w.buf += b"\x00" * start
    w.header(stamp_ns, frame_id)
    w.pack("f", dt32)
    w.pack("I", length)
    if length:  # an empty array is not aligned (Fast CDR aligns only what it writes)
        w._align(8)
    return bytes(w.buf[4 + start:])


def candidate_set_to_cdr(
    candidates: np.ndarray,
    scores: np.ndarray,
    selected: int,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    denoising_steps: int = 0,
) -> bytes:
    """The serialized ``CandidateSet`` that ``candidate_set_to_msg`` builds, byte for byte, written
    straight from the arrays: building M x T ``geometry_msgs/Point`` objects costs ~10 us each in
    Python (2.8 ms at M = 32). ``Publisher.publish`` takes the bytes.

    The M candidate records differ only in their points and score; the rest of a record depends on
    where it starts modulo 8 (the float64 points are 8-aligned, everything else 4-aligned), so it is
    written once per alignment and the records are joined (~0.03 ms at M = 32, ~0.2 ms field by field).
    """
    cands, score_arr, selected = _candidate_set_fields(candidates, scores, selected, denoising_steps)
    dt32 = _check_dt("CandidateSet", dt)
    num, length = cands.shape[0], cands.shape[1]
    out = _CdrWriter()
    out.header(stamp_ns, frame_id)
    out.pack("I", num)
    xyz = np.zeros((num, length, 3), dtype="<f8")
    xyz[..., :2] = cands
    points = [row.tobytes() for row in xyz]
    # after the points (8-aligned, 24 bytes each): empty yaw and speed (two zero counts), the score
    tails = [b"\x00" * 8 + struct.pack("<f", score) for score in score_arr.astype(np.float32)]
    prefixes: dict[int, bytes] = {}  # record start mod 8 -> the record's bytes before its points
    parts = [bytes(out.buf)]
    pos = len(out.buf) - 4
    for m in range(num):
        key = pos % 8
        prefix = prefixes.get(key)
        if prefix is None:
            prefix = prefixes[key] = _trajectory_record_prefix(key, stamp_ns, frame_id, dt32, length)
        parts += (prefix, points[m], tails[m])
        pos += len(prefix) + len(points[m]) + len(tails[m])
    parts.append(struct.pack("<iI", selected, int(denoising_steps)))  # every field is 4-aligned here
    return b"".join(parts)


# ----------------------------------------------------------------------------------------------------
# candidate markers (planning/markers, for RViz / Foxglove)

#: height of the candidate lines above the ground (m), so that they draw over a ground plane
MARKER_Z = 0.1
_SELECTED_RGBA = (0.1, 0.4, 1.0, 1.0)
_UNSCORED_RGBA = (0.6, 0.6, 0.6, 0.6)


def _candidate_marker_styles(scores: np.ndarray, selected: int) -> list[tuple[str, float, tuple]]:
    """(namespace, line width in m, RGBA) of each candidate's line: scored red (0) to green (1), grey
    when unscored (NaN), the selected one blue and wider."""
    out = []
    for m, score in enumerate(np.asarray(scores, dtype=np.float64)):
        if m == selected:
            out.append(("selected", 0.4, _SELECTED_RGBA))
        elif not math.isfinite(score):
            out.append(("candidates", 0.1, _UNSCORED_RGBA))
        else:
            v = float(np.clip(score, 0.0, 1.0))
            out.append(("candidates", 0.1, (1.0 - v, v, 0.1, 0.8)))
    return out


def _marker_fields(candidates, scores, selected) -> tuple[np.ndarray, list[tuple[str, float, tuple]]]:
    kind = "MarkerArray"
    cands = _as_array(kind, "candidates", candidates, (None, None, 2), np.float64)
    score_arr = np.asarray(scores, dtype=np.float64)
    if score_arr.shape != (cands.shape[0],):
        raise _fail(kind, "scores", f"has shape {list(score_arr.shape)}, expected [{cands.shape[0]}]")
    return cands, _candidate_marker_styles(score_arr, int(selected))


def candidate_markers_to_msg(candidates: np.ndarray, scores: np.ndarray, selected: int, stamp_ns: int,
                             frame_id: str = EGO_FRAME) -> MarkerArray:
    """A DELETEALL marker, then one LINE_STRIP per candidate from the ego (the origin) through its points."""
    cands, styles = _marker_fields(candidates, scores, selected)
    out = MarkerArray()
    clear = Marker(action=Marker.DELETEALL)
    clear.header = make_header(stamp_ns, frame_id)
    out.markers.append(clear)
    for m, (traj, (ns, width, rgba)) in enumerate(zip(cands, styles)):
        mk = Marker()
        mk.header = make_header(stamp_ns, frame_id)
        mk.ns, mk.id = ns, m
        mk.type, mk.action = Marker.LINE_STRIP, Marker.ADD
        mk.pose.orientation.w = 1.0
        mk.scale.x = width
        mk.color = ColorRGBA(r=rgba[0], g=rgba[1], b=rgba[2], a=rgba[3])
        mk.points = [Point(x=0.0, y=0.0, z=MARKER_Z)] + [Point(x=float(x), y=float(y), z=MARKER_Z)
                                                         for x, y in traj]
        out.markers.append(mk)
    return out


def _marker_cdr(out: _CdrWriter, stamp_ns: int, frame_id: str, ns: str, marker_id: int, marker_type: int,
                action: int, width: float, rgba: tuple, points: np.ndarray) -> None:
    """One visualization_msgs/Marker (the fields of ROS 2 Kilted's definition, in order) with the pose at
    the identity and every field the candidate lines leave unset at its default."""
    out.header(stamp_ns, frame_id)
    out.string(ns)
    out.pack("iii", marker_id, marker_type, action)
    out.pack("dddddddddd", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, width, 0.0, 0.0)  # pose, scale
    out.pack("ffff", *rgba)
    out.pack("iI", 0, 0)  # lifetime
    out.pack("?", False)  # frame_locked
    out.pack("I", len(points))
    out.array(points, "<f8")
    out.buf += _MARKER_TAIL  # 4-aligned here (after the float64 points or their count)


def _marker_tail() -> bytes:
    """The fields after a Marker's points, all at their defaults: the same bytes for every marker
    (every one of them 4-aligned, and they start 4-aligned)."""
    out = _CdrWriter()
    out.pack("I", 0)  # colors
    out.string("")  # texture_resource
    out.header(0, "")  # texture: sensor_msgs/CompressedImage
    out.string("")
    out.pack("I", 0)
    out.pack("I", 0)  # uv_coordinates
    out.string("")  # text
    out.string("")  # mesh_resource
    out.string("")  # mesh_file: visualization_msgs/MeshFile
    out.pack("I", 0)
    out.pack("?", False)  # mesh_use_embedded_materials
    return bytes(out.buf[4:])


_MARKER_TAIL = _marker_tail()


def candidate_markers_to_cdr(candidates: np.ndarray, scores: np.ndarray, selected: int, stamp_ns: int,
                             frame_id: str = EGO_FRAME) -> bytes:
    """The serialized MarkerArray that :func:`candidate_markers_to_msg` builds, written from the arrays
    (about 5x faster at M = 32 than building and serializing the message objects). The layout is that
    of ROS 2 Kilted's Marker; :func:`markers_cdr_matches_this_distro` checks it against the installed
    definition, and the planner node builds messages where it does not match."""
    cands, styles = _marker_fields(candidates, scores, selected)
    out = _CdrWriter()
    out.pack("I", len(cands) + 1)
    _marker_cdr(out, stamp_ns, frame_id, "", 0, Marker.ARROW, Marker.DELETEALL, 0.0, (0.0, 0.0, 0.0, 0.0),
                np.zeros((0, 3)))
    xyz = np.full((cands.shape[1] + 1, 3), MARKER_Z, dtype="<f8")
    xyz[0, :2] = 0.0
    for m, (traj, (ns, width, rgba)) in enumerate(zip(cands, styles)):
        xyz[1:, :2] = traj
        _marker_cdr(out, stamp_ns, frame_id, ns, m, Marker.LINE_STRIP, Marker.ADD, width, rgba, xyz)
    return bytes(out.buf)


def markers_cdr_matches_this_distro() -> bool:
    """Whether :func:`candidate_markers_to_cdr` decodes, with this ROS 2 install's Marker definition, to
    the message :func:`candidate_markers_to_msg` builds (a distro whose Marker has other fields does not)."""
    from rclpy.serialization import deserialize_message, serialize_message

    rng = np.random.default_rng(0)
    cands = rng.normal(size=(3, 4, 2))
    scores = np.array([0.25, np.nan, 0.75])
    try:
        got = deserialize_message(candidate_markers_to_cdr(cands, scores, 2, 123, "frame"), MarkerArray)
    except Exception:  # noqa: BLE001 -- a layout the installed definition cannot read
        return False
    # what a subscriber of the message objects receives (colours rounded to float32 on the way)
    sent = deserialize_message(serialize_message(candidate_markers_to_msg(cands, scores, 2, 123, "frame")),
                               MarkerArray)
    return got == sent


def candidate_set_from_msg(msg: CandidateSet) -> CandidateSetArrays:
    kind = "CandidateSet"
    num = len(msg.candidates)
    if not -1 <= msg.selected_index < num:
        raise _fail(
            kind, "selected_index", f"is {msg.selected_index}, expected -1..{num - 1} for {num} candidates"
        )
    trajectories = [
        trajectory_from_msg(t, kind=f"{kind}.candidates[{m}]") for m, t in enumerate(msg.candidates)
    ]
    lengths = {len(t.points) for t in trajectories}
    if len(lengths) > 1:
        raise _fail(kind, "candidates", f"have different point counts {sorted(lengths)}, expected one T")
    dts = {t.dt for t in trajectories}
    if len(dts) > 1:
        raise _fail(kind, "candidates.dt", f"differ {sorted(dts)}, expected one dt")
    length = lengths.pop() if lengths else 0
    cands = np.stack([t.points for t in trajectories]) if num else np.zeros((0, length, 2))
    scores = np.array([t.score for t in trajectories], dtype=np.float64)
    dt = dts.pop() if dts else float("nan")
    return CandidateSetArrays(
        cands,
        scores,
        int(msg.selected_index),
        dt,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        int(msg.denoising_steps),
    )


def _quaternion_to_yaw(kind: str, field_name: str, q: Any) -> float:
    values = np.array([q.x, q.y, q.z, q.w], dtype=np.float64)
    _check_finite(kind, field_name, values)
    norm = float(np.linalg.norm(values))
    if abs(norm - 1.0) > 1e-3:
        raise _fail(kind, field_name, f"has norm {norm:.6f}, expected a unit quaternion")
    return quaternion_to_yaw(*(float(v) for v in values / norm))


def _path_poses(points, dt, stamp_ns, start_xy, start_yaw) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(points [T, 2], pose stamps in ns, yaws) of the nav_msgs/Path of a trajectory, validated."""
    kind = "Path"
    pts = _as_array(kind, "poses", points, (None, 2), np.float64)
    dt = _check_dt(kind, dt)
    ns_to_time(stamp_ns)  # a negative stamp is refused before anything is built
    stamps = [int(stamp_ns) + round((k + 1) * dt * _NS_PER_S) for k in range(len(pts))]
    return pts, stamps, headings_from_points(pts, start_xy=start_xy, start_yaw=start_yaw)


def trajectory_to_path(
    points: np.ndarray,
    dt: float,
    stamp_ns: int = 0,
    frame_id: str = EGO_FRAME,
    start_xy: Sequence[float] | None = (0.0, 0.0),
    start_yaw: float = 0.0,
) -> Path:
    """nav_msgs/Path of a trajectory (for RViz and standard consumers): pose k stamped
    stamp + (k+1)*dt, orientation from finite differences (see headings_from_points)."""
    pts, stamps, yaws = _path_poses(points, dt, stamp_ns, start_xy, start_yaw)
    msg = Path()
    msg.header = make_header(stamp_ns, frame_id)
    for (x, y), stamp, yaw in zip(pts, stamps, yaws):
        pose = PoseStamped()
        pose.header = make_header(stamp, frame_id)
        pose.pose.position.x = float(x)
        pose.pose.position.y = float(y)
        qx, qy, qz, qw = yaw_to_quaternion(float(yaw))
        pose.pose.orientation.x, pose.pose.orientation.y = qx, qy
        pose.pose.orientation.z, pose.pose.orientation.w = qz, qw
        msg.poses.append(pose)
    return msg


def trajectory_to_path_cdr(points: np.ndarray, dt: float, stamp_ns: int = 0,
                           frame_id: str = EGO_FRAME) -> bytes:
    """The serialized ``nav_msgs/Path`` that ``trajectory_to_path`` builds for a plan from the ego (the
    origin, heading 0), written from the arrays (T PoseStamped objects cost ~0.1 ms to build at T = 8;
    the bytes ~0.03 ms)."""
    pts, stamps, yaws = _path_poses(points, dt, stamp_ns, (0.0, 0.0), 0.0)
    out = _CdrWriter()
    out.header(stamp_ns, frame_id)
    out.pack("I", len(pts))
    for (x, y), stamp, yaw in zip(pts, stamps, yaws):
        out.header(stamp, frame_id)
        out.pack("ddddddd", float(x), float(y), 0.0, *yaw_to_quaternion(float(yaw)))
    return bytes(out.buf)


def path_to_trajectory(msg: Path) -> TrajectoryArrays:
    """Points and yaw of a Path; dt from the pose stamps (which must be evenly spaced after the header
    stamp, as trajectory_to_path writes them)."""
    kind = "Path"
    num = len(msg.poses)
    pts = np.array([(p.pose.position.x, p.pose.position.y) for p in msg.poses], dtype=np.float64).reshape(
        -1, 2
    )
    _check_finite(kind, "poses", pts)
    yaw = np.array(
        [
            _quaternion_to_yaw(kind, f"poses[{k}].pose.orientation", p.pose.orientation)
            for k, p in enumerate(msg.poses)
        ],
        dtype=np.float32,
    )
    stamp_ns = time_to_ns(msg.header.stamp)
    dt = float("nan")
    if num:
        stamps = np.array([time_to_ns(p.header.stamp) for p in msg.poses], dtype=np.int64)
        offsets = stamps - stamp_ns
        dt_ns = offsets[0]
        expected = np.round(np.arange(1, num + 1) * (dt_ns / _NS_PER_S) * _NS_PER_S)
        if dt_ns <= 0 or np.max(np.abs(offsets - expected)) > 1000:
            raise _fail(
                kind,
                "poses[].header.stamp",
                f"offsets {offsets[:4].tolist()}... ns from header.stamp are not (k+1)*dt with dt > 0",
            )
        dt = dt_ns / _NS_PER_S
    return TrajectoryArrays(pts, dt, stamp_ns, str(msg.header.frame_id), yaw, None)


# --------------------------------------------------------------------------------------------------
# Control command
# --------------------------------------------------------------------------------------------------


@dataclass
class ControlCommandValues:
    acceleration: float  # m/s^2
    steering_angle: float  # rad
    steering_rate: float  # rad/s
    target_speed: float  # m/s
    emergency_stop: bool = False
    reason: str = ""
    stamp_ns: int = 0
    frame_id: str = EGO_FRAME


_COMMAND_FIELDS = ("acceleration", "steering_angle", "steering_rate", "target_speed")


def control_command_to_msg(cmd: ControlCommandValues) -> ControlCommand:
    msg = ControlCommand()
    msg.header = make_header(cmd.stamp_ns, cmd.frame_id)
    for name in _COMMAND_FIELDS:
        setattr(msg, name, _f32(_check_scalar("ControlCommand", name, getattr(cmd, name))))
    msg.emergency_stop = bool(cmd.emergency_stop)
    msg.reason = str(cmd.reason)
    return msg


def control_command_from_msg(msg: ControlCommand) -> ControlCommandValues:
    values = {name: _check_scalar("ControlCommand", name, getattr(msg, name)) for name in _COMMAND_FIELDS}
    return ControlCommandValues(
        **values,
        emergency_stop=bool(msg.emergency_stop),
        reason=str(msg.reason),
        stamp_ns=time_to_ns(msg.header.stamp),
        frame_id=str(msg.header.frame_id),
    )


# --------------------------------------------------------------------------------------------------
# Planning diagnostics
# --------------------------------------------------------------------------------------------------


def planning_diagnostics_to_msg(
    stage_ms: Mapping[str, float],
    *,
    node: str,
    backend: str,
    stamp_ns: int = 0,
    input_stamp_ns: int = 0,
    total_ms: float | None = None,
    end_to_end_ms: float = 0.0,
    deadline_missed: bool = False,
    cycle_count: int = 0,
    deadline_miss_count: int = 0,
    rejected_input_count: int = 0,
    fallback_active: bool = False,
    fallback_reason: str = "",
) -> PlanningDiagnostics:
    """Encode a cycle report; stage order is kept; total_ms defaults to the sum of the stages."""
    kind = "PlanningDiagnostics"
    msg = PlanningDiagnostics()
    msg.header = make_header(stamp_ns, "")
    msg.input_stamp = ns_to_time(input_stamp_ns)
    msg.node = str(node)
    msg.backend = str(backend)
    stages = []
    for name, ms in stage_ms.items():
        ms = _check_scalar(kind, f"stages[{name!r}].milliseconds", ms)
        if ms < 0:
            raise _fail(kind, f"stages[{name!r}].milliseconds", f"is {ms}, expected >= 0")
        stages.append(StageLatency(name=str(name), milliseconds=_f32(ms)))
    msg.stages = stages
    msg.total_ms = _f32(
        _check_scalar(kind, "total_ms", sum(s.milliseconds for s in stages) if total_ms is None else total_ms)
    )
    msg.end_to_end_ms = _f32(_check_scalar(kind, "end_to_end_ms", end_to_end_ms))
    msg.deadline_missed = bool(deadline_missed)
    for name, value in (
        ("cycle_count", cycle_count),
        ("deadline_miss_count", deadline_miss_count),
        ("rejected_input_count", rejected_input_count),
    ):
        if int(value) < 0:
            raise _fail(kind, name, f"is {value}, expected >= 0")
        setattr(msg, name, int(value))
    msg.fallback_active = bool(fallback_active)
    msg.fallback_reason = str(fallback_reason)
    return msg


def planning_diagnostics_from_msg(msg: PlanningDiagnostics) -> dict[str, Any]:
    """-> dict with `stages` (name -> ms, in order) and every other field under its message name."""
    kind = "PlanningDiagnostics"
    seen: set[str] = set()
    for k, stage in enumerate(msg.stages):
        if stage.name in seen:
            raise _fail(kind, f"stages[{k}].name", f"repeats stage {stage.name!r}")
        seen.add(stage.name)
        _check_scalar(kind, f"stages[{k}].milliseconds", stage.milliseconds)
    _check_scalar(kind, "total_ms", msg.total_ms)
    _check_scalar(kind, "end_to_end_ms", msg.end_to_end_ms)
    return planning_diagnostics_record(msg)


# --------------------------------------------------------------------------------------------------
# Odometry
# --------------------------------------------------------------------------------------------------


@dataclass
class EgoMotion:
    """Ego pose (box centre, world frame) and motion: speed along the heading, yaw rate."""

    x: float
    y: float
    yaw: float
    speed: float
    yaw_rate: float
    stamp_ns: int = 0
    frame_id: str = WORLD_FRAME
    child_frame_id: str = EGO_FRAME


def odometry_to_msg(motion: EgoMotion) -> Odometry:
    kind = "Odometry"
    msg = Odometry()
    msg.header = make_header(motion.stamp_ns, motion.frame_id)
    msg.child_frame_id = str(motion.child_frame_id)
    msg.pose.pose.position.x = _check_scalar(kind, "pose.pose.position.x", motion.x)
    msg.pose.pose.position.y = _check_scalar(kind, "pose.pose.position.y", motion.y)
    qx, qy, qz, qw = yaw_to_quaternion(_check_scalar(kind, "pose.pose.orientation(yaw)", motion.yaw))
    msg.pose.pose.orientation.x, msg.pose.pose.orientation.y = qx, qy
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = qz, qw
    # Twist is expressed in child_frame_id (REP-105): forward speed is linear.x.
    msg.twist.twist.linear.x = _check_scalar(kind, "twist.twist.linear.x", motion.speed)
    msg.twist.twist.angular.z = _check_scalar(kind, "twist.twist.angular.z", motion.yaw_rate)
    return msg


def odometry_from_msg(msg: Odometry) -> EgoMotion:
    kind = "Odometry"
    pos = msg.pose.pose.position
    x = _check_scalar(kind, "pose.pose.position.x", pos.x)
    y = _check_scalar(kind, "pose.pose.position.y", pos.y)
    yaw = _quaternion_to_yaw(kind, "pose.pose.orientation", msg.pose.pose.orientation)
    speed = _check_scalar(kind, "twist.twist.linear.x", msg.twist.twist.linear.x)
    yaw_rate = _check_scalar(kind, "twist.twist.angular.z", msg.twist.twist.angular.z)
    return EgoMotion(
        x,
        y,
        yaw,
        speed,
        yaw_rate,
        time_to_ns(msg.header.stamp),
        str(msg.header.frame_id),
        str(msg.child_frame_id),
    )
