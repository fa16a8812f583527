"""The planner's post-planning stages: one pipeline of stage objects between selection and execution.

After the selection the cycle's plans (:class:`CyclePlans`: the candidates, their scores and logits,
the selected index per row, the plan to execute where a stage changed it and what each stage reported)
pass through a :class:`StagePipeline`, in order:

1. ``safety_layer`` (:class:`rad2_planner.safety_layer.CriticStage`): the collision critic accepts,
   re-selects or redraws the candidates (``safety_layer.mode``; deterministic selection only).
2. ``stall_recovery`` (:class:`StallRecoveryStage`, :mod:`rad2_planner.stall_recovery`).
3. ``plan_braking`` (:class:`PlanBrakingStage`, :func:`rad2_planner.comfort_limits.limit_plan_braking`).
4. ``traffic_rules`` (:class:`TrafficRuleStage`, :mod:`rad2_planner.traffic_rules`).
5. ``safety_envelope`` (:class:`SafetyEnvelopeStage`, :mod:`rad2_planner.safety_envelope`).
6. ``comfort_limits`` (:class:`ComfortLimitStage`, :mod:`rad2_planner.comfort_limits`).
7. ``drivable_area`` (:class:`DrivableAreaStage`, :mod:`rad2_planner.drivable_area`): the plan as it
   will be executed, checked against the BEV's drivable area; reported, or also stopped before the exit.

Every stage has the interface of :class:`Stage`: ``applies(context)`` (whether it runs this cycle) and
``apply(plans, context) -> plans`` (a new :class:`CyclePlans`, the input untouched); the pipeline
times each stage with a ``timing_key`` into the cycle's ``timings_ms``. Stages 2–7 re-time one row's
plan along its own path (:class:`RetimingStage`: ``retime(plan, context, row) -> (plan or None, note)``);
the maths is the named module's, the stage object reads the row's inputs and writes what it says into
the row's ``info`` under its ``note_key``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from rad2_core.lane_map import SIGNAL_STATE_NAMES
from rad2_core.route_path import observation_route

from rad2_planner.candidates import first_overlaps, safe_candidates
from rad2_planner.comfort_limits import (
    ComfortLimitParams,
    limit_acceleration,
    limit_curve_speed,
    limit_plan_braking,
)
from rad2_planner.drivable_area import DrivableAreaParams, first_exit
from rad2_planner.mission_pace import MissionPaceParams
from rad2_planner.safety_envelope import SafetyEnvelopeParams, apply_envelope
from rad2_planner.stall_recovery import (
    StallRecoveryParams,
    asks_for_reversing,
    clear_road_start,
    even_start,
    on_drivable_area,
    recovery_plan,
    retime_towards,
)
from rad2_planner.traffic_rules import TrafficRuleParams, allowed_distance, limit_progress

# a follower (left out of the mission pace's agent check): behind, within a lane either side, heading the
# ego's way within 45° (agent tokens carry cos and sin of the relative heading)
FOLLOWER_LATERAL_M = 5.25
COS_45 = float(np.cos(np.pi / 4))

# The parameter blocks (params/planner.yaml) of the rule stages 2-8, each with its ``enabled`` switch
# (plan braking is comfort_limits'). All off: the networks' selected plan is executed as it is ("learned
# only" in rad2 eval experiments, arm option @R=off).
RULE_STAGE_BLOCKS = ("stall_recovery", "mission_pace", "traffic_rules", "safety_envelope", "comfort_limits",
                     "drivable_area")


@dataclass(frozen=True)
class CyclePlans:
    """The plans of a planning cycle's ``B`` rows as the stages pass them on."""

    candidates: np.ndarray  # [B, M, T, 2] ego-frame metres
    scores: np.ndarray  # [B, M] the discriminator's (NaN when not run)
    logits: np.ndarray  # [B, M] what the selection ranked
    selected: tuple[int, ...]  # per row: the selected candidate
    executed: tuple[np.ndarray | None, ...]  # per row: [T, 2] float32 where a stage changed it, else None
    info: tuple[dict[str, Any], ...]  # per row: what the stages report (PlanResult.info)

    @classmethod
    def of(cls, candidates: np.ndarray, selected: Sequence[int], scores: np.ndarray | None = None,
           logits: np.ndarray | None = None) -> CyclePlans:
        """Plans before any stage: nothing executed yet, nothing reported (NaN scores and logits when
        not given)."""
        b, m = candidates.shape[:2]
        nan = np.full((b, m), np.nan, dtype=np.float32)
        return cls(candidates, nan if scores is None else scores, nan if logits is None else logits,
                   tuple(int(s) for s in selected), (None,) * b, tuple({} for _ in range(b)))

    @property
    def batch_size(self) -> int:
        return len(self.selected)

    def plan(self, i: int) -> np.ndarray:
        """Row ``i``'s plan as it stands: what a stage made of it, else the selected candidate."""
        return self.candidates[i, self.selected[i]] if self.executed[i] is None else self.executed[i]

    def notes(self, key: str) -> list[str]:
        """Per row, what the stage with ``note_key`` ``key`` reported ("" where nothing)."""
        return [str(info.get(key, "")) for info in self.info]


