"""Waymo Open Motion Dataset (WOMD) scenarios -> :class:`Clip`, without TensorFlow.

WOMD ships ``waymo.open_dataset.Scenario`` protobufs in TFRecord files. Both layers are read here:

- TFRecord framing (``uint64 length | uint32 masked CRC32C(length) | data | uint32 masked CRC32C(data)``,
  little-endian), both CRCs verified (CRC-32C/Castagnoli, from the ``crc32c`` package); gzip-compressed
  files are read too;
- the Scenario messages, by the classes protoc generated from Waymo's own ``scenario.proto`` /
  ``map.proto`` (``womd_protos/``; their descriptors live in a pool of their own, so the official
  package, if also imported, does not clash).

Conversion (one clip per Scenario record):

- the ``sdc_track_index`` track is the ego (box size: median of its valid states); the clip spans its
  valid states (gaps inside are interpolated); every other track with a valid state in that span is
  an agent (``TYPE_VEHICLE/PEDESTRIAN/CYCLIST`` -> ``AGENT_*``, anything else ``AGENT_OTHER``);
- lanes: centreline = the lane polyline; left/right boundaries = the lane points projected onto the
  road lines / edges its ``left_boundaries`` / ``right_boundaries`` reference, else the centreline
  offset by half ``adapters.womd.default_lane_width_m``; successors = ``exit_lanes``; drivable area =
  each lane's polygon (WOMD has no drivable-area polygons); crosswalks kept; speed limits from
  ``speed_limit_mph`` (-> m/s), or ``adapters.womd.default_speed_limits`` by lane type when 0;
- adjacency: per side the listed neighbour (WOMD lists only same-direction lanes) with the longest
  adjacent stretch; a lane change into it is allowed when broken lines make up at least
  ``adapters.womd.lane_change_min_broken_fraction`` of the marked boundary between the two lanes;
- traffic signals: one signal per lane that ``dynamic_map_states`` ever lists (signal id = lane id,
  controlling that lane), its stop line a segment one default lane width long across the lane at the
  logged ``stop_point``; states: (ARROW_/FLASHING_)STOP -> red, (ARROW_/FLASHING_)CAUTION -> yellow,
  (ARROW_)GO -> green, anything else unknown (flashing red is a stop-and-go rule, a red is the closest
  state the simulator has);
- time: WOMD is 10 Hz; ``timestamps_seconds`` must be evenly spaced (within
  ``adapters.log_step_tolerance`` of a step) and the clip is resampled to ``sim.dt`` (params/sim.yaml);
- the route: :func:`rad2_datasets.adapters.logged_clip` (the lanes the ego's path traverses, bike lanes
  excluded, extended along successors).

Every error names the file, the record index and the field.

One module, about 700 lines: the TFRecord framing, the Scenario-to-clip mapping (tracks, map features,
signals) and the route are one reader of one format; the message classes themselves are generated
(``womd_protos``).
"""

from __future__ import annotations

import gzip
import math
import os
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from crc32c import crc32c
from google.protobuf.message import DecodeError
from rad2_core.clip import AGENT_CYCLIST, AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.config import require
from rad2_core.field_checks import ClipValidationError
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED, SIGNAL_UNKNOWN, SIGNAL_YELLOW, LaneMap

from rad2_datasets.adapters import logged_clip
from rad2_datasets.adapters.womd_protos.waymo_open_dataset.protos import map_pb2, scenario_pb2

MPH_TO_MPS = 0.44704


class WOMDFormatError(ValueError):
    """A file is not a readable WOMD TFRecord / Scenario; the message names file, record and field."""


