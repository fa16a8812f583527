"""Argoverse 2 motion-forecasting scenarios -> :class:`Clip`.

A scenario directory holds ``scenario_<id>.parquet`` (one row per track and timestep: track_id,
object_type, timestep, position_x/y, heading, velocity_x/y, ...) and
``log_map_archive_<id>.json`` (lane_segments with centreline/boundaries/successors/lane_type,
drivable_areas, pedestrian_crossings). The track named ``"AV"`` is the ego.

What AV2 lacks is filled from ``params/bev.yaml`` (``adapters.*``), documented there:
- box sizes: per ``object_type`` defaults (``adapters.default_box_sizes``) and the ego size
  (``adapters.ego_box_size``);
- speed limits: per ``lane_type`` defaults (``adapters.default_speed_limits``);
- the route: the lanes the ego's logged path traverses (Viterbi lane matching, gaps bridged via
  successors), extended ``adapters.route_extension_m`` along successors.
Lane adjacency comes from ``left_neighbor_id`` / ``right_neighbor_id``, kept only for neighbours in the
archive that run the same way (AV2 also lists the lane across a centre line, which is no lane to change
into); a lane change is allowed across a ``left_lane_mark_type`` / ``right_lane_mark_type`` that is dashed
(``DASHED_*``, ``DOUBLE_DASH_*``) and forbidden across solid, mixed (``DASH_SOLID_*`` / ``SOLID_DASH_*``:
which side is dashed is not stated), ``NONE`` or ``UNKNOWN`` markings.
Positions are AV2 city coordinates (metres, x east / y north); headings are radians CCW from +x.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.config import require
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap

from rad2_datasets.adapters import logged_clip

EGO_TRACK_ID = "AV"

AV2_TYPE_MAP = {
    "vehicle": AGENT_VEHICLE,
    "bus": AGENT_VEHICLE,
    "pedestrian": AGENT_PEDESTRIAN,
    "cyclist": AGENT_CYCLIST,
    "motorcyclist": AGENT_CYCLIST,
}


# lane_mark_type values of the AV2 map format; the dashed ones may be crossed to change lanes
LANE_MARK_TYPES = frozenset({
    "DASH_SOLID_YELLOW", "DASH_SOLID_WHITE", "DASHED_WHITE", "DASHED_YELLOW", "DOUBLE_SOLID_YELLOW",
    "DOUBLE_SOLID_WHITE", "DOUBLE_DASH_YELLOW", "DOUBLE_DASH_WHITE", "SOLID_YELLOW", "SOLID_WHITE",
    "SOLID_DASH_WHITE", "SOLID_DASH_YELLOW", "SOLID_BLUE", "NONE", "UNKNOWN",
})
CROSSABLE_MARK_TYPES = frozenset({"DASHED_WHITE", "DASHED_YELLOW", "DOUBLE_DASH_YELLOW", "DOUBLE_DASH_WHITE"})


class AV2FormatError(ValueError):
    """The files are not a readable AV2 scenario."""


def _xy(points: list[dict[str, float]]) -> np.ndarray:
    return np.array([[p["x"], p["y"]] for p in points], dtype=np.float64).reshape(-1, 2)


def centerline_from_boundaries(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The midline of a lane given only its two boundaries: both resampled at the same fractions of
    their arc length (as many points as the denser one, at least 2), then averaged pairwise. AV2 log
    map archives may store a lane segment by its boundaries alone; the format defines the centreline
    as this midline."""
    from rad2_core.tokens import arc_lengths, resample_polyline

    n = max(len(left), len(right), 2)
    mids = []
    for side in (left, right):
        cum = arc_lengths(side)
        mids.append(resample_polyline(side, np.linspace(0.0, cum[-1], n), cum)[:, :2])
    return 0.5 * (mids[0] + mids[1])


