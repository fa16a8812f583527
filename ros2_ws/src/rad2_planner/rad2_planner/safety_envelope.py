"""Longitudinal safety envelope on the executed plan (no ROS, no networks).

The learned generator imitates drivers, and neither it nor the ``safe_medoid`` selection keeps a
safe distance: the selection only avoids candidates whose boxes *overlap* the agents extrapolated at
constant velocity, so a plan that tails a leader at 0.4 s (it merged in behind it) passes as long as
the leader does not slow down; when it does, the replanned candidates brake too late and the ego
runs into its rear (at fault, ``bev_warp_sim.safety`` rule 3). This stage bounds the executed plan's
speed along its own path (the path is kept, only the timing changes, like ``comfort_limits`` and
``traffic_rules``) so that at every plan point the ego could still stop behind every agent in its
path even if that agent braked hard from then on (the safe speed of Gipps' car-following model, a
form of the RSS longitudinal distance):

    s_ego(t) + v(t)·reaction_time_s + v(t)²/(2·ego_decel)  <=  s_hit(t) + v_a(t)²/(2·agent_decel) - margin_m

- ``s_hit(t)``: the arc length along the plan's path (extended straight ahead beyond its end) at
  which the ego box, widened by ``lateral_margin_m`` on each side, first touches the agent's box at
  time t predicted at constant velocity from its observation token (the agent is *in the path* at t
  when there is such a point); ``v_a`` the agent's speed along the path there (>= 0).
- only agents whose centre is ahead of the ego's centre now count (a follower is its own hazard), or
  that overtake it in another lane and are ahead of its centre within ``alongside_horizon_s``, and
  at a plan point only where they meet the path ahead of the ego there (an agent crossing behind it,
  or moving in beside it, is not one to stop for). An agent crossing the path (heading more than
  ``crossing_angle_deg`` from the path's) where the ego could not stop before it even at the emergency
  limit is not stopped for either: the ego is already in its way, and braking would leave it standing
  there (like a red light in the dilemma zone, ``traffic_rules``).
- constant velocity is trusted only so far for agents that are not in the path now: one crossing it
  counts only at plan times up to ``crossing_horizon_s``, one beside it moving into it (a cut-in) only
  up to ``cut_in_horizon_s``. Over the whole plan, cross traffic that stops at its own signal and
  lateral drift within a lane two lanes over (recorded traffic) forced stops for conflicts that never
  came; within the horizons a real cut-in or crossing still finds the ego braking at the emergency limit.
- a car beside the path still alongside the ego (its rear not yet ahead of the ego's front) counts
  only up to ``alongside_horizon_s``: moving in, it would meet the ego's side, not its front, and in
  recorded traffic the extrapolated lateral wobble of cars in the next lane forced emergency stops beside
  them, each handing the hazard to the follower. A decisive cut-in from alongside still counts.
- the plan's speed on each interval is lowered to the largest speed that satisfies the bound at the
  interval's end; it never drops faster than the vehicle's emergency deceleration (``vehicle.min_accel``
  of params/vehicle.yaml): when the bound asks for more, the plan brakes at that limit. When the bound
  of a later point cannot be met even so (an agent cutting in), the plan brakes at that limit from now
  on, for as few intervals as make it reachable: braking starts at once, not when the agent is in the
  path. A plan that satisfies the bound is returned unchanged.
- only an agent heading within ``along_angle_deg`` of the path where it meets it gets the braking credit
  ``v_a²/(2·agent_decel)``; and at every moment the ego can still stop, at the emergency limit, short of
  where an agent in its path is then (the contact bound, ``speed_bound``). Agents are placed in the path
  ``substeps`` times per plan interval (``planner.collision_time_step_s``).
- except where only predicted entries make the bound unreachable: agents not in the path now whose
  constant-velocity entry into it lies more than ``entry_imminent_s`` ahead. Then the plan brakes at
  ``entry_brake_decel`` from now (within the tracker's jerk limits) and keeps every other agent's bound;
  the prediction is re-checked every cycle, and an entry within ``entry_imminent_s`` brakes as above. On
  recorded traffic most emergency stops for such entries lasted one cycle (the neighbour's
  extrapolated drift was gone in the next): a jolt for a conflict that never came.

The comfort stage after it only re-times plans slower (braking is never limited), so an envelope stop
stays a stop. Parameters: ``safety_envelope.*`` in params/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rad2_core.geometry import boxes_overlap
from rad2_core.tokens import arc_lengths


@dataclass(frozen=True)
class SafetyEnvelopeParams:
    enabled: bool
    reaction_time_s: float  # s, the ego's response delay assumed by the bound
    ego_decel: float  # m/s^2, braking the ego counts on to stop (below its emergency limit: a reserve)
    agent_decel: float  # m/s^2, hardest braking assumed of an agent ahead
    margin_m: float  # m, kept between the ego's box and the agent's when both have stopped
    lateral_margin_m: float  # m, the ego's box is widened by this on each side for the in-path test
    station_step_m: float  # m, spacing of the ego boxes swept along the path
    crossing_angle_deg: float  # deg, an agent whose heading differs more from the path's is crossing it
    along_angle_deg: float  # deg, only an agent heading within this of the path is credited its braking way
    crossing_horizon_s: float  # s, a crossing agent counts only where it meets the path this soon
    cut_in_horizon_s: float  # s, an agent moving into the path from beside it counts only this soon
    alongside_horizon_s: float  # s, ... and one doing so while alongside the ego only this soon
    entry_brake_decel: float  # m/s^2, braking for predicted entries not yet imminent (0: emergency limit)
    entry_imminent_s: float  # s, an entry predicted this soon is braked for up to the emergency limit
    # the headway careful humans keep (module doc, "Closing on a leader"); 0 switches the bound off
    follow_time_gap_s: float = 0.0  # s, time gap kept behind an agent in the path once at its speed
    closing_decel: float = 0.0  # m/s^2, braking the ego may need to come down to a leader's speed

    def __post_init__(self):
        for name in ("ego_decel", "agent_decel", "station_step_m"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"safety_envelope.{name}: must be a positive number, got {value!r}")
        if not 0.0 < self.crossing_angle_deg <= 90.0:
            raise ValueError(f"safety_envelope.crossing_angle_deg: must be in (0, 90], got "
                             f"{self.crossing_angle_deg!r}")
        if not 0.0 <= self.along_angle_deg <= self.crossing_angle_deg:
            raise ValueError(f"safety_envelope.along_angle_deg: must be in [0, crossing_angle_deg = "
                             f"{self.crossing_angle_deg!r}], got {self.along_angle_deg!r}")
        for name in ("reaction_time_s", "margin_m", "lateral_margin_m", "crossing_horizon_s",
                     "cut_in_horizon_s", "alongside_horizon_s", "entry_brake_decel", "entry_imminent_s",
                     "follow_time_gap_s", "closing_decel"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0.0:
                raise ValueError(f"safety_envelope.{name}: must be a number >= 0, got {value!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> SafetyEnvelopeParams:
        from rad2_core.config import require

        c = require(params, "safety_envelope")
        return cls(bool(c["enabled"]), float(c["reaction_time_s"]), float(c["ego_decel"]),
                   float(c["agent_decel"]), float(c["margin_m"]), float(c["lateral_margin_m"]),
                   float(c["station_step_m"]), float(c["crossing_angle_deg"]), float(c["along_angle_deg"]),
                   float(c["crossing_horizon_s"]), float(c["cut_in_horizon_s"]),
                   float(c["alongside_horizon_s"]), float(c["entry_brake_decel"]),
                   float(c["entry_imminent_s"]), float(c["follow_time_gap_s"]), float(c["closing_decel"]))

    @property
    def closing_bound(self) -> bool:
        return self.follow_time_gap_s > 0.0 and self.closing_decel > 0.0


def constant_velocity_boxes(agents: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Boxes ``[N, len(times), 5]`` (x, y, yaw, length, width) of observation agent tokens ``agents
    [N, 10]`` (x, y, cos, sin, vx, vy, length, width, ...; ego frame) extrapolated at constant velocity
    to ``times`` (s from now)."""
    a = np.asarray(agents, np.float64)
    t = np.asarray(times, np.float64)
    return np.stack(
        np.broadcast_arrays(
            a[:, None, 0] + a[:, None, 4] * t,
            a[:, None, 1] + a[:, None, 5] * t,
            np.arctan2(a[:, 3], a[:, 2])[:, None],
            a[:, None, 6],
            a[:, None, 7],
        ),
        -1,
    )


