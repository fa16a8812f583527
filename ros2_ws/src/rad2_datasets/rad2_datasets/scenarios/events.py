"""Scenario kinds: the event controllers that turn ordinary SUMO traffic into a scenario.

Safety-oriented (an actor provokes a near-miss with the ego; the ego is SUMO's own driver model):
``hard_brake`` (the leader in the ego lane brakes hard), ``cut_in`` (a vehicle in the adjacent lane
changes into the ego lane just ahead), ``crossing_conflict`` (a vehicle runs a red light / ignores
right of way at a junction, timed to cross just ahead of the ego), ``pull_out`` (a stopped vehicle
in the adjacent lane pulls out into the ego lane ahead).
Efficiency-oriented: ``slow_leader``, ``congestion``, ``free_road``.
Start-up (training data only, not in the bundled sets): ``junction_start`` (the ego starts at rest a
short way before a junction on its route and pulls away through it, mostly into a turn).

Each controller: ``setup(ctx)`` is called every step of the prologue until it has placed its actors
(they are inserted before the first logged step); ``control(ctx, k)`` runs after every logged step
``k``; ``triggered()`` says whether the event fired; ``info()`` goes into the clip metadata.

One module, a little over 600 lines: one controller class per scenario kind, each short, all with the
interface above.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rad2_datasets.scenarios.runner import EGO_ID, ScenarioRejected, SimContext
from rad2_datasets.scenarios.traffic import sample_range

SAFETY_KINDS = ("hard_brake", "cut_in", "crossing_conflict", "pull_out")
EFFICIENCY_KINDS = ("slow_leader", "congestion", "free_road")
START_KINDS = ("junction_start",)
BUNDLED_KINDS = SAFETY_KINDS + EFFICIENCY_KINDS  # the kinds of the committed data/ sets
ALL_KINDS = BUNDLED_KINDS + START_KINDS
TURN_DIRECTIONS = ("l", "r", "L", "R")  # SUMO connection directions: left, right, partly left / right

ACTOR_ID = "actor0"
ACTOR_LENGTH = 4.5  # the actor vType (traffic.vehicle_types)
STRATEGIC_ONLY_LCMODE = 513  # SUMO lcMode: strategic changes only, keep safety gaps
NO_LC_LCMODE = 0  # no own changes; TraCI requests executed without safety checks


def _is_internal(edge_or_lane: str) -> bool:
    return edge_or_lane.startswith(":")


class Event:
    kind = ""
    safety = False
    min_lanes = 1

    def __init__(self, cfg: dict, rng: np.random.Generator):
        ev = cfg["events"]
        self.p = dict(ev.get(self.kind) or {})
        window = self.p.get("trigger_window_s", ev["trigger_window_s"])
        self.t_trigger = sample_range(rng, window, f"events.{self.kind}.trigger_window_s")
        self.t_window_end = float(window[1]) + 2.0
        self.trigger_step: int | None = None
        self.setup_failure = ""
        self.params: dict[str, float] = {"trigger_time_s": round(self.t_trigger, 3)}
        self.actors: list[str] = []

    def _sample(self, rng, name: str) -> float:
        if name not in self.p:
            raise ValueError(f"scenarios.events.{self.kind}.{name} is missing")
        v = sample_range(rng, self.p[name], f"events.{self.kind}.{name}")
        self.params[name] = round(v, 4)
        return v

    def setup(self, ctx: SimContext) -> bool:
        return True

    def confirm(self, ctx: SimContext) -> None:
        for a in self.actors:
            if not ctx.present(a):
                raise ScenarioRejected("actor_not_inserted", a)

    def control(self, ctx: SimContext, k: int) -> None:
        pass

    def triggered(self) -> bool:
        return self.trigger_step is not None

    def info(self) -> dict[str, Any]:
        return {"trigger_step": self.trigger_step, "actors": list(self.actors), "params": dict(self.params)}

    def _window_over(self, ctx: SimContext, k: int) -> bool:
        return k * ctx.dt > self.t_window_end

    def _ego_on_edge(self, ctx: SimContext, min_speed: float = 3.0):
        lane, idx, pos, edge = ctx.lane_of(EGO_ID)
        if _is_internal(edge) or ctx.speed(EGO_ID) < min_speed:
            return None
        return lane, idx, pos, edge

    def _spawn_ahead(self, ctx: SimContext, lane_index: int, front_pos: float, speed: float | str) -> None:
        edge = ctx.lane_of(EGO_ID)[3]
        route = ctx.remaining_route(EGO_ID)
        route = route[route.index(edge) :] if edge in route else [edge]
        ctx.spawn(ACTOR_ID, route, lane_index, front_pos, speed)
        self.actors.append(ACTOR_ID)

    def _spawn_leader(self, ctx: SimContext, st, headway: float, clear_ahead: float) -> bool:
        """Place the actor in the ego lane ``headway`` seconds ahead (at its max safe speed, strategic lane
        changes only), clearing the lane up to ``clear_ahead`` metres past it; False if the lane is short."""
        lane, idx, pos, _ = st
        front = pos + headway * ctx.speed(EGO_ID) + 2.0 + ACTOR_LENGTH
        if front > ctx.lane_length(lane) - 5.0:
            self.setup_failure = "lane too short for the leader"
            return False
        ctx.clear_lane(lane, pos + 0.1, front + clear_ahead)
        self._spawn_ahead(ctx, idx, front, "max")  # max safe speed there: the ego's or less
        ctx.sim.vehicle.setLaneChangeMode(ACTOR_ID, STRATEGIC_ONLY_LCMODE)
        return True

    def _adjacent_lanes(self, ctx: SimContext, st) -> list[int]:
        """Indices of the lanes beside the ego's (right first); records a setup failure if there are none."""
        _, idx, _, edge = st
        options = [j for j in (idx - 1, idx + 1) if 0 <= j < ctx.num_lanes(edge) and ctx.car_lane(edge, j)]
        if not options:
            self.setup_failure = "ego edge has no adjacent lane"
        return options

    def _spawn_beside(self, ctx: SimContext, st, j: int, front: float, side_clear: tuple[float, float],
                      speed: float) -> None:
        """Place the actor in the adjacent lane ``j`` with its front at ``front`` and lane changes off (only
        TraCI requests), after clearing that lane over ``pos + side_clear`` and the ego lane ahead."""
        lane, idx, pos, edge = st
        ctx.clear_lane(f"{edge}_{j}", pos + side_clear[0], front + side_clear[1])
        ctx.clear_lane(lane, pos + 0.1, front + 30.0)
        self._spawn_ahead(ctx, j, front, speed)
        ctx.sim.vehicle.setLaneChangeMode(ACTOR_ID, NO_LC_LCMODE)
        self.params["side_lane_offset"] = int(j - idx)

    def _fire(
        self, ctx: SimContext, k: int, phase: str, release_after_s: float, gap: float, v_ego: float
    ) -> None:
        """Record the trigger at step ``k``: enter ``phase``, release the actor ``release_after_s`` later,
        and keep the gap and ego speed at the trigger in the clip metadata."""
        self.phase = phase
        self.trigger_step = k
        self.release_step = k + int(round(release_after_s / ctx.dt))
        self.params["gap_at_trigger_m"] = round(gap, 3)
        self.params["ego_speed_at_trigger_mps"] = round(v_ego, 3)

    def _gap_to_actor(self, ctx: SimContext, on_internal: bool = True) -> float | None:
        """Bumper gap from the ego to the actor ahead on the same edge (None on different edges, or on a
        junction's internal edge unless ``on_internal``)."""
        _, _, ego_pos, ego_edge = ctx.lane_of(EGO_ID)
        _, _, a_pos, a_edge = ctx.lane_of(ACTOR_ID)
        if ego_edge != a_edge or (not on_internal and _is_internal(ego_edge)):
            return None
        return a_pos - ACTOR_LENGTH - ego_pos


