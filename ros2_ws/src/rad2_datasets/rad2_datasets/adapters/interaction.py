"""INTERACTION dataset track files + their location's Lanelet2 map -> :class:`Clip` (no ROS).

The dataset's layout (v1)::

    <root>/maps/<location>.osm                                  Lanelet2 OSM of the location
    <root>/recorded_trackfiles/<location>/vehicle_tracks_NNN.csv
    <root>/recorded_trackfiles/<location>/pedestrian_tracks_NNN.csv   (some locations only)

- **Vehicle tracks**: one row per vehicle and frame, ``track_id, frame_id, timestamp_ms, agent_type, x,
  y, vx, vy, psi_rad, length, width`` (metres, m/s, radians; box centres; 10 Hz; ``track_id`` unique
  within its file only).
  A vehicle logged mostly at 3 m/s or faster against its ``psi_rad`` gets the heading turned by pi
  (:func:`heading_along_motion`: no car reverses that fast; the heading is mislabelled).
- **Pedestrian tracks**: the same without ``psi_rad, length, width`` (``track_id`` may be written
  ``P<n>``). They are read with the vehicle file of the same number and become pedestrian or cyclist
  agents: ``pedestrian`` / ``bicycle`` by their type, the dataset's combined type ``pedestrian/bicycle``
  by speed (a median of at least :data:`CYCLIST_MIN_MEDIAN_SPEED` m/s is a cyclist). Their boxes are
  ``adapters.default_box_sizes`` (params/bev.yaml), their heading the direction of their velocity.
- **The map**: the OSM nodes' lat/lon are a projection whose origin is (0, 0); read with the Lanelet2
  loader (:mod:`rad2_datasets.adapters.lanelet2_map`) with the ``utm`` projector at origin (0, 0), the
  tracks' x / y are in its frame. It is found by the location's name, ``<root>/maps/<location>.osm``,
  else as a ``.osm`` beside the track file (``<location>.osm``, or the only one there).

No ego is recorded: every vehicle may be one. A file gives one clip per promoted ego (up to
``egos_per_scenario``), ranked as the CommonRoad reader ranks NGSIM vehicles: of passenger-car type and
size (``adapters.promoted_ego``), moving, with a logged box that overlaps no other road user's; best
first: the longest clip, then the farthest travelled, then the smallest track id. A track file runs for
minutes, so a clip is a window of the ego's track :data:`CLIP_S` long (the length of the project's
bundled clips, params/scenarios.yaml ``scenarios.sim.clip_steps``), or all of a shorter track: the window
on the map's lanelets in which the ego travels farthest. The other road users are the agents, valid in
the frames they were logged. The route is the ego's logged path matched to the lanelets
(:func:`rad2_datasets.adapters.logged_clip`), and the clip is resampled to ``sim.dt``.

Refused, naming the file, the ego and why (:class:`InteractionFormatError`, a
:class:`rad2_datasets.adapters.logs.LogFormatError`):

- a whole file: no map found; a malformed row (the line, the field and its value: not a number, not
  finite, an impossible value such as a speed beyond ``validators.objects.max_speed_m_s`` or a point far
  outside the map, a frame not after the track's previous one, a timestamp off the file's frame rate);
- one ego: a track too short for a clip (``adapters.corpus_ego.min_duration_s``), an ego off every lane
  (its positions outside the lanelets by more than ``sim.offroad_margin_m``), a route that does not
  follow it (:class:`rad2_core.route_path.RouteError`), a clip the plausibility checks refuse.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.config import require
from rad2_core.field_checks import ClipValidationError
from rad2_core.geometry import boxes_overlap, wrap_angle
from rad2_core.lane_map import LaneMap
from rad2_core.route_path import RouteError

from rad2_datasets.adapters import logged_clip
from rad2_datasets.adapters.logs import LogFormatError

VEHICLE_COLUMNS = ("track_id", "frame_id", "timestamp_ms", "agent_type", "x", "y", "vx", "vy", "psi_rad",
                   "length", "width")
PEDESTRIAN_COLUMNS = VEHICLE_COLUMNS[:8]
MAP_PROJECTOR = "utm"
MAP_ORIGIN = (0.0, 0.0)  # lat, lon: the dataset's maps are projected from (0, 0)
# A clip is a window of the promoted ego's track this long (s): the bundled clips' length, 150 steps at
# 10 Hz (params/scenarios.yaml scenarios.sim.clip_steps).
CLIP_S = 15.0
# Windows of a long track are tried at this spacing (frames) along it.
WINDOW_STRIDE = 10
# A logged position farther than this (m) outside the bounding box of the map's lanes is not on the
# recorded scene (the drone's view is a few hundred metres across).
MAP_MARGIN_M = 1000.0
# Pedestrian-file agents: ids offset by this (their track_id restarts at 1 beside the vehicles'), and the
# combined type "pedestrian/bicycle" is a cyclist from this median speed (m/s) on.
PEDESTRIAN_ID_OFFSET = 1_000_000
CYCLIST_MIN_MEDIAN_SPEED = 2.5
# A pedestrian's heading follows its velocity from this speed (m/s) on; slower, the last such heading.
_HEADING_MIN_SPEED = 0.2
# No vehicle reverses this fast (m/s): a track logged mostly this fast against its psi_rad has a heading
# off by pi (a car of the roundabout's files "reversed" 100 m through it at 7 m/s, and as an ego the
# planner, which has no reverse, stood facing the wrong way until a car drove into it).
REVERSING_MAX_SPEED = 3.0

# the types whose tracks may be promoted to ego (box size decides the rest, as for NGSIM)
EGO_TYPES = ("car",)
_TYPE_MAP = {
    "car": AGENT_VEHICLE,
    "truck": AGENT_VEHICLE,
    "bus": AGENT_VEHICLE,
    "van": AGENT_VEHICLE,
    "trailer": AGENT_VEHICLE,
    "motorcycle": AGENT_CYCLIST,
    "bicycle": AGENT_CYCLIST,
    "cyclist": AGENT_CYCLIST,
    "pedestrian": AGENT_PEDESTRIAN,
}
_VRU_COMBINED = "pedestrian/bicycle"
_FILE_NUMBER = re.compile(r"(?:vehicle|pedestrian)_tracks_(\d+)$")


class InteractionFormatError(LogFormatError):
    """An INTERACTION track file, or one ego of it, that does not convert; the message names the file
    (and the line and field, or the ego) and ``reason`` is a short category: ``missing map``,
    ``malformed row``, ``no ego``, ``track too short``, ``off every lane``, ``route``, ``implausible``,
    ``invalid``."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# track files
