"""Reference policies that validate the simulator and the metrics (all implement ``Planner``).

- ``expert``: log replay, *privileged*: it reads the clip in ``reset`` and, before each plan, the
  simulator's context (current step and simulated pose, :meth:`set_sim_context`); it outputs the
  logged future ego positions at ``(k+1)·plan_dt`` in the simulated ego frame (past the clip end, the
  last logged velocity is continued).
- ``constant_velocity``: straight ahead at the current speed.
- ``idm``: a rule-based lane follower along the route tokens. The leader is the nearest agent token
  whose box, now or after ``leader_predict_s`` at constant velocity, lies within the corridor
  around the route ahead; the desired speed is the on-route speed limit from the map tokens (or
  ``fallback_speed``); the Intelligent Driver Model is integrated over the plan horizon with the
  leader moving at its current speed along the route, and the resulting arc lengths are placed on
  the route polyline.
- ``pdm_closed``: PDM-Closed (Dauner et al., CoRL 2023), :mod:`bev_warp_sim.pdm_closed`: IDM proposals
  at several target speeds on the route centreline and parallel paths, simulated, scored with
  nuPlan's closed-loop metrics, the best one executed; parameters params/pdm_closed.yaml.

Learned planners join through :data:`POLICIES` (name -> factory), e.g. ``rad2`` -> ``Rad2Policy``.
Every factory takes ``params``: every file of params/ as the entry point loaded it, merged
(:func:`rad2_core.config.load_merged`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from rad2_core.config import require
from rad2_core.geometry import world_to_ego
from rad2_core.planning_interface import PlanResult
from rad2_core.route_path import RoutePath, observation_route


class PolicyError(ValueError):
    """Bad policy name, parameters or missing privileged context."""


def _plan_params(params: dict[str, Any]) -> tuple[float, int]:
    return float(require(params, "planner.plan_dt")), int(require(params, "planner.plan_points"))


def _result(traj: np.ndarray, plan_dt: float, name: str) -> PlanResult:
    traj = np.asarray(traj, dtype=np.float64)
    return PlanResult(candidates=traj[None].astype(np.float32), scores=np.array([np.nan], np.float32),
                      selected=0, plan_dt=plan_dt, info={"policy": name})


class ExpertReplay:
    """Privileged log replay (see module docstring)."""

    name = "expert"

    def __init__(self, params: dict[str, Any], **_: Any):
        self.plan_dt, self.points = _plan_params(params)
        self.clip = None
        self._ctx = None

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None:
        if clip is None:
            raise PolicyError("expert: reset needs the clip (the expert replays its log)")
        self.clip = clip
        self._ctx = None

    def set_sim_context(self, ctx) -> None:
        self._ctx = ctx

    def plan(self, observation: Any) -> PlanResult:
        if self.clip is None or self._ctx is None:
            raise PolicyError("expert: no simulator context (call reset(clip), then set_sim_context)")
        clip = self.clip
        dt = float(clip.dt)
        t = int(self._ctx.step)
        times = t + (np.arange(1, self.points + 1) * self.plan_dt) / dt
        last = clip.num_steps - 1
        xs = np.interp(np.minimum(times, last), np.arange(clip.num_steps), clip.ego_x)
        ys = np.interp(np.minimum(times, last), np.arange(clip.num_steps), clip.ego_y)
        over = np.maximum(times - last, 0.0) * dt
        if over.any():
            v = clip.ego_speed[last]
            xs = xs + over * v * np.cos(clip.ego_yaw[last])
            ys = ys + over * v * np.sin(clip.ego_yaw[last])
        traj = world_to_ego(np.stack([xs, ys], -1), self._ctx.pose)
        return _result(traj, self.plan_dt, self.name)


class ConstantVelocity:
    """Straight ahead at the current speed."""

    name = "constant_velocity"

    def __init__(self, params: dict[str, Any], **_: Any):
        self.plan_dt, self.points = _plan_params(params)

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None:
        pass

    def plan(self, observation: Any) -> PlanResult:
        v = float(np.asarray(observation.ego_state)[0])
        k = np.arange(1, self.points + 1) * self.plan_dt
        return _result(np.stack([v * k, np.zeros_like(k)], -1), self.plan_dt, self.name)


class IdmLaneFollower:
    """IDM along the route (see module docstring); parameters ``reference_policies.idm`` of sim.yaml."""

    name = "idm"

    def __init__(self, params: dict[str, Any], **_: Any):
        self.plan_dt, self.points = _plan_params(params)
        self.cfg = {k: float(v) for k, v in require(params, "reference_policies.idm").items()}
        self.ego_length = float(require(params, "vehicle.length"))
        self.ego_width = float(require(params, "vehicle.width"))

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None:
        pass

    def _speed_limit(self, obs) -> float:
        mp = np.asarray(obs.map_polylines, dtype=np.float64)
        mm = np.asarray(obs.map_mask, bool)
        if not mm.any():
            return self.cfg["fallback_speed"]
        pts = mp[mm].reshape(-1, mp.shape[-1])
        on = pts[pts[:, 5] > 0.5]
        if len(on) == 0:
            on = pts
        near = on[np.argmin(np.hypot(on[:, 0], on[:, 1]))]
        return float(near[4]) if near[4] > 0 else self.cfg["fallback_speed"]

    def plan(self, observation: Any) -> PlanResult:
        cfg = self.cfg
        route = RoutePath(observation_route(observation.route, observation.route_mask))
        s_ego = float(route.project(np.zeros(2))[0])
        v = float(np.asarray(observation.ego_state)[0])
        v0 = min(self._speed_limit(observation), cfg["max_speed"])
        # leader: nearest agent in the corridor along the route ahead
        gap, v_lead = np.inf, 0.0
        ag = np.asarray(observation.agents, dtype=np.float64)[np.asarray(observation.agents_mask, bool)]
        for a in ag:
            for horizon in (0.0, cfg["leader_predict_s"]):
                p = a[0:2] + horizon * a[4:6]
                s_a, lat, head = route.project(p)
                half = 0.5 * (a[7] + self.ego_width) + cfg["lateral_margin"]
                if abs(float(lat)) < half and float(s_a) > s_ego:
                    g = float(s_a) - s_ego - 0.5 * (a[6] + self.ego_length)
                    if g < gap:
                        gap = g
                        v_lead = max(0.0, float(a[4] * np.cos(head) + a[5] * np.sin(head)))
                    break
        # integrate IDM over the plan horizon
        sub = max(1, int(round(self.plan_dt / cfg["dt"])))
        h = self.plan_dt / sub
        s, vv, lead_gap = 0.0, v, gap
        out = []
        for _ in range(self.points):
            for _ in range(sub):
                acc = cfg["a_max"] * (1.0 - (vv / max(v0, 0.1)) ** cfg["delta"])
                if np.isfinite(lead_gap):
                    s_star = cfg["min_gap"] + max(0.0, vv * cfg["time_headway"] + vv * (vv - v_lead)
                                                  / (2.0 * np.sqrt(cfg["a_max"] * cfg["b_comfort"])))
                    acc -= cfg["a_max"] * (s_star / max(lead_gap, 0.1)) ** 2
                acc = max(acc, -cfg["b_max"])
                v_new = max(0.0, vv + acc * h)
                ds = 0.5 * (vv + v_new) * h
                s += ds
                vv = v_new
                if np.isfinite(lead_gap):
                    lead_gap += (v_lead * h) - ds
            out.append(s)
        s_q = s_ego + np.asarray(out)
        traj = _along(route, s_q)
        return _result(traj, self.plan_dt, self.name)


def _along(route, s: np.ndarray) -> np.ndarray:
    """Points at arc lengths ``s`` on a RoutePath (extrapolated along the last segment)."""
    k = np.clip(np.searchsorted(route.s0, s, side="right") - 1, 0, len(route.seg_len) - 1)
    u = (s - route.s0[k]) / route.seg_len[k]
    return route.points[k] + u[:, None] * route.seg[k]


def _rad2_factory(params: dict[str, Any], checkpoint_dir: str | None = None,
                  traffic_rules: bool | None = None, backend: str | None = None,
                  runtime_overrides: dict[str, Any] | None = None, **_: Any):
    """``traffic_rules``: override ``traffic_rules.enabled`` of params/planner.yaml (None: as the file);
    ``backend``: the network runtime (None: ``planner.backend``); ``runtime_overrides``: ``runtime.*``
    settings (checked; a dict value updates that block's keys)."""
    from rad2_core.config import merge_runtime_overrides
    from rad2_planner.policy import Rad2Policy

    params = {**params, "runtime": dict(params["runtime"])}
    merge_runtime_overrides(params["runtime"], runtime_overrides or {})
    if traffic_rules is not None:
        params["traffic_rules"] = {**params["traffic_rules"], "enabled": bool(traffic_rules)}
    return Rad2Policy.from_params(params, checkpoint_dir=checkpoint_dir,
                                  **({"backend": backend} if backend else {}))


def _pdm_closed_factory(params: dict[str, Any], **kwargs: Any):
    from bev_warp_sim.pdm_closed import make_pdm_closed

    return make_pdm_closed(params, **kwargs)


POLICIES: dict[str, Callable[..., Any]] = {
    "expert": ExpertReplay,
    "constant_velocity": ConstantVelocity,
    "idm": IdmLaneFollower,
    "pdm_closed": _pdm_closed_factory,
    "rad2": _rad2_factory,
}


def make_policy(name: str, params: dict[str, Any], **kwargs: Any):
    """Instantiate a registered policy by name (``POLICIES``) with ``params`` (every file of params/ as
    loaded, merged)."""
    if name not in POLICIES:
        raise PolicyError(f"policy: {name!r} is not one of {sorted(POLICIES)}")
    return POLICIES[name](params, **kwargs)
