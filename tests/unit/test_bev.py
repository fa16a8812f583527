"""BEV raster and tokens: SE(2) equivariance, channel layout from params, masks, token transforms."""

import copy
from pathlib import Path

import cv2
import numpy as np
import pytest
from bev_warp_sim.warp import BevWarper
from rad2_core.bev import BevError, get_config, rasterize_bev, snapshot_from_clip
from rad2_core.config import load_merged, load_params
from rad2_core.geometry import relative_pose, se2_compose
from rad2_core.observation import (
    ObservationError,
    build_observation,
    stack_observations,
    transform_tokens,
)
from rad2_datasets.adapters.av2 import load_av2_scenario
from synthetic_scenes import make_clip

LOG_PARAMS = load_merged("bev", "sim", "validators")

AV2_DIR = Path(__file__).parents[1] / "fixtures" / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151"
BEV = load_params("bev")
VEHICLE = load_params("vehicle")

DELTAS = [(2.3, -1.7, 0.25), (-3.1, 2.2, -0.6), (0.26, 0.13, 1.3)]
OCCUPANCY = ("drivable_area", "agents_t0", "agents_t-5", "agents_t-10")


@pytest.fixture(scope="module")
def clips():
    return [make_clip(), load_av2_scenario(AV2_DIR, LOG_PARAMS)]


@pytest.fixture(scope="module")
def fine_params():
    """Same field of view at 0.25 m cells (boxes span more cells, so the discretisation error is smaller)."""
    p = copy.deepcopy(load_params("bev"))
    p["bev"].update(resolution_m=0.25, height=256, width=256)
    return p