class FreeRoad(Event):
    kind = "free_road"

    def setup(self, ctx):
        self.trigger_step = 0
        return True


class Congestion(Event):
    """Dense background demand plus a bottleneck (a speed cap on an edge of the ego's route ahead)."""

    kind = "congestion"

    def setup(self, ctx):
        rng = ctx.rng
        v_cap = self._sample(rng, "slowdown_speed_mps")
        ahead = self._sample(rng, "slowdown_ahead_m")
        lane, _, pos, edge = ctx.lane_of(EGO_ID)
        dist = ctx.lane_length(lane) - pos
        for e in ctx.remaining_route(EGO_ID)[1:]:
            if dist >= ahead:
                ctx.sim.edge.setMaxSpeed(e, v_cap)
                self.params["bottleneck_edge_offset_m"] = round(dist, 2)
                break
            dist += ctx.net.getEdge(e).getLength()
        self.trigger_step = 0
        return True


class SlowLeader(Event):
    kind = "slow_leader"

    def setup(self, ctx):
        st = self._ego_on_edge(ctx)
        if st is None:
            return False
        frac = self._sample(ctx.rng, "speed_fraction")
        headway = self._sample(ctx.rng, "leader_headway_s")
        v_slow = frac * float(ctx.sim.lane.getMaxSpeed(st[0]))
        if not self._spawn_leader(ctx, st, headway, 10.0):  # it slows down to v_slow once confirmed
            return False
        self.v_slow = v_slow
        self.trigger_step = 0
        return True

    def confirm(self, ctx):
        super().confirm(ctx)
        ctx.sim.vehicle.setMaxSpeed(ACTOR_ID, self.v_slow)


