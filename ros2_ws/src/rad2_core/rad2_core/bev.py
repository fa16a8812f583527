"""Ego-centred bird's-eye-view raster with named channels, rasterised with OpenCV.

Grid (``params/bev.yaml`` ``bev.*``): cell (row i, col j) covers the ego-frame square
``[origin_x + j*res, +res) x [origin_y + i*res, +res)``; columns run along +x (forward), rows along
+y (left). Output is float32 ``[C, H, W]`` with channels named by ``bev.channels``:

- ``drivable_area``: 1 inside drivable-area polygons and lane polygons;
- ``lane_centerline`` / ``lane_boundary``: 1 on the lines;
- ``route``: 1 on the route polyline; ``crosswalk`` (optional): 1 inside crosswalks;
- ``agents_t0``, ``agents_t-<k>``: box occupancy now and ``k`` steps ago, drawn at the positions of
  that time expressed in the *current* ego frame;
- ``agent_velocity_x`` / ``agent_velocity_y``: the agent's world velocity rotated into the ego
  frame (m/s), written into its current box;
- ``speed_limit``: the lane's speed limit (m/s) inside each lane polygon;
- ``traffic_signal``: the centrelines of the lanes a traffic light controls and its stop lines, drawn
  with the light's state now (:data:`SIGNAL_CHANNEL_VALUES`: red 1, yellow 0.5, green 0.25; 0 where no
  light is known). Where lines of different states cross, the more restrictive one shows.

Input is a :class:`SceneSnapshot`, which live perception can fill without a :class:`Clip`;
:func:`snapshot_from_clip` builds one from a logged clip. Map geometry is prepared once per
``map_id`` (concatenated, with per-polyline bounding boxes for view culling), so a frame costs one
affine transform of the visible points plus the OpenCV fills (sub-pixel ``shift``).

Re-expressing a raster in another ego frame (BEV-Warp) is ``bev_warp_sim.warp.BevWarper``, which takes
its grid geometry from :class:`BevConfig` and :func:`ego_to_pixel_affine`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from rad2_core.clip import Clip
from rad2_core.config import cached_by_block, require
from rad2_core.geometry import box_corners, rotate_vectors, se2_inverse, se2_matrix
from rad2_core.lane_map import SIGNAL_GREEN, SIGNAL_RED, SIGNAL_YELLOW, LaneMap


class BevError(ValueError):
    """Bad BEV input or configuration (message names the field)."""


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BevConfig:
    resolution: float
    height: int
    width: int
    origin_x: float
    origin_y: float
    channels: tuple[str, ...]
    vector_pairs: tuple[tuple[str, str], ...]
    history_offsets: tuple[int, ...]
    thickness: int
    shift: int
    margin: float
    supersample: int

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> BevConfig:
        """From params/bev.yaml as loaded (its schema bounds the grid; the channel names are checked
        here, the schema lists no choices for them)."""
        vec = [str(v) for v in require(params, "bev.vector_channels")]
        if len(vec) % 2:
            raise BevError(f"bev.vector_channels: needs (x, y) pairs, got {len(vec)} names {vec}")
        cfg = cls(
            resolution=float(require(params, "bev.resolution_m")),
            height=int(require(params, "bev.height")),
            width=int(require(params, "bev.width")),
            origin_x=float(require(params, "bev.origin_x")),
            origin_y=float(require(params, "bev.origin_y")),
            channels=tuple(str(c) for c in require(params, "bev.channels")),
            vector_pairs=tuple((vec[i], vec[i + 1]) for i in range(0, len(vec), 2)),
            history_offsets=tuple(int(k) for k in require(params, "bev.history_offsets")),
            thickness=int(require(params, "bev.line_thickness_px")),
            shift=int(require(params, "bev.subpixel_bits")),
            margin=float(require(params, "bev.view_margin_m")),
            supersample=int(require(params, "bev.occupancy_supersample")),
        )
        for name in cfg.channels:
            _channel_kind(name)
        for a, b in cfg.vector_pairs:
            for c in (a, b):
                if c not in cfg.channels:
                    raise BevError(f"bev.vector_channels: {c!r} is not in bev.channels")
        return cfg

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.channels), self.height, self.width)

    def channel_index(self, name: str) -> int:
        try:
            return self.channels.index(name)
        except ValueError:
            raise BevError(f"channel {name!r} not in bev.channels {list(self.channels)}") from None

    def view_corners(self) -> np.ndarray:
        """Ego-frame corners (4, 2) of the raster."""
        x0, y0 = self.origin_x, self.origin_y
        x1, y1 = x0 + self.width * self.resolution, y0 + self.height * self.resolution
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])

    def cell_centers(self) -> tuple[np.ndarray, np.ndarray]:
        """Ego-frame x [W] and y [H] of the cell centres."""
        xs = self.origin_x + (np.arange(self.width) + 0.5) * self.resolution
        ys = self.origin_y + (np.arange(self.height) + 0.5) * self.resolution
        return xs, ys


_STATIC = {
    "drivable_area",
    "lane_centerline",
    "lane_boundary",
    "route",
    "crosswalk",
    "speed_limit",
    "traffic_signal",
    "agent_velocity_x",
    "agent_velocity_y",
    "ego",
}


def _channel_kind(name: str) -> tuple[str, int]:
    if name in _STATIC:
        return name, 0
    if name.startswith("agents_t"):
        rest = name[len("agents_t") :]
        try:
            k = int(rest)
        except ValueError:
            k = None
        if k is not None and k <= 0:
            return "agents", -k
    raise BevError(f"bev.channels: unknown channel name {name!r}")


_CONFIG_CACHE: dict[str, BevConfig] = {}


def get_config(params: dict[str, Any] | BevConfig) -> BevConfig:
    """The BevConfig of a params dict (cached by the content of its ``bev`` block)."""
    if isinstance(params, BevConfig):
        return params
    return cached_by_block(_CONFIG_CACHE, params, "bev", BevConfig.from_params)


# ----------------------------------------------------------------------------------------------
# scene snapshot (what the raster is made of)
# ----------------------------------------------------------------------------------------------
@dataclass
class AgentFrame:
    """Agents at one instant, world frame. All arrays [N]."""

    ids: np.ndarray
    types: np.ndarray
    x: np.ndarray
    y: np.ndarray
    yaw: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    length: np.ndarray
    width: np.ndarray

    @classmethod
    def empty(cls) -> AgentFrame:
        z = np.zeros(0)
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int8), z, z, z, z, z, z, z)

    @classmethod
    def from_arrays(cls, ids, types, x, y, yaw, vx, vy, length, width) -> AgentFrame:
        f = cls(
            np.asarray(ids, np.int64).reshape(-1),
            np.asarray(types, np.int8).reshape(-1),
            *(np.asarray(a, np.float64).reshape(-1) for a in (x, y, yaw, vx, vy, length, width)),
        )
        f.validate("agents")
        return f

    def __len__(self) -> int:
        return int(len(self.x))

    def validate(self, name: str) -> None:
        n = len(self.x)
        for key in ("ids", "types", "x", "y", "yaw", "vx", "vy", "length", "width"):
            a = getattr(self, key)
            if not isinstance(a, np.ndarray) or a.shape != (n,):
                raise BevError(f"{name}.{key}: shape {getattr(a, 'shape', None)} does not match (N={n},)")
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                raise BevError(f"{name}.{key}: contains non-finite values")


@dataclass
class SceneSnapshot:
    """Everything the BEV and tokens are computed from, at one time (world frame).

    ``history`` maps a step offset k (> 0) to the agents k steps ago; ``ego_state`` is
    (speed, accel, yaw rate, steering) and ``route_lane_ids`` flags on-route lanes for tokens.
    """

    map: LaneMap
    ego_pose: np.ndarray
    route_polyline: np.ndarray
    agents: AgentFrame
    ego_length: float  # m, the ego box (from the log, or params/vehicle.yaml on a vehicle)
    ego_width: float
    history: dict[int, AgentFrame] = field(default_factory=dict)
    ego_state: np.ndarray = field(default_factory=lambda: np.zeros(4))
    route_lane_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    timestamp: float = 0.0
    signal_states: np.ndarray | None = None  # [S] state of each map signal now (None: not known)

    def validate(self) -> SceneSnapshot:
        if not isinstance(self.map, LaneMap):
            raise BevError(f"map: expected a LaneMap, got {type(self.map).__name__}")
        pose = np.asarray(self.ego_pose)
        if pose.shape != (3,) or not np.all(np.isfinite(pose)):
            raise BevError(f"ego_pose: expected finite shape (3,), got {pose.shape} {pose}")
        rp = np.asarray(self.route_polyline)
        if rp.ndim != 2 or rp.shape[1] != 2:
            raise BevError(f"route_polyline: shape {rp.shape} is not [Pr, 2]")
        self.agents.validate("agents")
        for k, frame in self.history.items():
            frame.validate(f"history[{k}]")
        if np.asarray(self.ego_state).shape != (4,):
            raise BevError(f"ego_state: shape {np.asarray(self.ego_state).shape} is not (4,)")
        return self


def _frame_at(clip: Clip, t: int) -> AgentFrame:
    a = clip.agents_at(t)
    return AgentFrame(a.ids, a.types, a.x, a.y, a.yaw, a.vx, a.vy, a.length, a.width)


def ego_state_from_clip(clip: Clip, t: int, wheelbase: float) -> np.ndarray:
    """(speed, accel, yaw rate, steering) at step t from the logged ego track."""
    yaw = np.unwrap(clip.ego_yaw)
    if clip.num_steps > 1:
        rate = np.gradient(yaw, clip.dt)[t]
    else:
        rate = 0.0
    v = float(clip.ego_speed[t])
    steer = float(np.arctan(wheelbase * rate / v)) if v > 0.5 else 0.0
    return np.array([v, float(clip.ego_accel[t]), float(rate), steer])


def snapshot_from_clip(
    clip: Clip, t: int, params: dict[str, Any] | BevConfig, vehicle_params: dict[str, Any]
) -> SceneSnapshot:
    """The scene at step ``t`` of a clip; history steps before the clip start use step 0. ``params``:
    params/bev.yaml (or its BevConfig), ``vehicle_params``: params/vehicle.yaml (the wheelbase)."""
    cfg = get_config(params)
    wheelbase = float(require(vehicle_params, "vehicle.wheelbase"))
    t = clip._check_step(t)
    offsets = set(cfg.history_offsets)
    for name in cfg.channels:
        kind, k = _channel_kind(name)
        if kind == "agents" and k > 0:
            offsets.add(k)
    history = {k: _frame_at(clip, max(t - k, 0)) for k in sorted(offsets)}
    return SceneSnapshot(
        map=clip.map,
        ego_pose=clip.ego_pose(t),
        route_polyline=clip.route_polyline,
        agents=_frame_at(clip, t),
        history=history,
        ego_state=ego_state_from_clip(clip, t, wheelbase),
        route_lane_ids=clip.route_lane_ids,
        ego_length=clip.ego_length,
        ego_width=clip.ego_width,
        timestamp=t * clip.dt,
        signal_states=clip.signals_at(t) if clip.map.num_signals else None,
    )


# ----------------------------------------------------------------------------------------------
# prepared map geometry
# ----------------------------------------------------------------------------------------------
class _PolySet:
    """Many polylines concatenated, with bounding boxes for culling."""

    def __init__(self, polys: list[np.ndarray], values: np.ndarray | None = None):
        polys = [np.asarray(p, np.float64).reshape(-1, 2) for p in polys if len(p) >= 2]
        self.count = len(polys)
        if self.count:
            self.points = np.concatenate(polys)
            lens = np.array([len(p) for p in polys])
            self.offsets = np.concatenate([[0], np.cumsum(lens)])
            self.bbox = np.array(
                [[p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()] for p in polys]
            )
        else:
            self.points = np.zeros((0, 2))
            self.offsets = np.zeros(1, np.int64)
            self.bbox = np.zeros((0, 4))
        self.values = values

    def visible(self, box: np.ndarray) -> np.ndarray:
        if not self.count:
            return np.zeros(0, np.int64)
        b = self.bbox
        return np.flatnonzero(
            (b[:, 2] >= box[0]) & (b[:, 0] <= box[2]) & (b[:, 3] >= box[1]) & (b[:, 1] <= box[3])
        )

    def pixel_polys(self, idx: np.ndarray, affine: np.ndarray, scale: float) -> list[np.ndarray]:
        """Fixed-point pixel coordinates of the selected polylines."""
        if len(idx) == 0:
            return []
        starts, stops = self.offsets[idx], self.offsets[idx + 1]
        if len(idx) == self.count:
            pts = self.points
            bounds = self.offsets
        else:
            sel = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)])
            pts = self.points[sel]
            bounds = np.concatenate([[0], np.cumsum(stops - starts)])
        pix = pts @ affine[:, :2].T + affine[:, 2]
        fixed = np.round(pix * scale).astype(np.int32)
        return [fixed[bounds[i] : bounds[i + 1]] for i in range(len(idx))]


class PreparedMap:
    """A LaneMap's geometry in raster-friendly form (built once per map_id)."""

    def __init__(self, lane_map: LaneMap):
        self.map_id = lane_map.map_id
        lane_polys = [
            np.concatenate([r, lft[::-1]])
            for lft, r in zip(lane_map.left_boundaries, lane_map.right_boundaries)
        ]
        self.drivable = _PolySet(list(lane_map.drivable_areas))
        self.lanes = _PolySet(lane_polys, np.asarray(lane_map.speed_limits, np.float64))
        self.centerlines = _PolySet(list(lane_map.centerlines))
        self.boundaries = _PolySet(list(lane_map.left_boundaries) + list(lane_map.right_boundaries))
        self.crosswalks = _PolySet(list(lane_map.crosswalks))