# ----------------------------------------------------------------------------------------------
# TFRecord files
# ----------------------------------------------------------------------------------------------
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C: rotated right by 15 bits plus a constant, so that the CRC of data
    that itself holds CRCs stays meaningful."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _open_record_file(path: Path) -> BinaryIO:
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":  # gzip magic: TFRecordOptions(compression_type="GZIP")
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def iter_tfrecord(path: str | os.PathLike, verify_crc: bool = True) -> Iterator[tuple[int, bytes]]:
    """(record index, payload) of each record of a TFRecord file; framing and CRC errors raise
    :class:`WOMDFormatError` naming the file, the record and the part that is wrong."""
    path = Path(path)
    try:
        f = _open_record_file(path)
    except OSError as exc:
        raise WOMDFormatError(f"{path}: cannot open ({type(exc).__name__}: {exc})") from exc
    with f:
        index = 0
        while True:
            try:
                header = f.read(12)
                if not header:
                    return
                if len(header) < 12:
                    raise WOMDFormatError(
                        f"{path}: record {index}: truncated header ({len(header)} of 12 bytes)"
                    )
                (length,) = struct.unpack("<Q", header[:8])
                (length_crc,) = struct.unpack("<I", header[8:])
                if verify_crc and masked_crc32c(header[:8]) != length_crc:
                    raise WOMDFormatError(
                        f"{path}: record {index}: length CRC mismatch (stored 0x{length_crc:08x}, "
                        f"computed 0x{masked_crc32c(header[:8]):08x}); corrupt or not a TFRecord file"
                    )
                data = f.read(length)
                footer = f.read(4)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise WOMDFormatError(
                    f"{path}: record {index}: read failed ({type(exc).__name__}: {exc})"
                ) from exc
            if len(data) < length or len(footer) < 4:
                raise WOMDFormatError(
                    f"{path}: record {index}: truncated data ({len(data)} of {length} bytes"
                    f"{'' if len(data) < length else ', no data CRC'})"
                )
            (data_crc,) = struct.unpack("<I", footer)
            if verify_crc:
                computed = masked_crc32c(data)
                if computed != data_crc:
                    raise WOMDFormatError(
                        f"{path}: record {index}: data CRC mismatch (stored 0x{data_crc:08x}, "
                        f"computed 0x{computed:08x}); the record is corrupt"
                    )
            yield index, data
            index += 1


