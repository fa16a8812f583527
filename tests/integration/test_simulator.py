"""Closed-loop simulator: replay fidelity, latched execution, batching, purity (branching, random action
sequences, pickling), reactive agents, rewards and metrics."""

import pickle
from dataclasses import replace

import numpy as np
import pytest
from bev_warp_sim import rewards as rw
from bev_warp_sim import simulator as simmod
from bev_warp_sim.metrics import EpisodeResult, aggregate
from bev_warp_sim.reference_policies import make_policy
from bev_warp_sim.rollout import PerRowPlanners, run_rollouts
from bev_warp_sim.simulator import Simulator
from bev_warp_sim.state import Controls, SimulationError
from bev_warp_sim.trace import EpisodeTrace, decision_intervals
from hypothesis import given, settings
from hypothesis import strategies as hs
from rad2_core.config import load_merged
from rad2_core.route_path import RoutePath
from synthetic_scenes import make_clip

PARAMS = load_merged()
BEV = PARAMS


@pytest.fixture(scope="module")
def sim():
    return Simulator(PARAMS)


@pytest.fixture(scope="module")
def clip():
    return make_clip()


def test_expert_replay_tracks_the_log(sim, clip):
    [ro], stats = run_rollouts(sim, PerRowPlanners(lambda: make_policy("expert", PARAMS)), [clip], h_reuse=1,
                               max_steps=60)
    res = ro.result
    track = ro.trace.ego
    assert stats.env_steps == 60 and stats.decisions == 60
    dev = np.hypot(track[:, 0] - clip.ego_x[: len(track)], track[:, 1] - clip.ego_y[: len(track)])
    assert res.termination == "max_steps" and not res.collided
    assert dev.max() < 0.2
    assert res.rho == pytest.approx(1.0, abs=0.02)


def test_observation_at_start_equals_logged_and_moves_with_ego(sim, clip):
    st = sim.init([clip], [10])
    obs = simmod.observe(st, simulator=sim)
    logged = sim.logged_observation(clip, 10)
    np.testing.assert_array_equal(obs.bev, logged.bev)
    np.testing.assert_allclose(obs.route, logged.route, atol=1e-5)
    st2, _ = simmod.step(st, Controls(np.tile([[0.0, 0.3]], (40, 1))), simulator=sim)
    for _ in range(5):
        st2, _ = simmod.step(st2, simulator=sim)
    obs2 = simmod.observe(st2, simulator=sim)
    assert obs2.ego_state[3] > 0.0  # the simulated steering shows in the ego state
    assert not np.allclose(obs2.bev, sim.logged_observation(clip, int(st2.t[0])).bev)


def test_latch_breaks_early_on_safety_violation(sim):
    clip = make_clip(num_steps=200)
    st = sim.init([clip], [60], max_steps=100)
    # full throttle towards the slower leader, latched for the whole horizon
    st = sim.commit(st, {0: Controls(np.tile([[3.0, 0.0]], (40, 1)))}, h_reuse=40)
    steps = 0
    while not sim.needs_decision(st)[0] and not st.done[0]:
        st, info = sim.step(st)
        steps += 1
    assert steps < 40, "the latch should have been cut short"
    assert st.break_reason[0] == "safety"
    assert st.ttc_track(0)[-1] < PARAMS["latch"]["ttc_break_s"]
    assert decision_intervals(sim.trace(st, 0))[0].end_step == st.t[0]


def test_latch_runs_h_reuse_steps_when_safe(sim, clip):
    st = sim.init([clip], [0])
    st = sim.commit(st, {0: Controls(np.zeros((40, 2)))})
    for _ in range(PARAMS["latch"]["h_reuse"]):
        assert not sim.needs_decision(st)[0]
        st, _ = sim.step(st)
    assert sim.needs_decision(st)[0] and st.break_reason[0] == "latch_done"
    with pytest.raises(SimulationError, match="no controls left"):
        sim.step(sim.init([clip], [0]))  # nothing committed yet