@dataclass(frozen=True)
class EnvelopeResult:
    plan: np.ndarray  # [T, 2] the executed plan (the input itself when unchanged)
    fired: bool  # the bound lowered the plan's speed somewhere
    agent: int  # index (into the unmasked agent tokens) of the agent that bound it first, -1 if none
    gap_m: float  # nearest point along the path where the ego box would touch that agent, nan if none
    decel: float  # m/s^2, the hardest deceleration of the re-timed plan (0 when unchanged)

    def note(self) -> str:
        return (f"brake for agent {self.agent} in the path {self.gap_m:.1f} m ahead (plan decel up to "
                f"{self.decel:.1f} m/s^2)") if self.fired else ""


def _path(plan: np.ndarray, extension_m: float) -> tuple[np.ndarray, np.ndarray]:
    """The plan's path from the origin, points closer than 1 cm dropped, extended straight along its
    last direction (the ego's heading when it does not move) by ``extension_m``; with arc lengths."""
    pts = np.vstack([np.zeros((1, 2)), np.asarray(plan, np.float64)])
    keep = np.concatenate([[True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-2])
    pts = pts[keep]
    if len(pts) >= 2:
        d = pts[-1] - pts[-2]
        d = d / np.linalg.norm(d)
    else:
        d = np.array([1.0, 0.0])
    pts = np.vstack([pts, pts[-1] + extension_m * d])
    return pts, arc_lengths(pts)


def apply_envelope(plan: np.ndarray, plan_dt: float, ego_speed: float, agents: np.ndarray,
                   agents_mask: np.ndarray, ego_size: tuple[float, float], emergency_decel: float,
                   p: SafetyEnvelopeParams, max_speed: float | None = None,
                   substeps: int = 1) -> EnvelopeResult:
    """``plan`` [T, 2] (ego frame, point k at (k+1)·plan_dt) re-timed along its path within the bound
    of the module doc against the agents ``agents [N, 10]`` (observation tokens, ``agents_mask [N]``),
    braking at most at ``emergency_decel`` (m/s^2, > 0).

    ``substeps``: the agents are placed in the path at this many times per plan interval, and the bound
    holds at each of them (``planner.collision_time_step_s``). Why: at the plan's 0.5 s a car crossing
    at 8.5 m/s moves 4 m between two looks, about its own length, and passed through the ego's swept
    path unseen (a car crossing a crawling ego's nose at a junction, hit at fault).

    ``max_speed`` (m/s, the vehicle's): the speed the swept path's length is computed from is capped
    there, so an impossible ego or plan speed (the nodes' validators reject those before planning) cannot
    make the sweep, and its memory, unbounded. A non-finite ``ego_speed`` is an error naming it.
    """
    if not np.isfinite(ego_speed):
        raise ValueError(f"ego_speed: {ego_speed!r} m/s is not finite")
    pts = np.asarray(plan, np.float64)
    unchanged = EnvelopeResult(pts.copy(), False, -1, float("nan"), 0.0)
    idx = np.flatnonzero(np.asarray(agents_mask, bool))
    if not p.enabled or len(idx) == 0 or len(pts) == 0:
        return unchanged
    a = np.asarray(agents, np.float64)[idx]
    v0 = max(float(ego_speed), 0.0)
    # the agents that count: centre ahead of the ego's centre now, or overtaking from behind in another
    # lane (clear of the ego's width now) fast enough to be ahead of the ego's centre within
    # alongside_horizon_s: a car 7 m/s faster coming up from behind-left and moving across the ego's nose
    # was left out until its centre passed the ego's, when the ego, accelerating, could no longer avoid
    # it. A follower in the ego's own lane stays out (braking for it is its own hazard).
    overtaking = ((np.abs(a[:, 1]) > 0.5 * (ego_size[1] + a[:, 7]))
                  & (a[:, 0] + (a[:, 4] - v0) * p.alongside_horizon_s > 0.0))
    ahead = (a[:, 0] > 0.0) | overtaking
    idx, a = idx[ahead], a[ahead]
    if len(idx) == 0:
        return unchanged
    own_cum = arc_lengths(np.vstack([np.zeros((1, 2)), pts]))
    own_speed = np.diff(own_cum) / plan_dt  # the plan's speed on each interval
    v_top = max(v0, float(own_speed.max()))
    if max_speed is not None:
        v_top = min(v_top, float(max_speed))
    a_speed = np.hypot(a[:, 4], a[:, 5])
    reach = v_top * (p.reaction_time_s + plan_dt) + v_top**2 / (2.0 * p.ego_decel) + p.margin_m + ego_size[0]
    if p.closing_bound:  # far enough to see a standing leader the ego must come down to at closing_decel
        reach = max(reach, v_top * (p.follow_time_gap_s + plan_dt) + v_top**2 / (2.0 * p.closing_decel)
                    + p.margin_m + ego_size[0])
    path, cum = _path(pts, max(reach, 1.0) + p.station_step_m)
    # the ego box swept along the path: stations every station_step_m with the path's heading there
    s = np.arange(0.0, cum[-1] + 1e-9, p.station_step_m)
    seg = np.clip(np.searchsorted(cum, s, side="right") - 1, 0, len(path) - 2)
    d = np.diff(path, axis=0)[seg]
    yaw = np.arctan2(d[:, 1], d[:, 0])
    ego = np.stack(np.broadcast_arrays(np.interp(s, cum, path[:, 0]), np.interp(s, cum, path[:, 1]), yaw,
                                       ego_size[0], ego_size[1] + 2.0 * p.lateral_margin_m), -1)  # S 5
    n = int(substeps)
    if n < 1:
        raise ValueError(f"substeps: must be an integer >= 1, got {substeps!r}")
    times = np.arange(len(pts) * n + 1) * (plan_dt / n)  # now and n times per plan interval
    boxes = constant_velocity_boxes(a, times)  # N T+1 5
    hit = boxes_overlap(ego[None, None], boxes[:, :, None])  # N T+1 S
    any_hit = hit.any(-1)
    if not any_hit.any():
        return unchanged
    first = hit.argmax(-1)
    # the last station before the first touching one (conservative by at most one station)
    s_hit = np.where(any_hit, np.maximum(s[first] - p.station_step_m, 0.0), np.inf)  # N T+1
    # the agent's speed along the path where it is met, >= 0 (an oncoming agent stops nowhere ahead);
    # only an agent heading along the path there (within along_angle_deg: a leader, a car changing into
    # the lane) is credited with the way it would still go braking. One entering at a steeper angle
    # sweeps across the path where it meets it, its side first: credited with its speed's projection, a
    # car passing across a crawling ego's nose as the ego turned right into its lane (30-40 degrees off
    # the path) "would stop 5 m further on", and the bound let the ego drive into its side.
    heading_off = np.arctan2(a[:, 3], a[:, 2])[:, None] - yaw[first]  # N T+1
    v_along = np.maximum(a[:, None, 4] * np.cos(yaw[first]) + a[:, None, 5] * np.sin(yaw[first]), 0.0)
    v_along = np.minimum(v_along, a_speed[:, None])
    v_along = np.where(np.cos(heading_off) >= np.cos(np.radians(p.along_angle_deg)), v_along, 0.0)
    # where the ego's centre must be able to stop by, per agent and time
    limit = s_hit + v_along**2 / (2.0 * p.agent_decel) - p.margin_m  # N T+1
    # an agent crossing the path that the ego cannot stop before even at its emergency limit (it is
    # already in the agent's way): braking would leave it standing there, so the plan goes on. Going on
    # is the choice that gives up braking, so it is judged against the first touching station itself,
    # not the one before it: with s_hit, a crawling ego (stopping in 0.4 m) whose nose is a station
    # short of a car sweeping across it was waved on into its side.
    crossing = np.abs(np.cos(heading_off)) < np.cos(np.radians(p.crossing_angle_deg))
    limit = np.where(crossing & (v0**2 / (2.0 * emergency_decel) > s[first]), np.inf, limit)
    # constant velocity is trusted only so far for an agent not in the path now: a crossing one counts up
    # to crossing_horizon_s (cross traffic may stop at its own signal), one beside the path moving into
    # it up to cut_in_horizon_s (lateral drift within a lane two lanes over is not a cut-in), and one
    # still alongside the ego (its rear not yet ahead of the ego's front) up to alongside_horizon_s (the
    # lateral wobble of a car in the next lane is not one either; moving in, it meets the ego's side)
    alongside = ~any_hit[:, 0] & (a[:, 0] - 0.5 * a[:, 6] < 0.5 * ego_size[0])
    beside = np.where(alongside, p.alongside_horizon_s, p.cut_in_horizon_s)
    horizon = np.where(crossing, p.crossing_horizon_s, np.where(any_hit[:, :1], np.inf, beside[:, None]))
    limit = np.where(times[None, :] > horizon + 1e-9, np.inf, limit)
    # the closing bound's agents: those the ego follows or that move in ahead of it, never crossing ones
    # (crossing traffic is stopped for by the bound above only), within the same horizons
    close_at = np.where(crossing | ~np.isfinite(limit), np.inf, s_hit - p.margin_m)  # N T+1
    # the middle of the stations touching the agent: where it is along the path
    last = hit.shape[-1] - 1 - hit[..., ::-1].argmax(-1)
    middle = np.where(any_hit, 0.5 * (s[first] + s[last]), -np.inf)  # N T+1
    # the substeps of an interval: their time since the interval's start
    tau = np.arange(1, n + 1) * (plan_dt / n)
    # the contact bound's station per agent and time (speed_bound); none where the ego's box touches the
    # agent where it stands now
    contact_at = np.where(s[first] > 0.0, s_hit, np.inf)  # N T+1
    e = float(emergency_decel)
    b = p.reaction_time_s + tau
    step_down = emergency_decel * plan_dt
    c_gap = p.follow_time_gap_s + plan_dt

    def closing_speed(k: int, s_now: float) -> tuple[float, int]:
        """The largest speed u on interval k from which the ego keeps follow_time_gap_s behind every
        leader ahead (at constant velocity) and can come down to its speed at closing_decel:
        s_now + u·(dt + follow_time_gap_s) + max(u - v_a, 0)²/(2·closing_decel) <= s_hit - margin."""
        end = (k + 1) * n
        who = np.flatnonzero((middle[:, end] > s_now) & np.isfinite(close_at[:, end]))
        if len(who) == 0:
            return np.inf, -1
        room, v_a = np.maximum(close_at[who, end] - s_now, 0.0), v_along[who, end]
        # below the leader's speed only the time gap binds; above it the closing term too
        disc = np.maximum(c_gap * c_gap + 2.0 * (room - c_gap * v_a) / p.closing_decel, 0.0)
        above = v_a + p.closing_decel * (-c_gap + np.sqrt(disc))
        u = np.where(v_a * c_gap >= room, room / c_gap, above)
        j = int(np.argmin(u))
        return float(u[j]), int(who[j])

    def speed_bound(lim: np.ndarray, k: int, s_now: float) -> tuple[float, int, bool]:
        """The largest constant speed u on interval k with, at each of its substeps τ and for every
        agent ahead of the ego where it meets its path:
        - the stopping bound: s_now + u·τ + u·reaction_time_s + u²/(2·ego_decel) <= its limit;
        - the contact bound: s_now + u·τ + u²/(2·emergency_decel) <= s_hit, where the agent is then.
        With the agent that binds it (-1: none) and whether the ego is past one of these bounds at the
        interval's start already (no speed meets it).

        Why the contact bound: the stopping bound credits an agent moving along the path with the way it
        would still go braking, right for a leader, but a much faster car cutting in across the ego's
        nose (passing it on the right and moving in at 2.5 m/s, 9 m/s faster) got 26 m of credit while
        its rear corner swept the ego's front: at every moment the ego must still be able to stop short
        of where such an agent is. An agent the ego's box touches where it stands now (s[first] = 0: it
        comes to the ego, e.g. grazing its side) has no such bound: braking would not keep it off."""
        cols = k * n + np.arange(1, n + 1)
        lims = np.where(middle[:, cols] > s_now, lim[:, cols], np.inf)  # N n
        room = np.maximum(lims.min(0, initial=np.inf) - s_now, 0.0)  # n
        u = np.where(room > 0, p.ego_decel * (-b + np.sqrt(b * b + 2.0 * room / p.ego_decel)), 0.0)
        contact = np.where(np.isfinite(lims), contact_at[:, cols], np.inf)  # N n
        c_room = np.maximum(contact.min(0, initial=np.inf) - s_now, 0.0)
        u_contact = np.where(c_room > 0, e * (-tau + np.sqrt(tau * tau + 2.0 * c_room / e)), 0.0)
        passed = bool(min(lims.min(initial=np.inf), contact.min(initial=np.inf)) < s_now - 1e-9)
        j = int(np.argmin(np.minimum(u, u_contact)))
        if u_contact[j] < u[j]:
            return float(u_contact[j]), int(np.argmin(contact[:, j])), passed
        return float(u[j]), (int(np.argmin(lims[:, j])) if np.isfinite(lims[:, j]).any() else -1), passed

    def retime(lim: np.ndarray, forced: int) -> tuple[np.ndarray, bool, int, int]:
        """Forward pass against the limits ``lim`` braking at the emergency limit on the first ``forced``
        intervals; returns the progress at every point, whether the speed was lowered, the first
        interval whose bound even emergency braking could not meet (-1: none) and the agent that bound
        the plan first."""
        s_now, v_prev = 0.0, v0
        out = np.empty(len(pts))
        lowered, short_of, binding = False, -1, -1
        for k, v_own in enumerate(own_speed):
            u = float(v_own)
            if p.closing_bound:
                # never closing on a leader faster than careful humans do: slowed at closing_decel at
                # most (a comfort bound; the stopping bound below stays the hard one)
                u_close, leader = closing_speed(k, s_now)
                if u_close < u - 1e-6:
                    u = min(u, max(u_close, v_prev - p.closing_decel * plan_dt, 0.0))
                    lowered = True
                    binding = leader if binding < 0 else binding
            u_max, bound_by, passed = speed_bound(lim, k, s_now)
            floor = max(v_prev - step_down, 0.0)
            if k < forced:
                u = min(u, floor)
            elif u_max < u - 1e-6:
                u = min(u, max(u_max, floor))
                # unreachable: even the emergency limit is too slow, or the ego is past a bound already
                # when the interval starts (the plan's speeds are constant per interval, so a drop to 0
                # at its start looks possible from any speed: a plan that kept 2.9 m/s for 0.5 s and
                # then "stopped" in front of a crossing car drove on into it, cycle after cycle)
                if short_of < 0 and (u_max < floor - 1e-6 or passed):
                    short_of = k
            if u < v_own - 1e-6:
                lowered = True
                if binding < 0 and bound_by >= 0:
                    binding = bound_by
            s_now += u * plan_dt
            out[k] = s_now
            v_prev = u
        return out, lowered, short_of, binding

    def latest(lim: np.ndarray) -> tuple[np.ndarray, bool, int, int]:
        """The plan's speed kept wherever the bound allows; where it cannot be met further on even
        braking at the emergency limit, braking at that limit from now on for as few intervals as make
        it reachable (or for all of them before it). Also returns whether that was needed."""
        forced = 0
        out, lowered, short_of, binding = retime(lim, forced)
        while short_of > forced:
            forced += 1
            out, lowered, short_of, binding = retime(lim, forced)
        return out, lowered, forced > 0 or short_of >= 0, binding

    out_s, fired, emergency, binding = latest(limit)
    if not fired:
        return unchanged
    if emergency and p.entry_brake_decel > 0.0:
        # An agent not in the path now but predicted to enter it (a cut-in, a crossing) is a
        # constant-velocity guess that the next cycle may take back: on recorded traffic most of the
        # emergency stops for such entries lasted one cycle, a jolt for nothing. Where only entries
        # predicted later than entry_imminent_s make the bound unreachable, the plan brakes from now at
        # entry_brake_decel (within the tracker's jerk limits) and keeps the bound of every other agent;
        # an entry that comes true is re-checked every cycle and braked for at the emergency limit
        # once it is imminent.
        enters_at = np.where(any_hit.any(1), times[any_hit.argmax(1)], np.inf)
        later = ~any_hit[:, 0] & (enters_at > p.entry_imminent_s + 1e-9)
        if later.any():
            others = np.where(later[:, None], np.inf, limit)
            kept_s, _, kept_emergency, kept_binding = latest(others)
            if not kept_emergency:
                rate = min(p.entry_brake_decel, float(emergency_decel))  # never beyond the vehicle's limit
                line = np.maximum(v0 - rate * (np.arange(len(pts)) + 0.5) * plan_dt, 0.0)
                speeds = np.minimum(np.diff(np.concatenate([[0.0], kept_s])) / plan_dt, line)
                out_s = np.cumsum(speeds) * plan_dt
                binding = binding if binding >= 0 else kept_binding
    if binding < 0:
        binding = int(np.argmin(limit.min(1)))
    met = s_hit[binding][np.isfinite(s_hit[binding])]
    gap = float(met.min()) if met.size else float("nan")
    speeds = np.diff(np.concatenate([[0.0], out_s])) / plan_dt
    decel = float(np.max(-np.diff(np.concatenate([[v0], speeds])) / plan_dt, initial=0.0))
    x = np.interp(out_s, own_cum, np.concatenate([[0.0], pts[:, 0]]))
    y = np.interp(out_s, own_cum, np.concatenate([[0.0], pts[:, 1]]))
    return EnvelopeResult(np.stack([x, y], -1), True, int(idx[binding]), gap, max(decel, 0.0))


__all__ = ["EnvelopeResult", "SafetyEnvelopeParams", "apply_envelope", "constant_velocity_boxes"]