def _lane_polyline(where: str, segment: dict[str, Any], key: str) -> np.ndarray:
    """A lane segment's polyline ``key``, an error naming the file, lane and field when it is unusable."""
    try:
        pts = _xy(segment[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise AV2FormatError(f"{where}: lane segment {segment.get('id')!r}: field {key!r} is missing or not "
                             f"a list of {{x, y}} points ({type(exc).__name__}: {exc})") from None
    if len(pts) < 2 or not np.isfinite(pts).all():
        raise AV2FormatError(f"{where}: lane segment {segment.get('id')!r}: field {key!r} needs >= 2 finite "
                             f"points, got {len(pts)}")
    return pts


def _lane_geometry(where: str, segment: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centreline, left boundary, right boundary); the centreline computed when the archive omits it."""
    left = _lane_polyline(where, segment, "left_lane_boundary")
    right = _lane_polyline(where, segment, "right_lane_boundary")
    if segment.get("centerline") is None:
        return centerline_from_boundaries(left, right), left, right
    return _lane_polyline(where, segment, "centerline"), left, right


def _lane_ref(where: str, segment: dict[str, Any], key: str) -> int | None:
    """An optional lane id field (``left_neighbor_id`` ...) as an int or None."""
    v = segment.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise AV2FormatError(f"{where}: lane segment {segment.get('id')!r}: field {key!r} = {v!r} "
                             "is not a lane id") from None


def _lane_refs(where: str, segment: dict[str, Any], key: str) -> list[int]:
    """A list-of-lane-ids field (``successors`` ...)."""
    v = segment.get(key) or []
    try:
        return [int(x) for x in v]
    except (TypeError, ValueError):
        raise AV2FormatError(f"{where}: lane segment {segment.get('id')!r}: field {key!r} = {v!r} "
                             "is not a list of lane ids") from None


def _records(where: str, archive: dict[str, Any], key: str) -> list[dict[str, Any]]:
    table = archive[key]
    if not isinstance(table, dict) or not all(isinstance(r, dict) for r in table.values()):
        raise AV2FormatError(f"{where}: {key}: expected an object of id -> record")
    return list(table.values())


def _area_polyline(where: str, table: str, record: dict[str, Any], key: str) -> np.ndarray:
    try:
        pts = _xy(record[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise AV2FormatError(f"{where}: {table} {record.get('id')!r}: field {key!r} is missing or not "
                             f"a list of {{x, y}} points ({type(exc).__name__}: {exc})") from None
    if not np.isfinite(pts).all():
        raise AV2FormatError(f"{where}: {table} {record.get('id')!r}: field {key!r} has non-finite points")
    return pts


def _mark_type(where: str, segment: dict[str, Any], key: str) -> str:
    v = segment.get(key, "UNKNOWN")
    if not isinstance(v, str) or v.upper() not in LANE_MARK_TYPES:
        raise AV2FormatError(f"{where}: lane segment {segment.get('id')!r}: field {key!r} = {v!r} "
                             f"is not an AV2 lane mark type ({', '.join(sorted(LANE_MARK_TYPES))})")
    return v.upper()


def _direction(centerline: np.ndarray) -> np.ndarray:
    d = centerline[-1] - centerline[0]
    n = float(np.linalg.norm(d))
    return d / n if n > 1e-9 else d


def _adjacency(where: str, lanes: list[dict[str, Any]], centerlines: list[np.ndarray]) -> dict[str, list]:
    """Same-direction neighbours per side (lane id or None) and whether the marking between may be crossed."""
    index = {int(s["id"]): k for k, s in enumerate(lanes)}
    out: dict[str, list] = {"left_neighbors": [], "right_neighbors": [], "lane_change_left": [],
                            "lane_change_right": []}
    for k, seg in enumerate(lanes):
        for side in ("left", "right"):
            nb = _lane_ref(where, seg, f"{side}_neighbor_id")
            mark = _mark_type(where, seg, f"{side}_lane_mark_type")
            j = index.get(nb) if nb is not None else None
            # a neighbour outside the archive's crop, the lane itself, or one running the other way (dot of
            # the overall directions <= 0) is no lane to change into
            if j is None or j == k or float(_direction(centerlines[k]) @ _direction(centerlines[j])) <= 0.0:
                nb = None
            out[f"{side}_neighbors"].append(nb)
            out[f"lane_change_{side}"].append(nb is not None and mark in CROSSABLE_MARK_TYPES)
    return out


def _track_int_id(track_id: str) -> int:
    """AV2 track ids are strings (usually digits); non-numeric ones get a stable CRC-based id."""
    try:
        return int(track_id)
    except ValueError:
        return -int(zlib.crc32(track_id.encode()))


def find_scenario_files(path: str | os.PathLike) -> tuple[Path, Path]:
    """(parquet, map json) of a scenario directory (or given its parquet file)."""
    path = Path(path)
    directory = path.parent if path.is_file() else path
    parquets = sorted(directory.glob("scenario_*.parquet"))
    maps = sorted(directory.glob("log_map_archive_*.json"))
    if path.is_file() and path.suffix == ".parquet":
        parquets = [path]
    if not parquets:
        raise AV2FormatError(f"{directory}: no scenario_*.parquet file")
    if not maps:
        raise AV2FormatError(f"{directory}: no log_map_archive_*.json file")
    return parquets[0], maps[0]


def load_av2_map(
    json_path: str | os.PathLike, params: dict[str, Any]
) -> tuple[LaneMap, np.ndarray]:
    """The map archive as a LaneMap, plus a [L] bool mask of vehicle-drivable lanes (``params``:
    params/bev.yaml as loaded, its ``adapters`` block)."""
    limits = require(params, "adapters.default_speed_limits")
    try:
        with open(json_path) as f:
            archive = json.load(f)
    except (OSError, ValueError) as exc:
        raise AV2FormatError(f"{json_path}: unreadable map archive ({type(exc).__name__}: {exc})") from exc
    for key in ("lane_segments", "drivable_areas", "pedestrian_crossings"):
        if not isinstance(archive, dict) or key not in archive:
            raise AV2FormatError(f"{json_path}: missing key {key!r}")
    try:
        lanes = sorted(archive["lane_segments"].values(), key=lambda s: int(s["id"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AV2FormatError(f"{json_path}: lane_segments: every segment needs an integer 'id' "
                             f"({type(exc).__name__}: {exc})") from None
    where = str(json_path)
    geometry = [_lane_geometry(where, s) for s in lanes]
    ids = [int(s["id"]) for s in lanes]
    known = set(ids)
    speed, vehicle_lane = [], []
    for s in lanes:
        lane_type = str(s.get("lane_type", "")).lower()
        speed.append(float(limits.get(lane_type, limits["default"])))
        vehicle_lane.append(lane_type in ("vehicle", "bus"))
    drivable = [_area_polyline(where, "drivable_areas", a, "area_boundary")
                for a in _records(where, archive, "drivable_areas")]
    crosswalks = []
    for c in _records(where, archive, "pedestrian_crossings"):
        e1 = _area_polyline(where, "pedestrian_crossings", c, "edge1")
        e2 = _area_polyline(where, "pedestrian_crossings", c, "edge2")
        crosswalks.append(np.concatenate([e1, e2[::-1]]))
    lane_map = LaneMap.build(
        lane_ids=ids,
        centerlines=[g[0] for g in geometry],
        left_boundaries=[g[1] for g in geometry],
        right_boundaries=[g[2] for g in geometry],
        speed_limits=speed,
        successors=[[v for v in _lane_refs(where, s, "successors") if v in known] for s in lanes],
        drivable_areas=[d for d in drivable if len(d) >= 3],
        crosswalks=[c for c in crosswalks if len(c) >= 3],
        **_adjacency(where, lanes, [g[0] for g in geometry]),
    )
    return lane_map, np.array(vehicle_lane, dtype=bool)


def load_av2_scenario(
    path: str | os.PathLike, params: dict[str, Any], lane_map: LaneMap | None = None
) -> Clip:
    """Read one AV2 scenario directory into a validated :class:`Clip` (``params``: params/bev.yaml and
    sim.yaml as loaded, merged by :func:`rad2_core.config.merged`)."""
    import pandas as pd

    sizes = require(params, "adapters.default_box_sizes")
    ego_len, ego_wid = (float(v) for v in require(params, "adapters.ego_box_size"))
    dt = float(require(params, "adapters.av2_dt"))
    parquet, map_json = find_scenario_files(path)
    df = pd.read_parquet(parquet)
    needed = [
        "track_id",
        "object_type",
        "timestep",
        "position_x",
        "position_y",
        "heading",
        "velocity_x",
        "velocity_y",
    ]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise AV2FormatError(f"{parquet}: missing columns {missing}")
    vehicle_lanes = None
    if lane_map is None:
        lane_map, vehicle_lanes = load_av2_map(map_json, params)
    t0 = int(df["timestep"].min())
    num_steps = int(df["timestep"].max()) - t0 + 1
    ego_df = df[df["track_id"] == EGO_TRACK_ID].sort_values("timestep")
    if len(ego_df) != num_steps:
        raise AV2FormatError(
            f"{parquet}: ego track {EGO_TRACK_ID!r} has {len(ego_df)} rows,"
            f" expected {num_steps} (one per step)"
        )
    ex = ego_df["position_x"].to_numpy(np.float64)
    ey = ego_df["position_y"].to_numpy(np.float64)
    eyaw = wrap_angle(ego_df["heading"].to_numpy(np.float64))
    espeed = np.hypot(ego_df["velocity_x"].to_numpy(np.float64), ego_df["velocity_y"].to_numpy(np.float64))

    agents = df[df["track_id"] != EGO_TRACK_ID]
    track_ids = sorted(agents["track_id"].unique(), key=lambda s: (not str(s).isdigit(), str(s)))
    n = len(track_ids)
    row_of = {tid: i for i, tid in enumerate(track_ids)}
    shape = (n, num_steps)
    ax, ay, ayaw, avx, avy = (np.zeros(shape) for _ in range(5))
    valid = np.zeros(shape, dtype=bool)
    rows = agents["track_id"].map(row_of).to_numpy()
    cols = agents["timestep"].to_numpy() - t0
    ax[rows, cols] = agents["position_x"].to_numpy()
    ay[rows, cols] = agents["position_y"].to_numpy()
    ayaw[rows, cols] = wrap_angle(agents["heading"].to_numpy())
    avx[rows, cols] = agents["velocity_x"].to_numpy()
    avy[rows, cols] = agents["velocity_y"].to_numpy()
    valid[rows, cols] = True
    first_type = agents.groupby("track_id")["object_type"].first()
    types, lengths, widths = [], [], []
    for tid in track_ids:
        obj = str(first_type[tid]).lower()
        types.append(AV2_TYPE_MAP.get(obj, AGENT_OTHER))
        ln, wd = sizes.get(obj, sizes["unknown"])
        lengths.append(float(ln))
        widths.append(float(wd))

    first = df.iloc[0]
    scenario_id = (
        str(first["scenario_id"]) if "scenario_id" in df.columns else parquet.stem[len("scenario_") :]
    )
    metadata = {
        "city": str(first["city"]) if "city" in df.columns else None,
        "focal_track_id": str(first["focal_track_id"]) if "focal_track_id" in df.columns else None,
        "box_sizes": "defaults by object_type (params/bev.yaml adapters.default_box_sizes)",
        "speed_limits": "defaults by lane_type (params/bev.yaml adapters.default_speed_limits)",
    }
    agent_fields = {
        "agent_ids": [_track_int_id(str(t)) for t in track_ids],
        "agent_types": types,
        "agent_length": lengths,
        "agent_width": widths,
        "agent_x": ax,
        "agent_y": ay,
        "agent_yaw": ayaw,
        "agent_vx": avx,
        "agent_vy": avy,
        "agent_valid": valid,
    }
    return logged_clip(
        params,
        lane_map,
        clip_id=f"av2_{scenario_id}",
        source="av2",
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
        lane_allowed=vehicle_lanes,
    )
