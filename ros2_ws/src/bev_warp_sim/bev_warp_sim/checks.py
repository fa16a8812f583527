"""What the simulator checks of a state after each step: collisions (with at-fault attribution), time to
collision (RAD-2 Eq. 12, and the follower's), the drivable area, and red lights crossed.

The geometry and the rules live in :mod:`bev_warp_sim.safety` and :mod:`rad2_core.stop_lines`; this
module applies them to the rollouts of a :class:`~bev_warp_sim.state.SimState` with the clip's map
(:class:`~bev_warp_sim.clip_registry.MapGeometry`) and the agents' look-ahead
(:meth:`bev_warp_sim.agents.AgentModel.future`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rad2_core.stop_lines import stop_line_crossings

from bev_warp_sim import safety
from bev_warp_sim.agents import AgentModel
from bev_warp_sim.clip_registry import ClipCache
from bev_warp_sim.state import SimState, with_row


class SceneChecks:
    """One simulator's checks. ``params``: its merged parameters (``ttc.*``, ``at_fault.*``, read when
    a check runs); ``vehicle``: the simulated ego's :class:`~rad2_core.bicycle.VehicleParams`."""

    def __init__(self, params: dict[str, Any], clips: ClipCache, agents: AgentModel, vehicle, dt: float):
        self.params = params
        self.clips = clips
        self.agents = agents
        self.vehicle = vehicle
        self.dt = float(dt)

    def _ego_sizes(self, state: SimState) -> np.ndarray:
        clips = (self.clips.clip_data(k).clip for k in state.clip_keys)
        return np.array([[c.ego_length, c.ego_width] for c in clips])

    def ttc(self, state: SimState) -> tuple[np.ndarray, np.ndarray]:
        """``(T_t, T^rear_t)`` of every rollout (``[B]`` each) from one overlap test."""
        from rad2_core.bicycle import slip_and_curvature

        boxes, valid = self.agents.future(state)
        _, kappa = slip_and_curvature(state.ego[:, 4], self.vehicle)
        return safety.ttc_at_state(state.ego[:, :3], state.ego[:, 3], state.ego[:, 3] * kappa,
                                   self._ego_sizes(state), boxes, valid, self.params, with_rear=True)

    def collisions(self, state: SimState, rows):
        """(hit per row in ``rows``, new collided, at_fault and collision records) after a step."""
        hits = np.zeros(len(rows), bool)
        collided, at_fault = state.collided.copy(), state.at_fault.copy()
        collisions = state.collisions
        for k, b in enumerate(rows):
            d = self.clips.clip_data(state.clip_keys[b])
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
                geom = self.clips.map_geometry(clip.map)
                pt = safety.contact_point(ego_box, agent_boxes[j])
                info = safety.classify_collision(
                    ego_box, ev, agent_boxes[j], state.agent_vel[b, j], self.params, agent_index=int(j),
                    road_heading=geom.road_heading(pt), ego_ran_red=ran_red)
                new.append({"step": int(state.t[b]), "agent_id": int(clip.agent_ids[j]),
                            "agent_type": int(clip.agent_types[j]), **info.as_dict()})
                if info.at_fault:
                    at_fault[b] = True
            if new:
                collisions = with_row(collisions, b, collisions[b] + tuple(new))
        return hits, collided, at_fault, collisions

    def _ran_red_recently(self, state: SimState, b: int, clip) -> bool:
        """Whether the ego's front crossed a red stop line of its route within the last
        ``at_fault.red_light_window_s`` (right of way at signals for the at-fault rule)."""
        if not clip.map.num_signals or clip.signal_states is None:
            return False
        window = int(round(float(self.params["at_fault"]["red_light_window_s"]) / self.dt)) + 1
        track = state.ego_track(b)[-window:]
        first_step = int(state.t[b]) - len(track) + 1
        return bool(red_light_crossings(clip, track, first_step))

    def on_road(self, state: SimState, rows) -> np.ndarray:
        """Per row, whether the ego is on the drivable area (grown by ``sim.offroad_margin_m``): its box
        centre (``sim.offroad_check: centre``) or all four box corners (``box``, the CommonRoad judge's
        rule with margin 0)."""
        whole_box = self.params["sim"]["offroad_check"] == "box"
        out = np.ones(len(rows), bool)
        for k, b in enumerate(rows):
            clip = self.clips.clip_data(state.clip_keys[b]).clip
            points = state.ego[b, :2][None]
            if whole_box:
                x, y, yaw = (float(v) for v in state.ego[b, :3])
                c, s = np.cos(yaw), np.sin(yaw)
                dx = 0.5 * clip.ego_length * np.array([1.0, 1.0, -1.0, -1.0])
                dy = 0.5 * clip.ego_width * np.array([1.0, -1.0, -1.0, 1.0])
                points = np.stack([x + c * dx - s * dy, y + s * dx + c * dy], axis=-1)
            out[k] = bool(self.clips.map_geometry(clip.map).on_road(points).all())
        return out


def red_light_crossings(clip, track: np.ndarray, start: int) -> tuple[tuple[int, int], ...]:
    """(log step, signal id) where the ego's front crossed a stop line whose signal was red; ``track``
    holds the ego states ``[n, >= 3]`` from log step ``start`` on."""
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