@dataclass
class CycleContext:
    """What the stages read of the planning cycle besides the plans."""

    inputs: dict[str, np.ndarray]  # the model's inputs, batched (its BEV channels, in its order)
    timings: dict[str, float] = field(default_factory=dict)  # the cycle's timings_ms, stages add theirs
    signal_stop: Any = None  # the observation's next signal stop(s) ([B, 2] or [2]; None: no signal input)
    selection: str = "deterministic"  # the cycle's selection mode
    # the generator's state, for a stage that draws new candidates (the critic's rejection sampling)
    scene: Any = None
    num_steps: int = 0  # K
    scored: bool = False  # whether the discriminator runs this cycle
    seed: int | None = None  # the cycle's seed (None: per-row ``row_seeds``)
    row_seeds: list[int] | None = None
    t_start: float = 0.0  # time.perf_counter() at the start of the cycle (round budget)
    target_speeds: np.ndarray | None = None  # [B] m/s the mission asks each row to keep (NaN: none)


class Stage(Protocol):
    """A post-planning stage."""

    name: str
    timing_key: str | None  # the key of its time in timings_ms (None: it records its own)

    def applies(self, context: CycleContext) -> bool: ...

    def apply(self, plans: CyclePlans, context: CycleContext) -> CyclePlans: ...


class RetimingStage:
    """A stage that re-times each row's plan along its path; subclasses give :meth:`retime`."""

    name = ""
    note_key: str | None = None  # the info key of its note (None: it reports nothing)

    @property
    def timing_key(self) -> str:
        return self.name

    @property
    def enabled(self) -> bool:
        raise NotImplementedError

    def applies(self, context: CycleContext) -> bool:
        # a disabled stage still reports its (empty) time, so every cycle's timings_ms has the same keys
        return True

    def rows(self, plans: CyclePlans, context: CycleContext) -> range:
        """The rows this cycle re-times (all of them while enabled)."""
        return range(plans.batch_size) if self.enabled else range(0)

    def retime(self, plan: np.ndarray, context: CycleContext, i: int) -> tuple[np.ndarray | None, str]:
        """Row ``i``'s ``plan`` re-timed (None: unchanged) and a note saying why ("" for none)."""
        raise NotImplementedError

    def apply(self, plans: CyclePlans, context: CycleContext) -> CyclePlans:
        executed, info = list(plans.executed), list(plans.info)
        for i in self.rows(plans, context):
            new, note = self.retime(plans.plan(i), context, i)
            if new is not None:
                executed[i] = new.astype(np.float32)
            if note and self.note_key:
                info[i] = {**info[i], self.note_key: note}
        return replace(plans, executed=tuple(executed), info=tuple(info))


