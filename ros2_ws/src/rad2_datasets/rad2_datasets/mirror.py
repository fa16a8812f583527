"""Left-right mirror images of clips (y -> -y in the world frame). No ROS.

Recorded right-hand traffic mirrored is left-hand traffic with the same physics: every track, lane,
boundary and polygon is reflected across the x axis, headings and lateral velocities change sign, a
lane's left boundary becomes its right one, its left neighbour its right one (and the lane-change
permissions with them), and polygons keep their winding (their vertex order is reversed). What a
policy does on a mirrored dataset against what it does on the original measures how much it relies on
the side of the road it was trained on: the same drivers, the same gaps, the other side.

A mirrored clip is named ``<clip_id>_mirrored`` and says so in its metadata (``mirrored: true``);
mirroring twice gives the original arrays back. Mirrored maps are new maps (their own content hash).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from rad2_core.clip import Clip
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap

MIRROR_SUFFIX = "_mirrored"


def _points(p: np.ndarray) -> np.ndarray:
    return np.asarray(p, np.float64) * np.array([1.0, -1.0])


def _polygon(p: np.ndarray) -> np.ndarray:
    # a reflection reverses the winding; reversing the vertices restores it
    return _points(p)[::-1].copy()


def _yaw(yaw: np.ndarray) -> np.ndarray:
    # -pi is outside (-pi, pi]: wrapped back to pi
    return wrap_angle(-np.asarray(yaw, np.float64))


def mirror_map(m: LaneMap) -> LaneMap:
    """The map reflected across the x axis (see the module doc); a new map id."""
    return LaneMap.build(
        lane_ids=m.lane_ids,
        centerlines=[_points(p) for p in m.centerlines],
        left_boundaries=[_points(p) for p in m.right_boundaries],
        right_boundaries=[_points(p) for p in m.left_boundaries],
        speed_limits=m.speed_limits,
        successors=m.successors,
        drivable_areas=[_polygon(p) for p in m.drivable_areas],
        crosswalks=[_polygon(p) for p in m.crosswalks],
        left_neighbors=m.right_neighbors,
        right_neighbors=m.left_neighbors,
        lane_change_left=m.lane_change_right,
        lane_change_right=m.lane_change_left,
        signal_ids=m.signal_ids,
        signal_lanes=m.signal_lanes,
        signal_stop_lines=[_points(p) for p in m.signal_stop_lines],
    )


def mirror_clip(clip: Clip, mirrored_map: LaneMap | None = None) -> Clip:
    """``clip`` reflected across the x axis; ``mirrored_map``: :func:`mirror_map` of its map when the
    caller already has it (clips of one road network share it), else it is built here. Invalid agent
    entries stay zeros."""
    valid = np.asarray(clip.agent_valid, bool)
    name = (clip.clip_id[: -len(MIRROR_SUFFIX)] if clip.clip_id.endswith(MIRROR_SUFFIX)
            else clip.clip_id + MIRROR_SUFFIX)
    metadata = dict(clip.metadata)
    if metadata.pop("mirrored", False) is not True:
        metadata["mirrored"] = True
    return replace(
        clip,
        clip_id=name,
        ego_y=-np.asarray(clip.ego_y, np.float64),
        ego_yaw=_yaw(clip.ego_yaw),
        agent_y=np.where(valid, -clip.agent_y, 0.0),
        agent_yaw=np.where(valid, _yaw(clip.agent_yaw), 0.0),
        agent_vy=np.where(valid, -clip.agent_vy, 0.0),
        map=mirrored_map if mirrored_map is not None else mirror_map(clip.map),
        route_polyline=_points(clip.route_polyline),
        metadata=metadata,
    )


def mirror_dataset(source: str | Path, out: str | Path,
                   progress: Callable[[int], None] | None = None) -> int:
    """Write the mirror image of every clip of the dataset ``source`` to the new dataset ``out`` (each
    map mirrored once); returns the number of clips. ``progress(1)`` after each clip."""
    from rad2_core.storage import iter_dataset, read_index, save_dataset

    maps: dict[str, LaneMap] = {}

    def mirrored():
        for clip in iter_dataset(source):
            if clip.map.map_id not in maps:
                maps[clip.map.map_id] = mirror_map(clip.map)
            yield mirror_clip(clip, maps[clip.map.map_id])
            if progress is not None:
                progress(1)

    description = read_index(source).get("description") or Path(source).name
    index = save_dataset(mirrored(), out, description=f"{description}, mirrored left-right (y -> -y)")
    return int(index["num_clips"])


__all__ = ["MIRROR_SUFFIX", "mirror_clip", "mirror_dataset", "mirror_map"]
