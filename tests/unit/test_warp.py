"""BEV-Warp: identity, inverse, agreement with rasterisation at the simulated pose, both backends."""

import numpy as np
import pytest
from bev_warp_sim.warp import BevWarper, WarpError, warp_matrix
from rad2_core.bev import rasterize_bev, snapshot_from_clip
from rad2_core.config import load_params
from rad2_core.geometry import se2_compose
from synthetic_scenes import make_clip

VEHICLE = load_params("vehicle")
BEV = load_params("bev")
BACKENDS = ("opencv", "torch")


@pytest.fixture(scope="module")
def warper():
    return BevWarper(BEV)


@pytest.fixture(scope="module")
def scene():
    clip = make_clip()
    return clip, snapshot_from_clip(clip, 40, BEV, VEHICLE)


def _smooth_field(seed=0):
    import cv2

    rng = np.random.default_rng(seed)
    c, h, w = len(BEV["bev"]["channels"]), BEV["bev"]["height"], BEV["bev"]["width"]
    f = rng.normal(size=(c, h, w)).astype(np.float32)
    return np.stack([cv2.GaussianBlur(ch, (0, 0), 6.0) for ch in f]) * 10.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_warp_is_exact(warper, backend):
    f = _smooth_field()
    pose = np.array([12.0, -3.0, 0.7])
    out = warper(f, pose, pose, backend=backend)
    if backend == "opencv":
        np.testing.assert_array_equal(out, f)
    else:
        np.testing.assert_allclose(out, f, atol=1e-5)


def test_warp_matrix_maps_reference_frame_into_simulated_frame():
    ref = np.array([5.0, 2.0, 0.3])
    sim = se2_compose(ref, [1.0, 0.5, 0.1])  # simulated pose 1 m ahead, 0.5 m left in the logged frame
    m = warp_matrix(ref, sim)
    # the simulated ego origin, seen from the logged frame at (1, 0.5), is the origin of the new frame
    p_ref = np.array([1.0, 0.5, 1.0])
    np.testing.assert_allclose(m @ p_ref, [0.0, 0.0, 1.0], atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_warp_then_inverse_recovers_interior(warper, backend):
    f = _smooth_field(1)
    ref = np.array([0.0, 0.0, 0.2])
    sim = se2_compose(ref, [2.3, -1.1, 0.06])
    there = warper(f, ref, sim, backend=backend)
    back = warper(there, sim, ref, backend=backend)
    inner = (slice(None), slice(16, -16), slice(16, -16))
    err = np.abs(back[inner] - f[inner])
    # two bilinear resamplings of a smooth field; vector channels rotate there and back
    assert err.max() < 0.05 * np.abs(f).max()
    assert not np.allclose(there[inner], f[inner], atol=0.05)  # the warp did move things


@pytest.mark.parametrize("backend", BACKENDS)
def test_warped_equals_rasterised_at_simulated_pose(warper, scene, backend):
    clip, snap = scene
    ref = clip.ego_pose(40)
    logged = rasterize_bev(snap, ref, params=BEV)
    channels = BEV["bev"]["channels"]
    for delta in ([1.2, 0.6, 0.05], [-0.7, -1.3, -0.08], [0.3, 0.2, 0.0]):
        sim = se2_compose(ref, delta)
        warped = warper(logged, ref, sim, backend=backend)
        direct = rasterize_bev(snap, sim, params=BEV)
        occ = [channels.index(n) for n in ("drivable_area", "agents_t0", "agents_t-5", "agents_t-10")]
        # compare where both rasters see the scene (the warped one is blank outside the logged view)
        view = warper(np.ones_like(logged), ref, sim, backend=backend)[occ] > 0.999
        a, b = (warped[occ] >= 0.5) & view, (direct[occ] >= 0.5) & view
        iou = (a & b).sum() / max((a | b).sum(), 1)
        assert iou > 0.95, (delta, iou)
        # per channel: small agent boxes (~9 x 4 cells) lose a boundary row to the two discretisations,
        # a misplaced warp (wrong sign or direction, a cell off) drops far below this
        for k in range(len(occ)):
            if b[k].sum():
                assert (a[k] & b[k]).sum() / max((a[k] | b[k]).sum(), 1) > 0.75, (channels[occ[k]], delta)
        # vector channels: rotated into the simulated frame
        kx, ky = channels.index("agent_velocity_x"), channels.index("agent_velocity_y")
        inside = (direct[channels.index("agents_t0")] > 0.5) & (warped[channels.index("agents_t0")] > 0.999)
        if inside.any():
            np.testing.assert_allclose(warped[kx][inside], direct[kx][inside], atol=0.05)
            np.testing.assert_allclose(warped[ky][inside], direct[ky][inside], atol=0.05)


def test_backends_agree_and_batch_matches_single(warper):
    f = _smooth_field(2)
    ref = np.array([[0.0, 0.0, 0.0], [3.0, 1.0, -0.4]])
    sim = se2_compose(ref, np.array([[1.0, 0.5, 0.1], [-2.0, 0.3, -0.2]]))
    batch = np.stack([f, 0.5 * f])
    a = warper(batch, ref, sim, backend="opencv")
    b = warper(batch, ref, sim, backend="torch")
    inner = (slice(None), slice(None), slice(4, -4), slice(4, -4))
    assert np.abs(a[inner] - b[inner]).max() < 0.02 * np.abs(f).max()  # OpenCV uses 1/32-px weights
    for i in range(2):
        np.testing.assert_array_equal(a[i], warper(batch[i], ref[i], sim[i], backend="opencv"))


def test_bad_inputs_name_the_field(warper):
    with pytest.raises(WarpError, match="features"):
        warper(np.zeros((3, 10, 10), np.float32), np.zeros(3), np.zeros(3))
    with pytest.raises(WarpError, match="poses"):
        warper(_smooth_field(), np.array([np.nan, 0, 0]), np.zeros(3))
    with pytest.raises(WarpError, match="warp_backend"):
        BevWarper(BEV, backend="cuda")
