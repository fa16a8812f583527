"""Logged driving scenes ("clips") and their lane-level maps: the data model, validation and storage.

A :class:`Clip` is 10-20 s of a scene sampled every ``dt`` seconds: the ego's logged track, the
other agents' tracks (with validity masks), the lane map (a :class:`LaneMap`, shared between clips
of the same road network), the ego's route and JSON-able metadata. Everything is in the world
frame (x east, y north, metres, radians CCW from +x); poses are box centres. See
``docs/conventions.md`` for the contract.

On disk a dataset is a directory::

    index.json              {"format_version": 1, "clips": [{clip_id, file, map_id, kind, ...}]}
    clips/<clip_id>.npz     compressed arrays, ``format_version`` and ``map_id``
    maps/<map_id>.npz       each map once (``map_id`` is a content hash)

World coordinates are stored as float32 offsets from a per-file float64 origin (millimetre-level
precision even for UTM-sized coordinates); the ego track is stored in float64.
Agent entries where ``agent_valid`` is False carry no meaning (adapters write zeros).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rad2_core.geometry import wrap_angle

FORMAT_VERSION = 1
MAP_FORMAT_VERSION = 1

# Agent type constants, identical to rad2_msgs/AgentState.
AGENT_VEHICLE = 0
AGENT_PEDESTRIAN = 1
AGENT_CYCLIST = 2
AGENT_OTHER = 3
AGENT_TYPE_NAMES = {
    AGENT_VEHICLE: "vehicle",
    AGENT_PEDESTRIAN: "pedestrian",
    AGENT_CYCLIST: "cyclist",
    AGENT_OTHER: "other",
}

# Traffic-signal states, identical to rad2_msgs/TrafficSignal (arrows and flashing map onto these:
# a flashing red is a stop sign, a flashing yellow is caution; adapters document their mapping).
SIGNAL_UNKNOWN = 0
SIGNAL_RED = 1
SIGNAL_YELLOW = 2
SIGNAL_GREEN = 3
SIGNAL_STATE_NAMES = {SIGNAL_UNKNOWN: "unknown", SIGNAL_RED: "red", SIGNAL_YELLOW: "yellow",
                      SIGNAL_GREEN: "green"}
# which of two states a lane controlled by both must obey (the higher)
SIGNAL_RESTRICTIVENESS = {SIGNAL_UNKNOWN: 0, SIGNAL_GREEN: 1, SIGNAL_YELLOW: 2, SIGNAL_RED: 3}
# "no neighbour" in LaneMap.left_neighbors / right_neighbors (never a valid lane id)
NO_LANE = -1

_YAW_TOL = 1e-6
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ClipValidationError(ValueError):
    """A clip or map is inconsistent; the message starts with the offending field's name."""


