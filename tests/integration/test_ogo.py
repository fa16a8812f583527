"""On-policy Generator Optimization (RAD-2 Eq. 19): re-timing keeps the path and changes only the timing;
deceleration when TTC is short, acceleration when lagging the log and safe; targets from real rollouts."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from bev_warp_sim.rollout import PerRowPlanners, run_rollouts
from bev_warp_sim.simulator import Simulator
from rad2_core.config import load_merged
from rad2_core.geometry import world_to_ego
from rad2_core.tokens import project_onto_polyline
from rad2_training.ogo import OGOConfig, OGOTarget, decide, minibatch, ogo_targets, raw_segment, retime
from synthetic_scenes import make_clip

PARAMS = load_merged()


def _arc(n=8, radius=30.0, step=4.0):
    th = np.arange(1, n + 1) * step / radius
    return np.stack([radius * np.sin(th), radius * (1 - np.cos(th))], -1)


def _arc_length(points):
    path = np.vstack([[0.0, 0.0], points])
    return np.cumsum(np.hypot(*np.diff(path, axis=0).T))


def _offset_distance(s_raw, ratio):
    """Arc lengths after a constant acceleration offset that scales the horizon's distance by ratio."""
    frac = np.arange(1, len(s_raw) + 1) / len(s_raw)
    return s_raw + (ratio - 1.0) * s_raw[-1] * frac**2


@pytest.mark.parametrize("ratio", [0.8, 0.5])
def test_compression_keeps_the_path_and_offsets_the_acceleration(ratio):
    """RAD-2 §3.3.3: a constant offset on the acceleration, re-integrated. The path stays, the horizon's
    distance scales by the ratio, and the start speed is kept (no brake step at the plan's first point)."""
    raw = _arc()  # 4 m per 0.5 s step: 8 m/s
    out = retime(raw, ratio)
    path = np.vstack([[0.0, 0.0], raw])
    for p in out:  # every re-timed point lies on the driven path
        assert abs(project_onto_polyline(path, p)[1]) < 1e-9
    s_raw, s_out = _arc_length(raw), _arc_length(out)
    # chords of a gentle arc: 1e-2 relative
    assert s_out[-1] == pytest.approx(ratio * s_raw[-1], rel=1e-2)
    dt = 0.5
    t = dt * np.arange(1, len(raw) + 1)
    accel_offset = 2.0 * (s_out - s_raw) / t**2  # one constant, the same at every point
    np.testing.assert_allclose(accel_offset, 2.0 * (ratio - 1.0) * s_raw[-1] / t[-1] ** 2, rtol=1e-2)
    assert abs(accel_offset[0]) < 3.0  # per-point scaling by 0.5 would brake at 16 m/s² over the first step
    assert np.all(np.diff(s_out) > 0)


def test_a_deceleration_that_would_reverse_stops_the_ego_instead():
    raw = _arc()
    out = retime(raw, 0.05)
    s_out = _arc_length(out)
    assert np.all(np.diff(s_out) >= -1e-9)  # never backwards
    np.testing.assert_allclose(out[-3:] - out[-1], 0.0)  # at rest by the horizon's end
    assert s_out[-1] < 0.6 * _arc_length(raw)[-1]


def test_extension_follows_the_path_then_its_last_heading():
    raw = _arc()
    out = retime(raw, 1.25)
    path = np.vstack([[0.0, 0.0], raw])
    s_raw = _arc_length(raw)
    inside = _offset_distance(s_raw, 1.25) <= s_raw[-1]
    assert inside.any() and not inside.all()
    for p in out[inside]:
        assert abs(project_onto_polyline(path, p)[1]) < 1e-9
    d = raw[-1] - raw[-2]
    heading = np.arctan2(d[1], d[0])
    beyond = out[~inside] - raw[-1]
    np.testing.assert_allclose(np.arctan2(beyond[:, 1], beyond[:, 0]), heading, atol=1e-9)
    assert np.linalg.norm(beyond[-1]) == pytest.approx(0.25 * s_raw[-1], rel=1e-9)
    np.testing.assert_array_equal(retime(np.zeros((8, 2)), 1.25), np.zeros((8, 2)))  # standing still