def write_tfrecord(path: str | os.PathLike, records: Iterable[bytes]) -> Path:
    """Write payloads as an (uncompressed) TFRecord file; e.g. to keep a subset of WOMD scenarios."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for data in records:
            data = bytes(data)
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked_crc32c(header)))
            f.write(data + struct.pack("<I", masked_crc32c(data)))
    return path


def count_tfrecords(path: str | os.PathLike) -> int:
    """Number of records in a file, from the length headers alone (no CRC check, no payload read)."""
    path = Path(path)
    n = 0
    with _open_record_file(path) as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return n
            (length,) = struct.unpack("<Q", header[:8])
            f.seek(length + 4, os.SEEK_CUR)
            n += 1


def womd_files(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """TFRecord files named by ``inputs``: files as given, directories expanded to their
    ``*.tfrecord*`` files (sorted)."""
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and ".tfrecord" in q.name)
            if not found:
                raise WOMDFormatError(f"{p}: directory holds no *.tfrecord* file")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise WOMDFormatError(f"{p}: no such file or directory")
    return files


# ----------------------------------------------------------------------------------------------
# Enum values of the Scenario messages
# ----------------------------------------------------------------------------------------------
_LINE = map_pb2.RoadLine
_SIGNAL = map_pb2.TrafficSignalLaneState
_LANE = map_pb2.LaneCenter
_TRACK = scenario_pb2.Track
# Road line types that are broken (crossable) lines. PASSING_DOUBLE_YELLOW is solid on one side and
# broken on the other, and the proto does not say which: treated as not crossable.
BROKEN_ROAD_LINE_TYPES = frozenset(
    {_LINE.TYPE_BROKEN_SINGLE_WHITE, _LINE.TYPE_BROKEN_SINGLE_YELLOW, _LINE.TYPE_BROKEN_DOUBLE_YELLOW}
)
_SIGNAL_STATE_MAP = {
    _SIGNAL.LANE_STATE_ARROW_STOP: SIGNAL_RED,
    _SIGNAL.LANE_STATE_STOP: SIGNAL_RED,
    _SIGNAL.LANE_STATE_FLASHING_STOP: SIGNAL_RED,
    _SIGNAL.LANE_STATE_ARROW_CAUTION: SIGNAL_YELLOW,
    _SIGNAL.LANE_STATE_CAUTION: SIGNAL_YELLOW,
    _SIGNAL.LANE_STATE_FLASHING_CAUTION: SIGNAL_YELLOW,
    _SIGNAL.LANE_STATE_ARROW_GO: SIGNAL_GREEN,
    _SIGNAL.LANE_STATE_GO: SIGNAL_GREEN,
}
_TRACK_TYPE_MAP = {
    _TRACK.TYPE_VEHICLE: AGENT_VEHICLE,
    _TRACK.TYPE_PEDESTRIAN: AGENT_PEDESTRIAN,
    _TRACK.TYPE_CYCLIST: AGENT_CYCLIST,
}
_TRACK_TYPE_SIZE_KEY = {AGENT_VEHICLE: "vehicle", AGENT_PEDESTRIAN: "pedestrian", AGENT_CYCLIST: "cyclist"}
_LANE_TYPE_NAMES = {
    _LANE.TYPE_UNDEFINED: "undefined",
    _LANE.TYPE_FREEWAY: "freeway",
    _LANE.TYPE_SURFACE_STREET: "surface_street",
    _LANE.TYPE_BIKE_LANE: "bike_lane",
}
LANE_TYPE_BIKE = _LANE.TYPE_BIKE_LANE


# ----------------------------------------------------------------------------------------------
# Scenario -> Clip
# ----------------------------------------------------------------------------------------------
def _points(where: str, field: str, pts) -> np.ndarray:
    xy = np.array([(p.x, p.y) for p in pts], dtype=np.float64).reshape(-1, 2)
    if not np.isfinite(xy).all():
        raise WOMDFormatError(f"{where}: {field}: non-finite coordinates")
    return xy


def _unit_tangents(poly: np.ndarray) -> np.ndarray:
    """[K, 2] unit direction of travel at each polyline point (central differences)."""
    d = np.gradient(poly, axis=0) if len(poly) > 2 else np.repeat(poly[-1:] - poly[:1], len(poly), axis=0)
    n = np.linalg.norm(d, axis=1, keepdims=True)
    return d / np.where(n > 1e-9, n, 1.0)


def _project(points: np.ndarray, poly: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Closest points on polyline ``poly`` to each of ``points`` and their distances."""
    if len(poly) == 1:
        return np.repeat(poly, len(points), axis=0), np.linalg.norm(points - poly[0], axis=1)
    a, v = poly[:-1], np.diff(poly, axis=0)
    len2 = np.maximum(np.sum(v * v, axis=1), 1e-12)
    u = np.clip(np.einsum("pkd,kd->pk", points[:, None, :] - a[None], v) / len2, 0.0, 1.0)
    proj = a[None] + u[..., None] * v[None]
    dist = np.linalg.norm(points[:, None, :] - proj, axis=-1)
    best = np.argmin(dist, axis=1)
    rows = np.arange(len(points))
    return proj[rows, best], dist[rows, best]


def _boundary(
    center: np.ndarray,
    segments,
    lines: dict[int, np.ndarray],
    side: float,
    half_width: float,
    max_offset: float,
) -> np.ndarray:
    """A lane side from the road lines/edges its boundary segments reference: each lane point in a
    segment's index range projected onto that line (when it lies within ``max_offset``); points no
    segment covers are offset by ``half_width`` to the ``side`` (+1 left, -1 right)."""
    normal = _unit_tangents(center) @ np.array([[0.0, 1.0], [-1.0, 0.0]])  # left normal
    out = center + side * half_width * normal
    last = len(center) - 1
    for seg in segments:
        line = lines.get(int(seg.boundary_feature_id))
        if line is None:
            continue
        lo = min(max(int(seg.lane_start_index), 0), last)
        hi = min(max(int(seg.lane_end_index), lo), last)
        proj, dist = _project(center[lo : hi + 1], line)
        ok = dist <= max_offset
        out[lo : hi + 1][ok] = proj[ok]
    return out