class HardBrake(Event):
    """The ego's leader (placed just ahead in its lane) brakes hard to a low speed, holds, resumes."""

    kind = "hard_brake"
    safety = True

    def __init__(self, cfg, rng):
        super().__init__(cfg, rng)
        self.headway = self._sample(rng, "leader_headway_s")
        self.decel = self._sample(rng, "decel_mps2")
        self.target_frac = self._sample(rng, "target_speed_fraction")
        self.hold = self._sample(rng, "hold_s")
        self.min_speed = float(self.p["min_trigger_speed_mps"])
        self.max_gap = float(self.p["max_trigger_gap_m"])
        self.phase = "follow"
        self.v_target = 0.0
        self.release_step = 0

    def setup(self, ctx):
        st = self._ego_on_edge(ctx, self.min_speed)
        if st is None:
            return False
        return self._spawn_leader(ctx, st, self.headway, 25.0)

    def control(self, ctx, k):
        sim = ctx.sim
        if not ctx.present(ACTOR_ID):
            return
        v_a = ctx.speed(ACTOR_ID)
        if self.phase == "follow":
            if k * ctx.dt < self.t_trigger:
                return
            lead = ctx.leader(EGO_ID, self.max_gap)
            if lead and lead[0] == ACTOR_ID and v_a >= self.min_speed:
                self.phase = "brake"
                self.trigger_step = k
                self.v_target = self.target_frac * v_a
                self.params["speed_at_trigger_mps"] = round(v_a, 3)
                self.params["gap_at_trigger_m"] = round(lead[1], 3)
                sim.vehicle.setDecel(ACTOR_ID, self.decel + 0.5)
        if self.phase == "brake":
            v_cmd = max(self.v_target, v_a - self.decel * ctx.dt)
            sim.vehicle.setSpeed(ACTOR_ID, v_cmd)
            if v_cmd <= self.v_target + 1e-6:
                self.phase = "hold"
                self.release_step = k + int(round(self.hold / ctx.dt))
        elif self.phase == "hold" and k >= self.release_step:
            sim.vehicle.setSpeed(ACTOR_ID, -1)
            self.phase = "done"


