"""Argoverse 2 *sensor dataset* logs -> :class:`Clip`.

A log directory holds

- ``annotations.feather``: one row per 3D cuboid and lidar sweep (timestamp_ns, track_uuid, category,
  length_m, width_m, height_m, qw, qx, qy, qz, tx_m, ty_m, tz_m, num_interior_pts), the pose given in
  the ego-vehicle frame at that sweep's timestamp;
- ``city_SE3_egovehicle.feather``: the ego pose in the city frame (timestamp_ns, qw, qx, qy, qz, tx_m,
  ty_m, tz_m) at every sensor timestamp (lidar sweeps and camera frames, so at least 10 Hz);
- ``map/log_map_archive_*.json``: the same map format as the motion-forecasting scenarios
  (:func:`rad2_datasets.adapters.av2.load_av2_map`).

The clip's steps are an even grid at the sweep rate (``adapters.av2_dt``, 10 Hz) from the first annotated
sweep to the last. Each sweep's annotations land on the grid step they are closest to (a sweep more than
``adapters.log_step_tolerance`` of a step off the grid is dropped, and a step without a sweep leaves the
agents invalid there); the ego pose is interpolated at the grid times themselves. Boxes go to the city
frame through the ego pose at their own sweep's timestamp; headings are the yaw of the box's forward (x)
axis in the city frame. Velocities are differences of the city positions along each track (central
within runs of consecutive sweeps, over the sweeps' real times; zero for a track seen in one sweep only);
the ego's from its positions on the grid. Box sizes are each track's median; the ego's is
``adapters.ego_box_size``. The clip is then resampled to ``sim.dt`` by
:func:`rad2_datasets.adapters.logged_clip`, which also matches the route (vehicle and bus lanes only).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_CYCLIST, AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.config import require
from rad2_core.field_checks import ClipValidationError
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap

from rad2_datasets.adapters import logged_clip
from rad2_datasets.adapters.av2 import AV2FormatError, load_av2_map

ANNOTATION_COLUMNS = (
    "timestamp_ns",
    "track_uuid",
    "category",
    "length_m",
    "width_m",
    "qw",
    "qx",
    "qy",
    "qz",
    "tx_m",
    "ty_m",
)
POSE_COLUMNS = ("timestamp_ns", "qw", "qx", "qy", "qz", "tx_m", "ty_m")

# AV2 sensor-dataset cuboid categories. A bicycle or motorcycle box is the vehicle alone (its rider has a
# box of their own, BICYCLIST / MOTORCYCLIST), so it is an "other" obstacle like cones and signs.
CATEGORY_MAP = {
    "REGULAR_VEHICLE": AGENT_VEHICLE,
    "LARGE_VEHICLE": AGENT_VEHICLE,
    "BUS": AGENT_VEHICLE,
    "BOX_TRUCK": AGENT_VEHICLE,
    "TRUCK": AGENT_VEHICLE,
    "TRUCK_CAB": AGENT_VEHICLE,
    "VEHICULAR_TRAILER": AGENT_VEHICLE,
    "SCHOOL_BUS": AGENT_VEHICLE,
    "ARTICULATED_BUS": AGENT_VEHICLE,
    "RAILED_VEHICLE": AGENT_VEHICLE,
    "MESSAGE_BOARD_TRAILER": AGENT_VEHICLE,
    "PEDESTRIAN": AGENT_PEDESTRIAN,
    "OFFICIAL_SIGNALER": AGENT_PEDESTRIAN,
    "WHEELCHAIR": AGENT_PEDESTRIAN,
    "STROLLER": AGENT_PEDESTRIAN,
    "BICYCLIST": AGENT_CYCLIST,
    "MOTORCYCLIST": AGENT_CYCLIST,
    "WHEELED_RIDER": AGENT_CYCLIST,
}


class AV2SensorFormatError(AV2FormatError):
    """A log directory is not a readable AV2 sensor log; the message names the file and the column."""


def _read_feather(path: Path, columns: tuple[str, ...]):
    import pandas as pd

    if not path.is_file():
        raise AV2SensorFormatError(f"{path}: missing (an AV2 sensor log directory holds {path.name})")
    try:
        df = pd.read_feather(path)
    except Exception as exc:  # pyarrow raises its own error types for every kind of damage
        raise AV2SensorFormatError(f"{path}: unreadable feather file ({type(exc).__name__}: {exc})") from exc
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise AV2SensorFormatError(f"{path}: missing columns {missing} (has {list(df.columns)})")
    for c in columns:
        if c in ("track_uuid", "category"):
            continue
        values = df[c].to_numpy()
        if values.dtype.kind not in "iuf":
            raise AV2SensorFormatError(f"{path}: column {c!r} has dtype {values.dtype}, expected numbers")
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            row = int(np.flatnonzero(~np.isfinite(values))[0])
            raise AV2SensorFormatError(f"{path}: column {c!r}: non-finite value at row {row}")
    if len(df) == 0:
        raise AV2SensorFormatError(f"{path}: no rows")
    return df


def _rotations(df, path: Path, what: str):
    from scipy.spatial.transform import Rotation

    q = df[["qx", "qy", "qz", "qw"]].to_numpy(np.float64)  # scipy takes scalar-last quaternions
    norm = np.linalg.norm(q, axis=1)
    bad = np.flatnonzero(np.abs(norm - 1.0) > 1e-3)
    if len(bad):
        raise AV2SensorFormatError(
            f"{path}: columns qw, qx, qy, qz: row {int(bad[0])} ({what}) has norm "
            f"{norm[bad[0]]:.6f}, expected a unit quaternion"
        )
    return Rotation.from_quat(q / norm[:, None])


def _yaw_of(rot) -> np.ndarray:
    """Heading in the xy plane of each rotation's forward (x) axis."""
    fwd = rot.apply(np.array([1.0, 0.0, 0.0]))
    return np.arctan2(fwd[..., 1], fwd[..., 0])