class StallRecoveryStage(RetimingStage):
    """Below ``start_speed`` a selected plan that holds its speed and accelerates later is evened out
    from now; below ``clear_road_below`` a plan that crawls is made to accelerate where the road ahead
    is clear; a plan that asks for reversing (the vehicle has none) is replaced by the route followed
    forwards where that stays on the BEV's drivable area (:mod:`rad2_planner.stall_recovery`).

    ``channel_names``: the model's BEV channels in its order (``ModelConfig.input_channel_names``);
    without a drivable area among them a reversing or crawling plan is kept as it is."""

    name = "stall_recovery"
    note_key = "stall_recovery"

    def __init__(self, params: StallRecoveryParams, plan_dt: float, vehicle, bev_cfg,
                 channel_names: list[str], ego_size: tuple[float, float], max_curvature: float,
                 drivable: DrivableAreaParams, collision_substeps: int = 1):
        self.params = params
        self.collision_substeps = int(collision_substeps)
        self.drivable = drivable
        self.plan_dt = float(plan_dt)
        self.vehicle = vehicle
        self.bev_cfg = bev_cfg
        self.channel_names = list(channel_names)
        self.ego_size = ego_size
        self.max_curvature = float(max_curvature)

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def retime(self, plan, context, i):
        inputs = context.inputs
        speed, _, _, steer = (float(v) for v in inputs["ego_state"][i])
        channel = drivable_channel(inputs["bev"], self.channel_names, self.bev_cfg)
        route = observation_route(inputs["route"][i], inputs["route_mask"][i])
        if not asks_for_reversing(plan, self.params):
            started = even_start(plan, speed, self.plan_dt, self.params)
            note = "" if started is None else "late acceleration: the plan's acceleration evened out from now"
            current = plan if started is None else started
            if channel is not None:
                cleared = self.clear_road(current, speed, route, inputs["bev"][i, channel], context, i)
                if cleared is not None:
                    return cleared, "slow plan on a clear road: accelerating"
            return started, note
        if channel is None:
            return None, ""
        bev = inputs["bev"][i, channel]
        forward, straight, lookahead = recovery_plan(route, speed, steer, self.plan_dt, plan.shape[0],
                                                     self.vehicle, self.params, bev, self.bev_cfg)
        if forward is None:
            return None, "plan asks for reversing; following the route would leave the drivable area"
        return forward, (f"plan asks for reversing (x {float(plan[:, 0].min()):.1f} m): following the route "
                         f"(straight {straight:g} m, look-ahead {lookahead:g} m)")

    def clear_road(self, plan, speed, route, drivable, context, i) -> np.ndarray | None:
        """:func:`clear_road_start`'s plan where :func:`keeps_clear` (every agent); else None."""
        faster = clear_road_start(plan, speed, self.plan_dt, route, self.params)
        if faster is None or not keeps_clear(faster, drivable, context.inputs, i, self.plan_dt, self.ego_size,
                                             self.max_curvature, self.bev_cfg, self.drivable,
                                             substeps=self.collision_substeps):
            return None
        return faster[: plan.shape[0]]