def test_batched_step_equals_single_steps(sim, clip):
    other = make_clip(clip_id="synthetic_1", ego_speed=8.0)
    clips, starts = [clip, other, clip], [0, 5, 30]
    rng = np.random.default_rng(3)
    controls = [Controls(rng.uniform([-2, -0.2], [2, 0.2], (40, 2))) for _ in clips]
    batch = sim.init(clips, starts)
    batch = sim.commit(batch, dict(enumerate(controls)))
    singles = [sim.commit(sim.init([c], [s]), {0: u}) for c, s, u in zip(clips, starts, controls)]
    for _ in range(6):
        batch, info = sim.step(batch)
        singles = [sim.step(s)[0] for s in singles]
    for i, s in enumerate(singles):
        np.testing.assert_allclose(batch.ego[i], s.ego[0], atol=1e-12)
        assert batch.t[i] == s.t[0]
        np.testing.assert_allclose(batch.ttc_track(i), s.ttc_track(0))
    obs_b = sim.observe(batch)
    obs_s = sim.observe(singles[1])[0]
    np.testing.assert_allclose(obs_b[1].bev, obs_s.bev, atol=1e-6)


def test_step_is_pure(sim, clip):
    st = sim.commit(sim.init([clip], [0]), {0: Controls(np.ones((40, 2)) * [1.0, 0.1])})
    ego0, t0, n_hist = st.ego.copy(), st.t.copy(), len(st.ego_hist)
    st2, _ = sim.step(st)
    np.testing.assert_array_equal(st.ego, ego0)
    np.testing.assert_array_equal(st.t, t0)
    assert len(st.ego_hist) == n_hist and len(st2.ego_hist) == n_hist + 1
    with pytest.raises(ValueError, match="read-only"):
        st.ego[0, 0] = 1.0  # states are values: their arrays cannot be written


def _drive(sim, state, controls, steps):
    """Commit ``controls`` at every decision and step ``steps`` times (or to the end)."""
    for _ in range(steps):
        if state.done.all():
            break
        need = np.flatnonzero(sim.needs_decision(state))
        if len(need):
            state = sim.commit(state, {int(b): controls for b in need})
        state, _ = sim.step(state)
    return state


def test_branched_continuations_do_not_see_each_other(sim):
    clip = make_clip(num_steps=200)
    root = _drive(sim, sim.init([clip], [50], max_steps=80), Controls(np.zeros((40, 2))), 10)
    root_bytes = pickle.dumps(root)
    root_decisions = root.decisions[0]
    # two continuations from ONE state: one brakes hard, one accelerates into the slower leader
    brake = _drive(sim, root, Controls(np.tile([[-3.0, 0.0]], (40, 1))), 100)
    speed = _drive(sim, root, Controls(np.tile([[3.0, 0.0]], (40, 1))), 100)
    assert pickle.dumps(root) == root_bytes  # the branch point is untouched
    assert root.decisions[0] is root_decisions
    n_root = len(root_decisions)
    assert brake.decisions[0][:n_root] == root_decisions and speed.decisions[0][:n_root] == root_decisions
    assert brake.decisions[0][n_root:] and speed.decisions[0][n_root:]
    assert not set(map(id, brake.decisions[0][n_root:])) & set(map(id, speed.decisions[0][n_root:]))
    tb, ts = sim.trace(brake, 0), sim.trace(speed, 0)
    assert ts.collided and not tb.collided
    rb, rs = rw.compute_rewards(tb, PARAMS), rw.compute_rewards(ts, PARAMS)
    assert rs["rad2_collision"] == -PARAMS["ttc"]["t_max"] and rb["rad2_collision"] > rs["rad2_collision"]
    # the branch's intervals end where its own next decision or its own end is
    ends = [iv.end_step for iv in decision_intervals(tb)]
    assert ends[-1] == tb.end_step and ends[: n_root - 1] == [d.step for d in root_decisions[1:]]
    # and the root continues exactly as before either branch ran
    again = _drive(sim, pickle.loads(root_bytes), Controls(np.tile([[-3.0, 0.0]], (40, 1))), 100)
    np.testing.assert_array_equal(sim.trace(again, 0).ego, tb.ego)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(hs.lists(hs.tuples(hs.floats(-6.0, 3.0), hs.floats(-0.4, 0.4), hs.integers(1, 12)), min_size=1,
                max_size=6))
