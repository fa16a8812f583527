"""Safety layer: the simulator-based labeller, the collision critic (checkpoint, ONNX parity) and the two
baselines of the planner's safety stage (candidate selection, rejection sampling); mode off changes
nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from rad2_core.config import ParameterError, load_merged, load_params, validate_overrides
from rad2_core.open_loop_metrics import vehicle_max_curvature
from rad2_planner.networks.critic import (
    CRITIC_INPUTS,
    CollisionCritic,
    CriticCheckpointError,
    CriticConfig,
    CriticRunner,
    critic_example_inputs,
    ensure_critic_onnx,
)
from rad2_planner.policy import Rad2Policy
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.onnx_export import example_inputs
from rad2_planner.safety_layer import SafetyLayerParams, next_round_fits
from rad2_training.critic_data import CriticDataset, label_candidates, warning_statistics
from synthetic_scenes import make_clip
from tiny_models import randomised_model, tiny_config

PARAMS = load_merged()
# the dataclass as the file gives it, without the round budget (closed loop takes every round)
KAPPA = vehicle_max_curvature(PARAMS)
LAYER = replace(SafetyLayerParams.from_params(PARAMS), round_budget_ms=None)

ROOT = Path(__file__).resolve().parents[2]


def _straight(speed: float, plan_points: int = 8, plan_dt: float = 0.5) -> np.ndarray:
    t = (np.arange(plan_points) + 1.0) * plan_dt
    return np.stack([speed * t, np.zeros_like(t)], -1)


# ----------------------------------------------------------------------------------------------------
# labels


def test_labeller_marks_driving_into_the_leader_and_staying_behind():
    """make_clip: ego at x = 20 m heading +x; a 4.6 m leader at x = 45 m drives 8 m/s in the same lane.
    At 20 m/s the ego's front (x + 2.4) meets the leader's rear (45 + 8 t - 2.3) at t = 20.3 / 12 = 1.69 s;
    at 5 m/s it falls behind and nothing else is in its lane."""
    clip = make_clip(ego_speed=10.0)
    pose = np.array([clip.ego_x[0], clip.ego_y[0], clip.ego_yaw[0]])
    cands = np.stack([_straight(20.0), _straight(5.0)])
    collides, ttc, complete = label_candidates(cands, 0.5, pose, clip, 0, horizon_s=4.0, max_curvature=KAPPA)
    assert complete
    assert collides.tolist() == [True, False]
    assert ttc[0] == pytest.approx(1.7, abs=1e-9) and np.isinf(ttc[1])  # first overlapping 0.1 s step
    # within a 1.5 s horizon the fast candidate is still clear of the leader
    assert not label_candidates(cands, 0.5, pose, clip, 0, horizon_s=1.5, max_curvature=KAPPA)[0].any()
    # near the clip's end the horizon is not logged: reported incomplete
    assert not label_candidates(cands, 0.5, pose, clip, clip.num_steps - 10, horizon_s=4.0,
                                max_curvature=KAPPA)[2]


def test_labeller_errors_name_the_field():
    clip = make_clip()
    with pytest.raises(ValueError, match="candidates"):
        label_candidates(np.zeros((3, 8)), 0.5, np.zeros(3), clip, 0, 4.0, max_curvature=KAPPA)
    with pytest.raises(ValueError, match="horizon_s"):
        label_candidates(np.zeros((1, 8, 2)), 0.5, np.zeros(3), clip, 0, 5.0, max_curvature=KAPPA)


def test_warning_statistics_on_a_hand_made_set():
    """Two decisions of one rollout that collides at step 20: precision, recall and lead times."""
    m = 2
    data = CriticDataset(
        trajectories=np.zeros((2, m, 8, 2), np.float32),
        agents=np.zeros((2, 3, 10), np.float32),
        agents_mask=np.zeros((2, 3), bool),
        ego_state=np.zeros((2, 4), np.float32),
        collides=np.array([[True, False], [True, True]]),
        ttc=np.array([[2.0, np.inf], [1.0, 0.5]], np.float32),
        selected=np.array([0, 1]),
        step=np.array([0, 10]),
        rollout=np.array([0, 0]),
        rollout_collision_step=np.array([20, 20]),
        clip_ids=["c"],
        meta={"clip_dt": 0.1, "horizon_s": 4.0},
    )
    probs = np.array([[0.8, 0.6], [0.2, 0.95]])
    s = warning_statistics(probs, data, (0.5, 0.9))["thresholds"]
    assert s["0.5"]["candidates"]["precision"] == pytest.approx(2 / 3)
    assert s["0.5"]["candidates"]["recall"] == pytest.approx(2 / 3)
    assert s["0.5"]["candidates"]["mean_lead_s"] == pytest.approx((2.0 + 0.5) / 2)
    assert s["0.9"]["executed"]["recall"] == pytest.approx(0.5)
    # the executed plan was flagged at step 0 (p = 0.8) and step 10: first warning 2.0 s before step 20
    assert s["0.5"]["events"] == {
        "detected": 1,
        "of": 1,
        "recall": 1.0,
        "mean_first_warning_lead_s": pytest.approx(2.0),
    }
    assert s["0.9"]["events"]["mean_first_warning_lead_s"] == pytest.approx(1.0)


def _dataset(d: int, clip_ids: list[str], collision_step: int = -1) -> CriticDataset:
    return CriticDataset(
        trajectories=np.zeros((d, 2, 8, 2), np.float32),
        agents=np.zeros((d, 3, 10), np.float32),
        agents_mask=np.zeros((d, 3), bool),
        ego_state=np.zeros((d, 4), np.float32),
        collides=np.zeros((d, 2), bool),
        ttc=np.full((d, 2), np.inf, np.float32),
        selected=np.zeros(d, np.int32),
        step=np.arange(d, dtype=np.int32),
        rollout=np.zeros(d, np.int32),
        rollout_collision_step=np.full(d, collision_step, np.int32),
        clip_ids=clip_ids,
        meta={"horizon_s": 4.0},
    )


def test_dataset_concatenate_offsets_rollouts_and_round_trips(tmp_path):
    empty = _dataset(0, ["b"])  # a chunk whose decisions all ran past its clip's end still counts its clip
    data = CriticDataset.concatenate([_dataset(2, ["a"]), empty, _dataset(3, ["c"], collision_step=9)])
    assert data.clip_ids == ["a", "b", "c"] and data.rollout.tolist() == [0, 0, 2, 2, 2]
    assert data.summary()["rollouts_with_collision"] == 1
    again = CriticDataset.load(data.save(tmp_path / "d.npz"))
    assert again.clip_ids == data.clip_ids and again.meta == data.meta
    assert all(
        np.array_equal(getattr(again, k), getattr(data, k)) for k in ("trajectories", "ttc", "rollout")
    )
    with pytest.raises(ValueError, match="does not exist"):
        CriticDataset.load(tmp_path / "none.npz")


# ----------------------------------------------------------------------------------------------------
# the critic network


def _tiny_critic_cfg() -> CriticConfig:
    return CriticConfig(d_model=16, num_heads=2, num_blocks=1, max_agents=4)


def test_checkpoint_round_trip_and_errors(tmp_path):
    torch.manual_seed(0)
    critic = CollisionCritic(_tiny_critic_cfg()).eval()
    critic.save(tmp_path / "c", {"seed": 0})
    again = CollisionCritic.load(tmp_path / "c")
    ex = critic_example_inputs(critic.cfg, batch=2, m=3, n=6)
    args = [torch.from_numpy(ex[k]) for k in CRITIC_INPUTS]
    assert torch.equal(critic(*args)[0], again(*args)[0]) and again.training_info == {"seed": 0}
    with pytest.raises(CriticCheckpointError, match="no config.json"):
        CollisionCritic.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="CriticConfig.horizon_s"):
        CriticConfig(horizon_s=5.0)


def test_onnx_export_matches_pytorch_for_b_by_m_candidates(tmp_path):
    torch.manual_seed(1)
    critic = CollisionCritic(_tiny_critic_cfg()).eval()
    with torch.no_grad():  # a random head is near-constant; spread it so a mismatch would show
        critic.head[-1].weight.mul_(20.0)
    path = ensure_critic_onnx(critic, tmp_path)
    mtime = path.stat().st_mtime_ns
    assert ensure_critic_onnx(critic, tmp_path).stat().st_mtime_ns == mtime  # cached: not exported again
    pt = CriticRunner(critic, "pytorch", PARAMS["runtime"])
    ox = CriticRunner(critic, "onnxruntime", PARAMS["runtime"], onnx_dir=tmp_path)
    for b, m, n in ((1, 32, 3), (3, 7, 9)):  # other sizes than the export's example (2, 3, 5)
        ex = critic_example_inputs(critic.cfg, batch=b, m=m, n=n, seed=b)
        (lg_pt, p_pt), (lg_ox, p_ox) = (
            pt(*(ex[k] for k in CRITIC_INPUTS)),
            ox(*(ex[k] for k in CRITIC_INPUTS)),
        )
        assert lg_pt.shape == lg_ox.shape == p_ox.shape == (b, m)
        assert np.abs(lg_pt - lg_ox).max() < 1e-4 and np.abs(p_pt - p_ox).max() < 1e-5
        assert lg_pt.std() > 1e-3  # the outputs do depend on the inputs
    with pytest.raises(ValueError, match="trajectories"):
        pt(np.zeros((1, 2, 5, 2)), ex["agents"][:1], ex["agents_mask"][:1], ex["ego_state"][:1])


def test_masked_agents_do_not_change_the_prediction():
    torch.manual_seed(2)
    critic = CollisionCritic(_tiny_critic_cfg()).eval()
    ex = critic_example_inputs(critic.cfg, batch=1, m=4, n=4)
    ex["agents_mask"][:] = [[True, True, False, False]]
    args = {k: torch.from_numpy(v) for k, v in ex.items()}
    base = critic(*(args[k] for k in CRITIC_INPUTS))[0]
    args["agents"][0, 2:] = torch.randn(2, 10) * 50  # what a padded slot holds does not matter
    assert torch.allclose(base, critic(*(args[k] for k in CRITIC_INPUTS))[0], atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# the planner's safety stage


class ScriptedCritic(CollisionCritic):
    """A critic whose risk is a fixed function of the candidate (how far it ends forward), so a test
    knows which candidates it rejects; counts its calls."""

    def __init__(self, offset: float = 0.0):
        super().__init__(CriticConfig(d_model=8, num_heads=2, num_blocks=1))
        self.offset = offset
        self.calls = 0

    def logits(self, trajectories, agents, agents_mask, ego_state):
        self.calls += 1
        return trajectories[..., -1, 0] - self.offset


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model = randomised_model(tiny_config())
    model.discriminator_trained = True
    ex = example_inputs(model.cfg, batch=3, seed=4)
    return model, {k: ex[k] for k in SCENE_INPUTS}


def _policy(model, tmp_path, critic=None, **safety):
    layer = replace(LAYER, **safety) if safety else replace(LAYER, mode="off")
    return Rad2Policy(model, PARAMS, backend="pytorch", onnx_dir=tmp_path, safety_layer=layer, critic=critic,
                      num_candidates=16)


def _risk(critic, result):
    return 1.0 / (1.0 + np.exp(-(result.candidates[:, -1, 0] - critic.offset)))


def _safe_among(policy, observation, result, allowed):
    """Of the candidates ``allowed``, those the discriminator ranks: its safe set (planner.
    discriminator_candidates: safe) among them, or all of them where none of them is in it."""
    from rad2_planner.candidates import observation_inputs

    inputs = observation_inputs(observation, policy.cfg, policy.observation_channels)
    mask = policy.discriminator_mask(result.candidates[None], inputs)
    both = allowed if mask is None else allowed[mask[0, allowed]]
    return both if len(both) else allowed


def test_mode_off_leaves_plan_batch_unchanged_and_loads_no_critic(tiny, tmp_path):
    model, obs = tiny
    off = _policy(model, tmp_path, critic_checkpoint=str(tmp_path / "nowhere"), mode="off")  # never read
    plain = Rad2Policy(model, PARAMS, backend="pytorch", onnx_dir=tmp_path,
                       num_candidates=16)  # planner.yaml: off
    assert plain.safety.mode == "off"
    a, b = off.plan_batch(obs, seeds=[1, 2, 3]), plain.plan_batch(obs, seeds=[1, 2, 3])
    for ra, rb in zip(a, b):
        assert np.array_equal(ra.candidates, rb.candidates) and ra.selected == rb.selected
        assert "critic" not in ra.timings_ms and "corrections" not in ra.info
    # a critic that accepts everything changes nothing either (only adds its diagnostics)
    lenient = ScriptedCritic(offset=1e6)
    for mode in ("candidate_selection", "rejection_sampling"):
        res = _policy(model, tmp_path, lenient, mode=mode, threshold=0.5).plan_batch(obs, seeds=[1, 2, 3])
        for r, ref in zip(res, a):
            assert np.array_equal(r.candidates, ref.candidates) and r.selected == ref.selected, mode
            assert r.info["corrections"] == 0 and "critic" in r.timings_ms


def test_candidate_selection_never_picks_a_rejected_candidate_when_one_is_accepted(tiny, tmp_path):
    model, obs = tiny
    base = _policy(model, tmp_path)
    for i in range(3):
        row = {k: v[i : i + 1] for k, v in obs.items()}
        for seed in range(3):
            r0 = base.plan(row, seed=seed)
            # reject the candidates ending beyond the median forward distance
            critic = ScriptedCritic(offset=float(np.median(r0.candidates[:, -1, 0])))
            r = _policy(model, tmp_path, critic, mode="candidate_selection", threshold=0.5).plan(
                row, seed=seed
            )
            assert np.array_equal(r.candidates, r0.candidates)
            p = _risk(critic, r)
            accepted = np.flatnonzero(p < 0.5)
            assert len(accepted) > 0 and r.selected in accepted
            # the policy's own rule among the accepted ones: the highest discriminator logit (of the
            # safe set among them, as always)
            ranked = _safe_among(base, row, r, accepted)
            assert r.selected == ranked[np.argmax(r.logits[ranked])]
            assert r.info["corrections"] == int(r.selected != r0.selected)
            assert r.info["critic_p"] == pytest.approx(p[r.selected], abs=1e-6)
    # nothing accepted (threshold 0): the least risky candidate
    critic = ScriptedCritic()
    r = _policy(model, tmp_path, critic, mode="candidate_selection", threshold=0.0).plan_batch(obs, seed=0)[0]
    assert r.selected == int(np.argmin(_risk(critic, r))) and not r.info["critic_accepted"]


def test_rejection_sampling_stops_at_max_rounds_and_keeps_the_least_risky(tiny, tmp_path):
    model, obs = tiny
    critic = ScriptedCritic()
    pol = _policy(model, tmp_path, critic, mode="rejection_sampling", threshold=0.0, max_rounds=3)
    res = pol.plan_batch(obs, seeds=[5, 6, 7])
    assert critic.calls == 1 + 3  # the first proposal, then one call per round for the rejected rows
    first = _policy(model, tmp_path).plan_batch(obs, seeds=[5, 6, 7])
    for i, (r, f) in enumerate(zip(res, first)):
        assert r.info["corrections"] == 3 and not r.info["critic_accepted"]
        # the executed proposal is no riskier than the first one, and it is its set's own selection
        assert r.info["critic_p"] <= _risk(critic, f)[f.selected] + 1e-9
        assert r.info["critic_p"] == pytest.approx(_risk(critic, r)[r.selected], abs=1e-6)
        row = {k: v[i : i + 1] for k, v in obs.items()}
        ranked = _safe_among(pol, row, r, np.arange(len(r.logits)))
        assert r.selected == int(ranked[np.argmax(r.logits[ranked])])
        assert r.timings_ms["corrections"] > 0.0
    # deterministic: the same seeds give the same redraws
    again = pol.plan_batch(obs, seeds=[5, 6, 7])
    assert all(np.array_equal(a.candidates, b.candidates) for a, b in zip(res, again))
    # a row is resampled only while it is rejected: with a threshold between the proposals' risks some
    # rows stop early, and no row ever exceeds max_rounds
    mid = float(np.median([_risk(critic, f)[f.selected] for f in first]))
    res = _policy(model, tmp_path, critic, mode="rejection_sampling", threshold=mid, max_rounds=2).plan_batch(
        obs, seeds=[5, 6, 7]
    )
    for r, f in zip(res, first):
        assert 0 <= r.info["corrections"] <= 2
        if _risk(critic, f)[f.selected] < mid:
            assert r.info["corrections"] == 0 and np.array_equal(r.candidates, f.candidates)


def test_rejection_sampling_budget_stops_the_rounds_and_keeps_the_least_risky(tiny, tmp_path):
    """A budget no cycle can meet runs no extra round: the first proposal (the least risky seen) is
    executed, flagged and counted; a budget every cycle meets behaves exactly as no budget."""
    model, obs = tiny
    first = _policy(model, tmp_path).plan_batch(obs, seeds=[5, 6, 7])
    critic = ScriptedCritic()
    tight = _policy(model, tmp_path, critic, mode="rejection_sampling", threshold=0.0, max_rounds=3,
                    round_budget_ms=1e-6)
    res = tight.plan_batch(obs, seeds=[5, 6, 7])
    assert critic.calls == 1  # the first proposal only: no round started
    assert tight.budget_stop_count == 3
    for r, f in zip(res, first):
        assert r.info["corrections"] == 0 and r.info["safety_stopped_by_budget"]
        assert not r.info["critic_accepted"]
        assert np.array_equal(r.candidates, f.candidates) and r.selected == f.selected
        assert r.info["critic_p"] == pytest.approx(_risk(critic, f)[f.selected], abs=1e-6)
        assert r.timings_ms["corrections"] == 0.0
    # a large budget and no budget give the same plans (and max_rounds still ends the rounds)
    for threshold in (0.0, float(np.median([_risk(critic, f)[f.selected] for f in first]))):
        runs = []
        for budget in (None, 1e9):
            c = ScriptedCritic()
            pol = _policy(model, tmp_path, c, mode="rejection_sampling", threshold=threshold, max_rounds=3,
                          round_budget_ms=budget)
            runs.append((pol.plan_batch(obs, seeds=[5, 6, 7]), c.calls, pol.budget_stop_count))
        (a, calls_a, stops_a), (b, calls_b, stops_b) = runs
        assert calls_a == calls_b and stops_a == stops_b == 0
        for ra, rb in zip(a, b):
            assert np.array_equal(ra.candidates, rb.candidates) and ra.selected == rb.selected
            assert np.array_equal(ra.executed, rb.executed)
            assert ra.info["corrections"] == rb.info["corrections"]
            assert ra.info["critic_p"] == rb.info["critic_p"]
            assert not ra.info["safety_stopped_by_budget"] and not rb.info["safety_stopped_by_budget"]
    # rows the critic accepts are never flagged, even when the budget is spent
    lenient = _policy(model, tmp_path, ScriptedCritic(offset=1e6), mode="rejection_sampling",
                      round_budget_ms=1e-6)
    assert not any(r.info["safety_stopped_by_budget"] for r in lenient.plan_batch(obs, seeds=[5, 6, 7]))
    assert lenient.budget_stop_count == 0


def test_next_round_fits_uses_the_costliest_round_so_far():
    assert next_round_fits(30.0, [25.0], 60.0)  # 55 <= 60
    assert not next_round_fits(30.0, [25.0, 31.0], 60.0)  # the costliest round decides
    assert next_round_fits(60.0, [0.0], 60.0)  # a round may end exactly at the budget
    assert next_round_fits(1e9, [1e9], None)  # no budget


def test_safety_layer_parameters_are_checked():
    with pytest.raises(ValueError, match="safety_layer.mode"):
        replace(LAYER, mode="maybe")
    # the threshold and the rounds are bounded by the schema, where the file or an override is read
    with pytest.raises(ParameterError, match=r"safety_layer.threshold = 1.5 is above"):
        validate_overrides("planner", {"safety_layer.threshold": 1.5})
    with pytest.raises(ParameterError, match=r"safety_layer.max_rounds = 0 is below"):
        validate_overrides("planner", {"safety_layer.max_rounds": 0})
    for bad in (0.0, -5.0, float("nan"), float("inf"), "fast", True):
        with pytest.raises(ValueError, match=r"safety_layer.round_budget_ms: .*" + re.escape(repr(bad))):
            replace(LAYER, mode="rejection_sampling", round_budget_ms=bad)
    sl = {"mode": "rejection_sampling", "threshold": 0.5, "max_rounds": 3, "critic_checkpoint": "x",
          "correction_checkpoint": "y"}
    with pytest.raises(ValueError, match="safety_layer.round_budget_ms: 'soon'"):
        SafetyLayerParams.from_params({"safety_layer": {**sl, "round_budget_ms": "soon"}})
    # the file's budget; a params dict written before the key existed is refused, naming it
    file_budget = load_params("planner")["safety_layer"]["round_budget_ms"]
    assert SafetyLayerParams.from_params(load_params("planner")).round_budget_ms == file_budget
    with pytest.raises(ParameterError,
                       match=r"planner.yaml: missing key safety_layer.round_budget_ms \(older"):
        SafetyLayerParams.from_params({"safety_layer": sl})
    assert replace(LAYER, round_budget_ms=None).round_budget_ms is None  # set in code: no budget


def test_a_missing_critic_checkpoint_fails_at_construction(tiny, tmp_path):
    model, _ = tiny
    with pytest.raises(CriticCheckpointError, match="rad2 train critic"):
        _policy(model, tmp_path, mode="candidate_selection", critic_checkpoint=str(tmp_path / "none"))


@pytest.mark.parametrize("verb", ["train critic", "eval safety-layer"])
def test_cli_help(verb, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "rad2_bringup.cli", *verb.split(), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------------
# the planner node: the layer's timings and corrections in its diagnostics (in process, no spinning)


@pytest.fixture
def planner_node(monkeypatch):
    from ros_process import import_ros_messages, require_ros_build, unique_domain_id

    require_ros_build()
    import_ros_messages()
    import rclpy
    from rad2_ros.nodes.planner_node import PlannerNode

    monkeypatch.setenv("ROS_DOMAIN_ID", str(unique_domain_id()))
    overrides = {
        "planner.backend": "pytorch",  # no ONNX export: the test is about the node's reports
        "planner.num_candidates": 8,
        "planner.num_denoise_steps": 2,
        # the planner the shipped self-correcting generator was fine-tuned from (it shares its encoder)
        "planner.checkpoint_dir": "checkpoints/rad2_rl",
        "safety_layer.mode": "rejection_sampling",
        "safety_layer.threshold": 0.0,  # every proposal rejected: each cycle runs its rounds
        "safety_layer.max_rounds": 1,
        "safety_layer.round_budget_ms": 10000.0,  # no budget cut: the round count is exact
    }
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    args = ["--ros-args"] + [a for k, v in overrides.items() for a in ("-p", f"{k}:={v}")]
    node = PlannerNode(context=ctx, cli_args=args, start_parameter_services=False)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def test_planner_node_reports_the_safety_layer_in_its_diagnostics(planner_node):
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.observation import build_observation
    from rad2_ros import conversions as rc

    node = planner_node
    assert node.policy.safety.mode == "rejection_sampling"  # safety_layer.* are node parameters
    assert node.policy.safety.round_budget_ms == 10000.0
    diags, statuses = [], []
    node.pub_diag.publish = lambda m: diags.append(rc.planning_diagnostics_from_msg(m))
    node.diagnostics.publish = lambda level, message, values=None: statuses.append(dict(values or {}))
    params = {**load_params("bev"), **load_params("vehicle")}
    grid = rc.BevGrid.from_params(params["bev"])
    clip = make_clip(num_steps=20)
    obs = build_observation(snapshot_from_clip(clip, 10, params, params), params=params)

    def cycle():
        stamp = node._now_ns()
        node.cycle(rc.bev_to_msg(obs.bev, grid, list(params["bev"]["channels"]), stamp),
                   rc.scene_tokens_to_msg(rc.SceneTokenArrays.from_observation(obs, stamp)))
        return diags[-1], statuses[-1]

    diag, values = cycle()
    for stage in ("encode", "score", "select", "critic", "corrections", "traffic_rules", "comfort_limits",
                  "drivable_area", "publish"):
        assert stage in diag["stages"], (stage, list(diag["stages"]))
    assert diag["stages"]["critic"] > 0.0 and diag["stages"]["corrections"] > 0.0
    assert values["safety_layer"] == "rejection_sampling"
    assert values["corrections"] == 1 and values["critic_accepted"] is False
    assert 0.0 <= float(values["critic_p"]) <= 1.0
    assert values["safety_stopped_by_budget"] is False
    assert values["safety_corrected_cycle_count"] == 1 and values["safety_budget_stop_count"] == 0

    # a budget no cycle meets: no round, the flag and the counter say so
    node.policy.set_safety_layer(replace(node.policy.safety, round_budget_ms=1e-3))
    diag, values = cycle()
    assert values["corrections"] == 0 and values["safety_stopped_by_budget"] is True
    assert diag["stages"]["corrections"] == 0.0 and diag["stages"]["critic"] > 0.0
    assert values["safety_corrected_cycle_count"] == 1 and values["safety_budget_stop_count"] == 1

    # self-correction (the shipped self-correcting generator): its rounds reported the same way
    node.policy.set_safety_layer(replace(node.policy.safety, mode="self_correction", round_budget_ms=10000.0))
    diag, values = cycle()
    assert values["safety_layer"] == "self_correction" and values["corrections"] == 1
    assert diag["stages"]["corrections"] > 0.0 and values["critic_accepted"] is False
    assert values["safety_corrected_cycle_count"] == 2

    # off: neither the stages nor the key-values of the layer
    node.policy.set_safety_layer(replace(node.policy.safety, mode="off"))
    diag, values = cycle()
    assert "critic" not in diag["stages"] and "corrections" not in diag["stages"]
    assert "comfort_limits" in diag["stages"]
    assert not {"safety_layer", "corrections", "critic_p", "critic_accepted"} & set(values)
    # the drivable-area check reports on every cycle's diagnostics, fired or not
    assert int(values["drivable_area_cycle_count"]) >= 0 and "drivable_area_last" in values