def keeps_clear(plan: np.ndarray, drivable: np.ndarray, inputs: dict[str, np.ndarray], i: int,
                plan_dt: float, ego_size: tuple[float, float], max_curvature: float, bev_cfg,
                drivable_params: DrivableAreaParams, pacing: bool = False, substeps: int = 1) -> bool:
    """Whether a re-timed ``plan`` (ego frame, continued to its check horizon) keeps every point on the
    BEV's ``drivable`` area, the ego's box on it over the drivable-area check's horizon (a corner cut by
    the box), and overlaps no observed agent of row ``i`` extrapolated at constant velocity
    (``pacing``, the mission pace's check: a follower, behind the ego's centre within a lane either side
    and heading its way within 45°, is left out, since it is no reason to be slower; a car crossing or
    coming the other way counts wherever it is; and the road is judged only where the ego's box stays a
    box length inside the BEV's grid, which a plan at road speeds leaves: beyond it the plan follows the
    route)."""
    on_grid = plan
    if pacing:
        x_end = bev_cfg.origin_x + bev_cfg.width * bev_cfg.resolution - 1.5 * ego_size[0]
        beyond = np.flatnonzero(plan[:, 0] > x_end)
        on_grid = plan[: beyond[0]] if len(beyond) else plan
    if len(on_grid) and not on_drivable_area(on_grid, drivable, bev_cfg):
        return False
    if len(on_grid) and first_exit(on_grid, plan_dt, ego_size, drivable, bev_cfg, drivable_params,
                                   max_curvature) is not None:
        return False
    agents, mask = inputs["agents"][i], inputs["agents_mask"][i].astype(bool)
    if pacing:
        behind = (agents[:, 0] < 0.0) & (np.abs(agents[:, 1]) < FOLLOWER_LATERAL_M)
        follower = behind & (agents[:, 2] > COS_45)
        mask = mask & ~follower
    first = first_overlaps(plan[None], agents, mask, plan_dt, ego_size, max_curvature, substeps)
    return bool(first[0] >= len(plan))


class MissionPaceStage(RetimingStage):
    """Each row with a mission speed (``CycleContext.target_speeds``, NaN: none) has its plan re-timed
    towards it: faster where the road ahead is clear, slower along its own path
    (:mod:`rad2_planner.mission_pace`)."""

    name = "mission_pace"
    note_key = "mission_pace"

    def __init__(self, params: MissionPaceParams, plan_dt: float, bev_cfg, channel_names: list[str],
                 ego_size: tuple[float, float], max_curvature: float, drivable: DrivableAreaParams,
                 collision_substeps: int = 1):
        self.params = params
        self.collision_substeps = int(collision_substeps)
        self.plan_dt = float(plan_dt)
        self.bev_cfg = bev_cfg
        self.channel_names = list(channel_names)
        self.ego_size = ego_size
        self.max_curvature = float(max_curvature)
        self.drivable = drivable

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def rows(self, plans, context):
        if not self.enabled or context.target_speeds is None:
            return range(0)
        return [i for i in range(plans.batch_size) if np.isfinite(context.target_speeds[i])]

    def retime(self, plan, context, i):
        p = self.params
        inputs = context.inputs
        target = float(context.target_speeds[i])
        speed = float(inputs["ego_state"][i][0])
        path_speed = float(np.hypot(*(plan[-1] - (plan[-2] if len(plan) > 1 else 0.0)))) / self.plan_dt
        if abs(speed - target) <= p.tolerance_m_s and abs(path_speed - target) <= p.tolerance_m_s:
            return None, ""
        route = observation_route(inputs["route"][i], inputs["route_mask"][i])
        new = retime_towards(plan, speed, self.plan_dt, route, target, p.accel, p.decel, p.horizon_s,
                             p.curve_accel, p.min_gain_m, join_margin_m=p.join_margin_m)
        if new is None:
            return None, ""
        if target > speed:  # faster (continued to horizon_s): only on a clear road ahead
            channel = drivable_channel(inputs["bev"], self.channel_names, self.bev_cfg)
            if channel is None or not keeps_clear(new, inputs["bev"][i, channel], inputs, i, self.plan_dt,
                                                  self.ego_size, self.max_curvature, self.bev_cfg,
                                                  self.drivable, pacing=True,
                                                  substeps=self.collision_substeps):
                return None, ""
            return new[: len(plan)], f"towards the mission's pace {target:.1f} m/s (faster)"
        return new, f"towards the mission's pace {target:.1f} m/s (slower)"


def drivable_channel(bev: np.ndarray, channel_names: list[str], cfg) -> int | None:
    """The drivable-area channel of the inputs' BEV ``[B, C, H, W]`` when it has the model's layout
    (``channel_names`` in its order, grid ``cfg``); None when the model takes no drivable area."""
    if "drivable_area" in channel_names and bev.shape[1:] == (len(channel_names), cfg.height, cfg.width):
        return channel_names.index("drivable_area")
    return None


