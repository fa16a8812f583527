"""When a candidate first meets an agent extrapolated at constant velocity (rad2_planner/candidates.py):
looked at between plan points as well as at them."""

import numpy as np
import pytest
from rad2_core.config import load_merged
from rad2_planner.candidates import first_overlaps, safe_candidates, substep_poses

DT = 0.5
EGO = (4.8, 1.9)


def straight(speed: float, t: int = 8) -> np.ndarray:
    return np.stack([speed * DT * (np.arange(t) + 1.0), np.zeros(t)], -1)


def test_substep_poses_interpolate_from_the_origin_and_end_on_the_plan_points():
    plan = np.array([[1.0, 0.0], [2.0, 1.0]])
    yaw = np.array([0.0, np.pi / 2])
    fine = substep_poses(plan, yaw, 4)
    assert fine.shape == (8, 3)
    np.testing.assert_allclose(fine[3], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(fine[7], [2.0, 1.0, np.pi / 2])
    np.testing.assert_allclose(fine[0], [0.25, 0.0, 0.0])
    np.testing.assert_allclose(fine[5], [1.5, 0.5, np.pi / 4])
    # a heading across +-pi turns the short way round
    wrap = substep_poses(np.array([[1.0, 0.0], [2.0, 0.0]]), np.array([3.0, -3.0]), 2)
    assert abs(wrap[2, 2] - (3.0 + 0.5 * (2 * np.pi - 6.0))) < 1e-9
    np.testing.assert_array_equal(substep_poses(plan, yaw, 1), np.concatenate([plan, yaw[:, None]], -1))
    with pytest.raises(ValueError, match="substeps"):
        substep_poses(plan, yaw, 0)


def test_a_car_crossing_between_two_plan_points_is_found_with_substeps():
    """A car crossing at 16 m/s 10 m ahead has not reached the path at 0.5 s, where the ego (8 m/s) is
    still short of its lane, and has left it at 1.0 s: only a look in between finds that it passes
    through the ego's box, in the second interval."""
    crosser = np.array([[10.0, 12.0, 0.0, -1.0, 0.0, -16.0, 4.5, 1.8, 0.0, 0.0]])
    cand = straight(8.0)[None]
    mask = np.ones(1, bool)
    assert first_overlaps(cand, crosser, mask, DT, EGO, 0.2) == 8
    assert first_overlaps(cand, crosser, mask, DT, EGO, 0.2, substeps=5) == 1
    # of two candidates the one that waits is the safe set
    wait = straight(0.5)[None]
    both = np.concatenate([cand, wait])
    np.testing.assert_array_equal(safe_candidates(both, crosser, mask, DT, EGO, 0.2, substeps=5), [1])
    np.testing.assert_array_equal(safe_candidates(both, crosser, mask, DT, EGO, 0.2), [0, 1])


def test_the_planner_file_sets_a_step_finer_than_the_plan():
    p = load_merged()["planner"]
    assert 0.0 < p["collision_time_step_s"] < p["plan_dt"]