_MAP_CACHE: OrderedDict[str, PreparedMap] = OrderedDict()
_MAP_CACHE_SIZE = 32


def prepare_map(lane_map: LaneMap) -> PreparedMap:
    pm = _MAP_CACHE.get(lane_map.map_id)
    if pm is None:
        pm = PreparedMap(lane_map)
        _MAP_CACHE[lane_map.map_id] = pm
        if len(_MAP_CACHE) > _MAP_CACHE_SIZE:
            _MAP_CACHE.popitem(last=False)
    else:
        _MAP_CACHE.move_to_end(lane_map.map_id)
    return pm


# ----------------------------------------------------------------------------------------------
# rasterisation
# ----------------------------------------------------------------------------------------------
def world_to_pixel_affine(ego_pose, cfg: BevConfig) -> np.ndarray:
    """2x3 affine mapping world (x, y) to continuous pixel (u=col, v=row), pixel centres at integers."""
    return ego_to_pixel_affine(cfg) @ se2_matrix(se2_inverse(np.asarray(ego_pose, dtype=np.float64)))


def ego_to_pixel_affine(cfg: BevConfig) -> np.ndarray:
    """2x3 affine mapping ego-frame (x, y) to continuous pixel (u, v)."""
    r = 1.0 / cfg.resolution
    return np.array([[r, 0.0, -cfg.origin_x * r - 0.5], [0.0, r, -cfg.origin_y * r - 0.5]])