class TrafficRuleStage(RetimingStage):
    """The plan re-timed to stop before a red (or stoppable yellow) signal's stop line
    (:mod:`rad2_planner.traffic_rules`), where the observation carries signal stops."""

    name = "traffic_rules"
    note_key = "traffic_rule"

    def __init__(self, params: TrafficRuleParams, plan_dt: float, ego_length: float):
        self.params = params
        self.plan_dt = float(plan_dt)
        self.ego_length = float(ego_length)

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def rows(self, plans, context):
        # an observation without signal stops (a dict, a log without signals) leaves every plan as it is
        return range(0) if context.signal_stop is None else super().rows(plans, context)

    def retime(self, plan, context, i):
        speed = float(context.inputs["ego_state"][i, 0])
        stop = np.asarray(context.signal_stop, np.float64).reshape(len(context.inputs["ego_state"]), 2)[i]
        limit = allowed_distance(stop, speed, self.ego_length, self.params)
        if limit is None:
            return None, ""
        limited = limit_progress(plan, self.plan_dt, speed, limit, self.params.comfort_decel)
        return limited, f"stop for {SIGNAL_STATE_NAMES[int(stop[1])]} signal in {limit:.1f} m"


class SafetyEnvelopeStage(RetimingStage):
    """The plan re-timed so that at every point the ego could still stop behind every agent in its
    path if that agent braked hard (:mod:`rad2_planner.safety_envelope`), braking up to the vehicle's
    emergency limit ``emergency_decel`` where needed."""

    name = "safety_envelope"
    note_key = "safety_envelope"

    def __init__(self, params: SafetyEnvelopeParams, plan_dt: float, ego_size: tuple[float, float],
                 emergency_decel: float, max_speed: float, collision_substeps: int = 1):
        self.params = params
        self.collision_substeps = int(collision_substeps)
        self.plan_dt = float(plan_dt)
        self.ego_size = ego_size
        self.emergency_decel = float(emergency_decel)
        self.max_speed = float(max_speed)

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def retime(self, plan, context, i):
        inputs = context.inputs
        res = apply_envelope(plan, self.plan_dt, float(inputs["ego_state"][i, 0]), inputs["agents"][i],
                             inputs["agents_mask"][i], self.ego_size, self.emergency_decel, self.params,
                             max_speed=self.max_speed, substeps=self.collision_substeps)
        return (res.plan, res.note()) if res.fired else (None, "")


class PlanBrakingStage(RetimingStage):
    """The selected plan's own braking held to ``comfort_limits.max_plan_decel`` before the rule stages
    (:func:`rad2_planner.comfort_limits.limit_plan_braking`); the traffic rules and the safety envelope
    after it brake as hard as they need. Off when ``max_plan_decel`` is 0 or the comfort limits are off.

    The softer plan is kept only where it meets no observed agent, extrapolated at constant velocity,
    sooner than the selected plan does (the safe set's own test,
    :func:`rad2_planner.candidates.safe_candidates`). Why: the generator's hard braking is sometimes
    for cross traffic that the safety envelope trusts only over its short crossing horizon; softening
    that braking drove the ego into crossing cars on the SUMO stress set. Past the plan's end the softer
    plan follows the observation's route, and it corners no harder than
    ``comfort_limits.plan_braking_curve_accel`` where the plan did not."""

    name = "plan_braking"
    note_key = "plan_braking"

    def __init__(self, params: ComfortLimitParams, plan_dt: float, ego_size: tuple[float, float],
                 max_curvature: float, collision_substeps: int = 1):
        self.params = params
        self.collision_substeps = int(collision_substeps)
        self.plan_dt = float(plan_dt)
        self.ego_size = ego_size
        self.max_curvature = float(max_curvature)

    @property
    def enabled(self) -> bool:
        return self.params.enabled and self.params.max_plan_decel > 0.0

    def retime(self, plan, context, i):
        inputs = context.inputs
        route = observation_route(inputs["route"][i], inputs["route_mask"][i])
        limited = limit_plan_braking(plan, self.plan_dt, float(inputs["ego_state"][i, 0]),
                                     self.params.max_plan_decel, route, self.params.plan_braking_curve_accel,
                                     self.params.curvature_chord_m)
        if np.array_equal(limited, plan):
            return None, ""
        both = np.stack([np.asarray(plan, np.float64), limited])
        latest = safe_candidates(both, inputs["agents"][i], inputs["agents_mask"][i], self.plan_dt,
                                 self.ego_size, self.max_curvature, substeps=self.collision_substeps)
        if 1 not in latest:
            return None, ""
        return limited, f"the plan's braking held to {self.params.max_plan_decel:g} m/s^2"


