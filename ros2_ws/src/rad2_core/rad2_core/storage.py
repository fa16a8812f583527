"""Reading and writing clips, lane maps and datasets (``.npz`` files and a dataset's ``index.json``).

On disk a dataset is a directory::

    index.json              {"format_version": 1, "clips": [{clip_id, file, map_id, kind, ...}]}
    clips/<clip_id>.npz     compressed arrays, ``format_version`` and ``map_id``
    maps/<map_id>.npz       each map once (``map_id`` is a content hash)

A single clip file may instead embed its map. World coordinates are stored as float32 offsets from a
per-file float64 origin (millimetre-level precision even for UTM-sized coordinates); the ego track is
stored in float64. Every reader turns a missing, truncated, foreign or wrong-version file into a
:class:`ClipFormatError` naming the file.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rad2_core.clip import Clip
from rad2_core.field_checks import ClipValidationError
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import LaneMap

FORMAT_VERSION = 1
MAP_FORMAT_VERSION = 1


class ClipFormatError(ValueError):
    """A file on disk is not a clip/map/dataset this code can read (wrong or unknown version...)."""



def _pack_polys(polys: Sequence[np.ndarray], origin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(polys) == 0:
        return np.zeros((0, 2), np.float32), np.zeros(1, np.int64)
    lens = np.array([len(p) for p in polys], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pts = np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in polys]) - origin
    return pts.astype(np.float32), offsets


def _unpack_polys(pts: np.ndarray, offsets: np.ndarray, origin: np.ndarray) -> list[np.ndarray]:
    full = pts.astype(np.float64) + origin
    return [full[offsets[i] : offsets[i + 1]].copy() for i in range(len(offsets) - 1)]


def _map_origin(m: LaneMap) -> np.ndarray:
    pts = [p for p in m.centerlines if len(p)]
    if not pts:
        return np.zeros(2)
    return np.round(np.concatenate(pts).mean(axis=0), 0)


def _map_arrays(m: LaneMap, prefix: str = "") -> dict[str, np.ndarray]:
    origin = _map_origin(m)
    out: dict[str, np.ndarray] = {
        "map_format_version": np.int64(MAP_FORMAT_VERSION),
        "map_id": np.array(m.map_id),
        "origin": origin,
        "lane_ids": np.asarray(m.lane_ids, np.int64),
        "speed_limits": np.asarray(m.speed_limits, np.float32),
    }
    for key, polys in (
        ("cl", m.centerlines),
        ("lb", m.left_boundaries),
        ("rb", m.right_boundaries),
        ("da", m.drivable_areas),
        ("cw", m.crosswalks),
    ):
        out[f"{key}_pts"], out[f"{key}_off"] = _pack_polys(polys, origin)
    lens = np.array([len(s) for s in m.successors], dtype=np.int64)
    out["succ_off"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    out["succ"] = np.array([int(v) for s in m.successors for v in s], dtype=np.int64)
    # optional parts (absent keys read back as "none"; files of older maps load unchanged)
    if m.has_adjacency:
        out["left_nb"] = np.asarray(m.left_neighbors, np.int64)
        out["right_nb"] = np.asarray(m.right_neighbors, np.int64)
        out["lc_left"] = np.asarray(m.lane_change_left, bool)
        out["lc_right"] = np.asarray(m.lane_change_right, bool)
    if m.num_signals:
        out["sig_ids"] = np.asarray(m.signal_ids, np.int64)
        lens = np.array([len(v) for v in m.signal_lanes], dtype=np.int64)
        out["sig_lanes_off"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        out["sig_lanes"] = np.array([int(v) for lanes in m.signal_lanes for v in lanes], dtype=np.int64)
        out["sig_sl_pts"], out["sig_sl_off"] = _pack_polys(m.signal_stop_lines, origin)
    return {prefix + k: v for k, v in out.items()}


def _map_from_arrays(z, prefix: str = "", where: str = "") -> LaneMap:
    def get(k):
        return z[prefix + k]

    def has(k):
        return prefix + k in z

    version = int(get("map_format_version"))
    if version != MAP_FORMAT_VERSION:
        raise ClipFormatError(
            f"{where}: map_format_version {version} is not supported (this code reads {MAP_FORMAT_VERSION})"
        )
    origin = get("origin").astype(np.float64)
    succ, succ_off = get("succ"), get("succ_off")
    return LaneMap(
        map_id=str(get("map_id")),
        lane_ids=get("lane_ids").astype(np.int64),
        centerlines=_unpack_polys(get("cl_pts"), get("cl_off"), origin),
        left_boundaries=_unpack_polys(get("lb_pts"), get("lb_off"), origin),
        right_boundaries=_unpack_polys(get("rb_pts"), get("rb_off"), origin),
        speed_limits=get("speed_limits").astype(np.float64),
        successors=[
            succ[succ_off[i] : succ_off[i + 1]].astype(int).tolist() for i in range(len(succ_off) - 1)
        ],
        drivable_areas=_unpack_polys(get("da_pts"), get("da_off"), origin),
        crosswalks=_unpack_polys(get("cw_pts"), get("cw_off"), origin),
        **_optional_map_parts(get, has, origin),
    )


def _optional_map_parts(get, has, origin: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if has("left_nb"):
        out.update(left_neighbors=get("left_nb").astype(np.int64),
                   right_neighbors=get("right_nb").astype(np.int64),
                   lane_change_left=get("lc_left").astype(bool),
                   lane_change_right=get("lc_right").astype(bool))
    if has("sig_ids"):
        off, lanes = get("sig_lanes_off"), get("sig_lanes")
        out.update(signal_ids=get("sig_ids").astype(np.int64),
                   signal_lanes=[lanes[off[i]:off[i + 1]].astype(int).tolist() for i in range(len(off) - 1)],
                   signal_stop_lines=_unpack_polys(get("sig_sl_pts"), get("sig_sl_off"), origin))
    return out


def save_map(lane_map: LaneMap, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **_map_arrays(lane_map))
    return path


# What a truncated, corrupted or foreign .npz raises inside NumPy; the loaders turn it into an error
# naming the file (and keep ClipFormatError / ClipValidationError, which name it already).
_UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def load_map(path: str | os.PathLike) -> LaneMap:
    path = Path(path)
    if not path.is_file():
        raise ClipFormatError(f"map file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "map_format_version" not in z:
                raise ClipFormatError(f"{path}: not a rad2 map file (no map_format_version)")
            return _map_from_arrays(z, where=str(path))
    except (ClipFormatError, ClipValidationError):
        raise
    except _UNREADABLE as exc:
        raise ClipFormatError(f"{path}: unreadable map file ({type(exc).__name__}: {exc})") from exc


def _clip_arrays(clip: Clip) -> dict[str, np.ndarray]:
    origin = np.round(np.array([clip.ego_x.mean(), clip.ego_y.mean()]), 0) if clip.num_steps else np.zeros(2)
    valid = clip.agent_valid

    def rel(a, o):
        return np.where(valid, a - o, 0.0).astype(np.float32)

    return {
        "format_version": np.int64(FORMAT_VERSION),
        "clip_id": np.array(clip.clip_id),
        "map_id": np.array(clip.map.map_id),
        "dt": np.float64(clip.dt),
        "origin": origin,
        "ego_x": clip.ego_x,
        "ego_y": clip.ego_y,
        "ego_yaw": clip.ego_yaw,
        "ego_speed": clip.ego_speed.astype(np.float32),
        "ego_accel": clip.ego_accel.astype(np.float32),
        "ego_size": np.array([clip.ego_length, clip.ego_width]),
        "agent_ids": clip.agent_ids.astype(np.int64),
        "agent_types": clip.agent_types.astype(np.int8),
        "agent_length": clip.agent_length.astype(np.float32),
        "agent_width": clip.agent_width.astype(np.float32),
        "agent_x": rel(clip.agent_x, origin[0]),
        "agent_y": rel(clip.agent_y, origin[1]),
        "agent_yaw": np.where(valid, clip.agent_yaw, 0.0).astype(np.float32),
        "agent_vx": np.where(valid, clip.agent_vx, 0.0).astype(np.float32),
        "agent_vy": np.where(valid, clip.agent_vy, 0.0).astype(np.float32),
        "agent_valid": valid.astype(bool),
        "route_lane_ids": clip.route_lane_ids.astype(np.int64),
        "route_polyline": (clip.route_polyline - origin).astype(np.float32),
        "metadata": np.array(json.dumps(clip.metadata, sort_keys=True)),
        **({} if clip.signal_states is None else {"signal_states": clip.signal_states.astype(np.int8)}),
    }


def _clip_from_arrays(z, lane_map: LaneMap, where: str) -> Clip:
    origin = z["origin"].astype(np.float64)
    valid = z["agent_valid"].astype(bool)
    f64 = lambda k: z[k].astype(np.float64)  # noqa: E731
    yaw = np.where(valid, wrap_angle(f64("agent_yaw")), 0.0)
    size = z["ego_size"]
    return Clip(
        clip_id=str(z["clip_id"]),
        dt=float(z["dt"]),
        num_steps=int(len(z["ego_x"])),
        ego_x=f64("ego_x"),
        ego_y=f64("ego_y"),
        ego_yaw=f64("ego_yaw"),
        ego_speed=f64("ego_speed"),
        ego_accel=f64("ego_accel"),
        ego_length=float(size[0]),
        ego_width=float(size[1]),
        agent_ids=z["agent_ids"].astype(np.int64),
        agent_types=z["agent_types"].astype(np.int8),
        agent_length=f64("agent_length"),
        agent_width=f64("agent_width"),
        agent_x=np.where(valid, f64("agent_x") + origin[0], 0.0),
        agent_y=np.where(valid, f64("agent_y") + origin[1], 0.0),
        agent_yaw=yaw,
        agent_vx=f64("agent_vx"),
        agent_vy=f64("agent_vy"),
        agent_valid=valid,
        map=lane_map,
        route_lane_ids=z["route_lane_ids"].astype(np.int64),
        route_polyline=f64("route_polyline") + origin,
        metadata=json.loads(str(z["metadata"])),
        signal_states=z["signal_states"].astype(np.int8) if "signal_states" in z else None,
    )


def _check_version(z, path) -> None:
    if "format_version" not in z:
        raise ClipFormatError(f"{path}: not a rad2 clip file (no format_version)")
    version = int(z["format_version"])
    if version != FORMAT_VERSION:
        raise ClipFormatError(
            f"{path}: format_version {version} is not supported (this code reads {FORMAT_VERSION})"
        )


def save_clip(clip: Clip, path: str | os.PathLike, embed_map: bool = True, validate: bool = True) -> Path:
    """Write one clip to ``path`` (.npz). With ``embed_map`` the map travels inside the file;
    otherwise only its ``map_id`` is stored and the map must be saved under ``maps/`` (datasets)."""
    if validate:
        clip.validate()
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_suffix(".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = _clip_arrays(clip)
    if embed_map:
        arrays.update(_map_arrays(clip.map, prefix="map__"))
    np.savez_compressed(path, **arrays)
    return path


def load_clip(
    path: str | os.PathLike,
    maps_dir: str | os.PathLike | None = None,
    map_cache: dict[str, LaneMap] | None = None,
) -> Clip:
    """Read a clip written by :func:`save_clip`. A clip without an embedded map finds it in
    ``maps_dir`` (default: ``<path>/../../maps``, the dataset layout)."""
    path = Path(path)
    if not path.is_file():
        raise ClipFormatError(f"clip file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            _check_version(z, path)
            map_id = str(z["map_id"])
            if "map__map_id" in z:
                lane_map = _map_from_arrays(z, prefix="map__", where=str(path))
            elif map_cache is not None and map_id in map_cache:
                lane_map = map_cache[map_id]
            else:
                mdir = Path(maps_dir) if maps_dir is not None else path.parent.parent / "maps"
                lane_map = load_map(mdir / f"{map_id}.npz")
                if map_cache is not None:
                    map_cache[map_id] = lane_map
            return _clip_from_arrays(z, lane_map, str(path))
    except (ClipFormatError, ClipValidationError):
        raise
    except _UNREADABLE as exc:
        raise ClipFormatError(f"{path}: unreadable clip file ({type(exc).__name__}: {exc})") from exc



# ----------------------------------------------------------------------------------------------
# datasets
# ----------------------------------------------------------------------------------------------
INDEX_FILE = "index.json"


def _index_entry(clip: Clip, file: str) -> dict[str, Any]:
    return {
        "clip_id": clip.clip_id,
        "file": file,
        "map_id": clip.map.map_id,
        "kind": clip.scenario_kind,
        "source": str(clip.metadata.get("source", "unknown")),
        "steps": int(clip.num_steps),
        "dt": float(clip.dt),
        "num_agents": clip.num_agents,
    }


def read_index(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``index.json`` of a dataset directory (version-checked)."""
    directory = Path(directory)
    path = directory / INDEX_FILE
    if not path.is_file():
        raise ClipFormatError(f"{directory}: no {INDEX_FILE}; not a rad2 dataset directory")
    try:
        with path.open() as f:
            index = json.load(f)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise ClipFormatError(f"{path}: unreadable dataset index ({type(exc).__name__}: {exc})") from exc
    version = index.get("format_version") if isinstance(index, dict) else None
    if version != FORMAT_VERSION:
        raise ClipFormatError(
            f"{path}: format_version {version!r} is not supported (this code reads {FORMAT_VERSION})"
        )
    if not isinstance(index.get("clips"), list):
        raise ClipFormatError(f"{path}: 'clips' must be a list")
    return index


