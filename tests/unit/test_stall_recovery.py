"""Stall recovery (rad2_planner/stall_recovery.py): a slow ego accelerates evenly from now instead of
replanning "hold, then accelerate" forever, a plan that crawls accelerates where the road ahead is clear,
and a plan that asks for reversing is replaced by the route followed forwards within the vehicle's
limits, only where that stays on the drivable area; and the policy applies all three."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from rad2_core.bev import get_config
from rad2_core.bicycle import VehicleParams
from rad2_core.config import load_merged, load_params
from rad2_planner.stall_recovery import (
    StallRecoveryParams,
    asks_for_reversing,
    clear_road_start,
    even_start,
    follow_route,
    recovery_plan,
)

PARAMS = load_merged()

BEV = load_params("bev")
P = StallRecoveryParams.from_params(load_params("planner"))
VEHICLE = VehicleParams.from_params(load_params("vehicle"))
DT = 0.5


def _right_turn_route(corner_x: float = 6.0, radius: float = 6.0) -> np.ndarray:
    """Ego frame: straight ahead to ``corner_x``, a quarter circle to the right, then along -y."""
    straight = np.stack([np.linspace(0.0, corner_x, 7), np.zeros(7)], axis=-1)
    a = np.linspace(0.0, np.pi / 2, 13)[1:]
    arc = np.stack([corner_x + radius * np.sin(a), -radius * (1.0 - np.cos(a))], axis=-1)
    tail = np.stack([np.full(15, corner_x + radius), -radius - np.arange(1, 16) * 2.0], axis=-1)
    return np.concatenate([straight, arc, tail])


def _progress(plan: np.ndarray) -> np.ndarray:
    return np.cumsum(np.hypot(*np.diff(np.vstack([[0.0, 0.0], plan]), axis=0).T))


def test_a_slow_start_accelerates_evenly_along_the_same_path():
    """A plan that stands for a second and accelerates later (what the imitation generator proposes to a
    standing ego, again every cycle) is re-timed: on the same path, even acceleration from the ego's
    speed up to the plan's speed at start_horizon_s, then the plan's own speeds, never past its end."""
    path_y = lambda x: 0.02 * x**2  # noqa: E731 - a gentle bend, so "the same path" is tested off a line
    xs = np.array([0.02, 0.05, 0.3, 0.9, 2.0, 3.6, 5.6, 8.0])
    plan = np.stack([xs, path_y(xs)], axis=-1)
    out = even_start(plan, ego_speed=0.0, plan_dt=DT, p=P)
    assert out is not None and out.shape == plan.shape
    np.testing.assert_allclose(out[:, 1], path_y(out[:, 0]), atol=0.02)  # on the plan's path
    s_old, s_new = _progress(plan), _progress(out)
    n = int(round(P.start_horizon_s / DT))
    v_at = (s_old[n - 1] - s_old[n - 2]) / DT  # the plan's speed at the horizon
    t = np.arange(1, n + 1) * DT
    np.testing.assert_allclose(s_new[:n], 0.5 * v_at / (n * DT) * t**2, rtol=0.03)  # even from rest
    assert s_new[0] > 3 * s_old[0] and s_new[n - 1] > s_old[n - 1]  # it sets off now, and gains ground
    assert np.all(s_new <= s_old[-1] + 1e-6) and np.all(np.diff(s_new) >= -1e-9)  # no further, no back
    # the same plan from a moving ego (above start_speed), a plan that brakes, one that gains at once and
    # a standing plan are left alone
    assert even_start(plan, ego_speed=P.start_speed + 0.1, plan_dt=DT, p=P) is None
    braking = np.stack([np.array([2.0, 3.8, 5.3, 6.5, 7.4, 8.0, 8.2, 8.2]), np.zeros(8)], axis=-1)
    assert even_start(braking, ego_speed=2.5, plan_dt=DT, p=P) is None
    brisk = np.stack([1.0 * np.arange(1, 9) ** 1.0, np.zeros(8)], axis=-1)
    assert even_start(brisk, ego_speed=0.0, plan_dt=DT, p=P) is None
    assert even_start(np.zeros((8, 2)), ego_speed=0.0, plan_dt=DT, p=P) is None
    assert even_start(plan, ego_speed=float("nan"), plan_dt=DT, p=P) is None
    holed = np.where(np.arange(8)[:, None] == 5, np.nan, plan)
    assert even_start(holed, ego_speed=0.0, plan_dt=DT, p=P) is None


def test_a_moving_ego_that_should_speed_up_accelerates_now():
    """Leaving a corner at 6 m/s the generator proposes to hold 6 m/s for a second and reach 10 m/s later;
    executed a tenth of a second at a time, the ego would lag. Below start_speed the acceleration starts
    now; a plan that cruises or brakes at that speed is left alone, and above start_speed nothing changes."""
    p = replace(P, start_speed=20.0, start_horizon_s=2.0)
    speeds = np.array([6.0, 6.0, 6.0, 7.5, 9.0, 10.0, 10.0, 10.0])  # m/s over each 0.5 s interval
    plan = np.stack([np.cumsum(speeds * DT), np.zeros(8)], axis=-1)
    out = even_start(plan, ego_speed=6.0, plan_dt=DT, p=p)
    assert out is not None
    s_new = _progress(out)
    t = np.arange(1, 5) * DT
    accel = (7.5 - 6.0) / 2.0  # to the plan's speed over its interval ending at 2 s
    np.testing.assert_allclose(s_new[:4], 6.0 * t + 0.5 * accel * t**2, rtol=1e-6)
    assert s_new[-1] == pytest.approx(_progress(plan)[-1])  # never past the plan's own end
    cruise = np.stack([np.cumsum(np.full(8, 6.0) * DT), np.zeros(8)], axis=-1)
    assert even_start(cruise, ego_speed=6.0, plan_dt=DT, p=p) is None
    assert even_start(plan, ego_speed=6.0, plan_dt=DT, p=replace(p, start_speed=5.0)) is None


def test_a_plan_that_stops_still_stops_at_the_same_place():
    xs = np.array([0.1, 0.3, 0.9, 2.0, 3.0, 3.5, 3.6, 3.6])
    plan = np.stack([xs, np.zeros(8)], axis=-1)
    out = even_start(plan, ego_speed=0.5, plan_dt=DT, p=P)
    assert out is not None
    assert out[:, 0].max() <= 3.6 + 1e-9 and out[-1, 0] == pytest.approx(3.6)


def test_reversing_is_told_from_a_standing_plan_with_jitter():
    assert asks_for_reversing(np.array([[-0.5, 0.0], [-1.5, 0.3], [-3.0, 1.0]]), P)
    assert not asks_for_reversing(np.array([[-0.2, 0.0], [0.1, 0.0], [-0.3, 0.0]]), P)


def test_the_route_is_followed_forwards_within_the_steering_limits():
    route = _right_turn_route()
    plan = follow_route(route, ego_speed=3.0, ego_steer=0.0, plan_dt=DT, num_points=8, vehicle=VEHICLE, p=P,
                        lookahead_m=3.0)
    assert plan.shape == (8, 2) and np.all(np.isfinite(plan))
    # forwards only: progress along +x first, then down the outgoing road (to the right)
    assert plan[0, 0] > 0.0 and plan[-1, 1] < -3.0
    # the speed approaches P.speed at P.accel (no faster)
    steps = np.hypot(*np.diff(np.vstack([[0.0, 0.0], plan]), axis=0).T) / DT
    assert steps.max() <= P.speed + 1e-6 and steps[0] <= 3.0 + P.accel * DT + 1e-6
    # from standstill it sets off at P.accel
    slow = follow_route(route, 0.0, 0.0, DT, 8, VEHICLE, P, 3.0)
    assert 0.0 < slow[0, 0] <= 0.5 * P.accel * DT**2 + 1e-6
    # it stays close to the route (pure pursuit cuts the corner a little, never by metres)
    d = np.min(np.linalg.norm(plan[:, None] - route[None], axis=-1), axis=1)
    assert d.max() < 1.5, d


def _drivable(mask_fn) -> np.ndarray:
    cfg = get_config(BEV)
    xs, ys = cfg.cell_centers()
    gx, gy = np.meshgrid(xs, ys)
    return mask_fn(gx, gy).astype(np.float32)


def test_recovery_uses_the_first_variant_on_the_drivable_area_or_none():
    cfg = get_config(BEV)
    route = _right_turn_route(corner_x=2.0, radius=3.0)  # a corner tighter than the car can take
    args = (route, 0.0, 0.0, DT, 8, VEHICLE, P)
    everywhere = _drivable(lambda x, y: np.ones_like(x))
    plan, straight, lookahead = recovery_plan(*args, everywhere, cfg)
    assert plan is not None and (straight, lookahead) == (P.straight_m[0], P.lookahead_m[0])
    # an L-shaped road whose inside corner is not drivable: the car must pull into the junction first
    corner = _drivable(lambda x, y: ((np.abs(y) < 2.0) & (x < 12.0)) | ((x > 3.0) & (x < 12.0) & (y < 2.0)))
    plan, straight, _ = recovery_plan(*args, corner, cfg)
    cols = np.floor((plan[:, 0] - cfg.origin_x) / cfg.resolution).astype(int)
    rows = np.floor((plan[:, 1] - cfg.origin_y) / cfg.resolution).astype(int)
    assert plan is not None and np.all(corner[rows, cols] >= 0.5)
    nowhere = _drivable(lambda x, y: np.zeros_like(x))
    assert recovery_plan(*args, nowhere, cfg)[0] is None


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="stall_recovery.speed: must be a positive number, got -1.0"):
        replace(P, speed=-1.0)
    with pytest.raises(ValueError, match="stall_recovery.lookahead_m"):
        replace(P, lookahead_m=())


def test_the_policy_applies_both_and_says_so():
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs
    from rad2_planner.stages import CycleContext, CyclePlans

    def recover(policy, candidates, inputs):
        out = policy.pipeline.stage("stall_recovery").apply(CyclePlans.of(candidates, [0, 0]),
                                                             CycleContext(inputs))
        return list(out.executed), out.notes("stall_recovery")

    params = load_params("planner")
    on = {**params, "stall_recovery": {**params["stall_recovery"], "enabled": True}}
    policy = Rad2Policy.from_params({**PARAMS, **on}, backend="pytorch")
    cfg = get_config(BEV)
    ex = example_inputs(policy.cfg, batch=2, seed=0)
    inputs = {k: np.array(ex[k]) for k in SCENE_INPUTS}
    inputs["ego_state"][:] = 0.0  # both standing, wheels straight
    inputs["bev"][:] = 0.0
    inputs["bev"][:, cfg.channel_index("drivable_area")] = 1.0
    full = _right_turn_route()
    route = full[:: max(1, len(full) // policy.cfg.n_route)][: policy.cfg.n_route]
    inputs["route"][:] = 0.0
    inputs["route"][:, : len(route), :2] = route
    inputs["route_mask"][:] = False
    inputs["route_mask"][:, : len(route)] = True
    t = np.arange(1, 9)[:, None]
    backwards = np.concatenate([-0.6 * t, 0.2 * t], axis=1)
    waiting = np.array([[0.0, 0.0], [0.1, 0.0], [0.8, 0.0], [2.0, 0.0], [3.5, 0.0], [5.5, 0.0], [8.0, 0.0],
                        [11.0, 0.0]])
    candidates = np.stack([np.stack([backwards] * 4), np.stack([waiting] * 4)]).astype(np.float32)
    executed, notes = recover(policy, candidates, inputs)
    assert notes[0].startswith("plan asks for reversing") and executed[0][:, 0].min() > -1e-6
    assert notes[1].startswith("late acceleration") and executed[1][0, 0] > 5 * waiting[0, 0] + 0.1
    assert executed[1][-1, 0] <= waiting[-1, 0] + 1e-5
    # with the stage switched off, nothing changes
    off = Rad2Policy.from_params({**PARAMS, "stall_recovery": {**params["stall_recovery"], "enabled": False}},
                                 backend="pytorch")
    assert recover(off, candidates, inputs) == ([None, None], ["", ""])


def test_impossible_ego_values_stay_within_the_vehicle():
    """A speed of 1e6 m/s or a steering angle of 1e3 rad (rejected upstream by the validators) still gives
    a finite plan no faster than the vehicle's top speed, and a route point 1 km away no jump."""
    route = _right_turn_route()
    for speed, steer in ((1e6, 0.0), (0.0, 1e3), (1e6, -1e3)):
        plan = follow_route(route, speed, steer, DT, 8, VEHICLE, P, 3.0)
        steps = np.hypot(*np.diff(np.vstack([[0.0, 0.0], plan]), axis=0).T) / DT
        assert np.all(np.isfinite(plan)) and steps.max() <= VEHICLE.max_speed + 1e-6, (speed, steer)
        evened = even_start(plan, speed, DT, P)
        assert evened is None or (speed < P.start_speed and np.all(np.isfinite(evened)))
    far = np.array([[0.0, 0.0], [1000.0, 1000.0]])
    plan = follow_route(far, 2.0, 0.0, DT, 8, VEHICLE, P, 3.0)
    assert np.all(np.isfinite(plan)) and np.hypot(*plan[-1]) < 2.0 + P.speed * 8 * DT

