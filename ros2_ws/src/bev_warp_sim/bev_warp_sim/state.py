"""The simulator's state: an immutable batched value, and the pure pieces of a step that need nothing else.

:class:`SimState` holds ``B`` rollouts. Its arrays are read-only, its histories and decision points
are tuples of immutable records, and it holds no reference to the simulator: clips are named by a
content key of :mod:`bev_warp_sim.clip_registry`, so a state pickles to a few kB and a worker process
resolves the same key after registering the same clip. Transitions (``Simulator.commit`` and
``Simulator.step``) return new states and never touch their input, so any number of continuations can
branch from one state (GRPO groups). This module also holds what a transition reads or writes that
depends on the state alone: the ego's motion under its latched controls (:func:`drive_latched`) and
the decision-point record of a committed action (:func:`plan_record`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from rad2_core.geometry import wrap_angle
from rad2_core.planning_interface import PlanResult

from bev_warp_sim.trace import DecisionPoint, frozen_array


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


@dataclass(frozen=True)
class SimState:
    """State of ``B`` rollouts, an immutable value. Arrays have a leading batch axis and are read-only;
    histories hold one entry per step (``ego_hist[k]`` is ``[B, 6]``); ``decisions[b]`` and
    ``collisions[b]`` are tuples of immutable records of rollout ``b``."""

    clip_keys: tuple[str, ...]  # registry keys (clip_registry.register_clip)
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


def with_row(items: tuple, b: int, value) -> tuple:
    """``items`` with entry ``b`` replaced (per-rollout tuples of a state are never written in place)."""
    return items[:b] + (value,) + items[b + 1:]


def drive_latched(state: SimState, vehicle, dt: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The running rollouts (``rows``) one step on: each applies its next latched control, clamped to
    ``vehicle``'s limits, to the kinematic bicycle for ``dt``. Returns ``rows`` and the new ``ego``,
    ``accel``, ``latch_pos`` and ``t`` arrays (fresh copies; rows that are done keep their values)."""
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
    u = clamp_controls(ego[rows], u, vehicle, dt)
    ego[rows] = bicycle_step(ego[rows], u, vehicle, dt)
    ego[rows, 2] = wrap_angle(ego[rows, 2])
    accel[rows] = u[:, 0]
    latch_pos[rows] += 1
    t[rows] += 1
    return rows, {"ego": ego, "accel": accel, "latch_pos": latch_pos, "t": t}


def plan_record(act, default_plan_dt: float) -> tuple[np.ndarray, float, dict[str, Any]]:
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