def save_dataset(
    clips: Iterable[Clip],
    directory: str | os.PathLike,
    append: bool = False,
    description: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Write clips (each map once, by ``map_id``) and ``index.json``; returns the index.

    ``append`` keeps the clips already listed in an existing index (same clip_id is replaced).
    """
    directory = Path(directory)
    (directory / "clips").mkdir(parents=True, exist_ok=True)
    (directory / "maps").mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {}
    index: dict[str, Any] = {"format_version": FORMAT_VERSION}
    if append and (directory / INDEX_FILE).is_file():
        index = read_index(directory)
        entries = {e["clip_id"]: e for e in index["clips"]}
    if description is not None:
        index["description"] = description
    it: Iterable[Clip] = clips
    if progress:
        from tqdm import tqdm

        it = tqdm(clips, desc=f"saving {directory.name}", unit="clip")
    written_maps: set[str] = set()
    for clip in it:
        clip.validate()
        mid = clip.map.map_id
        if mid not in written_maps:
            mpath = directory / "maps" / f"{mid}.npz"
            if not mpath.is_file():
                save_map(clip.map, mpath)
            written_maps.add(mid)
        rel = f"clips/{clip.clip_id}.npz"
        save_clip(clip, directory / rel, embed_map=False, validate=False)
        entries[clip.clip_id] = _index_entry(clip, rel)
    index["clips"] = list(entries.values())
    kinds: dict[str, int] = {}
    for e in index["clips"]:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    index["num_clips"] = len(index["clips"])
    index["kinds"] = kinds
    tmp = directory / (INDEX_FILE + ".tmp")
    with tmp.open("w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    tmp.replace(directory / INDEX_FILE)
    return index


def iter_dataset(directory: str | os.PathLike, kinds: Sequence[str] | None = None) -> Iterator[Clip]:
    """Lazily yield the clips of a dataset in index order (maps loaded once each)."""
    directory = Path(directory)
    index = read_index(directory)
    cache: dict[str, LaneMap] = {}
    for entry in index["clips"]:
        if kinds is not None and entry.get("kind") not in kinds:
            continue
        yield load_clip(directory / entry["file"], maps_dir=directory / "maps", map_cache=cache)


def load_dataset(directory: str | os.PathLike, kinds: Sequence[str] | None = None) -> list[Clip]:
    """All clips of a dataset (optionally only the given scenario kinds)."""
    return list(iter_dataset(directory, kinds))
