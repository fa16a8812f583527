"""Rollout engine: grouped rollouts from identical initial states, batching-independent seeds, what a
decision point records for RL, and Ray workers that return exactly what the single-process engine
returns (a real local Ray instance with 2 workers)."""

import numpy as np
import pytest
from bev_warp_sim.reference_policies import make_policy
from bev_warp_sim.rollout import PerRowPlanners, chunk_rows, decision_seed, expand_rows, run_rollouts
from bev_warp_sim.simulator import Simulator
from bev_warp_sim.trace import decision_intervals
from rad2_core.config import load_merged
from rad2_core.storage import load_dataset
from rad2_planner.policy import resolve_path

PARAMS = load_merged()
BEV = VEHICLE = PARAMS

CHECKPOINT = str(resolve_path("checkpoints/rad2_il"))


@pytest.fixture(scope="module")
def sim():
    return Simulator(PARAMS)


@pytest.fixture(scope="module")
def clips():
    return load_dataset(resolve_path("data/eval_safety"))[:3]


def test_groups_start_identically_and_chunks_keep_groups_whole(clips):
    rows = expand_rows(clips, group_size=4, start_steps=[0, 5, 10])
    assert [(r.group, r.member) for r in rows[:5]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert {r.start_step for r in rows if r.group == 1} == {5}
    chunks = chunk_rows(rows, batch_size=6)
    assert [len(c) for c in chunks] == [4, 4, 4]  # 6 rows would split a group of 4
    assert all(len({r.group for r in c}) == 1 for c in chunks)
    # a decision's seed is a function of its identity only
    assert decision_seed(0, 1, 2, 3) == decision_seed(0, 1, 2, 3) != decision_seed(0, 1, 2, 4)


def test_reference_policy_rollouts_do_not_depend_on_batch_size(sim, clips):
    decider = PerRowPlanners(lambda: make_policy("idm", PARAMS))
    a, stats = run_rollouts(sim, decider, clips, group_size=2, batch_size=2, max_steps=30)
    b, _ = run_rollouts(sim, decider, clips, group_size=2, batch_size=16, max_steps=30)
    assert stats.env_steps == sum(r.trace.num_steps for r in a)
    assert stats.decisions == sum(len(r.trace.decisions) for r in a)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.trace.ego, y.trace.ego)
        assert x.rewards == y.rewards
    # deterministic policy, identical initial states: the two members of a group drive identically
    np.testing.assert_array_equal(a[0].trace.ego, a[1].trace.ego)
    ivs = decision_intervals(a[0].trace)
    assert ivs[0].start_step == 0 and ivs[-1].end_step == a[0].trace.end_step
    assert all(iv.end_step - iv.start_step <= sim.h_reuse for iv in ivs)  # latched for at most H_reuse


@pytest.fixture(scope="module")
def uniform_spec():
    from rad2_training.workers import PolicySpec

    return PolicySpec(name="rad2", checkpoint_dir=CHECKPOINT, backend="onnxruntime", selection="sample",
                      distribution="uniform", record_discriminator_inputs=True, threads=1)


def test_sampled_group_members_diverge_and_decisions_hold_what_rl_needs(sim, clips, uniform_spec):
    decider = uniform_spec.build(PARAMS)
    m = decider.policy.num_candidates
    out, stats = run_rollouts(sim, decider, clips[:1], group_size=3, max_steps=24, seed=7,
                              rewards=["rad2", "laviplan"])
    assert stats.decisions >= 9 and [r.member for r in out] == [0, 1, 2]
    first = [r.trace.decisions[0] for r in out]
    np.testing.assert_array_equal(first[0].ego_state, first[1].ego_state)  # identical initial states
    assert len({d.seed for d in first}) == 3  # ... but their own noise and draws
    assert not np.allclose(out[0].trace.ego, out[1].trace.ego)
    for r in out:
        assert set(r.rewards) == {"rad2", "laviplan"}
        for d in r.trace.decisions:
            assert d.candidates.shape == (m, 8, 2) and 0 <= d.selected < m
            # executed: the selected candidate, or its re-timing along the same path: never ahead of it,
            # except where the plan-braking stage softened it (it may then run on past the path's end)
            from rad2_core.tokens import arc_lengths, project_onto_polyline

            path = np.vstack([[0.0, 0.0], d.candidates[d.selected]])
            along = arc_lengths(np.vstack([[0.0, 0.0], d.trajectory]))[1:]
            on_path = d.trajectory[along <= arc_lengths(path)[-1] + 1e-6]
            assert max((project_onto_polyline(path, q)[1] for q in on_path), default=0.0) < 1e-3
            if not d.info.get("plan_braking"):
                assert np.linalg.norm(d.trajectory[-1]) <= np.linalg.norm(path[-1]) + 1e-3
            assert d.log_prob == pytest.approx(-np.log(m)) and d.entropy == pytest.approx(np.log(m))
            inputs = d.discriminator_inputs
            assert inputs["bev_tokens"].ndim == 2 and inputs["agents"].shape[-1] == 10
            assert d.observation is None  # the 655 kB BEV is not kept unless asked for


