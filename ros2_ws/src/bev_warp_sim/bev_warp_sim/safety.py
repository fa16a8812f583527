"""Collision, time-to-collision and at-fault attribution between the ego and logged agents.

Boxes are arrays ``[..., 5]`` = (x, y, yaw, length, width): box centre, heading (rad, CCW from +x)
and full extents, in the world frame. Everything broadcasts over leading axes so a batch of rollouts,
a window of look-ahead steps and all agents are checked in one call.

Time to collision (RAD-2 Eq. 12)
    ``T_t = inf{k·dt ∈ [0, T_max] : B_ego(k; t) ∩ V_env(t + k) ≠ ∅}``, ``T_max`` when nothing is hit.
    ``B_ego(k; t)`` is the ego box projected from its state at step ``t`` with *constant speed and
    constant yaw rate* (a CTRV arc, see :func:`project_ego_ctrv`); ``V_env(t + k)`` are the agents'
    boxes at absolute step ``t + k`` taken from the log (their ground-truth future; non-reactive replay)
    or from any other future the caller supplies. Two optional exclusions follow nuPlan's TTC metric:
    a stationary ego (speed below ``at_fault.stopped_speed``) gets ``T_max`` because it cannot cause a
    collision by moving, and agents whose centre is behind the ego rear bumper at step ``t`` are ignored
    (a vehicle closing in from behind is its own hazard). A box overlap at ``k = 0`` always gives
    ``T_t = 0``, whatever the exclusions: a collision is a collision.

Follower time to collision (``T^rear_t``, :func:`ttc_at_state` with ``with_rear=True``)
    The same projection against only the agents that ``T_t`` leaves out as behind the ego, stationary
    ego included: how soon a vehicle coming up from behind, on its own (logged) future, reaches the ego
    if the ego holds its speed. A log-replayed follower cannot brake for an ego slower than the logged
    one, so this is the margin that rear-end collisions in a non-reactive replay use up; the ``rad2``
    reward can weigh it (``rewards.rad2.weight_follower``).

At-fault attribution (:func:`classify_collision`)
    The contact point is the centroid of the two boxes' intersection polygon. Each box is split along
    its heading into a front zone, a side zone and a rear zone (front/rear = ``zone_fraction`` of the
    length). Rules, first match wins:

    1. ego stationary (speed < ``stopped_speed``): not at fault;
    2. contact in the ego's rear zone (rear-ended): not at fault;
    2b. the ego crossed a red stop line on its route within ``at_fault.red_light_window_s`` before the
       contact (it entered the junction against the signal, so it had no right of way): at fault;
    3. ego front zone against the agent's rear zone (ran into a vehicle ahead, cut-ins included, as in
       nuPlan): at fault;
    4. ego side zone against the agent's front zone (the agent's front entered the ego's side):
       not at fault;
    5. ego front zone and headings opposite (|Δyaw| > 135°, head-on), or ego front against the side of
       an agent crossing at |Δyaw| ≥ 45°: at fault;
    6. otherwise (near-parallel swipes, merges, corner contacts) the vehicle moving sideways across the
       road towards the other is at fault: with ``n`` the normal of the lane direction at the contact
       (``road_heading``; the ego's heading when no map is given), the ego's velocity component along
       ``n`` towards the agent is compared with the agent's component towards the ego; the ego is at
       fault when its own exceeds the agent's by more than ``at_fault.lateral_tie_m_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.geometry import box_corners, boxes_overlap, wrap_angle


def make_boxes(x, y, yaw, length, width) -> np.ndarray:
    """Stack broadcast box parameters into ``[..., 5]`` float64."""
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (x, y, yaw, length, width)))
    return np.stack(arrays, axis=-1)


def _check_boxes(name: str, boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim == 0 or boxes.shape[-1] != 5:
        raise ValueError(
            f"{name}: expected boxes of shape [..., 5] (x, y, yaw, length, width), got {boxes.shape}"
        )
    return boxes


def collisions(ego_box, agent_boxes, agent_valid=None) -> np.ndarray:
    """Agents overlapping the ego: ``ego_box [..., 5]``, ``agent_boxes [..., N, 5]`` -> ``[..., N]`` bool."""
    ego_box = _check_boxes("ego_box", ego_box)
    agent_boxes = _check_boxes("agent_boxes", agent_boxes)
    hit = boxes_overlap(ego_box[..., None, :], agent_boxes)
    if agent_valid is not None:
        hit &= np.asarray(agent_valid, dtype=bool)
    return hit


def project_ego_ctrv(pose, speed, yaw_rate, n_steps: int, dt: float) -> np.ndarray:
    """Ego poses ``[..., n_steps + 1, 3]`` at look-ahead ``k·dt``, k = 0..n_steps, driving at constant
    speed and constant yaw rate from ``pose [..., 3]`` (exact arc, straight line when yaw rate ≈ 0)."""
    pose = np.asarray(pose, dtype=np.float64)
    speed = np.asarray(speed, dtype=np.float64)[..., None]
    yaw_rate = np.asarray(yaw_rate, dtype=np.float64)[..., None]
    if n_steps < 0:
        raise ValueError(f"n_steps: must be >= 0, got {n_steps}")
    tau = np.arange(n_steps + 1, dtype=np.float64) * dt
    yaw0 = pose[..., 2:3]
    dyaw = yaw_rate * tau
    small = np.abs(yaw_rate) < 1e-6
    safe_w = np.where(small, 1.0, yaw_rate)
    radius = speed / safe_w
    arc_x = np.where(small, speed * tau * np.cos(yaw0), radius * (np.sin(yaw0 + dyaw) - np.sin(yaw0)))
    arc_y = np.where(small, speed * tau * np.sin(yaw0), -radius * (np.cos(yaw0 + dyaw) - np.cos(yaw0)))
    x = pose[..., 0:1] + arc_x
    y = pose[..., 1:2] + arc_y
    yaw = wrap_angle(yaw0 + dyaw)
    return np.stack(np.broadcast_arrays(x, y, yaw), axis=-1)


def time_to_collision(
    ego_future,
    ego_size,
    agent_future,
    agent_valid,
    dt: float,
    t_max: float,
    ignore_agents=None,
) -> np.ndarray:
    """RAD-2 Eq. 12 for a batch.

    ego_future ``[..., K+1, 3]`` ego poses at look-ahead k = 0..K (k·dt ≤ t_max); ego_size ``[..., 2]``
    (length, width) or ``(2,)``; agent_future ``[..., N, K+1, 5]`` agent boxes at the same absolute
    times; agent_valid ``[..., N, K+1]``; ignore_agents ``[..., N]`` bool excludes agents at k ≥ 1 (they
    still count at k = 0). Returns T ``[...]`` in seconds: the first ``k·dt`` with an overlap, or t_max.
    A tuple of masks as ``ignore_agents`` returns a tuple of T, one per mask, from one overlap test.
    """
    ego_future = np.asarray(ego_future, dtype=np.float64)
    agent_future = _check_boxes("agent_future", agent_future)
    if ego_future.shape[-1] != 3:
        raise ValueError(f"ego_future: expected [..., K+1, 3] poses, got {ego_future.shape}")
    k1 = ego_future.shape[-2]
    if agent_future.shape[-2] != k1:
        raise ValueError(
            f"agent_future: look-ahead length {agent_future.shape[-2]} does not match ego_future's {k1}"
        )
    ego_size = np.asarray(ego_size, dtype=np.float64)
    ego_boxes = np.concatenate(
        [ego_future, np.broadcast_to(ego_size[..., None, :], ego_future.shape[:-1] + (2,))], axis=-1
    )  # [..., K+1, 5]
    hit = boxes_overlap(ego_boxes[..., None, :, :], agent_future)  # [..., N, K+1]
    hit &= np.asarray(agent_valid, dtype=bool)
    if isinstance(ignore_agents, tuple):  # several agent selections over one overlap test
        return tuple(_first_hit_time(hit, ign, dt, t_max) for ign in ignore_agents)
    return _first_hit_time(hit, ignore_agents, dt, t_max)


def _first_hit_time(hit: np.ndarray, ignore_agents, dt: float, t_max: float) -> np.ndarray:
    """First ``k·dt`` (≤ t_max) with a hit ``[..., N, K+1]`` by an agent not ignored at k ≥ 1."""
    k1 = hit.shape[-1]
    if ignore_agents is not None:
        ign = np.asarray(ignore_agents, dtype=bool)[..., None]
        hit = hit & ~(ign & (np.arange(k1) >= 1))
    any_hit = hit.any(axis=-2)  # [..., K+1]
    times = np.arange(k1, dtype=np.float64) * dt
    first = np.where(any_hit, times, np.inf).min(axis=-1)
    return np.minimum(first, t_max)


def rear_agents(ego_pose, ego_length, agent_xy) -> np.ndarray:
    """Agents whose centre lies behind the ego rear bumper.

    ``ego_pose [..., 3]``, ``ego_length [...]``, ``agent_xy [..., N, 2]`` -> bool ``[..., N]``.
    """
    ego_pose = np.asarray(ego_pose, dtype=np.float64)
    agent_xy = np.asarray(agent_xy, dtype=np.float64)
    c, s = np.cos(ego_pose[..., 2])[..., None], np.sin(ego_pose[..., 2])[..., None]
    dx = agent_xy[..., 0] - ego_pose[..., 0][..., None]
    dy = agent_xy[..., 1] - ego_pose[..., 1][..., None]
    lon = c * dx + s * dy
    return lon < -0.5 * np.asarray(ego_length, dtype=np.float64)[..., None]


def ttc_at_state(
    ego_pose,
    ego_speed,
    ego_yaw_rate,
    ego_size,
    agent_future,
    agent_valid,
    params: dict[str, Any],
    with_rear: bool = False,
):
    """T_t from an ego state (CTRV projection) against agent boxes ``[..., N, K+1, 5]`` over the look-ahead.

    ``params`` is the ``sim.yaml`` dict (uses ``ttc.*`` and ``at_fault.stopped_speed``). K+1 must equal
    ``round(t_max / dt) + 1``. With ``with_rear``, returns ``(T_t, T^rear_t)``: the follower time to
    collision (module docstring) from the same overlap test.
    """
    cfg = params["ttc"]
    dt, t_max = float(cfg["dt"]), float(cfg["t_max"])
    n_steps = int(round(t_max / dt))
    ego_pose = np.asarray(ego_pose, dtype=np.float64)
    ego_speed = np.asarray(ego_speed, dtype=np.float64)
    future = project_ego_ctrv(ego_pose, ego_speed, ego_yaw_rate, n_steps, dt)
    ego_size = np.asarray(ego_size, dtype=np.float64)
    behind = rear_agents(ego_pose, ego_size[..., 0], np.asarray(agent_future)[..., 0, :2])
    ignore = behind if cfg.get("exclude_rear_agents", False) else None
    if cfg.get("exclude_stopped_ego", False):
        stopped = ego_speed < float(params["at_fault"]["stopped_speed"])
        # a stationary ego keeps only its current overlaps: ignore everyone at k >= 1
        n_agents = np.asarray(agent_future).shape[-3]
        stop_mask = np.broadcast_to(stopped[..., None], stopped.shape + (n_agents,))
        ignore = stop_mask if ignore is None else (ignore | stop_mask)
    if not with_rear:
        return time_to_collision(future, ego_size, agent_future, agent_valid, dt, t_max, ignore)
    return time_to_collision(future, ego_size, agent_future, agent_valid, dt, t_max, (ignore, ~behind))


# ----------------------------------------------------------------------------------------------------
# At-fault attribution


@dataclass
class CollisionInfo:
    """One ego-agent contact: where it is on each box and whether the ego is to blame."""

    agent_index: int
    ego_zone: str  # front | side | rear
    agent_zone: str
    ego_stopped: bool
    at_fault: bool
    contact_xy: tuple[float, float]
    ego_ran_red: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent_index": self.agent_index,
            "ego_zone": self.ego_zone,
            "agent_zone": self.agent_zone,
            "ego_stopped": self.ego_stopped,
            "at_fault": self.at_fault,
            "contact_xy": list(self.contact_xy),
            "ego_ran_red": self.ego_ran_red,
        }


def _zone(box: np.ndarray, point: np.ndarray, zone_fraction: float) -> str:
    c, s = np.cos(box[2]), np.sin(box[2])
    lon = c * (point[0] - box[0]) + s * (point[1] - box[1])
    half = 0.5 * box[3]
    if lon >= half - zone_fraction * box[3]:
        return "front"
    if lon <= -half + zone_fraction * box[3]:
        return "rear"
    return "side"


def contact_point(ego_box, agent_box) -> np.ndarray:
    """Centroid of the intersection polygon of two overlapping boxes (midpoint of centres if degenerate)."""
    from shapely.geometry import Polygon

    pa = Polygon(box_corners(*np.asarray(ego_box, dtype=np.float64)))
    pb = Polygon(box_corners(*np.asarray(agent_box, dtype=np.float64)))
    inter = pa.intersection(pb)
    if inter.is_empty or inter.area <= 1e-12:
        return 0.5 * (np.asarray(ego_box[:2], dtype=np.float64) + np.asarray(agent_box[:2], dtype=np.float64))
    cen = inter.centroid
    return np.array([cen.x, cen.y])


def classify_collision(
    ego_box,
    ego_velocity,
    agent_box,
    agent_velocity,
    params: dict[str, Any],
    agent_index: int = -1,
    road_heading: float | None = None,
    ego_ran_red: bool = False,
) -> CollisionInfo:
    """Attribute one ego-agent contact (see the module docstring for the rule).

    Boxes ``(5,)`` world frame; velocities ``(2,)`` world-frame m/s; ``road_heading`` the lane direction
    at the contact (rad), used for side swipes (the ego's heading when unknown).
    """
    cfg = params["at_fault"]
    zone_fraction = float(cfg["zone_fraction"])
    ego_box = np.asarray(ego_box, dtype=np.float64)
    agent_box = np.asarray(agent_box, dtype=np.float64)
    ev = np.asarray(ego_velocity, dtype=np.float64)
    av = np.asarray(agent_velocity, dtype=np.float64)
    point = contact_point(ego_box, agent_box)
    ego_zone = _zone(ego_box, point, zone_fraction)
    agent_zone = _zone(agent_box, point, zone_fraction)
    stopped = bool(np.hypot(*ev) < float(cfg["stopped_speed"]))
    dyaw = abs(float(wrap_angle(agent_box[2] - ego_box[2])))
    if stopped or ego_zone == "rear":
        at_fault = False
    elif ego_ran_red:
        at_fault = True  # entered against a red signal: no right of way, whatever the geometry
    elif ego_zone == "front" and agent_zone == "rear":
        at_fault = True  # ran into a vehicle ahead
    elif ego_zone == "side" and agent_zone == "front":
        at_fault = False  # the agent's front entered the ego's side
    elif ego_zone == "front" and (dyaw > 0.75 * np.pi or (agent_zone == "side" and dyaw >= 0.25 * np.pi)):
        at_fault = True  # head-on, or the ego drove into the side of a crossing agent
    else:  # near-parallel swipe / merge / corner contact: who moves across the road towards the other
        ref = float(ego_box[2]) if road_heading is None else float(road_heading)
        normal = np.array([-np.sin(ref), np.cos(ref)])
        side = 1.0 if float(np.dot(agent_box[:2] - ego_box[:2], normal)) >= 0 else -1.0
        ego_in = side * float(np.dot(ev, normal))  # ego's lateral speed towards the agent
        agent_in = -side * float(np.dot(av, normal))  # agent's lateral speed towards the ego
        at_fault = ego_in > agent_in + float(cfg.get("lateral_tie_m_s", 0.1))
    return CollisionInfo(
        agent_index=int(agent_index),
        ego_zone=ego_zone,
        agent_zone=agent_zone,
        ego_stopped=stopped,
        at_fault=bool(at_fault),
        contact_xy=(float(point[0]), float(point[1])),
        ego_ran_red=bool(ego_ran_red),
    )


# ----------------------------------------------------------------------------------------------------
# Clips


def agent_future_boxes(clip, start: int, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Logged agent boxes ``[N, n_steps+1, 5]`` and validity for steps start..start+n_steps (padded invalid
    past the clip end)."""
    n = len(clip.agent_ids)
    t_total = int(clip.num_steps)
    idx = np.arange(start, start + n_steps + 1)
    inside = idx < t_total
    idc = np.clip(idx, 0, t_total - 1)
    boxes = np.zeros((n, n_steps + 1, 5))
    if n:
        boxes[..., 0] = clip.agent_x[:, idc]
        boxes[..., 1] = clip.agent_y[:, idc]
        boxes[..., 2] = clip.agent_yaw[:, idc]
        boxes[..., 3] = np.asarray(clip.agent_length, dtype=np.float64)[:, None]
        boxes[..., 4] = np.asarray(clip.agent_width, dtype=np.float64)[:, None]
    if n:
        valid = np.asarray(clip.agent_valid, dtype=bool)[:, idc] & inside[None, :]
    else:
        valid = np.zeros((0, n_steps + 1), dtype=bool)
    return boxes, valid


def logged_yaw_rate(clip) -> np.ndarray:
    """Ego yaw rate ``[T]`` of the log by central differences of the unwrapped heading."""
    yaw = np.unwrap(np.asarray(clip.ego_yaw, dtype=np.float64))
    if len(yaw) < 2:
        return np.zeros_like(yaw)
    return np.gradient(yaw, float(clip.dt))


def min_ttc_of_log(clip, params: dict[str, Any]) -> dict[str, Any]:
    """Safety of the logged ego drive: T_t at every step (CTRV ego projection vs logged agent futures),
    its minimum, and the logged ego-agent collisions with their attribution.

    Returns ``{"ttc": [T] array, "min_ttc": float, "argmin_step": int, "collisions": [dict, ...]}``.
    """
    cfg = params["ttc"]
    n_steps = int(round(float(cfg["t_max"]) / float(cfg["dt"])))
    if abs(float(cfg["dt"]) - float(clip.dt)) > 1e-9:
        raise ValueError(f"ttc.dt: {cfg['dt']} must equal the clip dt {clip.dt} for logged futures")
    t_total = int(clip.num_steps)
    pose = np.stack([clip.ego_x, clip.ego_y, clip.ego_yaw], -1).astype(np.float64)
    speed = np.asarray(clip.ego_speed, dtype=np.float64)
    yaw_rate = logged_yaw_rate(clip)
    size = np.array([clip.ego_length, clip.ego_width], dtype=np.float64)
    n = len(clip.agent_ids)
    ttc = np.full(t_total, float(cfg["t_max"]))
    events: list[dict[str, Any]] = []
    if n:
        # [T, N, K+1, 5] is small for clips (T ≤ 200, N ≤ ~60, K ≤ 40); do it in chunks to bound memory
        chunk = 50
        for t0 in range(0, t_total, chunk):
            ts = np.arange(t0, min(t0 + chunk, t_total))
            fut = [agent_future_boxes(clip, int(t), n_steps) for t in ts]
            boxes = np.stack([f[0] for f in fut])
            valid = np.stack([f[1] for f in fut])
            ttc[ts] = ttc_at_state(pose[ts], speed[ts], yaw_rate[ts], size, boxes, valid, params)
        ego_boxes = make_boxes(pose[:, 0], pose[:, 1], pose[:, 2], size[0], size[1])  # [T, 5]
        agent_boxes = make_boxes(
            clip.agent_x.T, clip.agent_y.T, clip.agent_yaw.T,
            np.asarray(clip.agent_length)[None, :], np.asarray(clip.agent_width)[None, :],
        )  # [T, N, 5]
        hits = collisions(ego_boxes, agent_boxes, np.asarray(clip.agent_valid).T)
        seen: set[int] = set()
        ego_vel = np.stack([speed * np.cos(pose[:, 2]), speed * np.sin(pose[:, 2])], -1)
        for t, j in zip(*np.nonzero(hits)):
            if int(j) in seen:  # first contact per agent only
                continue
            seen.add(int(j))
            info = classify_collision(
                ego_boxes[t], ego_vel[t], agent_boxes[t, j],
                (clip.agent_vx[j, t], clip.agent_vy[j, t]), params, agent_index=int(j),
            )
            events.append({"step": int(t), "agent_id": int(clip.agent_ids[j]), **info.as_dict()})
    k = int(np.argmin(ttc)) if t_total else 0
    return {"ttc": ttc, "min_ttc": float(ttc.min()) if t_total else float(cfg["t_max"]),
            "argmin_step": k, "collisions": events}
