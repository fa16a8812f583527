"""The longitudinal safety envelope on the executed plan (rad2_planner/safety_envelope.py)."""

import numpy as np
import pytest
from rad2_core.config import load_merged, load_params
from rad2_core.geometry import boxes_overlap
from rad2_planner.comfort_limits import ComfortLimitParams, limit_acceleration
from rad2_planner.safety_envelope import SafetyEnvelopeParams, apply_envelope, constant_velocity_boxes

PARAMS = load_merged()

DT = 0.5
T = 8
EGO = (4.8, 1.9)
EMERGENCY = 8.0
P = SafetyEnvelopeParams(enabled=True, reaction_time_s=0.5, ego_decel=4.0, agent_decel=4.0, margin_m=2.0,
                         lateral_margin_m=0.2, station_step_m=1.0, crossing_angle_deg=45.0,
                         along_angle_deg=20.0, crossing_horizon_s=1.0, cut_in_horizon_s=2.0,
                         alongside_horizon_s=1.0, entry_brake_decel=0.0,
                         entry_imminent_s=1.0)


def straight_plan(speed: float, lateral: float = 0.0) -> np.ndarray:
    x = speed * DT * (np.arange(T) + 1.0)
    return np.stack([x, np.full(T, lateral)], -1)


def agent(x: float, y: float, vx: float = 0.0, vy: float = 0.0, length: float = 4.5, width: float = 1.8):
    return np.array([x, y, 1.0, 0.0, vx, vy, length, width, 0.0, 0.0])


def run(plan, speed, agents, p=P):
    agents = np.atleast_2d(np.asarray(agents, float)) if len(agents) else np.zeros((0, 10))
    return apply_envelope(plan, DT, speed, agents, np.ones(len(agents), bool), EGO, EMERGENCY, p)


def ego_front_progress(plan: np.ndarray) -> np.ndarray:
    return np.linalg.norm(plan, axis=1) + 0.5 * EGO[0]


def test_stopped_car_ahead_brakes_and_stops_before_it():
    plan = straight_plan(15.0)  # 60 m in 4 s, straight through the car
    car = agent(45.0, 0.0)  # rear bumper at 42.75 m from the ego's centre
    res = run(plan, 15.0, [car])
    assert res.fired and res.agent == 0
    assert "brake for agent 0" in res.note()
    steps = np.diff(np.linalg.norm(np.vstack([[0, 0], res.plan]), axis=1))
    assert np.all(steps >= -1e-9)  # never backwards
    assert steps[-1] / DT < 0.3 * 15.0  # most of the speed is gone within the 4 s horizon
    assert np.all(np.diff(steps) <= 1e-9)  # slowing down all the way
    rear = 45.0 - 0.5 * 4.5
    assert np.all(ego_front_progress(res.plan) <= rear - P.margin_m + 1e-6)
    # the path is kept: every point stays on the x axis
    np.testing.assert_allclose(res.plan[:, 1], 0.0, atol=1e-9)
    # no box of the executed plan overlaps the car
    boxes = np.stack([res.plan[:, 0], res.plan[:, 1], np.zeros(T), np.full(T, EGO[0]), np.full(T, EGO[1])],
                     -1)
    assert not boxes_overlap(boxes, constant_velocity_boxes(car[None], np.zeros(1))[0, 0]).any()


def test_emergency_braking_is_allowed_but_bounded_by_the_vehicle_limit():
    plan = straight_plan(20.0)
    res = run(plan, 20.0, [agent(25.0, 0.0)])  # too close to stop at ego_decel: brake harder
    assert res.fired
    speeds = np.diff(np.concatenate([[0.0], res.plan[:, 0]])) / DT
    decel = -np.diff(np.concatenate([[20.0], speeds])) / DT
    assert decel.max() > P.ego_decel + 1.0  # harder than the planning deceleration ...
    assert decel.max() <= EMERGENCY + 1e-6  # ... never beyond the vehicle's emergency limit
    assert res.decel == pytest.approx(decel.max())