def _view_box(ego_pose, cfg: BevConfig) -> np.ndarray:
    ex, ey, yaw = (float(v) for v in ego_pose)
    c, s = np.cos(yaw), np.sin(yaw)
    corners = cfg.view_corners()
    wx = ex + c * corners[:, 0] - s * corners[:, 1]
    wy = ey + s * corners[:, 0] + c * corners[:, 1]
    m = cfg.margin
    return np.array([wx.min() - m, wy.min() - m, wx.max() + m, wy.max() + m])


def _agent_polys(frame: AgentFrame, affine: np.ndarray, scale: float, box: np.ndarray, shrink: float):
    """Fixed-point pixel corners of the agents inside ``box``.

    OpenCV's fill covers every pixel an edge passes through (about half a cell of dilation per
    side), so boxes are drawn ``shrink`` (one cell) shorter and narrower: the result then
    approximates the set of cells whose centre lies in the true box.
    """
    if len(frame) == 0:
        return [], np.zeros(0, np.int64)
    inside = (frame.x >= box[0]) & (frame.x <= box[2]) & (frame.y >= box[1]) & (frame.y <= box[3])
    idx = np.flatnonzero(inside)
    if len(idx) == 0:
        return [], idx
    length = np.maximum(frame.length[idx] - shrink, 1e-3)
    width = np.maximum(frame.width[idx] - shrink, 1e-3)
    corners = box_corners(frame.x[idx], frame.y[idx], frame.yaw[idx], length, width)
    pix = corners @ affine[:, :2].T + affine[:, 2]
    fixed = np.round(pix * scale).astype(np.int32)
    return list(fixed), idx