def _warp(raster, delta, cfg, mode="bilinear"):
    """The simulator's warp by ``delta`` (new ego pose in the old ego frame), plus the interior of the
    new raster that the old one covers (eroded by two cells)."""
    warper = BevWarper(cfg)
    out = warper(raster, np.zeros(3), delta, mode=mode)
    ones = warper(np.ones(cfg.shape, np.float32), np.zeros(3), delta, mode="nearest")
    covered = ones[cfg.channel_index("drivable_area")] > 0.5
    interior = cv2.erode(covered.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    return out, interior


def _iou(a, b, mask):
    a, b = a[mask] > 0.5, b[mask] > 0.5
    union = (a | b).sum()
    return 1.0 if union == 0 else (a & b).sum() / union


def _equivariance(clip, params, steps=(20, 60, 100)):
    cfg = get_config(params)
    ious = {n: [] for n in OCCUPANCY}
    inter = {n: [0, 0] for n in OCCUPANCY}
    vel_err = []
    for t in steps:
        snap = snapshot_from_clip(clip, t, params, VEHICLE)
        ref = rasterize_bev(snap, params=params)
        for d in DELTAS:
            moved = rasterize_bev(snap, ego_pose=se2_compose(snap.ego_pose, d), params=params)
            warped, interior = _warp(ref, d, cfg)
            for n in OCCUPANCY:
                k = cfg.channel_index(n)
                a, b = moved[k][interior] > 0.5, warped[k][interior] > 0.5
                inter[n][0] += (a & b).sum()
                inter[n][1] += (a | b).sum()
                ious[n].append(_iou(moved[k], warped[k], interior))
            # velocity: nearest-neighbour warp; where both rasters have a box, the rotated vectors agree
            nearest, _ = _warp(ref, d, cfg, "nearest")
            kx, ky = cfg.channel_index("agent_velocity_x"), cfg.channel_index("agent_velocity_y")
            both = (
                interior & (np.hypot(moved[kx], moved[ky]) > 0.1) & (np.hypot(nearest[kx], nearest[ky]) > 0.1)
            )
            if both.any():
                err = np.hypot(moved[kx] - nearest[kx], moved[ky] - nearest[ky])[both]
                vel_err.append(float(np.median(err)))
    pooled = {n: v[0] / max(v[1], 1) for n, v in inter.items()}
    return pooled, vel_err


def test_channels_and_shape_from_params(clips):
    params = load_params("bev")
    cfg = get_config(params)
    bev = rasterize_bev(snapshot_from_clip(clips[0], 30, BEV, VEHICLE), params=BEV)
    assert bev.dtype == np.float32 and bev.shape == (len(params["bev"]["channels"]), 128, 128)
    assert cfg.channels == tuple(params["bev"]["channels"])
    # the ego sits on its lane: drivable area and speed limit under the ego, centreline near it
    xs, ys = cfg.cell_centers()
    j, i = int(np.argmin(np.abs(xs))), int(np.argmin(np.abs(ys)))
    assert bev[cfg.channel_index("drivable_area"), i, j] > 0.99
    assert bev[cfg.channel_index("speed_limit"), i, j] == pytest.approx(13.9, abs=1e-4)
    assert bev[cfg.channel_index("route"), i - 1 : i + 2, j].max() == 1.0
    # at t = 3 s the leader (8 m/s, ego 10 m/s) is 19 m ahead, along +x in the ego frame
    jl = int(np.argmin(np.abs(xs - 19.0)))
    assert bev[cfg.channel_index("agents_t0"), i, jl] > 0.99
    assert bev[cfg.channel_index("agent_velocity_x"), i, jl] == pytest.approx(8.0, abs=1e-4)
    assert abs(bev[cfg.channel_index("agent_velocity_y"), i, jl]) < 1e-4
    # history: 1 s ago the leader was 8 m further back, drawn in the current ego frame
    hist = bev[cfg.channel_index("agents_t-10"), i]
    assert hist[int(np.argmin(np.abs(xs - 11.0)))] > 0.99 and hist[jl] < 0.01
    # a different channel list is honoured; unknown names are rejected
    p2 = copy.deepcopy(params)
    p2["bev"]["channels"] = ["drivable_area", "agents_t0", "agents_t-3", "crosswalk"]
    p2["bev"]["vector_channels"] = []
    assert rasterize_bev(snapshot_from_clip(clips[0], 30, p2, VEHICLE), params=p2).shape == (4, 128, 128)
    p2["bev"]["channels"] = ["drivable_area", "lidar"]
    with pytest.raises(BevError, match="lidar"):
        get_config(p2)


def test_equivariance_default_grid(clips):
    for clip in clips:
        pooled, vel_err = _equivariance(clip, load_params("bev"))
        assert pooled["drivable_area"] > 0.95, pooled
        # 0.5 m cells: a car is ~4 x 9 cells, so +-half-cell edges cap agent IoU near 0.92
        for n in OCCUPANCY[1:]:
            assert pooled[n] > 0.88, (clip.clip_id, pooled)
        assert vel_err and max(vel_err) < 0.05


def test_equivariance_fine_grid(clips, fine_params):
    for clip in clips:
        pooled, vel_err = _equivariance(clip, fine_params, steps=(30, 90))
        assert pooled["drivable_area"] > 0.95
        # all agent occupancy (now and history) pooled; each channel alone stays above 0.93
        agents = np.mean([pooled[n] for n in OCCUPANCY[1:]])
        assert agents > 0.95, (clip.clip_id, pooled)
        assert min(pooled[n] for n in OCCUPANCY[1:]) > 0.93, (clip.clip_id, pooled)
        assert max(vel_err) < 0.05


def test_delta_warp_matches_pose_pair_warp_on_both_backends(clips):
    """Warping by a relative pose equals warping between the absolute poses, and the OpenCV and torch
    backends agree on a real raster."""
    cfg = get_config(BEV)
    snap = snapshot_from_clip(clips[1], 50, BEV, VEHICLE)
    ref = rasterize_bev(snap, params=BEV)
    d = DELTAS[0]
    ours, interior = _warp(ref, d, cfg)
    pose_pair = BevWarper(cfg)(ref, snap.ego_pose, se2_compose(snap.ego_pose, d))
    np.testing.assert_allclose(ours[:, interior], pose_pair[:, interior], atol=1e-4)
    torch_out = BevWarper(cfg, backend="torch")(ref, np.zeros(3), d)
    # OpenCV interpolates with 1/32-px weights; occupancy in [0, 1], velocities and limits in m/s
    tol = 0.02 * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(ours[:, interior], torch_out[:, interior], atol=tol)


def test_tokens_transform_consistency(clips):
    for clip in clips:
        snap = snapshot_from_clip(clip, 40, BEV, VEHICLE)
        obs = build_observation(snap, params=BEV).validate(load_params("bev"))
        for d in DELTAS:
            new_pose = se2_compose(snap.ego_pose, d)
            direct = build_observation(snap, ego_pose=new_pose, params=BEV)
            moved = transform_tokens(obs, relative_pose(snap.ego_pose, new_pose))
            # agents: same set (up to ordering), compare row by nearest position
            a = moved.agents[moved.agents_mask]
            b = direct.agents[direct.agents_mask]
            common = min(len(a), len(b))
            for row in b[:common]:
                k = np.argmin(np.linalg.norm(a[:, :2] - row[:2], axis=1))
                np.testing.assert_allclose(a[k], row, atol=2e-3)
            # route: both start at the projection, so compare points' lateral offsets to the line
            # through the transformed ones; directions must agree
            np.testing.assert_allclose(moved.route[0, 2:4], direct.route[0, 2:4], atol=0.05)
            # map polylines: every direct centreline point lies on a transformed polyline
            pts = moved.map_polylines[moved.map_mask][:, :, :2].reshape(-1, 2)
            for poly in direct.map_polylines[direct.map_mask][:8]:
                if np.abs(poly[:, :2]).max() > 40:
                    continue
                d_min = np.linalg.norm(poly[:, None, :2] - pts[None], axis=-1).min(axis=1)
                assert np.median(d_min) < 3.5


def test_padding_masks_and_batching(clips):
    params = load_params("bev")
    obs = build_observation(snapshot_from_clip(clips[0], 50, BEV, VEHICLE), params=BEV)
    n_valid = int(obs.agents_mask.sum())
    assert n_valid == 3  # the late car is not valid yet
    assert obs.agents_mask[:n_valid].all() and not obs.agents_mask[n_valid:].any()
    assert np.all(obs.agents[n_valid:] == 0)
    d = np.linalg.norm(obs.agents[:n_valid, :2], axis=1)
    assert np.all(np.diff(d) >= 0), "nearest first"
    assert obs.map_mask.sum() == 4 and not obs.map_mask[4:].any()
    assert np.all(obs.map_polylines[4:] == 0)
    on_route = obs.map_polylines[obs.map_mask][:, 0, 5]
    assert sorted(on_route.tolist()) == [0.0, 0.0, 1.0, 1.0]
    # route points every spacing_m metres ahead
    spacing = params["tokens"]["route"]["spacing_m"]
    r = obs.route[obs.route_mask]
    np.testing.assert_allclose(np.linalg.norm(np.diff(r[:5, :2], axis=0), axis=1), spacing, atol=1e-3)
    # near the end of the route the tail is masked
    end_snap = snapshot_from_clip(make_clip(num_steps=200, ego_speed=12.0), 199, BEV, VEHICLE)
    end = build_observation(end_snap, params=BEV)
    assert 0 < end.route_mask.sum() < len(end.route_mask)
    assert end.route_mask[: end.route_mask.sum()].all()
    batch = stack_observations([obs, end]).validate(params)
    assert batch.batch_shape == (2,) and len(batch) == 2
    np.testing.assert_array_equal(batch[1].route_mask, end.route_mask)
    bad = obs.copy()
    bad.agents_mask = bad.agents_mask[:-1]
    with pytest.raises(ObservationError, match=r"agents_mask: shape \(31,\)"):
        bad.validate()
    bad = obs.copy()
    bad.bev = bad.bev.astype(np.float64)
    with pytest.raises(ObservationError, match="bev: dtype float64"):
        bad.validate()