def test_decisions_safety_first_then_efficiency():
    cfg = OGOConfig(gamma_safe_s=2.0, lag_m=2.0)
    tr = SimpleNamespace(start_step=10, ttc=np.array([3.0, 1.5, 3.0, 1.0]),
                         route_s=np.array([0.0, 5.0, 10.0, 12.0]), expert_s=np.array([0.0, 5.5, 15.0, 20.0]))
    assert decide(tr, 10, cfg) is None  # safe and on pace
    assert decide(tr, 11, cfg) == "decelerate"
    assert decide(tr, 12, cfg) == "accelerate"  # 5 m behind the log, TTC 3 s
    assert decide(tr, 13, cfg) == "decelerate"  # behind, but unsafe: safety wins
    with pytest.raises(ValueError, match="decel_ratio"):
        OGOConfig(decel_ratio=1.2)
    with pytest.raises(ValueError, match="segment"):
        OGOConfig(segment="driven")


def test_the_plan_segment_is_the_committed_plan_and_ignores_what_the_tracker_did():
    """With ``segment: plan`` a decision's raw segment is its committed plan even where the drive that
    followed braked at the tracker's limit (a stitched, jerky profile); a decision without a plan of the
    generator's shape falls back to the drive."""
    from rad2_training.ogo import segment

    plan = np.stack([np.arange(1, 9) * 4.0, np.zeros(8)], -1)  # 8 m/s held
    t = np.arange(0, 60)
    ego = np.zeros((60, 5))
    ego[:, 0] = np.minimum(0.8 * t, 0.8 * 20 + 0.1 * (t - 20).clip(0))  # 8 m/s, then a hard stop
    ego[:, 3] = np.where(t < 20, 8.0, 1.0)
    tr = SimpleNamespace(start_step=0, dt=0.1, ego=ego)
    d = SimpleNamespace(step=0, trajectory=plan, info={"plan_dt": 0.5})
    np.testing.assert_allclose(segment(tr, d, OGOConfig(segment="plan"), 8, 0.5), plan)
    driven = segment(tr, d, OGOConfig(segment="executed"), 8, 0.5)
    assert driven[-1, 0] < 0.7 * plan[-1, 0]
    for other in (SimpleNamespace(step=0, trajectory=None, info={}),
                  SimpleNamespace(step=0, trajectory=plan[:6], info={"plan_dt": 0.5}),
                  SimpleNamespace(step=0, trajectory=plan, info={"plan_dt": 0.25}),
                  SimpleNamespace(step=0, trajectory=np.where(plan > 20, np.nan, plan),
                                  info={"plan_dt": 0.5})):
        np.testing.assert_allclose(segment(tr, other, OGOConfig(segment="plan"), 8, 0.5), driven)
    # ``candidate``: the generator's selected proposal, not the plan post-processing made of it
    slowed = plan * np.linspace(1.0, 0.7, 8)[:, None]
    cands = np.stack([plan * 0.5, plan, plan * 1.2])
    d = SimpleNamespace(step=0, trajectory=slowed, candidates=cands, selected=1, info={"plan_dt": 0.5})
    np.testing.assert_allclose(segment(tr, d, OGOConfig(segment="candidate"), 8, 0.5), plan)
    np.testing.assert_allclose(segment(tr, d, OGOConfig(segment="plan"), 8, 0.5), slowed)
    for other in (SimpleNamespace(step=0, trajectory=slowed, candidates=None, selected=0, info={}),
                  SimpleNamespace(step=0, trajectory=slowed, candidates=cands, selected=3, info={})):
        np.testing.assert_allclose(segment(tr, other, OGOConfig(segment="candidate"), 8, 0.5), driven)


class _Straight:
    """Straight ahead from the current speed with a constant acceleration (a test planner)."""

    name = "straight"

    def __init__(self, accel: float, speed_factor: float = 1.0):
        self.accel, self.speed_factor = accel, speed_factor

    def reset(self, clip=None, start_step=0, seed=None):
        pass

    def plan(self, obs):
        from rad2_core.planning_interface import PlanResult

        t = np.arange(1, 9) * 0.5
        v = float(obs.ego_state[0]) * self.speed_factor
        s = np.maximum(v * t + 0.5 * self.accel * t**2, 0.0)
        s = np.maximum.accumulate(s)
        return PlanResult(candidates=np.stack([s, 0 * s], -1)[None].astype(np.float32),
                          scores=np.full(1, np.nan, np.float32), selected=0, plan_dt=0.5)