def _downsample(canvas: np.ndarray, cfg: BevConfig) -> np.ndarray:
    """uint8 0/255 canvas on the fine grid -> float32 cell coverage in [0, 1]."""
    if cfg.supersample == 1:
        return canvas.astype(np.float32) / 255.0
    small = cv2.resize(canvas, (cfg.width, cfg.height), interpolation=cv2.INTER_AREA)
    return small.astype(np.float32) / 255.0


# Value of the traffic_signal channel on the lanes and stop lines of a light in each state (0: none known).
# Drawn from the least to the most restrictive, so where a red and a green lane cross the red shows.
SIGNAL_CHANNEL_VALUES = {SIGNAL_GREEN: 0.25, SIGNAL_YELLOW: 0.5, SIGNAL_RED: 1.0}


def _draw_signals(img: np.ndarray, snapshot: SceneSnapshot, affine: np.ndarray, scale: float,
                  box: np.ndarray, cfg: BevConfig) -> None:
    lane_map = snapshot.map
    if snapshot.signal_states is None or not lane_map.num_signals:
        return
    try:
        lane_states = lane_map.lane_signal_states(snapshot.signal_states)
    except ValueError as e:
        raise BevError(str(e)) from None
    states = np.asarray(snapshot.signal_states).reshape(-1)
    for state, value in SIGNAL_CHANNEL_VALUES.items():
        lines = [lane_map.centerlines[k] for k in np.flatnonzero(lane_states == state)]
        lines += [lane_map.signal_stop_lines[s] for s in np.flatnonzero(states == state)]
        lines = [np.asarray(p, np.float64) for p in lines if len(p) >= 2]
        lines = [p for p in lines if p[:, 0].max() >= box[0] and p[:, 0].min() <= box[2]
                 and p[:, 1].max() >= box[1] and p[:, 1].min() <= box[3]]
        if lines:
            pix = [np.round((p @ affine[:, :2].T + affine[:, 2]) * scale).astype(np.int32) for p in lines]
            cv2.polylines(img, pix, False, value, cfg.thickness, cv2.LINE_8, cfg.shift)


