"""The drivable-area check of the executed plan (rad2_planner.drivable_area, the pipeline's last stage):
hand-built BEV drivable areas, a plan that stays on the road, one that turns off it, one that runs past
the BEV's edge; report only, or also stop before the exit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from rad2_core.bev import get_config
from rad2_core.config import load_merged, load_params
from rad2_planner.drivable_area import DrivableAreaParams, first_exit, footprint_corners, path_headings

PARAMS = load_merged()
CFG = get_config(load_params("bev"))
P = DrivableAreaParams.from_params(load_params("planner"))
EGO = (4.8, 1.9)
DT = 0.5  # the planner's plan_dt: its points are 5 m apart at 10 m/s


def _drivable(mask_fn) -> np.ndarray:
    xs, ys = CFG.cell_centers()
    gx, gy = np.meshgrid(xs, ys)
    return mask_fn(gx, gy).astype(np.float32)


ROAD = _drivable(lambda x, y: np.abs(y) < 3.5)  # a straight 7 m road along the ego's heading
K = np.arange(1, 9)
STRAIGHT = np.stack([K * 5.0, np.zeros(8)], axis=1)  # 10 m/s for 4 s
TURN = np.stack([K * 5.0, np.where(K > 2, (K - 2) * 2.0, 0.0)], axis=1)  # 10 m straight, then off to the left


def test_footprint_follows_the_path_heading():
    yaw = path_headings(np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
    assert yaw == pytest.approx([0.0, 0.0, np.pi / 2])  # a point that has not moved keeps the heading
    corners = footprint_corners(np.array([[0.0, 1.0]]), np.array([np.pi / 2]), EGO)[0]  # heading +y
    assert np.ptp(corners[:, 0]) == pytest.approx(EGO[1]) and np.ptp(corners[:, 1]) == pytest.approx(EGO[0])


def test_a_plan_on_the_road_passes_and_one_turning_off_it_is_found_where_it_leaves():
    assert first_exit(STRAIGHT, DT, EGO, ROAD, CFG, P) is None
    found = first_exit(TURN, DT, EGO, ROAD, CFG, P)
    assert found is not None
    # found between the plan's points: in the segment that leaves the axis, before its end (y = 2)
    assert found.index == 2 and 1.0 < found.time_s < 1.5, found
    assert 10.0 < found.distance_m < 15.4 and 0 < found.distance_m - found.inside_m <= P.sample_step_m + 1e-9
    assert "leaves the drivable area" in found.note()
    # beyond the checked horizon the same exit is not looked at
    assert first_exit(TURN, DT, EGO, ROAD, CFG, replace(P, horizon_s=1.0)) is None
    # points 5 m apart with a gap of the road between them: the box is checked between the points too
    # (the boxes at x = 10 and 15 m reach 12.4 and 12.6 m: a gap from 13 to 17 m lies between them)
    gap = _drivable(lambda x, y: (np.abs(y) < 3.5) & ((x < 13.0) | (x > 17.0)))
    assert first_exit(STRAIGHT, DT, EGO, gap, CFG, P) is not None
    assert first_exit(STRAIGHT, DT, EGO, gap, CFG, replace(P, sample_step_m=5.0)) is None


def test_cells_outside_the_bev_are_unknown_not_off_road():
    far = np.stack([K * 50.0, np.zeros(8)], axis=1)  # 400 m: leaves the grid ahead
    assert first_exit(far, DT, EGO, ROAD, CFG, P) is None
    nowhere = np.zeros_like(ROAD)
    assert first_exit(STRAIGHT, DT, EGO, nowhere, CFG, P).index == 0  # off-road at once


def test_the_stage_reports_or_stops_before_the_exit():
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.runtime.base import SCENE_INPUTS
    from rad2_planner.runtime.onnx_export import example_inputs
    from rad2_planner.stages import CycleContext, CyclePlans

    def run(action: str):
        params = {**PARAMS, "drivable_area": {**PARAMS["drivable_area"], "action": action}}
        policy = Rad2Policy.from_params(params, backend="pytorch")
        ex = example_inputs(policy.cfg, batch=2, seed=0)
        inputs = {k: np.array(ex[k]) for k in SCENE_INPUTS}
        inputs["ego_state"][:] = 0.0
        inputs["ego_state"][:, 0] = 10.0
        inputs["bev"][:] = 0.0
        inputs["bev"][:, CFG.channel_index("drivable_area")] = ROAD
        assert (policy.cfg.plan_points, policy.plan_dt) == (len(K), DT)
        candidates = np.stack([np.stack([STRAIGHT] * 4), np.stack([TURN] * 4)]).astype(np.float32)
        out = policy.pipeline.stage("drivable_area").apply(CyclePlans.of(candidates, [0, 0]),
                                                           CycleContext(inputs))
        return out, candidates

    reported, candidates = run("report")
    assert reported.notes("drivable_area")[0] == ""
    assert reported.notes("drivable_area")[1].startswith("plan leaves the drivable area")
    assert reported.executed == (None, None)  # reported, executed as it is
    stopped, _ = run("stop")
    plan = stopped.executed[1]
    assert plan is not None and "stopping in" in stopped.notes("drivable_area")[1]
    found = first_exit(candidates[1, 0], DT, EGO, ROAD, CFG, P)
    travelled = np.sum(np.linalg.norm(np.diff(np.vstack([[0.0, 0.0], plan]), axis=0), axis=1))
    assert travelled <= found.inside_m - P.stop_margin_m + 1e-3
    assert first_exit(plan, DT, EGO, ROAD, CFG, P) is None  # the stopped plan stays on the road
    assert stopped.executed[0] is None


def test_a_whole_candidate_set_is_checked_as_first_exit_checks_one_plan():
    """candidate_exit_times (the safe set's drivable-area preference, every cycle) finds the exits
    first_exit finds, within one sub-sample, for a set of candidates drifting off a straight road."""
    from rad2_planner.drivable_area import candidate_exit_times

    drivable = _drivable(lambda x, y: np.abs(y) < 3.5)
    rng = np.random.default_rng(0)
    cands = np.stack([np.cumsum(np.full((32, 8), 5.0), 1), np.cumsum(rng.normal(0.0, 0.6, (32, 8)), 1)], -1)
    got = candidate_exit_times(cands, DT, EGO, drivable, CFG, P)
    want = np.array([e.time_s if (e := first_exit(c, DT, EGO, drivable, CFG, P)) else np.inf for c in cands])
    assert np.isinf(got).sum() == np.isinf(want).sum() and 0 < np.isfinite(want).sum() < 32
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=DT / 8 + 0.06)
    assert candidate_exit_times(cands[:0], DT, EGO, drivable, CFG, P).shape == (0,)


def test_the_safe_set_prefers_candidates_that_stay_on_the_road():
    from rad2_planner.candidates import safe_candidates, safe_medoid_index
    from rad2_planner.drivable_area import candidate_exit_times

    drivable = _drivable(lambda x, y: np.abs(y) < 3.5)
    x = np.cumsum(np.full(8, 5.0))
    on_road = [np.stack([x, np.zeros(8)], -1), np.stack([x, np.full(8, 0.5)], -1)]
    off_road = [np.stack([x, np.linspace(0.5, 8.0, 8) * k], -1) for k in (1.0, 1.5, 2.0)]
    cands = np.stack(on_road + off_road)  # the medoid of all five drifts off the road
    no_agents, mask = np.zeros((1, 10)), np.zeros(1, bool)
    exits = candidate_exit_times(cands, DT, EGO, drivable, CFG, P)
    assert np.isinf(exits[:2]).all() and np.isfinite(exits[2:]).all()
    assert list(safe_candidates(cands, no_agents, mask, DT, EGO, 0.3)) == [0, 1, 2, 3, 4]
    assert list(safe_candidates(cands, no_agents, mask, DT, EGO, 0.3, exits)) == [0, 1]
    assert safe_medoid_index(cands, no_agents, mask, DT, EGO, 0.3, exit_times=exits) in (0, 1)
    # every candidate leaves the road: those leaving it latest
    assert list(safe_candidates(cands[2:], no_agents, mask, DT, EGO, 0.3, exits[2:])) == [0]


def test_the_box_turns_no_faster_than_the_car_can():
    from rad2_core.bicycle import VehicleParams, slip_and_curvature

    vehicle = VehicleParams.from_params(load_params("vehicle"))
    kappa = float(slip_and_curvature(vehicle.max_steer, vehicle)[1])
    # a standing ego's plan: its first points centimetres apart, pointing sideways, then on along the lane
    jitter = np.array([[0.01, 0.13], [0.2, 0.3], [0.8, 0.3], [1.6, 0.1], [2.6, 0.0], [3.8, 0.0]])
    lane = _drivable(lambda x, y: np.abs(y) < 1.9)  # a 3.8 m turn lane, the 1.9 m wide ego in its middle
    raw = path_headings(jitter)
    assert abs(raw[0]) > 1.4  # the first segment's direction: 86 degrees off the lane
    assert first_exit(jitter, DT, EGO, lane, CFG, P).index == 0  # read as sideways across the lane
    held = path_headings(jitter, kappa)
    assert np.abs(held).max() < 0.2  # the car cannot turn more on 4 m of path
    assert first_exit(jitter, DT, EGO, lane, CFG, P, kappa) is None
    # on a circle just inside the car's tightest turn every chord's direction is reachable: unchanged
    arc, bend = np.arange(1, 7) * 1.5, 0.95 * kappa  # points 1.5 m apart
    circle = np.stack([np.sin(bend * arc), 1 - np.cos(bend * arc)], axis=1) / bend
    assert path_headings(circle, kappa) == pytest.approx(path_headings(circle), abs=1e-6)
