"""Clips by content key, and the static arrays the simulator derives from a clip and from its map.

A :class:`~bev_warp_sim.state.SimState` names its clips by :func:`clip_key` (the clip id and a hash of
its log arrays), resolved through a process-wide registry (:func:`register_clip`,
:func:`registered_clip`), so states stay small and picklable. A simulator keeps what it derives once
per clip (:class:`ClipData`: padded agent boxes, the checked route, reactive agents' arc lengths) and
per map (:class:`MapGeometry`: the drivable area, lane headings and speed limits) in a
:class:`ClipCache`; a clip is checked for plausibility when its data is first built.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np
from rad2_core.route_path import RouteError, RouteLimits, check_route
from rad2_core.validators import PlausibilityError, check_clip, load_limits

from bev_warp_sim.state import SimulationError

_REGISTRY: OrderedDict[str, Any] = OrderedDict()
# Derived clip data a simulator keeps (least recently used dropped beyond it; rebuilt from the registry)
_CLIP_DATA_SIZE = 256


def clip_key(clip) -> str:
    """Content key of a clip: its id and a hash of its log arrays (two edits of one id never collide)."""
    h = hashlib.sha1(str(clip.clip_id).encode())
    h.update(np.float64(clip.dt).tobytes())
    for name in ("ego_x", "ego_y", "ego_yaw", "ego_speed", "agent_x", "agent_y", "agent_yaw", "agent_valid",
                 "route_polyline"):
        h.update(np.ascontiguousarray(getattr(clip, name)).tobytes())
    h.update(str(clip.map.map_id).encode())
    return f"{clip.clip_id}#{h.hexdigest()[:16]}"


def register_clip(clip, capacity: int) -> str:
    """Make ``clip`` resolvable by its key in this process (least recently used clips are dropped beyond
    ``capacity``, ``sim.clip_registry_size``); returns the key."""
    key = clip_key(clip)
    _REGISTRY[key] = clip
    _REGISTRY.move_to_end(key)
    cap = int(capacity)
    while len(_REGISTRY) > max(cap, 1):
        _REGISTRY.popitem(last=False)
    return key


def registered_clip(key: str):
    try:
        return _REGISTRY[key]
    except KeyError:
        raise SimulationError(
            f"clip_keys: {key!r} is not registered in this process (register_clip(clip) first, or raise "
            "sim.clip_registry_size)") from None


class MapGeometry:
    """Drivable area (for off-road) and lane segments (road heading for at-fault) of one map."""

    def __init__(self, lane_map, margin: float):
        import shapely

        self.area = lane_map.drivable_geometry(margin)
        if self.area is not None:
            shapely.prepare(self.area)
        segs, heads, limits = [], [], []
        for k, cl in enumerate(lane_map.centerlines):
            if len(cl) < 2:
                continue
            segs.append(np.concatenate([cl[:-1], cl[1:]], axis=1))
            d = np.diff(cl, axis=0)
            heads.append(np.arctan2(d[:, 1], d[:, 0]))
            limits.append(np.full(len(d), float(lane_map.speed_limits[k])))
        self.segments = np.concatenate(segs) if segs else np.zeros((0, 4))
        self.headings = np.concatenate(heads) if heads else np.zeros(0)
        self.speed_limits = np.concatenate(limits) if limits else np.zeros(0)

    def on_road(self, xy) -> np.ndarray:
        import shapely

        xy = np.atleast_2d(np.asarray(xy, dtype=np.float64))
        if self.area is None:
            return np.ones(len(xy), dtype=bool)
        return shapely.contains_xy(self.area, xy[:, 0], xy[:, 1])

    def nearest_segment(self, xy) -> np.ndarray:
        xy = np.atleast_2d(np.asarray(xy, dtype=np.float64))
        if len(self.segments) == 0:
            return np.full(len(xy), -1)
        a, b = self.segments[:, :2], self.segments[:, 2:]
        ab = b - a
        p = xy[:, None, :] - a
        u = np.clip(np.sum(p * ab, -1) / np.maximum(np.sum(ab * ab, -1), 1e-12), 0.0, 1.0)
        d2 = np.sum((p - u[..., None] * ab) ** 2, -1)
        return np.argmin(d2, axis=1)

    def road_heading(self, xy) -> float | None:
        k = int(self.nearest_segment(xy)[0])
        return None if k < 0 else float(self.headings[k])

    def speed_limit(self, xy) -> np.ndarray:
        k = self.nearest_segment(xy)
        out = np.full(len(k), np.inf)
        ok = k >= 0
        out[ok] = self.speed_limits[k[ok]]
        return out


class ClipData:
    """Immutable arrays of one clip the simulator reads every step."""

    def __init__(self, clip, look: int, route_limits: RouteLimits):
        clip.validate() if hasattr(clip, "validate") else None
        self.clip = clip
        t_total = int(clip.num_steps)
        n = clip.num_agents
        self.num_steps = t_total
        tpad = t_total + look + 1
        self.boxes = np.zeros((n, tpad, 5))
        self.valid = np.zeros((n, tpad), dtype=bool)
        self.vel = np.zeros((n, tpad, 2))
        if n:
            self.boxes[:, :t_total, 0] = clip.agent_x
            self.boxes[:, :t_total, 1] = clip.agent_y
            self.boxes[:, :t_total, 2] = clip.agent_yaw
            self.boxes[:, :, 3] = clip.agent_length[:, None]
            self.boxes[:, :, 4] = clip.agent_width[:, None]
            self.valid[:, :t_total] = clip.agent_valid
            self.vel[:, :t_total, 0] = clip.agent_vx
            self.vel[:, :t_total, 1] = clip.agent_vy
        expert_xy = np.stack([clip.ego_x, clip.ego_y], -1)
        try:  # the same check that dataset conversion makes (rad2_core.route_path)
            self.route = check_route(clip.route_polyline, expert_xy, route_limits)
        except RouteError as exc:
            raise SimulationError(f"clip {clip.clip_id!r}: {exc} (EP would count progress along it "
                                  "wrongly; rebuild the route)") from None
        self.expert_s = self.route.project(expert_xy)[0]
        # reactive agents: cumulative arc length of each logged path (non-decreasing over valid steps)
        self.agent_s = np.zeros((n, t_total))
        self.agent_speed = np.zeros((n, t_total))
        for j in range(n):
            xy = np.stack([clip.agent_x[j], clip.agent_y[j]], -1)
            d = np.hypot(*np.diff(xy, axis=0).T)
            ok = clip.agent_valid[j, 1:] & clip.agent_valid[j, :-1]
            self.agent_s[j, 1:] = np.cumsum(np.where(ok, d, 0.0))
            self.agent_speed[j] = np.hypot(clip.agent_vx[j], clip.agent_vy[j])


class ClipCache:
    """One simulator's derived data of registered clips (:class:`ClipData`, least recently used dropped
    beyond 256) and of maps (:class:`MapGeometry`, by map id).

    ``params``: the simulator's merged parameters (``sim.offroad_margin_m``, the route limits of
    rad2_core.route_path and the plausibility limits of validators.yaml); ``look``: the steps of
    agent future the padded boxes must cover (``ttc.t_max / sim.dt``).
    """

    def __init__(self, params: dict[str, Any], look: int):
        self.params = params
        self.look = int(look)
        self._clip_limits = load_limits(params)  # params/validators.yaml: a log of the impossible is refused
        self._maps: dict[str, MapGeometry] = {}
        self._clips: OrderedDict[str, ClipData] = OrderedDict()

    def map_geometry(self, lane_map) -> MapGeometry:
        key = lane_map.map_id
        if key not in self._maps:
            self._maps[key] = MapGeometry(lane_map, float(self.params["sim"]["offroad_margin_m"]))
        return self._maps[key]

    def clip_data(self, key: str) -> ClipData:
        """Derived arrays of the registered clip ``key`` (cached; rebuilt from the registry when evicted)."""
        data = self._clips.get(key)
        if data is None:
            clip = registered_clip(key)
            bad = check_clip(clip, self._clip_limits)
            if bad:
                what = f"clip {clip.clip_id!r} is not a drivable log"
                raise SimulationError(str(PlausibilityError(what, bad)))
            data = ClipData(clip, self.look, RouteLimits.from_params(self.params))
            self._clips[key] = data
            while len(self._clips) > _CLIP_DATA_SIZE:
                self._clips.popitem(last=False)
        else:
            self._clips.move_to_end(key)
        return data