def rasterize_bev(
    snapshot: SceneSnapshot,
    ego_pose=None,
    *,
    params: dict[str, Any] | BevConfig,
    prepared: PreparedMap | None = None,
) -> np.ndarray:
    """float32 [C, H, W] raster of ``snapshot`` centred on ``ego_pose`` (default: the snapshot's)."""
    cfg = get_config(params)
    pose = np.asarray(snapshot.ego_pose if ego_pose is None else ego_pose, dtype=np.float64)
    if pose.shape != (3,) or not np.all(np.isfinite(pose)):
        raise BevError(f"ego_pose: expected finite shape (3,), got {pose.shape}")
    pm = prepared if prepared is not None else prepare_map(snapshot.map)
    affine = world_to_pixel_affine(pose, cfg)
    box = _view_box(pose, cfg)
    scale = float(1 << cfg.shift)
    shift = cfg.shift
    h, w = cfg.height, cfg.width
    ss = cfg.supersample
    hs, ws = h * ss, w * ss
    # occupancy channels are drawn on an ss-times finer grid and area-averaged (cell coverage)
    affine_ss = affine * ss
    affine_ss[:, 2] += 0.5 * (ss - 1)
    out = np.zeros(cfg.shape, dtype=np.float32)
    lane_idx = None
    for ci, name in enumerate(cfg.channels):
        kind, k = _channel_kind(name)
        img = out[ci]
        if kind == "drivable_area":
            canvas = np.zeros((hs, ws), np.uint8)
            for ps in (pm.drivable, pm.lanes):
                for poly in ps.pixel_polys(ps.visible(box), affine_ss, scale):
                    cv2.fillPoly(canvas, [poly], 255, cv2.LINE_8, shift)
            img[:] = _downsample(canvas, cfg)
        elif kind in ("lane_centerline", "lane_boundary"):
            ps = pm.centerlines if kind == "lane_centerline" else pm.boundaries
            polys = ps.pixel_polys(ps.visible(box), affine, scale)
            if polys:
                canvas = np.zeros((h, w), np.uint8)
                cv2.polylines(canvas, polys, False, 1, cfg.thickness, cv2.LINE_8, shift)
                img[:] = canvas
        elif kind == "crosswalk":
            canvas = np.zeros((hs, ws), np.uint8)
            for poly in pm.crosswalks.pixel_polys(pm.crosswalks.visible(box), affine_ss, scale):
                cv2.fillPoly(canvas, [poly], 255, cv2.LINE_8, shift)
            img[:] = _downsample(canvas, cfg)
        elif kind == "route":
            rp = np.asarray(snapshot.route_polyline, np.float64)
            if len(rp) >= 2:
                near = (
                    (rp[:, 0] >= box[0]) & (rp[:, 0] <= box[2]) & (rp[:, 1] >= box[1]) & (rp[:, 1] <= box[3])
                )
                near = near | np.r_[near[1:], False] | np.r_[False, near[:-1]]
                if near.any():
                    pix = np.round((rp @ affine[:, :2].T + affine[:, 2]) * scale).astype(np.int32)
                    # split into runs of visible points so distant parts are not drawn
                    runs = np.split(np.arange(len(rp)), np.flatnonzero(np.diff(near.astype(np.int8))) + 1)
                    polys = [pix[r] for r in runs if near[r[0]] and len(r) >= 2]
                    if polys:
                        canvas = np.zeros((h, w), np.uint8)
                        cv2.polylines(canvas, polys, False, 1, cfg.thickness, cv2.LINE_8, shift)
                        img[:] = canvas
        elif kind == "speed_limit":
            if lane_idx is None:
                lane_idx = pm.lanes.visible(box)
            polys = pm.lanes.pixel_polys(lane_idx, affine, scale)
            for poly, li in zip(polys, lane_idx):
                cv2.fillPoly(img, [poly], float(pm.lanes.values[li]), cv2.LINE_8, shift)
        elif kind == "traffic_signal":
            _draw_signals(img, snapshot, affine, scale, box, cfg)
        elif kind == "agents":
            if k == 0:
                frame = snapshot.agents
            elif k in snapshot.history:
                frame = snapshot.history[k]
            else:
                raise BevError(
                    f"history: channel {name!r} needs agents {k} steps ago; snapshot has "
                    f"offsets {sorted(snapshot.history)}"
                )
            polys, _ = _agent_polys(frame, affine_ss, scale, box, cfg.resolution / cfg.supersample)
            if polys:
                canvas = np.zeros((hs, ws), np.uint8)
                for poly in polys:
                    cv2.fillPoly(canvas, [poly], 255, cv2.LINE_8, shift)
                img[:] = _downsample(canvas, cfg)
        elif kind == "ego":
            ego = box_corners(pose[0], pose[1], pose[2], snapshot.ego_length, snapshot.ego_width)
            poly = np.round((ego @ affine[:, :2].T + affine[:, 2]) * scale).astype(np.int32)
            cv2.fillPoly(img, [poly], 1.0, cv2.LINE_8, shift)
    # velocity channels: ego-frame components written into the current boxes
    pairs = [
        (cfg.channels.index(a), cfg.channels.index(b))
        for a, b in cfg.vector_pairs
        if a in ("agent_velocity_x",) and b in ("agent_velocity_y",)
    ]
    if pairs and len(snapshot.agents):
        frame = snapshot.agents
        polys, idx = _agent_polys(frame, affine, scale, box, cfg.resolution)
        if polys:
            vel = rotate_vectors(np.stack([frame.vx[idx], frame.vy[idx]], axis=-1), -pose[2])
            vxe, vye = vel[:, 0], vel[:, 1]
            for ix, iy in pairs:
                for poly, a, b in zip(polys, vxe, vye):
                    cv2.fillPoly(out[ix], [poly], float(a), cv2.LINE_8, shift)
                    cv2.fillPoly(out[iy], [poly], float(b), cv2.LINE_8, shift)
    return out


__all__ = [
    "AgentFrame",
    "BevConfig",
    "BevError",
    "PreparedMap",
    "SIGNAL_CHANNEL_VALUES",
    "SceneSnapshot",
    "ego_state_from_clip",
    "ego_to_pixel_affine",
    "get_config",
    "prepare_map",
    "rasterize_bev",
    "snapshot_from_clip",
    "world_to_pixel_affine",
]