# the crawl on a clear road, switched on with the values the tests assume (whatever the default)
CR = replace(P, clear_road_below=3.0, clear_road_speed=5.0, clear_road_horizon_s=6.0,
             clear_road_curve_accel=1.5, clear_road_min_gain_m=1.0)


def _crawl(speed: float = 1.0, n: int = 8) -> np.ndarray:
    return np.stack([speed * DT * np.arange(1, n + 1), np.zeros(n)], axis=-1)


def test_a_crawl_on_a_clear_road_accelerates_along_the_plan_and_the_route():
    """A plan that keeps a 1 m/s ego at 1 m/s is re-timed to accelerate at stall_recovery.accel towards
    clear_road_speed, past its own short path along the route, continued to clear_road_horizon_s for
    the caller's agent check; never behind the plan at any point."""
    route = np.stack([np.arange(0.0, 60.0, 2.5), np.zeros(24)], axis=-1)
    plan = _crawl()
    out = clear_road_start(plan, 1.0, DT, route, CR)
    n = int(np.ceil(CR.clear_road_horizon_s / DT))
    assert out is not None and out.shape == (max(n, len(plan)), 2)
    s = _progress(out)
    t = np.arange(1, len(s) + 1) * DT
    t_top = (CR.clear_road_speed - 1.0) / CR.accel
    want = np.where(t <= t_top, 1.0 * t + 0.5 * CR.accel * t**2,
                    1.0 * t_top + 0.5 * CR.accel * t_top**2 + CR.clear_road_speed * (t - t_top))
    np.testing.assert_allclose(s, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:, 1], 0.0, atol=1e-9)  # on the route
    assert np.all(s[: len(plan)] >= _progress(plan) - 1e-9)


