"""The nuPlan-style closed-loop score of hand-made episode records (bev_warp_sim.nuplan_score)."""

import numpy as np
import pytest
from bev_warp_sim import nuplan_score as ns
from bev_warp_sim.metrics import aggregate, episode_outcome
from bev_warp_sim.trace import EpisodeTrace
from rad2_core.clip import AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE
from rad2_core.config import load_params

PARAMS = load_params("sim")
# nuPlan's weights: progress 5, TTC 5, speed limit 4, comfort 2
W = {"progress": 5.0, "ttc": 5.0, "speed_limit": 4.0, "comfort": 2.0}


def _trace(n=41, ego_speed=10.0, log_speed=10.0, **kw):
    """A straight drive along the route (the x axis), 0.1 s steps, the log at ``log_speed``."""
    k = np.arange(n)
    ego = np.zeros((n, 6))
    ego[:, 0], ego[:, 3] = ego_speed * k * 0.1, ego_speed
    expert_xy = np.stack([log_speed * k * 0.1, np.zeros(n)], -1)
    base = dict(clip_id="c", scenario_kind="k", dt=0.1, t_max=3.0, start_step=0, end_step=n - 1,
                window_end=n - 1, termination="clip_end", ego=ego, ttc=np.full(n, 3.0),
                rear_ttc=np.full(n, 3.0), route_s=ego[:, 0].copy(), speed_limits=np.full(n, 13.9),
                expert_s=expert_xy[:, 0].copy(), expert_xy=expert_xy, collided=False, at_fault=False,
                offroad=False)
    base.update(kw)
    return EpisodeTrace(**base)


def _hit(step, at_fault=True, agent_type=AGENT_VEHICLE):
    return {"step": step, "agent_index": 0, "agent_type": agent_type, "at_fault": at_fault}


def test_config_matches_nuplan_weights():
    cfg = ns.NuplanScoreConfig.from_params(PARAMS)
    assert cfg.weights == W
    assert cfg.least_min_ttc_s == pytest.approx(0.95) and cfg.min_progress_ratio == pytest.approx(0.2)


def test_clean_drive_scores_one():
    t = ns.nuplan_score_terms(_trace(), PARAMS)
    assert t["score"] == pytest.approx(1.0)
    assert all(t[k] == 1.0 for k in ns.MULTIPLIER_TERMS + ns.WEIGHTED_TERMS)


def test_at_fault_collision_with_a_road_user_scores_zero():
    for kind in (AGENT_VEHICLE, AGENT_PEDESTRIAN):
        tr = _trace(n=21, collided=True, at_fault=True, termination="collision",
                    collisions=(_hit(20, True, kind),))
        t = ns.nuplan_score_terms(tr, PARAMS)
        assert t["no_at_fault_collisions"] == 0.0 and t["score"] == 0.0


def test_collision_not_at_fault_keeps_the_multiplier_and_the_ttc_before_it():
    ttc = np.full(41, 3.0)
    ttc[30:] = 0.0  # T_t drops to 0 once the boxes touch
    tr = _trace(collided=True, ttc=ttc, collisions=(_hit(30, at_fault=False),))
    t = ns.nuplan_score_terms(tr, PARAMS)
    assert t["no_at_fault_collisions"] == 1.0 and t["ttc"] == 1.0 and t["score"] == pytest.approx(1.0)


def test_objects_halve_once_then_zero():
    one = (_hit(10, True, AGENT_OTHER),)
    assert ns.at_fault_collision_multiplier(one, 1) == 0.5
    assert ns.at_fault_collision_multiplier(one + (_hit(20, True, AGENT_OTHER),), 1) == 0.0
    assert ns.at_fault_collision_multiplier((_hit(10, False, AGENT_VEHICLE),), 1) == 1.0
    tr = _trace(collided=True, at_fault=True, collisions=one)
    assert ns.nuplan_score_terms(tr, PARAMS)["score"] == pytest.approx(0.5)


def test_offroad_scores_zero():
    t = ns.nuplan_score_terms(_trace(offroad=True, termination="offroad"), PARAMS)
    assert t["drivable_area"] == 0.0 and t["score"] == 0.0


