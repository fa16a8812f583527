"""safe_score (bev_warp_sim.rewards): no progress pays for an at-fault collision, progress beyond the log's
earns nothing, a collision that was not the ego's fault and a near miss multiply the rest down."""

import numpy as np
import pytest
from bev_warp_sim import nuplan_score as ns
from bev_warp_sim import rewards as rw
from bev_warp_sim.trace import EpisodeTrace
from rad2_core.clip import AGENT_OTHER, AGENT_VEHICLE
from rad2_core.config import load_params

PARAMS = load_params("sim")
CFG = PARAMS["rewards"]["safe_score"]


def _trace(n=41, ego_speed=10.0, log_speed=10.0, ttc=None, **kw):
    """A straight drive along the route (the x axis), 0.1 s steps, the log at ``log_speed``; no speed
    limit in reach and a constant speed (comfortable), so only what a test changes moves the reward."""
    k = np.arange(n)
    ego = np.zeros((n, 6))
    ego[:, 0], ego[:, 3] = ego_speed * k * 0.1, ego_speed
    expert_xy = np.stack([log_speed * k * 0.1, np.zeros(n)], -1)
    base = dict(clip_id="c", scenario_kind="k", dt=0.1, t_max=3.0, start_step=0, end_step=n - 1,
                window_end=n - 1, termination="clip_end", ego=ego,
                ttc=np.full(n, 3.0) if ttc is None else np.asarray(ttc, float), rear_ttc=np.full(n, 3.0),
                route_s=ego[:, 0].copy(), speed_limits=np.full(n, np.inf), expert_s=expert_xy[:, 0].copy(),
                expert_xy=expert_xy, collided=False, at_fault=False, offroad=False)
    base.update(kw)
    return EpisodeTrace(**base)


def _hit(step, at_fault, agent_type=AGENT_VEHICLE):
    return {"step": step, "agent_index": 0, "agent_type": agent_type, "at_fault": at_fault}


def _at_fault(**kw):
    return _trace(collided=True, at_fault=True, termination="collision", collisions=(_hit(40, True),), **kw)


def _not_at_fault(**kw):
    return _trace(collided=True, termination="collision", collisions=(_hit(40, False),), **kw)


def _near_miss(**kw):
    ttc = np.full(41, 3.0)
    ttc[20] = 0.5 * float(CFG["near_miss_ttc_s"])
    return _trace(ttc=ttc, **kw)


def score(trace, params=PARAMS):
    return rw.REWARDS["safe_score"](trace, params)


def test_registered_and_a_clean_drive_at_the_logs_progress_scores_one():
    assert "safe_score" in rw.REWARDS and "safe_score" in rw.compute_rewards(_trace(), PARAMS)
    assert score(_trace()) == pytest.approx(1.0)


def test_an_at_fault_collision_scores_below_every_episode_without_one_whatever_the_progress():
    extreme = _at_fault(ego_speed=1.0e4)  # a thousand times the log's progress
    assert score(extreme) == rw.SAFE_SCORE_FLOOR == score(_at_fault(ego_speed=0.0))
    others = [_trace(ego_speed=v) for v in (0.0, 0.01, 1.0, 2.5, 9.0, 10.0, 1.0e4)]
    others += [_not_at_fault(ego_speed=v) for v in (0.0, 3.0, 1.0e4)]
    others += [_near_miss(ego_speed=v) for v in (0.0, 3.0, 1.0e4)]
    others += [_near_miss(ego_speed=0.0, collided=True, collisions=(_hit(40, False),))]
    others += [_trace(ego_speed=-5.0)]  # driving backwards: nuPlan's direction and progress gates at 0
    lowest_other = min(score(t) for t in others)
    assert lowest_other >= 0.0 and score(extreme) < lowest_other
    # the property over random episodes: at-fault ones below all others, at any progress and terms
    rng = np.random.default_rng(0)
    fault, clean = [], []
    for _ in range(200):
        speed = float(rng.choice([0.0, rng.uniform(0, 20), rng.uniform(20, 1e4)]))
        ttc = np.full(41, 3.0)
        ttc[1 + int(rng.integers(40))] = rng.uniform(0, 3)
        jerky = rng.random() < 0.3  # a comfort violation
        tr = _trace(ego_speed=speed, ttc=ttc)
        if jerky:
            ego = tr.ego.copy()
            ego[20:, 3] += 5.0  # a 5 m/s jump in one step
            tr = _trace(ego_speed=speed, ttc=ttc, ego=ego)
        kind = rng.integers(3)
        if kind == 0:
            fault.append(_at_fault(ego_speed=speed, ttc=ttc))
        elif kind == 1:
            clean.append(_not_at_fault(ego_speed=speed, ttc=ttc))
        else:
            clean.append(tr)
    assert fault and clean
    assert max(score(t) for t in fault) < min(score(t) for t in clean)