def test_a_bend_ahead_caps_the_faster_plan():
    """Along a route that turns on a 6 m radius just past the plan's end, the faster plan's speed stays
    near sqrt(clear_road_curve_accel * 6 m) (3 m/s), below clear_road_speed."""
    route = _right_turn_route(corner_x=4.0, radius=6.0)
    out = clear_road_start(_crawl(0.5), 0.5, DT, route, CR)
    assert out is not None
    speeds = np.diff(np.concatenate([[0.0], _progress(out)])) / DT
    assert speeds.max() <= np.sqrt(CR.clear_road_curve_accel * 6.0) * 1.15
    assert speeds.max() < CR.clear_road_speed - 1.0


def test_a_plan_braking_for_a_bend_the_ego_is_too_fast_for_is_left_alone():
    """A 2.9 m/s ego whose plan slows for a turn on a 4 m radius (cap sqrt(1.5 * 4) = 2.4 m/s) keeps
    that plan: held at its speed it would leave the road (a SUMO pull-out clip did)."""
    route = _right_turn_route(corner_x=3.0, radius=4.0)
    assert clear_road_start(_crawl(1.0), 2.9, DT, route, CR) is None
    assert clear_road_start(_crawl(1.0), 1.0, DT, route, CR) is not None  # slower than the bend allows