# --------------------------------------------------------------------------------------------------
def track_file_kind(path: str | os.PathLike) -> str | None:
    """``"vehicle"`` or ``"pedestrian"`` when ``path`` is a ``.csv`` file whose header is an INTERACTION
    track file's, else None (a file that cannot be read is None too)."""
    path = Path(path)
    if not path.name.lower().endswith(".csv") or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            first = fh.readline(4096)
    except (OSError, UnicodeDecodeError):
        return None
    header = tuple(c.strip() for c in first.strip().split(","))
    if header == VEHICLE_COLUMNS:
        return "vehicle"
    if header == PEDESTRIAN_COLUMNS:
        return "pedestrian"
    return None


@dataclass
class Track:
    """One road user of a track file (arrays over its logged frames, in file order)."""

    agent_id: int
    raw_id: str
    agent_type: str
    frames: np.ndarray  # int64
    timestamps_ms: np.ndarray  # int64
    x: np.ndarray
    y: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    yaw: np.ndarray
    length: float
    width: float
    lines: np.ndarray  # the CSV line of each row
    kind: int = AGENT_VEHICLE
    from_pedestrian_file: bool = False


@dataclass
class TrackFile:
    """The road users of one vehicle track file and its pedestrian file, if any."""

    path: Path
    location: str
    number: str  # "000" of vehicle_tracks_000.csv (the file's stem when it has no number)
    dt: float  # s, the logged frame step
    tracks: dict[int, Track] = field(default_factory=dict)  # agent id -> track
    pedestrian_path: Path | None = None


def _bad_row(path: Path, line: int, name: str, raw: str, what: str) -> InteractionFormatError:
    return InteractionFormatError(f"{path}: line {line}: {name} {raw!r}: {what}", "malformed row")