def test_ray_workers_match_the_single_process_engine(sim, clips, uniform_spec):
    pytest.importorskip("ray")
    from rad2_training.workers import RolloutPool

    kwargs = dict(batch_size=4, seed=3, max_steps=20, rewards=["rad2"])
    local, local_stats = run_rollouts(sim, uniform_spec.build(PARAMS), clips, 2, **kwargs)
    with RolloutPool(uniform_spec, PARAMS, num_workers=2, address="") as pool:
        remote, remote_stats = pool.run(clips, 2, **kwargs)
    assert len(remote) == len(local) == 6
    assert remote_stats.env_steps == local_stats.env_steps
    for x, y in zip(local, remote):
        assert (x.group, x.member) == (y.group, y.member)
        assert [d.selected for d in x.trace.decisions] == [d.selected for d in y.trace.decisions]
        np.testing.assert_array_equal(x.trace.ego, y.trace.ego)
        assert x.rewards == y.rewards


def test_ray_workers_simulate_with_the_settings_they_are_given(clips, uniform_spec):
    """--sim-set of train_rl / rl_experiments reaches the workers: they must not reload params/sim.yaml."""
    pytest.importorskip("ray")
    from bev_warp_sim.simulator import Simulator
    from rad2_core.config import params_with_overrides
    from rad2_training.workers import RolloutPool

    sim_params, _ = params_with_overrides("sim", ["sim.max_steps=7", "sim.reactive_agents=true"])
    params = {**PARAMS, **sim_params}
    kwargs = dict(batch_size=4, seed=3, rewards=["rad2"])
    local, local_stats = run_rollouts(Simulator(params), uniform_spec.build(params), clips[:2], 2, **kwargs)
    with RolloutPool(uniform_spec, params, num_workers=2, address="") as pool:
        remote, remote_stats = pool.run(clips[:2], 2, **kwargs)
    assert remote_stats.env_steps == local_stats.env_steps == 4 * 7  # 2 clips x G = 2, 7 steps each
    for x, y in zip(local, remote):
        np.testing.assert_array_equal(x.trace.ego, y.trace.ego)


def test_curation_keeps_hard_clips_and_refuses_overlap_with_evaluation_sets(sim, tmp_path):
    from rad2_core.config import load_params
    from rad2_training.curation import CurationError, composition, judge, overlapping, write_sets

    pool = load_dataset(resolve_path("data/train"))
    pool = [c for c in pool if c.scenario_kind in ("hard_brake", "free_road")][:2] + pool[-1:]
    held_out = load_dataset(resolve_path("data/eval_efficiency"))[:2]
    assert overlapping(pool, held_out) == [] and overlapping(held_out[:1], held_out) == [held_out[0].clip_id]
    rollouts, _ = run_rollouts(sim, PerRowPlanners(lambda: make_policy("constant_velocity", PARAMS)), pool, 2,
                               max_steps=60, h_reuse=8)
    cfg = load_params("training")["curation"]
    verdicts = judge(pool, rollouts, cfg)
    for v, clip in zip(verdicts, pool):
        group = [r for r in rollouts if r.trace.clip_id == clip.clip_id]
        risky = any(r.result.collided or r.result.min_ttc < cfg["safety_max_min_ttc_s"] for r in group)
        assert v.keep_safety == (risky and clip.scenario_kind in cfg["safety_kinds"])
        assert not (v.keep_efficiency and clip.scenario_kind in cfg["safety_kinds"])
    assert sum(r["pool"] for r in composition(verdicts)) == len(pool)
    safety_dir, eff_dir = write_sets(pool, verdicts, tmp_path, held_out)
    kept = load_dataset(safety_dir) + load_dataset(eff_dir)
    assert {c.clip_id for c in kept} == {v.clip_id for v in verdicts if v.keep_safety or v.keep_efficiency}
    assert kept, "constant velocity into a hard-braking leader should be kept as safety-critical"
    with pytest.raises(CurationError, match="evaluation set"):  # a held-out clip in a written set
        write_sets(pool, verdicts, tmp_path / "again", held_out + kept[:1])


def test_new_weights_reach_a_workers_openvino_backend(clips):
    """RolloutWorker.set_weights re-exports the graphs and compiles them again on the worker's backend:
    the plans follow the new weights and equal PyTorch's on them."""
    import torch
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.observation import build_observation
    from rad2_planner.policy import Rad2Policy
    from rad2_training.workers import PolicySpec, RolloutWorker

    worker = RolloutWorker(PolicySpec(checkpoint_dir=CHECKPOINT, backend="openvino", threads=1), PARAMS)
    policy = worker.decider.policy
    obs = build_observation(snapshot_from_clip(clips[0], 10, BEV, VEHICLE), params=BEV)
    before = policy.plan(obs, seed=3).candidates
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with torch.no_grad():
        for key, value in weights.items():
            if key.startswith("denoiser.") and value.dtype.is_floating_point:
                value.mul_(1.05)
    worker.set_weights(weights)
    after = policy.plan(obs, seed=3).candidates
    assert policy.backend.name == "openvino" and np.abs(after - before).max() > 1e-3
    reference = Rad2Policy(policy.model, PARAMS, backend="pytorch").plan(obs, seed=3).candidates
    assert np.abs(after - reference).max() < 1e-4