def test_random_action_sequences_never_mutate_their_input(actions):
    sim = _PROPERTY_SIM
    state = sim.init([_PROPERTY_CLIP, _PROPERTY_CLIP], [30, 31], max_steps=40)
    for accel, rate, hold in actions:
        if state.done.all():
            break
        before = pickle.dumps(state)
        need = np.flatnonzero(sim.needs_decision(state))
        u = Controls(np.tile([[accel, rate]], (40, 1)))
        committed = sim.commit(state, {int(b): u for b in need}, h_reuse=hold) if len(need) else state
        stepped, _ = sim.step(committed)
        again, _ = sim.step(committed)
        assert pickle.dumps(state) == before
        assert pickle.dumps(stepped) == pickle.dumps(again)  # deterministic given the state
        assert len(stepped.ego_hist) == len(state.ego_hist) + 1
        state = stepped


_PROPERTY_SIM = Simulator(PARAMS)
_PROPERTY_CLIP = make_clip(num_steps=120)


def test_state_pickles_small_and_resumes_identically(sim, clip):
    st = _drive(sim, sim.init([clip], [0]), Controls(np.zeros((40, 2))), 20)
    blob = pickle.dumps(st)
    assert len(blob) < 64_000, f"a one-clip state pickles to {len(blob)} bytes"
    restored = pickle.loads(blob)
    a = _drive(sim, st, Controls(np.ones((40, 2)) * [0.5, 0.0]), 10)
    b = _drive(sim, restored, Controls(np.ones((40, 2)) * [0.5, 0.0]), 10)
    np.testing.assert_array_equal(a.ego, b.ego)
    with pytest.raises(SimulationError, match="not registered"):
        sim.step(replace(st, clip_keys=("nowhere#0",)))


def test_collision_ends_episode_with_attribution(sim, clip):
    pl = make_policy("constant_velocity", PARAMS)
    st = sim.init([clip], [60])
    st = sim.commit(st, {0: Controls(np.tile([[3.0, 0.0]], (40, 1)))}, h_reuse=40)
    while not st.done[0]:
        if sim.needs_decision(st)[0]:
            st = sim.commit(st, {0: pl.plan(sim.observe(st)[0])})
        st, _ = sim.step(st)
    res = sim.episode_result(st, 0)
    assert res.termination == "collision" and res.collided and res.at_fault
    assert res.collisions[0]["ego_zone"] == "front" and res.min_ttc == 0.0
    assert res.r_coll == -PARAMS["ttc"]["t_max"] and res.plan_r1 == 0.0


def _follower_clip():
    """The synthetic clip with agent 1 replaced by a car 12 m behind the ego in its lane."""
    c = make_clip()
    lag = 14
    j = 1
    ax, ay, ayaw = c.agent_x.copy(), c.agent_y.copy(), c.agent_yaw.copy()
    avx, avy, valid = c.agent_vx.copy(), c.agent_vy.copy(), c.agent_valid.copy()
    ax[j, lag:], ay[j, lag:], ayaw[j, lag:] = c.ego_x[:-lag], c.ego_y[:-lag], c.ego_yaw[:-lag]
    avx[j, lag:] = c.ego_speed[:-lag] * np.cos(c.ego_yaw[:-lag])
    avy[j, lag:] = c.ego_speed[:-lag] * np.sin(c.ego_yaw[:-lag])
    valid[j] = False
    valid[j, lag:] = True
    return replace(c, clip_id="follower", agent_x=ax, agent_y=ay, agent_yaw=ayaw, agent_vx=avx, agent_vy=avy,
                   agent_valid=valid)