def _number(path: Path, line: int, name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _bad_row(path, line, name, raw, "is not a number") from None
    if not math.isfinite(value):
        raise _bad_row(path, line, name, raw, "is not finite")
    return value


def _integer(path: Path, line: int, name: str, raw: str) -> int:
    value = _number(path, line, name, raw)
    if value != int(value) or value < 0:
        raise _bad_row(path, line, name, raw, "is not a whole number >= 0")
    return int(value)


def _track_key(path: Path, line: int, raw: str, pedestrian: bool) -> int:
    text = raw.strip()
    if pedestrian and text[:1] in ("P", "p"):
        text = text[1:]
    try:
        value = int(text)
    except ValueError:
        want = "a whole number or P<number>" if pedestrian else "a whole number"
        raise _bad_row(path, line, "track_id", raw, f"is not {want}") from None
    if value < 0 or (pedestrian and value >= PEDESTRIAN_ID_OFFSET):
        raise _bad_row(path, line, "track_id", raw, "is out of range")
    return value + PEDESTRIAN_ID_OFFSET if pedestrian else value


def _read_rows(path: Path, pedestrian: bool, params: dict[str, Any]) -> dict[int, dict[str, list]]:
    """Rows of one track file grouped by agent id (file order), every field checked."""
    columns = PEDESTRIAN_COLUMNS if pedestrian else VEHICLE_COLUMNS
    objects = require(params, "validators.objects")
    vmax = float(objects["max_speed_m_s"])
    pmax = float(require(params, "validators.odometry.max_abs_position_m"))
    size_min = float(objects["min_size_m"])
    size_max = {"length": float(objects["max_length_m"]), "width": float(objects["max_width_m"])}
    rows: dict[int, dict[str, list]] = {}
    try:
        fh = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise InteractionFormatError(f"{path}: cannot be read ({exc})", "malformed row") from exc
    with fh:
        reader = csv.reader(fh)
        try:
            header = tuple(c.strip() for c in next(reader, []))
            if header != columns:
                raise InteractionFormatError(
                    f"{path}: line 1: header {','.join(header)!r} is not an INTERACTION "
                    f"{'pedestrian' if pedestrian else 'vehicle'} track file's ({','.join(columns)})",
                    "malformed row")
            for row in reader:
                line = reader.line_num
                if not any(c.strip() for c in row):
                    continue
                if len(row) != len(columns):
                    raise InteractionFormatError(f"{path}: line {line}: {len(row)} fields, expected "
                                                 f"{len(columns)} ({','.join(columns)})", "malformed row")
                key = _track_key(path, line, row[0], pedestrian)
                frame = _integer(path, line, "frame_id", row[1])
                ts = _integer(path, line, "timestamp_ms", row[2])
                agent_type = row[3].strip().lower()
                if not agent_type:
                    raise _bad_row(path, line, "agent_type", row[3], "is empty")
                x, y, vx, vy = (_number(path, line, n, row[k]) for k, n in zip(range(4, 8), columns[4:8]))
                for name, raw, v in (("x", row[4], x), ("y", row[5], y)):
                    if abs(v) > pmax:
                        raise _bad_row(path, line, name, raw, f"is beyond {pmax:g} m "
                                                              "(validators.odometry.max_abs_position_m)")
                speed = math.hypot(vx, vy)
                if speed > vmax:
                    name, raw = ("vx", row[6]) if abs(vx) >= abs(vy) else ("vy", row[7])
                    raise _bad_row(path, line, name, raw, f"a speed of {speed:.6g} m/s (vx {row[6]!r}, vy "
                                                          f"{row[7]!r}) is beyond {vmax:g} m/s "
                                                          "(validators.objects.max_speed_m_s)")
                if pedestrian:
                    yaw, length, width = math.nan, math.nan, math.nan
                else:
                    yaw = _number(path, line, "psi_rad", row[8])
                    if abs(yaw) > 2.0 * math.pi + 1e-6:
                        raise _bad_row(path, line, "psi_rad", row[8], "is not a heading in [-2 pi, 2 pi]")
                    length = _number(path, line, "length", row[9])
                    width = _number(path, line, "width", row[10])
                    for name, raw, v in (("length", row[9], length), ("width", row[10], width)):
                        if not size_min <= v <= size_max[name]:
                            raise _bad_row(path, line, name, raw,
                                           f"is outside [{size_min:g}, {size_max[name]:g}] m "
                                           f"(validators.objects)")
                track = rows.get(key)
                if track is None:
                    track = rows[key] = {"raw_id": row[0].strip(), "type": agent_type, "length": length,
                                         "width": width, "rows": []}
                elif track["rows"][-1][0] >= frame:
                    prev = track["rows"][-1]
                    raise _bad_row(path, line, "frame_id", row[1],
                                   f"is not after the frame_id {prev[0]} of track {row[0].strip()}'s "
                                   f"previous row (line {prev[-1]}): a track's frames must increase")
                track["rows"].append((frame, ts, x, y, vx, vy, yaw, line))
        except csv.Error as exc:
            raise InteractionFormatError(f"{path}: line {reader.line_num}: not readable as CSV ({exc})",
                                         "malformed row") from exc
        except UnicodeDecodeError as exc:
            raise InteractionFormatError(f"{path}: not a UTF-8 text file ({exc})", "malformed row") from exc
    if not rows:
        raise InteractionFormatError(f"{path}: holds no track rows", "malformed row")
    return rows


def _frame_step_ms(path: Path, groups: list[dict[int, dict[str, list]]], tolerance: float) -> float:
    """The file's frame step (ms) from timestamp_ms against frame_id; every row must keep to it within
    ``tolerance`` of a step (the row that does not is named)."""
    ratios, offsets = [], []
    for rows in groups:
        for track in rows.values():
            a = np.asarray([(r[0], r[1]) for r in track["rows"]], np.float64)
            if len(a) > 1:
                ratios.append(np.diff(a[:, 1]) / np.diff(a[:, 0]))
    step = float(np.median(np.concatenate(ratios))) if ratios else 100.0  # the format's 10 Hz
    if not step > 0.0:
        raise InteractionFormatError(f"{path}: timestamp_ms does not increase with frame_id", "malformed row")
    for rows in groups:
        for track in rows.values():
            offsets += [r[1] - step * r[0] for r in track["rows"]]
    offset = float(np.median(offsets))
    for g, rows in enumerate(groups):
        for track in rows.values():
            for r in track["rows"]:
                expected = offset + step * r[0]
                if abs(r[1] - expected) > tolerance * step:
                    where = path if g == 0 else track.get("path", path)
                    raise InteractionFormatError(
                        f"{where}: line {r[-1]}: timestamp_ms {r[1]!r}: does not match frame_id {r[0]} "
                        f"(expected {expected:.0f} ms at {step:g} ms a frame)", "malformed row")
    return step


def _pedestrian_kind(agent_type: str, speed: np.ndarray) -> int:
    if agent_type == _VRU_COMBINED:
        return AGENT_CYCLIST if float(np.median(speed)) >= CYCLIST_MIN_MEDIAN_SPEED else AGENT_PEDESTRIAN
    return _TYPE_MAP.get(agent_type, AGENT_PEDESTRIAN)


def _velocity_heading(vx: np.ndarray, vy: np.ndarray) -> np.ndarray:
    """Heading of the velocity where it is fast enough to tell, else the nearest such heading (0 when the
    agent never moves)."""
    moving = np.hypot(vx, vy) >= _HEADING_MIN_SPEED
    if not moving.any():
        return np.zeros(len(vx))
    idx = np.flatnonzero(moving)
    nearest = idx[np.clip(np.searchsorted(idx, np.arange(len(vx)), side="right") - 1, 0, None)]
    nearest = np.where(np.arange(len(vx)) < idx[0], idx[0], nearest)
    return np.arctan2(vy[nearest], vx[nearest])


def heading_along_motion(yaw: np.ndarray, vx: np.ndarray, vy: np.ndarray) -> np.ndarray:
    """A vehicle track's logged heading ``yaw``, turned by pi when most of its frames at
    :data:`REVERSING_MAX_SPEED` or faster move against it (the heading is then mislabelled, not the car
    reversing); else as logged."""
    fast = np.hypot(vx, vy) >= REVERSING_MAX_SPEED
    if not fast.any():
        return yaw
    against = (vx * np.cos(yaw) + vy * np.sin(yaw))[fast] < 0.0
    return wrap_angle(yaw + np.pi) if float(against.mean()) > 0.5 else yaw


def _make_track(key: int, rec: dict[str, Any], pedestrian: bool, sizes: dict[str, Any]) -> Track:
    a = np.asarray([r[:7] for r in rec["rows"]], np.float64)
    lines = np.asarray([r[-1] for r in rec["rows"]], np.int64)
    vx, vy = a[:, 4], a[:, 5]
    if pedestrian:
        kind = _pedestrian_kind(rec["type"], np.hypot(vx, vy))
        size_key = "cyclist" if kind == AGENT_CYCLIST else "pedestrian"
        length, width = (float(v) for v in sizes[size_key])
        yaw = _velocity_heading(vx, vy)
    else:
        kind = _TYPE_MAP.get(rec["type"], AGENT_OTHER)
        length, width = float(rec["length"]), float(rec["width"])
        yaw = heading_along_motion(wrap_angle(a[:, 6]), vx, vy)
    return Track(agent_id=key, raw_id=rec["raw_id"], agent_type=rec["type"], frames=a[:, 0].astype(np.int64),
                 timestamps_ms=a[:, 1].astype(np.int64), x=a[:, 2], y=a[:, 3], vx=vx, vy=vy,
                 yaw=np.asarray(yaw, np.float64), length=length, width=width, lines=lines, kind=kind,
                 from_pedestrian_file=pedestrian)


def _check_jumps(path: Path, track: Track, step_ms: float, params: dict[str, Any]) -> None:
    """No step between consecutive rows of a track faster than any road user moves."""
    if len(track.frames) < 2:
        return
    vmax = float(require(params, "validators.objects.max_speed_m_s"))
    margin = float(require(params, "validators.odometry.jump_margin_m"))
    gap_s = np.diff(track.frames) * step_ms / 1000.0
    dist = np.hypot(np.diff(track.x), np.diff(track.y))
    bad = np.flatnonzero(dist > vmax * gap_s + margin)
    if len(bad):
        i = int(bad[0]) + 1
        raise InteractionFormatError(
            f"{path}: line {int(track.lines[i])}: x {float(track.x[i])!r}, y {float(track.y[i])!r}: "
            f"{dist[i - 1]:.1f} m from track {track.raw_id}'s previous row (line "
            f"{int(track.lines[i - 1])}) in {gap_s[i - 1]:g} s, faster than {vmax:g} m/s "
            "(validators.objects.max_speed_m_s)",
            "malformed row")


def pedestrian_file_of(path: str | os.PathLike) -> Path | None:
    """``pedestrian_tracks_NNN.csv`` beside ``vehicle_tracks_NNN.csv``, if it exists."""
    path = Path(path)
    m = _FILE_NUMBER.match(path.stem)
    if m is None or not path.stem.startswith("vehicle_"):
        return None
    other = path.with_name(f"pedestrian_tracks_{m.group(1)}{path.suffix}")
    return other if other.is_file() else None


def read_track_file(path: str | os.PathLike, params: dict[str, Any], lane_map: LaneMap | None = None
                    ) -> TrackFile:
    """The road users of the vehicle track file ``path`` and of its pedestrian file (``params``:
    params/bev.yaml, sim.yaml and validators.yaml as loaded, merged; ``lane_map``: the location's map,
    to check that every position lies on its scene). Raises :class:`InteractionFormatError` naming the
    file, the line, the field and its value at the first malformed row."""
    path = Path(path)
    if not path.is_file():
        raise InteractionFormatError(f"{path}: no such track file", "malformed row")
    vehicles = _read_rows(path, False, params)
    ped_path = pedestrian_file_of(path)
    pedestrians = _read_rows(ped_path, True, params) if ped_path is not None else {}
    for rec in pedestrians.values():
        rec["path"] = ped_path
    step_ms = _frame_step_ms(path, [vehicles, pedestrians],
                             float(require(params, "adapters.log_step_tolerance")))
    sizes = require(params, "adapters.default_box_sizes")
    m = _FILE_NUMBER.match(path.stem)
    out = TrackFile(path=path, location=path.parent.name, number=m.group(1) if m else path.stem,
                    dt=step_ms / 1000.0, pedestrian_path=ped_path)
    for pedestrian, rows in ((False, vehicles), (True, pedestrians)):
        for key, rec in rows.items():
            out.tracks[key] = _make_track(key, rec, pedestrian, sizes)
    if lane_map is not None:
        _check_on_scene(out, lane_map)
    for track in out.tracks.values():
        _check_jumps(ped_path if track.from_pedestrian_file else path, track, step_ms, params)
    return out


# --------------------------------------------------------------------------------------------------
# the map
# --------------------------------------------------------------------------------------------------
def find_map(path: str | os.PathLike) -> Path:
    """The Lanelet2 map of the track file ``path``: ``<root>/maps/<location>.osm`` for
    ``<root>/recorded_trackfiles/<location>/<file>``, else ``<location>.osm`` or the only ``.osm`` beside
    the file. :class:`InteractionFormatError` (reason ``missing map``) names the places looked at."""
    path = Path(path)
    location = path.parent.name
    looked = []
    if len(path.parents) >= 3:
        candidate = path.parents[2] / "maps" / f"{location}.osm"
        if candidate.is_file():
            return candidate
        looked.append(str(candidate))
    beside = path.parent / f"{location}.osm"
    if beside.is_file():
        return beside
    looked.append(str(beside))
    others = sorted(p for p in path.parent.glob("*.osm") if p.is_file())
    if len(others) == 1:
        return others[0]
    several = f"; {len(others)} other .osm files beside it, none named {location}.osm" if others else ""
    raise InteractionFormatError(f"{path}: missing map: no Lanelet2 map of location {location!r} at "
                                 f"{' or '.join(looked)}{several}", "missing map")


@functools.lru_cache(maxsize=8)
def _cached_map(path: str, mtime_ns: int, size: int, fallback_speed: float):
    from rad2_datasets.adapters.lanelet2_map import load_lanelet2

    params = {"adapters": {"default_speed_limits": {"default": fallback_speed}}}
    lane_map = load_lanelet2(path, origin=MAP_ORIGIN, projector=MAP_PROJECTOR, params=params).lane_map
    return lane_map, _drivable_area(lane_map)


def _drivable_area(lane_map: LaneMap):
    import shapely
    from shapely.geometry import Polygon

    polys = [Polygon(p).buffer(0) for p in lane_map.drivable_areas if len(p) >= 3]
    area = shapely.unary_union(polys)
    shapely.prepare(area)
    return area


def load_location_map(map_path: str | os.PathLike, params: dict[str, Any]):
    """(LaneMap, drivable area as a shapely geometry) of a location's map, read once per process."""
    from rad2_datasets.adapters.lanelet2_map import Lanelet2MapError

    p = Path(map_path)
    st = p.stat()
    try:
        return _cached_map(str(p.resolve()), st.st_mtime_ns, st.st_size,
                           float(require(params, "adapters.default_speed_limits.default")))
    except Lanelet2MapError as exc:
        raise InteractionFormatError(f"map: {exc}", "missing map") from exc


def _check_on_scene(tf: TrackFile, lane_map: LaneMap) -> None:
    """Every logged position within :data:`MAP_MARGIN_M` of the map's lanes (the row that is not, named)."""
    pts = np.concatenate(lane_map.centerlines)
    lo, hi = pts.min(axis=0) - MAP_MARGIN_M, pts.max(axis=0) + MAP_MARGIN_M
    for track in tf.tracks.values():
        out = (track.x < lo[0]) | (track.x > hi[0]) | (track.y < lo[1]) | (track.y > hi[1])
        if out.any():
            i = int(np.flatnonzero(out)[0])
            where = tf.pedestrian_path if track.from_pedestrian_file else tf.path
            name = "x" if not lo[0] <= track.x[i] <= hi[0] else "y"
            value = float(track.x[i] if name == "x" else track.y[i])
            raise InteractionFormatError(
                f"{where}: line {int(track.lines[i])}: {name} {value!r}: the point ({track.x[i]:.6g}, "
                f"{track.y[i]:.6g}) is more than {MAP_MARGIN_M:g} m outside the map's lanes "
                f"(x {pts[:, 0].min():.0f}..{pts[:, 0].max():.0f}, y {pts[:, 1].min():.0f}.."
                f"{pts[:, 1].max():.0f} m)", "malformed row")


# --------------------------------------------------------------------------------------------------
# egos
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EgoWindow:
    """A promoted ego and the frames of its clip (``start`` .. ``stop`` - 1, indices into its track), or
    why it cannot give one (``refusal``: (reason, message))."""

    track_id: int
    start: int
    stop: int
    travel_m: float
    refusal: tuple[str, str] | None = None


def _runs(mask: np.ndarray, frames: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) index runs where ``mask`` holds over consecutive frames."""
    out, start = [], None
    for i in range(len(mask)):
        if mask[i] and start is None:
            start = i
        if start is not None and (not mask[i] or (i + 1 < len(mask) and frames[i + 1] != frames[i] + 1)):
            out.append((start, i + 1 if mask[i] else i))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def _ego_window(track: Track, on_lanes: np.ndarray, dt: float, clip_frames: int, min_frames: int,
                margin: float) -> EgoWindow:
    n = len(track.frames)
    if n < min_frames:
        return EgoWindow(track.agent_id, 0, n, 0.0, (
            "track too short", f"track too short for a clip: logged {(n - 1) * dt:.1f} s, a clip needs "
                               f"{(min_frames - 1) * dt:g} s (adapters.corpus_ego.min_duration_s)"))
    step = np.hypot(np.diff(track.x), np.diff(track.y))
    cum = np.concatenate([[0.0], np.cumsum(step)])
    best: tuple[int, float, int] | None = None  # (window frames, travel, start): the largest wins
    for lo, hi in _runs(on_lanes, track.frames):
        if hi - lo < min_frames:
            continue
        w = min(hi - lo, clip_frames)
        for s in sorted({*range(lo, hi - w + 1, WINDOW_STRIDE), hi - w}):
            travel = float(cum[s + w - 1] - cum[s])
            if best is None or (w, travel) > best[:2]:  # ties: the earliest
                best = (w, travel, s)
    if best is None:
        off = np.flatnonzero(~on_lanes)
        i = int(off[0])
        if not on_lanes.any():
            what = f"none of its {n} logged positions is on the map's lanelets"
        else:
            longest = max(hi - lo for lo, hi in _runs(on_lanes, track.frames))
            what = (f"on the map's lanelets for at most {(longest - 1) * dt:.1f} s in a row, a clip needs "
                    f"{(min_frames - 1) * dt:g} s")
        return EgoWindow(track.agent_id, 0, n, 0.0, (
            "off every lane", f"off every lane: {what} (within sim.offroad_margin_m {margin:g} m); e.g. "
                              f"frame {int(track.frames[i])} at ({track.x[i]:.1f}, {track.y[i]:.1f})"))
    return EgoWindow(track.agent_id, best[2], best[2] + best[0], best[1])


def _qualifies(track: Track, criteria: dict[str, Any]) -> bool:
    """A vehicle of passenger-car type and size that moves (``adapters.promoted_ego``)."""
    if track.from_pedestrian_file or track.agent_type not in EGO_TYPES:
        return False
    lo, hi = (float(v) for v in criteria["length_m"])
    if not lo <= track.length <= hi:
        return False
    lo, hi = (float(v) for v in criteria["width_m"])
    if not lo <= track.width <= hi:
        return False
    reach = np.hypot(track.x - track.x[0], track.y - track.y[0])
    return float(reach.max()) >= float(criteria["min_travel_m"])


def _others_in(tf: TrackFile, ego: Track, f0: int, f1: int) -> list[tuple[Track, np.ndarray]]:
    """The other road users logged within frames [f0, f1): (track, indices of those rows)."""
    out = []
    for track in tf.tracks.values():
        if track.agent_id == ego.agent_id or track.frames[-1] < f0 or track.frames[0] >= f1:
            continue
        idx = np.flatnonzero((track.frames >= f0) & (track.frames < f1))
        if len(idx):
            out.append((track, idx))
    return out


def _overlap(tf: TrackFile, ego: Track, win: EgoWindow) -> str | None:
    """Where the ego's logged box overlaps another road user's in its window (replayed as the ego, the
    log itself would collide)."""
    frames = ego.frames[win.start:win.stop]
    f0 = int(frames[0])
    pos = {int(f): k for k, f in enumerate(frames)}
    n = len(ego.x)
    ego_box = np.stack([ego.x, ego.y, ego.yaw, np.full(n, ego.length), np.full(n, ego.width)],
                       axis=-1)[win.start:win.stop]
    for track, idx in _others_in(tf, ego, f0, int(frames[-1]) + 1):
        both = [(k, pos[int(track.frames[i])]) for k, i in enumerate(idx) if int(track.frames[i]) in pos]
        if not both:
            continue
        rows = idx[[k for k, _ in both]]
        theirs = np.stack([track.x[rows], track.y[rows], track.yaw[rows], np.full(len(rows), track.length),
                           np.full(len(rows), track.width)], axis=-1)
        hit = np.flatnonzero(boxes_overlap(ego_box[[j for _, j in both]], theirs))
        if len(hit):
            return f"its logged box overlaps track {track.raw_id} at frame {int(track.frames[rows[hit[0]]])}"
    return None


def rank_egos(tf: TrackFile, area, params: dict[str, Any], clip_s: float = CLIP_S) -> list[EgoWindow]:
    """The tracks that may be promoted to ego, best first, each with its clip window: qualifying
    vehicles (:func:`_qualifies`) whose window is fine first (longest window, then farthest travelled,
    then smallest track id), then those that cannot give a clip (too short, off the lanelets) by track
    length, each with its refusal. A window whose straight-line travel is under
    ``adapters.promoted_ego.min_travel_m`` (a car parked for the whole of it) does not qualify. Egos
    whose logged box overlaps another road user's are left out when the clips are made
    (:func:`iter_interaction_clips`)."""
    import shapely

    criteria = require(params, "adapters.promoted_ego")
    margin = float(require(params, "sim.offroad_margin_m"))
    min_frames = int(round(float(require(params, "adapters.corpus_ego.min_duration_s")) / tf.dt)) + 1
    clip_frames = max(int(round(clip_s / tf.dt)), min_frames)
    fine, refused = [], []
    for track in tf.tracks.values():
        if not _qualifies(track, criteria):
            continue
        inside = shapely.contains_xy(area, track.x, track.y)
        if not inside.all():
            near = shapely.dwithin(area, shapely.points(track.x[~inside], track.y[~inside]), margin)
            inside[~inside] = near
        win = _ego_window(track, inside, tf.dt, clip_frames, min_frames, margin)
        if win.refusal is None:
            i, j = win.start, win.stop - 1
            if math.hypot(track.x[j] - track.x[i], track.y[j] - track.y[i]) < float(criteria["min_travel_m"]):
                continue
            fine.append(win)
        else:
            refused.append(win)
    fine.sort(key=lambda w: (-(w.stop - w.start), -w.travel_m, w.track_id))
    refused.sort(key=lambda w: (-len(tf.tracks[w.track_id].frames), w.track_id))
    return fine + refused


# --------------------------------------------------------------------------------------------------
# clips
# --------------------------------------------------------------------------------------------------
def clip_id_of(tf: TrackFile, ego: Track, start_ms: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in f"{tf.location}_{tf.number}")
    return f"interaction_{safe}_ego{ego.agent_id}_t{start_ms}"


def ego_clip(tf: TrackFile, lane_map: LaneMap, win: EgoWindow, params: dict[str, Any]) -> Clip:
    """The clip of ``win`` (a window of :func:`rank_egos`): the ego's track over the window, every other
    road user logged in it as an agent, the route matched to the lanelets (RouteError when none follows
    the ego)."""
    ego = tf.tracks[win.track_id]
    sl = slice(win.start, win.stop)
    frames = ego.frames[sl]
    f0, num = int(frames[0]), int(frames[-1]) - int(frames[0]) + 1
    if num != len(frames):
        raise InteractionFormatError(f"{tf.path}: ego track {ego.raw_id}: its frames have gaps", "invalid")
    heading = np.stack([np.cos(ego.yaw[sl]), np.sin(ego.yaw[sl])], axis=-1)
    moving_back = np.sum(np.stack([ego.vx[sl], ego.vy[sl]], axis=-1) * heading, axis=-1) < 0.0
    speed = np.hypot(ego.vx[sl], ego.vy[sl]) * np.where(moving_back, -1.0, 1.0)
    others = _others_in(tf, ego, f0, f0 + num)
    n = len(others)
    ax, ay, ayaw, avx, avy = (np.zeros((n, num)) for _ in range(5))
    valid = np.zeros((n, num), dtype=bool)
    for i, (track, idx) in enumerate(others):
        j = track.frames[idx] - f0
        ax[i, j], ay[i, j], ayaw[i, j] = track.x[idx], track.y[idx], track.yaw[idx]
        avx[i, j], avy[i, j] = track.vx[idx], track.vy[idx]
        valid[i, j] = True
    start_ms = int(ego.timestamps_ms[win.start])
    agents = {
        "agent_ids": [t.agent_id for t, _ in others],
        "agent_types": [t.kind for t, _ in others],
        "agent_length": [t.length for t, _ in others],
        "agent_width": [t.width for t, _ in others],
        "agent_x": ax, "agent_y": ay, "agent_yaw": ayaw, "agent_vx": avx, "agent_vy": avy,
        "agent_valid": valid,
    }
    metadata = {
        "dataset": "INTERACTION",
        "location": tf.location,
        "track_file": tf.path.name,
        "ego_track_id": int(ego.agent_id),
        "promoted_ego": True,
        "start_frame": f0,
        "start_timestamp_ms": start_ms,
        "licence": "INTERACTION dataset terms: non-commercial research, no redistribution",
    }
    return logged_clip(
        params, lane_map, clip_id=clip_id_of(tf, ego, start_ms), source="interaction",
        scenario_id=f"{tf.location}/{tf.path.stem}", dt=tf.dt, ego_x=ego.x[sl], ego_y=ego.y[sl],
        ego_yaw=ego.yaw[sl], ego_speed=speed, ego_length=ego.length, ego_width=ego.width, agents=agents,
        metadata=metadata)


def open_track_file(path: str | os.PathLike, params: dict[str, Any]):
    """(TrackFile, LaneMap, drivable area) of the vehicle track file ``path`` with its location's map,
    every row checked (on the map's scene too)."""
    path = Path(path)
    lane_map, area = load_location_map(find_map(path), params)
    return read_track_file(path, params, lane_map), lane_map, area


def iter_interaction_clips(path: str | os.PathLike, params: dict[str, Any], *, egos_per_scenario: int = 1,
                           errors: list[str] | None = None, clip_s: float = CLIP_S,
                           ego_track_ids: list[int] | None = None) -> Iterator[Clip]:
    """The clips of the vehicle track file ``path``: one per promoted ego, the best
    ``egos_per_scenario`` of :func:`rank_egos` (or the tracks ``ego_track_ids``), each through
    :func:`rad2_datasets.adapters.logs.plausible_clip`. A file that does not convert raises
    :class:`InteractionFormatError`; an ego that does not is appended to ``errors`` (its message names
    the file, the ego and the reason) or, without a list, raises."""
    from rad2_datasets.adapters.logs import plausible_clip

    path = Path(path)
    tf, lane_map, area = open_track_file(path, params)
    ranked = rank_egos(tf, area, params, clip_s)
    if ego_track_ids is not None:
        by_id = {w.track_id: w for w in ranked}
        missing = [t for t in ego_track_ids if t not in by_id]
        if missing:
            raise InteractionFormatError(
                f"{path}: ego tracks {missing}: not vehicles that may be promoted to ego "
                f"(adapters.promoted_ego: a moving car of passenger-car size)", "no ego")
        ranked = [by_id[t] for t in ego_track_ids]
        quota = len(ranked)
    else:
        quota = egos_per_scenario
    if not ranked:
        raise InteractionFormatError(
            f"{path}: no ego: no track is a moving car of passenger-car size (adapters.promoted_ego)",
            "no ego")
    attempted = 0
    overlaps: list[str] = []
    for win in ranked:
        if attempted >= quota:
            break
        ego = tf.tracks[win.track_id]
        overlap = None if win.refusal is not None or ego_track_ids is not None else _overlap(tf, ego, win)
        if overlap is not None:  # not promotable, as NGSIM vehicles whose boxes overlap (a filter)
            overlaps.append(f"track {ego.raw_id}: {overlap}")
            continue
        attempted += 1
        t0 = float(ego.timestamps_ms[win.start]) / 1000.0
        who = f"{path}: ego track {ego.raw_id} (from {t0:.1f} s)"
        try:
            if win.refusal is not None:
                raise InteractionFormatError(f"{who}: {win.refusal[1]}", win.refusal[0])
            try:
                clip = ego_clip(tf, lane_map, win, params)
            except RouteError as exc:
                raise InteractionFormatError(f"{who}: route: {exc}", "route") from exc
            except ClipValidationError as exc:
                raise InteractionFormatError(f"{who}: invalid clip: {exc}", "invalid") from exc
            try:
                clip = plausible_clip(clip, who, params)
            except InteractionFormatError:
                raise
            except LogFormatError as exc:
                raise InteractionFormatError(str(exc), "implausible") from exc
        except InteractionFormatError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        yield replace(clip, metadata={**clip.metadata, "ego_rank": attempted})
    if attempted == 0:
        raise InteractionFormatError(f"{path}: no ego: the logged box of every moving car overlaps another "
                                     f"road user's ({'; '.join(overlaps[:3])})", "no ego")


def load_interaction_clip(path: str | os.PathLike, params: dict[str, Any], ego_track_id: int | None = None,
                          clip_s: float = CLIP_S) -> Clip:
    """One clip of the vehicle track file ``path``: with ``ego_track_id`` that track as the ego, else the
    best-ranked ego."""
    ids = None if ego_track_id is None else [int(ego_track_id)]
    for clip in iter_interaction_clips(path, params, egos_per_scenario=1, clip_s=clip_s, ego_track_ids=ids):
        return clip
    raise InteractionFormatError(f"{path}: no clip", "no ego")  # pragma: no cover - raised above


__all__ = ["CLIP_S", "EgoWindow", "InteractionFormatError", "PEDESTRIAN_COLUMNS", "Track", "TrackFile",
           "VEHICLE_COLUMNS", "clip_id_of", "ego_clip", "find_map", "iter_interaction_clips",
           "load_interaction_clip", "load_location_map", "open_track_file", "pedestrian_file_of", "rank_egos",
           "read_track_file", "track_file_kind"]