def _broken_fraction(neighbor, own_segments, line_types: dict[int, int]) -> float:
    """Share (by lane points) of the marked boundary between a lane and a neighbour that is a broken line.
    The neighbour's own ``boundaries`` describe it; without them the lane's side boundary segments that
    overlap the adjacent stretch do. A segment of unknown type takes the type of the road line it names."""
    lo, hi = int(neighbor.self_start_index), int(neighbor.self_end_index)
    segs = list(neighbor.boundaries) or [
        s for s in own_segments if int(s.lane_end_index) >= lo and int(s.lane_start_index) <= hi
    ]
    total = broken = 0.0
    for s in segs:
        kind = int(s.boundary_type) or line_types.get(int(s.boundary_feature_id), 0)
        span = max(int(s.lane_end_index) - int(s.lane_start_index), 0) + 1
        total += span
        broken += span if kind in BROKEN_ROAD_LINE_TYPES else 0
    return broken / total if total else 0.0


def _stop_line(center: np.ndarray, point: np.ndarray, width: float) -> np.ndarray:
    """A segment ``width`` long across the lane at ``point``, perpendicular to the lane there."""
    k = int(np.argmin(np.linalg.norm(center - point, axis=1)))
    tangent = _unit_tangents(center)[k]
    normal = np.array([-tangent[1], tangent[0]])
    return np.stack([point - 0.5 * width * normal, point + 0.5 * width * normal])