class _EgoPoses:
    """City-frame ego poses, interpolated at any time inside the logged range (slerp for rotations)."""

    def __init__(self, df, path: Path):
        from scipy.spatial.transform import Slerp

        df = df.sort_values("timestamp_ns").drop_duplicates("timestamp_ns")
        if len(df) < 2:
            raise AV2SensorFormatError(f"{path}: {len(df)} distinct timestamp_ns, need at least 2 ego poses")
        self.path = path
        self.t = df["timestamp_ns"].to_numpy(np.int64)
        self.xyz = df[["tx_m", "ty_m"]].to_numpy(np.float64)
        self.slerp = Slerp((self.t - self.t[0]).astype(np.float64), _rotations(df, path, "ego pose"))

    def at(self, t_ns: np.ndarray):
        t_ns = np.asarray(t_ns, np.int64)
        outside = (t_ns < self.t[0]) | (t_ns > self.t[-1])
        if outside.any():
            bad = int(t_ns[outside][0])
            raise AV2SensorFormatError(
                f"{self.path}: timestamp_ns: no ego pose around {bad} (poses cover "
                f"{self.t[0]} .. {self.t[-1]})"
            )
        rel = (t_ns - self.t[0]).astype(np.float64)
        xy = np.stack(
            [np.interp(rel, (self.t - self.t[0]).astype(np.float64), self.xyz[:, k]) for k in (0, 1)], axis=-1
        )
        return xy, self.slerp(rel)


