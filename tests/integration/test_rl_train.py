"""The RL training loop (rad2_training/train.py) on the real simulator and the shipped IL checkpoint: a run
interrupted after a checkpoint and resumed in a new process state ends bit-identical to an
uninterrupted run (weights, buffer, optimiser, entropy temperature, random generators), and the CLI's
errors name the bad setting."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from bev_warp_sim.simulator import Simulator
from rad2_core.config import load_all, load_merged, load_params, load_schema
from rad2_core.storage import load_dataset
from rad2_planner.networks.model import PlannerModel
from rad2_planner.policy import resolve_path
from rad2_training.train import RLRun, config_from_params, train

PARAMS = load_merged()
FILES = load_all()
CANDIDATES = load_schema("planner")["planner.discriminator_candidates"].choices

CHECKPOINT = resolve_path("checkpoints/rad2_il")
SMALL = dict(iterations=3, clips_per_iteration=2, group_size=2, batch_size=4, num_candidates=6, ogo_every=2,
             ogo_imitation_weight=0.5,
             ogo_steps=2, ogo_batch=8, validation_clips=0, checkpoint_every=1, validate_every=100)


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def clips():
    return load_dataset(resolve_path("data/eval_safety"))[:6]


def _run(clips) -> RLRun:
    torch.set_num_threads(1)
    cfg, tc, ogo = config_from_params(load_params("training"), **SMALL)
    return RLRun(PlannerModel.load(CHECKPOINT), cfg, tc, ogo, Simulator(PARAMS), clips, params=PARAMS)


def test_resume_after_a_kill_continues_exactly(clips, tmp_path):
    straight = _run(clips)
    train(straight, tmp_path / "a")

    interrupted = _run(clips)

    def kill_after_second(it):
        if it == 2:
            raise Killed

    with pytest.raises(Killed):
        train(interrupted, tmp_path / "b", on_iteration=kill_after_second)
    resumed = _run(clips)
    resumed.restore(tmp_path / "b" / "last")
    assert resumed.state.iteration == 2 and len(resumed.trainer.buffer) == 2
    for got, want in zip(resumed.trainer.buffer, interrupted.trainer.buffer):
        assert np.array_equal(got.candidates, want.candidates)
        assert np.array_equal(got.advantage, want.advantage)
    train(resumed, tmp_path / "b")

    assert resumed.state.iteration == straight.state.iteration == 3
    assert resumed.state.updates == 3 and resumed.state.generator_updates == 1
    rewards = [h["reward_mean"] for h in straight.state.history]
    assert [h["reward_mean"] for h in resumed.state.history] == rewards
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.trainer.entropy.log_beta == straight.trainer.entropy.log_beta
    # the discriminator and the generator both moved away from the IL checkpoint
    il = PlannerModel.load(CHECKPOINT).state_dict()
    moved = {k.split(".")[0] for k, v in straight.model.state_dict().items() if not torch.equal(v, il[k])}
    assert {"discriminator", "denoiser"} <= moved


def test_best_validation_round_is_kept_as_a_planner_checkpoint(clips, tmp_path):
    """best/ is the planner of the round the rule keeps (rl.keep_round_by: fewest at-fault collisions,
    then highest score, then lowest CR), the starting planner (round 0) included, with that round
    recorded; the run state remembers it, so a resumed run compares against it."""
    from rad2_training.train import better_round

    torch.set_num_threads(1)
    cfg, tc, ogo = config_from_params(load_params("training"),
                                      **{**SMALL, "validate_every": 1, "window_steps": 12})
    run = RLRun(PlannerModel.load(CHECKPOINT), cfg, tc, ogo, Simulator(PARAMS), clips[:4], clips[4:],
                params=PARAMS)
    train(run, tmp_path)
    start = run.state.start_validation  # the starting planner, validated before round 1
    assert set(start) == {"val_clips", "val_at_fault_collisions", "val_collision_rate",
                          "val_at_fault_collision_rate", "val_score", "val_progress_ratio", "val_reward"}
    vals = [start] + [{k: h[k] for k in start} for h in run.state.history]
    assert len(vals) == cfg.iterations + 1
    best_round = 0  # the first round the rule ranks best (0: the start)
    for i, v in enumerate(vals):
        if better_round(v, vals[best_round], cfg.keep_round_by):
            best_round = i
    kept = vals[best_round]
    assert run.state.best_iteration == best_round and run.state.best_validation == kept
    assert run.state.best_val_reward == kept["val_reward"]
    best = PlannerModel.load(tmp_path / "best")
    record = best.training_info["rl_best"]
    assert record["iteration"] == best_round and record["val_reward"] == kept["val_reward"]
    assert best.discriminator_trained == (best_round > 0)  # the start is the IL planner
    if best_round == cfg.iterations:  # the last round's planner is the live model
        for (name, a), b in zip(run.model.state_dict().items(), best.state_dict().values()):
            assert torch.equal(a, b), name
    assert "rl_best" not in run.model.training_info  # only best/ carries it
    resumed = RLRun(PlannerModel.load(CHECKPOINT), cfg, tc, ogo, Simulator(PARAMS), clips[:4], clips[4:],
                    params=PARAMS)
    resumed.restore(tmp_path / "last")
    assert (resumed.state.best_iteration, resumed.state.best_validation) == (best_round, kept)


def test_best_is_the_starting_planner_when_no_round_validates_better(clips, tmp_path, monkeypatch):
    """A fine-tuning run whose every round validates worse than its start leaves best/ = the start (by
    reward here; the safety rule on synthetic validations: tests/unit/test_rl_round_selection.py)."""
    torch.set_num_threads(1)
    by_reward = {**SMALL, "iterations": 2, "validate_every": 1, "keep_round_by": "reward"}
    cfg, tc, ogo = config_from_params(load_params("training"), **by_reward)
    run = RLRun(PlannerModel.load(CHECKPOINT), cfg, tc, ogo, Simulator(PARAMS), clips[:2], clips[4:5],
                params=PARAMS)
    rewards = iter([0.5, 0.1, 0.3])  # the start, round 1, round 2
    monkeypatch.setattr(run, "validate", lambda: {"val_reward": next(rewards)})
    train(run, tmp_path)
    assert (run.state.best_iteration, run.state.best_val_reward) == (0, 0.5)
    best = PlannerModel.load(tmp_path / "best")
    assert best.training_info["rl_best"] == {"iteration": 0, "val_reward": 0.5}
    start = PlannerModel.load(CHECKPOINT).state_dict()
    for name, value in best.state_dict().items():
        assert torch.equal(value, start[name]), name
    assert any(not torch.equal(v, start[k]) for k, v in run.model.state_dict().items())  # it did train


def test_a_run_started_from_an_rl_checkpoint_keeps_that_runs_record():
    from types import SimpleNamespace

    from rad2_training.session import stamp_rl_run

    first = {"rl_command": "train_rl.py --out a", "rl_seed": 1, "rl": {"iteration": 5}}
    model = SimpleNamespace(training_info={"command": "train_il.py", **first,
                                           "previous_rl": {"rl_command": "train_rl.py --out z"}})
    stamp_rl_run(model, seed=3)
    info = model.training_info
    assert info["command"] == "train_il.py" and info["rl_seed"] == 3
    assert info["rl_command"] == " ".join(sys.argv) and "rl" not in info
    assert info["previous_rl"] == {**first, "previous_rl": {"rl_command": "train_rl.py --out z"}}
    plain = SimpleNamespace(training_info={"command": "train_il.py"})
    stamp_rl_run(plain, seed=0)
    assert "previous_rl" not in plain.training_info


@pytest.mark.parametrize("start, trained", [("checkpoints/rad2_rl", True), ("checkpoints/rad2_il", False)])
def test_a_run_that_freezes_the_discriminator_exports_it_as_it_started(start, trained, tmp_path):
    """rl.train_discriminator: false (OGO on a frozen, already trained discriminator) makes no
    discriminator update; final/ must still say whether the discriminator it carries was trained, or
    the planner would ignore a trained one (and use an untrained one's scores)."""
    from types import SimpleNamespace

    from rad2_training.session import export_final

    cfg, _, _ = config_from_params(load_params("training"), train_discriminator=False)
    model = PlannerModel.load(resolve_path(start))
    assert model.discriminator_trained is trained
    state = SimpleNamespace(history=[{"iteration": 0, "reward_mean": 0.1, "collision_rate": 0.0}],
                            seconds=1.0, updates=0)
    export_final(model, state, cfg, tmp_path)
    assert PlannerModel.load(tmp_path / "final").discriminator_trained is trained


def test_validation_clips_are_held_out_of_every_training_set_in_proportion():
    from types import SimpleNamespace

    from rad2_training.session import split_clips

    cfg = SimpleNamespace(seed=0, validation_clips=16, clips_per_iteration=12)
    sizes = {"old_safety": 48, "old_efficiency": 29, "rich_safety": 40, "rich_efficiency": 33}
    clips = [(name, i) for name, n in sizes.items() for i in range(n)]
    groups = [name for name, _ in clips]
    train, val = split_clips(clips, cfg, groups)
    assert sorted(train + val) == sorted(clips) and not set(train) & set(val)
    held = {name: sum(c[0] == name for c in val) for name in sizes}
    # 16 × 48/150 = 5.12, 29/150 → 3.09, 40/150 → 4.27, 33/150 → 3.52: floors 5 3 4 3, the one left
    # to the largest remainder (rich_efficiency)
    assert held == {"old_safety": 5, "old_efficiency": 3, "rich_safety": 4, "rich_efficiency": 4}
    # the unstratified permutation of the same pool held out only 2 old safety clips
    plain_train, plain_val = split_clips(clips, cfg)
    assert sum(c[0] == "old_safety" for c in plain_val) == 2
    # one group is the plain permutation, order included; the split is a function of the seed
    assert split_clips(clips, cfg, [0] * len(clips)) == (plain_train, plain_val)
    assert split_clips(clips, cfg, groups) == (train, val)
    with pytest.raises(ValueError, match="group labels"):
        split_clips(clips, cfg, groups[:-1])


def test_cli_names_a_bad_setting(tmp_path):
    cmd = [sys.executable, "-m", "rad2_bringup.cli", "train", "rl", "--out", str(tmp_path), "--no-progress"]
    res = subprocess.run(cmd + ["--set", "rl.tc_grpo.advantage=ppo"], capture_output=True, text=True)
    assert res.returncode == 2 and "rl.tc_grpo.advantage" in res.stderr and "ppo" in res.stderr
    res = subprocess.run(cmd + ["--set", "rl.group_size=1"], capture_output=True, text=True)
    assert res.returncode == 2 and "rl.group_size" in res.stderr
    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert res.returncode == 2 and "no checkpoint" in res.stderr
    twice = ["--train-data", "data/eval_safety", str(resolve_path("data/eval_safety"))]
    res = subprocess.run(cmd + twice, capture_output=True, text=True)
    assert res.returncode == 2 and "--train-data" in res.stderr and "twice" in res.stderr
    # a run keeps its simulator settings: a resume with others is refused, naming both
    (tmp_path / "sim_overrides.json").write_text('{"sim.reactive_agents": true}')
    res = subprocess.run(cmd + ["--resume", "--sim-set", "sim.reactive_agents=false"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "--sim-set" in res.stderr and "sim.reactive_agents" in res.stderr
    for damaged in ("{not json", "[1, 2]"):  # a damaged record is named, never a traceback
        (tmp_path / "sim_overrides.json").write_text(damaged)
        res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
        assert res.returncode == 2 and "sim_overrides.json" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(cmd + ["--sim-set", "sim.max_steps=-5"], capture_output=True, text=True)
    assert res.returncode == 2 and "sim.max_steps" in res.stderr and "-5" in res.stderr
    # OGO re-renders its targets from the log, which holds no reactive agents: refused before any work
    res = subprocess.run(cmd + ["--sim-set", "sim.reactive_agents=true", "--set", "rl.train_generator=true"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "rl.train_generator" in res.stderr and "reactive" in res.stderr


def test_window_steps_start_groups_at_a_common_logged_step_and_stop_after_the_window(clips):
    torch.set_num_threads(1)
    cfg, tc, ogo = config_from_params(load_params("training"), **{**SMALL, "window_steps": 12})
    run = RLRun(PlannerModel.load(CHECKPOINT), cfg, tc, ogo, Simulator(PARAMS), clips, params=PARAMS)
    starts = run.window_starts(clips[:2])
    assert all(0 <= s <= c.num_steps - 1 - 12 for s, c in zip(starts, clips[:2]))
    rollouts, _ = run.collect(clips[:2], seed=0, start_steps=starts)
    for r in rollouts:
        assert r.trace.start_step == starts[r.group]  # one initial state per group
        assert r.trace.window_end - r.trace.start_step <= 12 and len(r.trace.ego) <= 13
    assert len({round(r.rewards[cfg.reward], 9) for r in rollouts}) > 1
    with pytest.raises(ValueError, match="rl.window_steps"):
        config_from_params(load_params("training"), window_steps=-1)


def test_experiment_arms_parse_the_discriminator_candidates_option():
    from rad2_evaluation.experiments import parse_arm, policy_spec

    arm = parse_arm("il:uniform@D=safe@M=16", str(CHECKPOINT), CANDIDATES)
    assert (arm.rule, arm.m, arm.discriminator_candidates) == ("uniform", 16, "safe")
    spec = policy_spec(arm, threads=1)
    assert spec.planner_overrides == {"num_candidates": 16, "discriminator_candidates": "safe"}
    assert parse_arm("il:safe_medoid", str(CHECKPOINT), CANDIDATES).discriminator_candidates is None
    with pytest.raises(ValueError, match="D=all|safe"):
        parse_arm("il:uniform@D=nearest", str(CHECKPOINT), CANDIDATES)
    arm = parse_arm("il:safe_medoid@D=safe@P=2.5", str(CHECKPOINT), CANDIDATES)
    assert arm.prior_weight == 2.5
    assert policy_spec(arm, threads=1).planner_overrides == {
        "discriminator_candidates": "safe", "discriminator_prior_weight": 2.5,
        "fallback_selection": "safe_medoid"}
    for bad in ("P=-1", "P=nan", "P=strong", "P=1e6"):
        with pytest.raises(ValueError, match=r"P=<float in \[0, 1000\]>"):
            parse_arm(f"il:safe_medoid@{bad}", str(CHECKPOINT), CANDIDATES)
    noise_modes = load_schema("planner")["planner.initial_noise"].choices
    arm = parse_arm(f"ckpt:{CHECKPOINT}@N=per_episode", str(CHECKPOINT), CANDIDATES, noise_modes)
    assert policy_spec(arm, threads=1).planner_overrides == {"initial_noise": "per_episode"}
    with pytest.raises(ValueError, match="N=per_cycle|per_episode"):
        parse_arm(f"ckpt:{CHECKPOINT}@N=per_day", str(CHECKPOINT), CANDIDATES, noise_modes)


def test_a_learned_only_arm_runs_the_networks_with_every_rule_stage_off():
    """@R=off: the selected plan executed as the networks chose it (what is learned, beside what the
    rules add); reference policies have no rule stages to turn off."""
    from rad2_evaluation.experiments import parse_arm, policy_spec
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.stages import RULE_STAGE_BLOCKS

    arm = parse_arm(f"ckpt:{CHECKPOINT}@R=off", str(CHECKPOINT), CANDIDATES)
    assert not arm.rule_stages
    params = policy_spec(arm, threads=1).planner_params(PARAMS)
    assert all(params[block]["enabled"] is False for block in RULE_STAGE_BLOCKS)
    assert all(PARAMS[block]["enabled"] for block in RULE_STAGE_BLOCKS)  # the run's own params untouched
    policy = Rad2Policy.from_params(params, checkpoint_dir=str(CHECKPOINT))
    assert not any(stage.enabled for stage in policy.pipeline.stages[1:])
    assert parse_arm("il:safe_medoid@R=on", str(CHECKPOINT), CANDIDATES).rule_stages
    with pytest.raises(ValueError, match="R=on|off"):
        parse_arm("il:safe_medoid@R=none", str(CHECKPOINT), CANDIDATES)
    with pytest.raises(ValueError, match="takes only @H"):
        parse_arm("ref:pdm_closed@R=off", str(CHECKPOINT), CANDIDATES)


def test_rule_arms_on_an_rl_checkpoint_never_select_by_its_discriminator():
    """il:RULE --il-checkpoint <RL checkpoint>: the rule, in this process and in every Ray worker (each
    builds its decider from the spec); a worker that rebuilt the policy without the flag once used the
    trained discriminator."""
    from rad2_evaluation.experiments import parse_arm, policy_spec

    rl_ckpt = str(resolve_path("checkpoints/rad2_rl"))
    assert PlannerModel.load(rl_ckpt).discriminator_trained
    for text, uses_discriminator in (("il:safe_medoid", False), ("il:medoid@D=safe@P=4", False),
                                     (f"ckpt:{rl_ckpt}@D=safe@P=4", True)):
        decider = policy_spec(parse_arm(text, rl_ckpt, CANDIDATES), threads=1).build(PARAMS)
        assert decider.policy.has_discriminator is uses_discriminator, text


def test_experiment_results_of_separate_runs_merge_into_one_table(tmp_path):
    """Runs of one seed each (side by side on several processes or machines) give the table that one
    run over all seeds gives; unequal run counts are refused rather than averaged."""
    import json

    from rad2_evaluation.experiments import Arm, experiments_table, merge_results, policy_spec

    def run(cr, ep, where):
        return {"il:safe_medoid": {
            f"{where}/data/eval_safety": [{"CR": cr, "AF-CR": 0.0, "Safety@1": 1 - cr,
                                           "comfort_violation_steps": 0.2}],
            f"{where}/data/eval_efficiency": [{"EP-Mean": ep, "EP@1.0": 0.5, "CR": 0.0,
                                               "comfort_violation_steps": 0.1}]}}

    paths = []
    for i, (cr, ep) in enumerate(((0.05, 0.9), (0.15, 1.0))):
        paths.append(tmp_path / f"seed{i}.json")
        paths[-1].write_text(json.dumps(run(cr, ep, f"/elsewhere{i}")))
    merged, splits, runs = merge_results(paths)
    assert runs == 2 and [p.rsplit("/", 1)[-1] for p in splits] == ["eval_efficiency", "eval_safety"]
    text = "\n".join(experiments_table(merged, splits, "2 per cell", None, 0.0))
    assert "| il:safe_medoid | 0.100 ± 0.050 |" in text and "| il:safe_medoid | 0.950 ± 0.050 |" in text
    lopsided = tmp_path / "extra.json"
    lopsided.write_text(json.dumps({"il:uniform": run(0.1, 0.9, "/x")["il:safe_medoid"]}))
    with pytest.raises(ValueError, match="different numbers of runs"):
        merge_results(paths + [lopsided])
    arm = Arm("il:uniform", str(CHECKPOINT), "uniform", None, None)
    spec = policy_spec(arm, threads=1, backend="pytorch", device="cuda")  # an arm on a GPU's planner
    assert spec.backend == "pytorch" and spec.planner_overrides == {"device": "cuda"}


def test_runs_of_one_planner_under_two_labels_merge_into_one_arm(tmp_path):
    """A run's checkpoint evaluated on some seeds and the same weights shipped elsewhere on others: the
    renames apply to every file before pooling, so their seeds form one arm; an unknown label is named."""
    import json

    from rad2_evaluation.experiments import merge_results

    def seed(label, cr):
        return {label: {"/x/data/eval_safety": [{"CR": cr, "AF-CR": 0.0, "Safety@1": 1 - cr,
                                                 "comfort_violation_steps": 0.2}]}}

    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    paths[0].write_text(json.dumps(seed("ckpt:runs/x/best", 0.04)))
    paths[1].write_text(json.dumps(seed("ckpt:checkpoints/x", 0.06)))
    assert sorted(merge_results(paths, {"ckpt:runs/x/best": "x"})[0]) == ["ckpt:checkpoints/x", "x"]
    merged, _, runs = merge_results(paths, {"ckpt:runs/x/best": "x", "ckpt:checkpoints/x": "x"})
    assert runs == 2 and list(merged) == ["x"]
    assert [r["CR"] for r in next(iter(merged["x"].values()))] == [0.04, 0.06]
    with pytest.raises(ValueError, match=r"no arm labelled \['ckpt:elsewhere'\]"):
        merge_results(paths, {"ckpt:elsewhere": "x"})
    cli = subprocess.run([sys.executable, "-m", "rad2_bringup.cli", "eval", "experiments", "--merge",
                          *map(str, paths),
                          "--rename", "ckpt:runs/x/best->x", "ckpt:checkpoints/x->x", "--out",
                          str(tmp_path / "m")], capture_output=True, text=True, timeout=120,
                         cwd=resolve_path("."))
    assert cli.returncode == 0, cli.stderr
    assert "| x | 0.050 ± 0.010 |" in (tmp_path / "m" / "experiments.md").read_text()


def test_a_mixed_split_is_reported_on_both_collisions_and_progress(tmp_path):
    """A set of both kinds of clip (eval_rich) is judged on CR and EP together: its table has both,
    a metric missing from an older results.json shows as a dash, and the plot has a panel for each."""
    from rad2_evaluation.experiments import experiments_table, plot_experiments

    split = "/x/data/eval_rich"
    runs = [{"CR": cr, "AF-CR": 0.0, "EP-Mean": ep, "EP@1.0": 0.4, "comfort_violation_steps": 0.2}
            for cr, ep in ((0.1, 0.8), (0.2, 0.9))]
    text = "\n".join(experiments_table({"il:uniform": {split: runs}}, [split], [0, 1], None, 0.0))
    assert "| arm | CR | AF-CR | offroad_rate | EP-Mean | EP@1.0 | comfort_violation_steps |" in text
    row = ("| il:uniform | 0.150 ± 0.050 | 0.000 ± 0.000 | – | 0.850 ± 0.050 | 0.400 ± 0.000 "
           "| 0.200 ± 0.000 | – |")
    assert row in text
    plot_experiments({"il:uniform": {split: runs}}, [split], tmp_path / "p.png", lambda s: s)
    import matplotlib.image

    height, width = matplotlib.image.imread(tmp_path / "p.png").shape[:2]
    assert width > 1.5 * height  # two panels side by side


def test_experiment_results_keep_each_clips_outcome(tmp_path):
    """results.json holds, per seed, one record per clip whose collisions add up to the seed's CR."""
    import json

    from rad2_evaluation.experiments import parse_arm, run_experiments

    torch.set_num_threads(1)
    arm = parse_arm("il:safe_medoid@M=4@H=8", str(CHECKPOINT), CANDIDATES)
    results = run_experiments([arm], ["data/eval_safety"], [0], tmp_path, FILES, max_clips=2,
                              backend="pytorch")
    (runs,) = json.loads((tmp_path / "results.json").read_text())[arm.label].values()
    assert runs == next(iter(results[arm.label].values()))  # what was returned is what was written
    clips = runs[0]["clips"]
    names = [c.clip_id for c in load_dataset(resolve_path("data/eval_safety"))[:2]]
    assert [c["clip_id"] for c in clips] == names
    assert runs[0]["CR"] == pytest.approx(np.mean([c["collided"] for c in clips]))
    assert all(c["termination"] in ("clip_end", "collision", "offroad", "max_steps") for c in clips)
    report = (tmp_path / "experiments.md").read_text()
    hits = sum(c["collided"] for c in clips)
    assert f"| {arm.label} | {hits} / 2 |" in report  # the collision table counts the same episodes
    # the cycle timed alone after the rollouts: H=8 over two clips leaves fewer than the 200 asked for
    assert 0 < runs[0]["cycle_count"] < 200
    assert 0 < runs[0]["cycle_median_ms"] <= runs[0]["cycle_p99_ms"]


def test_resuming_with_an_optimiser_over_other_parameters_names_the_setting():
    """A run saved with OGO updating the scene encoder cannot silently resume without it: the error says
    which setting to restore instead of torch's parameter-group mismatch."""
    import torch
    from rad2_training.train import _optimizer_arrays, _optimizer_meta, _restore_optimizer

    enc, den = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    started = torch.optim.AdamW([*enc.parameters(), *den.parameters()], lr=1e-3)
    den(enc(torch.ones(1, 2))).sum().backward()
    started.step()
    meta, arrays = _optimizer_meta(started), _optimizer_arrays("gen_opt", started)
    with pytest.raises(ValueError, match="rl.ogo.update_scene_encoder"):
        _restore_optimizer(torch.optim.AdamW(den.parameters(), lr=1e-3), "gen_opt", arrays, meta)
    same = torch.optim.AdamW([*enc.parameters(), *den.parameters()], lr=1e-3)
    _restore_optimizer(same, "gen_opt", arrays, meta)
    assert same.state_dict()["state"][0]["step"] == 1


def test_reference_arms_share_the_table_with_the_planner(tmp_path):
    """ref:NAME arms drive a reference policy beside planner arms: parsed with their own options only,
    driven once (they are deterministic) and counted under every seed, with the real-split columns
    (off-road, score, plan-to-plan change, wall time per clip) in the table."""
    import json

    from rad2_evaluation.experiments import parse_arm, run_experiments

    arm = parse_arm("ref:pdm_closed@H=2", str(CHECKPOINT), CANDIDATES)
    assert (arm.reference, arm.h_reuse) == ("pdm_closed", 2)
    for bad, match in (("ref:rad2", "ref:pdm_closed"), ("ref:nope", "ref:idm"), ("ref:idm@M=8", "only @H")):
        with pytest.raises(ValueError, match=match):
            parse_arm(bad, str(CHECKPOINT), CANDIDATES)
    arms = [parse_arm("ref:idm", str(CHECKPOINT), CANDIDATES),
            parse_arm("ref:expert", str(CHECKPOINT), CANDIDATES)]
    run_experiments(arms, ["data/eval_real"], [0, 1], tmp_path, FILES, max_clips=2)
    results = json.loads((tmp_path / "results.json").read_text())
    first_two = [c.clip_id for c in load_dataset(resolve_path("data/eval_real"))[:2]]
    for label in ("ref:idm", "ref:expert"):
        (runs,) = results[label].values()
        assert len(runs) == 2 and runs[0] == runs[1]  # one drive stands for both seeds
        assert runs[0]["wall_s_per_clip"] > 0
        assert [c["clip_id"] for c in runs[0]["clips"]] == first_two
    (expert,) = results["ref:expert"].values()
    assert expert[0]["EP-Mean"] == pytest.approx(1.0, abs=0.02)  # the log replayed
    report = (tmp_path / "experiments.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| arm |"))
    for column in ("offroad_rate", "score", "plan_speed_change_m_s", "cycle_p99_ms", "wall_s_per_clip"):
        assert column in header
    for label in ("ref:idm", "ref:expert"):  # every seed's cell shows the one timing of the arm
        (runs,) = results[label].values()
        assert runs[0]["cycle_p99_ms"] == runs[1]["cycle_p99_ms"] > 0
    assert (tmp_path / "summary_eval_real.png").is_file()