def womd_lane_map(scenario, params: dict[str, Any], where: str) -> tuple[LaneMap, np.ndarray, dict[str, Any]]:
    """(LaneMap with adjacency and signals, [L] bool mask of lanes a car may use, map statistics)."""
    half = 0.5 * float(require(params, "adapters.womd.default_lane_width_m"))
    max_offset = float(require(params, "adapters.womd.boundary_max_offset_m"))
    limits = require(params, "adapters.womd.default_speed_limits")
    min_broken = float(require(params, "adapters.womd.lane_change_min_broken_fraction"))
    lanes, lines, line_types, crosswalks = {}, {}, {}, []
    seen: set[int] = set()
    stats = {"stop_signs": 0, "speed_bumps": 0, "driveways": 0, "lanes_dropped_short": 0}
    for i, feat in enumerate(scenario.map_features):
        fid = int(feat.id)
        kind = feat.WhichOneof("feature_data")
        if fid in seen:
            raise WOMDFormatError(f"{where}: map_features[{i}].id: duplicate feature id {fid}")
        seen.add(fid)
        if kind == "lane":
            poly = _points(where, f"map_features[{i}] (lane {fid}).lane.polyline", feat.lane.polyline)
            # repeated points are dropped only after the boundaries are built: boundary and neighbour
            # index ranges count the points as stored
            keep = np.concatenate([[True], np.linalg.norm(np.diff(poly, axis=0), axis=1) > 1e-6])[: len(poly)]
            if keep.sum() < 2:
                # a one-point lane has no direction: nothing can follow or drive it
                stats["lanes_dropped_short"] += 1
                continue
            lanes[fid] = (feat.lane, poly, keep)
        elif kind in ("road_line", "road_edge"):
            msg = getattr(feat, kind)
            pts = _points(where, f"map_features[{i}] ({kind} {fid}).{kind}.polyline", msg.polyline)
            if len(pts):
                lines[fid] = pts
                line_types[fid] = int(msg.type) if kind == "road_line" else 0
        elif kind == "crosswalk":
            poly = _points(
                where, f"map_features[{i}] (crosswalk {fid}).crosswalk.polygon", feat.crosswalk.polygon
            )
            if len(poly) >= 3:
                crosswalks.append(poly)
        elif kind in ("stop_sign", "speed_bump", "driveway"):
            stats[kind + "s"] += 1
    if not lanes:
        raise WOMDFormatError(f"{where}: map_features: the scenario has no lane with >= 2 polyline points")
    ids = sorted(lanes)
    known = set(ids)
    center, left, right, speed, succ, vehicle = [], [], [], [], [], []
    nb = {"left": [], "right": []}
    allowed = {"left": [], "right": []}
    for lid in ids:
        lane, poly, keep = lanes[lid]
        center.append(poly[keep])
        left.append(_boundary(poly, lane.left_boundaries, lines, +1.0, half, max_offset)[keep])
        right.append(_boundary(poly, lane.right_boundaries, lines, -1.0, half, max_offset)[keep])
        mph = float(lane.speed_limit_mph)
        if not math.isfinite(mph) or mph < 0:
            raise WOMDFormatError(f"{where}: lane {lid}: speed_limit_mph {mph} is not a speed")
        type_name = _LANE_TYPE_NAMES.get(int(lane.type), "undefined")
        speed.append(mph * MPH_TO_MPS if mph > 0 else float(limits.get(type_name, limits["default"])))
        succ.append([int(s) for s in lane.exit_lanes if int(s) in known and int(s) != lid])
        vehicle.append(int(lane.type) != LANE_TYPE_BIKE)
        for side, listed, own in (
            ("left", lane.left_neighbors, lane.left_boundaries),
            ("right", lane.right_neighbors, lane.right_boundaries),
        ):
            cands = [n for n in listed if int(n.feature_id) in known and int(n.feature_id) != lid]
            if not cands:
                nb[side].append(None)
                allowed[side].append(False)
                continue
            # LaneMap keeps one neighbour a side: the one alongside for the longest stretch
            best = max(cands, key=lambda n: int(n.self_end_index) - int(n.self_start_index))
            nb[side].append(int(best.feature_id))
            allowed[side].append(_broken_fraction(best, own, line_types) >= min_broken)
    signal_ids, signal_lanes, stop_lines, stats["signals_without_lane"] = _signals(
        scenario, lanes, known, 2.0 * half, where
    )
    lane_map = LaneMap.build(
        lane_ids=ids,
        centerlines=center,
        left_boundaries=left,
        right_boundaries=right,
        speed_limits=speed,
        successors=succ,
        drivable_areas=[np.concatenate([r, lb[::-1]]) for lb, r in zip(left, right)],
        crosswalks=crosswalks,
        left_neighbors=nb["left"],
        right_neighbors=nb["right"],
        lane_change_left=allowed["left"],
        lane_change_right=allowed["right"],
        signal_ids=signal_ids,
        signal_lanes=signal_lanes,
        signal_stop_lines=stop_lines,
    )
    try:
        lane_map.validate()
    except ClipValidationError as exc:
        raise WOMDFormatError(f"{where}: map_features: the converted map is inconsistent ({exc})") from exc
    return lane_map, np.array(vehicle, dtype=bool), stats


def _signals(scenario, lanes: dict, known: set[int], width: float, where: str):
    """Signals (one per controlled lane present in the map): ids, lanes, stop lines."""
    stop_points: dict[int, np.ndarray | None] = {}
    unknown: set[int] = set()
    for t, dyn in enumerate(scenario.dynamic_map_states):
        for j, st in enumerate(dyn.lane_states):
            lid = int(st.lane)
            if lid not in known:
                unknown.add(lid)  # a signal for a lane outside the scenario's map crop (or a dropped lane)
                continue
            if stop_points.get(lid) is None and st.HasField("stop_point"):
                pt = np.array([st.stop_point.x, st.stop_point.y], dtype=np.float64)
                if not np.isfinite(pt).all():
                    raise WOMDFormatError(
                        f"{where}: dynamic_map_states[{t}].lane_states[{j}].stop_point: "
                        f"non-finite coordinates {pt.tolist()}"
                    )
                stop_points[lid] = pt
            else:
                stop_points.setdefault(lid, None)
    ids = sorted(stop_points)
    lines = []
    for lid in ids:
        center = lanes[lid][1][lanes[lid][2]]
        # no logged stop point: a signalised lane starts at its stop line in WOMD's lane graph
        pt = stop_points[lid] if stop_points[lid] is not None else center[0]
        lines.append(_stop_line(center, pt, width))
    return ids, [[lid] for lid in ids], lines, len(unknown)