def test_reactive_follower_brakes_for_a_stopping_ego():
    clip = _follower_clip()
    brake = Controls(np.tile([[-6.0, 0.0]], (40, 1)))
    results = {}
    for reactive in (False, True):
        params = {**PARAMS, "sim": {**PARAMS["sim"], "reactive_agents": reactive}}
        s = Simulator(params)
        st = s.commit(s.init([clip], [20], max_steps=50), {0: brake}, h_reuse=40)
        while not st.done[0]:
            if s.needs_decision(st)[0]:
                st = s.commit(st, {0: brake}, h_reuse=40)
            st, _ = s.step(st)
        results[reactive] = s.episode_result(st, 0)
    assert results[False].collided and not results[False].at_fault  # rear-ended while braking
    assert results[False].collisions[0]["ego_zone"] == "rear"
    assert not results[True].collided  # the IDM follower stops behind the ego


def test_rewards_match_the_paper():
    assert rw.r_coll([3.0, 2.5, 0.7, 3.0], 3.0) == pytest.approx(-2.3)
    assert rw.r_eff(1.07, 1.05, 1.10) == pytest.approx(1.0)
    assert rw.r_eff(0.9, 1.05, 1.10) == pytest.approx(0.85)
    assert rw.r_eff(1.3, 1.05, 1.10) == pytest.approx(0.8)
    assert rw.progress_ratio(5.0, 0.2, 1.0) == 1.0
    assert rw.progress_ratio(45.0, 50.0, 1.0) == pytest.approx(0.9)
    path = RoutePath(np.array([[0.0, 0.0], [10.0, 0.0], [10.0, 10.0]]))
    s, lat, _ = path.project(np.array([[5.0, 1.0], [11.0, 5.0]]))
    np.testing.assert_allclose(s, [5.0, 15.0])
    np.testing.assert_allclose(lat, [1.0, -1.0])


def test_plan_r1_gates_and_terms():
    base = dict(collided=False, drivable_ok=True, route_s=np.linspace(0, 40, 41), speeds=np.full(41, 10.0),
                speed_limits=np.full(41, 13.9), comfort_ok=True, min_ttc=3.0, rho=1.0, dt=0.1, params=PARAMS)
    assert rw.plan_r1_reward(**base)["total"] == pytest.approx(1.0)
    assert rw.plan_r1_reward(**{**base, "collided": True})["total"] == 0.0
    assert rw.plan_r1_reward(**{**base, "drivable_ok": False})["total"] == 0.0
    ttc_low = rw.plan_r1_reward(**{**base, "min_ttc": 0.5})
    assert ttc_low["total"] == pytest.approx(5.0 / 10.0)  # weights 2 + 5 + 2 + 1, TTC term lost
    backwards = np.concatenate([np.linspace(0, 10, 11), np.linspace(10, 6, 11)[1:]])  # 4 m back in 1 s
    assert rw.plan_r1_reward(**{**base, "route_s": backwards})["direction"] == 0.5
    fast = rw.plan_r1_reward(**{**base, "speeds": np.full(41, 13.9 + 2.23)})
    assert fast["speed_limit"] == pytest.approx(0.0)


def _result(**kw):
    base = dict(clip_id="c", scenario_kind="k", start_step=0, end_step=10, num_steps=10,
                termination="clip_end", collided=False, at_fault=False, offroad=False, min_ttc=3.0, rho=1.0,
                ego_progress_m=10.0,
                expert_progress_m=10.0, comfort_violation_rate=0.0, comfort_any=False, r_coll=0.0, r_eff=1.0,
                plan_r1=1.0)
    base.update(kw)
    return EpisodeResult(**base)