def test_a_clear_road_leaves_fast_egos_fast_plans_and_bad_values_alone():
    route = np.stack([np.arange(0.0, 60.0, 2.5), np.zeros(24)], axis=-1)
    assert clear_road_start(_crawl(4.0), CR.clear_road_below + 0.1, DT, route, CR) is None  # not slow
    assert clear_road_start(_crawl(CR.clear_road_speed), 1.0, DT, route, CR) is None  # already faster
    assert clear_road_start(_crawl(), 1.0, DT, route, replace(CR, clear_road_below=0.0)) is None  # off
    bad = _crawl()
    bad[3] = np.nan
    assert clear_road_start(bad, 1.0, DT, route, CR) is None
    assert clear_road_start(_crawl(), float("nan"), DT, route, CR) is None
    assert clear_road_start(_crawl(), 1e6, DT, route, CR) is None  # an impossible speed is not slow
    far = _crawl()
    far[-1] = [1000.0, 1000.0]  # a plan point 1 km away: that plan already goes further
    assert clear_road_start(far, 1.0, DT, route, CR) is None
    # a route of one repeated point: straight on along the plan
    out = clear_road_start(_crawl(), 1.0, DT, np.zeros((5, 2)), CR)
    assert out is not None and np.all(np.isfinite(out)) and np.allclose(out[:, 1], 0.0)
    with pytest.raises(ValueError, match="stall_recovery.clear_road_speed .* must exceed clear_road_below"):
        replace(CR, clear_road_below=6.0, clear_road_speed=5.0)