def _signal_states(scenario, signal_ids: np.ndarray, num_steps: int, where: str) -> np.ndarray | None:
    dyn = scenario.dynamic_map_states
    if len(signal_ids) == 0:
        return None
    if len(dyn) != num_steps:
        raise WOMDFormatError(
            f"{where}: dynamic_map_states: {len(dyn)} entries, expected {num_steps} "
            "(one per timestamps_seconds entry)"
        )
    row = {int(s): k for k, s in enumerate(signal_ids)}
    states = np.full((len(signal_ids), num_steps), SIGNAL_UNKNOWN, dtype=np.int8)
    for t, d in enumerate(dyn):
        for st in d.lane_states:
            k = row.get(int(st.lane))
            if k is not None:
                states[k, t] = _SIGNAL_STATE_MAP.get(int(st.state), SIGNAL_UNKNOWN)
    return states


def _log_step(ts: np.ndarray, tolerance: float, where: str) -> float:
    """The log's step (s) from ``timestamps_seconds``, which must be evenly spaced within ``tolerance``
    of a step: the clip format and its resampling assume one step for the whole log."""
    if len(ts) < 2:
        raise WOMDFormatError(f"{where}: timestamps_seconds: {len(ts)} entries, a clip needs at least 2")
    if not np.isfinite(ts).all():
        raise WOMDFormatError(f"{where}: timestamps_seconds: non-finite values")
    diffs = np.diff(ts)
    # rounded to microseconds: stored timestamps carry float noise that would otherwise turn a 10 Hz log
    # into a 0.1000000015 s one, resampled for nothing
    dt = round(float(ts[-1] - ts[0]) / (len(ts) - 1), 6)
    if dt <= 0:
        raise WOMDFormatError(f"{where}: timestamps_seconds: not increasing ({ts[0]} .. {ts[-1]})")
    bad = np.flatnonzero(np.abs(diffs - dt) > tolerance * dt)
    if len(bad):
        k = int(bad[0])
        raise WOMDFormatError(
            f"{where}: timestamps_seconds: uneven spacing, step {k}->{k + 1} is {diffs[k]:.6f} s against "
            f"a mean of {dt:.6f} s (tolerance {tolerance:.0%} of a step, adapters.log_step_tolerance); "
            "cannot resample"
        )
    return dt


def _track_arrays(track, num_steps: int, where: str, field: str) -> dict[str, np.ndarray]:
    states = track.states
    if len(states) != num_steps:
        raise WOMDFormatError(
            f"{where}: {field}.states: {len(states)} entries, expected {num_steps} "
            "(one per timestamps_seconds entry)"
        )
    a = np.array(
        [
            (
                s.center_x,
                s.center_y,
                s.heading,
                s.velocity_x,
                s.velocity_y,
                s.length,
                s.width,
                1.0 if s.valid else 0.0,
            )
            for s in states
        ],
        dtype=np.float64,
    ).reshape(num_steps, 8)
    valid = a[:, 7] > 0.5
    if not np.isfinite(a[valid, :7]).all():
        t = int(np.flatnonzero(valid & ~np.isfinite(a[:, :7]).all(axis=1))[0])
        raise WOMDFormatError(f"{where}: {field}.states[{t}]: non-finite values in a valid state")
    return {
        "x": a[:, 0],
        "y": a[:, 1],
        "yaw": a[:, 2],
        "vx": a[:, 3],
        "vy": a[:, 4],
        "length": a[:, 5],
        "width": a[:, 6],
        "valid": valid,
    }


