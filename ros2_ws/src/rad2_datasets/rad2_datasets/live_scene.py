"""Live scene assembly for the perception-features node (no ROS): object lists + odometry + a map and
route loaded from a clip/dataset file or a Lanelet2 map with a mission route ->
:class:`~rad2_core.bev.SceneSnapshot` -> Observation.

The node feeds ``add_odometry`` and ``add_objects`` with arrays (converted from messages by
``rad2_ros.conversions``) and calls ``observation(stamp)``; everything here is testable and
reusable offline (rad2 eval replay, tests).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.bev import AgentFrame, SceneSnapshot, get_config, prepare_map
from rad2_core.clip import Clip
from rad2_core.config import require
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap
from rad2_core.observation import Observation, build_observation
from rad2_core.storage import load_clip, read_index


class LiveSceneError(ValueError):
    """The scene cannot be assembled (no odometry, stale odometry, bad map file)."""


@dataclass
class MapAndRoute:
    lane_map: LaneMap
    route_polyline: np.ndarray
    route_lane_ids: np.ndarray
    source: str


def load_map_and_route(path: str | Path, clip_id: str = "first", route: str = "", *,
                       params: dict[str, Any]) -> MapAndRoute:
    """The lane map and route of a clip file (.npz), of one clip of a dataset directory, or of a
    Lanelet2 map (.osm) with a mission ``route``.

    Autoware-style map loading: the map (and the route a mission planner would give) are loaded once
    at start-up from a file named by a parameter; ``clip_id`` "first" takes the dataset's first clip.
    For a Lanelet2 map ``route`` is either lanelet ids in driving order ("1001 1012": consecutive
    ones are joined by the routing graph's shortest path, lane changes included) or the start and
    goal positions in map metres ("x,y x,y"); see :func:`parse_route`. ``params``: params/bev.yaml as
    loaded (a Lanelet2 map's default speed limit).
    """
    path = Path(path)
    if path.suffix.lower() == ".osm" and path.is_file():
        return _from_lanelet2(path, route, params)
    if path.is_dir():
        index = read_index(path)
        entries = index["clips"]
        if not entries:
            raise LiveSceneError(f"{path}: dataset has no clips")
        if clip_id in ("", "first"):
            entry = entries[0]
        else:
            matches = [e for e in entries if e.get("clip_id") == clip_id]
            if not matches:
                have = [e["clip_id"] for e in entries[:5]]
                raise LiveSceneError(f"{path}: no clip {clip_id!r} (have e.g. {have})")
            entry = matches[0]
        clip = load_clip(path / entry["file"], maps_dir=path / "maps")
    elif path.is_file():
        clip = load_clip(path)
    else:
        raise LiveSceneError(f"map file {path} does not exist")
    return _from_clip(clip, str(path))


def parse_route(route: str, where: str = "route") -> tuple[list[int] | None, list[np.ndarray] | None]:
    """A mission route string -> (lanelet ids, None) or (None, [start xy, goal xy]).

    Whitespace-separated tokens: all integers ("1001 1002 1012") are lanelet ids; all "x,y" pairs
    (exactly two: "5.0,-1.75 90.0,1.75") are start and goal positions in map metres.
    """
    tokens = str(route).split()
    if not tokens:
        raise LiveSceneError(f"{where}: empty; a Lanelet2 map needs a mission route: lanelet ids in driving "
                             "order ('1001 1012') or start and goal positions in map metres ('x,y x,y')")
    if all("," not in t for t in tokens):
        try:
            return [int(t) for t in tokens], None
        except ValueError:
            raise LiveSceneError(f"{where}: {route!r} is neither lanelet ids (integers) nor 'x,y x,y' "
                                 "start and goal positions") from None
    points = []
    for t in tokens:
        try:
            xy = np.array([float(v) for v in t.split(",")], np.float64)
        except ValueError:
            xy = np.zeros(0)
        if xy.shape != (2,) or not np.all(np.isfinite(xy)):
            raise LiveSceneError(f"{where}: position {t!r} in {route!r} is not a finite 'x,y' pair")
        points.append(xy)
    if len(points) != 2:
        raise LiveSceneError(f"{where}: {route!r} has {len(points)} position(s); give exactly a start and "
                             "a goal")
    return None, points


def _from_lanelet2(path: Path, route: str, params: dict[str, Any]) -> MapAndRoute:
    ids, points = parse_route(route, f"{path}: route (perception.route)")
    # lanelet2 is only needed for .osm maps: imported here so clip maps work without it
    from rad2_datasets.adapters.lanelet2_map import Lanelet2MapError, load_lanelet2, mission_route

    try:
        l2 = load_lanelet2(path, params=params)
        if ids is not None:
            lane_ids, polyline = mission_route(l2, lanelet_ids=ids)
        else:
            lane_ids, polyline = mission_route(l2, start_xy=points[0], goal_xy=points[1])
    except Lanelet2MapError as exc:
        raise LiveSceneError(str(exc)) from exc
    return MapAndRoute(l2.lane_map, polyline, lane_ids, f"{path}#route {' '.join(str(route).split())}")


def _from_clip(clip: Clip, source: str) -> MapAndRoute:
    return MapAndRoute(clip.map, np.asarray(clip.route_polyline, np.float64),
                       np.asarray(clip.route_lane_ids, np.int64), f"{source}#{clip.clip_id}")


@dataclass
class _Odom:
    stamp: float
    pose: np.ndarray  # x, y, yaw
    speed: float
    yaw_rate: float


class LiveScene:
    """Short histories of object lists and odometry; builds the observation at an objects stamp."""

    def __init__(self, scene: MapAndRoute, params: dict[str, Any], step_s: float, history_s: float,
                 odom_max_age_s: float, history_tolerance_s: float):
        self.scene = scene
        self.params = params
        self.cfg = get_config(params)
        self.wheelbase = float(require(params, "vehicle.wheelbase"))
        self.ego_length = float(require(params, "vehicle.length"))
        self.ego_width = float(require(params, "vehicle.width"))
        self.step_s = step_s
        self.history_s = history_s
        self.odom_max_age_s = odom_max_age_s
        self.tolerance_s = history_tolerance_s
        offsets = set(self.cfg.history_offsets)
        for name in self.cfg.channels:
            if name.startswith("agents_t-"):
                offsets.add(int(name.split("-")[1]))
        self.offsets = sorted(offsets)
        self._objects: deque[tuple[float, AgentFrame]] = deque()
        self._odom: deque[_Odom] = deque()
        self._signals: tuple[float, np.ndarray] | None = None  # (stamp, [S] states by map signal)
        self._signal_rows = {int(v): k for k, v in enumerate(scene.lane_map.signal_ids)}
        prepare_map(scene.lane_map)  # cache the prepared raster geometry once, at start-up

    # -- inputs --------------------------------------------------------------------------------
    def add_odometry(self, stamp: float, x: float, y: float, yaw: float, speed: float,
                     yaw_rate: float) -> None:
        vals = np.array([stamp, x, y, yaw, speed, yaw_rate], dtype=np.float64)
        if not np.all(np.isfinite(vals)):
            raise LiveSceneError(f"odometry at {stamp}: non-finite values {vals.tolist()}")
        if self._odom and stamp < self._odom[-1].stamp:
            self._odom.clear()  # time jumped back (bag loop / new clip): restart the history
        if self._odom and stamp == self._odom[-1].stamp:
            self._odom.pop()  # a re-sent sample replaces its first copy (no zero-dt pair in the history)
        self._odom.append(_Odom(stamp, np.array([x, y, wrap_angle(yaw)]), speed, yaw_rate))
        self._trim(self._odom, stamp, key=lambda o: o.stamp)

    def add_objects(self, stamp: float, frame: AgentFrame) -> None:
        frame.validate("objects")
        if self._objects and stamp < self._objects[-1][0]:
            self._objects.clear()
        if self._objects and stamp == self._objects[-1][0]:
            self._objects.pop()  # a re-sent object list replaces its first copy
        self._objects.append((stamp, frame))
        self._trim(self._objects, stamp, key=lambda o: o[0])

    def add_signals(self, stamp: float, states: dict[int, int]) -> list[int]:
        """The signal states reported with an object list (signal id -> clip.SIGNAL_*). Signals the map
        does not have are returned (the caller reports them) and otherwise ignored; map signals not
        listed are unknown."""
        row = np.zeros(len(self._signal_rows), np.int8)
        unknown_ids = []
        for sid, state in states.items():
            k = self._signal_rows.get(int(sid))
            if k is None:
                unknown_ids.append(int(sid))
            else:
                row[k] = int(state)
        self._signals = (float(stamp), row)
        return unknown_ids

    def signals_at(self, stamp: float) -> np.ndarray | None:
        """The last reported states if they are at most ``history_s`` older than ``stamp`` (a light not
        heard from for longer is unknown, not red or green), else None."""
        if self._signals is None or stamp - self._signals[0] > self.history_s:
            return None
        return self._signals[1]

    def _trim(self, q: deque, now: float, key) -> None:
        while q and key(q[0]) < now - self.history_s:
            q.popleft()

    # -- state -----------------------------------------------------------------------------------
    def ego_at(self, stamp: float) -> tuple[np.ndarray, np.ndarray]:
        """Ego pose (interpolated between odometry samples) and (speed, accel, yaw rate, steering)."""
        if not self._odom:
            raise LiveSceneError("no odometry received yet")
        stamps = np.array([o.stamp for o in self._odom])
        nearest = float(np.min(np.abs(stamps - stamp)))
        if nearest > self.odom_max_age_s:
            raise LiveSceneError(f"odometry is stale: nearest sample {nearest * 1e3:.0f} ms from the objects "
                                 f"stamp (> {self.odom_max_age_s * 1e3:.0f} ms)")
        i = int(np.searchsorted(stamps, stamp))
        if 0 < i < len(stamps):
            a, b = self._odom[i - 1], self._odom[i]
            w = (stamp - a.stamp) / max(b.stamp - a.stamp, 1e-9)
            dyaw = wrap_angle(b.pose[2] - a.pose[2])
            pose = np.array([a.pose[0] + w * (b.pose[0] - a.pose[0]), a.pose[1] + w * (b.pose[1] - a.pose[1]),
                             wrap_angle(a.pose[2] + w * dyaw)])
            speed = a.speed + w * (b.speed - a.speed)
            yaw_rate = a.yaw_rate + w * (b.yaw_rate - a.yaw_rate)
        else:
            o = self._odom[min(i, len(stamps) - 1)]
            pose, speed, yaw_rate = o.pose.copy(), o.speed, o.yaw_rate
        # longitudinal acceleration: speed difference over about one step of history
        older = [o for o in self._odom if o.stamp <= stamp - 0.5 * self.step_s]
        accel = 0.0
        if older:
            o = older[-1]
            accel = (speed - o.speed) / max(stamp - o.stamp, 1e-3)
        steer = math.atan(self.wheelbase * yaw_rate / speed) if speed > 0.5 else 0.0
        return pose, np.array([speed, accel, yaw_rate, steer], dtype=np.float64)

    def _frame_before(self, stamp: float) -> AgentFrame:
        """The object list closest to ``stamp`` (within tolerance), else the oldest one kept."""
        best = min(self._objects, key=lambda o: abs(o[0] - stamp))
        if abs(best[0] - stamp) <= self.tolerance_s:
            return best[1]
        return self._objects[0][1]

    def snapshot(self, stamp: float) -> SceneSnapshot:
        if not self._objects:
            raise LiveSceneError("no object list received yet")
        frames = [o for o in self._objects if abs(o[0] - stamp) <= 1e-6]
        current = frames[-1][1] if frames else self._frame_before(stamp)
        pose, ego_state = self.ego_at(stamp)
        history = {k: self._frame_before(stamp - k * self.step_s) for k in self.offsets}
        return SceneSnapshot(
            map=self.scene.lane_map, ego_pose=pose, route_polyline=self.scene.route_polyline,
            agents=current, history=history, ego_state=ego_state, route_lane_ids=self.scene.route_lane_ids,
            ego_length=self.ego_length, ego_width=self.ego_width, timestamp=stamp,
            signal_states=self.signals_at(stamp),
        ).validate()

    def observation(self, stamp: float) -> Observation:
        return build_observation(self.snapshot(stamp), params=self.params)