def test_comfort_limits_keep_the_envelope_stop():
    res = run(straight_plan(15.0), 15.0, [agent(45.0, 0.0)])
    comfort = ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05)
    limited = limit_acceleration(res.plan, DT, 15.0, 0.0, comfort)
    assert ego_front_progress(limited)[-1] <= ego_front_progress(res.plan)[-1] + 1e-6


def test_free_road_plan_unchanged():
    plan = straight_plan(25.0)
    res = run(plan, 25.0, [])
    assert not res.fired and res.note() == ""
    np.testing.assert_array_equal(res.plan, plan)


@pytest.mark.parametrize("lateral", [3.5, -3.5])
def test_car_in_adjacent_lane_unchanged(lateral):
    plan = straight_plan(20.0)
    res = run(plan, 20.0, [agent(15.0, lateral), agent(40.0, lateral, vx=5.0)])
    assert not res.fired
    np.testing.assert_array_equal(res.plan, plan)


def test_leader_at_a_safe_distance_unchanged_and_tailgating_slows_down():
    # same speed, a 2 s gap: nothing to do
    plan = straight_plan(20.0)
    assert not run(plan, 20.0, [agent(4.65 + 40.0, 0.0, vx=20.0)]).fired
    # same speed, a 0.3 s gap (6 m): the plan slows down to open the gap
    res = run(plan, 20.0, [agent(4.65 + 6.0, 0.0, vx=20.0)])
    assert res.fired
    assert res.plan[-1, 0] < plan[-1, 0] - 1.0


def test_follower_and_oncoming_in_other_lane_ignored():
    plan = straight_plan(15.0)
    # a faster car behind in our lane (its own hazard), an oncoming one in the other lane
    oncoming = np.array([50.0, 3.5, -1.0, 0.0, -15.0, 0.0, 4.5, 1.8, 0.0, 0.0])
    res = run(plan, 15.0, [agent(-10.0, 0.0, vx=25.0), oncoming])
    assert not res.fired


def test_disabled_is_identity():
    plan = straight_plan(15.0)
    off = SafetyEnvelopeParams(**{**P.__dict__, "enabled": False})
    res = run(plan, 15.0, [agent(20.0, 0.0)], off)
    assert not res.fired
    np.testing.assert_array_equal(res.plan, plan)


def test_params_file_and_validation():
    p = SafetyEnvelopeParams.from_params(load_params("planner"))
    assert p.enabled
    with pytest.raises(ValueError, match="safety_envelope.ego_decel: must be a positive number"):
        SafetyEnvelopeParams(**{**P.__dict__, "ego_decel": 0.0})
    with pytest.raises(ValueError, match="safety_envelope.margin_m: must be a number >= 0"):
        SafetyEnvelopeParams(**{**P.__dict__, "margin_m": -1.0})


def test_cut_in_from_alongside_brakes_at_once():
    # a slow car beside the ego, ahead, pulling into the ego's lane: in its path only from 1 s on, but
    # the bound there cannot be met unless the ego brakes at its emergency limit now
    plan = straight_plan(25.0)
    res = run(plan, 25.0, [agent(8.0, 3.2, vx=5.0, vy=-1.6)])
    assert res.fired
    first_speed = res.plan[0, 0] / DT
    assert first_speed == pytest.approx(25.0 - EMERGENCY * DT)  # emergency braking from the first interval