def test_the_stage_accelerates_a_crawl_only_where_no_agent_and_no_edge_is_met():
    """Through the policy's stage: a crawling plan on an empty drivable road accelerates and says so; a
    car standing 14 m ahead in the lane (met within clear_road_horizon_s), or a road that is not
    drivable, leaves the crawl as it is."""
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.stages import CycleContext, CyclePlans
    from synthetic_scenes import empty_road_inputs

    recovery = {**PARAMS["stall_recovery"], "enabled": True, "clear_road_below": CR.clear_road_below,
                "clear_road_speed": CR.clear_road_speed}
    policy = Rad2Policy.from_params({**PARAMS, "stall_recovery": recovery}, backend="pytorch")
    cfg = get_config(BEV)
    inputs = empty_road_inputs(policy, BEV, speed=1.0)
    candidates = np.stack([_crawl()] * 4)[None].astype(np.float32)

    def run(inp):
        out = policy.pipeline.stage("stall_recovery").apply(CyclePlans.of(candidates, [0]), CycleContext(inp))
        return out.executed[0], out.notes("stall_recovery")[0]

    executed, note = run(inputs)
    assert note == "slow plan on a clear road: accelerating"
    assert executed.shape == (8, 2) and executed[-1, 0] > candidates[0, 0, -1, 0] + CR.clear_road_min_gain_m
    blocked = {k: v.copy() for k, v in inputs.items()}
    blocked["agents"][0, 0, :8] = [14.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.5, 1.9]  # standing in the lane
    blocked["agents_mask"][0, 0] = True
    assert run(blocked) == (None, "")
    beside = {k: v.copy() for k, v in blocked.items()}
    beside["agents"][0, 0, 1] = 4.0  # the same car at the kerb, 4 m to the left of the path
    assert run(beside)[1] == "slow plan on a clear road: accelerating"
    off_road = {k: v.copy() for k, v in inputs.items()}
    off_road["bev"][:, cfg.channel_index("drivable_area")] = 0.0
    assert run(off_road) == (None, "")