def _check_targets(ro, cfg, kinds):
    targets = ogo_targets([ro], cfg, plan_points=8, plan_dt=0.5)
    assert targets and kinds <= {t.kind for t in targets}, [t.kind for t in targets]
    tr = ro.trace
    committed = {d.step: d.trajectory for d in tr.decisions}
    for t in targets:
        i = t.step - tr.start_step
        if cfg.segment == "executed":
            np.testing.assert_allclose(t.raw, raw_segment(tr, t.step, 8, 0.5))
            if i + 5 < len(tr.ego):  # the first plan point is 0.5 s = 5 steps later, where it was driven
                np.testing.assert_allclose(t.raw[0], world_to_ego(tr.ego[i + 5, :2][None], tr.ego[i, :3])[0])
        elif cfg.segment == "candidate":
            d = next(d for d in tr.decisions if d.step == t.step)
            np.testing.assert_allclose(t.raw, d.candidates[d.selected])
        else:  # the plan committed at the decision, not the drive that followed
            np.testing.assert_allclose(t.raw, committed[t.step])
        assert t.kind == decide(tr, t.step, cfg)
        ratio = cfg.decel_ratio if t.kind == "decelerate" else cfg.accel_ratio
        expected = np.maximum.accumulate(np.maximum(_offset_distance(_arc_length(t.raw), ratio), 0.0))
        np.testing.assert_allclose(_arc_length(t.target), expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("segment", ["plan", "candidate", "executed"])
def test_targets_from_closed_loop_rollouts(segment):
    sim = Simulator(PARAMS)
    clip = make_clip(num_steps=200)  # a slower leader ahead in the ego's lane
    cfg = OGOConfig(segment=segment)
    # accelerating into the slower leader: short TTCs before the contact -> deceleration targets
    [fast], _ = run_rollouts(sim, PerRowPlanners(lambda: _Straight(3.0)), [clip], start_steps=60,
                             max_steps=100, h_reuse=8)
    assert fast.trace.collided
    _check_targets(fast, cfg, {"decelerate"})
    # crawling at a third of the speed: far behind the log with nothing near -> acceleration targets
    [slow], _ = run_rollouts(sim, PerRowPlanners(lambda: _Straight(0.0, speed_factor=0.3)), [clip],
                             start_steps=0, max_steps=60, h_reuse=8)
    _check_targets(slow, cfg, {"accelerate"})
    # ``kinds`` keeps one half of Eq. 19: the same rollouts then give targets of that kind only
    both = ogo_targets([fast, slow], cfg, plan_points=8, plan_dt=0.5)
    for kinds in ("accelerate", "decelerate"):
        only = ogo_targets([fast, slow], OGOConfig(segment=segment, kinds=kinds), plan_points=8, plan_dt=0.5)
        assert only and {t.kind for t in only} == {kinds}
        assert [(t.clip_id, t.step) for t in only] == [(t.clip_id, t.step) for t in both if t.kind == kinds]
    with pytest.raises(ValueError, match="kinds"):
        OGOConfig(kinds="brake")


def test_follower_aware_decisions():
    """rl.ogo.follower_gamma_s: a close follower vetoes a deceleration target and, with the road ahead
    clear, asks for an acceleration one; 0 leaves RAD-2's rule (T_t and the lag only)."""
    # steps: hazard ahead + follower close | hazard only | follower only | neither, lagging | neither
    trace = SimpleNamespace(start_step=10, ttc=np.array([1.0, 1.0, 3.0, 3.0, 3.0]),
                            rear_ttc=np.array([0.8, 3.0, 1.2, 3.0, 3.0]),
                            route_s=np.array([0.0, 10.0, 20.0, 30.0, 40.0]),
                            expert_s=np.array([0.0, 10.0, 20.0, 35.0, 40.0]))
    rad2 = [decide(trace, 10 + i, OGOConfig()) for i in range(5)]
    aware = [decide(trace, 10 + i, OGOConfig(follower_gamma_s=2.0)) for i in range(5)]
    assert rad2 == ["decelerate", "decelerate", None, "accelerate", None]
    assert aware == [None, "decelerate", "accelerate", "accelerate", None]
    with pytest.raises(ValueError, match="follower_gamma_s"):
        OGOConfig(follower_gamma_s=-1.0)


def test_generator_fine_tuning_moves_towards_the_targets():
    """A few Eq. 19 steps on real OGO targets lower the generator's loss on them (same noise draws)."""
    import torch
    from rad2_core.config import load_params
    from rad2_planner.diffusion import NoiseSchedule
    from rad2_planner.networks import PlannerModel
    from rad2_planner.policy import resolve_path
    from rad2_training.imitation import diffusion_loss, to_torch
    from rad2_training.ogo import generator_batch, generator_step

    sim = Simulator(PARAMS)
    clip = make_clip(num_steps=200)
    [fast], _ = run_rollouts(sim, PerRowPlanners(lambda: _Straight(3.0)), [clip], start_steps=60,
                             max_steps=100, h_reuse=8)
    targets = ogo_targets([fast], OGOConfig(), plan_points=8, plan_dt=0.5)[:4]
    model = PlannerModel.load(resolve_path("checkpoints/rad2_il"))
    d = load_params("planner")["diffusion"]
    schedule = NoiseSchedule(model.cfg.num_train_steps, d["schedule"])
    batch = generator_batch(sim, {clip.clip_id: clip}, targets, model.cfg)
    assert batch["target"].shape == (len(targets), 8, 2) and batch["bev"].shape[0] == len(targets)

    def loss() -> float:
        with torch.no_grad():
            return float(diffusion_loss(model, to_torch(batch, torch.device("cpu")), schedule, 4,
                                        torch.Generator().manual_seed(7)))

    before = loss()
    encoder = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    opt = torch.optim.AdamW(model.denoiser.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        generator_step(model, opt, batch, schedule, 4, gen)
    assert loss() < 0.8 * before
    # the scene encoder, whose BEV tokens the discriminator reads, is left as it was (and trainable again)
    assert all(torch.equal(v, model.encoder.state_dict()[k]) for k, v in encoder.items())
    assert all(p.grad is None for p in model.encoder.parameters())
    assert all(p.requires_grad for p in model.encoder.parameters())


def test_imitation_mix_uses_logged_futures_and_adds_its_weighted_loss():
    """RAD-2 Table 4 row 3: the logged samples have a whole logged horizon, their targets are the logged
    ego future in the ego frame, and one OGO step's loss is the OGO term plus the weighted imitation term
    (the same noise draws, in that order)."""
    import torch
    from rad2_planner.diffusion import NoiseSchedule
    from rad2_planner.networks import PlannerModel
    from rad2_planner.policy import resolve_path
    from rad2_training.imitation import diffusion_loss, to_torch
    from rad2_training.ogo import generator_batch, generator_step, imitation_batch, imitation_samples

    sim = Simulator(PARAMS)
    clips = [make_clip(num_steps=200), make_clip(num_steps=30, clip_id="synthetic_short")]  # too short
    model = PlannerModel.load(resolve_path("checkpoints/rad2_il"))
    horizon = int(round(model.cfg.plan_dt / clips[0].dt)) * model.cfg.plan_points
    samples = imitation_samples(clips, np.random.default_rng(0), 6, model.cfg.plan_dt, model.cfg.plan_points)
    assert len(samples) == 6 and {i for i, _ in samples} == {0}
    assert all(0 <= t < clips[0].num_steps - horizon for _, t in samples)
    assert len({t for _, t in samples}) > 1
    logged = imitation_batch(sim, clips, samples, model.cfg)
    i, t = samples[0]
    stride = int(round(model.cfg.plan_dt / clips[0].dt))
    fut = np.stack([clips[0].ego_x, clips[0].ego_y], -1)[t + stride * np.arange(1, model.cfg.plan_points + 1)]
    np.testing.assert_allclose(logged["target"][0], world_to_ego(fut, clips[0].ego_pose(t)), atol=1e-4)
    with pytest.raises(ValueError, match="imitation mix"):
        imitation_samples(clips[1:], np.random.default_rng(0), 2, model.cfg.plan_dt, model.cfg.plan_points)

    [fast], _ = run_rollouts(sim, PerRowPlanners(lambda: _Straight(3.0)), [clips[0]], start_steps=60,
                             max_steps=100, h_reuse=8)
    targets = ogo_targets([fast], OGOConfig(), plan_points=8, plan_dt=0.5)[:4]
    batch = generator_batch(sim, {clips[0].clip_id: clips[0]}, targets, model.cfg)
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        ogo = float(diffusion_loss(model, to_torch(batch, torch.device("cpu")), schedule, 2, gen))
        il = float(diffusion_loss(model, to_torch(logged, torch.device("cpu")), schedule, 2, gen))
    opt = torch.optim.SGD(list(model.encoder.parameters()) + list(model.denoiser.parameters()), lr=0.0)
    got = generator_step(model, opt, batch, schedule, 2, torch.Generator().manual_seed(5),
                         imitation_batch=logged, imitation_weight=0.5)
    assert got == pytest.approx(ogo + 0.5 * il, rel=1e-5)
    assert il > 0 and got > ogo


def _clip_with_follower(gap_steps: int = 7):
    """The synthetic slow-leader clip with its left-lane car replaced by a follower that drives the
    ego's logged path ``gap_steps`` log steps behind it (2.2 m bumper to bumper at 10 m/s)."""
    clip = make_clip(num_steps=200)
    ax, ay, ayaw = (np.array(a) for a in (clip.agent_x, clip.agent_y, clip.agent_yaw))
    valid = np.array(clip.agent_valid)
    lag = np.clip(np.arange(clip.num_steps) - gap_steps, 0, None)
    ax[1], ay[1], ayaw[1] = clip.ego_x[lag], clip.ego_y[lag], clip.ego_yaw[lag]
    valid[1] = True
    lengths = np.array(clip.agent_length, dtype=np.float64)
    lengths[1] = 4.8
    return dataclasses.replace(clip, agent_x=ax, agent_y=ay, agent_yaw=ayaw, agent_valid=valid,
                               agent_length=lengths)


def test_a_retiming_that_hits_a_logged_agent_the_plan_missed_is_rejected():
    """Compressing the logged drive with a follower 2.2 m behind backs the ego into it; extending it runs
    the ego into the slower leader ahead; a mild compression hits neither and is kept; a target that
    hits only what its raw segment already hits is kept."""
    from rad2_core.open_loop_metrics import logged_future
    from rad2_training.ogo import OGOTarget, agents_hit, reject_new_collisions

    clip = _clip_with_follower()
    step = 50
    raw = logged_future(clip, step, 0.5, 8).ego
    state = np.array([clip.ego_x[step], clip.ego_y[step], clip.ego_yaw[step], clip.ego_speed[step], 0.0])
    assert not agents_hit(raw, state, clip, step, 0.5).any()  # the logged drive itself is clear

    def target(ratio, kind, points=raw):
        return OGOTarget(clip.clip_id, step, state, 0.0, points, retime(points, ratio), kind)

    back = target(0.8, "decelerate")
    ahead = target(1.15, "accelerate")
    mild = target(0.98, "decelerate")
    assert agents_hit(back.target, state, clip, step, 0.5)[1]  # the follower
    assert agents_hit(ahead.target, state, clip, step, 0.5)[0]  # the leader
    kept, rejected = reject_new_collisions([back, ahead, mild], {clip.clip_id: clip}, 0.5)
    assert rejected == 2 and [t.kind for t in kept] == ["decelerate"] and kept[0] is mild
    # a raw plan already into the leader: its deceleration still hits the leader alone, and is kept
    into_leader = raw * np.array([1.2, 1.0])
    assert agents_hit(into_leader, state, clip, step, 0.5)[0]
    slower = target(0.95, "decelerate", into_leader)
    new = agents_hit(slower.target, state, clip, step, 0.5) & ~agents_hit(into_leader, state, clip, step, 0.5)
    assert not new.any()
    assert reject_new_collisions([slower], {clip.clip_id: clip}, 0.5) == ([slower], 0)


def test_balanced_minibatches_draw_both_kinds_equally_whatever_the_mix():
    def target(kind):
        z = np.zeros((8, 2))
        return OGOTarget("c", 0, np.zeros(5), 0.0, z, z, kind)

    targets = [target("decelerate")] * 90 + [target("accelerate")] * 10
    rng = np.random.default_rng(0)
    kinds = lambda idx: [targets[i].kind for i in idx]  # noqa: E731
    balanced = kinds(minibatch(targets, 16, rng, balance_kinds=True))
    assert len(balanced) == 16 and balanced.count("accelerate") == 8
    # the minority runs out: what is left of the batch is not filled from the majority
    few = kinds(minibatch(targets, 32, rng, balance_kinds=True))
    assert few.count("accelerate") == 10 and few.count("decelerate") == 16
    # uniform draws follow the mix; one kind alone falls back to uniform draws
    uniform = [kinds(minibatch(targets, 16, rng, balance_kinds=False)).count("accelerate")
               for _ in range(200)]
    assert 1.0 < np.mean(uniform) < 2.2
    only = minibatch(targets[:90], 16, rng, balance_kinds=True)
    assert len(set(only.tolist())) == 16