def test_a_car_alongside_moving_in_counts_only_within_the_alongside_horizon():
    # a car in the next lane, 3 m/s slower, moving towards the ego's lane at 0.9 m/s: it enters the
    # path after about 1.4 s. Alongside the ego (its rear behind the ego's front) it counts only within
    # 1 s, so the plan is kept (it would meet the ego's side); pulled ahead by 8 m the same move is a
    # cut-in in front of the ego (2 s), and the ego brakes at its emergency limit at once
    plan = straight_plan(20.0)
    assert not run(plan, 20.0, [agent(1.0, -3.2, vx=17.0, vy=0.9)]).fired
    whole = SafetyEnvelopeParams(**{**P.__dict__, "alongside_horizon_s": 2.0})
    assert run(plan, 20.0, [agent(1.0, -3.2, vx=17.0, vy=0.9)], whole).fired
    ahead = run(plan, 20.0, [agent(9.0, -3.2, vx=17.0, vy=0.9)])
    assert ahead.fired and ahead.plan[0, 0] / DT == pytest.approx(20.0 - EMERGENCY * DT)
    # a decisive move in from alongside (within the horizon) is still braked for
    assert run(plan, 20.0, [agent(1.0, -2.6, vx=17.0, vy=1.5)]).fired


def test_agent_crossing_behind_the_ego_ignored():
    # crosses the ego's path 10 m ahead in 2 s; the ego (20 m/s) is 30 m further on by then
    plan = straight_plan(20.0)
    res = run(plan, 20.0, [np.array([10.0, 10.0, 0.0, -1.0, 0.0, -5.0, 4.5, 1.8, 0.0, 0.0])])
    assert not res.fired


def test_policy_applies_the_envelope_with_the_vehicle_emergency_limit(tmp_path):
    import torch
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs
    from rad2_planner.stages import CycleContext, CyclePlans
    from tiny_models import randomised_model, tiny_config

    torch.set_num_threads(1)
    model = randomised_model(tiny_config())
    policy = Rad2Policy(model, PARAMS, backend="pytorch", onnx_dir=tmp_path, num_candidates=4)
    stage = policy.pipeline.stage("safety_envelope")
    assert stage.params.enabled and stage.emergency_decel == pytest.approx(8.0)  # vehicle.yaml
    ex = example_inputs(model.cfg, batch=1, seed=0)
    inputs = {k: np.array(ex[k]) for k in SCENE_INPUTS}
    inputs["ego_state"][0, 0] = 15.0
    inputs["agents_mask"][:] = False
    inputs["agents"][0, 0] = agent(45.0, 0.0)
    inputs["agents_mask"][0, 0] = True
    candidates = np.repeat(straight_plan(15.0)[None, None], 4, axis=1).astype(np.float32)
    out = stage.apply(CyclePlans.of(candidates, [0]), CycleContext(inputs))
    executed, notes = out.executed, out.notes("safety_envelope")
    assert notes[0].startswith("brake for agent 0")
    assert np.all(ego_front_progress(executed[0]) <= 45.0 - 2.25 - P.margin_m + 1e-4)
    # a plan_batch cycle reports the stage's time
    result = policy.plan_batch({k: v for k, v in inputs.items()}, seeds=[0])[0]
    assert "safety_envelope" in result.timings_ms


def test_crossing_agent_stopped_for_only_where_the_ego_can_stop_before_its_path():
    crosser = np.array([20.0, 6.0, 0.0, -1.0, 0.0, -8.0, 4.5, 1.8, 0.0, 0.0])  # crosses 20 m ahead at 0.5 s
    res = run(straight_plan(10.0), 10.0, [crosser])
    assert res.fired  # room to stop: yield
    assert np.all(ego_front_progress(res.plan)[:2] <= 20.0 - 0.9 + 1e-6)
    # one sweeping over the ego's front now: it cannot stop short of it, so it keeps its plan
    over_front = np.array([4.0, 4.0, 0.0, -1.0, 0.0, -8.0, 4.5, 1.8, 0.0, 0.0])
    plan = straight_plan(7.0)
    res = run(plan, 7.0, [over_front])
    assert not res.fired
    np.testing.assert_array_equal(res.plan, plan)


