"""The other road users of a rollout: replayed from the log, or reactive (IDM along their logged paths).

Log replay is the paper's setting: every agent is where the log has it at each step. With
``sim.reactive_agents`` an agent follows its logged path with an IDM speed that brakes for the ego when
the ego is in front of it on its path, and never gets ahead of its logged progress (``reactive.*`` of
params/sim.yaml). :meth:`AgentModel.future` gives the agents' boxes over the TTC look-ahead: the log's,
or for reactive agents their constant-velocity continuation from the simulated state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rad2_core.geometry import wrap_angle

from bev_warp_sim.clip_registry import ClipCache, ClipData
from bev_warp_sim.state import SimState

AGENT_FIELDS = ("agent_pose", "agent_vel", "agent_valid", "agent_s", "agent_v")


class AgentModel:
    """How one simulator moves the agents. ``params``: the simulator's merged parameters (``reactive.*``
    read at each step); ``look``: steps of the TTC look-ahead; ``dt``: ``sim.dt``."""

    def __init__(self, params: dict[str, Any], clips: ClipCache, reactive: bool, dt: float, look: int):
        self.params = params
        self.clips = clips
        self.reactive = bool(reactive)
        self.dt = float(dt)
        self.look = int(look)

    def at_start(self, data: list[ClipData], starts: np.ndarray) -> dict[str, np.ndarray]:
        """The agent arrays (``AGENT_FIELDS``) of rollouts of ``data`` starting at log steps ``starts``,
        padded to the largest agent count."""
        b = len(data)
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
        return {"agent_pose": pose, "agent_vel": vel, "agent_valid": valid, "agent_s": agent_s,
                "agent_v": agent_v}

    def advance(self, state: SimState, t: np.ndarray, ego: np.ndarray, rows) -> dict[str, np.ndarray]:
        """New agent arrays for log step ``t`` (log replay, or the reactive IDM step)."""
        out = {k: getattr(state, k).copy() for k in AGENT_FIELDS}
        for b in rows:
            d = self.clips.clip_data(state.clip_keys[b])
            n = d.boxes.shape[0]
            tb = int(t[b])
            if not self.reactive:
                out["agent_pose"][b, :n] = d.boxes[:, tb, :3]
                out["agent_vel"][b, :n] = d.vel[:, tb]
                out["agent_valid"][b, :n] = d.valid[:, tb]
            else:
                self._reactive_step(out, d, b, tb, ego[b])
        return out

    def _reactive_step(self, agents: dict[str, np.ndarray], d: ClipData, b: int, t: int, ego) -> None:
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

    def future(self, state: SimState) -> tuple[np.ndarray, np.ndarray]:
        """``[B, N, K+1, 5]`` agent boxes over the look-ahead and their validity."""
        b = state.batch_size
        n_max = state.agent_pose.shape[1]
        k1 = self.look + 1
        boxes = np.zeros((b, n_max, k1, 5))
        valid = np.zeros((b, n_max, k1), bool)
        tau = np.arange(k1) * self.dt
        for i, key in enumerate(state.clip_keys):
            d = self.clips.clip_data(key)
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
