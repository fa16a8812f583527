"""BEV-Warp closed-loop simulator: immutable batched state, pure step, latched execution (RAD-2 §3.2, §3.3.1).

A rollout replays a logged clip from ``start_step``. At log step ``t`` the planner sees the logged
observation of time ``t`` (BEV rasterised at the logged ego pose, tokens in that frame) warped into the
simulated ego frame (``warp.BevWarper``; tokens by ``warp.warp_tokens``) with the simulated
ego state. A committed plan is turned into controls by the batched iLQR tracker
(``rad2_control.TrackingController``); the controls are replayed open loop for ``latch.h_reuse``
steps (latched execution) unless the safety check fires (``T_t < latch.ttc_break_s`` or a collision),
which ends the latch so the next step is a decision point. Every step integrates the kinematic bicycle
for ``sim.dt``, advances the log, checks collisions (with at-fault attribution), time to collision
(Eq. 12) and the drivable area, and records the ego track. An episode ends at the end of the clip (or
after ``sim.max_steps``), on a collision (``sim.terminate_on_collision``) or off-road
(``sim.terminate_on_offroad``).

**Purity.** :class:`SimState` is a frozen value: its arrays are read-only, its histories and decision
points are tuples of immutable records, and it holds no reference to the simulator — clips are named
by a content key in a process-wide registry (:func:`register_clip`), so a state pickles to a few kB
and a worker process resolves the same key after registering the same clip. ``commit`` and ``step``
return new states and never touch their input, so any number of continuations can branch from one
state (GRPO groups). Outcomes and rewards are pure functions of the finished rollout's
:class:`~bev_warp_sim.trace.EpisodeTrace` (:meth:`Simulator.trace`,
:func:`bev_warp_sim.metrics.episode_outcome`, :data:`bev_warp_sim.rewards.REWARDS`).

Agents are replayed from the log (non-reactive, the paper's setting) or, with
``sim.reactive_agents``, follow their logged paths with an IDM speed that reacts to the ego when it is
in front of them on their path (never getting ahead of their logged progress). Reactive observations
are rasterised directly at the simulated pose from the simulated scene (the logged features would show
the agents where the log had them) and TTC uses the agents' constant-speed continuation along their
paths.

Everything is batched: ``B`` rollouts (any mix of clips and start steps) step together; the single-
rollout functions :func:`init`, :func:`observe` and :func:`step` are the ``B = 1`` case. The driving
loop (observe → plan → commit → step) lives in :mod:`bev_warp_sim.rollout`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
from rad2_core.geometry import wrap_angle
from rad2_core.planning_interface import PlanResult
from rad2_core.route_path import RouteError, RouteLimits, check_route
from rad2_core.stop_lines import next_signal_stop, stop_line_crossings
from rad2_core.validators import PlausibilityError, check_clip, load_limits

from bev_warp_sim import safety
from bev_warp_sim.metrics import EpisodeResult, episode_outcome
from bev_warp_sim.trace import DecisionPoint, EpisodeTrace, frozen_array
from bev_warp_sim.warp import BevWarper, view_uncovered_fraction, warp_tokens


class SimulationError(ValueError):
    """Bad simulator input (message names the field and value)."""


@dataclass
class Controls:
    """An explicit control sequence ``[H, 2]`` (accel m/s², steering rate rad/s) to latch."""

    values: np.ndarray


@dataclass
class SimContext:
    """What privileged reference policies may read before planning (never given to learned ones)."""

    clip: Any
    step: int
    pose: np.ndarray
    ego_state: np.ndarray  # bicycle state (x, y, yaw, v, delta)


# ----------------------------------------------------------------------------------------------------
# clip registry: states name clips by content key


_REGISTRY: OrderedDict[str, Any] = OrderedDict()


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


# ----------------------------------------------------------------------------------------------------
# static per-clip / per-map data


class _MapGeometry:
    """Drivable area (for off-road) and lane segments (road heading for at-fault) of one map."""

    def __init__(self, lane_map, margin: float):
        import shapely
        from shapely.geometry import Polygon

        polys = []
        for p in lane_map.drivable_areas:
            if len(p) >= 3:
                polys.append(Polygon(p).buffer(0))
        for left, right in zip(lane_map.left_boundaries, lane_map.right_boundaries):
            ring = np.concatenate([left, right[::-1]])
            if len(ring) >= 3:
                polys.append(Polygon(ring).buffer(0))
        self.area = shapely.unary_union(polys).buffer(margin) if polys else None
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


class _ClipData:
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


# ----------------------------------------------------------------------------------------------------
# state


@dataclass(frozen=True)
class SimState:
    """State of ``B`` rollouts, an immutable value. Arrays have a leading batch axis and are read-only;
    histories hold one entry per step (``ego_hist[k]`` is ``[B, 6]``); ``decisions[b]`` and
    ``collisions[b]`` are tuples of immutable records of rollout ``b``."""

    clip_keys: tuple[str, ...]  # registry keys (register_clip)
    start: np.ndarray  # [B] first log step
    end: np.ndarray  # [B] last log step of the planned window
    t: np.ndarray  # [B] current log step
    ego: np.ndarray  # [B, 5] bicycle state x, y, yaw, v, delta
    accel: np.ndarray  # [B] last applied acceleration
    controls: np.ndarray  # [B, H, 2] latched controls
    latch_pos: np.ndarray  # [B] index of the next latched control
    latch_len: np.ndarray  # [B] controls to replay (0: no latch)
    needs_plan: np.ndarray  # [B] bool: the next step is a decision point
    break_reason: tuple[str, ...]
    done: np.ndarray  # [B] bool
    termination: tuple[str, ...]
    collided: np.ndarray  # [B] bool
    at_fault: np.ndarray  # [B] bool
    offroad: np.ndarray  # [B] bool
    collisions: tuple[tuple[dict, ...], ...]
    agent_pose: np.ndarray  # [B, N, 3] current agent poses (reactive: simulated)
    agent_vel: np.ndarray  # [B, N, 2]
    agent_valid: np.ndarray  # [B, N]
    agent_s: np.ndarray  # [B, N] reactive progress along the logged path
    agent_v: np.ndarray  # [B, N] reactive speed
    ego_hist: tuple[np.ndarray, ...]  # per step [B, 6]: x, y, yaw, v, delta, accel
    ttc_hist: tuple[np.ndarray, ...]  # per step [B] T_t (step 0: the start state)
    rear_ttc_hist: tuple[np.ndarray, ...]  # per step [B] T^rear_t, the follower's (safety module)
    agent_hist: tuple[np.ndarray, ...]  # reactive only: per step [B, N, 3]
    decisions: tuple[tuple[DecisionPoint, ...], ...]
    steps_taken: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray) and v.flags.writeable:
                object.__setattr__(self, f.name, frozen_array(v))

    @property
    def batch_size(self) -> int:
        return int(len(self.t))

    def ego_track(self, b: int) -> np.ndarray:
        """``[n, 6]`` recorded ego states of rollout ``b`` (x, y, yaw, v, delta, accel)."""
        n = int(self.t[b] - self.start[b]) + 1
        return np.stack([h[b] for h in self.ego_hist[:n]]) if self.ego_hist else np.zeros((0, 6))

    def ttc_track(self, b: int) -> np.ndarray:
        n = int(self.t[b] - self.start[b]) + 1
        return np.array([h[b] for h in self.ttc_hist[:n]])

    def rear_ttc_track(self, b: int) -> np.ndarray:
        n = int(self.t[b] - self.start[b]) + 1
        return np.array([h[b] for h in self.rear_ttc_hist[:n]])

    def agent_track(self, b: int) -> list[np.ndarray]:
        """Reactive agents: per step ``[N, 3]`` simulated poses of rollout ``b`` (empty when log-replayed)."""
        n = int(self.t[b] - self.start[b]) + 1
        return [h[b] for h in self.agent_hist[:n]]


def _with_row(items: tuple, b: int, value) -> tuple:
    return items[:b] + (value,) + items[b + 1:]


# ----------------------------------------------------------------------------------------------------
# simulator


class Simulator:
    """Holds parameters, the controller, the warper and caches; every method is pure in the state.

    ``params``: params/sim.yaml, bev.yaml, planner.yaml, controller.yaml, vehicle.yaml and
    validators.yaml as the entry point loaded them, merged (:func:`rad2_core.config.load_merged`);
    ``controller``: a tracker to use instead of the one those files describe.
    """

    def __init__(self, params: dict[str, Any], controller=None):
        from rad2_control.tracker import TrackingController

        self.params = params
        self.bev_params = params
        self.plan_dt = float(params["planner"]["plan_dt"])
        cfg = self.params["sim"]
        self.dt = float(cfg["dt"])
        self.reactive = bool(cfg["reactive_agents"])
        self.controller = controller if controller is not None else TrackingController(params, params)
        # the simulated vehicle is the controller's (an injected controller may model another vehicle)
        self.vehicle_params = {"vehicle": asdict(self.controller.vehicle)}
        if abs(self.controller.dt - self.dt) > 1e-9:
            raise SimulationError(f"sim.dt: {self.dt} differs from controller.dt {self.controller.dt}")
        self.warper = BevWarper(self.bev_params, backend=str(cfg["warp_backend"]))
        self.observation_channels = self.warper.cfg.channels  # the BEV channels its observations carry
        self.max_uncovered = float(cfg["warp_max_uncovered"])
        if not 0.0 <= self.max_uncovered <= 1.0:
            raise SimulationError(f"sim.warp_max_uncovered: {self.max_uncovered} must be in [0, 1]")
        tcfg = self.params["ttc"]
        if abs(float(tcfg["dt"]) - self.dt) > 1e-9:
            raise SimulationError(f"ttc.dt: {tcfg['dt']} must equal sim.dt {self.dt}")
        self.look = int(round(float(tcfg["t_max"]) / self.dt))
        self.t_max = float(tcfg["t_max"])
        self.h_reuse = int(self.params["latch"]["h_reuse"])
        if self.h_reuse < 1:
            raise SimulationError(f"latch.h_reuse: must be >= 1, got {self.h_reuse}")
        self.registry_size = int(cfg["clip_registry_size"])
        self._clip_limits = load_limits(params)  # params/validators.yaml: a log of the impossible is refused
        self._maps: dict[str, _MapGeometry] = {}
        self._clips: OrderedDict[str, _ClipData] = OrderedDict()
        self._obs_cache: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._obs_cache_size = int(cfg["feature_cache_steps"])
        self.wheelbase = float(self.vehicle_params["vehicle"]["wheelbase"])

    # -- caches ---------------------------------------------------------------------------------------
    def map_geometry(self, lane_map) -> _MapGeometry:
        key = lane_map.map_id
        if key not in self._maps:
            self._maps[key] = _MapGeometry(lane_map, float(self.params["sim"]["offroad_margin_m"]))
        return self._maps[key]

    def clip_data(self, key: str) -> _ClipData:
        """Derived arrays of the registered clip ``key`` (cached; rebuilt from the registry when evicted)."""
        data = self._clips.get(key)
        if data is None:
            clip = registered_clip(key)
            bad = check_clip(clip, self._clip_limits)
            if bad:
                what = f"clip {clip.clip_id!r} is not a drivable log"
                raise SimulationError(str(PlausibilityError(what, bad)))
            data = _ClipData(clip, self.look, RouteLimits.from_params(self.params))
            self._clips[key] = data
            while len(self._clips) > 256:
                self._clips.popitem(last=False)
        else:
            self._clips.move_to_end(key)
        return data

    def clip(self, state: SimState, b: int):
        return self.clip_data(state.clip_keys[b]).clip

    def logged_observation(self, clip, t: int, key: str | None = None):
        """The logged observation of step ``t`` (BEV + tokens at the logged pose); cached per (clip, t)."""
        from rad2_core.bev import snapshot_from_clip
        from rad2_core.observation import build_observation

        cache_key = (key or clip_key(clip), int(t))
        obs = self._obs_cache.get(cache_key)
        if obs is None:
            snap = snapshot_from_clip(clip, int(t), self.bev_params, self.vehicle_params)
            obs = build_observation(snap, params=self.bev_params)
            self._obs_cache[cache_key] = obs
            while len(self._obs_cache) > self._obs_cache_size:
                self._obs_cache.popitem(last=False)
        else:
            self._obs_cache.move_to_end(cache_key)
        return obs

    # -- init -----------------------------------------------------------------------------------------
    def init(self, clips, start_steps=0, max_steps: int | None = None) -> SimState:
        """Start ``B`` rollouts: ``clips`` a Clip or a list; ``start_steps`` an int or one per clip."""
        from rad2_core.bev import ego_state_from_clip

        clips = [clips] if not isinstance(clips, list | tuple) else list(clips)
        if not clips:
            raise SimulationError("clips: empty list")
        b = len(clips)
        starts = np.broadcast_to(np.asarray(start_steps, dtype=np.int64), (b,)).copy()
        keys = tuple(register_clip(c, self.registry_size) for c in clips)
        data = [self.clip_data(k) for k in keys]
        max_steps = int(self.params["sim"]["max_steps"]) if max_steps is None else int(max_steps)
        ends = np.empty(b, dtype=np.int64)
        for i, (c, s) in enumerate(zip(clips, starts)):
            if abs(float(c.dt) - self.dt) > 1e-3 * self.dt:
                raise SimulationError(f"clips[{i}].dt: {c.dt} s differs from sim.dt {self.dt} s (clip "
                                      f"{c.clip_id!r}; resample it first)")
            if not 0 <= s < c.num_steps - 1:
                raise SimulationError(
                    f"start_steps[{i}]: {int(s)} outside [0, {c.num_steps - 2}] for clip {c.clip_id!r}")
            ends[i] = c.num_steps - 1 if max_steps <= 0 else min(c.num_steps - 1, s + max_steps)
            self.map_geometry(c.map)
        ego = np.zeros((b, 5))
        accel = np.zeros(b)
        for i, (c, s) in enumerate(zip(clips, starts)):
            es = ego_state_from_clip(c, int(s), self.wheelbase)
            ego[i] = [c.ego_x[s], c.ego_y[s], c.ego_yaw[s], es[0], es[3]]
            accel[i] = es[1]
        vmax = self.controller.vehicle.max_steer
        ego[:, 4] = np.clip(ego[:, 4], -vmax, vmax)
        n_max = max((d.boxes.shape[0] for d in data), default=0)
        pose, vel = np.zeros((b, n_max, 3)), np.zeros((b, n_max, 2))
        valid, agent_s, agent_v = np.zeros((b, n_max), bool), np.zeros((b, n_max)), np.zeros((b, n_max))
        for i, d in enumerate(data):
            n = d.boxes.shape[0]
            s = int(starts[i])
            pose[i, :n] = d.boxes[:, s, :3]
            vel[i, :n] = d.vel[:, s]
            valid[i, :n] = d.valid[:, s]
            agent_s[i, :n] = d.agent_s[:, s]
            agent_v[i, :n] = d.agent_speed[:, s]
        h = self.controller.horizon
        state = SimState(
            clip_keys=keys, start=starts, end=ends, t=starts.copy(), ego=ego, accel=accel,
            controls=np.zeros((b, h, 2)), latch_pos=np.zeros(b, np.int64), latch_len=np.zeros(b, np.int64),
            needs_plan=np.ones(b, bool), break_reason=("start",) * b, done=np.zeros(b, bool),
            termination=("",) * b, collided=np.zeros(b, bool), at_fault=np.zeros(b, bool),
            offroad=np.zeros(b, bool), collisions=((),) * b, agent_pose=pose, agent_vel=vel,
            agent_valid=valid, agent_s=agent_s, agent_v=agent_v,
            ego_hist=(frozen_array(np.column_stack([ego, accel])),), ttc_hist=(), rear_ttc_hist=(),
            agent_hist=(), decisions=((),) * b,
        )
        ttc, rear_ttc = self._ttc(state)
        return replace(state, ttc_hist=(frozen_array(ttc),), rear_ttc_hist=(frozen_array(rear_ttc),),
                       agent_hist=(frozen_array(pose.copy()),) if self.reactive else ())

    # -- observation ----------------------------------------------------------------------------------
    def ego_state_vector(self, state: SimState) -> np.ndarray:
        """``[B, 4]`` (speed, accel, yaw rate, steering) of the simulated ego, the Observation layout."""
        return self._ego_state_vector(np.asarray(state.ego), np.asarray(state.accel))

    def _ego_state_vector(self, ego: np.ndarray, accel: np.ndarray) -> np.ndarray:
        from rad2_core.bicycle import slip_and_curvature

        _, kappa = slip_and_curvature(ego[:, 4], self.controller.vehicle)
        return np.column_stack([ego[:, 3], accel, ego[:, 3] * kappa, ego[:, 4]])

    def observe(self, state: SimState, indices=None) -> list:
        """Observations of rollouts ``indices`` (default: all), each an unbatched ``Observation``."""
        idx = list(range(state.batch_size)) if indices is None else [int(i) for i in indices]
        if not idx:
            return []
        if self.reactive:
            return [self._render_reactive(state, i) for i in idx]
        keys = [state.clip_keys[i] for i in idx]
        return self._warped(keys, [int(state.t[i]) for i in idx], np.asarray(state.ego[idx]),
                            np.asarray(state.accel[idx]))

    def observation_at(self, clip, step: int, ego_state, accel: float):
        """The observation a policy saw at log step ``step`` with the ego in bicycle state ``ego_state``
        (x, y, yaw, v, δ) and acceleration ``accel`` — what a decision point records, rendered again for
        a trainer (log-replayed agents only: reactive agents' poses are not part of a decision)."""
        if self.reactive:
            raise SimulationError("observation_at: reactive agents are not recorded in decision points")
        ego = np.asarray(ego_state, dtype=np.float64).reshape(1, 5)
        return self._warped([register_clip(clip, self.registry_size)], [int(step)], ego,
                            np.array([float(accel)]))[0]

    def _warped(self, keys: list[str], steps: list[int], ego: np.ndarray, accel: np.ndarray) -> list:
        """The logged observations of (clip, step), warped into the simulated ego poses (BEV and tokens).

        A warp can only move what the logged raster holds: where the simulated ego has fallen more than
        a few metres behind the logged one (or turned away from it), part of its view lies outside the
        logged raster and comes out empty, and once it is 16 m behind, the ego stands on a blank BEV and
        no planner can recover (the laggard's spiral: a worse view, a worse plan, a longer lag). Rows
        whose view is uncovered beyond ``sim.warp_max_uncovered`` are therefore rendered afresh at the
        simulated pose from the clip's map and logged agents, which the rasterised BEV makes exact."""
        es = self._ego_state_vector(ego, accel).astype(np.float32)
        clips = [self.clip_data(k).clip for k in keys]
        logged = [self.logged_observation(c, t, k) for c, t, k in zip(clips, steps, keys)]
        ref_pose = np.stack([c.ego_pose(t) for c, t in zip(clips, steps)])
        bev = self.warper(np.stack([o.bev for o in logged]), ref_pose, ego[:, :3])
        uncovered = np.zeros(len(keys))  # 1.0: the pure warp, nothing to measure on the hot path
        if self.max_uncovered < 1.0:
            uncovered = view_uncovered_fraction(self.warper.cfg, ref_pose, ego[:, :3])
        out = []
        for k in range(len(keys)):
            if uncovered[k] > self.max_uncovered:
                out.append(self._rendered_at(clips[k], steps[k], ego[k], es[k]))
                continue
            o = warp_tokens(logged[k], ref_pose[k], ego[k, :3])
            o.bev = bev[k]
            o.ego_state = es[k].copy()
            c = clips[k]
            if c.map.num_signals:  # the stop line's distance from the simulated ego, not the logged one
                o.signal_stop = next_signal_stop(c.map, c.signals_at(steps[k]), c.route_lane_ids,
                                                 c.route_polyline, ego[k, :3], c.ego_length)
            out.append(o)
        return out

    def _rendered_at(self, clip, t: int, ego: np.ndarray, ego_state: np.ndarray):
        """The observation of log step ``t`` (map and logged agents) rendered at the simulated ego pose."""
        from rad2_core.bev import snapshot_from_clip
        from rad2_core.observation import build_observation

        snap = snapshot_from_clip(clip, int(t), self.bev_params, self.vehicle_params)
        return build_observation(snap, ego_pose=ego[:3], ego_state=ego_state.copy(), params=self.bev_params)

    def _render_reactive(self, state: SimState, i: int):
        from rad2_core.bev import AgentFrame, snapshot_from_clip
        from rad2_core.observation import build_observation

        d = self.clip_data(state.clip_keys[i])
        clip = d.clip
        t = int(state.t[i])
        snap = snapshot_from_clip(clip, t, self.bev_params, self.vehicle_params)
        n = clip.num_agents

        def frame(poses, valid, vel):
            ok = np.flatnonzero(valid[:n])
            return AgentFrame(clip.agent_ids[ok], clip.agent_types[ok], poses[ok, 0], poses[ok, 1],
                              poses[ok, 2], vel[ok, 0], vel[ok, 1], clip.agent_length[ok],
                              clip.agent_width[ok])

        snap.agents = frame(state.agent_pose[i], state.agent_valid[i], state.agent_vel[i])
        steps_in = t - int(state.start[i])
        for k in list(snap.history):
            j = max(steps_in - k, 0)
            poses = state.agent_hist[j][i]
            valid = d.valid[:, max(t - k, 0)]
            snap.history[k] = frame(poses, valid, np.zeros((len(poses), 2)))
        es = self.ego_state_vector(state)[i]
        return build_observation(snap, ego_pose=state.ego[i, :3], ego_state=es, params=self.bev_params)

    def context(self, state: SimState, i: int) -> SimContext:
        return SimContext(clip=self.clip(state, i), step=int(state.t[i]), pose=state.ego[i, :3].copy(),
                          ego_state=state.ego[i].copy())

    # -- decisions ------------------------------------------------------------------------------------
    def needs_decision(self, state: SimState) -> np.ndarray:
        return state.needs_plan & ~state.done

    def commit(self, state: SimState, actions: dict[int, Any], observations: dict[int, Any] | None = None,
               h_reuse: int | None = None) -> SimState:
        """A new state with new actions latched for some rollouts (``{b: PlanResult | [T, 2] ego-frame plan
        | Controls}``); ``observations`` optionally kept in the decision points.

        Plans are tracked by one batched iLQR solve; ``h_reuse`` overrides ``latch.h_reuse``.
        """
        h_reuse = self.h_reuse if h_reuse is None else int(h_reuse)
        if h_reuse < 1:
            raise SimulationError(f"h_reuse: must be >= 1, got {h_reuse}")
        controls, latch_len = state.controls.copy(), state.latch_len.copy()
        latch_pos = state.latch_pos.copy()
        needs_plan, decisions = state.needs_plan.copy(), state.decisions
        horizon = controls.shape[1]
        plans: list[tuple[int, np.ndarray, float]] = []
        for b, act in actions.items():
            b = int(b)
            if not 0 <= b < state.batch_size:
                raise SimulationError(f"actions: rollout index {b} outside [0, {state.batch_size})")
            if state.done[b]:
                continue
            record: dict[str, Any] = {}
            if isinstance(act, Controls):
                u = np.asarray(act.values, dtype=np.float64)
                if u.ndim != 2 or u.shape[1] != 2 or len(u) < 1 or not np.isfinite(u).all():
                    raise SimulationError(
                        f"actions[{b}]: controls must be a finite [H, 2] array, got shape {u.shape}")
                h = min(len(u), horizon)
                controls[b] = 0.0
                controls[b, :h] = u[:h]
                latch_len[b] = min(h_reuse, h)
            else:
                traj, plan_dt, record = _plan_record(act, self.plan_dt)
                if traj.ndim != 2 or traj.shape[1] != 2 or len(traj) < 1 or not np.isfinite(traj).all():
                    raise SimulationError(f"actions[{b}]: trajectory must be a finite [T, 2] array, got "
                                          f"shape {traj.shape}")
                plans.append((b, traj, plan_dt))
                latch_len[b] = min(h_reuse, horizon)
            dp = DecisionPoint(step=int(state.t[b]), ego_state=frozen_array(state.ego[b].copy()),
                               accel=float(state.accel[b]), reason=state.break_reason[b],
                               observation=None if observations is None else observations.get(b), **record)
            latch_pos[b] = 0
            needs_plan[b] = False
            decisions = _with_row(decisions, b, decisions[b] + (dp,))
        # group by (T, plan_dt) so one reference build + one iLQR solve serves each group
        groups: dict[tuple[int, float], list[int]] = {}
        for k, (_, traj, pdt) in enumerate(plans):
            groups.setdefault((len(traj), pdt), []).append(k)
        for (_, pdt), ks in groups.items():
            rows = [plans[k][0] for k in ks]
            pts = np.stack([plans[k][1] for k in ks])
            ego = np.asarray(state.ego[rows])
            ref = self.controller.reference(pts, pdt, ego[:, :3], frame="ego")
            controls[rows] = self.controller.solve(ego, ref).controls
        return replace(state, controls=controls, latch_len=latch_len, latch_pos=latch_pos,
                       needs_plan=needs_plan, decisions=decisions)

    # -- step -----------------------------------------------------------------------------------------
    def step(self, state: SimState) -> tuple[SimState, dict[str, Any]]:
        """The state one step later for every running rollout (its next latched control); pure."""
        from rad2_core.bicycle import clamp_controls
        from rad2_core.bicycle import step as bicycle_step

        run = ~state.done
        # a pending decision is a request: without a new commit the latched sequence continues while it lasts
        missing = run & ((state.latch_len == 0) | (state.latch_pos >= state.controls.shape[1]))
        if missing.any():
            raise SimulationError(
                f"step: rollouts {np.flatnonzero(missing).tolist()} have no controls left (commit an action)")
        rows = np.flatnonzero(run)
        ego, accel = state.ego.copy(), state.accel.copy()
        latch_pos, t = state.latch_pos.copy(), state.t.copy()
        u = state.controls[rows, latch_pos[rows]]
        u = clamp_controls(ego[rows], u, self.controller.vehicle, self.dt)
        ego[rows] = bicycle_step(ego[rows], u, self.controller.vehicle, self.dt)
        ego[rows, 2] = wrap_angle(ego[rows, 2])
        accel[rows] = u[:, 0]
        latch_pos[rows] += 1
        t[rows] += 1
        moved = replace(state, ego=ego, accel=accel, latch_pos=latch_pos, t=t,
                        **self._advance_agents(state, t, ego, rows))
        ttc, rear_ttc = self._ttc(moved)
        hits, collided, at_fault, collisions = self._collisions(moved, rows)
        on_road = self._on_road(moved, rows)
        cfg = self.params["sim"]
        ttc_break = float(self.params["latch"]["ttc_break_s"])
        needs_plan, offroad, done = state.needs_plan.copy(), state.offroad.copy(), state.done.copy()
        break_reason, termination = list(state.break_reason), list(state.termination)
        finished = []
        for k, b in enumerate(rows):
            if hits[k] or ttc[b] < ttc_break:
                needs_plan[b] = True
                break_reason[b] = "safety"
            elif latch_pos[b] >= state.latch_len[b]:
                needs_plan[b] = True
                break_reason[b] = "latch_done"
            if not on_road[k]:
                offroad[b] = True
            term = ""
            if hits[k] and cfg["terminate_on_collision"]:
                term = "collision"
            elif not on_road[k] and cfg["terminate_on_offroad"]:
                term = "offroad"
            elif t[b] >= state.end[b]:
                at_clip_end = state.end[b] == self.clip_data(state.clip_keys[b]).num_steps - 1
                term = "clip_end" if at_clip_end else "max_steps"
            if term:
                done[b] = True
                termination[b] = term
                finished.append(int(b))
        new = replace(
            moved, needs_plan=needs_plan, break_reason=tuple(break_reason), offroad=offroad, done=done,
            termination=tuple(termination), collided=collided, at_fault=at_fault, collisions=collisions,
            ego_hist=state.ego_hist + (frozen_array(np.column_stack([ego, accel])),),
            ttc_hist=state.ttc_hist + (frozen_array(np.where(run, ttc, state.ttc_hist[-1])),),
            rear_ttc_hist=state.rear_ttc_hist + (
                frozen_array(np.where(run, rear_ttc, state.rear_ttc_hist[-1])),),
            agent_hist=state.agent_hist + ((frozen_array(moved.agent_pose.copy()),) if self.reactive else ()),
            steps_taken=state.steps_taken + 1,
        )
        return new, {"ttc": ttc, "collided": collided.copy(), "finished": finished}

    # -- physics of the scene -------------------------------------------------------------------------
    def _advance_agents(self, state: SimState, t: np.ndarray, ego: np.ndarray, rows) -> dict[str, np.ndarray]:
        """New agent arrays for log step ``t`` (log replay, or the reactive IDM step)."""
        out = {k: getattr(state, k).copy() for k in ("agent_pose", "agent_vel", "agent_valid", "agent_s",
                                                     "agent_v")}
        for b in rows:
            d = self.clip_data(state.clip_keys[b])
            n = d.boxes.shape[0]
            tb = int(t[b])
            if not self.reactive:
                out["agent_pose"][b, :n] = d.boxes[:, tb, :3]
                out["agent_vel"][b, :n] = d.vel[:, tb]
                out["agent_valid"][b, :n] = d.valid[:, tb]
            else:
                self._reactive_step(out, d, b, tb, ego[b])
        return out

    def _reactive_step(self, agents: dict[str, np.ndarray], d: _ClipData, b: int, t: int, ego) -> None:
        """IDM along the logged path towards the logged progress, braking for an ego ahead on the path.

        Writes row ``b`` of the (fresh, not yet frozen) agent arrays ``agents``."""
        cfg = self.params["reactive"]
        clip = d.clip
        n = d.boxes.shape[0]
        el, ew = clip.ego_length, clip.ego_width
        pose_a, vel_a, valid_a = agents["agent_pose"], agents["agent_vel"], agents["agent_valid"]
        s_a, v_a = agents["agent_s"], agents["agent_v"]
        for j in range(n):
            if not d.valid[j, t]:
                valid_a[b, j] = False
                continue
            s_log = d.agent_s[j, t]
            if not valid_a[b, j]:  # (re)appears: start on the log
                s_a[b, j], v_a[b, j] = s_log, d.agent_speed[j, t]
            s, v = s_a[b, j], v_a[b, j]
            pose = pose_a[b, j]
            c, sn = np.cos(pose[2]), np.sin(pose[2])
            dx, dy = ego[0] - pose[0], ego[1] - pose[1]
            lon, lat = c * dx + sn * dy, -sn * dx + c * dy
            leader = (0.0 < lon < float(cfg["lookahead_m"])) and (
                abs(lat) < 0.5 * (clip.agent_width[j] + ew) + float(cfg["lateral_margin"]))
            if not leader and s >= s_log - 1e-6:
                s_new, v_new = s_log, d.agent_speed[j, t]
            else:
                v0 = max(d.agent_speed[j, t] + 0.5 * max(s_log - s, 0.0), 0.5)
                acc = float(cfg["a_max"]) * (1.0 - (v / v0) ** float(cfg["delta"]))
                if leader:
                    gap = max(lon - 0.5 * (clip.agent_length[j] + el), 0.1)
                    dv = v - ego[3] * np.cos(wrap_angle(ego[2] - pose[2]))
                    s_star = float(cfg["min_gap"]) + max(
                        0.0, v * float(cfg["time_headway"])
                        + v * dv / (2.0 * np.sqrt(float(cfg["a_max"]) * float(cfg["b_comfort"]))))
                    acc -= float(cfg["a_max"]) * (s_star / gap) ** 2
                acc = max(acc, -float(cfg["b_max"]))
                v_new = max(0.0, v + acc * self.dt)
                s_new = min(s + v_new * self.dt, s_log)
            # pose on the logged path at arc length s_new (first logged time with that progress)
            valid_t = np.flatnonzero(d.valid[j, : d.num_steps])
            sp = d.agent_s[j, valid_t]
            k = int(np.clip(np.searchsorted(sp, s_new, side="left"), 0, len(valid_t) - 1))
            k0 = max(k - 1, 0)
            ta, tb = valid_t[k0], valid_t[k]
            span = sp[k] - sp[k0]
            f = 0.0 if span <= 1e-9 else float(np.clip((s_new - sp[k0]) / span, 0.0, 1.0))
            xa, xb = d.boxes[j, ta, :3], d.boxes[j, tb, :3]
            yaw = xa[2] + f * wrap_angle(xb[2] - xa[2])
            pose_a[b, j] = [xa[0] + f * (xb[0] - xa[0]), xa[1] + f * (xb[1] - xa[1]), wrap_angle(yaw)]
            vel_a[b, j] = v_new * np.array([np.cos(yaw), np.sin(yaw)])
            s_a[b, j], v_a[b, j] = s_new, v_new
            valid_a[b, j] = True

    def _agent_future(self, state: SimState) -> tuple[np.ndarray, np.ndarray]:
        """``[B, N, K+1, 5]`` agent boxes over the look-ahead and their validity."""
        b = state.batch_size
        n_max = state.agent_pose.shape[1]
        k1 = self.look + 1
        boxes = np.zeros((b, n_max, k1, 5))
        valid = np.zeros((b, n_max, k1), bool)
        tau = np.arange(k1) * self.dt
        for i, key in enumerate(state.clip_keys):
            d = self.clip_data(key)
            n = d.boxes.shape[0]
            if n == 0:
                continue
            t = int(state.t[i])
            if not self.reactive:
                boxes[i, :n] = d.boxes[:, t:t + k1]
                valid[i, :n] = d.valid[:, t:t + k1]
            else:  # constant velocity from the simulated state
                p, v = state.agent_pose[i, :n], state.agent_vel[i, :n]
                boxes[i, :n, :, 0] = p[:, None, 0] + v[:, None, 0] * tau
                boxes[i, :n, :, 1] = p[:, None, 1] + v[:, None, 1] * tau
                boxes[i, :n, :, 2] = p[:, None, 2]
                boxes[i, :n, :, 3:] = d.boxes[:, t:t + 1, 3:]
                valid[i, :n] = state.agent_valid[i, :n, None]
        return boxes, valid

    def _ego_sizes(self, state: SimState) -> np.ndarray:
        clips = (self.clip_data(k).clip for k in state.clip_keys)
        return np.array([[c.ego_length, c.ego_width] for c in clips])

    def _ttc(self, state: SimState) -> tuple[np.ndarray, np.ndarray]:
        """``(T_t, T^rear_t)`` of every rollout (``[B]`` each) from one overlap test."""
        from rad2_core.bicycle import slip_and_curvature

        boxes, valid = self._agent_future(state)
        _, kappa = slip_and_curvature(state.ego[:, 4], self.controller.vehicle)
        return safety.ttc_at_state(state.ego[:, :3], state.ego[:, 3], state.ego[:, 3] * kappa,
                                   self._ego_sizes(state), boxes, valid, self.params, with_rear=True)

    def _collisions(self, state: SimState, rows):
        """(hit per row in ``rows``, new collided, at_fault and collision records) after a step."""
        hits = np.zeros(len(rows), bool)
        collided, at_fault = state.collided.copy(), state.at_fault.copy()
        collisions = state.collisions
        for k, b in enumerate(rows):
            d = self.clip_data(state.clip_keys[b])
            n = d.boxes.shape[0]
            if n == 0:
                continue
            clip = d.clip
            ego_box = np.array([*state.ego[b, :3], clip.ego_length, clip.ego_width])
            agent_boxes = np.concatenate([state.agent_pose[b, :n], d.boxes[:, 0, 3:]], axis=1)
            hit = safety.collisions(ego_box, agent_boxes, state.agent_valid[b, :n])
            if not hit.any():
                continue
            hits[k] = True
            collided[b] = True
            known = {c["agent_index"] for c in collisions[b]}
            ev = state.ego[b, 3] * np.array([np.cos(state.ego[b, 2]), np.sin(state.ego[b, 2])])
            ran_red = self._ran_red_recently(state, b, clip)
            new = []
            for j in np.flatnonzero(hit):
                if int(j) in known:
                    continue
                geom = self.map_geometry(clip.map)
                pt = safety.contact_point(ego_box, agent_boxes[j])
                info = safety.classify_collision(
                    ego_box, ev, agent_boxes[j], state.agent_vel[b, j], self.params, agent_index=int(j),
                    road_heading=geom.road_heading(pt), ego_ran_red=ran_red)
                new.append({"step": int(state.t[b]), "agent_id": int(clip.agent_ids[j]),
                            "agent_type": int(clip.agent_types[j]), **info.as_dict()})
                if info.at_fault:
                    at_fault[b] = True
            if new:
                collisions = _with_row(collisions, b, collisions[b] + tuple(new))
        return hits, collided, at_fault, collisions

    def _ran_red_recently(self, state: SimState, b: int, clip) -> bool:
        """Whether the ego's front crossed a red stop line of its route within the last
        ``at_fault.red_light_window_s`` (right of way at signals for the at-fault rule)."""
        if not clip.map.num_signals or clip.signal_states is None:
            return False
        window = int(round(float(self.params["at_fault"]["red_light_window_s"]) / self.dt)) + 1
        track = state.ego_track(b)[-window:]
        first_step = int(state.t[b]) - len(track) + 1
        return bool(self._red_light_crossings(clip, track, first_step))

    def _on_road(self, state: SimState, rows) -> np.ndarray:
        out = np.ones(len(rows), bool)
        for k, b in enumerate(rows):
            out[k] = bool(self.map_geometry(self.clip(state, b).map).on_road(state.ego[b, :2])[0])
        return out

    # -- finished rollouts ----------------------------------------------------------------------------
    def trace(self, state: SimState, b: int) -> EpisodeTrace:
        """The immutable record of rollout ``b`` that outcomes, metrics and rewards are computed from."""
        d = self.clip_data(state.clip_keys[b])
        clip = d.clip
        track = state.ego_track(b)
        start, window_end = int(state.start[b]), int(state.end[b])
        return EpisodeTrace(
            clip_id=clip.clip_id, scenario_kind=str(clip.metadata.get("scenario_kind", "")), dt=self.dt,
            t_max=self.t_max, start_step=start, end_step=int(state.t[b]), window_end=window_end,
            termination=state.termination[b], ego=frozen_array(track),
            ttc=frozen_array(state.ttc_track(b)), rear_ttc=frozen_array(state.rear_ttc_track(b)),
            route_s=frozen_array(d.route.project(track[:, :2])[0]),
            speed_limits=frozen_array(self.map_geometry(clip.map).speed_limit(track[:, :2])),
            expert_s=frozen_array(d.expert_s[start:window_end + 1]),
            expert_xy=frozen_array(np.stack([clip.ego_x, clip.ego_y], -1)[start:window_end + 1]),
            collided=bool(state.collided[b]), at_fault=bool(state.at_fault[b]),
            offroad=bool(state.offroad[b]),
            collisions=state.collisions[b], decisions=state.decisions[b],
            red_light_crossings=self._red_light_crossings(clip, track, start),
        )

    @staticmethod
    def _red_light_crossings(clip, track: np.ndarray, start: int) -> tuple[tuple[int, int], ...]:
        """(log step, signal id) where the ego's front crossed a stop line whose signal was red."""
        if not clip.map.num_signals or clip.signal_states is None or len(track) < 2:
            return ()
        half = 0.5 * clip.ego_length
        front = track[:, :2] + half * np.column_stack([np.cos(track[:, 2]), np.sin(track[:, 2])])
        out = []
        for k in range(1, len(track)):
            step = start + k
            for sid in stop_line_crossings(clip.map, clip.signals_at(min(step, clip.num_steps - 1)),
                                           clip.route_lane_ids, front[k - 1], front[k]):
                out.append((int(step), int(sid)))
        return tuple(out)

    def episode_result(self, state: SimState, b: int) -> EpisodeResult:
        """The outcome of rollout ``b`` (:func:`bev_warp_sim.metrics.episode_outcome` of its trace)."""
        return episode_outcome(self.trace(state, b), self.params)

    def results(self, state: SimState) -> list[EpisodeResult | None]:
        """Outcomes of the finished rollouts (``None`` for those still running)."""
        return [self.episode_result(state, b) if state.done[b] else None for b in range(state.batch_size)]


def _plan_record(act, default_plan_dt: float) -> tuple[np.ndarray, float, dict[str, Any]]:
    """(trajectory, plan_dt, DecisionPoint fields) of a PlanResult or a bare ``[T, 2]`` plan."""
    if not isinstance(act, PlanResult):
        traj = np.asarray(act, dtype=np.float64)
        return traj, default_plan_dt, {"trajectory": frozen_array(traj.copy())}
    traj = np.asarray(act.trajectory, dtype=np.float64)

    def arr(v):
        return None if v is None else frozen_array(np.array(v))

    info = dict(act.info)
    info["plan_dt"] = float(act.plan_dt)  # for plan-to-plan consistency (metrics)
    record = {
        "selected": int(act.selected), "trajectory": frozen_array(traj.copy()),
        "candidates": arr(act.candidates),
        "scores": arr(act.scores), "logits": arr(getattr(act, "logits", None)),
        "probs": arr(getattr(act, "probs", None)), "log_prob": float(getattr(act, "log_prob", np.nan)),
        "entropy": float(getattr(act, "entropy", np.nan)),
        "seed": int(info["seed"]) if "seed" in info else None,
        "discriminator_inputs": getattr(act, "discriminator_inputs", None), "info": info,
    }
    return traj, float(act.plan_dt), record


# ----------------------------------------------------------------------------------------------------
# single-rollout functional API

def init(clip, start_step: int = 0, *, simulator: Simulator, max_steps: int | None = None) -> SimState:
    """One rollout of ``clip`` from ``start_step`` on ``simulator``."""
    return simulator.init([clip], [start_step], max_steps=max_steps)


def observe(state: SimState, *, simulator: Simulator):
    """The observation of a single rollout (warped logged BEV + transformed tokens + simulated ego state)."""
    if state.batch_size != 1:
        raise SimulationError(f"observe: expected a single rollout, got B={state.batch_size} (use Simulator)")
    return simulator.observe(state)[0]


def step(state: SimState, plan_or_controls=None, observation=None, *,
         simulator: Simulator) -> tuple[SimState, dict[str, Any]]:
    """Advance a single rollout one step; a given plan (PlanResult, [T, 2] ego-frame trajectory or
    :class:`Controls`) starts a new latch first. Without one the latched controls continue."""
    sim = simulator
    if state.batch_size != 1:
        raise SimulationError(f"step: expected a single rollout, got B={state.batch_size} (use Simulator)")
    if state.done[0]:
        raise SimulationError(f"step: the episode is over ({state.termination[0]})")
    if plan_or_controls is not None:
        obs = None if observation is None else {0: observation}
        state = sim.commit(state, {0: plan_or_controls}, obs)
    return sim.step(state)