def test_cross_traffic_counts_only_within_the_crossing_horizon():
    """A crossing car 2.5 s from the ego's path (extrapolated at constant velocity) holds the ego back
    only when the horizon reaches that far; within the horizon it is yielded to."""
    crosser = np.array([30.0, 22.0, 0.0, -1.0, 0.0, -8.0, 4.5, 1.8, 0.0, 0.0])  # on the path at ~2.5 s
    plan = straight_plan(10.0)  # the ego's front is there at ~2.8 s
    far = run(plan, 10.0, [crosser], P)
    assert not far.fired
    np.testing.assert_array_equal(far.plan, plan)
    long = SafetyEnvelopeParams(**{**P.__dict__, "crossing_horizon_s": 4.0})
    assert run(plan, 10.0, [crosser], long).fired
    # the same car 1 s later in its approach (0.5 s from the path) is within the horizon: yield
    near = crosser + np.array([0, -16.0, 0, 0, 0, 0, 0, 0, 0, 0])
    assert run(plan, 10.0, [near], P).fired


def test_a_drift_into_the_path_counts_only_within_the_cut_in_horizon():
    """A slower car two lanes over drifting sideways at 1.2 m/s enters the ego's path only after about
    3.5 s (extrapolated at constant velocity): with a 2 s cut-in horizon the ego keeps its plan, with
    the whole plan as the horizon it brakes now; the same car 1.5 s into the path is braked for."""
    drifter = agent(7.0, -6.5, vx=15.7, vy=1.2)
    plan = straight_plan(18.8)
    assert not run(plan, 18.8, [drifter], P).fired
    whole = SafetyEnvelopeParams(**{**P.__dict__, "cut_in_horizon_s": 4.0})
    assert run(plan, 18.8, [drifter], whole).fired
    close = agent(7.0, -4.0, vx=15.7, vy=1.2)  # enters the path at about 1.4 s
    assert run(plan, 18.8, [close], P).fired


def test_impossible_ego_speed_keeps_the_sweep_bounded_and_nan_is_named():
    # 1e6 m/s cannot happen (the nodes reject it); the core must still answer at once, not sweep 1e11 m
    res = apply_envelope(straight_plan(15.0), DT, 1.0e6, np.atleast_2d(agent(45.0, 0.0)), np.ones(1, bool),
                         EGO, EMERGENCY, P, max_speed=40.0)
    assert res.fired and np.all(np.isfinite(res.plan))
    with pytest.raises(ValueError, match="ego_speed"):
        run(straight_plan(15.0), float("nan"), [agent(45.0, 0.0)])


ENTRY = SafetyEnvelopeParams(**{**P.__dict__, "entry_brake_decel": 2.5})


def _interval_speeds(plan: np.ndarray, v0: float) -> tuple[np.ndarray, np.ndarray]:
    progress = np.cumsum(np.linalg.norm(np.diff(np.vstack([[0.0, 0.0], plan]), axis=0), axis=1))
    speeds = np.diff(np.concatenate([[0.0], progress])) / DT
    return speeds, -np.diff(np.concatenate([[v0], speeds])) / DT


def test_a_predicted_entry_not_yet_imminent_is_braked_for_at_the_entry_rate():
    # the cut-in of the alongside test, 8 m further ahead: it enters the path after about 1.4 s, and the
    # bound there is out of reach but for emergency braking now; with entry_brake_decel the ego brakes
    # at that rate from now and re-checks every cycle
    plan = straight_plan(20.0)
    cut_in = agent(9.0, -3.2, vx=17.0, vy=0.9)
    hard = run(plan, 20.0, [cut_in])
    assert hard.plan[0, 0] / DT == pytest.approx(20.0 - EMERGENCY * DT)
    soft = run(plan, 20.0, [cut_in], ENTRY)
    assert soft.fired and soft.agent == 0
    speeds, decel = _interval_speeds(soft.plan, 20.0)
    assert decel[0] > 0.5 and decel.max() <= 2.5 + 1e-6
    assert speeds[0] == pytest.approx(20.0 - 2.5 * 0.5 * DT)
    # a rate set beyond the vehicle's emergency limit is held to that limit
    beyond = run(plan, 20.0, [cut_in], SafetyEnvelopeParams(**{**P.__dict__, "entry_brake_decel": 10.0}))
    assert _interval_speeds(beyond.plan, 20.0)[1].max() <= EMERGENCY + 1e-6