def test_metrics_definitions():
    results = [
        _result(),
        _result(collided=True, min_ttc=0.0, rho=0.5),
        _result(collided=True, at_fault=True, min_ttc=0.0, rho=0.3),
        _result(min_ttc=1.5, rho=0.995),
        _result(min_ttc=1.0, rho=0.92, comfort_any=True, comfort_violation_rate=0.1),
    ]
    m = aggregate(results, PARAMS)
    assert m["CR"] == pytest.approx(0.4)
    assert m["AF-CR"] == pytest.approx(0.2)
    assert m["Safety@1"] == pytest.approx(0.4)  # 3.0, 3.0... min TTC of exactly 1.0 does not count
    assert m["Safety@2"] == pytest.approx(0.2)
    assert m["EP-Mean"] == pytest.approx((1.0 + 0.5 + 0.3 + 0.995 + 0.92) / 5)
    assert m["EP@1.0"] == pytest.approx(0.4)  # 1.0 and 0.995 (tolerance 0.01)
    assert m["EP@0.9"] == pytest.approx(0.6)
    assert m["comfort_violation_clips"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="results"):
        aggregate([], PARAMS)


def _trace(n=11, ego_speed=9.0, lateral=0.0, ttc=None, **kw):
    """Straight drive along x: the ego at ``ego_speed`` (``lateral`` m to the left of the log), the log at
    10 m/s, 0.1 s steps; the route is the x axis."""
    k = np.arange(n)
    ego = np.zeros((n, 6))
    ego[:, 0], ego[:, 1], ego[:, 3] = ego_speed * k * 0.1, lateral, ego_speed
    expert_xy = np.stack([10.0 * k * 0.1, np.zeros(n)], -1)
    base = dict(clip_id="c", scenario_kind="slow_leader", dt=0.1, t_max=3.0, start_step=0, end_step=n - 1,
                window_end=n - 1, termination="clip_end", ego=ego,
                ttc=np.full(n, 3.0) if ttc is None else np.asarray(ttc, float), rear_ttc=np.full(n, 3.0),
                route_s=ego[:, 0].copy(),
                speed_limits=np.full(n, 13.9), expert_s=expert_xy[:, 0].copy(), expert_xy=expert_xy,
                collided=False, at_fault=False, offroad=False)
    base.update(kw)
    return EpisodeTrace(**base)


def test_reward_registry_hand_computed():
    tr = _trace(ttc=[3.0, 3.0, 2.5, 1.2] + [3.0] * 7)  # progress 9 m against the log's 10 m: rho = 0.9
    r = rw.compute_rewards(tr, PARAMS)
    assert set(r) == set(rw.REWARDS)
    assert r["rad2_collision"] == pytest.approx(1.2 - 3.0)  # Eq. 13: worst margin
    assert r["rad2_efficiency"] == pytest.approx((0.9 - 1.05) + 1.0)  # Eq. 14: below the window
    assert r["rad2"] == pytest.approx(-1.8 + 0.85)  # weights 1 and 1 in params/sim.yaml
    assert r["correction_planner"] == pytest.approx(0.9)
    # Plan-R1: gates pass; comfort, TTC (1.2 >= 0.95) and speed-limit terms 1, progress 0.9 (weights 2/5/2/1)
    assert r["plan_r1"] == pytest.approx((2 + 5 + 2 + 0.9) / 10)
    # LaViPlan against the log: 1 m to the side at the log's speed -> ADE = FDE = 1
    assert rw.reward_laviplan(_trace(ego_speed=10.0, lateral=1.0), PARAMS) == pytest.approx(-2 * np.log(2.0))
    assert rw.reward_laviplan(_trace(ego_speed=10.0), PARAMS) == pytest.approx(0.0)
    hit = _trace(collided=True, termination="collision")
    assert rw.reward_rad2_collision(hit, PARAMS) == -3.0
    # the follower margin: worst T^rear_t against T_max
    follow = _trace(ttc=[3.0, 3.0, 2.5, 1.2] + [3.0] * 7, rear_ttc=[0.2, 3.0, 0.9, 2.0] + [3.0] * 7)
    assert r["follower_margin"] == 0.0
    assert rw.reward_follower_margin(follow, PARAMS) == pytest.approx(0.9 - 3.0)  # step 0 is the log's
    assert rw.reward_follower_margin(hit, PARAMS) == -3.0
    assert rw.reward_rad2(follow, PARAMS) == pytest.approx(r["rad2"])  # the paper's reward ignores it
    assert r["rad2_follow"] == pytest.approx(r["rad2"])  # no follower closing in: nothing added
    weighted = {**PARAMS, "rewards": {**PARAMS["rewards"], "rad2_follow": {"weight_follower": 0.5}}}
    assert rw.reward_rad2_follow(follow, weighted) == pytest.approx(r["rad2"] + 0.5 * (0.9 - 3.0))
    assert rw.reward_correction_planner(hit, PARAMS) == -1.0 and rw.reward_plan_r1(hit, PARAMS) == 0.0
    fast = _trace(ego_speed=11.5)  # rho = 1.15: above the window
    assert rw.reward_rad2_efficiency(fast, PARAMS) == pytest.approx(1.10 - 1.15 + 1.0)
    assert rw.reward_correction_planner(fast, PARAMS) == 1.0  # progress capped at 1
    with pytest.raises(ValueError, match="unknown reward"):
        rw.compute_rewards(tr, PARAMS, ["made_up"])