class CutIn(Event):
    """A vehicle driving alongside in the adjacent lane changes into the ego lane just ahead, slower."""

    kind = "cut_in"
    safety = True
    min_lanes = 2

    def __init__(self, cfg, rng):
        super().__init__(cfg, rng)
        self.gap = self._sample(rng, "gap_m")
        self.dv = self._sample(rng, "speed_delta_mps")
        self.lc_time = float(self.p["lane_change_duration_s"])
        self.phase = "align"
        self.ego_index = 0
        self.release_step = 0

    def setup(self, ctx):
        st = self._ego_on_edge(ctx, 5.0)
        if st is None:
            return False
        lane, idx, pos, edge = st
        options = self._adjacent_lanes(ctx, st)
        if not options:
            return False
        j = options[int(ctx.rng.integers(len(options)))]
        v_e = ctx.speed(EGO_ID)
        front = pos + self.gap + ACTOR_LENGTH
        need = front + v_e * (self.t_trigger + self.lc_time) + 10.0
        if need > ctx.lane_length(lane):
            self.setup_failure = "edge too short for the cut-in"
            return False
        self._spawn_beside(ctx, st, j, front, (-15.0, 20.0), v_e)
        self.ego_index = idx
        return True

    def control(self, ctx, k):
        sim = ctx.sim
        if not ctx.present(ACTOR_ID):
            return
        v_e = ctx.speed(EGO_ID)
        if self.phase == "align":
            gap = self._gap_to_actor(ctx, on_internal=False)
            if gap is None:
                return
            sim.vehicle.setSpeed(ACTOR_ID, max(0.0, v_e + 0.8 * (self.gap - gap)))
            if k * ctx.dt >= self.t_trigger and abs(gap - self.gap) < 1.5 and v_e >= 5.0:
                ego_idx = ctx.lane_of(EGO_ID)[1]
                sim.vehicle.changeLane(ACTOR_ID, ego_idx, 5.0)
                sim.vehicle.setSpeed(ACTOR_ID, max(1.0, v_e + self.dv))
                self._fire(ctx, k, "change", self.lc_time + 1.0, gap, v_e)
        elif self.phase == "change" and k >= self.release_step:
            sim.vehicle.setSpeed(ACTOR_ID, -1)
            sim.vehicle.setLaneChangeMode(ACTOR_ID, STRATEGIC_ONLY_LCMODE)
            self.phase = "done"


class PullOut(Event):
    """A vehicle stopped in the adjacent lane ahead pulls out slowly into the ego lane."""

    kind = "pull_out"
    safety = True
    min_lanes = 2

    def __init__(self, cfg, rng):
        super().__init__(cfg, rng)
        self.trigger_gap = self._sample(rng, "trigger_gap_m")
        self.v_max = self._sample(rng, "actor_max_speed_mps")
        self.ahead = self._sample(rng, "start_ahead_m")
        self.phase = "parked"
        self.release_step = 0

    def setup(self, ctx):
        st = self._ego_on_edge(ctx, 5.0)
        if st is None:
            return False
        lane, _, pos, _ = st
        options = self._adjacent_lanes(ctx, st)
        if not options:
            return False
        j = options[0]  # prefer the lane on the right (kerb side)
        front = pos + self.ahead + ACTOR_LENGTH
        if front > ctx.lane_length(lane) - 10.0:
            self.setup_failure = "edge too short for the parked vehicle"
            return False
        self._spawn_beside(ctx, st, j, front, (-30.0, 10.0), 0.0)
        ctx.sim.vehicle.setSpeed(ACTOR_ID, 0.0)
        return True

    def control(self, ctx, k):
        sim = ctx.sim
        if not ctx.present(ACTOR_ID):
            return
        if self.phase == "parked":
            gap = self._gap_to_actor(ctx)
            if gap is None or k * ctx.dt < 1.0:
                return
            if gap <= self.trigger_gap:
                sim.vehicle.setMaxSpeed(ACTOR_ID, self.v_max)
                sim.vehicle.setSpeed(ACTOR_ID, -1)
                sim.vehicle.changeLane(ACTOR_ID, ctx.lane_of(EGO_ID)[1], 8.0)
                self._fire(ctx, k, "pulling", 6.0, gap, ctx.speed(EGO_ID))
        elif self.phase == "pulling" and k >= self.release_step:
            sim.vehicle.setLaneChangeMode(ACTOR_ID, STRATEGIC_ONLY_LCMODE)
            self.phase = "done"


