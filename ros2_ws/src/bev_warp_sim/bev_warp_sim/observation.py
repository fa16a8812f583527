"""What the planner observes in the simulator: the logged observation warped into the simulated ego frame.

At log step ``t`` the planner sees the logged observation of time ``t`` (BEV rasterised at the logged
ego pose, tokens in that frame) warped into the simulated ego frame (``warp.BevWarper``; tokens by
``warp.warp_tokens``) with the simulated ego state, and the next signal's stop line measured from the
simulated ego. Where the warp cannot cover the simulated view (``sim.warp_max_uncovered``), and for
reactive agents (the logged features would show the agents where the log had them), the observation is
rasterised afresh at the simulated pose (:func:`rad2_core.bev.snapshot_from_clip`,
:func:`rad2_core.observation.build_observation`). Logged observations are cached per (clip, step).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from rad2_core.stop_lines import next_signal_stop

from bev_warp_sim.clip_registry import ClipCache, clip_key, register_clip
from bev_warp_sim.state import SimState, SimulationError
from bev_warp_sim.warp import BevWarper, view_uncovered_fraction, warp_tokens


class Observer:
    """One simulator's observations. ``params``: its merged parameters (the BEV of bev.yaml and
    ``sim.*``); ``vehicle_params``: ``{"vehicle": ...}`` of the simulated ego; ``vehicle``: its
    :class:`~rad2_core.bicycle.VehicleParams` (the yaw rate of the ego-state vector)."""

    def __init__(self, params: dict[str, Any], vehicle_params: dict[str, Any], vehicle, clips: ClipCache,
                 reactive: bool):
        cfg = params["sim"]
        self.bev_params = params
        self.vehicle_params = vehicle_params
        self.vehicle = vehicle
        self.clips = clips
        self.reactive = bool(reactive)
        self.registry_size = int(cfg["clip_registry_size"])
        self.warper = BevWarper(self.bev_params, backend=str(cfg["warp_backend"]))
        self.max_uncovered = float(cfg["warp_max_uncovered"])
        self._cache: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._cache_size = int(cfg["feature_cache_steps"])

    def logged_observation(self, clip, t: int, key: str | None = None):
        """The logged observation of step ``t`` (BEV + tokens at the logged pose); cached per (clip, t)."""
        from rad2_core.bev import snapshot_from_clip
        from rad2_core.observation import build_observation

        cache_key = (key or clip_key(clip), int(t))
        obs = self._cache.get(cache_key)
        if obs is None:
            snap = snapshot_from_clip(clip, int(t), self.bev_params, self.vehicle_params)
            obs = build_observation(snap, params=self.bev_params)
            self._cache[cache_key] = obs
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(cache_key)
        return obs

    def ego_state_vector(self, ego: np.ndarray, accel: np.ndarray) -> np.ndarray:
        """``[B, 4]`` (speed, accel, yaw rate, steering) of bicycle states ``ego [B, 5]``, the Observation
        layout."""
        from rad2_core.bicycle import slip_and_curvature

        _, kappa = slip_and_curvature(ego[:, 4], self.vehicle)
        return np.column_stack([ego[:, 3], accel, ego[:, 3] * kappa, ego[:, 4]])

    def observe(self, state: SimState, idx: list[int]) -> list:
        """Observations of rollouts ``idx``, each an unbatched ``Observation``."""
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
        es = self.ego_state_vector(ego, accel).astype(np.float32)
        clips = [self.clips.clip_data(k).clip for k in keys]
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
        """The observation of rollout ``i`` rendered at the simulated ego pose with the simulated agents
        (their current poses and, for the history frames, the poses recorded in the state)."""
        from rad2_core.bev import AgentFrame, snapshot_from_clip
        from rad2_core.observation import build_observation

        d = self.clips.clip_data(state.clip_keys[i])
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
        es = self.ego_state_vector(np.asarray(state.ego), np.asarray(state.accel))[i]
        return build_observation(snap, ego_pose=state.ego[i, :3], ego_state=es, params=self.bev_params)
