"""Logged driving scenes ("clips"): the :class:`Clip` data model, its queries and its validation.

A :class:`Clip` is 10-20 s of a scene sampled every ``dt`` seconds: the ego's logged track, the
other agents' tracks (with validity masks), the lane map (a :class:`~rad2_core.lane_map.LaneMap`,
shared between clips of the same road network), the ego's route, the map signals' states and
JSON-able metadata. Everything is in the world frame (x east, y north, metres, radians CCW from +x);
poses are box centres. See ``docs/conventions.md`` for the contract.
Agent entries where ``agent_valid`` is False carry no meaning (adapters write zeros).
Reading and writing clips and datasets is :mod:`rad2_core.storage`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rad2_core.field_checks import SAFE_ID, ClipValidationError, check_array
from rad2_core.geometry import wrap_angle
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_UNKNOWN, LaneMap

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

_YAW_TOL = 1e-6


def _check_wrapped(name: str, yaw: np.ndarray, mask=None) -> None:
    vals = yaw if mask is None else yaw[mask]
    if vals.size and (np.any(vals <= -math.pi - _YAW_TOL) or np.any(vals > math.pi + _YAW_TOL)):
        worst = vals[np.argmax(np.abs(vals))]
        raise ClipValidationError(f"{name}: value {worst:.6f} rad is not wrapped to (-pi, pi]")



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
        if not isinstance(self.clip_id, str) or not SAFE_ID.match(self.clip_id):
            raise ClipValidationError(
                f"clip_id: {self.clip_id!r} must be a non-empty string of letters, digits, '_', '-', '.'"
            )
        if not isinstance(self.dt, int | float) or not math.isfinite(self.dt) or self.dt <= 0:
            raise ClipValidationError(f"dt: {self.dt!r} must be a positive finite number of seconds")
        if not isinstance(self.num_steps, int | np.integer) or self.num_steps < 1:
            raise ClipValidationError(f"num_steps: {self.num_steps!r} must be a positive integer")
        t = int(self.num_steps)
        for name in _EGO_TRACKS:
            check_array(name, getattr(self, name), (t,), f"T={t}")
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
        check_array("agent_types", self.agent_types, (n,), f"N={n}")
        if n and (self.agent_types.min() < 0 or self.agent_types.max() > AGENT_OTHER):
            raise ClipValidationError(
                f"agent_types: values must be in 0..3, got {sorted(set(self.agent_types.tolist()))}"
            )
        for name in ("agent_length", "agent_width"):
            arr = check_array(name, getattr(self, name), (n,), f"N={n}")
            if n and np.any(arr <= 0):
                raise ClipValidationError(f"{name}: value {arr.min()} is not a positive size")
        check_array("agent_valid", self.agent_valid, (n, t), f"N={n}, T={t}", finite=False)
        if self.agent_valid.dtype != bool:
            raise ClipValidationError(f"agent_valid: dtype {self.agent_valid.dtype} is not bool")
        for name in _AGENT_TRACKS:
            check_array(name, getattr(self, name), (n, t), f"N={n}, T={t}", finite_mask=self.agent_valid)
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
        check_array("route_polyline", rp, rp.shape, "Pr, 2")
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
            check_array("signal_states", self.signal_states, (s_count, t), f"S={s_count}, T={t}",
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

