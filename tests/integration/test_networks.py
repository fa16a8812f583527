"""Networks, diffusion sampler, normalisation, open-loop metrics and IL pieces (tiny configs, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rad2_core.config import load_merged
from rad2_core.geometry import box_corners, boxes_overlap
from rad2_core.observation import ObservationError
from rad2_core.open_loop_metrics import (
    OpenLoopAccumulator,
    displacement_errors,
    logged_future,
    plan_collisions,
    vehicle_max_curvature,
)
from rad2_planner.candidates import medoid_index, observation_inputs
from rad2_planner.diffusion import NoiseSchedule, initial_noise, sample
from rad2_planner.networks import PlannerModel, TrajectoryNormalizer
from rad2_planner.runtime.base import DISCRIMINATOR_INPUTS, SCENE_INPUTS
from rad2_planner.runtime.onnx_export import example_inputs
from tiny_models import randomised_model, tiny_config

PARAMS = load_merged()
VEHICLE = PARAMS
STATIC_SPEED = float(PARAMS["metrics"]["open_loop_static_speed"])


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny models run fastest single-threaded (and do not thrash a shared CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torch_inputs(cfg, batch=2, m=3, seed=0):
    return {k: torch.from_numpy(v) for k, v in example_inputs(cfg, batch, m, seed).items()}


def test_shapes_for_several_m():
    cfg = tiny_config()
    model = randomised_model(cfg)
    ex = torch_inputs(cfg)
    with torch.no_grad():
        tokens, bias, cond, bev_tokens = model.encoder(*(ex[k] for k in SCENE_INPUTS))
        assert tokens.shape == (2, cfg.scene_tokens, cfg.d_model)
        assert bias.shape == (2, cfg.scene_tokens) and cond.shape == (2, cfg.d_model)
        assert bev_tokens.shape == (2, cfg.bev_tokens, cfg.d_model) and cfg.bev_tokens == 16
        for m in (1, 4, 9):
            x = torch.randn(2, m, cfg.plan_points, 2)
            out = model.denoiser(x, torch.tensor([10.0, 900.0]), tokens, bias, cond)
            assert out.shape == (2, m, cfg.plan_points, 2) and torch.isfinite(out).all()
            s = model.discriminator(x * 10, *(ex[k] for k in DISCRIMINATOR_INPUTS[1:-1]), bev_tokens)
            assert s.shape == (2, m) and bool(((s > 0) & (s < 1)).all())


def test_masked_tokens_do_not_influence_outputs():
    cfg = tiny_config()
    model = randomised_model(cfg)
    ex = torch_inputs(cfg)
    ex["agents_mask"][:, 1:] = False
    ex["map_mask"][:, 2:] = False
    x = torch.randn(2, 3, cfg.plan_points, 2)
    t = torch.tensor([100.0, 500.0])

    def run(inp):
        with torch.no_grad():
            tokens, bias, cond, bev = model.encoder(*(inp[k] for k in SCENE_INPUTS))
            return (
                model.denoiser(x, t, tokens, bias, cond),
                model.discriminator(x * 5, *(inp[k] for k in DISCRIMINATOR_INPUTS[1:-1]), bev),
            )

    base = run(ex)
    changed = {k: v.clone() for k, v in ex.items()}
    changed["agents"][:, 1:] += 50.0
    changed["map_polylines"][:, 2:] -= 30.0
    other = run(changed)
    for a, b in zip(base, other):
        assert torch.allclose(a, b, atol=1e-5)
    # and a valid agent does matter
    changed["agents"][:, 0] += 5.0
    assert not torch.allclose(run(changed)[0], base[0], atol=1e-5)


def test_discriminator_without_agents_or_map_is_finite():
    cfg = tiny_config()
    model = randomised_model(cfg)
    ex = torch_inputs(cfg)
    ex["agents_mask"][:] = False
    ex["map_mask"][:] = False
    with torch.no_grad():
        _, _, _, bev = model.encoder(*(ex[k] for k in SCENE_INPUTS))
        s = model.discriminator(*(ex[k] for k in DISCRIMINATOR_INPUTS[:-1]), bev)
    assert torch.isfinite(s).all()


def test_discriminator_logits_and_scores_agree():
    cfg = tiny_config()
    model = randomised_model(cfg)
    ex = torch_inputs(cfg, m=5)
    with torch.no_grad():
        bev = model.encoder(*(ex[k] for k in SCENE_INPUTS))[3]
        args = (*(ex[k] for k in DISCRIMINATOR_INPUTS[:-1]), bev)
        logits = model.discriminator.logits(*args)
        both = model.discriminator.logits_and_scores(*args)
        scores = model.discriminator(*args)
    assert logits.shape == (2, 5) and torch.equal(both[0], logits) and torch.equal(both[1], scores)
    assert torch.equal(scores, torch.sigmoid(logits))
    # the model-side helper takes NumPy or tensors, batched, and keeps the graph for the RL update
    recorded = {k: ex[k].numpy() for k in DISCRIMINATOR_INPUTS[1:-1]} | {"bev_tokens": bev.numpy()}
    again = model.discriminator_logits(ex["trajectories"].numpy(), recorded)
    assert torch.allclose(again, logits, atol=1e-6) and again.requires_grad
    with pytest.raises(ValueError, match="discriminator_inputs: missing 'bev_tokens'"):
        model.discriminator_logits(ex["trajectories"], {k: recorded[k] for k in DISCRIMINATOR_INPUTS[1:-1]})
    with pytest.raises(ValueError, match=r"discriminator_inputs.ego_state: shape \(1, 4\) does not match"):
        model.discriminator_logits(ex["trajectories"], recorded | {"ego_state": recorded["ego_state"][:1]})
    with pytest.raises(ValueError, match=r"candidates: shape \(5, 8, 2\)"):
        model.discriminator_logits(ex["trajectories"][0], recorded)


def test_discriminator_initialised_from_generator_encoders():
    cfg = tiny_config()
    model = randomised_model(cfg)
    assert not torch.equal(
        model.discriminator.map.point_mlp.net[0].weight, model.encoder.map.point_mlp.net[0].weight
    )
    model.discriminator.init_from_scene_encoder(model.encoder)
    for a, b in (
        (model.discriminator.map, model.encoder.map),
        (model.discriminator.agents, model.encoder.agents),
    ):
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert ka == kb and torch.equal(va, vb)
    # independent parameters: training one does not move the other
    with torch.no_grad():
        model.discriminator.map.point_mlp.net[0].weight.add_(1.0)
    assert not torch.equal(
        model.discriminator.map.point_mlp.net[0].weight, model.encoder.map.point_mlp.net[0].weight
    )


def test_checkpoint_roundtrip(tmp_path):
    cfg = tiny_config()
    model = randomised_model(cfg)
    model.normalizer = TrajectoryNormalizer(np.ones((8, 2)), np.full((8, 2), 2.0), 0.5)
    model.discriminator_trained = True
    model.save(tmp_path / "ck")
    loaded = PlannerModel.load(tmp_path / "ck")
    assert loaded.discriminator_trained and np.allclose(loaded.normalizer.std, 2.0)
    ex = torch_inputs(cfg)
    with torch.no_grad():
        a = model.encoder(*(ex[k] for k in SCENE_INPUTS))[0]
        b = loaded.encoder(*(ex[k] for k in SCENE_INPUTS))[0]
    assert torch.equal(a, b)
    assert loaded.weights_hash() == model.weights_hash()
    # the shipped form: float16 files, loaded back as float32 with small rounding only
    model.save(tmp_path / "half", dtype=torch.float16)
    assert (tmp_path / "half" / "generator.safetensors").stat().st_size < 0.6 * (
        tmp_path / "ck" / "generator.safetensors"
    ).stat().st_size
    half = PlannerModel.load(tmp_path / "half")
    assert next(half.parameters()).dtype == torch.float32
    with torch.no_grad():
        c = half.encoder(*(ex[k] for k in SCENE_INPUTS))[0]
    assert torch.allclose(a, c, atol=5e-2) and not torch.equal(a, c)


def test_normalizer_roundtrip_and_speed_awareness():
    rng = np.random.default_rng(0)
    speeds = rng.uniform(0, 20, 200)
    times = (np.arange(8) + 1) * 0.5
    trajs = np.stack([speeds[:, None] * times, rng.normal(0, 0.3, (200, 8))], -1)
    trajs[..., 0] += rng.normal(0, 0.5, (200, 8))
    norm = TrajectoryNormalizer.fit(trajs, speeds, 0.5)
    z = norm.normalize(trajs, speeds)
    assert np.allclose(norm.denormalize(z, speeds), trajs, atol=1e-4)
    # constant-velocity motion is absorbed by the prior: residual std is the noise, not the speed spread
    assert norm.std[:, 0].max() < 1.0
    zt = norm.normalize(
        torch.from_numpy(trajs.astype(np.float32)), torch.from_numpy(speeds.astype(np.float32))
    )
    assert np.allclose(zt.numpy(), z, atol=1e-4)
    with pytest.raises(ValueError, match="std"):
        TrajectoryNormalizer(np.zeros((8, 2)), np.zeros((8, 2)), 0.5)


def test_speed_conditioned_normalizer_centres_a_standstill_on_standing_still():
    """Drivers at speed brake on average, drivers at a standstill stay or creep forward: one all-speed
    mean would centre a standing ego on a plan that reverses; the speed tables must not."""
    rng = np.random.default_rng(1)
    times = (np.arange(8) + 1) * 0.5
    speeds = np.concatenate([np.zeros(300), rng.uniform(8, 20, 700)])
    decel = np.where(speeds > 0, 1.0, 0.0)  # 1 m/s² braking at speed; standing cars creep at 0.3 m/s
    x = speeds[:, None] * times - 0.5 * decel[:, None] * times**2 + (speeds == 0)[:, None] * 0.3 * times
    trajs = np.stack([x + rng.normal(0, 0.2, x.shape), rng.normal(0, 0.2, x.shape)], -1)
    flat = TrajectoryNormalizer.fit(trajs, speeds, 0.5)
    by_speed = TrajectoryNormalizer.fit(trajs, speeds, 0.5, speed_step=2.5, prior_samples=10)
    assert by_speed.speed_conditioned and not flat.speed_conditioned
    zero = np.zeros((1, 8, 2), np.float32)
    assert flat.denormalize(zero, np.zeros(1))[0, -1, 0] < -1.0  # the all-speed mean reverses from rest
    assert by_speed.denormalize(zero, np.zeros(1))[0, -1, 0] == pytest.approx(1.2, abs=0.3)
    assert by_speed.denormalize(zero, np.full(1, 12.0))[0, -1, 0] == pytest.approx(12 * 4 - 8, abs=1.0)
    # exact round trip, numpy and torch agree, speeds past the last table are held at it
    z = by_speed.normalize(trajs, speeds)
    assert np.allclose(by_speed.denormalize(z, speeds), trajs, atol=1e-3)
    as_torch = (torch.from_numpy(a.astype(np.float32)) for a in (trajs, speeds))
    zt = by_speed.normalize(*as_torch)
    assert np.allclose(zt.numpy(), z, atol=1e-4)
    far = by_speed.denormalize(zero, np.full(1, 500.0)) - by_speed.prior(np.full(1, 500.0))
    last = by_speed.denormalize(zero, np.full(1, by_speed.speed_knots[-1])) - by_speed.prior(
        np.full(1, by_speed.speed_knots[-1]))
    assert np.allclose(far, last, atol=1e-4)
    # an invalid speed must not index outside the tables: NaN stays NaN, as with one table
    assert np.isnan(by_speed.denormalize(zero, np.full(1, np.nan))).all()
    assert np.isnan(by_speed.denormalize(torch.zeros(1, 8, 2), torch.full((1,), float("nan"))).numpy()).all()
    restored = TrajectoryNormalizer.from_dict(by_speed.to_dict())
    assert np.allclose(restored.denormalize(z, speeds), trajs, atol=1e-3)
    with pytest.raises(ValueError, match="speed_step"):
        TrajectoryNormalizer(by_speed.mean, by_speed.std, 0.5, 0.0)


@pytest.mark.parametrize("sampler", ["ddim", "dpmpp_2m"])
def test_sampler_recovers_oracle_and_is_deterministic(sampler):
    sched = NoiseSchedule(1000)
    target = np.random.default_rng(1).normal(size=(1, 1, 8, 2)).astype(np.float32)
    calls = []

    def oracle(x, t):
        calls.append(float(t[0]))
        return np.broadcast_to(target, x.shape)

    x = initial_noise(1, 5, 8, seed=3)
    out = sample(oracle, x, sched, 4, sampler)
    assert np.allclose(out, np.broadcast_to(target, out.shape), atol=1e-5)
    assert len(calls) == 4 and calls[0] == pytest.approx(999.0) and calls == sorted(calls, reverse=True)
    assert np.array_equal(initial_noise(1, 5, 8, 3), x) and not np.array_equal(initial_noise(1, 5, 8, 4), x)

    # a denoiser that depends on x: both samplers' intermediate steps matter and stay finite
    out2 = sample(lambda xx, t: 0.5 * xx, x, sched, 5, sampler)
    assert np.all(np.isfinite(out2))
    with pytest.raises(ValueError, match="K"):
        sample(oracle, x, sched, 0, sampler)
    with pytest.raises(ValueError, match="sampler"):
        sample(oracle, x, sched, 2, "euler")


def test_noise_schedule_limits():
    s = NoiseSchedule(1000)
    assert s.alpha_bar(0) > 0.999 and s.alpha_bar(999) < 1e-3
    assert np.all(np.diff(s.alpha_bar(np.arange(1000))) <= 0)


def test_box_overlap_agrees_with_polygon_intersection():
    """The closed-form separating-axis test (with its bounding-circle cull) against shapely's exact
    polygon intersection on random boxes, many of them near-touching, over a broadcast M x N x T grid."""
    from shapely.geometry import Polygon

    rng = np.random.default_rng(7)
    a = np.concatenate([rng.uniform(-6, 6, (12, 1, 3, 2)), rng.uniform(-4, 4, (12, 1, 3, 1)),
                        rng.uniform(0.3, 6, (12, 1, 3, 2))], -1)
    b = np.concatenate([rng.uniform(-6, 6, (1, 30, 3, 2)), rng.uniform(-4, 4, (1, 30, 3, 1)),
                        rng.uniform(0.3, 6, (1, 30, 3, 2))], -1)
    got = boxes_overlap(a, b)
    assert got.shape == (12, 30, 3) and 0.1 < got.mean() < 0.9
    ab = np.broadcast_arrays(a, b)
    for idx in np.ndindex(got.shape):
        pa, pb = (Polygon(box_corners(*box[idx])) for box in ab)
        assert got[idx] == pa.intersects(pb), (idx, ab[0][idx], ab[1][idx])
    assert boxes_overlap((0, 0, 0, 4, 2), (np.nan, 0, 0, 4, 2))  # undefined counts as a hit
    with pytest.raises(ValueError, match="b: expected boxes"):
        boxes_overlap((0, 0, 0, 4, 2), np.zeros((3, 4)))


def test_tracks_overlap_equals_the_exhaustive_pairwise_test():
    """The broad phase of tracks_overlap drops only pairs that cannot touch: on random scenes (agents
    clustered near the tracks and scattered far, some invalid, some undefined) it equals the exhaustive
    M x N x T boxes_overlap."""
    from rad2_core.geometry import tracks_overlap

    rng = np.random.default_rng(11)
    for trial in range(40):
        m, n, t = rng.integers(1, 20), rng.integers(0, 40), rng.integers(1, 9)
        a = np.concatenate([rng.uniform(-10, 30, (m, t, 2)), rng.uniform(-4, 4, (m, t, 1)),
                            rng.uniform(0.5, 6, (m, t, 2))], -1)
        spread = 15.0 if trial % 2 else 60.0
        b = np.concatenate([rng.uniform(-spread, spread, (n, t, 2)), rng.uniform(-4, 4, (n, t, 1)),
                            rng.uniform(0.5, 6, (n, t, 2))], -1)
        valid = rng.random((n, t)) > 0.2
        if trial % 5 == 0 and n:
            b[rng.integers(n), rng.integers(t), rng.integers(5)] = np.nan
        if trial % 7 == 0:
            a[rng.integers(m), rng.integers(t), rng.integers(5)] = np.nan
        want = (boxes_overlap(a[:, None], b[None]) & valid[None]).any(axis=1)
        np.testing.assert_array_equal(tracks_overlap(a, b, valid), want)
        np.testing.assert_array_equal(tracks_overlap(a, b), boxes_overlap(a[:, None], b[None]).any(axis=1))
    with pytest.raises(ValueError, match="tracks_overlap"):
        tracks_overlap(np.zeros((2, 3, 5)), np.zeros((2, 4, 5)))


def test_box_overlap_and_collisions():
    a = (0, 0, 0, 4.0, 2.0)
    assert boxes_overlap(a, (3.9, 0, 0.3, 4.0, 2.0))
    assert not boxes_overlap(a, (4.2, 0, 0, 4.0, 2.0))
    assert not boxes_overlap(a, (0, 2.1, 0, 4.0, 2.0))
    assert boxes_overlap(a, (2.5, 1.5, np.pi / 4, 2.0, 1.0))
    from rad2_core.open_loop_metrics import LoggedFuture

    times = (np.arange(8) + 1) * 0.5
    plans = np.stack([np.stack([10 * times, np.zeros(8)], -1), np.stack([10 * times, np.full(8, 4.0)], -1)])
    # a parked car 30 m ahead in the ego lane, and a moving one far to the left
    pose = np.zeros((2, 8, 3))
    pose[0, :, 0] = 30.0
    pose[1, :, 0], pose[1, :, 1] = 5 * times, 20.0
    spd = np.array([[0.0] * 9, [5.0] * 9])
    fut = LoggedFuture(
        plans[0],
        np.ones(8, bool),
        pose,
        np.array([[4.5, 2.0], [4.5, 2.0]]),
        spd,
        np.ones((2, 8), bool),
        (4.8, 1.9),
    )
    col = plan_collisions(plans, fut, STATIC_SPEED, vehicle_max_curvature(PARAMS))
    assert col["collision"].tolist() == [True, False]
    assert col["static"].tolist() == [True, False] and col["dynamic"].tolist() == [False, False]
    fut.agent_valid[0] = False
    assert not plan_collisions(plans, fut, STATIC_SPEED, vehicle_max_curvature(PARAMS))["collision"].any()


def test_displacement_errors_and_accumulator():
    gt = np.stack([np.arange(1, 9, dtype=float), np.zeros(8)], -1)
    cands = np.stack([gt + [0.0, 1.0], gt + [0.0, 3.0]])
    d = displacement_errors(cands, 1, gt)
    assert d == pytest.approx({"minADE": 1.0, "minFDE": 1.0, "ADE": 3.0, "FDE": 3.0})
    assert medoid_index(np.stack([gt, gt + 0.1, gt + 0.2, gt + 10])) in (1, 2)


def test_logged_future_and_recovery_target():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from rad2_training.imitation import recovery_target, sample_steps
    from synthetic_scenes import make_clip

    clip = make_clip(num_steps=81)
    fut = logged_future(clip, 10, 0.5, 8)
    assert fut.ego.shape == (8, 2) and fut.ego_valid.all()
    assert fut.ego[-1, 0] == pytest.approx(40.0, abs=1.5)  # 10 m/s for 4 s, mostly straight ahead
    tgt0 = recovery_target(clip, 10, np.zeros(3), 0.5, 8, 2.0)
    assert np.allclose(tgt0, fut.ego, atol=1e-4)
    # perturbed 1 m to the right: the log is 1 m to the LEFT at first and fully rejoined after 2 s
    tgt = recovery_target(clip, 10, np.array([0.0, -1.0, 0.0]), 0.5, 8, 2.0)
    assert tgt[0, 1] - tgt0[0, 1] == pytest.approx(0.25, abs=0.05)
    assert np.allclose(tgt[4:], tgt0[4:] + [0.0, 1.0], atol=0.05)
    assert sample_steps(81, 0.1, 0.5, 8, 10) == [0, 10, 20, 30, 40]
    acc = OpenLoopAccumulator.from_params(PARAMS, PARAMS)
    acc.add(np.stack([tgt0, tgt0 + 1.0]), 0, fut)
    s = acc.summary()
    assert s["ADE"] == pytest.approx(0.0, abs=1e-6) and s["samples"] == 1.0


def test_observation_shape_errors_name_the_field():
    cfg = tiny_config()
    ex = example_inputs(cfg, batch=1)
    obs = {k: ex[k][0] for k in SCENE_INPUTS}
    assert observation_inputs(obs, cfg)["bev"].shape == (1, 10, 32, 32)
    bad = dict(obs, agents=np.zeros((5, 10), np.float32))
    with pytest.raises(ObservationError, match=r"agents: shape \(5, 10\)"):
        observation_inputs(bad, cfg)
    with pytest.raises(ObservationError, match="ego_state"):
        observation_inputs(dict(obs, ego_state=np.full(4, np.nan, np.float32)), cfg)


def test_il_loss_decreases_on_a_fixed_batch():
    from rad2_training.imitation import diffusion_loss

    cfg = tiny_config(bev_hw=(16, 16), bev_stages=[8])
    torch.manual_seed(0)
    model = PlannerModel(cfg, TrajectoryNormalizer.identity(8, 0.5, 5.0))
    ex = torch_inputs(cfg, batch=4)
    batch = {k: ex[k] for k in SCENE_INPUTS}
    batch["target"] = torch.cumsum(torch.rand(4, 8, 2), dim=1) * torch.tensor([5.0, 0.5])
    opt = torch.optim.Adam(list(model.encoder.parameters()) + list(model.denoiser.parameters()), lr=3e-3)
    sched = NoiseSchedule(1000)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        loss = diffusion_loss(model, batch, sched, 4, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])


def test_safe_medoid_avoids_an_extrapolated_agent():
    from rad2_core.bicycle import VehicleParams
    from rad2_core.open_loop_metrics import vehicle_max_curvature
    from rad2_planner.candidates import safe_medoid_index

    vehicle = VehicleParams.from_params(VEHICLE)  # ego box and tightest turn of params/vehicle.yaml
    limits = ((vehicle.length, vehicle.width), vehicle_max_curvature(PARAMS))

    times = (np.arange(8) + 1) * 0.5
    fast = np.stack([10 * times, np.zeros(8)], -1)  # reaches the stopped car 25 m ahead
    slow = np.stack([np.minimum(3 * times, 12.0), np.zeros(8)], -1)  # stops well short of it
    cands = np.stack([fast, fast + [0.2, 0.0], fast - [0.2, 0.0], slow])
    agents = np.zeros((3, 10), np.float32)
    agents[0, :8] = [25.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.5, 2.0]
    mask = np.array([True, False, False])
    assert medoid_index(cands) in (0, 1, 2)
    assert safe_medoid_index(cands, agents, mask, 0.5, *limits) == 3
    # the same car in the next lane is no obstacle: back to the plain medoid
    agents[0, 1] = 6.0
    assert safe_medoid_index(cands, agents, mask, 0.5, *limits) == medoid_index(cands)


def test_safe_medoid_progress_quantile_keeps_the_faster_safe_candidates_along_the_route():
    from rad2_core.bicycle import VehicleParams
    from rad2_core.open_loop_metrics import vehicle_max_curvature
    from rad2_core.route_path import observation_route
    from rad2_planner.candidates import safe_medoid_index

    vehicle = VehicleParams.from_params(VEHICLE)
    limits = ((vehicle.length, vehicle.width), vehicle_max_curvature(PARAMS))
    times = (np.arange(8) + 1) * 0.5
    # a left turn: straight for 10 m, then along +y
    route_tokens = np.array([[0.0, 0.0], [10.0, 0.0], [10.0, 40.0]], np.float32)
    route = observation_route(route_tokens, np.ones(3, bool))

    def along(speed):  # a candidate following the route at a constant speed
        s = speed * times
        return np.stack([np.minimum(s, 10.0), np.maximum(s - 10.0, 0.0)], -1)

    slow = [along(v) for v in (2.0, 2.2, 2.4, 2.6, 2.8)]  # the crowded slow mode
    fast = [along(v) for v in (6.0, 6.3)]
    straight_on = np.stack([7.0 * times, np.zeros(8)], -1)  # long, but leaves the route at the turn
    cands = np.stack(slow + fast + [straight_on])
    no_agents, mask = np.zeros((1, 10), np.float32), np.zeros(1, bool)
    plain = safe_medoid_index(cands, no_agents, mask, 0.5, *limits)
    assert plain in range(5)  # the medoid sits in the slow mode
    assert safe_medoid_index(cands, no_agents, mask, 0.5, *limits, route, 0.0) == plain
    # the faster quarter by progress ALONG THE ROUTE: the two fast ones (the straight-on one gets only
    # about 10 m along the turning route although its path is longer)
    picked = safe_medoid_index(cands, no_agents, mask, 0.5, *limits, route, 0.75)
    assert picked in (5, 6)
    # safety comes first: a stopped car 14 m up the turn makes the fast ones unsafe
    agents = np.zeros((1, 10), np.float32)
    agents[0, :8] = [10.0, 14.0, 0.0, 1.0, 0.0, 0.0, 4.5, 2.0]
    safe_pick = safe_medoid_index(cands, agents, np.ones(1, bool), 0.5, *limits, route, 0.75)
    assert safe_pick in range(5) or safe_pick == 7
    assert np.abs(cands[safe_pick, :, 1]).max() < 14.0 - 2.25 - 2.5


def test_corrupted_checkpoints_are_errors_naming_the_file(tmp_path):
    from rad2_planner.networks.model import CheckpointError

    d = randomised_model(tiny_config()).save(tmp_path / "ckpt")
    gen = d / "generator.safetensors"
    good = gen.read_bytes()
    gen.write_bytes(good[: len(good) // 2])  # a truncated copy
    with pytest.raises(CheckpointError, match=r"generator\.safetensors: unreadable weights"):
        PlannerModel.load(d)
    gen.write_bytes(good)
    other = randomised_model(tiny_config(d_model=16, num_heads=2)).save(tmp_path / "other")
    (d / "discriminator.safetensors").write_bytes((other / "discriminator.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"discriminator\.safetensors: weights do not fit"):
        PlannerModel.load(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: unreadable checkpoint metadata"):
        PlannerModel.load(d)


def test_discriminator_candidates_safe_ranks_and_samples_the_safe_set_only():
    """planner.discriminator_candidates: safe -> the argmax of a trained discriminator and the RL draw
    are taken among safe_candidates (the safe set of safe_medoid), even where the discriminator
    prefers a candidate that runs into an agent."""
    from rad2_core.config import load_params
    from rad2_planner.candidates import safe_candidates
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.selection import CandidateDistribution

    params = load_params("planner")
    params["planner"]["discriminator_candidates"] = "safe"
    policy = Rad2Policy(randomised_model(tiny_config()), {**PARAMS, **params}, backend="pytorch",
                        num_candidates=4)
    policy.model.discriminator_trained = True
    times = (np.arange(8) + 1) * 0.5
    fast = np.stack([10 * times, np.zeros(8)], -1)  # reaches the stopped car 25 m ahead
    slow = np.stack([np.minimum(3 * times, 12.0), np.zeros(8)], -1)
    cands = np.stack([fast, fast + [0.2, 0.0], slow, slow + [0.1, 0.0]])[None]
    agents = np.zeros((1, 3, 10), np.float32)
    agents[0, 0, :8] = [25.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.5, 2.0]
    inputs = {"agents": agents, "agents_mask": np.array([[True, False, False]])}
    safe = safe_candidates(cands[0], agents[0], inputs["agents_mask"][0], 0.5, policy.ego_size,
                           policy.max_curvature)
    assert safe.tolist() == [2, 3]
    logits = np.array([[9.0, 8.0, 0.0, 1.0]], np.float32)  # prefers the colliding ones
    assert policy.select_deterministic(cands, logits, inputs) == ([3], "discriminator:safe")
    draw = policy._sample(logits, CandidateDistribution(), [np.random.default_rng(0)],
                          policy.discriminator_mask(cands, inputs))
    assert draw.index[0] in (2, 3) and draw.probs[0, :2].sum() == 0.0
    params["planner"]["discriminator_candidates"] = "all"
    plain = Rad2Policy(policy.model, {**PARAMS, **params}, backend="pytorch", num_candidates=4)
    assert plain.select_deterministic(cands, logits, inputs) == ([0], "discriminator")
    params["planner"]["discriminator_candidates"] = "nearest"
    with pytest.raises(ValueError, match="planner.discriminator_candidates"):
        Rad2Policy(policy.model, {**PARAMS, **params}, backend="pytorch", num_candidates=4)


def test_consensus_prior_leans_selection_to_the_medoid_of_the_allowed_set():
    """planner.discriminator_prior_weight κ: softmax(l + κ·prior). With flat logits (an untrained head)
    the argmax is the medoid of the allowed candidates; a discriminator that prefers another candidate by
    more than the prior's margin still gets its way; a negative or non-number κ is refused by name."""
    from rad2_core.config import load_params
    from rad2_planner.candidates import consensus_prior, medoid_index
    from rad2_planner.policy import Rad2Policy

    times = (np.arange(8) + 1.0)[:, None]
    cluster = [np.hstack([times * v, np.zeros_like(times)]) for v in (5.0, 5.2, 5.4, 5.6)]
    outlier = np.hstack([times * 9.0, times * 0.5])
    cands = np.stack(cluster + [outlier]).astype(np.float32)  # M = 5
    prior = consensus_prior(cands)
    assert int(np.argmax(prior)) == medoid_index(cands) and prior.max() == 0.0
    assert prior[4] == prior.min() < -1.0  # the outlier is the least preferred
    allowed = np.array([False, False, True, True, True])
    sub = consensus_prior(cands, allowed)
    assert (sub[~allowed] == 0).all() and int(np.argmax(np.where(allowed, sub, -np.inf))) == 3
    assert sub[2] > sub[4]  # within the allowed set, the cluster member beats the outlier
    angles = np.array([0.0, 2.0, 4.0]) * np.pi / 3.0
    ring = np.stack([np.full((8, 2), (np.cos(a), np.sin(a))) for a in angles])
    assert np.allclose(consensus_prior(ring), 0.0)  # equally far apart: no preference

    params = load_params("planner")
    params["planner"]["discriminator_prior_weight"] = 3.0
    policy = Rad2Policy(randomised_model(tiny_config()), {**PARAMS, **params}, backend="pytorch",
                        num_candidates=5)
    policy.model.discriminator_trained = True
    inputs = {"agents": np.zeros((1, 1, 10), np.float32), "agents_mask": np.zeros((1, 1), bool)}
    flat = np.zeros((1, 5), np.float32)
    kappa_prior = policy.selection_prior(cands[None], None)
    np.testing.assert_allclose(kappa_prior[0], 3.0 * prior, rtol=1e-6)
    assert policy.select_deterministic(cands[None], flat + kappa_prior, inputs)[0] == [medoid_index(cands)]
    strong = np.array([[0.0, 0.0, 0.0, 0.0, 20.0]], np.float32)  # learned preference outweighs the prior
    assert policy.select_deterministic(cands[None], strong + kappa_prior, inputs)[0] == [4]
    params["planner"]["discriminator_prior_weight"] = 0.0
    assert Rad2Policy(policy.model, {**PARAMS, **params}, backend="pytorch",
                      num_candidates=5).selection_prior(
        cands[None], None) is None
    for bad in (-1.0, float("nan"), 1e6, "4"):
        params["planner"]["discriminator_prior_weight"] = bad
        with pytest.raises(ValueError, match="planner.discriminator_prior_weight"):
            Rad2Policy(policy.model, {**PARAMS, **params}, backend="pytorch", num_candidates=5)
