"""The headway humans keep: time gaps, closing speeds and braking of every logged driver behind the
vehicle ahead of it, measured on recorded clips (no ROS, no networks).

Every logged vehicle of a recorded clip is a human driver: the ego and every agent of type vehicle
is a *follower* here, at every step where it is logged. Its *leader* at a step is the nearest road
user (not a pedestrian) ahead of it in its path:

- the path is an arc from the follower's centre along its heading, bent by its own curvature
  (yaw rate / speed, from the logged heading over ``curvature_window_s``; straight below
  ``min_speed``, at most ``max_curvature``);
- a road user is in the path when its centre lies within ``lane_half_width`` (half a lane) of the
  arc, ahead of the follower's centre, no further than ``max_range_m`` along it (and at most a
  quarter turn), and heading within ``max_heading_deg`` of the arc's direction there (so a car in the
  next lane, an oncoming car or one crossing is not a leader);
- the leader is the one of those nearest along the arc.

For each follower step with a leader (:func:`clip_headway`):

- ``gap_m``: bumper-to-bumper distance along the path: the distance between the centres along the
  arc, less half the follower's length and the leader's half extent along the path (its box
  projected: half length · |cos| + half width · |sin| of the heading difference). Samples whose boxes
  overlap along the path (gap <= 0: a logging or box-size error) are counted and left out.
- ``speed``: the follower's speed along its own heading (m/s).
- ``time_gap_s``: gap / speed, only where speed >= ``min_speed`` (NaN below): how many seconds
  behind the leader's rear the follower's front is.
- ``closing_mps``: the follower's speed less the leader's velocity along the path's direction at the
  leader (the follower's heading on a straight road); > 0 when the follower is catching up.
- ``ttc_s``: gap / closing where closing > 0 (NaN otherwise): time to collision if neither changed
  speed.
- ``required_decel``: closing² / (2 · gap) where closing > 0 (NaN otherwise): the constant braking
  (m/s², relative to the leader) that would just avoid reaching the leader if it held its speed. The
  smallest braking the situation asks of the follower.
- ``decel``: the follower's own deceleration (m/s², > 0 braking): minus the derivative of its speed,
  smoothed over ``accel_window_s`` (NaN where the window is not all logged).

Braking of every moving vehicle step (with or without a leader) is returned as well (``braking``),
and *cut-ins*: a follower's leader changes to a road user that was not its leader in the previous
``cut_in_memory_s``, at a gap smaller than the previous leader's (or where there was none), and stays
the leader for ``cut_in_persist_s``. An event is a cut-in proper (``by_leader``) when the new leader
moved further sideways over the preceding ``cut_in_window_s`` than the follower did (measured across
the lane direction of the map near the follower, or across its mean heading without a lane), and a
lane change of the follower's own otherwise.

Vehicle steps logged in several clips (NGSIM clips of one scene share their traffic, and the corpus
holds some recordings under several file names) are counted once: a follower step is identified by
the vehicle's id, the absolute step of the log (metadata ``start_time_step``) and its position to
0.1 m (:class:`HeadwayAccumulator`).

:func:`summarize` gives the figures per speed band of the follower: low percentiles (p1, p5, p10,
p50) of the time gap, the distance gap and TTC (how close the closest humans come), high
percentiles (p50, p90, p95, p99, p99.9) of the closing speed, the required deceleration and the
braking (how hard the hardest come in), and the *envelope*: per time-gap bin, the p95 / p99 of the
closing speed humans accepted at that time gap. An automated planner that keeps within the low
percentiles and the envelope behaves like the careful part of the recorded drivers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rad2_core.clip import AGENT_PEDESTRIAN, AGENT_VEHICLE, Clip
from rad2_core.field_checks import ClipValidationError
from rad2_core.geometry import wrap_angle

# what a logged road vehicle can do at all: beyond these the log is wrong, not the driver
MAX_SPEED = 70.0  # m/s
MAX_LENGTH = 30.0  # m
MAX_WIDTH = 5.0  # m
MAX_DT = 1.0  # s

LOW_PERCENTILES = (1.0, 5.0, 10.0, 50.0)
HIGH_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
SPEED_BANDS = (0.0, 5.0, 10.0, 15.0, 20.0, math.inf)


# metadata naming the log's step of a clip's first step, and the ego's id in the log (CommonRoad /
# NGSIM, INTERACTION): vehicle steps logged in several clips are recognised by them
_START_KEYS = ("start_time_step", "start_frame")
_EGO_ID_KEYS = ("ego_obstacle_id", "ego_track_id")


class HeadwayInputError(ClipValidationError):
    """A clip or a parameter the headway statistics cannot use; the message names the field and value."""


@dataclass(frozen=True)
class HeadwayParams:
    """How a leader is found and how the signals are smoothed (see the module's docstring). The values
    the tools use are params/headway.yaml's (:meth:`from_params`); the defaults here are those of a
    clip-level call in code (tests, notebooks) and equal the file's."""

    lane_half_width: float = 1.75  # m: half a 3.5 m lane
    max_heading_deg: float = 30.0
    max_range_m: float = 100.0
    min_speed: float = 2.0  # m/s: time gap and path curvature only above it
    max_curvature: float = 0.1  # 1/m (radius >= 10 m)
    curvature_window_s: float = 1.0
    accel_window_s: float = 1.0
    cut_in_memory_s: float = 1.0
    cut_in_persist_s: float = 0.5
    cut_in_window_s: float = 1.0
    cut_in_response_s: float = 3.0
    speed_bands: tuple[float, ...] = SPEED_BANDS
    time_gap_bins: tuple[float, ...] = tuple(np.round(np.arange(0.0, 4.01, 0.25), 2).tolist())
    min_bin_count: int = 30  # envelope bins with fewer samples give no percentile
    min_band_samples: int = 100  # speed bands with fewer following samples give no percentile

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> HeadwayParams:
        """From params/headway.yaml as loaded (its ``headway`` block); the last speed band is open above."""
        from rad2_core.config import require

        c = require(params, "headway", "headway.yaml")
        floats = ("lane_half_width", "max_heading_deg", "max_range_m", "min_speed", "max_curvature",
                  "curvature_window_s", "accel_window_s", "cut_in_memory_s", "cut_in_persist_s",
                  "cut_in_window_s", "cut_in_response_s")
        return cls(**{k: float(c[k]) for k in floats},
                   speed_bands=(*(float(v) for v in c["speed_bands"]), math.inf),
                   time_gap_bins=tuple(float(v) for v in c["time_gap_bins"]),
                   min_bin_count=int(c["min_bin_count"]), min_band_samples=int(c["min_band_samples"]))

    def validate(self) -> HeadwayParams:
        positive = ("lane_half_width", "max_heading_deg", "max_range_m", "min_speed", "max_curvature",
                    "curvature_window_s", "accel_window_s", "cut_in_memory_s", "cut_in_persist_s",
                    "cut_in_window_s", "cut_in_response_s")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise HeadwayInputError(f"params.{name}: {v!r} must be a finite number > 0")
        if self.max_heading_deg >= 90.0:
            raise HeadwayInputError(f"params.max_heading_deg: {self.max_heading_deg!r} must be < 90")
        for name in ("speed_bands", "time_gap_bins"):
            edges = np.asarray(getattr(self, name), dtype=float)
            if edges.ndim != 1 or len(edges) < 2 or np.any(np.isnan(edges)) or np.any(np.diff(edges) <= 0):
                raise HeadwayInputError(
                    f"params.{name}: {getattr(self, name)!r} must be >= 2 increasing edges")
        for name in ("min_bin_count", "min_band_samples"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise HeadwayInputError(f"params.{name}: {v!r} must be an integer >= 1")
        return self


# -- the vehicles of a clip ---------------------------------------------------------------------------
@dataclass
class Tracks:
    """Every road user of a clip as rows [V, T], row 0 the ego (world frame, box centres)."""

    ids: np.ndarray  # [V] int64 (the ego: metadata ego_obstacle_id, else -1)
    types: np.ndarray  # [V] int8
    length: np.ndarray  # [V]
    width: np.ndarray  # [V]
    x: np.ndarray  # [V, T]
    y: np.ndarray
    yaw: np.ndarray
    vx: np.ndarray  # world-frame velocity
    vy: np.ndarray
    valid: np.ndarray  # [V, T] bool
    dt: float
    start_step: int

    @property
    def speed(self) -> np.ndarray:
        """[V, T] speed along each road user's own heading (negative reversing; 0 where not logged)."""
        return np.where(self.valid, self.vx * np.cos(self.yaw) + self.vy * np.sin(self.yaw), 0.0)


def _check_clip(clip: Clip) -> None:
    """Refuse what no road vehicle does (HeadwayInputError naming the clip, field and value)."""
    try:
        clip.validate()
    except HeadwayInputError:
        raise
    except ClipValidationError as exc:
        raise HeadwayInputError(f"clip {clip.clip_id!r}: {exc}") from None
    where = f"clip {clip.clip_id!r}"
    if clip.dt > MAX_DT:
        raise HeadwayInputError(f"{where}: dt: {clip.dt!r} s is longer than {MAX_DT} s")
    if clip.num_steps and np.max(np.abs(clip.ego_speed)) > MAX_SPEED:
        k = int(np.argmax(np.abs(clip.ego_speed)))
        raise HeadwayInputError(f"{where}: ego_speed: {clip.ego_speed[k]!r} m/s at step {k} is beyond "
                                f"{MAX_SPEED} m/s")
    for name, value, bound in (("ego_length", clip.ego_length, MAX_LENGTH),
                               ("ego_width", clip.ego_width, MAX_WIDTH)):
        if value > bound:
            raise HeadwayInputError(f"{where}: {name}: {value!r} m is beyond {bound} m")
    for name, bound in (("agent_length", MAX_LENGTH), ("agent_width", MAX_WIDTH)):
        arr = getattr(clip, name)
        if arr.size and arr.max() > bound:
            k = int(np.argmax(arr))
            raise HeadwayInputError(f"{where}: {name}: {arr[k]!r} m of agent {int(clip.agent_ids[k])} is "
                                    f"beyond {bound} m")
    if clip.num_agents:
        spd = np.where(clip.agent_valid, np.hypot(clip.agent_vx, clip.agent_vy), 0.0)
        if spd.max() > MAX_SPEED:
            i, t = np.unravel_index(int(np.argmax(spd)), spd.shape)
            raise HeadwayInputError(f"{where}: agent_vx/agent_vy: speed {spd[i, t]!r} m/s of agent "
                                    f"{int(clip.agent_ids[i])} at step {t} is beyond {MAX_SPEED} m/s")
    for key in (*_START_KEYS, *_EGO_ID_KEYS):
        value = clip.metadata.get(key, 0)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise HeadwayInputError(f"{where}: metadata.{key}: {value!r} is not an integer")


def _metadata_int(clip: Clip, keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = clip.metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    return default


def clip_tracks(clip: Clip) -> Tracks:
    """The ego and the agents of ``clip`` as :class:`Tracks` (the clip checked first)."""
    _check_clip(clip)
    t = clip.num_steps
    ego_id = _metadata_int(clip, _EGO_ID_KEYS, -1)
    evx = clip.ego_speed * np.cos(clip.ego_yaw)
    evy = clip.ego_speed * np.sin(clip.ego_yaw)

    def rows(ego_row, agents):
        return np.concatenate([np.asarray(ego_row, float).reshape(1, t), np.asarray(agents, float)], axis=0)

    valid = np.concatenate([np.ones((1, t), bool), clip.agent_valid.astype(bool)], axis=0)
    tr = Tracks(
        ids=np.concatenate([[ego_id], clip.agent_ids]).astype(np.int64),
        types=np.concatenate([[AGENT_VEHICLE], clip.agent_types]).astype(np.int8),
        length=np.concatenate([[clip.ego_length], clip.agent_length]).astype(float),
        width=np.concatenate([[clip.ego_width], clip.agent_width]).astype(float),
        x=rows(clip.ego_x, clip.agent_x), y=rows(clip.ego_y, clip.agent_y),
        yaw=rows(clip.ego_yaw, clip.agent_yaw), vx=rows(evx, clip.agent_vx), vy=rows(evy, clip.agent_vy),
        valid=valid, dt=float(clip.dt), start_step=_metadata_int(clip, _START_KEYS, 0))
    for name in ("x", "y", "yaw", "vx", "vy"):
        arr = getattr(tr, name)
        arr[~valid] = 0.0
    return tr


# -- smoothing along a track ----------------------------------------------------------------------------
def _window_steps(window_s: float, dt: float) -> int:
    """Half-width in steps of a centred window of ``window_s`` seconds (at least 1)."""
    return max(1, int(round(window_s / (2.0 * dt))))


def _shift(a: np.ndarray, k: int, fill) -> np.ndarray:
    """``a`` moved ``k`` steps along its last axis: out[..., t] = a[..., t + k] (``fill`` outside)."""
    out = np.full_like(a, fill)
    t = a.shape[-1]
    if k >= 0:
        if k < t:
            out[..., : t - k] = a[..., k:]
    elif -k < t:
        out[..., -k:] = a[..., : t + k]
    return out


def _moving_mean(a: np.ndarray, valid: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Centred mean of ``a`` over 2·half + 1 steps, and where every step of that window is logged."""
    total = np.zeros_like(a, dtype=float)
    ok = np.ones_like(valid, dtype=bool)
    for k in range(-half, half + 1):
        total += _shift(np.where(valid, a, 0.0), k, 0.0)
        ok &= _shift(valid, k, False)
    return total / (2 * half + 1), ok


def deceleration(speed: np.ndarray, valid: np.ndarray, dt: float, window_s: float) -> np.ndarray:
    """[V, T] deceleration (m/s², > 0 braking): minus the centred difference of the speed smoothed over
    ``window_s``; NaN where the smoothing window or the difference leaves the logged steps."""
    half = _window_steps(window_s, dt)
    smooth, ok = _moving_mean(speed, valid, half)
    ahead, behind = _shift(smooth, 1, np.nan), _shift(smooth, -1, np.nan)
    good = ok & _shift(ok, 1, False) & _shift(ok, -1, False)
    return np.where(good, -(ahead - behind) / (2.0 * dt), np.nan)


def curvature(tr: Tracks, params: HeadwayParams) -> np.ndarray:
    """[V, T] path curvature (1/m, left > 0): the heading's rate over ``curvature_window_s`` divided by
    the speed; 0 below ``min_speed`` or where the window is not logged; at most ``max_curvature``."""
    half = _window_steps(params.curvature_window_s, tr.dt)
    ahead, behind = _shift(tr.yaw, half, 0.0), _shift(tr.yaw, -half, 0.0)
    ok = tr.valid & _shift(tr.valid, half, False) & _shift(tr.valid, -half, False)
    rate = wrap_angle(ahead - behind) / (2.0 * half * tr.dt)
    speed = tr.speed
    kappa = np.where(ok & (speed >= params.min_speed), rate / np.maximum(speed, params.min_speed), 0.0)
    return np.clip(kappa, -params.max_curvature, params.max_curvature)


# -- leaders ---------------------------------------------------------------------------------------------
@dataclass
class Leaders:
    """The leader of every follower row at every step ([V, T]; -1 / NaN where there is none)."""

    index: np.ndarray  # row of the leader in the Tracks
    along_m: np.ndarray  # centre to centre along the path
    lateral_m: np.ndarray  # the leader's centre's offset from the path (left > 0)
    gap_m: np.ndarray  # bumper to bumper along the path
    leader_speed: np.ndarray  # the leader's velocity along the path's direction at the leader


def path_frame(dx, dy, kappa, max_range_m: float):
    """Along-path distance, lateral offset and path direction change of points (dx, dy) in a follower's
    frame (x ahead, y left) for a path of curvature ``kappa`` from the origin along +x. Points beyond a
    quarter turn or behind the origin get an along-path distance <= 0 or > ``max_range_m``."""
    dx, dy, kappa = np.broadcast_arrays(*(np.asarray(a, float) for a in (dx, dy, kappa)))
    curved = np.abs(kappa) > 1e-4
    k_safe = np.where(curved, kappa, 1.0)
    radius = 1.0 / np.abs(k_safe)
    side = np.sign(k_safe)
    rho = np.hypot(dx, dy - side * radius)
    theta = np.arctan2(dx, radius - side * dy)  # angle turned along the arc, in (-pi, pi]
    quarter = np.where(theta > 0.5 * np.pi, -1.0, 1.0)  # beyond a quarter turn: not ahead
    along = np.where(curved, quarter * radius * theta, dx)
    lateral = np.where(curved, side * (radius - rho), dy)
    turn = np.where(curved, kappa * np.maximum(along, 0.0), 0.0)
    along = np.where(along > max_range_m, np.inf, along)
    return along, lateral, turn


def find_leaders(tr: Tracks, params: HeadwayParams, kappa: np.ndarray | None = None,
                 chunk_cells: int = 400_000) -> Leaders:
    """The leader of every vehicle row at every step (see the module's docstring); pedestrians are
    neither followers nor leaders. Vectorised over [followers, candidates, steps] in time chunks of at
    most ``chunk_cells`` pairs."""
    v, t = tr.valid.shape
    kappa = curvature(tr, params) if kappa is None else kappa
    follower = (tr.types == AGENT_VEHICLE)[:, None] & tr.valid
    candidate = (tr.types != AGENT_PEDESTRIAN)[:, None] & tr.valid
    out = Leaders(index=np.full((v, t), -1, np.int64), along_m=np.full((v, t), np.nan),
                  lateral_m=np.full((v, t), np.nan), gap_m=np.full((v, t), np.nan),
                  leader_speed=np.full((v, t), np.nan))
    if v < 2:
        return out
    step = max(1, chunk_cells // (v * v))
    max_turn = math.radians(params.max_heading_deg)
    for t0 in range(0, t, step):
        sl = slice(t0, min(t, t0 + step))
        x, y, yaw = tr.x[:, sl], tr.y[:, sl], tr.yaw[:, sl]
        c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]  # follower axis 0, candidate axis 1
        wx = x[None, :, :] - x[:, None, :]
        wy = y[None, :, :] - y[:, None, :]
        dx = c * wx + s * wy
        dy = -s * wx + c * wy
        along, lateral, turn = path_frame(dx, dy, kappa[:, None, sl], params.max_range_m)
        path_yaw = yaw[:, None, :] + turn
        rel = wrap_angle(yaw[None, :, :] - path_yaw)
        ok = (follower[:, None, sl] & candidate[None, :, sl] & (along > 0.0) & np.isfinite(along)
              & (np.abs(lateral) <= params.lane_half_width) & (np.abs(rel) <= max_turn))
        ok &= ~np.eye(v, dtype=bool)[:, :, None]
        key = np.where(ok, along, np.inf)
        lead = np.argmin(key, axis=1)  # [V, steps]
        has = np.isfinite(np.take_along_axis(key, lead[:, None, :], axis=1)[:, 0, :])
        a_along, a_lat, a_rel, a_path = (np.take_along_axis(a, lead[:, None, :], axis=1)[:, 0, :]
                                         for a in (along, lateral, rel, path_yaw))
        lv = tr.vx[:, sl][lead, np.arange(lead.shape[1])[None, :]]
        lw = tr.vy[:, sl][lead, np.arange(lead.shape[1])[None, :]]
        l_speed = lv * np.cos(a_path) + lw * np.sin(a_path)
        half_extent = 0.5 * (tr.length[lead] * np.abs(np.cos(a_rel)) + tr.width[lead] * np.abs(np.sin(a_rel)))
        gap = a_along - 0.5 * tr.length[:, None] - half_extent
        out.index[:, sl] = np.where(has, lead, -1)
        out.along_m[:, sl] = np.where(has, a_along, np.nan)
        out.lateral_m[:, sl] = np.where(has, a_lat, np.nan)
        out.gap_m[:, sl] = np.where(has, gap, np.nan)
        out.leader_speed[:, sl] = np.where(has, l_speed, np.nan)
    return out


# -- cut-ins -----------------------------------------------------------------------------------------------
def _lane_direction(lane_map, px: float, py: float, yaw: float, max_dist: float = 5.0) -> float | None:
    """The direction of the lane centreline nearest (px, py) among those within 45 deg of ``yaw``."""
    best, best_d = None, max_dist
    for cl in lane_map.centerlines if lane_map is not None else ():
        if len(cl) < 2:
            continue
        a, b = cl[:-1], cl[1:]
        seg = b - a
        n2 = np.maximum((seg * seg).sum(axis=1), 1e-12)
        u = np.clip(((px - a[:, 0]) * seg[:, 0] + (py - a[:, 1]) * seg[:, 1]) / n2, 0.0, 1.0)
        d = np.hypot(a[:, 0] + u * seg[:, 0] - px, a[:, 1] + u * seg[:, 1] - py)
        heading = np.arctan2(seg[:, 1], seg[:, 0])
        d = np.where(np.abs(wrap_angle(heading - yaw)) <= math.pi / 4, d, np.inf)
        k = int(np.argmin(d))
        if d[k] < best_d:
            best, best_d = float(heading[k]), float(d[k])
    return best


def find_cut_ins(tr: Tracks, leaders: Leaders, decel: np.ndarray, params: HeadwayParams,
                 lane_map=None) -> list[dict]:
    """Events where a follower's leader changes to one not its leader in the last ``cut_in_memory_s``,
    at a smaller gap than the previous leader's (or none before), for at least ``cut_in_persist_s``.
    Each event: follower row, step, new leader row, ``gap_m`` / ``time_gap_s`` / ``closing_mps`` at
    entry, ``previous_gap_m`` (inf without one), ``by_leader`` (the new leader moved further sideways
    than the follower over ``cut_in_window_s``), and ``response_decel``: the follower's largest
    deceleration over the ``cut_in_response_s`` after entry (NaN where none is known)."""
    idx, gap = leaders.index, leaders.gap_m
    v, t = idx.shape
    memory = max(1, int(round(params.cut_in_memory_s / tr.dt)))
    persist = max(1, int(round(params.cut_in_persist_s / tr.dt)))
    window = max(1, int(round(params.cut_in_window_s / tr.dt)))
    response = max(1, int(round(params.cut_in_response_s / tr.dt)))
    speed = tr.speed
    events = []
    changed = (idx[:, 1:] >= 0) & (idx[:, 1:] != idx[:, :-1]) & tr.valid[:, :-1]
    for f, k in zip(*np.nonzero(changed), strict=True):
        step = int(k) + 1
        new = int(idx[f, step])
        if step < memory or np.any(idx[f, step - memory: step] == new):
            continue  # the same leader again (flicker at the path's edge) or too early to tell
        if step + persist > t or np.any(idx[f, step: step + persist] != new):
            continue
        if not tr.valid[new, step - 1]:
            continue  # a track that starts here: entering the recorded area, not the path
        prev = int(idx[f, step - 1])
        prev_gap = float(gap[f, step - 1]) if prev >= 0 else math.inf
        g = float(gap[f, step])
        if not g < prev_gap or g <= 0.0:
            continue
        s0 = max(0, step - window)
        while not (tr.valid[f, s0] and tr.valid[new, s0]):
            s0 += 1
        direction = _lane_direction(lane_map, tr.x[f, step], tr.y[f, step], tr.yaw[f, step])
        if direction is None:
            seen = tr.valid[f, s0: step + 1]
            yaws = tr.yaw[f, s0: step + 1][seen]
            direction = float(np.arctan2(np.sin(yaws).mean(), np.cos(yaws).mean()))
        nx, ny = -math.sin(direction), math.cos(direction)

        def sideways(r, s0=s0, step=step, nx=nx, ny=ny):
            return abs((tr.x[r, step] - tr.x[r, s0]) * nx + (tr.y[r, step] - tr.y[r, s0]) * ny)

        own = float(speed[f, step])
        closing = own - float(leaders.leader_speed[f, step])
        resp = decel[f, step: min(t, step + response + 1)]
        events.append({
            "follower": int(f), "step": step, "leader": new,
            "gap_m": g, "previous_gap_m": prev_gap, "speed": own,
            "time_gap_s": g / own if own >= params.min_speed else math.nan,
            "closing_mps": closing,
            "by_leader": bool(sideways(new) > sideways(f)),
            "response_decel": float(np.nanmax(resp)) if np.any(np.isfinite(resp)) else math.nan,
        })
    return events


# -- one clip ----------------------------------------------------------------------------------------------
@dataclass
class ClipHeadway:
    """What one clip gives: following samples (one per follower step with a leader, gap > 0), the
    braking of every moving vehicle step, the cut-in events, and counts."""

    samples: dict[str, np.ndarray]  # speed, gap_m, time_gap_s, closing_mps, ttc_s, required_decel, decel
    keys: np.ndarray  # [S] int64 identity of each sample's follower step (for de-duplication)
    braking: np.ndarray  # [B] deceleration of every moving vehicle step (NaN dropped)
    braking_speed: np.ndarray  # [B] the speed at those steps
    braking_keys: np.ndarray  # [B]
    vehicle_keys: np.ndarray  # every logged vehicle step
    cut_ins: list[dict]
    overlapping: int  # follower steps whose leader's box overlaps along the path (left out)


SAMPLE_FIELDS = ("speed", "gap_m", "time_gap_s", "closing_mps", "ttc_s", "required_decel", "decel")


def _step_keys(tr: Tracks, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """int64 identity of vehicle steps: id, absolute step and position to 0.1 m, hashed."""
    vid = tr.ids[rows].astype(np.int64)
    ab = (steps + tr.start_step).astype(np.int64)
    xi = np.round(tr.x[rows, steps] * 10.0).astype(np.int64)
    yi = np.round(tr.y[rows, steps] * 10.0).astype(np.int64)
    with np.errstate(over="ignore"):
        h = vid * np.int64(1_000_003) + ab
        h = h * np.int64(10_000_019) + xi
        h = h * np.int64(10_000_079) + yi
    return h


def clip_headway(clip: Clip, params: HeadwayParams | None = None) -> ClipHeadway:
    """Headway samples, braking and cut-ins of every vehicle of ``clip`` (see the module's docstring).
    Raises :class:`HeadwayInputError` naming the field for a clip with NaN or impossible values."""
    params = (params or HeadwayParams()).validate()
    tr = clip_tracks(clip)
    speed = tr.speed
    decel = deceleration(speed, tr.valid, tr.dt, params.accel_window_s)
    leaders = find_leaders(tr, params)
    vehicle = (tr.types == AGENT_VEHICLE)[:, None] & tr.valid
    has = leaders.index >= 0
    overlapping = int(np.count_nonzero(has & (leaders.gap_m <= 0.0)))
    use = has & (leaders.gap_m > 0.0)
    rows, steps = np.nonzero(use)
    own = speed[rows, steps]
    gap = leaders.gap_m[rows, steps]
    closing = own - leaders.leader_speed[rows, steps]
    approaching = closing > 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = {
            "speed": own,
            "gap_m": gap,
            "time_gap_s": np.where(own >= params.min_speed, gap / np.maximum(own, 1e-9), np.nan),
            "closing_mps": closing,
            "ttc_s": np.where(approaching, gap / np.where(approaching, closing, 1.0), np.nan),
            "required_decel": np.where(approaching, closing * closing / (2.0 * gap), np.nan),
            "decel": decel[rows, steps],
        }
    moving = vehicle & np.isfinite(decel) & (speed >= params.min_speed)
    b_rows, b_steps = np.nonzero(moving)
    return ClipHeadway(
        samples=samples, keys=_step_keys(tr, rows, steps),
        braking=decel[b_rows, b_steps], braking_speed=speed[b_rows, b_steps],
        braking_keys=_step_keys(tr, b_rows, b_steps),
        vehicle_keys=_step_keys(tr, *np.nonzero(vehicle)),
        cut_ins=find_cut_ins(tr, leaders, decel, params, clip.map),
        overlapping=overlapping)


# -- a dataset -----------------------------------------------------------------------------------------------
class _KeySet:
    """A growing set of int64 keys kept as one sorted array (cheaper than a set of Python ints)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)

    def fresh(self, keys: np.ndarray) -> np.ndarray:
        """[K] bool: the keys not seen before (the first of repeats within ``keys``); adds them."""
        keys = np.asarray(keys, np.int64)
        new = ~np.isin(keys, self.keys)
        _, first = np.unique(keys, return_index=True)
        once = np.zeros(len(keys), bool)
        once[first] = True
        new &= once
        self.keys = np.union1d(self.keys, keys[new])
        return new


@dataclass
class HeadwayAccumulator:
    """Samples of many clips, each vehicle step once (the first clip that logs it wins)."""

    params: HeadwayParams = field(default_factory=HeadwayParams)
    parts: dict[str, list[np.ndarray]] = field(default_factory=lambda: {k: [] for k in SAMPLE_FIELDS})
    braking: list[np.ndarray] = field(default_factory=list)
    braking_speed: list[np.ndarray] = field(default_factory=list)
    cut_ins: list[dict] = field(default_factory=list)
    clips: int = 0
    overlapping: int = 0
    vehicle_steps: int = 0
    duplicate_steps: int = 0
    dt: float | None = None
    _seen: _KeySet = field(default_factory=_KeySet)
    _seen_braking: _KeySet = field(default_factory=_KeySet)
    _seen_vehicle: _KeySet = field(default_factory=_KeySet)
    _seen_events: set = field(default_factory=set)

    def add(self, clip: Clip) -> ClipHeadway:
        """Add one clip's samples (vehicle steps seen before are skipped); returns the clip's own."""
        one = clip_headway(clip, self.params)
        self.clips += 1
        self.dt = clip.dt if self.dt is None else self.dt
        fresh = self._seen.fresh(one.keys)
        self.duplicate_steps += int(len(fresh) - fresh.sum())
        for k in SAMPLE_FIELDS:
            self.parts[k].append(one.samples[k][fresh])
        fb = self._seen_braking.fresh(one.braking_keys)
        self.braking.append(one.braking[fb])
        self.braking_speed.append(one.braking_speed[fb])
        self.vehicle_steps += int(self._seen_vehicle.fresh(one.vehicle_keys).sum())
        self.overlapping += one.overlapping
        # a cut-in counts once: follower, new leader and the log's step identify it
        start = _metadata_int(clip, _START_KEYS, 0)
        ids = np.concatenate([[_metadata_int(clip, _EGO_ID_KEYS, -1)], clip.agent_ids])
        for e in one.cut_ins:
            key = (int(ids[e["follower"]]), int(ids[e["leader"]]), e["step"] + start,
                   round(float(e["gap_m"]), 1))
            if key not in self._seen_events:
                self._seen_events.add(key)
                self.cut_ins.append(dict(e, clip_id=clip.clip_id))
        return one

    def arrays(self) -> dict[str, np.ndarray]:
        """The distributions: every de-duplicated following sample per field, plus ``braking`` and
        ``braking_speed`` of every moving vehicle step."""
        out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}
        out["braking"] = np.concatenate(self.braking) if self.braking else np.zeros(0)
        out["braking_speed"] = np.concatenate(self.braking_speed) if self.braking_speed else np.zeros(0)
        return out


def accumulate(clips: Iterable[Clip], params: HeadwayParams | None = None) -> HeadwayAccumulator:
    """:class:`HeadwayAccumulator` of ``clips``."""
    acc = HeadwayAccumulator(params=(params or HeadwayParams()).validate())
    for clip in clips:
        acc.add(clip)
    return acc


# -- summaries -----------------------------------------------------------------------------------------------
def percentiles(values: np.ndarray, qs: Sequence[float]) -> dict[str, float | None]:
    """{"p5": value, ...} of the finite ``values`` (None for each where there are none)."""
    vals = np.asarray(values, float)
    vals = vals[np.isfinite(vals)]
    names = [f"p{q:g}" for q in qs]
    if vals.size == 0:
        return dict.fromkeys(names)
    return {n: float(v) for n, v in zip(names, np.percentile(vals, qs), strict=True)}


def band_label(lo: float, hi: float) -> str:
    return f"{lo:g}+" if math.isinf(hi) else f"{lo:g}-{hi:g}"


def _figures(a: dict[str, np.ndarray], sel: np.ndarray, b_sel: np.ndarray, dt: float,
             min_samples: int = 1) -> dict:
    """The figures of the following samples ``sel`` and the moving steps ``b_sel``; percentiles are
    None where there are fewer than ``min_samples`` following samples (too few to say)."""
    count, b_count = int(sel.sum()), int(b_sel.sum())
    if count < min_samples:
        sel, b_sel = np.zeros_like(sel), np.zeros_like(b_sel)
    closing = a["closing_mps"][sel]
    return {
        "samples": count,
        "following_s": float(count * dt),
        "time_gap_s": percentiles(a["time_gap_s"][sel], LOW_PERCENTILES),
        "gap_m": percentiles(a["gap_m"][sel], LOW_PERCENTILES),
        "ttc_s": percentiles(a["ttc_s"][sel], LOW_PERCENTILES),
        "closing_mps": percentiles(closing, HIGH_PERCENTILES),
        "closing_share": float(np.mean(closing > 0.0)) if closing.size else None,
        "required_decel": percentiles(a["required_decel"][sel], HIGH_PERCENTILES),
        "decel_following": percentiles(a["decel"][sel], HIGH_PERCENTILES),
        "braking": percentiles(a["braking"][b_sel], HIGH_PERCENTILES),
        "braking_samples": b_count,
    }


def envelope(time_gap: np.ndarray, closing: np.ndarray, params: HeadwayParams) -> list[dict]:
    """Per time-gap bin: the samples and the p50 / p95 / p99 of the closing speed at that time gap
    (None in a bin with fewer than ``min_bin_count`` samples): the largest closing speeds humans accept
    at each time gap."""
    edges = np.asarray(params.time_gap_bins, float)
    ok = np.isfinite(time_gap) & np.isfinite(closing)
    tg, cl = time_gap[ok], closing[ok]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (tg >= lo) & (tg < hi)
        n = int(sel.sum())
        row = {"time_gap_lo": float(lo), "time_gap_hi": float(hi), "samples": n}
        enough = n >= params.min_bin_count
        row.update({k: (v if enough else None) for k, v in percentiles(cl[sel], (50.0, 95.0, 99.0)).items()})
        out.append(row)
    return out


def summarize(acc: HeadwayAccumulator) -> dict:
    """The statistics of an accumulator as a JSON-able dict: counts, ``all`` speeds and ``bands`` (per
    speed band of the follower: low percentiles of time gap / gap / TTC, high of closing speed,
    required deceleration, deceleration while following and braking of every moving step), the
    ``envelope`` of closing speed over time gap, and ``cut_ins``."""
    p = acc.params
    a = acc.arrays()
    dt = float(acc.dt or 0.1)
    n = a["speed"].size
    all_sel = np.ones(n, bool)
    b_all = np.isfinite(a["braking"])
    out = {
        "clips": acc.clips,
        "vehicle_steps": acc.vehicle_steps,
        "following_samples": int(n),
        "following_hours": n * dt / 3600.0,
        "duplicate_steps_skipped": acc.duplicate_steps,
        "overlapping_boxes_left_out": acc.overlapping,
        "dt": dt,
        "params": {k: ([None if math.isinf(e) else e for e in v] if isinstance(v, tuple) else v)
                   for k, v in p.__dict__.items()},
        "all": _figures(a, all_sel, b_all, dt),
        "bands": [],
    }
    edges = p.speed_bands
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (a["speed"] >= lo) & (a["speed"] < hi)
        b_sel = b_all & (a["braking_speed"] >= lo) & (a["braking_speed"] < hi)
        out["bands"].append({"band": band_label(lo, hi), "lo": lo, "hi": None if math.isinf(hi) else hi,
                             **_figures(a, sel, b_sel, dt, p.min_band_samples)})
    out["envelope"] = envelope(a["time_gap_s"], a["closing_mps"], p)
    ev = acc.cut_ins
    proper = [e for e in ev if e["by_leader"]]

    def dist(key, qs, events):
        return percentiles(np.array([e[key] for e in events], float), qs)

    out["cut_ins"] = {
        "events": len(ev),
        "by_leader": len(proper),
        "own_lane_changes": len(ev) - len(proper),
        "per_following_hour": len(proper) / (n * dt / 3600.0) if n else None,
        "gap_m": dist("gap_m", LOW_PERCENTILES, proper),
        "time_gap_s": dist("time_gap_s", LOW_PERCENTILES, proper),
        "closing_mps": dist("closing_mps", HIGH_PERCENTILES, proper),
        "response_decel": dist("response_decel", HIGH_PERCENTILES, proper),
    }
    return out
