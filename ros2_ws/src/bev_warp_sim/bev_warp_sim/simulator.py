"""BEV-Warp closed-loop simulator: immutable batched state, pure step, latched execution (RAD-2 §3.2, §3.3.1).

A rollout replays a logged clip from ``start_step``. At log step ``t`` the planner sees the logged
observation of time ``t`` warped into the simulated ego frame (:mod:`bev_warp_sim.observation`). A
committed plan is turned into controls by the batched iLQR tracker
(``rad2_control.TrackingController``); the controls are replayed open loop for ``latch.h_reuse``
steps (latched execution) unless the safety check fires (``T_t < latch.ttc_break_s`` or a collision),
which ends the latch so the next step is a decision point. Every step integrates the kinematic bicycle
for ``sim.dt`` (:func:`bev_warp_sim.state.drive_latched`), advances the agents
(:mod:`bev_warp_sim.agents`), checks collisions (with at-fault attribution), time to collision
(Eq. 12) and the drivable area (:mod:`bev_warp_sim.checks`), and records the ego track. An episode ends
at the end of the clip (or after ``sim.max_steps``), on a collision (``sim.terminate_on_collision``),
off-road (``sim.terminate_on_offroad``), or at the end of the route (``sim.terminate_at_route_end``):
a logged route ends where the recorded map does, and an ego that drives faster than the logged driver
reaches that end before the clip does; past it there is no road in the map, which is not the ego
leaving the road (termination ``route_end`` when the ego's centre reaches it: the route completed).

**Purity.** :class:`~bev_warp_sim.state.SimState` is a frozen value naming its clips by a content key
(:mod:`bev_warp_sim.clip_registry`); :meth:`Simulator.commit` and :meth:`Simulator.step` return new
states and never touch their input, so any number of continuations can branch from one state (GRPO
groups). Outcomes and rewards are pure functions of the finished rollout's
:class:`~bev_warp_sim.trace.EpisodeTrace` (:meth:`Simulator.trace`,
:func:`bev_warp_sim.metrics.episode_outcome`, :data:`bev_warp_sim.rewards.REWARDS`).

Agents are replayed from the log (non-reactive, the paper's setting) or, with ``sim.reactive_agents``,
follow their logged paths with an IDM speed that reacts to the ego (:mod:`bev_warp_sim.agents`);
reactive observations are rasterised at the simulated pose from the simulated scene and TTC uses the
agents' constant-speed continuation.

Everything is batched: ``B`` rollouts (any mix of clips and start steps) step together; the single-
rollout functions :func:`init`, :func:`observe` and :func:`step` are the ``B = 1`` case. The driving
loop (observe → plan → commit → step) lives in :mod:`bev_warp_sim.rollout`.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import numpy as np

from bev_warp_sim.agents import AgentModel
from bev_warp_sim.checks import SceneChecks, red_light_crossings
from bev_warp_sim.clip_registry import ClipCache, register_clip
from bev_warp_sim.metrics import EpisodeResult, episode_outcome
from bev_warp_sim.observation import Observer
from bev_warp_sim.state import (
    Controls,
    SimContext,
    SimState,
    SimulationError,
    drive_latched,
    plan_record,
    with_row,
)
from bev_warp_sim.trace import DecisionPoint, EpisodeTrace, frozen_array

# arc length short of the route's end that counts as the end (projections past the end stop at it)
ROUTE_END_TOLERANCE_M = 0.05


class Simulator:
    """Holds parameters, the controller, the clip caches, the agents, the checks and the observer; every
    method is pure in the state.

    ``params``: params/sim.yaml, bev.yaml, planner.yaml, controller.yaml, vehicle.yaml and
    validators.yaml as the entry point loaded them, merged (:func:`rad2_core.config.load_merged`);
    ``controller``: a tracker to use instead of the one those files describe.
    """

    def __init__(self, params: dict[str, Any], controller=None):
        from rad2_control.tracker import TrackingController

        self.params = params
        self.plan_dt = float(params["planner"]["plan_dt"])
        cfg = self.params["sim"]
        self.dt = float(cfg["dt"])
        self.reactive = bool(cfg["reactive_agents"])
        self.controller = controller if controller is not None else TrackingController(params, params)
        # the simulated vehicle is the controller's (an injected controller may model another vehicle)
        self.vehicle_params = {"vehicle": asdict(self.controller.vehicle)}
        if abs(self.controller.dt - self.dt) > 1e-9:
            raise SimulationError(f"sim.dt: {self.dt} differs from controller.dt {self.controller.dt}")
        tcfg = self.params["ttc"]
        if abs(float(tcfg["dt"]) - self.dt) > 1e-9:
            raise SimulationError(f"ttc.dt: {tcfg['dt']} must equal sim.dt {self.dt}")
        look = int(round(float(tcfg["t_max"]) / self.dt))
        self.t_max = float(tcfg["t_max"])
        self.h_reuse = int(self.params["latch"]["h_reuse"])
        if self.h_reuse < 1:
            raise SimulationError(f"latch.h_reuse: must be >= 1, got {self.h_reuse}")
        self.registry_size = int(cfg["clip_registry_size"])
        self.clips = ClipCache(params, look)
        self.agents = AgentModel(params, self.clips, self.reactive, self.dt, look)
        self.observer = Observer(params, self.vehicle_params, self.controller.vehicle, self.clips,
                                 self.reactive)
        if not 0.0 <= self.observer.max_uncovered <= 1.0:
            raise SimulationError(f"sim.warp_max_uncovered: {self.observer.max_uncovered} must be in [0, 1]")
        self.observation_channels = self.observer.warper.cfg.channels  # the BEV channels it observes
        self.checks = SceneChecks(params, self.clips, self.agents, self.controller.vehicle, self.dt)
        self.wheelbase = float(self.vehicle_params["vehicle"]["wheelbase"])

    def clip(self, state: SimState, b: int):
        return self.clips.clip_data(state.clip_keys[b]).clip

    def logged_observation(self, clip, t: int, key: str | None = None):
        """The logged observation of step ``t`` (BEV + tokens at the logged pose); cached per (clip, t)."""
        return self.observer.logged_observation(clip, t, key)

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
        data = [self.clips.clip_data(k) for k in keys]
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
            self.clips.map_geometry(c.map)
        ego = np.zeros((b, 5))
        accel = np.zeros(b)
        for i, (c, s) in enumerate(zip(clips, starts)):
            es = ego_state_from_clip(c, int(s), self.wheelbase)
            ego[i] = [c.ego_x[s], c.ego_y[s], c.ego_yaw[s], es[0], es[3]]
            accel[i] = es[1]
        vmax = self.controller.vehicle.max_steer
        ego[:, 4] = np.clip(ego[:, 4], -vmax, vmax)
        agents = self.agents.at_start(data, starts)
        h = self.controller.horizon
        state = SimState(
            clip_keys=keys, start=starts, end=ends, t=starts.copy(), ego=ego, accel=accel,
            controls=np.zeros((b, h, 2)), latch_pos=np.zeros(b, np.int64), latch_len=np.zeros(b, np.int64),
            needs_plan=np.ones(b, bool), break_reason=("start",) * b, done=np.zeros(b, bool),
            termination=("",) * b, collided=np.zeros(b, bool), at_fault=np.zeros(b, bool),
            offroad=np.zeros(b, bool), collisions=((),) * b, **agents,
            ego_hist=(frozen_array(np.column_stack([ego, accel])),), ttc_hist=(), rear_ttc_hist=(),
            agent_hist=(), decisions=((),) * b,
        )
        ttc, rear_ttc = self.checks.ttc(state)
        return replace(state, ttc_hist=(frozen_array(ttc),), rear_ttc_hist=(frozen_array(rear_ttc),),
                       agent_hist=(frozen_array(agents["agent_pose"].copy()),) if self.reactive else ())

    # -- observation ----------------------------------------------------------------------------------
    def ego_state_vector(self, state: SimState) -> np.ndarray:
        """``[B, 4]`` (speed, accel, yaw rate, steering) of the simulated ego, the Observation layout."""
        return self.observer.ego_state_vector(np.asarray(state.ego), np.asarray(state.accel))

    def observe(self, state: SimState, indices=None) -> list:
        """Observations of rollouts ``indices`` (default: all), each an unbatched ``Observation``."""
        idx = list(range(state.batch_size)) if indices is None else [int(i) for i in indices]
        if not idx:
            return []
        return self.observer.observe(state, idx)

    def observation_at(self, clip, step: int, ego_state, accel: float):
        """The observation a policy saw at log step ``step`` with the ego in bicycle state ``ego_state``
        (x, y, yaw, v, δ) and acceleration ``accel``
        (:meth:`bev_warp_sim.observation.Observer.observation_at`)."""
        return self.observer.observation_at(clip, step, ego_state, accel)

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
                traj, plan_dt, record = plan_record(act, self.plan_dt)
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
            decisions = with_row(decisions, b, decisions[b] + (dp,))
        # group by (T, plan_dt) so one reference build + one iLQR solve serves each group
        groups: dict[tuple[int, float], list[int]] = {}
        for k, (_, traj, pdt) in enumerate(plans):
            groups.setdefault((len(traj), pdt), []).append(k)
        for (_, pdt), ks in groups.items():
            rows = [plans[k][0] for k in ks]
            pts = np.stack([plans[k][1] for k in ks])
            ego = np.asarray(state.ego[rows])
            ref = self.controller.reference(pts, pdt, ego[:, :3], frame="ego")
            solved = self.controller.solve(ego, ref).controls
            controls[rows] = self.controller.limit_jerk(solved, np.asarray(state.accel)[rows])
        return replace(state, controls=controls, latch_len=latch_len, latch_pos=latch_pos,
                       needs_plan=needs_plan, decisions=decisions)

    # -- step -----------------------------------------------------------------------------------------
    def step(self, state: SimState) -> tuple[SimState, dict[str, Any]]:
        """The state one step later for every running rollout (its next latched control); pure."""
        run = ~state.done
        rows, driven = drive_latched(state, self.controller.vehicle, self.dt)
        ego, accel, latch_pos, t = driven["ego"], driven["accel"], driven["latch_pos"], driven["t"]
        moved = replace(state, **driven, **self.agents.advance(state, t, ego, rows))
        ttc, rear_ttc = self.checks.ttc(moved)
        hits, collided, at_fault, collisions = self.checks.collisions(moved, rows)
        on_road = self.checks.on_road(moved, rows)
        cfg = self.params["sim"]
        at_route_end = (self._at_route_end(moved, rows) if cfg["terminate_at_route_end"]
                        else np.zeros(len(rows), bool))
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
            if not on_road[k] and not at_route_end[k]:
                offroad[b] = True
            term = ""
            if hits[k] and cfg["terminate_on_collision"]:
                term = "collision"
            elif at_route_end[k]:
                term = "route_end"
            elif not on_road[k] and cfg["terminate_on_offroad"]:
                term = "offroad"
            elif t[b] >= state.end[b]:
                at_clip_end = state.end[b] == self.clips.clip_data(state.clip_keys[b]).num_steps - 1
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

    def _at_route_end(self, state: SimState, rows) -> np.ndarray:
        """Per row: the ego's centre has reached the end of its clip's route (the lane's end, still on
        the mapped road; projections past the end stop there, so progress is the route's full length,
        as the log's is), close beside it (``sim.route_end_lateral_m``): an ego far beside the route's
        last point has left the road."""
        out = np.zeros(len(rows), bool)
        lateral = float(self.params["sim"]["route_end_lateral_m"])
        for k, b in enumerate(rows):
            d = self.clips.clip_data(state.clip_keys[b])
            s, lat, _ = d.route.project(state.ego[b, :2][None])
            out[k] = s[0] >= d.route.length - ROUTE_END_TOLERANCE_M and abs(lat[0]) <= lateral
        return out

    # -- finished rollouts ----------------------------------------------------------------------------
    def trace(self, state: SimState, b: int) -> EpisodeTrace:
        """The immutable record of rollout ``b`` that outcomes, metrics and rewards are computed from."""
        d = self.clips.clip_data(state.clip_keys[b])
        clip = d.clip
        track = state.ego_track(b)
        start, window_end = int(state.start[b]), int(state.end[b])
        return EpisodeTrace(
            clip_id=clip.clip_id, scenario_kind=str(clip.metadata.get("scenario_kind", "")), dt=self.dt,
            t_max=self.t_max, start_step=start, end_step=int(state.t[b]), window_end=window_end,
            termination=state.termination[b], ego=frozen_array(track),
            ttc=frozen_array(state.ttc_track(b)), rear_ttc=frozen_array(state.rear_ttc_track(b)),
            route_s=frozen_array(d.route.project(track[:, :2])[0]),
            speed_limits=frozen_array(self.clips.map_geometry(clip.map).speed_limit(track[:, :2])),
            expert_s=frozen_array(d.expert_s[start:window_end + 1]),
            expert_xy=frozen_array(np.stack([clip.ego_x, clip.ego_y], -1)[start:window_end + 1]),
            collided=bool(state.collided[b]), at_fault=bool(state.at_fault[b]),
            offroad=bool(state.offroad[b]),
            collisions=state.collisions[b], decisions=state.decisions[b],
            red_light_crossings=red_light_crossings(clip, track, start),
        )

    def episode_result(self, state: SimState, b: int) -> EpisodeResult:
        """The outcome of rollout ``b`` (:func:`bev_warp_sim.metrics.episode_outcome` of its trace)."""
        return episode_outcome(self.trace(state, b), self.params)

    def results(self, state: SimState) -> list[EpisodeResult | None]:
        """Outcomes of the finished rollouts (``None`` for those still running)."""
        return [self.episode_result(state, b) if state.done[b] else None for b in range(state.batch_size)]


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