def test_observation_at_a_decision_is_what_the_policy_saw(sim):
    """A trainer re-renders a decision's observation from what the decision point records."""
    clip = make_clip(num_steps=200)
    seen = {}

    class Recorder:
        name = "recorder"

        def reset(self, clip=None, start_step=0, seed=None):
            pass

        def plan(self, obs):
            seen[len(seen)] = obs
            return make_policy("constant_velocity", PARAMS).plan(obs)

    [ro], _ = run_rollouts(sim, PerRowPlanners(Recorder), [clip], start_steps=30, max_steps=40, h_reuse=8)
    for k, d in enumerate(ro.trace.decisions):
        again = sim.observation_at(clip, d.step, d.ego_state, d.accel)
        np.testing.assert_array_equal(again.bev, seen[k].bev)
        np.testing.assert_array_equal(again.ego_state, seen[k].ego_state)
        np.testing.assert_array_equal(again.agents, seen[k].agents)


def test_route_that_doubles_back_is_refused_naming_clip_and_place():
    """EP measures progress along the route; a route that reverses (an old lane-change stitch went
    forward, back and forward again) would count a stretch twice, so the simulator refuses the clip."""
    from synthetic_scenes import make_clip

    clip = make_clip(num_steps=30, clip_id="zigzag")
    route = np.array([[0.0, 0.0], [40.0, 0.0], [35.0, 3.5], [120.0, 3.5]])
    bad = replace(clip, route_polyline=route)
    with pytest.raises(SimulationError, match=r"'zigzag'.*doubles back at point 1 \(40.0, 0.0\)"):
        Simulator(PARAMS).init(bad)
    assert RoutePath(clip.route_polyline).reversal(120.0) is None  # a real route passes


def test_plan_consistency_is_the_planned_speed_change_between_cycles():
    """Two plans 0.5 s apart at 10 and 12 m/s: 2 m/s change wherever both are defined; a third plan
    equal to the second (shifted): no change. Plans without a time step are skipped."""
    from types import SimpleNamespace

    from bev_warp_sim.trace import DecisionPoint

    def plan(v, n=8, dt=0.5):
        return np.stack([v * dt * (np.arange(n) + 1), np.zeros(n)], -1)

    ego = np.zeros(5)
    decisions = (DecisionPoint(0, ego, 0.0, "start", trajectory=plan(10.0), info={"plan_dt": 0.5}),
                 DecisionPoint(5, ego, 0.0, "latch_done", trajectory=plan(12.0), info={"plan_dt": 0.5}))
    trace = SimpleNamespace(dt=0.1, decisions=decisions)
    assert rw.episode_plan_consistency(trace) == pytest.approx(2.0)
    third = DecisionPoint(10, ego, 0.0, "latch_done", trajectory=plan(12.0), info={"plan_dt": 0.5})
    same = decisions + (third,)
    assert rw.episode_plan_consistency(SimpleNamespace(dt=0.1, decisions=same)) == pytest.approx(1.0)
    assert np.isnan(rw.episode_plan_consistency(SimpleNamespace(dt=0.1, decisions=decisions[:1])))