def _fill_gaps(tr: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    """The ego's states on steps lo..hi with the invalid ones inside interpolated linearly in time
    (heading unwrapped first); the ego has to be somewhere at every step of a clip."""
    t = np.arange(lo, hi + 1)
    ok = np.flatnonzero(tr["valid"][lo : hi + 1]) + lo
    out = {k: np.interp(t, ok, tr[k][ok]) for k in ("x", "y", "vx", "vy")}
    out["yaw"] = wrap_angle(np.interp(t, ok, np.unwrap(tr["yaw"][ok])))
    return out


def _median_size(tr: dict[str, np.ndarray], key: str) -> float:
    vals = tr[key][tr["valid"] & (tr[key] > 0)]
    return float(np.median(vals)) if len(vals) else 0.0


def scenario_to_clip(scenario, params: dict[str, Any], where: str = "scenario") -> Clip:
    """One decoded ``Scenario`` message as a validated clip at the simulator's step (see the module doc).
    ``params``: params/bev.yaml and sim.yaml as loaded, merged; ``where`` prefixes error messages (the
    readers pass ``<file>: record <i>``)."""
    tolerance = float(require(params, "adapters.log_step_tolerance"))
    sizes = require(params, "adapters.default_box_sizes")
    ts = np.asarray(scenario.timestamps_seconds, dtype=np.float64)
    dt = _log_step(ts, tolerance, where)
    num_steps = len(ts)
    tracks = scenario.tracks
    sdc = int(scenario.sdc_track_index)
    if not 0 <= sdc < len(tracks):
        raise WOMDFormatError(
            f"{where}: sdc_track_index: {sdc} is not an index into tracks ({len(tracks)} tracks)"
        )
    arrays = [
        _track_arrays(tr, num_steps, where, f"tracks[{i}] (id {int(tr.id)})") for i, tr in enumerate(tracks)
    ]
    ego = arrays[sdc]
    valid_steps = np.flatnonzero(ego["valid"])
    if len(valid_steps) < 2:
        raise WOMDFormatError(
            f"{where}: tracks[{sdc}].states[*].valid: the SDC (ego) track has "
            f"{len(valid_steps)} valid states, a clip needs at least 2"
        )
    lo, hi = int(valid_steps[0]), int(valid_steps[-1])
    span = slice(lo, hi + 1)
    ego_fill = _fill_gaps(ego, lo, hi)
    ego_len, ego_wid = _median_size(ego, "length"), _median_size(ego, "width")
    if ego_len <= 0 or ego_wid <= 0:
        ego_len, ego_wid = (float(v) for v in require(params, "adapters.ego_box_size"))

    lane_map, vehicle_lanes, map_stats = womd_lane_map(scenario, params, where)
    signal_states = _signal_states(scenario, lane_map.signal_ids, num_steps, where)

    rows, ids, types, lengths, widths = [], [], [], [], []
    seen_ids: dict[int, int] = {int(tracks[sdc].id): sdc}
    for i, (tr, a) in enumerate(zip(tracks, arrays)):
        if i == sdc:
            continue
        tid = int(tr.id)
        if tid in seen_ids:
            raise WOMDFormatError(f"{where}: tracks[{i}].id: {tid} is also the id of tracks[{seen_ids[tid]}]")
        seen_ids[tid] = i
        if not a["valid"][span].any():
            continue
        kind = _TRACK_TYPE_MAP.get(int(tr.object_type), AGENT_OTHER)
        ln, wd = _median_size(a, "length"), _median_size(a, "width")
        if ln <= 0 or wd <= 0:
            ln, wd = (float(v) for v in sizes[_TRACK_TYPE_SIZE_KEY.get(kind, "unknown")])
        rows.append(a)
        ids.append(tid)
        types.append(kind)
        lengths.append(ln)
        widths.append(wd)
    steps = hi - lo + 1

    def stack(key: str) -> np.ndarray:
        if not rows:
            return np.zeros((0, steps))
        v = np.stack([r["valid"][span] for r in rows])
        return np.where(v, np.stack([r[key][span] for r in rows]), 0.0)

    valid = np.stack([r["valid"][span] for r in rows]) if rows else np.zeros((0, steps), bool)
    agents = {
        "agent_ids": ids,
        "agent_types": types,
        "agent_length": lengths,
        "agent_width": widths,
        "agent_x": stack("x"),
        "agent_y": stack("y"),
        "agent_yaw": wrap_angle(stack("yaw")),
        "agent_vx": stack("vx"),
        "agent_vy": stack("vy"),
        "agent_valid": valid,
    }
    scenario_id = str(scenario.scenario_id)
    safe_id = re.sub(r"[^A-Za-z0-9_.\-]", "_", scenario_id) or re.sub(r"[^A-Za-z0-9_.\-]", "_", where)
    metadata = {
        "current_time_index": int(scenario.current_time_index) - lo,
        "ego_valid_steps": [lo, hi] if (lo, hi) != (0, num_steps - 1) else None,
        "ego_interpolated_steps": int(steps - ego["valid"][span].sum()),
        "log_dt": dt,
        "objects_of_interest": [int(v) for v in scenario.objects_of_interest],
        "tracks_to_predict": [
            int(tracks[r.track_index].id)
            for r in scenario.tracks_to_predict
            if 0 <= int(r.track_index) < len(tracks)
        ],
        "map": map_stats,
        "box_sizes": "logged (median of valid states); adapters.default_box_sizes when not logged",
        "speed_limits": "speed_limit_mph; adapters.womd.default_speed_limits by lane type when 0",
    }
    try:
        return logged_clip(
            params,
            lane_map,
            clip_id=f"womd_{safe_id}",
            source="womd",
            scenario_id=scenario_id,
            dt=dt,
            ego_x=ego_fill["x"],
            ego_y=ego_fill["y"],
            ego_yaw=ego_fill["yaw"],
            ego_speed=np.hypot(ego_fill["vx"], ego_fill["vy"]),
            ego_length=ego_len,
            ego_width=ego_wid,
            agents=agents,
            metadata=metadata,
            lane_allowed=vehicle_lanes,
            signal_states=None if signal_states is None else signal_states[:, span],
        )
    except ClipValidationError as exc:
        raise WOMDFormatError(f"{where}: the converted clip is inconsistent ({exc})") from exc


def parse_scenario(data: bytes, where: str):
    """Decode one Scenario payload; a payload that is not one raises naming ``where``."""
    msg = scenario_pb2.Scenario()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise WOMDFormatError(f"{where}: not a waymo.open_dataset.Scenario message ({exc})") from exc
    return msg


def iter_womd_clips(
    path: str | os.PathLike | Iterable[str | os.PathLike],
    params: dict[str, Any],
    *,
    verify_crc: bool = True,
    limit: int | None = None,
    errors: list[str] | None = None,
) -> Iterator[Clip]:
    """Clips of every Scenario record in the TFRecord file(s) ``path`` (files or directories of
    ``*.tfrecord*``), at the simulator's step. ``limit`` stops after that many records. With an
    ``errors`` list a record that does not convert is skipped and its message appended; framing and
    CRC errors always raise (the rest of a file cannot be trusted)."""
    seen = 0
    for file in womd_files(path):
        for index, data in iter_tfrecord(file, verify_crc=verify_crc):
            if limit is not None and seen >= limit:
                return
            seen += 1
            where = f"{file}: record {index}"
            try:
                yield scenario_to_clip(parse_scenario(data, where), params, where)
            except WOMDFormatError as exc:
                if errors is None:
                    raise
                errors.append(str(exc))


def load_womd_scenario(
    path: str | os.PathLike, record: int = 0, *, params: dict[str, Any]
) -> Clip:
    """The clip of record ``record`` of one TFRecord file."""
    for index, data in iter_tfrecord(path):
        if index == record:
            where = f"{path}: record {index}"
            return scenario_to_clip(parse_scenario(data, where), params, where)
    raise WOMDFormatError(f"{path}: record {record}: the file has fewer records")


__all__ = [
    "WOMDFormatError",
    "count_tfrecords",
    "iter_tfrecord",
    "iter_womd_clips",
    "load_womd_scenario",
    "masked_crc32c",
    "parse_scenario",
    "scenario_to_clip",
    "womd_files",
    "womd_lane_map",
    "write_tfrecord",
]
