"""BEV-Warp closed-loop simulator: explicit batched state, pure step, latched execution (RAD-2 §3.2, §3.3.1).

A rollout replays a logged clip from ``start_step``. At log step ``t`` the planner sees the logged
observation of time ``t`` (BEV rasterised at the logged ego pose, tokens in that frame) warped into the
simulated ego frame (``warp.BevWarper``; tokens by ``warp.warp_tokens``) with the simulated
ego state. A committed plan is turned into controls by the batched iLQR tracker
(``rad2_planner.control.TrackingController``); the controls are replayed open loop for ``latch.h_reuse``
steps (latched execution) unless the safety check fires (``T_t < latch.ttc_break_s`` or a collision),
which ends the latch so the next step is a decision point. Every step integrates the kinematic bicycle
for ``sim.dt``, advances the log, checks collisions (with at-fault attribution), time to collision
(Eq. 12) and the drivable area, and records the ego track. An episode ends at the end of the clip (or
after ``sim.max_steps``), on a collision (``sim.terminate_on_collision``) or off-road
(``sim.terminate_on_offroad``); its :class:`~bev_warp_sim.metrics.EpisodeResult` (rewards included)
is then filled in.

Agents are replayed from the log (non-reactive, the paper's setting) or, with
``sim.reactive_agents``, follow their logged paths with an IDM speed that reacts to the ego when it is
in front of them on their path (never getting ahead of their logged progress). Reactive observations
are rasterised directly at the simulated pose from the simulated scene (the logged features would show
the agents where the log had them) and TTC uses the agents' constant-speed continuation along their
paths.

Everything is batched: ``B`` rollouts (any mix of clips and start steps) step together; the single-
rollout functions :func:`init`, :func:`observe` and :func:`step` are the ``B = 1`` case. ``step`` does
not modify the state passed in; it returns a new one.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rad2_planner.config import load_params
from rad2_planner.geometry import wrap_angle
from rad2_planner.planning_interface import PlanResult

from bev_warp_sim import rewards as rw
from bev_warp_sim import safety
from bev_warp_sim.metrics import EpisodeResult
from bev_warp_sim.warp import BevWarper, warp_tokens


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


@dataclass
class DecisionPoint:
    """A step where a new trajectory started a latch interval (the TC-GRPO decision set K_i)."""

    step: int
    ego_state: np.ndarray
    selected: int
    trajectory: np.ndarray | None
    candidates: np.ndarray | None
    scores: np.ndarray | None
    reason: str  # start | latch_done | safety
    observation: Any = None
    end_step: int = -1  # last step executed from this latch
    interval_min_ttc: float = float("inf")
    rewards: dict[str, float] = field(default_factory=dict)


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

    def __init__(self, clip, look: int):
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
        self.route = rw.RoutePath(clip.route_polyline)
        self.expert_s = self.route.project(np.stack([clip.ego_x, clip.ego_y], -1))[0]
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


@dataclass
class SimState:
    """State of ``B`` rollouts. Arrays have a leading batch axis; history lists hold one entry per step."""

    sim: Simulator
    data: list[_ClipData]
    start: np.ndarray  # [B] first log step
    end: np.ndarray  # [B] last log step of the planned window
    t: np.ndarray  # [B] current log step
    ego: np.ndarray  # [B, 5] bicycle state x, y, yaw, v, delta
    accel: np.ndarray  # [B] last applied acceleration
    controls: np.ndarray  # [B, H, 2] latched controls
    latch_pos: np.ndarray  # [B] index of the next latched control
    latch_len: np.ndarray  # [B] controls to replay (0: no latch)
    needs_plan: np.ndarray  # [B] bool: the next step is a decision point
    break_reason: list[str]
    done: np.ndarray  # [B] bool
    termination: list[str]
    collided: np.ndarray  # [B] bool
    at_fault: np.ndarray  # [B] bool
    offroad: np.ndarray  # [B] bool
    collisions: list[list[dict]]
    agent_pose: np.ndarray  # [B, N, 3] current agent poses (reactive: simulated)
    agent_vel: np.ndarray  # [B, N, 2]
    agent_valid: np.ndarray  # [B, N]
    agent_s: np.ndarray  # [B, N] reactive progress along the logged path
    agent_v: np.ndarray  # [B, N] reactive speed
    ego_hist: list[np.ndarray]  # per step [B, 6]: x, y, yaw, v, delta, accel
    ttc_hist: list[np.ndarray]  # per step [B] T_t (step 0: the start state)
    agent_hist: list[np.ndarray]  # reactive only: per step [B, N, 3]
    decisions: list[list[DecisionPoint]]
    results: list[EpisodeResult | None]
    steps_taken: int = 0

    @property
    def batch_size(self) -> int:
        return int(len(self.t))

    def copy(self) -> SimState:
        new = copy.copy(self)
        for name in ("start", "end", "t", "ego", "accel", "controls", "latch_pos", "latch_len", "needs_plan",
                     "done", "collided", "at_fault", "offroad", "agent_pose", "agent_vel", "agent_valid",
                     "agent_s", "agent_v"):
            setattr(new, name, getattr(self, name).copy())
        for name in ("break_reason", "termination", "ego_hist", "ttc_hist", "agent_hist", "results"):
            setattr(new, name, list(getattr(self, name)))
        new.collisions = [list(c) for c in self.collisions]
        new.decisions = [list(d) for d in self.decisions]
        return new

    def ego_track(self, b: int) -> np.ndarray:
        """``[n, 6]`` recorded ego states of rollout ``b`` (x, y, yaw, v, delta, accel)."""
        n = int(self.t[b] - self.start[b]) + 1
        return np.stack([h[b] for h in self.ego_hist[:n]]) if self.ego_hist else np.zeros((0, 6))

    def ttc_track(self, b: int) -> np.ndarray:
        n = int(self.t[b] - self.start[b]) + 1
        return np.array([h[b] for h in self.ttc_hist[:n]])


# ----------------------------------------------------------------------------------------------------
# simulator


class Simulator:
    """Holds parameters, the controller, the warper and per-clip caches; its methods are pure in the state."""

    def __init__(
        self,
        params: dict[str, Any] | None = None,
        bev_params: dict[str, Any] | None = None,
        controller=None,
        planner_params: dict[str, Any] | None = None,
    ):
        from rad2_planner.control.tracker import TrackingController

        self.params = params if params is not None else load_params("sim")
        self.bev_params = bev_params if bev_params is not None else load_params("bev")
        self.vehicle_params = load_params("vehicle")
        planner_params = planner_params if planner_params is not None else load_params("planner")
        self.plan_dt = float(planner_params["planner"]["plan_dt"])
        cfg = self.params["sim"]
        self.dt = float(cfg["dt"])
        self.reactive = bool(cfg["reactive_agents"])
        self.controller = controller if controller is not None else TrackingController()
        if abs(self.controller.dt - self.dt) > 1e-9:
            raise SimulationError(f"sim.dt: {self.dt} differs from controller.dt {self.controller.dt}")
        self.warper = BevWarper(self.bev_params, backend=str(cfg["warp_backend"]))
        tcfg = self.params["ttc"]
        if abs(float(tcfg["dt"]) - self.dt) > 1e-9:
            raise SimulationError(f"ttc.dt: {tcfg['dt']} must equal sim.dt {self.dt}")
        self.look = int(round(float(tcfg["t_max"]) / self.dt))
        self.t_max = float(tcfg["t_max"])
        self.h_reuse = int(self.params["latch"]["h_reuse"])
        if self.h_reuse < 1:
            raise SimulationError(f"latch.h_reuse: must be >= 1, got {self.h_reuse}")
        self._maps: dict[str, _MapGeometry] = {}
        self._clips: OrderedDict[int, _ClipData] = OrderedDict()
        self._obs_cache: OrderedDict[tuple[int, str, int], Any] = OrderedDict()
        self._obs_cache_size = int(cfg["feature_cache_steps"])
        self.wheelbase = float(self.vehicle_params["vehicle"]["wheelbase"])

    # -- caches ---------------------------------------------------------------------------------------
    def map_geometry(self, lane_map) -> _MapGeometry:
        key = lane_map.map_id
        if key not in self._maps:
            self._maps[key] = _MapGeometry(lane_map, float(self.params["sim"]["offroad_margin_m"]))
        return self._maps[key]

    def clip_data(self, clip) -> _ClipData:
        key = id(clip)
        if key not in self._clips:
            self._clips[key] = _ClipData(clip, self.look)
            while len(self._clips) > 256:
                self._clips.popitem(last=False)
        return self._clips[key]

    def logged_observation(self, clip, t: int):
        """The logged observation of step ``t`` (BEV + tokens at the logged pose); cached per (clip, t)."""
        from rad2_planner.bev import snapshot_from_clip
        from rad2_planner.observation import build_observation

        key = (id(clip), clip.clip_id, int(t))
        obs = self._obs_cache.get(key)
        if obs is None:
            snap = snapshot_from_clip(clip, int(t), self.bev_params, self.vehicle_params)
            obs = build_observation(snap, params=self.bev_params)
            self._obs_cache[key] = obs
            while len(self._obs_cache) > self._obs_cache_size:
                self._obs_cache.popitem(last=False)
        else:
            self._obs_cache.move_to_end(key)
        return obs

    # -- init -----------------------------------------------------------------------------------------
    def init(self, clips, start_steps=0, max_steps: int | None = None) -> SimState:
        """Start ``B`` rollouts: ``clips`` a Clip or a list; ``start_steps`` an int or one per clip."""
        clips = [clips] if not isinstance(clips, list | tuple) else list(clips)
        if not clips:
            raise SimulationError("clips: empty list")
        b = len(clips)
        starts = np.broadcast_to(np.asarray(start_steps, dtype=np.int64), (b,)).copy()
        data = [self.clip_data(c) for c in clips]
        max_steps = int(self.params["sim"]["max_steps"]) if max_steps is None else int(max_steps)
        ends = np.empty(b, dtype=np.int64)
        for i, (c, s) in enumerate(zip(clips, starts)):
            if not 0 <= s < c.num_steps - 1:
                raise SimulationError(
                    f"start_steps[{i}]: {int(s)} outside [0, {c.num_steps - 2}] for clip {c.clip_id!r}")
            ends[i] = c.num_steps - 1 if max_steps <= 0 else min(c.num_steps - 1, s + max_steps)
            self.map_geometry(c.map)
        from rad2_planner.bev import ego_state_from_clip

        ego = np.zeros((b, 5))
        accel = np.zeros(b)
        for i, (c, s) in enumerate(zip(clips, starts)):
            es = ego_state_from_clip(c, int(s), self.wheelbase)
            ego[i] = [c.ego_x[s], c.ego_y[s], c.ego_yaw[s], es[0], es[3]]
            accel[i] = es[1]
        vmax = self.controller.vehicle.max_steer
        ego[:, 4] = np.clip(ego[:, 4], -vmax, vmax)
        n_max = max((d.boxes.shape[0] for d in data), default=0)
        h = self.controller.horizon
        state = SimState(
            sim=self, data=data, start=starts, end=ends, t=starts.copy(), ego=ego, accel=accel,
            controls=np.zeros((b, h, 2)), latch_pos=np.zeros(b, np.int64), latch_len=np.zeros(b, np.int64),
            needs_plan=np.ones(b, bool), break_reason=["start"] * b, done=np.zeros(b, bool),
            termination=[""] * b, collided=np.zeros(b, bool), at_fault=np.zeros(b, bool),
            offroad=np.zeros(b, bool), collisions=[[] for _ in range(b)],
            agent_pose=np.zeros((b, n_max, 3)), agent_vel=np.zeros((b, n_max, 2)),
            agent_valid=np.zeros((b, n_max), bool), agent_s=np.zeros((b, n_max)),
            agent_v=np.zeros((b, n_max)),
            ego_hist=[], ttc_hist=[], agent_hist=[], decisions=[[] for _ in range(b)], results=[None] * b,
        )
        for i, d in enumerate(data):
            n = d.boxes.shape[0]
            s = int(starts[i])
            state.agent_pose[i, :n] = d.boxes[:, s, :3]
            state.agent_vel[i, :n] = d.vel[:, s]
            state.agent_valid[i, :n] = d.valid[:, s]
            state.agent_s[i, :n] = d.agent_s[:, s]
            state.agent_v[i, :n] = d.agent_speed[:, s]
        state.ego_hist.append(np.column_stack([ego, accel]))
        state.ttc_hist.append(self._ttc(state))
        if self.reactive:
            state.agent_hist.append(state.agent_pose.copy())
        return state

    # -- observation ----------------------------------------------------------------------------------
    def ego_state_vector(self, state: SimState) -> np.ndarray:
        """``[B, 4]`` (speed, accel, yaw rate, steering) of the simulated ego, the Observation layout."""
        from rad2_planner.control.bicycle import slip_and_curvature

        _, kappa = slip_and_curvature(state.ego[:, 4], self.controller.vehicle)
        return np.column_stack([state.ego[:, 3], state.accel, state.ego[:, 3] * kappa, state.ego[:, 4]])

    def observe(self, state: SimState, indices=None) -> list:
        """Observations of rollouts ``indices`` (default: all), each an unbatched ``Observation``."""
        idx = list(range(state.batch_size)) if indices is None else [int(i) for i in indices]
        if not idx:
            return []
        es = self.ego_state_vector(state).astype(np.float32)
        sim_pose = state.ego[idx, :3]
        if self.reactive:
            return [self._render_reactive(state, i) for i in idx]
        logged = [self.logged_observation(state.data[i].clip, int(state.t[i])) for i in idx]
        ref_pose = np.stack([state.data[i].clip.ego_pose(int(state.t[i])) for i in idx])
        bev = self.warper(np.stack([o.bev for o in logged]), ref_pose, sim_pose)
        out = []
        for k, i in enumerate(idx):
            o = warp_tokens(logged[k], ref_pose[k], sim_pose[k])
            o.bev = bev[k]
            o.ego_state = es[i].copy()
            out.append(o)
        return out

    def _render_reactive(self, state: SimState, i: int):
        from rad2_planner.bev import AgentFrame, snapshot_from_clip
        from rad2_planner.observation import build_observation

        clip = state.data[i].clip
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
            valid = state.data[i].valid[:, max(t - k, 0)]
            snap.history[k] = frame(poses, valid, np.zeros((len(poses), 2)))
        es = self.ego_state_vector(state)[i]
        return build_observation(snap, ego_pose=state.ego[i, :3], ego_state=es, params=self.bev_params)

    def context(self, state: SimState, i: int) -> SimContext:
        return SimContext(clip=state.data[i].clip, step=int(state.t[i]), pose=state.ego[i, :3].copy(),
                          ego_state=state.ego[i].copy())

    # -- decisions ------------------------------------------------------------------------------------
    def needs_decision(self, state: SimState) -> np.ndarray:
        return state.needs_plan & ~state.done

    def commit(self, state: SimState, actions: dict[int, Any], observations: dict[int, Any] | None = None,
               h_reuse: int | None = None) -> SimState:
        """Latch new actions for some rollouts (``{b: PlanResult | [T, 2] ego-frame plan | Controls}``).

        Plans are tracked by one batched iLQR solve; ``h_reuse`` overrides ``latch.h_reuse``.
        """
        state = state.copy()
        h_reuse = self.h_reuse if h_reuse is None else int(h_reuse)
        if h_reuse < 1:
            raise SimulationError(f"h_reuse: must be >= 1, got {h_reuse}")
        plans, plan_rows, plan_dts = [], [], []
        for b, act in actions.items():
            b = int(b)
            if not 0 <= b < state.batch_size:
                raise SimulationError(f"actions: rollout index {b} outside [0, {state.batch_size})")
            if state.done[b]:
                continue
            dp = DecisionPoint(step=int(state.t[b]), ego_state=state.ego[b].copy(), selected=0,
                               trajectory=None, candidates=None, scores=None, reason=state.break_reason[b],
                               observation=None if observations is None else observations.get(b))
            if isinstance(act, Controls):
                u = np.asarray(act.values, dtype=np.float64)
                if u.ndim != 2 or u.shape[1] != 2 or len(u) < 1 or not np.isfinite(u).all():
                    raise SimulationError(
                        f"actions[{b}]: controls must be a finite [H, 2] array, got shape {u.shape}")
                h = min(len(u), state.controls.shape[1])
                state.controls[b] = 0.0
                state.controls[b, :h] = u[:h]
                state.latch_len[b] = min(h_reuse, h)
            else:
                if isinstance(act, PlanResult):
                    traj = np.asarray(act.trajectory, dtype=np.float64)
                    dp.selected = int(act.selected)
                    dp.candidates = np.asarray(act.candidates)
                    dp.scores = np.asarray(act.scores)
                    plan_dt = float(act.plan_dt)
                else:
                    traj = np.asarray(act, dtype=np.float64)
                    plan_dt = self.plan_dt
                if traj.ndim != 2 or traj.shape[1] != 2 or len(traj) < 1 or not np.isfinite(traj).all():
                    raise SimulationError(f"actions[{b}]: trajectory must be a finite [T, 2] array, got "
                                          f"shape {traj.shape}")
                dp.trajectory = traj
                plans.append((b, traj, plan_dt))
                plan_rows.append(b)
                plan_dts.append(plan_dt)
                state.latch_len[b] = min(h_reuse, state.controls.shape[1])
            state.latch_pos[b] = 0
            state.needs_plan[b] = False
            state.decisions[b].append(dp)
        if plans:
            # group by (T, plan_dt) so one reference build + one iLQR solve serves each group
            groups: dict[tuple[int, float], list[int]] = {}
            for k, (_, traj, pdt) in enumerate(plans):
                groups.setdefault((len(traj), pdt), []).append(k)
            for (_, pdt), ks in groups.items():
                rows = [plans[k][0] for k in ks]
                pts = np.stack([plans[k][1] for k in ks])
                ref = self.controller.reference(pts, pdt, state.ego[rows, :3], frame="ego")
                sol = self.controller.solve(state.ego[rows], ref)
                state.controls[rows] = sol.controls
        return state

    # -- step -----------------------------------------------------------------------------------------
    def step(self, state: SimState) -> tuple[SimState, dict[str, Any]]:
        """Advance every running rollout by one step with its next latched control."""
        from rad2_planner.control.bicycle import clamp_controls
        from rad2_planner.control.bicycle import step as bicycle_step

        run = ~state.done
        # a pending decision is a request: without a new commit the latched sequence continues while it lasts
        missing = run & ((state.latch_len == 0) | (state.latch_pos >= state.controls.shape[1]))
        if missing.any():
            raise SimulationError(
                f"step: rollouts {np.flatnonzero(missing).tolist()} have no controls left (commit an action)")
        state = state.copy()
        rows = np.flatnonzero(run)
        u = state.controls[rows, state.latch_pos[rows]]
        u = clamp_controls(state.ego[rows], u, self.controller.vehicle, self.dt)
        state.ego[rows] = bicycle_step(state.ego[rows], u, self.controller.vehicle, self.dt)
        state.ego[rows, 2] = wrap_angle(state.ego[rows, 2])
        state.accel[rows] = u[:, 0]
        state.latch_pos[rows] += 1
        state.t[rows] += 1
        self._advance_agents(state, rows)
        ttc = self._ttc(state)
        hits = self._collisions(state, rows)
        on_road = self._on_road(state, rows)
        state.ego_hist.append(np.column_stack([state.ego, state.accel]))
        state.ttc_hist.append(np.where(run, ttc, state.ttc_hist[-1]))
        if self.reactive:
            state.agent_hist.append(state.agent_pose.copy())
        cfg = self.params["sim"]
        ttc_break = float(self.params["latch"]["ttc_break_s"])
        finished = []
        for k, b in enumerate(rows):
            dp = state.decisions[b][-1] if state.decisions[b] else None
            if dp is not None:
                dp.end_step = int(state.t[b])
                dp.interval_min_ttc = min(dp.interval_min_ttc, float(ttc[b]))
            reason = ""
            if hits[k]:
                reason = "collision"
            elif ttc[b] < ttc_break:
                reason = "safety"
            if reason:
                state.needs_plan[b] = True
                state.break_reason[b] = "safety"
            elif state.latch_pos[b] >= state.latch_len[b]:
                state.needs_plan[b] = True
                state.break_reason[b] = "latch_done"
            if not on_road[k]:
                state.offroad[b] = True
            term = ""
            if hits[k] and cfg["terminate_on_collision"]:
                term = "collision"
            elif not on_road[k] and cfg["terminate_on_offroad"]:
                term = "offroad"
            elif state.t[b] >= state.end[b]:
                term = "clip_end" if state.end[b] == state.data[b].num_steps - 1 else "max_steps"
            if term:
                state.done[b] = True
                state.termination[b] = term
                finished.append(int(b))
        state.steps_taken += 1
        for b in finished:
            state.results[b] = self.episode_result(state, b)
        return state, {"ttc": ttc, "collided": state.collided.copy(), "finished": finished}

    # -- physics of the scene -------------------------------------------------------------------------
    def _advance_agents(self, state: SimState, rows) -> None:
        for b in rows:
            d = state.data[b]
            n = d.boxes.shape[0]
            t = int(state.t[b])
            if not self.reactive:
                state.agent_pose[b, :n] = d.boxes[:, t, :3]
                state.agent_vel[b, :n] = d.vel[:, t]
                state.agent_valid[b, :n] = d.valid[:, t]
            else:
                self._reactive_step(state, b, t)

    def _reactive_step(self, state: SimState, b: int, t: int) -> None:
        """IDM along the logged path towards the logged progress, braking for an ego ahead on the path."""
        cfg = self.params["reactive"]
        d = state.data[b]
        clip = d.clip
        n = d.boxes.shape[0]
        ego = state.ego[b]
        el, ew = clip.ego_length, clip.ego_width
        for j in range(n):
            if not d.valid[j, t]:
                state.agent_valid[b, j] = False
                continue
            s_log = d.agent_s[j, t]
            if not state.agent_valid[b, j]:  # (re)appears: start on the log
                state.agent_s[b, j], state.agent_v[b, j] = s_log, d.agent_speed[j, t]
            s, v = state.agent_s[b, j], state.agent_v[b, j]
            pose = state.agent_pose[b, j]
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
            state.agent_pose[b, j] = [xa[0] + f * (xb[0] - xa[0]), xa[1] + f * (xb[1] - xa[1]),
                                      wrap_angle(yaw)]
            state.agent_vel[b, j] = v_new * np.array([np.cos(yaw), np.sin(yaw)])
            state.agent_s[b, j], state.agent_v[b, j] = s_new, v_new
            state.agent_valid[b, j] = True

    def _agent_future(self, state: SimState) -> tuple[np.ndarray, np.ndarray]:
        """``[B, N, K+1, 5]`` agent boxes over the look-ahead and their validity."""
        b = state.batch_size
        n_max = state.agent_pose.shape[1]
        k1 = self.look + 1
        boxes = np.zeros((b, n_max, k1, 5))
        valid = np.zeros((b, n_max, k1), bool)
        tau = np.arange(k1) * self.dt
        for i, d in enumerate(state.data):
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

    def _ttc(self, state: SimState) -> np.ndarray:
        from rad2_planner.control.bicycle import slip_and_curvature

        boxes, valid = self._agent_future(state)
        _, kappa = slip_and_curvature(state.ego[:, 4], self.controller.vehicle)
        size = np.array([[d.clip.ego_length, d.clip.ego_width] for d in state.data])
        return safety.ttc_at_state(state.ego[:, :3], state.ego[:, 3], state.ego[:, 3] * kappa, size, boxes,
                                   valid, self.params)

    def _collisions(self, state: SimState, rows) -> np.ndarray:
        out = np.zeros(len(rows), bool)
        for k, b in enumerate(rows):
            d = state.data[b]
            n = d.boxes.shape[0]
            if n == 0:
                continue
            clip = d.clip
            ego_box = np.array([*state.ego[b, :3], clip.ego_length, clip.ego_width])
            agent_boxes = np.concatenate([state.agent_pose[b, :n], d.boxes[:, 0, 3:]], axis=1)
            hit = safety.collisions(ego_box, agent_boxes, state.agent_valid[b, :n])
            if not hit.any():
                continue
            out[k] = True
            state.collided[b] = True
            known = {c["agent_index"] for c in state.collisions[b]}
            ev = state.ego[b, 3] * np.array([np.cos(state.ego[b, 2]), np.sin(state.ego[b, 2])])
            for j in np.flatnonzero(hit):
                if int(j) in known:
                    continue
                geom = self.map_geometry(clip.map)
                pt = safety.contact_point(ego_box, agent_boxes[j])
                info = safety.classify_collision(
                    ego_box, ev, agent_boxes[j], state.agent_vel[b, j], self.params, agent_index=int(j),
                    road_heading=geom.road_heading(pt))
                rec = {"step": int(state.t[b]), "agent_id": int(clip.agent_ids[j]),
                       "agent_type": int(clip.agent_types[j]), **info.as_dict()}
                state.collisions[b].append(rec)
                if info.at_fault:
                    state.at_fault[b] = True
        return out

    def _on_road(self, state: SimState, rows) -> np.ndarray:
        out = np.ones(len(rows), bool)
        for k, b in enumerate(rows):
            out[k] = bool(self.map_geometry(state.data[b].clip.map).on_road(state.ego[b, :2])[0])
        return out

    # -- episode summary ------------------------------------------------------------------------------
    def episode_result(self, state: SimState, b: int) -> EpisodeResult:
        d = state.data[b]
        clip = d.clip
        track = state.ego_track(b)
        ttc = state.ttc_track(b)[1:]  # T_t for t = 1..L (the start state is the log's)
        start, end = int(state.start[b]), int(state.end[b])
        s_ego = d.route.project(track[:, :2])[0]
        ego_prog = float(s_ego[-1] - s_ego[0])
        exp_prog = float(d.expert_s[end] - d.expert_s[start])
        rcfg = self.params["rewards"]
        rho = rw.progress_ratio(ego_prog, exp_prog, float(rcfg["min_expert_progress_m"]))
        sig = rw.comfort_signals(track[:, :3], track[:, 3], self.dt)
        viol = rw.comfort_violations(sig, self.params["comfort"])
        any_step = np.zeros(len(track), bool)
        for v in viol.values():
            any_step |= v
        min_ttc = float(ttc.min()) if len(ttc) else self.t_max
        if state.collided[b]:
            min_ttc = 0.0
        geom = self.map_geometry(clip.map)
        limits = geom.speed_limit(track[:, :2])
        pr1 = rw.plan_r1_reward(
            collided=bool(state.collided[b]), drivable_ok=not bool(state.offroad[b]), route_s=s_ego,
            speeds=track[:, 3], speed_limits=limits, comfort_ok=not any_step.any(), min_ttc=min_ttc, rho=rho,
            dt=self.dt, params=self.params,
        )
        r_c = rw.r_coll(ttc, self.t_max) if len(ttc) else 0.0
        if state.collided[b]:
            r_c = -self.t_max
        r_e = rw.r_eff(rho, float(rcfg["rho_low"]), float(rcfg["rho_high"]))
        for dp in state.decisions[b]:
            dp.rewards = {"r_coll": r_c, "r_eff": r_e,
                          "interval_r_coll": min(dp.interval_min_ttc, self.t_max) - self.t_max}
        return EpisodeResult(
            clip_id=clip.clip_id, scenario_kind=str(clip.metadata.get("scenario_kind", "")), start_step=start,
            end_step=int(state.t[b]), num_steps=int(state.t[b]) - start, termination=state.termination[b],
            collided=bool(state.collided[b]), at_fault=bool(state.at_fault[b]),
            offroad=bool(state.offroad[b]),
            min_ttc=min_ttc, rho=float(rho), ego_progress_m=ego_prog, expert_progress_m=exp_prog,
            comfort_violation_rate=float(any_step.mean()) if len(any_step) else 0.0,
            comfort_any=bool(any_step.any()), r_coll=float(r_c), r_eff=float(r_e),
            plan_r1=float(pr1["total"]),
            collisions=list(state.collisions[b]),
            comfort_by_term={k: float(v.mean()) for k, v in viol.items()},
            num_decisions=len(state.decisions[b]),
        )

    # -- driving loop ---------------------------------------------------------------------------------
    def run(self, state: SimState, planners: list, h_reuse: int | None = None,
            record_observations: bool = False, progress=None) -> SimState:
        """Drive all rollouts to the end with one ``Planner`` per rollout (``reset`` already called)."""
        if len(planners) != state.batch_size:
            raise SimulationError(f"planners: {len(planners)} given for {state.batch_size} rollouts")
        while not state.done.all():
            need = np.flatnonzero(self.needs_decision(state))
            if len(need):
                obs = self.observe(state, need)
                actions, kept = {}, {}
                for b, o in zip(need, obs):
                    pl = planners[b]
                    if hasattr(pl, "set_sim_context"):
                        pl.set_sim_context(self.context(state, int(b)))
                    actions[int(b)] = pl.plan(o)
                    if record_observations:
                        kept[int(b)] = o
                state = self.commit(state, actions, kept if record_observations else None, h_reuse=h_reuse)
            before = int(state.done.sum())
            state, _ = self.step(state)
            if progress is not None:
                progress(int(state.done.sum()) - before)
        return state


# ----------------------------------------------------------------------------------------------------
# single-rollout functional API

_DEFAULT: Simulator | None = None


def default_simulator() -> Simulator:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Simulator()
    return _DEFAULT


def init(clip, start_step: int = 0, params: dict[str, Any] | None = None, simulator: Simulator | None = None,
         max_steps: int | None = None) -> SimState:
    """One rollout of ``clip`` from ``start_step`` (``params``: a sim.yaml dict to override the defaults)."""
    if simulator is not None:
        sim = simulator
    else:
        sim = Simulator(params) if params is not None else default_simulator()
    return sim.init([clip], [start_step], max_steps=max_steps)


def observe(state: SimState):
    """The observation of a single rollout (warped logged BEV + transformed tokens + simulated ego state)."""
    if state.batch_size != 1:
        raise SimulationError(f"observe: expected a single rollout, got B={state.batch_size} (use Simulator)")
    return state.sim.observe(state)[0]


def step(state: SimState, plan_or_controls=None, observation=None) -> tuple[SimState, dict[str, Any]]:
    """Advance a single rollout one step; a given plan (PlanResult, [T, 2] ego-frame trajectory or
    :class:`Controls`) starts a new latch first. Without one the latched controls continue."""
    if state.batch_size != 1:
        raise SimulationError(f"step: expected a single rollout, got B={state.batch_size} (use Simulator)")
    if state.done[0]:
        raise SimulationError(f"step: the episode is over ({state.termination[0]})")
    if plan_or_controls is not None:
        obs = None if observation is None else {0: observation}
        state = state.sim.commit(state, {0: plan_or_controls}, obs)
    return state.sim.step(state)