def test_at_fault_with_an_object_and_off_road_are_the_floor_too():
    obj = _trace(ego_speed=50.0, collided=True, at_fault=True, collisions=(_hit(30, True, AGENT_OTHER),))
    assert ns.nuplan_score_terms(obj, PARAMS)["score"] > 0.0  # nuPlan halves it only
    assert score(obj) == rw.SAFE_SCORE_FLOOR
    assert score(_trace(ego_speed=50.0, offroad=True, termination="offroad")) == rw.SAFE_SCORE_FLOOR


def test_progress_beyond_the_logs_adds_nothing():
    at_log = score(_trace(ego_speed=10.0))
    for faster in (10.5, 12.0, 20.0, 1.0e4):
        assert score(_trace(ego_speed=faster)) == pytest.approx(at_log)
        assert score(_not_at_fault(ego_speed=faster)) == pytest.approx(score(_not_at_fault(ego_speed=10.0)))


def test_monotone_in_progress_below_the_logs():
    speeds = np.linspace(2.5, 10.0, 16)  # progress ratio 0.25 .. 1 (above nuPlan's making-progress 0.2)
    values = [score(_trace(ego_speed=v)) for v in speeds]
    assert all(b > a for a, b in zip(values, values[1:]))
    slow = [score(_trace(ego_speed=v)) for v in np.linspace(0.0, 10.0, 41)]
    assert all(b >= a for a, b in zip(slow, slow[1:]))  # never falls with more progress, stopping included
    # the weighted average by hand: ratio 0.5, weights of params/sim.yaml, the other terms 1
    w_p, w_s, w_c = (float(CFG[k]) for k in ("weight_progress", "weight_speed_limit", "weight_comfort"))
    assert score(_trace(ego_speed=5.0)) == pytest.approx((0.5 * w_p + w_s + w_c) / (w_p + w_s + w_c))


def test_a_collision_that_was_not_the_egos_fault_lowers_the_reward():
    for v in (5.0, 10.0, 30.0):
        clean, hit = score(_trace(ego_speed=v)), score(_not_at_fault(ego_speed=v))
        assert 0.0 < hit < clean
        assert hit == pytest.approx(float(CFG["not_at_fault_collision_factor"]) * clean)


def test_a_ttc_below_the_near_miss_threshold_lowers_the_reward():
    tau = float(CFG["near_miss_ttc_s"])
    for v in (5.0, 10.0, 30.0):
        clean = score(_trace(ego_speed=v))
        assert score(_near_miss(ego_speed=v)) == pytest.approx(float(CFG["near_miss_factor"]) * clean)
        assert score(_near_miss(ego_speed=v)) < clean
        at_tau = np.full(41, 3.0)
        at_tau[20] = tau
        assert score(_trace(ego_speed=v, ttc=at_tau)) == pytest.approx(clean)  # not below: no near miss
    # both: the factors multiply
    both = _near_miss(collided=True, collisions=(_hit(40, False),))
    assert score(both) == pytest.approx(float(CFG["near_miss_factor"])
                                        * float(CFG["not_at_fault_collision_factor"]))


def test_comfort_is_a_weighted_term_inside_the_product():
    ego = _trace().ego.copy()
    ego[20:, 3] += 5.0  # a 5 m/s jump in one step: beyond every acceleration bound
    jerky = _trace(ego=ego)
    terms = rw.safe_score_terms(jerky, PARAMS)
    assert terms["comfort"] == 0.0
    w_p, w_s, w_c = (float(CFG[k]) for k in ("weight_progress", "weight_speed_limit", "weight_comfort"))
    assert terms["total"] == pytest.approx((w_p * terms["progress"] + w_s) / (w_p + w_s + w_c))
    near = rw.safe_score_terms(_near_miss(ego=ego), PARAMS)
    assert near["total"] == pytest.approx(float(CFG["near_miss_factor"]) * terms["total"])


def test_weights_that_sum_to_zero_are_refused():
    params = {**PARAMS, "rewards": {**PARAMS["rewards"], "safe_score": {
        **CFG, "weight_progress": 0.0, "weight_speed_limit": 0.0, "weight_comfort": 0.0}}}
    with pytest.raises(ValueError, match="rewards.safe_score"):
        score(_trace(), params)