class CrossingConflict(Event):
    """At a junction on the ego's route, a vehicle on a crossing approach ignores its red light /
    the right of way and is timed to pass the conflict point ``lead_time_s`` before the ego."""

    kind = "crossing_conflict"
    safety = True

    def __init__(self, cfg, rng):
        super().__init__(cfg, rng)
        self.lead = self._sample(rng, "lead_time_s")
        self.v_a = self._sample(rng, "actor_speed_mps")
        self.approach = self._sample(rng, "approach_distance_m")
        self.v_cap = float(self.p["actor_max_speed_mps"])
        self.commit_m = float(self.p["commit_distance_m"])
        self.conflict: tuple[float, float] | None = None
        self.plan = None
        self.phase = "approach"

    def _find_conflicts(self, ctx, route: list[str]) -> list[tuple]:
        """Junctions on the route with a crossing movement from another approach, grouped in route
        order: [(e_in, node, [(f_in, f_out, conn, point, shape), ...]), ...]."""
        from shapely.geometry import LineString

        net = ctx.net
        groups = []
        for e_in, e_out in zip(route[:-1], route[1:]):
            ein, eout = net.getEdge(e_in), net.getEdge(e_out)
            node = ein.getToNode()
            ego_conns = ein.getOutgoing().get(eout, [])
            ego_path = _via_shape(net, ego_conns[0]) if ego_conns else None
            if ego_path is None:
                continue
            ego_line = LineString(ego_path)
            cands = []
            for f_in in sorted(node.getIncoming(), key=lambda e: e.getID()):
                if f_in is ein or f_in.getFunction() != "" or not f_in.allows("passenger"):
                    continue
                if f_in.getFromNode() is eout.getToNode():
                    continue  # oncoming from the ego's exit: not a crossing approach
                for f_out, conns in sorted(f_in.getOutgoing().items(), key=lambda kv: kv[0].getID()):
                    for c in conns:
                        if c.getDirection() not in ("s", "l", "L"):
                            continue
                        shape = _via_shape(net, c)
                        if shape is None:
                            continue
                        inter = ego_line.intersection(LineString(shape))
                        if inter.is_empty:
                            continue
                        pt = inter if inter.geom_type == "Point" else inter.representative_point()
                        cands.append((f_in, f_out, c, (pt.x, pt.y), shape))
            if cands:
                groups.append((e_in, node, cands))
        return groups

    def setup(self, ctx):
        st = self._ego_on_edge(ctx, 2.0)
        if st is None:
            return False
        if self.plan is None:
            groups = self._find_conflicts(ctx, ctx.remaining_route(EGO_ID))
            for e_in, node, cands in groups:
                straight = [c for c in cands if c[2].getDirection() == "s"] or cands
                pick = straight[int(ctx.rng.integers(len(straight)))]
                d = ctx.driving_distance(EGO_ID, *pick[3])
                if d is not None and d > self.approach + 5.0:
                    self.plan = (e_in, node, *pick)
                    break
            if self.plan is None:
                raise ScenarioRejected(
                    "setup_failed", "no crossing movement far enough ahead on the ego route"
                )
        e_in, node, f_in, f_out, conn, point, shape = self.plan
        d_e = ctx.driving_distance(EGO_ID, *point)
        if d_e is None:
            raise ScenarioRejected("setup_failed", "conflict point not on the ego route")
        if d_e > self.approach:
            return False
        v_e = max(ctx.speed(EGO_ID), 1.0)
        eta_a = d_e / v_e - self.lead
        if eta_a < 1.0:
            raise ScenarioRejected("setup_failed", "ego too close to the junction")
        from shapely.geometry import LineString, Point

        d_via = LineString(shape).project(Point(point))
        d_a = self.v_a * eta_a
        lane_len = f_in.getLength()
        pos = lane_len - max(d_a - d_via, 0.0)
        pos = float(np.clip(pos, 1.0, lane_len - 0.5))
        lane_idx = conn.getFromLane().getIndex()
        ctx.clear_lane(f"{f_in.getID()}_{lane_idx}", pos - 20.0, lane_len)
        ctx.spawn(ACTOR_ID, [f_in.getID(), f_out.getID()], lane_idx, pos, "max")
        self.actors.append(ACTOR_ID)
        ctx.sim.vehicle.setLaneChangeMode(ACTOR_ID, NO_LC_LCMODE)
        ctx.sim.vehicle.setSpeedMode(
            ACTOR_ID, 7
        )  # keep safe speed to leaders; ignore lights and right of way
        self.conflict = point
        self.params["junction_type"] = node.getType()
        self.params["conflict_direction"] = conn.getDirection()
        if node.getType().startswith("traffic_light"):
            # green for the ego's approach; the actor's link is green only while it is being inserted
            self._set_signal(ctx, e_in, f_in.getID())
        return True

    def confirm(self, ctx):
        super().confirm(ctx)
        if self.plan is not None and self.plan[1].getType().startswith("traffic_light"):
            self._set_signal(ctx, self.plan[0], None)

    def _set_signal(self, ctx, e_in: str, also_green: str | None) -> None:
        if freeze_signal(ctx, e_in, also_green):
            self.params["forced_signal"] = 1

    def control(self, ctx, k):
        if not ctx.present(ACTOR_ID) or self.phase == "done":
            return
        sim = ctx.sim
        d_a = self._actor_distance(ctx)
        d_e = ctx.driving_distance(EGO_ID, *self.conflict)
        if self.phase == "approach":
            if d_a is None or d_e is None or d_a < self.commit_m:
                self.phase = "commit"
                self.trigger_step = k
                self.params["ego_distance_at_commit_m"] = round(d_e, 3) if d_e is not None else -1.0
                sim.vehicle.setSpeed(ACTOR_ID, max(ctx.speed(ACTOR_ID), 3.0))
                return
            eta_e = d_e / max(ctx.speed(EGO_ID), 1.0)
            v_cmd = d_a / max(eta_e - self.lead, 0.3)
            sim.vehicle.setSpeed(ACTOR_ID, float(np.clip(v_cmd, 2.0, self.v_cap)))
        elif self.phase == "commit" and ctx.sim.vehicle.getRoadID(ACTOR_ID) == self.plan[3].getID():
            sim.vehicle.setSpeed(ACTOR_ID, -1)  # left the junction
            self.phase = "done"

    def _actor_distance(self, ctx) -> float | None:
        """Distance of the actor's front bumper to the conflict point while it is still on its approach."""
        if ctx.sim.vehicle.getRoadID(ACTOR_ID) != self.plan[2].getID():
            return None
        x, y = ctx.sim.vehicle.getPosition(ACTOR_ID)
        return float(np.hypot(x - self.conflict[0], y - self.conflict[1]))