def test_slow_progress_lowers_the_score():
    # half the log's progress: ratio 0.5, weighted average (5 * 0.5 + 5 + 4 + 2) / 16
    t = ns.nuplan_score_terms(_trace(ego_speed=5.0), PARAMS)
    assert t["progress"] == pytest.approx(0.5)
    assert t["score"] == pytest.approx((5 * 0.5 + 5 + 4 + 2) / 16)
    # under 20 % of the log's progress: not making progress, 0
    crawl = ns.nuplan_score_terms(_trace(ego_speed=1.5), PARAMS)
    assert crawl["making_progress"] == 0.0 and crawl["score"] == 0.0


def test_standing_where_the_log_stands_is_full_progress():
    t = ns.nuplan_score_terms(_trace(ego_speed=0.0, log_speed=0.0), PARAMS)
    assert t["progress"] == 1.0 and t["score"] == pytest.approx(1.0)


def test_low_ttc_speeding_and_discomfort():
    ttc = np.full(41, 3.0)
    ttc[12] = 0.5
    t = ns.nuplan_score_terms(_trace(ttc=ttc), PARAMS)
    assert t["ttc"] == 0.0 and t["score"] == pytest.approx(11 / 16)
    # 2.23 m/s over the limit all the time: speed-limit compliance 0
    fast = _trace(ego_speed=13.9 + 2.23, log_speed=13.9 + 2.23)
    assert ns.nuplan_score_terms(fast, PARAMS)["speed_limit"] == pytest.approx(0.0)
    jerky = _trace()
    ego = jerky.ego.copy()
    ego[20:, 3] = 2.0  # an 8 m/s drop in one step
    t = ns.nuplan_score_terms(_trace(ego=ego), PARAMS)
    assert t["comfort"] == 0.0


def test_driving_backwards_is_a_direction_violation():
    assert ns.driving_direction_multiplier(np.linspace(0, 10, 11), 0.1, 1.0, 2.0, 6.0) == 1.0
    back4 = np.concatenate([np.linspace(0, 10, 11), np.linspace(10, 6, 11)[1:]])  # 4 m back in 1 s
    assert ns.driving_direction_multiplier(back4, 0.1, 1.0, 2.0, 6.0) == 0.5
    back8 = np.concatenate([np.linspace(0, 10, 11), np.linspace(10, 2, 11)[1:]])
    assert ns.driving_direction_multiplier(back8, 0.1, 1.0, 2.0, 6.0) == 0.0


def test_outcome_and_aggregate_carry_the_score():
    clean = episode_outcome(_trace(), PARAMS)
    slow = episode_outcome(_trace(ego_speed=5.0), PARAMS)
    assert clean.score == pytest.approx(1.0) and clean.score_terms["progress"] == 1.0
    assert clean.as_dict()["score"] == pytest.approx(1.0)
    m = aggregate([clean, slow], PARAMS)
    assert m["score"] == pytest.approx((1.0 + (5 * 0.5 + 11) / 16) / 2)


def test_tables_show_the_score():
    from rad2_evaluation.closed_loop import SplitEvaluation, markdown_tables, policy_score

    clean = episode_outcome(_trace(), PARAMS)
    slow = episode_outcome(_trace(ego_speed=5.0), PARAMS)
    saf = SplitEvaluation("idm", "data/eval_safety", aggregate([clean], PARAMS), [clean])
    eff = SplitEvaluation("idm", "data/eval_efficiency", aggregate([slow, slow, slow], PARAMS), [slow] * 3)
    assert policy_score([saf, eff]) == pytest.approx((1.0 + 3 * (5 * 0.5 + 11) / 16) / 4)
    head, _, row = markdown_tables([saf, eff]).splitlines()
    assert head.rstrip(" |").endswith("score")
    assert row.split("|")[-2].strip() == f"{policy_score([saf, eff]):.3f}"
    assert saf.as_dict()["metrics"]["score"] == pytest.approx(1.0)
    assert saf.as_dict()["episodes"][0]["score_terms"]["drivable_area"] == 1.0