class ClipFormatError(ValueError):
    """A file on disk is not a clip/map/dataset this code can read (wrong or unknown version...)."""


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------
def _shape_str(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + (",)" if len(shape) == 1 else ")")


def _check_array(name: str, value, shape: tuple, dims: str, finite_mask=None, finite=True) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ClipValidationError(f"{name}: expected a numpy array, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ClipValidationError(f"{name}: shape {_shape_str(value.shape)} does not match ({dims})")
    if finite and value.dtype.kind == "f":
        vals = value if finite_mask is None else value[finite_mask]
        if not np.all(np.isfinite(vals)):
            bad = np.argwhere(~np.isfinite(value) & (True if finite_mask is None else finite_mask))[0]
            raise ClipValidationError(f"{name}: non-finite value {value[tuple(bad)]} at index {tuple(bad)}")
    return value


def _check_polylines(name: str, polys, min_points: int, count: int | None = None) -> None:
    if not isinstance(polys, list | tuple):
        raise ClipValidationError(f"{name}: expected a list of [K, 2] arrays, got {type(polys).__name__}")
    if count is not None and len(polys) != count:
        raise ClipValidationError(f"{name}: has {len(polys)} entries, expected {count} (one per lane)")
    for i, p in enumerate(polys):
        if not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[1] != 2:
            shape = getattr(p, "shape", None)
            raise ClipValidationError(f"{name}[{i}]: expected a [K, 2] array, got shape {shape}")
        if p.shape[0] < min_points:
            raise ClipValidationError(f"{name}[{i}]: has {p.shape[0]} points, needs at least {min_points}")
        if not np.all(np.isfinite(p)):
            raise ClipValidationError(f"{name}[{i}]: contains non-finite coordinates")


def _check_wrapped(name: str, yaw: np.ndarray, mask=None) -> None:
    vals = yaw if mask is None else yaw[mask]
    if vals.size and (np.any(vals <= -math.pi - _YAW_TOL) or np.any(vals > math.pi + _YAW_TOL)):
        worst = vals[np.argmax(np.abs(vals))]
        raise ClipValidationError(f"{name}: value {worst:.6f} rad is not wrapped to (-pi, pi]")


def _lane_refs(values) -> np.ndarray:
    """Lane ids with None for "no lane" -> int64 array with NO_LANE."""
    return np.array([NO_LANE if v is None else int(v) for v in values], dtype=np.int64).reshape(-1)


# ----------------------------------------------------------------------------------------------
# LaneMap
# ----------------------------------------------------------------------------------------------
@dataclass
class LaneMap:
    """A lane-level map in the world frame. Lane ``k`` is described by index ``k`` of every list."""

    map_id: str
    lane_ids: np.ndarray  # [L] int64
    centerlines: list[np.ndarray]  # [Pi, 2]
    left_boundaries: list[np.ndarray]  # [Qi, 2]
    right_boundaries: list[np.ndarray]  # [Qi, 2]
    speed_limits: np.ndarray  # [L] m/s
    successors: list[list[int]]  # lane ids
    drivable_areas: list[np.ndarray] = field(default_factory=list)  # [Ki, 2] polygons
    crosswalks: list[np.ndarray] = field(default_factory=list)  # [Ki, 2] polygons
    # Lane adjacency (same direction of travel): the neighbour's lane id or NO_LANE, and whether a lane
    # change into it is allowed (dashed marking / routing-graph "lane change" relation). Empty arrays:
    # the source has no adjacency (old maps); otherwise one entry per lane.
    left_neighbors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [L] or [0]
    right_neighbors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lane_change_left: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    lane_change_right: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # Traffic signals: signal s controls the lanes signal_lanes[s] (lane ids) and traffic stops before
    # signal_stop_lines[s] ([K >= 2, 2] polyline across those lanes). Their states per step are in
    # Clip.signal_states (a map is shared by clips, states are not).
    signal_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [S]
    signal_lanes: list[list[int]] = field(default_factory=list)
    signal_stop_lines: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        lane_ids,
        centerlines,
        left_boundaries,
        right_boundaries,
        speed_limits,
        successors,
        drivable_areas=(),
        crosswalks=(),
        map_id: str | None = None,
        left_neighbors=(),
        right_neighbors=(),
        lane_change_left=(),
        lane_change_right=(),
        signal_ids=(),
        signal_lanes=(),
        signal_stop_lines=(),
    ) -> LaneMap:
        """Construct with normalised dtypes; ``map_id`` defaults to the content hash. Neighbours may
        be given as lane ids with ``None`` or NO_LANE for "none"."""
        m = cls(
            map_id="",
            lane_ids=np.asarray(lane_ids, dtype=np.int64).reshape(-1),
            centerlines=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in centerlines],
            left_boundaries=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in left_boundaries],
            right_boundaries=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in right_boundaries],
            speed_limits=np.asarray(speed_limits, dtype=np.float64).reshape(-1),
            successors=[[int(s) for s in succ] for succ in successors],
            drivable_areas=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in drivable_areas],
            crosswalks=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in crosswalks],
            left_neighbors=_lane_refs(left_neighbors),
            right_neighbors=_lane_refs(right_neighbors),
            lane_change_left=np.asarray(lane_change_left, dtype=bool).reshape(-1),
            lane_change_right=np.asarray(lane_change_right, dtype=bool).reshape(-1),
            signal_ids=np.asarray(signal_ids, dtype=np.int64).reshape(-1),
            signal_lanes=[[int(v) for v in lanes] for lanes in signal_lanes],
            signal_stop_lines=[np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in signal_stop_lines],
        )
        m.map_id = map_id if map_id is not None else m.content_hash()
        return m

    @property
    def has_adjacency(self) -> bool:
        return len(self.left_neighbors) > 0

    @property
    def num_signals(self) -> int:
        return int(len(self.signal_ids))

    def lane_signal_states(self, signal_states) -> np.ndarray:
        """[L] int8 state (SIGNAL_*) of the light controlling each lane, in ``lane_ids`` order.

        ``signal_states`` ([S], rows of ``signal_ids``; None: not known). A lane no signal controls is
        SIGNAL_UNKNOWN; a lane two signals control takes the more restrictive state (red over yellow over
        green), because that is the one the driver must obey.
        """
        out = np.zeros(len(self.lane_ids), np.int8)
        if signal_states is None or not self.num_signals:
            return out
        states = np.asarray(signal_states).reshape(-1)
        if len(states) != self.num_signals:
            raise ClipValidationError(
                f"signal_states: {len(states)} values for the map's {self.num_signals} signals")
        bad = ~np.isin(states, list(SIGNAL_RESTRICTIVENESS))
        if bad.any():
            raise ClipValidationError(f"signal_states: unknown state {int(states[bad][0])} (expected one of "
                                      f"{sorted(SIGNAL_STATE_NAMES)})")
        # (signal, lane) pairs as flat arrays: vectorised, since the BEV and the tokens ask every frame
        counts = [len(lanes) for lanes in self.signal_lanes]
        signal_of = np.repeat(np.arange(len(counts)), counts)
        controlled = np.array([lid for lanes in self.signal_lanes for lid in lanes], np.int64)
        order = np.argsort(self.lane_ids, kind="stable")
        at = np.clip(np.searchsorted(self.lane_ids[order], controlled), 0, len(order) - 1)
        known = self.lane_ids[order][at] == controlled
        rank_of_state = np.zeros(max(SIGNAL_RESTRICTIVENESS) + 1, np.int8)
        state_of_rank = np.zeros(max(SIGNAL_RESTRICTIVENESS.values()) + 1, np.int8)
        for state, rank in SIGNAL_RESTRICTIVENESS.items():
            rank_of_state[state], state_of_rank[rank] = rank, state
        rank = np.zeros(len(self.lane_ids), np.int8)
        np.maximum.at(rank, order[at[known]], rank_of_state[states.astype(np.int64)[signal_of[known]]])
        return state_of_rank[rank]

    def neighbor(self, lane_id: int, side: str) -> int | None:
        """The left or right neighbour's lane id (``side`` "left"/"right"), or None."""
        if not self.has_adjacency:
            return None
        k = self.lane_index().get(int(lane_id))
        if k is None:
            raise KeyError(f"lane id {lane_id} is not in map {self.map_id}")
        v = int((self.left_neighbors if side == "left" else self.right_neighbors)[k])
        return None if v == NO_LANE else v

    @property
    def num_lanes(self) -> int:
        return int(len(self.lane_ids))

    def content_hash(self) -> str:
        """16-hex-digit SHA-256 of the map's content (coordinates quantised to millimetres)."""
        h = hashlib.sha256()

        def add_polys(tag: str, polys) -> None:
            h.update(tag.encode())
            h.update(np.int64(len(polys)).tobytes())
            for p in polys:
                q = np.round(np.asarray(p, dtype=np.float64) * 1000.0).astype(np.int64)
                h.update(np.int64(len(q)).tobytes())
                h.update(q.tobytes())

        h.update(np.asarray(self.lane_ids, dtype=np.int64).tobytes())
        add_polys("c", self.centerlines)
        add_polys("l", self.left_boundaries)
        add_polys("r", self.right_boundaries)
        h.update(np.round(np.asarray(self.speed_limits, dtype=np.float64) * 1000).astype(np.int64).tobytes())
        h.update(json.dumps([list(map(int, s)) for s in self.successors]).encode())
        add_polys("d", self.drivable_areas)
        add_polys("x", self.crosswalks)
        # only maps that have them hash the new fields, so the ids of older maps stay what they were
        if self.has_adjacency:
            h.update(b"adj")
            for a in (self.left_neighbors, self.right_neighbors):
                h.update(np.asarray(a, np.int64).tobytes())
            for a in (self.lane_change_left, self.lane_change_right):
                h.update(np.asarray(a, bool).tobytes())
        if self.num_signals:
            h.update(b"sig")
            h.update(np.asarray(self.signal_ids, np.int64).tobytes())
            h.update(json.dumps([list(map(int, s)) for s in self.signal_lanes]).encode())
            add_polys("s", self.signal_stop_lines)
        return h.hexdigest()[:16]

    def lane_index(self) -> dict[int, int]:
        """lane id -> index into the per-lane lists."""
        return {int(lid): k for k, lid in enumerate(self.lane_ids)}

    def validate(self) -> None:
        if not isinstance(self.map_id, str) or not _SAFE_ID.match(self.map_id or ""):
            raise ClipValidationError(f"map.map_id: {self.map_id!r} is not a non-empty file-name-safe string")
        if not isinstance(self.lane_ids, np.ndarray) or self.lane_ids.ndim != 1:
            raise ClipValidationError(
                f"map.lane_ids: expected a [L] array, got shape {getattr(self.lane_ids, 'shape', None)}"
            )
        n = len(self.lane_ids)
        if n == 0:
            raise ClipValidationError("map.lane_ids: the map has no lanes (L=0)")
        if self.lane_ids.dtype.kind not in "iu":
            raise ClipValidationError(f"map.lane_ids: dtype {self.lane_ids.dtype} is not integer")
        if len(np.unique(self.lane_ids)) != n:
            raise ClipValidationError("map.lane_ids: contains duplicate ids")
        _check_polylines("map.centerlines", self.centerlines, 2, n)
        _check_polylines("map.left_boundaries", self.left_boundaries, 2, n)
        _check_polylines("map.right_boundaries", self.right_boundaries, 2, n)
        _check_array("map.speed_limits", self.speed_limits, (n,), f"L={n}")
        if np.any(self.speed_limits <= 0):
            raise ClipValidationError(f"map.speed_limits: value {self.speed_limits.min()} is not positive")
        if not isinstance(self.successors, list) or len(self.successors) != n:
            raise ClipValidationError(
                f"map.successors: has {len(self.successors)} entries, expected {n} (one per lane)"
            )
        known = set(int(v) for v in self.lane_ids)
        for k, succ in enumerate(self.successors):
            for s in succ:
                if int(s) not in known:
                    raise ClipValidationError(f"map.successors[{k}]: lane id {s} is not in map.lane_ids")
        _check_polylines("map.drivable_areas", self.drivable_areas, 3)
        _check_polylines("map.crosswalks", self.crosswalks, 3)
        if NO_LANE in known:
            raise ClipValidationError(f"map.lane_ids: {NO_LANE} is reserved for 'no neighbour'")
        adj = (self.left_neighbors, self.right_neighbors, self.lane_change_left, self.lane_change_right)
        names = ("map.left_neighbors", "map.right_neighbors", "map.lane_change_left", "map.lane_change_right")
        if any(len(a) for a in adj):
            for name, a in zip(names, adj):
                _check_array(name, a, (n,), f"L={n}", finite=False)
            for name, a in zip(names[:2], adj[:2]):
                for k, v in enumerate(a):
                    if int(v) != NO_LANE and int(v) not in known:
                        raise ClipValidationError(f"{name}[{k}]: lane id {int(v)} is not in map.lane_ids")
                    if int(v) == int(self.lane_ids[k]):
                        raise ClipValidationError(f"{name}[{k}]: lane {int(v)} is its own neighbour")
            for name, allowed, nb in zip(names[2:], adj[2:], adj[:2]):
                bad = np.flatnonzero(np.asarray(allowed, bool) & (np.asarray(nb) == NO_LANE))
                if len(bad):
                    raise ClipValidationError(f"{name}[{int(bad[0])}]: a lane change is allowed but there is "
                                              "no neighbour on that side")
        s_count = len(self.signal_ids)
        if not isinstance(self.signal_ids, np.ndarray) or self.signal_ids.ndim != 1:
            raise ClipValidationError(
                f"map.signal_ids: expected a [S] array, got {type(self.signal_ids).__name__}")
        if len(np.unique(self.signal_ids)) != s_count:
            raise ClipValidationError("map.signal_ids: contains duplicate ids")
        if len(self.signal_lanes) != s_count:
            raise ClipValidationError(
                f"map.signal_lanes: has {len(self.signal_lanes)} entries, expected {s_count} "
                "(one per signal)")
        for k, lanes in enumerate(self.signal_lanes):
            if not lanes:
                raise ClipValidationError(
                    f"map.signal_lanes[{k}]: signal {int(self.signal_ids[k])} controls no lane")
            for lid in lanes:
                if int(lid) not in known:
                    raise ClipValidationError(f"map.signal_lanes[{k}]: lane id {lid} is not in map.lane_ids")
        _check_polylines("map.signal_stop_lines", self.signal_stop_lines, 2, s_count)


