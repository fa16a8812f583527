"""Bags of perception inputs made from a logged clip (rosbag2, MCAP storage; no rclpy).

Per log step (10 Hz, log timestamps ``start_time + t*dt``) the bag holds:

==========================  ================================  ===========================================
topic                       type                              content
==========================  ================================  ===========================================
``/clock``                  rosgraph_msgs/msg/Clock           the log time (for ``use_sim_time`` replay)
``localization/odometry``   nav_msgs/msg/Odometry             ego box-centre pose (map frame), speed,
                                                              yaw rate (twist in ``base_link``)
``perception/objects``      rad2_msgs/msg/PerceptionInputs    agents valid at t, world frame
``viz/scene``               visualization_msgs/msg/MarkerArray map near the ego, route, agents, ego box
``viz/ego_log``             nav_msgs/msg/Path                 the whole logged ego track (first stamp)
==========================  ================================  ===========================================

Everything is in the ``map`` frame, so Foxglove's 3D panel shows it without /tf. The map and route
are not in the messages: ``metadata.yaml`` ``custom_data`` names the clip file / dataset directory and
clip id (``rad2.map_file``, ``rad2.clip_id``), which replay passes to the perception node.
Used by rad2 data to-bag (the CLI) and rad2_evaluation.replay (which reads these bags back).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.geometry import yaw_to_quaternion
from rad2_core.storage import load_clip, read_index

from rad2_datasets import bags

#: Log time of step 0 unless --start-time is given (nonzero: ROS treats time 0 as "unset").
DEFAULT_START_TIME_S = 1_700_000_000.0
BAG_FORMAT = "rad2-perception-inputs/1"

TOPIC_CLOCK = "/clock"
TOPIC_ODOM = "/localization/odometry"
TOPIC_OBJECTS = "/perception/objects"
TOPIC_SCENE = "/viz/scene"
TOPIC_EGO_LOG = "/viz/ego_log"
WORLD_FRAME = "map"
EGO_FRAME = "base_link"

_TYPE_COLORS = {
    AGENT_VEHICLE: (0.95, 0.55, 0.15, 0.9),
    AGENT_PEDESTRIAN: (0.9, 0.2, 0.6, 0.9),
    AGENT_CYCLIST: (0.6, 0.3, 0.9, 0.9),
}
_OTHER_COLOR = (0.6, 0.6, 0.6, 0.9)


@dataclass
class ClipSource:
    """A clip and where the perception node finds its map and route again."""

    clip: Clip
    map_file: Path  # dataset directory or clip .npz
    map_clip_id: str  # clip id inside map_file


def load_clip_source(dataset: str | None, clip_id: str | None, index: int | None,
                     clip_file: str | None) -> ClipSource:
    """Resolve --dataset/--clip-id/--index or --clip into a clip; ValueError with the reason."""
    if clip_file:
        path = Path(clip_file).resolve()
        clip = load_clip(path)
        return ClipSource(clip, path, clip.clip_id)
    if not dataset:
        raise ValueError("give --dataset (with --clip-id or --index) or --clip")
    ddir = Path(dataset).resolve()
    entries = read_index(ddir)["clips"]
    if not entries:
        raise ValueError(f"dataset {ddir} holds no clips")
    if clip_id is not None:
        match = [e for e in entries if e["clip_id"] == clip_id]
        if not match:
            known = ", ".join(e["clip_id"] for e in entries[:8])
            raise ValueError(f"dataset {ddir} has no clip {clip_id!r} (first ids: {known}...)")
        entry = match[0]
    else:
        k = 0 if index is None else int(index)
        if not 0 <= k < len(entries):
            raise ValueError(f"--index {k} outside dataset {ddir} with {len(entries)} clips")
        entry = entries[k]
    clip = load_clip(ddir / entry["file"], maps_dir=ddir / "maps")
    return ClipSource(clip, ddir, clip.clip_id)


def slice_steps(clip: Clip, spec: str) -> Clip:
    """``clip`` restricted to ``START:STOP`` (either may be empty); ValueError on a bad spec."""
    try:
        a, b = spec.split(":")
        start = int(a) if a else 0
        stop = int(b) if b else clip.num_steps
    except ValueError:
        raise ValueError(f"--steps {spec!r}: expected START:STOP, e.g. 0:40") from None
    try:
        return clip.slice(start, min(stop, clip.num_steps))
    except IndexError as exc:
        raise ValueError(f"--steps {spec!r}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Message construction: rosbags objects (same field names as the rclpy messages), so that a bag can be
# written without a colcon build; ros_conversions builds rclpy messages and needs the built rad2_msgs
# --------------------------------------------------------------------------------------------------


def step_stamp_ns(start_time_ns: int, step: int, dt: float) -> int:
    return int(start_time_ns + round(step * dt * 1e9))


def yaw_quaternion(yaw: float, store: Any) -> Any:
    x, y, z, w = yaw_to_quaternion(yaw)
    return store.types["geometry_msgs/msg/Quaternion"](x=x, y=y, z=z, w=w)


def ego_yaw_rates(clip: Clip) -> np.ndarray:
    """[T] yaw rate (rad/s) by central differences of the unwrapped logged heading."""
    if clip.num_steps < 2:
        return np.zeros(clip.num_steps)
    return np.gradient(np.unwrap(clip.ego_yaw), clip.dt)


def odometry_msg(clip: Clip, t: int, stamp_ns: int, yaw_rate: float, store: Any) -> Any:
    odom = bags.new_message("nav_msgs/msg/Odometry", store, header=bags.header(stamp_ns, WORLD_FRAME, store),
                            child_frame_id=EGO_FRAME)
    odom.pose.pose.position.x = float(clip.ego_x[t])
    odom.pose.pose.position.y = float(clip.ego_y[t])
    odom.pose.pose.orientation = yaw_quaternion(float(clip.ego_yaw[t]), store)
    odom.twist.twist.linear.x = float(clip.ego_speed[t])
    odom.twist.twist.angular.z = float(yaw_rate)
    return odom


def objects_msg(clip: Clip, t: int, stamp_ns: int, store: Any) -> Any:
    agents = clip.agents_at(t)
    state = store.types["rad2_msgs/msg/AgentState"]
    pose2d = store.types["geometry_msgs/msg/Pose2D"]
    out = [
        state(id=int(agents.ids[k]), type=int(agents.types[k]),
              pose=pose2d(x=float(agents.x[k]), y=float(agents.y[k]), theta=float(agents.yaw[k])),
              length=float(agents.length[k]), width=float(agents.width[k]),
              velocity_x=float(agents.vx[k]), velocity_y=float(agents.vy[k]))
        for k in range(len(agents))
    ]
    signal = store.types["rad2_msgs/msg/TrafficSignal"]
    states = clip.signals_at(t)
    signals = [signal(signal_id=int(sid), state=int(st)) for sid, st in zip(clip.map.signal_ids, states)]
    return store.types["rad2_msgs/msg/PerceptionInputs"](header=bags.header(stamp_ns, WORLD_FRAME, store),
                                                         agents=out, signals=signals)


def _color(rgba: tuple[float, float, float, float], store: Any) -> Any:
    return store.types["std_msgs/msg/ColorRGBA"](r=rgba[0], g=rgba[1], b=rgba[2], a=rgba[3])


def _points(poly: np.ndarray, store: Any, z: float = 0.0) -> list:
    point = store.types["geometry_msgs/msg/Point"]
    return [point(x=float(x), y=float(y), z=z) for x, y in np.asarray(poly)[:, :2]]


class SceneMarkers:
    """Builds the per-step ``viz/scene`` MarkerArray (map within a radius, route, agents, ego)."""

    def __init__(self, clip: Clip, radius_m: float, lifetime_s: float, store: Any):
        self.clip = clip
        self.radius = float(radius_m)
        self.store = store
        self.lifetime_ns = int(lifetime_s * 1e9)
        m = clip.map
        self.polys: list[tuple[str, int, np.ndarray, tuple, float, bool]] = []
        for k in range(m.num_lanes):
            grey, white = (0.55, 0.55, 0.6, 0.8), (0.9, 0.9, 0.9, 0.6)
            self.polys.append(("lane_centerline", k, m.centerlines[k], grey, 0.15, False))
            self.polys.append(("lane_boundary", 2 * k, m.left_boundaries[k], white, 0.1, False))
            self.polys.append(("lane_boundary", 2 * k + 1, m.right_boundaries[k], white, 0.1, False))
        for k, poly in enumerate(m.drivable_areas):
            self.polys.append(("drivable_area", k, poly, (0.3, 0.3, 0.35, 0.5), 0.08, True))
        for k, poly in enumerate(m.crosswalks):
            self.polys.append(("crosswalk", k, poly, (0.95, 0.85, 0.2, 0.8), 0.2, True))

    def _marker(self, stamp_ns: int, ns: str, mid: int, mtype: int, **fields: Any) -> Any:
        store = self.store
        lifetime = store.types["builtin_interfaces/msg/Duration"](
            sec=self.lifetime_ns // 1_000_000_000, nanosec=self.lifetime_ns % 1_000_000_000)
        marker = bags.new_message("visualization_msgs/msg/Marker", store,
                                  header=bags.header(stamp_ns, WORLD_FRAME, store), ns=ns, id=int(mid),
                                  type=int(mtype), action=0, lifetime=lifetime)
        marker.pose.orientation.w = 1.0
        for key, value in fields.items():
            setattr(marker, key, value)
        return marker

    def _box(self, stamp_ns: int, ns: str, mid: int, x: float, y: float, yaw: float, length: float,
             width: float, rgba: tuple) -> Any:
        marker = self._marker(stamp_ns, ns, mid, 1, color=_color(rgba, self.store))  # CUBE
        marker.pose.position.x, marker.pose.position.y, marker.pose.position.z = float(x), float(y), 0.75
        marker.pose.orientation = yaw_quaternion(float(yaw), self.store)
        marker.scale.x, marker.scale.y, marker.scale.z = float(length), float(width), 1.5
        return marker

    def build(self, t: int, stamp_ns: int) -> Any:
        clip, store = self.clip, self.store
        ego = np.array([clip.ego_x[t], clip.ego_y[t]])
        markers = []
        for ns, mid, poly, rgba, width, closed in self.polys:
            if np.min(np.hypot(poly[:, 0] - ego[0], poly[:, 1] - ego[1])) > self.radius:
                continue
            pts = np.concatenate([poly, poly[:1]]) if closed else poly
            m = self._marker(stamp_ns, ns, mid, 4, color=_color(rgba, store), points=_points(pts, store))
            m.scale.x = width
            markers.append(m)
        route = self._marker(stamp_ns, "route", 0, 4, color=_color((0.2, 0.85, 0.3, 0.7), store),
                             points=_points(clip.route_polyline, store, z=0.05))
        route.scale.x = 0.5
        markers.append(route)
        agents = clip.agents_at(t)
        for k in range(len(agents)):
            rgba = _TYPE_COLORS.get(int(agents.types[k]), _OTHER_COLOR)
            markers.append(self._box(stamp_ns, "agents", int(agents.ids[k]), agents.x[k], agents.y[k],
                                     agents.yaw[k], agents.length[k], agents.width[k], rgba))
        markers.append(self._box(stamp_ns, "ego", 0, clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t],
                                 clip.ego_length, clip.ego_width, (0.2, 0.5, 1.0, 0.95)))
        return store.types["visualization_msgs/msg/MarkerArray"](markers=markers)


def ego_log_path(clip: Clip, start_time_ns: int, store: Any) -> Any:
    poses = []
    for t in range(clip.num_steps):
        stamp = step_stamp_ns(start_time_ns, t, clip.dt)
        ps = bags.new_message("geometry_msgs/msg/PoseStamped", store,
                              header=bags.header(stamp, WORLD_FRAME, store))
        ps.pose.position.x, ps.pose.position.y = float(clip.ego_x[t]), float(clip.ego_y[t])
        ps.pose.orientation = yaw_quaternion(float(clip.ego_yaw[t]), store)
        poses.append(ps)
    path_header = bags.header(start_time_ns, WORLD_FRAME, store)
    return store.types["nav_msgs/msg/Path"](header=path_header, poses=poses)


def clip_to_bag(source: ClipSource, out: str | Path, *, start_time_s: float = DEFAULT_START_TIME_S,
                viz: bool = True, viz_radius_m: float = 120.0, overwrite: bool = False,
                progress: bool = False) -> dict[str, int]:
    """Write the bag; returns message counts per topic."""
    clip = source.clip
    store = bags.typestore()
    start_ns = int(round(start_time_s * 1e9))
    yaw_rates = ego_yaw_rates(clip)
    scene = SceneMarkers(clip, viz_radius_m, lifetime_s=2.0 * clip.dt, store=store) if viz else None
    steps: Any = range(clip.num_steps)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc=f"{clip.clip_id} -> bag", unit="step")
    with bags.BagWriter(out, overwrite=overwrite, store=store) as writer:
        meta = {
            "format": BAG_FORMAT, "map_file": str(source.map_file), "clip_id": source.map_clip_id,
            "source_clip_id": clip.clip_id, "dt": repr(float(clip.dt)), "num_steps": clip.num_steps,
            "start_time_ns": start_ns, "ego_length": repr(float(clip.ego_length)),
            "ego_width": repr(float(clip.ego_width)), "scenario_kind": clip.scenario_kind,
            "world_frame": WORLD_FRAME, "ego_frame": EGO_FRAME,
        }
        sliced = clip.metadata.get("sliced_from")
        if isinstance(sliced, dict):
            meta["first_step"] = int(sliced.get("start", 0))
        else:
            meta["first_step"] = 0
        for key, value in meta.items():
            writer.set_metadata(key, value)
        if viz:
            writer.write(TOPIC_EGO_LOG, ego_log_path(clip, start_ns, store), start_ns)
        for t in steps:
            stamp = step_stamp_ns(start_ns, t, clip.dt)
            clock = store.types["rosgraph_msgs/msg/Clock"](clock=bags.ns_to_time(stamp, store))
            writer.write(TOPIC_CLOCK, clock, stamp)
            writer.write(TOPIC_ODOM, odometry_msg(clip, t, stamp, yaw_rates[t], store), stamp)
            writer.write(TOPIC_OBJECTS, objects_msg(clip, t, stamp, store), stamp)
            if scene is not None:
                writer.write(TOPIC_SCENE, scene.build(t, stamp), stamp)
        return dict(writer.counts)