def test_an_imminent_entry_or_a_car_in_the_path_still_gets_the_emergency_limit():
    plan = straight_plan(25.0)
    # the slow car pulling in from beside the ego's front enters within 1 s: emergency braking now
    imminent = [agent(8.0, 3.2, vx=5.0, vy=-1.6)]
    np.testing.assert_allclose(run(plan, 25.0, imminent, ENTRY).plan, run(plan, 25.0, imminent).plan)
    # a stopped car in the lane close ahead: not a prediction, nothing softened
    ahead = [agent(25.0, 0.0)]
    np.testing.assert_allclose(run(straight_plan(20.0), 20.0, ahead, ENTRY).plan,
                               run(straight_plan(20.0), 20.0, ahead).plan)


def test_entry_braking_keeps_the_bound_of_the_other_agents():
    # a predicted cut-in far ahead and a stopped car in the lane: the car's bound still holds
    plan = straight_plan(15.0)
    car = agent(40.0, 0.0)
    both = run(plan, 15.0, [agent(10.0, -3.2, vx=11.0, vy=0.9), car], ENTRY)
    assert both.fired
    assert np.all(ego_front_progress(both.plan) <= 40.0 - 0.5 * 4.5 - P.margin_m + 1e-6)


def test_entry_parameters_are_validated():
    for name in ("entry_brake_decel", "entry_imminent_s"):
        with pytest.raises(ValueError, match=f"safety_envelope.{name}: must be a number >= 0"):
            SafetyEnvelopeParams(**{**P.__dict__, name: -1.0})


HEADWAY = SafetyEnvelopeParams(**{**P.__dict__, "follow_time_gap_s": 1.0, "closing_decel": 2.0})


def _speeds(plan: np.ndarray, v0: float) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], np.linalg.norm(plan, axis=1)])) / DT


def _gaps(plan: np.ndarray, x: float, v: float) -> np.ndarray:
    """Bumper-to-bumper gap at every plan point to a 4.5 m car starting x m ahead at v m/s."""
    t = DT * (np.arange(T) + 1.0)
    return (x + v * t - 0.5 * 4.5) - (np.linalg.norm(plan, axis=1) + 0.5 * EGO[0])


@pytest.mark.parametrize(("x", "v"), [(22.0, 12.0), (30.0, 12.0), (25.0, 10.0)])
def test_the_plan_never_closes_on_a_leader_faster_than_careful_humans(x, v):
    """16 m/s towards a slower car ahead: the stopping bound alone lets the plan settle at a 0.5 s gap
    (its reaction time); the headway bound slows it, never faster than the stopping bound would, to keep
    follow_time_gap_s at the leader's speed, braking for it at closing_decel at most."""
    plan = straight_plan(16.0)
    leader = agent(x, 0.0, vx=v)
    hard_only = run(plan, 16.0, [leader])
    res = run(plan, 16.0, [leader], HEADWAY)
    assert res.fired and res.agent == 0
    speeds, hard_speeds = _speeds(res.plan, 16.0), _speeds(hard_only.plan, 16.0)
    assert np.all(speeds <= hard_speeds + 1e-6)
    gap, hard_gap = _gaps(res.plan, x, v), _gaps(hard_only.plan, x, v)
    assert gap[-1] >= hard_gap[-1] + 0.5, (gap, hard_gap)
    # what the headway bound adds is braking at closing_decel at most
    extra = np.flatnonzero(speeds < hard_speeds - 1e-6)
    decel = -np.diff(np.concatenate([[16.0], speeds])) / DT
    assert extra.size and decel[extra].max() <= HEADWAY.closing_decel + 1e-6, decel.round(2)
    # closing no faster than a human could still come down from at closing_decel, with its time gap
    closing = np.maximum(speeds - v, 0.0)
    needed = HEADWAY.follow_time_gap_s * speeds + closing**2 / (2 * HEADWAY.closing_decel) + HEADWAY.margin_m
    assert np.all(gap[3:] >= needed[3:] - 1.5), (gap.round(1), needed.round(1))