class ComfortLimitStage(RetimingStage):
    """The plan re-timed within ``comfort_limits`` (curve speed, then acceleration and jerk from the
    ego's speed; :mod:`rad2_planner.comfort_limits`); unchanged where it already was within them."""

    name = "comfort_limits"

    def __init__(self, params: ComfortLimitParams, plan_dt: float):
        self.params = params
        self.plan_dt = float(plan_dt)

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def retime(self, plan, context, i):
        speed, accel = (float(v) for v in context.inputs["ego_state"][i, :2])
        limited = limit_curve_speed(plan, self.plan_dt, self.params)
        limited = limit_acceleration(limited, self.plan_dt, speed, accel, self.params)
        return (None, "") if np.array_equal(limited, plan) else (limited, "")


class DrivableAreaStage(RetimingStage):
    """The plan as it will be executed, its ego box swept along the path, checked against the BEV's
    drivable area (:mod:`rad2_planner.drivable_area`); where it leaves it, the note says where, and with
    ``action: stop`` the plan is re-timed to stop before it. A model without a drivable-area channel
    leaves every plan unchecked."""

    name = "drivable_area"
    note_key = "drivable_area"

    def __init__(self, params: DrivableAreaParams, plan_dt: float, ego_size: tuple[float, float], bev_cfg,
                 channel_names: list[str], max_curvature: float):
        self.params = params
        self.plan_dt = float(plan_dt)
        self.ego_size = ego_size
        self.max_curvature = float(max_curvature)
        self.bev_cfg = bev_cfg
        self.channel_names = list(channel_names)

    @property
    def enabled(self) -> bool:
        return self.params.enabled

    def retime(self, plan, context, i):
        inputs = context.inputs
        channel = drivable_channel(inputs["bev"], self.channel_names, self.bev_cfg)
        if channel is None:
            return None, ""
        found = first_exit(plan, self.plan_dt, self.ego_size, inputs["bev"][i, channel], self.bev_cfg,
                           self.params, self.max_curvature)
        if found is None:
            return None, ""
        if self.params.action != "stop":
            return None, found.note()
        stop_at = max(found.inside_m - self.params.stop_margin_m, 0.0)
        limited = limit_progress(plan, self.plan_dt, float(inputs["ego_state"][i, 0]), stop_at,
                                 self.params.comfort_decel)
        return limited, f"{found.note()}: stopping in {stop_at:.1f} m"


class StagePipeline:
    """Stages run in order on a cycle's plans, each timed into the cycle's ``timings_ms``."""

    def __init__(self, stages: Sequence[Stage]):
        self.stages = tuple(stages)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r} (have {[s.name for s in self.stages]})")

    def run(self, plans: CyclePlans, context: CycleContext) -> CyclePlans:
        for s in self.stages:
            if not s.applies(context):
                continue
            t0 = time.perf_counter()
            plans = s.apply(plans, context)
            if s.timing_key is not None:
                context.timings[s.timing_key] = (time.perf_counter() - t0) * 1e3
        return plans