def freeze_signal(ctx: SimContext, e_in: str, also_green: str | None = None) -> bool:
    """Freeze the signal of the junction ``e_in`` leads into: green for the approach from ``e_in`` (and
    ``also_green``), red elsewhere. False when no traffic light controls ``e_in``."""
    green = {e_in, also_green}
    for tls in ctx.sim.trafficlight.getIDList():
        links = ctx.sim.trafficlight.getControlledLinks(tls)
        edges = [lk[0][0].rsplit("_", 1)[0] if lk else "" for lk in links]
        if e_in not in edges:
            continue
        ctx.sim.trafficlight.setRedYellowGreenState(tls, "".join("G" if e in green else "r" for e in edges))
        return True
    return False


class JunctionStart(Event):
    """The ego starts at rest a few metres before a junction on its route and pulls away through it.

    Why this kind exists: closed loop, the IL planner that had slowed to a stop before a sharp junction
    turn proposed only plans that went backwards, because the SUMO logs hold almost no starts from rest
    (docs/results.md, "Imitation, data and inputs"). Here the stop is made in the unlogged prologue (a SUMO
    stop ``stop_gap_m`` before the end of the approach lane) and released as logging starts, so the
    logged driver, at rest at step 0, drives off at once: with probability ``turn_fraction`` into a turn
    (left or right), otherwise straight on. A traffic light on that approach is frozen at green, so the
    start is never a wait at a red light the clip cannot show (signals are exported only with --signals).
    Nothing else about the traffic is changed."""

    kind = "junction_start"

    def __init__(self, cfg, rng):
        super().__init__(cfg, rng)
        self.stop_gap = self._sample(rng, "stop_gap_m")
        turn_fraction = float(self.p.get("turn_fraction", -1.0))
        if not 0.0 <= turn_fraction <= 1.0:
            raise ValueError(
                f"scenarios.events.junction_start.turn_fraction must be in [0, 1], got {turn_fraction}"
            )
        self.want_turn = bool(rng.random() < turn_fraction)
        self.params["turn"] = int(self.want_turn)
        self.braking = float(cfg["ego"]["decel_mps2"])
        self.phase = "seek"

    def _movement(self, ctx, edge: str):
        """The connection from ``edge`` to the next route edge that makes the wanted movement, or None."""
        route = ctx.remaining_route(EGO_ID)
        if len(route) < 2 or route[0] != edge:
            return None
        e_in, e_out = ctx.net.getEdge(edge), ctx.net.getEdge(route[1])
        wanted = TURN_DIRECTIONS if self.want_turn else ("s",)
        conns = [c for c in e_in.getOutgoing().get(e_out, []) if c.getDirection() in wanted]
        if not conns:
            return None
        _, idx, _, _ = ctx.lane_of(EGO_ID)
        same_lane = [c for c in conns if c.getFromLane().getIndex() == idx]
        return (same_lane or conns)[0]

    def setup(self, ctx):
        sim = ctx.sim
        if self.phase == "stopping":
            if sim.vehicle.isStopped(EGO_ID) and ctx.speed(EGO_ID) < 0.05:
                self.trigger_step = 0
                return True
            return False
        lane, _, pos, edge = ctx.lane_of(EGO_ID)
        if _is_internal(edge):
            return False
        conn = self._movement(ctx, edge)
        if conn is None:
            return False
        lane_idx = conn.getFromLane().getIndex()
        stop_pos = ctx.lane_length(f"{edge}_{lane_idx}") - self.stop_gap
        v = ctx.speed(EGO_ID)
        # room to stop at half the ego's usual deceleration, plus two steps of travel and a margin
        needed = v * v / self.braking + 2.0 * v * ctx.dt + 2.0
        if stop_pos < 5.0 or stop_pos - pos < needed:
            return False
        try:
            sim.vehicle.setStop(EGO_ID, edge, pos=stop_pos, laneIndex=lane_idx, duration=3600.0)
        except sim.TraCIException:  # SUMO cannot brake for it after all: try the next junction
            return False
        self.phase = "stopping"
        self.approach = edge
        node = conn.getFrom().getToNode()
        self.params["direction"] = conn.getDirection()
        self.params["junction_type"] = node.getType()
        return False

    def confirm(self, ctx):
        super().confirm(ctx)
        if freeze_signal(ctx, self.approach):
            self.params["forced_signal"] = 1
        ctx.sim.vehicle.resume(EGO_ID)


def _via_shape(net, conn) -> np.ndarray | None:
    """Polyline through a junction for a connection (its chain of internal lanes)."""
    via = conn.getViaLaneID()
    if not via:
        return None
    pts = []
    lane = net.getLane(via)
    for _ in range(4):
        pts.extend(p[:2] for p in lane.getShape())
        outs = lane.getOutgoing()
        if not outs:
            break
        nxt = outs[0].getViaLaneID() or outs[0].getToLane().getID()
        if not nxt.startswith(":"):
            break
        lane = net.getLane(nxt)
    arr = np.asarray(pts, dtype=np.float64)
    return arr if len(arr) >= 2 else None


EVENTS = {
    cls.kind: cls
    for cls in (HardBrake, CutIn, CrossingConflict, PullOut, SlowLeader, Congestion, FreeRoad, JunctionStart)
}


def make_event(kind: str, cfg: dict, rng: np.random.Generator) -> Event:
    if kind not in EVENTS:
        raise ValueError(f"scenario kind {kind!r} is not one of {sorted(EVENTS)}")
    return EVENTS[kind](cfg, rng)