def test_a_leader_far_ahead_or_pulling_away_leaves_the_plan_alone():
    plan = straight_plan(12.0)
    assert not run(plan, 12.0, [agent(150.0, 0.0, vx=12.0)], HEADWAY).fired
    assert not run(plan, 12.0, [agent(30.0, 0.0, vx=16.0)], HEADWAY).fired  # pulling away, 1.8 s gap


def test_the_headway_bound_leaves_crossing_traffic_to_the_stopping_bound():
    """A car crossing the path is no leader: the headway bound adds nothing to the stopping bound's
    answer (which stops for it, or not, as before)."""
    plan = straight_plan(10.0)
    crossing = agent(25.0, -6.0, vx=0.0, vy=8.0)
    crossing[2:4] = [0.0, 1.0]  # heading +y, across the path
    np.testing.assert_allclose(run(plan, 10.0, [crossing], HEADWAY).plan, run(plan, 10.0, [crossing]).plan)


def test_headway_parameters_are_checked():
    for name in ("follow_time_gap_s", "closing_decel"):
        with pytest.raises(ValueError, match=name):
            SafetyEnvelopeParams(**{**P.__dict__, name: -1.0})
    assert not SafetyEnvelopeParams(**{**P.__dict__, "follow_time_gap_s": 1.0}).closing_bound


def test_a_fast_crossing_car_is_seen_between_plan_points_with_substeps():
    """A car crossing at 16 m/s is on either side of the ego's path at 0 s and 0.5 s, and across it in
    between: looked at only at plan points the envelope misses it; at 0.1 s it brakes for it."""
    crosser = np.array([6.0, 3.6, 0.0, -1.0, 0.0, -16.0, 4.5, 1.8, 0.0, 0.0])
    plan = straight_plan(2.0)
    assert not run(plan, 2.0, [crosser]).fired
    res = apply_envelope(plan, DT, 2.0, crosser[None], np.ones(1, bool), EGO, EMERGENCY, P, substeps=5)
    assert res.fired and res.agent == 0
    # it slows so as to stay short of where the car crosses (its near side at 5.1 m) while it does
    assert ego_front_progress(res.plan)[0] <= 5.1 and res.plan[0, 0] < plan[0, 0]
    with pytest.raises(ValueError, match="substeps"):
        apply_envelope(plan, DT, 2.0, crosser[None], np.ones(1, bool), EGO, EMERGENCY, P, substeps=0)


def test_a_creeping_ego_stops_for_a_car_crossing_a_station_ahead_of_its_nose():
    """The ego at 2 m/s can stop in 0.25 m; a car crossing 1 m ahead of its nose is stopped for, not
    waved through as if the ego were already in its way."""
    crosser = np.array([4.3, 4.0, 0.0, -1.0, 0.0, -8.0, 4.5, 1.8, 0.0, 0.0])
    res = run(straight_plan(2.0), 2.0, [crosser])
    assert res.fired
    assert ego_front_progress(res.plan)[:2].max() <= 4.3 - 0.9  # short of it while it crosses