# ----------------------------------------------------------------------------------------------
# Clip
# ----------------------------------------------------------------------------------------------
@dataclass
class AgentsAt:
    """Valid agents at one step (world frame)."""

    ids: np.ndarray
    types: np.ndarray
    length: np.ndarray
    width: np.ndarray
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    index: np.ndarray  # row indices into the clip's agent arrays

    def __len__(self) -> int:
        return int(len(self.ids))


_AGENT_TRACKS = ("agent_x", "agent_y", "agent_yaw", "agent_vx", "agent_vy")
_EGO_TRACKS = ("ego_x", "ego_y", "ego_yaw", "ego_speed", "ego_accel")


@dataclass
class Clip:
    clip_id: str
    dt: float
    num_steps: int
    ego_x: np.ndarray
    ego_y: np.ndarray
    ego_yaw: np.ndarray
    ego_speed: np.ndarray
    ego_accel: np.ndarray
    ego_length: float
    ego_width: float
    agent_ids: np.ndarray
    agent_types: np.ndarray
    agent_length: np.ndarray
    agent_width: np.ndarray
    agent_x: np.ndarray
    agent_y: np.ndarray
    agent_yaw: np.ndarray
    agent_vx: np.ndarray
    agent_vy: np.ndarray
    agent_valid: np.ndarray
    map: LaneMap
    route_lane_ids: np.ndarray
    route_polyline: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    # [S, T] int8 state of map signal s at step t (SIGNAL_*); None: the log has no signal states
    # (every signal unknown). Rows follow map.signal_ids.
    signal_states: np.ndarray | None = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        *,
        clip_id: str,
        dt: float,
        ego_x,
        ego_y,
        ego_yaw,
        ego_speed,
        ego_accel,
        ego_length: float,
        ego_width: float,
        agent_ids,
        agent_types,
        agent_length,
        agent_width,
        agent_x,
        agent_y,
        agent_yaw,
        agent_vx,
        agent_vy,
        agent_valid,
        map: LaneMap,
        route_lane_ids,
        route_polyline,
        metadata: dict | None = None,
        signal_states=None,
    ) -> Clip:
        """Construct with canonical dtypes (float64 tracks, int64 ids, int8 types, bool mask)."""
        f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
        ego_x = f64(ego_x).reshape(-1)
        t = len(ego_x)
        n = len(np.asarray(agent_ids).reshape(-1))

        def track(a):
            a = f64(a)
            return a.reshape(n, t) if a.size == n * t else a

        valid = np.asarray(agent_valid, dtype=bool)
        return cls(
            clip_id=str(clip_id),
            dt=float(dt),
            num_steps=int(t),
            ego_x=ego_x,
            ego_y=f64(ego_y),
            ego_yaw=f64(ego_yaw),
            ego_speed=f64(ego_speed),
            ego_accel=f64(ego_accel),
            ego_length=float(ego_length),
            ego_width=float(ego_width),
            agent_ids=np.asarray(agent_ids, dtype=np.int64).reshape(-1),
            agent_types=np.asarray(agent_types, dtype=np.int8).reshape(-1),
            agent_length=f64(agent_length).reshape(-1),
            agent_width=f64(agent_width).reshape(-1),
            agent_x=track(agent_x),
            agent_y=track(agent_y),
            agent_yaw=track(agent_yaw),
            agent_vx=track(agent_vx),
            agent_vy=track(agent_vy),
            agent_valid=valid.reshape(n, t) if valid.size == n * t else valid,
            map=map,
            route_lane_ids=np.asarray(route_lane_ids, dtype=np.int64).reshape(-1),
            route_polyline=f64(route_polyline),
            metadata=dict(metadata or {}),
            signal_states=None if signal_states is None else np.asarray(signal_states, dtype=np.int8),
        )

    # -- convenience --------------------------------------------------------------------------
    @property
    def num_agents(self) -> int:
        return int(len(self.agent_ids))

    @property
    def duration_s(self) -> float:
        """Time spanned by the samples: (T - 1) * dt."""
        return max(self.num_steps - 1, 0) * self.dt

    def _check_step(self, t: int) -> int:
        t = int(t)
        if not 0 <= t < self.num_steps:
            raise IndexError(f"step {t} outside clip {self.clip_id!r} with {self.num_steps} steps")
        return t

    def ego_pose(self, t: int) -> np.ndarray:
        """Ego (x, y, yaw) at step ``t``."""
        t = self._check_step(t)
        return np.array([self.ego_x[t], self.ego_y[t], self.ego_yaw[t]])

    def ego_poses(self) -> np.ndarray:
        """[T, 3] ego poses."""
        return np.stack([self.ego_x, self.ego_y, self.ego_yaw], axis=-1)

    def signals_at(self, t: int) -> np.ndarray:
        """[S] int8 state of each map signal at step ``t`` (all SIGNAL_UNKNOWN without logged states)."""
        t = self._check_step(t)
        if self.signal_states is None:
            return np.zeros(self.map.num_signals, np.int8)
        return self.signal_states[:, t].copy()

    def agents_at(self, t: int) -> AgentsAt:
        """States of the agents valid at step ``t``."""
        t = self._check_step(t)
        idx = np.flatnonzero(self.agent_valid[:, t]) if self.num_agents else np.zeros(0, dtype=np.int64)
        return AgentsAt(
            ids=self.agent_ids[idx],
            types=self.agent_types[idx],
            length=self.agent_length[idx],
            width=self.agent_width[idx],
            x=self.agent_x[idx, t],
            y=self.agent_y[idx, t],
            yaw=self.agent_yaw[idx, t],
            vx=self.agent_vx[idx, t],
            vy=self.agent_vy[idx, t],
            index=idx,
        )

    def slice(self, start: int, stop: int) -> Clip:
        """Steps [start, stop) as a new clip; agents never valid inside the window are dropped."""
        start, stop = int(start), int(stop)
        if not (0 <= start < stop <= self.num_steps):
            raise IndexError(f"slice [{start}, {stop}) invalid for clip with {self.num_steps} steps")
        keep = self.agent_valid[:, start:stop].any(axis=1) if self.num_agents else np.zeros(0, bool)
        sub = {k: getattr(self, k)[keep, start:stop].copy() for k in _AGENT_TRACKS + ("agent_valid",)}
        ego = {k: getattr(self, k)[start:stop].copy() for k in _EGO_TRACKS}
        meta = dict(self.metadata)
        meta["sliced_from"] = {"clip_id": self.clip_id, "start": start, "stop": stop}
        return replace(
            self,
            clip_id=f"{self.clip_id}_s{start}-{stop}",
            num_steps=stop - start,
            **ego,
            **sub,
            agent_ids=self.agent_ids[keep].copy(),
            agent_types=self.agent_types[keep].copy(),
            agent_length=self.agent_length[keep].copy(),
            agent_width=self.agent_width[keep].copy(),
            metadata=meta,
            signal_states=None if self.signal_states is None else self.signal_states[:, start:stop].copy(),
        )

    def resample(self, dt: float) -> Clip:
        """The same log at time step ``dt`` (s): every track linearly interpolated in time (headings
        along the shorter arc), an agent valid at a new step only when both logged steps around it
        are, acceleration taken again from the resampled speed. Logs come at 0.04 s (CommonRoad
        highD/NGSIM), 0.1 s (AV2, WOMD) or other rates; the simulator steps at one rate, so every
        adapter hands it clips at that rate instead of a replay at the wrong speed."""
        dt = float(dt)
        if not (math.isfinite(dt) and dt > 0.0):
            raise ClipValidationError(f"resample dt: must be a finite number > 0, got {dt!r}")
        if abs(dt - self.dt) <= 1e-9 * max(dt, self.dt):
            return self
        duration = (self.num_steps - 1) * self.dt
        n = int(math.floor(duration / dt + 1e-6)) + 1
        if n < 2:
            raise ClipValidationError(
                f"resample dt: {dt} s leaves fewer than 2 steps of clip {self.clip_id!r} ({duration:.3f} s)")
        pos = np.arange(n) * dt / self.dt  # fractional index into the log
        i0 = np.minimum(np.floor(pos + 1e-9).astype(np.int64), self.num_steps - 1)
        i1 = np.minimum(i0 + 1, self.num_steps - 1)
        f = np.clip(pos - i0, 0.0, 1.0)

        def lerp(a: np.ndarray) -> np.ndarray:
            return a[..., i0] + f * (a[..., i1] - a[..., i0])

        def slerp(a: np.ndarray) -> np.ndarray:
            return wrap_angle(a[..., i0] + f * wrap_angle(a[..., i1] - a[..., i0]))

        ego = {k: (slerp if k == "ego_yaw" else lerp)(getattr(self, k)) for k in _EGO_TRACKS}
        ego["ego_accel"] = np.gradient(ego["ego_speed"], dt) if n > 1 else np.zeros(n)
        agents = {k: (slerp if k == "agent_yaw" else lerp)(getattr(self, k)) for k in _AGENT_TRACKS}
        valid = self.agent_valid[:, i0] & (self.agent_valid[:, i1] | (f < 1e-9))
        for k in _AGENT_TRACKS:
            agents[k] = np.where(valid, agents[k], 0.0)
        meta = dict(self.metadata)
        meta["resampled_from_dt"] = self.dt
        # a light does not interpolate: each new step shows the last logged state at or before it
        signals = None if self.signal_states is None else self.signal_states[:, i0].copy()
        return replace(self, dt=dt, num_steps=n, **ego, **agents, agent_valid=valid, metadata=meta,
                       signal_states=signals).validate()

    def select_agents(self, keep) -> Clip:
        """The same clip with only the agents selected by ``keep`` (a bool mask [N] or indices)."""
        names = ("agent_ids", "agent_types", "agent_length", "agent_width", *_AGENT_TRACKS, "agent_valid")
        return replace(self, **{k: getattr(self, k)[keep] for k in names})

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> Clip:
        """Raise :class:`ClipValidationError` naming the first inconsistent field; return self."""
        if not isinstance(self.clip_id, str) or not _SAFE_ID.match(self.clip_id):
            raise ClipValidationError(
                f"clip_id: {self.clip_id!r} must be a non-empty string of letters, digits, '_', '-', '.'"
            )
        if not isinstance(self.dt, int | float) or not math.isfinite(self.dt) or self.dt <= 0:
            raise ClipValidationError(f"dt: {self.dt!r} must be a positive finite number of seconds")
        if not isinstance(self.num_steps, int | np.integer) or self.num_steps < 1:
            raise ClipValidationError(f"num_steps: {self.num_steps!r} must be a positive integer")
        t = int(self.num_steps)
        for name in _EGO_TRACKS:
            _check_array(name, getattr(self, name), (t,), f"T={t}")
        _check_wrapped("ego_yaw", self.ego_yaw)
        for name in ("ego_length", "ego_width"):
            v = getattr(self, name)
            if not isinstance(v, int | float | np.floating) or not math.isfinite(v) or v <= 0:
                raise ClipValidationError(f"{name}: {v!r} must be a positive finite length in metres")
        if not isinstance(self.agent_ids, np.ndarray) or self.agent_ids.ndim != 1:
            raise ClipValidationError(
                f"agent_ids: expected a [N] array, got shape {getattr(self.agent_ids, 'shape', None)}"
            )
        n = len(self.agent_ids)
        if self.agent_ids.dtype.kind not in "iu":
            raise ClipValidationError(f"agent_ids: dtype {self.agent_ids.dtype} is not integer")
        if len(np.unique(self.agent_ids)) != n:
            raise ClipValidationError("agent_ids: contains duplicate ids")
        _check_array("agent_types", self.agent_types, (n,), f"N={n}")
        if n and (self.agent_types.min() < 0 or self.agent_types.max() > AGENT_OTHER):
            raise ClipValidationError(
                f"agent_types: values must be in 0..3, got {sorted(set(self.agent_types.tolist()))}"
            )
        for name in ("agent_length", "agent_width"):
            arr = _check_array(name, getattr(self, name), (n,), f"N={n}")
            if n and np.any(arr <= 0):
                raise ClipValidationError(f"{name}: value {arr.min()} is not a positive size")
        _check_array("agent_valid", self.agent_valid, (n, t), f"N={n}, T={t}", finite=False)
        if self.agent_valid.dtype != bool:
            raise ClipValidationError(f"agent_valid: dtype {self.agent_valid.dtype} is not bool")
        for name in _AGENT_TRACKS:
            _check_array(name, getattr(self, name), (n, t), f"N={n}, T={t}", finite_mask=self.agent_valid)
        _check_wrapped("agent_yaw", self.agent_yaw, self.agent_valid)
        if not isinstance(self.map, LaneMap):
            raise ClipValidationError(f"map: expected a LaneMap, got {type(self.map).__name__}")
        self.map.validate()
        if not isinstance(self.route_lane_ids, np.ndarray) or self.route_lane_ids.ndim != 1:
            raise ClipValidationError(
                "route_lane_ids: expected a [R] array, got shape"
                f" {getattr(self.route_lane_ids, 'shape', None)}"
            )
        if len(self.route_lane_ids) == 0:
            raise ClipValidationError("route_lane_ids: the route is empty (R=0)")
        known = set(int(v) for v in self.map.lane_ids)
        for lid in self.route_lane_ids:
            if int(lid) not in known:
                raise ClipValidationError(f"route_lane_ids: lane id {int(lid)} is not in map.lane_ids")
        rp = self.route_polyline
        if not isinstance(rp, np.ndarray) or rp.ndim != 2 or rp.shape[1] != 2 or rp.shape[0] < 2:
            raise ClipValidationError(
                f"route_polyline: shape {getattr(rp, 'shape', None)} is not [Pr >= 2, 2]"
            )
        _check_array("route_polyline", rp, rp.shape, "Pr, 2")
        if not isinstance(self.metadata, dict):
            raise ClipValidationError(f"metadata: expected a dict, got {type(self.metadata).__name__}")
        try:
            json.dumps(self.metadata)
        except (TypeError, ValueError) as exc:
            raise ClipValidationError(f"metadata: not JSON-serialisable ({exc})") from exc
        if "source" not in self.metadata:
            raise ClipValidationError("metadata: missing required key 'source'")
        if self.signal_states is not None:
            s_count = self.map.num_signals
            _check_array("signal_states", self.signal_states, (s_count, t), f"S={s_count}, T={t}",
                         finite=False)
            if self.signal_states.dtype.kind not in "iu":
                raise ClipValidationError(f"signal_states: dtype {self.signal_states.dtype} is not integer")
            if self.signal_states.size and (self.signal_states.min() < SIGNAL_UNKNOWN
                                            or self.signal_states.max() > SIGNAL_GREEN):
                raise ClipValidationError(
                    f"signal_states: values must be in 0..3 (unknown, red, yellow, green), got "
                    f"{sorted(set(self.signal_states.ravel().tolist()))}")
        return self

    @property
    def scenario_kind(self) -> str:
        return str(self.metadata.get("scenario_kind", "unknown"))


# ----------------------------------------------------------------------------------------------
# (de)serialisation
# ----------------------------------------------------------------------------------------------
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