def test_a_lagging_ego_sees_a_rendered_bev_where_a_warp_would_be_blank(clip):
    """20 m behind the logged ego, the simulated ego's own cell lies outside the logged raster: the pure
    warp (warp_max_uncovered 1.0, the paper's BEV-Warp) shows it a blank road; with 0.1 the scene is
    rendered at its pose, and its map layers equal the log's own at the step the log was there."""
    from bev_warp_sim.warp import view_uncovered_fraction
    from rad2_core.bev import get_config

    cfg = get_config(BEV)
    t_log, t_behind = 60, 40  # the log moves 10 m/s: 20 m behind
    st = Simulator(PARAMS).init([clip], [t_log])
    ego = np.array(st.ego)
    ego[0, :3] = clip.ego_pose(t_behind)
    lagging = replace(st, ego=ego)
    assert view_uncovered_fraction(cfg, clip.ego_pose(t_log)[None], ego[:, :3])[0] > 0.25
    channels = [cfg.channel_index(c) for c in ("drivable_area", "lane_centerline", "route")]
    here = (int(-cfg.origin_y / cfg.resolution), int(-cfg.origin_x / cfg.resolution))  # the ego's cell

    warp_params = {**PARAMS, "sim": {**PARAMS["sim"], "warp_max_uncovered": 1.0}}
    warped = simmod.observe(lagging, simulator=Simulator({**PARAMS, **warp_params}))
    assert warped.bev[channels[0]][here] == 0.0  # the blank the lagging ego used to stand on

    default = Simulator({**PARAMS, "sim": {**PARAMS["sim"], "warp_max_uncovered": 0.1}})
    rendered = simmod.observe(lagging, simulator=default)
    logged_there = default.logged_observation(clip, t_behind)
    np.testing.assert_allclose(rendered.bev[channels], logged_there.bev[channels], atol=1e-6)
    assert rendered.bev[channels[0]][here] == 1.0
    # the agents are those of the simulated step, not of the step the log was there
    agents = cfg.channel_index("agents_t0")
    assert not np.array_equal(rendered.bev[agents], logged_there.bev[agents])
    with pytest.raises(SimulationError, match="sim.warp_max_uncovered: 1.5"):
        Simulator({**PARAMS, "sim": {**PARAMS["sim"], "warp_max_uncovered": 1.5}})


def test_an_ego_at_the_end_of_its_route_completes_it_rather_than_leaving_the_road():
    """A recorded route ends where the map does; the clip's log runs on past it (here off the map).
    Reaching the route's end ends the episode as completed (route_end, full progress, not off-road);
    without that rule the same drive goes on beyond the mapped road."""
    clip = make_clip(num_steps=220)
    out = {}
    for flag in (True, False):
        params = load_merged()
        params["sim"]["terminate_at_route_end"] = flag
        [ro], _ = run_rollouts(Simulator(params), PerRowPlanners(lambda p=params: make_policy("expert", p)),
                               [clip], start_steps=[150], h_reuse=1)
        out[flag] = ro.result
    done = out[True]
    assert done.termination == "route_end" and not done.offroad and not done.collided
    assert done.rho == pytest.approx(1.0, abs=0.01)
    assert done.end_step < clip.num_steps - 1
    assert out[False].termination != "route_end" and out[False].end_step > done.end_step