def test_only_an_agent_heading_along_the_path_is_credited_with_its_braking_way():
    """A car entering the path 35 degrees off it, across the ego's nose, is stopped for where it meets
    the path; credited like a leader (along_angle_deg 45) the bound would let the creeping ego on."""
    heading = np.radians(-35.0)
    entering = np.array([6.5, 3.2, np.cos(heading), np.sin(heading), 8.5 * np.cos(heading),
                         8.5 * np.sin(heading), 4.5, 1.8, 0.0, 0.0])
    plan = straight_plan(3.0)
    credited = SafetyEnvelopeParams(**{**P.__dict__, "along_angle_deg": 45.0})
    assert not run(plan, 3.0, [entering], credited).fired
    assert run(plan, 3.0, [entering]).fired
    # a leader along the path keeps its credit: 12 m ahead at 10 m/s, the creeping ego goes on
    assert not run(plan, 3.0, [agent(14.0, 0.0, vx=10.0)]).fired
    with pytest.raises(ValueError, match="along_angle_deg"):
        SafetyEnvelopeParams(**{**P.__dict__, "along_angle_deg": 60.0})


def test_a_much_faster_car_cutting_in_across_the_nose_is_not_run_into():
    """A car passing the ego on its right at 14.7 m/s (the ego at 6) and moving in at 2 m/s: credited
    with its braking way it looks harmless to the stopping bound, but its rear corner sweeps the ego's
    front within 0.3 s. The contact bound slows the ego from the first interval."""
    heading = np.radians(8.0)
    cutting = np.array([1.0, -2.3, np.cos(heading), np.sin(heading), 14.6, 2.0, 4.5, 1.8, 0.0, 0.0])
    plan = straight_plan(6.0)
    res = apply_envelope(plan, DT, 6.0, cutting[None], np.ones(1, bool), EGO, EMERGENCY, P, substeps=5)
    assert res.fired and res.agent == 0
    assert res.plan[0, 0] / DT < 6.0 - 0.5


def test_braking_starts_now_for_a_crossing_car_that_arrives_in_the_next_interval():
    """A car crossing 3.6 m ahead of the ego's nose arrives in the plan's second interval. Keeping
    3 m/s through the first and stopping at the second looked possible to a plan whose speed is
    constant per interval; the ego would be past the point it must stop by. It brakes from now."""
    crosser = np.array([4.5, 9.0, 0.0, -1.0, 0.0, -8.5, 4.5, 1.8, 0.0, 0.0])
    res = apply_envelope(straight_plan(3.0), DT, 3.0, crosser[None], np.ones(1, bool), EGO, EMERGENCY, P,
                         substeps=5)
    assert res.fired
    assert res.plan[0, 0] / DT <= 3.0 - EMERGENCY * DT / 2  # braking in the first interval
    assert ego_front_progress(res.plan)[:2].max() <= 4.5 - 0.9  # short of its path while it crosses


def test_a_car_overtaking_from_behind_and_moving_across_the_nose_is_braked_for():
    """A car 7 m/s faster, its centre a metre behind the ego's in the lane to the left, heading 26
    degrees into the ego's path: it sweeps across the ego's nose within a second. It counted only once
    its centre passed the ego's, when the accelerating ego could no longer keep out of it."""
    heading = np.radians(-26.0)
    overtaker = np.array([-0.9, 3.2, np.cos(heading), np.sin(heading), 10.4, -5.0, 4.5, 1.8, 0.0, 0.0])
    plan = np.stack([np.cumsum(np.linspace(4.0, 8.0, T)) * DT, np.zeros(T)], -1)  # accelerating
    res = apply_envelope(plan, DT, 3.6, overtaker[None], np.ones(1, bool), EGO, EMERGENCY, P, substeps=5)
    assert res.fired and res.agent == 0
    assert res.plan[0, 0] / DT < 3.6  # braking in the first interval
    # the same car overtaking parallel to the ego's lane, and a faster follower in the ego's lane: no brake
    parallel = overtaker.copy()
    parallel[2:6] = [1.0, 0.0, 10.4, 0.0]
    follower = np.array([-7.0, 0.0, 1.0, 0.0, 10.4, 0.0, 4.5, 1.8, 0.0, 0.0])
    for other in (parallel, follower):
        res = apply_envelope(plan, DT, 3.6, other[None], np.ones(1, bool), EGO, EMERGENCY, P, substeps=5)
        assert not res.fired