def _track_velocities(steps: np.ndarray, times_s: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Velocity at each sample of one track (sorted by step): central differences over the real sweep
    times inside runs of consecutive steps; one-sided at run ends; zero for a lone sample."""
    vx, vy = np.zeros(len(steps)), np.zeros(len(steps))
    breaks = np.flatnonzero(np.diff(steps) != 1) + 1
    for run in np.split(np.arange(len(steps)), breaks):
        if len(run) >= 2:
            vx[run] = np.gradient(x[run], times_s[run])
            vy[run] = np.gradient(y[run], times_s[run])
    return vx, vy


def _track_ids(uuids: list[str], path: Path) -> list[int]:
    """Stable int64 ids: the first 60 bits of the hex uuid (AV2 track uuids are random uuid4s)."""
    out, seen = [], {}
    for u in uuids:
        hexdigits = re.sub(r"[^0-9a-fA-F]", "", u)
        if len(hexdigits) < 15:  # not a uuid: a digest, stable across processes (unlike hash())
            hexdigits = hashlib.sha1(u.encode()).hexdigest()
        tid = int(hexdigits[:15], 16)
        if tid in seen:
            raise AV2SensorFormatError(
                f"{path}: column 'track_uuid': {u!r} and {seen[tid]!r} share the id {tid}"
            )
        seen[tid] = u
        out.append(tid)
    return out


def find_sensor_log_files(log_dir: str | os.PathLike) -> tuple[Path, Path, Path]:
    """(annotations.feather, city_SE3_egovehicle.feather, map json) of a sensor log directory."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        raise AV2SensorFormatError(f"{log_dir}: not a directory (an AV2 sensor log is a directory)")
    maps = sorted((log_dir / "map").glob("log_map_archive_*.json"))
    if not maps:
        raise AV2SensorFormatError(f"{log_dir / 'map'}: no log_map_archive_*.json file")
    return log_dir / "annotations.feather", log_dir / "city_SE3_egovehicle.feather", maps[0]


def load_av2_sensor_log(
    log_dir: str | os.PathLike, params: dict[str, Any], lane_map: LaneMap | None = None
) -> Clip:
    """One AV2 sensor log directory as a validated clip at the simulator's step (see the module doc;
    ``params``: params/bev.yaml and sim.yaml as loaded, merged)."""
    dt = float(require(params, "adapters.av2_dt"))
    tolerance = float(require(params, "adapters.log_step_tolerance"))
    ego_len, ego_wid = (float(v) for v in require(params, "adapters.ego_box_size"))
    ann_path, pose_path, map_json = find_sensor_log_files(log_dir)
    ann = _read_feather(ann_path, ANNOTATION_COLUMNS)
    poses = _EgoPoses(_read_feather(pose_path, POSE_COLUMNS), pose_path)
    vehicle_lanes = None
    if lane_map is None:
        lane_map, vehicle_lanes = load_av2_map(map_json, params)

    # the step grid: sweeps on the nearest step of an even grid from the first sweep
    sweep_t = np.unique(ann["timestamp_ns"].to_numpy(np.int64))
    dt_ns = dt * 1e9
    rel = (sweep_t - sweep_t[0]) / dt_ns
    step_of_sweep = np.rint(rel).astype(np.int64)
    on_grid = np.abs(rel - step_of_sweep) <= tolerance
    # two sweeps on one step (a faster sensor, jitter): the first keeps it
    on_grid &= np.concatenate([[True], np.diff(step_of_sweep) > 0])
    num_steps = int(step_of_sweep[on_grid].max()) + 1
    if num_steps < 2:
        raise AV2SensorFormatError(
            f"{ann_path}: column 'timestamp_ns': the annotations span one sweep, a clip needs at least 2"
        )
    grid_t = sweep_t[0] + np.rint(np.arange(num_steps) * dt_ns).astype(np.int64)

    ego_xy, ego_rot = poses.at(grid_t)
    ego_yaw = wrap_angle(_yaw_of(ego_rot))
    ego_speed = np.hypot(np.gradient(ego_xy[:, 0], dt), np.gradient(ego_xy[:, 1], dt))

    # boxes to the city frame through the ego pose at their own sweep
    keep_sweep = dict(zip(sweep_t[on_grid].tolist(), step_of_sweep[on_grid].tolist()))
    ann = ann[ann["timestamp_ns"].isin(list(keep_sweep))]
    t_ns = ann["timestamp_ns"].to_numpy(np.int64)
    at_xy, at_rot = poses.at(t_ns)
    box_rot = _rotations(ann, ann_path, "annotation")
    local = ann[["tx_m", "ty_m"]].to_numpy(np.float64)
    local3 = np.concatenate([local, np.zeros((len(local), 1))], axis=1)
    city_xy = at_xy + at_rot.apply(local3)[:, :2]
    city_yaw = wrap_angle(_yaw_of(at_rot * box_rot))

    uuids = sorted(ann["track_uuid"].astype(str).unique())
    ids = _track_ids(uuids, ann_path)
    row_of = {u: i for i, u in enumerate(uuids)}
    n = len(uuids)
    shape = (n, num_steps)
    ax, ay, ayaw, avx, avy = (np.zeros(shape) for _ in range(5))
    valid = np.zeros(shape, bool)
    rows = ann["track_uuid"].astype(str).map(row_of).to_numpy()
    cols = np.array([keep_sweep[int(v)] for v in t_ns], dtype=np.int64)
    dup = np.zeros(len(rows), bool)
    order = np.lexsort((cols, rows))
    dup[order[1:]] = (rows[order[1:]] == rows[order[:-1]]) & (cols[order[1:]] == cols[order[:-1]])
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise AV2SensorFormatError(
            f"{ann_path}: columns track_uuid, timestamp_ns: track {uuids[rows[i]]!r} has two "
            f"boxes in sweep {int(t_ns[i])}"
        )
    ax[rows, cols], ay[rows, cols], ayaw[rows, cols] = city_xy[:, 0], city_xy[:, 1], city_yaw
    valid[rows, cols] = True
    lengths, widths, types = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    length_col, width_col = ann["length_m"].to_numpy(np.float64), ann["width_m"].to_numpy(np.float64)
    category = ann["category"].astype(str).str.upper().to_numpy()
    for r in range(n):
        sel = np.flatnonzero(rows == r)
        sel = sel[np.argsort(cols[sel])]
        vx, vy = _track_velocities(cols[sel], t_ns[sel] * 1e-9, city_xy[sel, 0], city_xy[sel, 1])
        avx[r, cols[sel]], avy[r, cols[sel]] = vx, vy
        lengths[r], widths[r] = np.median(length_col[sel]), np.median(width_col[sel])
        if lengths[r] <= 0 or widths[r] <= 0:
            raise AV2SensorFormatError(
                f"{ann_path}: columns length_m, width_m: track {uuids[r]!r} has a box of "
                f"{lengths[r]} x {widths[r]} m"
            )
        cats, counts = np.unique(category[sel], return_counts=True)
        types[r] = CATEGORY_MAP.get(str(cats[int(np.argmax(counts))]), AGENT_OTHER)  # the track's usual label

    log_id = Path(log_dir).resolve().name
    safe_id = re.sub(r"[^A-Za-z0-9_.\-]", "_", log_id)
    metadata = {
        "log_dt": dt,
        "sweeps": int(len(sweep_t)),
        "sweeps_off_grid": int((~on_grid).sum()),
        "steps_without_sweep": int(num_steps - on_grid.sum()),
        "track_uuids": dict(zip((str(i) for i in ids), uuids)),
        "box_sizes": "logged (median per track); ego adapters.ego_box_size",
        "speed_limits": "defaults by lane_type (params/bev.yaml adapters.default_speed_limits)",
    }
    agents = {
        "agent_ids": ids,
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
    try:
        return logged_clip(
            params,
            lane_map,
            clip_id=f"av2s_{safe_id}",
            source="av2_sensor",
            scenario_id=log_id,
            dt=dt,
            ego_x=ego_xy[:, 0],
            ego_y=ego_xy[:, 1],
            ego_yaw=ego_yaw,
            ego_speed=ego_speed,
            ego_length=ego_len,
            ego_width=ego_wid,
            agents=agents,
            metadata=metadata,
            lane_allowed=vehicle_lanes,
        )
    except ClipValidationError as exc:
        raise AV2SensorFormatError(f"{log_dir}: the converted clip is inconsistent ({exc})") from exc


__all__ = ["AV2SensorFormatError", "CATEGORY_MAP", "find_sensor_log_files", "load_av2_sensor_log"]
