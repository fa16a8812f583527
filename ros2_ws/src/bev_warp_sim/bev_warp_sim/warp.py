"""BEV-Warp (RAD-2 §3.2, Eq. 9): resample BEV features into another ego frame — the one warp of the project.

The logged features ``B_ref`` at step t were rasterised in the ego frame of the logged pose ``P_ref``;
the simulated ego sits at ``P_sim``. ``M = P_sim⁻¹ · P_ref`` maps logged-ego coordinates to simulated-ego
coordinates, so each output cell centre ``p_sim`` reads the logged raster at ``M⁻¹ · p_sim =
P_ref⁻¹ · P_sim · p_sim`` (bilinear, or nearest; cells that fall outside the logged raster read 0). Vector
channels (``bev.vector_channels`` pairs, e.g. agent velocity) are expressed in the ego frame, so after the
spatial resampling they are rotated by the yaw deviation ``yaw_ref − yaw_sim``.

To re-express a raster by a relative pose ``delta_pose = relative_pose(old_ego, new_ego)`` (the argument
of ``rad2_core.observation.transform_tokens``), call the warper with ``ref_pose = (0, 0, 0)`` and
``sim_pose = delta_pose``.

Grid geometry is :class:`rad2_core.bev.BevConfig` (pixel <-> ego affine from
:func:`rad2_core.bev.ego_to_pixel_affine`). Two interchangeable backends: OpenCV ``warpAffine`` (one
call per frame, channels-last) and torch ``grid_sample`` (one call for a whole batch).
``rad2 bench sim`` measures both; ``sim.warp_backend`` picks the default. Scene tokens are
transformed by the same SE(2) with ``rad2_core.observation.transform_tokens`` (see :func:`warp_tokens`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rad2_core.bev import BevConfig, ego_to_pixel_affine, get_config
from rad2_core.geometry import relative_pose, se2_matrix, wrap_angle

BACKENDS = ("opencv", "torch")
MODES = ("bilinear", "nearest")


class WarpError(ValueError):
    """Bad warp input (shape, pose, backend)."""


def warp_matrix(ref_pose, sim_pose) -> np.ndarray:
    """``M = P_sim⁻¹ · P_ref`` as ``[..., 3, 3]``: logged-ego coordinates -> simulated-ego coordinates."""
    return se2_matrix(relative_pose(sim_pose, ref_pose))


def sampling_matrix(cfg: BevConfig, ref_pose, sim_pose) -> np.ndarray:
    """``[..., 3, 3]`` output pixel -> logged-raster pixel (the inverse map the samplers use)."""
    e2p = np.vstack([ego_to_pixel_affine(cfg), [0.0, 0.0, 1.0]])
    return e2p @ se2_matrix(relative_pose(ref_pose, sim_pose)) @ np.linalg.inv(e2p)  # middle = M⁻¹


def view_uncovered_fraction(cfg: BevConfig, ref_pose, sim_pose, samples: int = 16) -> np.ndarray:
    """``[B]``: the fraction of the simulated ego's view (``samples`` x ``samples`` points spread over its
    raster) that falls outside the logged raster, i.e. what a warp would leave empty. Poses ``[B, 3]``."""
    ref_pose = np.asarray(ref_pose, np.float64).reshape(-1, 3)
    sim_pose = np.asarray(sim_pose, np.float64).reshape(-1, 3)
    xs = cfg.origin_x + (np.arange(samples) + 0.5) * (cfg.width * cfg.resolution / samples)
    ys = cfg.origin_y + (np.arange(samples) + 0.5) * (cfg.height * cfg.resolution / samples)
    gx, gy = np.meshgrid(xs, ys)
    pts = np.stack([gx.ravel(), gy.ravel(), np.ones(gx.size)])  # [3, N] simulated-ego frame
    in_ref = se2_matrix(relative_pose(ref_pose, sim_pose)) @ pts  # [B, 3, N] logged-ego frame
    x1 = cfg.origin_x + cfg.width * cfg.resolution
    y1 = cfg.origin_y + cfg.height * cfg.resolution
    inside = ((in_ref[:, 0] >= cfg.origin_x) & (in_ref[:, 0] < x1) & (in_ref[:, 1] >= cfg.origin_y)
              & (in_ref[:, 1] < y1))
    return 1.0 - inside.mean(axis=1)


def rotate_vector_channels(features: np.ndarray, angle, cfg: BevConfig) -> np.ndarray:
    """In place (and returned): rotate the (x, y) vector channel pairs of ``features [..., C, H, W]`` by
    ``angle`` (a scalar, or one angle per leading index)."""
    if not cfg.vector_pairs:
        return features
    angle = np.asarray(angle, dtype=np.float64)[..., None, None]
    c, s = np.cos(angle).astype(features.dtype), np.sin(angle).astype(features.dtype)
    for a, b in cfg.vector_pairs:
        ix, iy = cfg.channel_index(a), cfg.channel_index(b)
        vx = features[..., ix, :, :].copy()
        vy = features[..., iy, :, :].copy()
        features[..., ix, :, :] = c * vx - s * vy
        features[..., iy, :, :] = s * vx + c * vy
    return features


class BevWarper:
    """Warp ``[C, H, W]`` or ``[B, C, H, W]`` float32 features from logged to simulated poses.

    ``params``: a :class:`BevConfig`, or a params dict with a ``bev`` block (params/bev.yaml as loaded).
    ``backend``: one of :data:`BACKENDS` (what this module implements; the choices of sim.warp_backend).
    """

    def __init__(self, params: BevConfig | dict[str, Any], backend: str = "opencv",
                 torch_threads: int | None = None):
        if backend not in BACKENDS:
            raise WarpError(f"sim.warp_backend: {backend!r} is not one of {BACKENDS}")
        self.cfg = get_config(params)
        self.backend = backend
        self.torch_threads = torch_threads

    def __call__(self, features, ref_pose, sim_pose, backend: str | None = None,
                 mode: str = "bilinear") -> np.ndarray:
        backend = backend or self.backend
        if backend not in BACKENDS:
            raise WarpError(f"backend: {backend!r} is not one of {BACKENDS}")
        if mode not in MODES:
            raise WarpError(f"mode: {mode!r} is not one of {MODES}")
        feats = np.asarray(features)
        single = feats.ndim == 3
        if single:
            feats = feats[None]
        if feats.ndim != 4 or feats.shape[1:] != self.cfg.shape:
            raise WarpError(f"features: expected [C, H, W] or [B, C, H, W] with (C, H, W) = "
                            f"{self.cfg.shape}, got {np.asarray(features).shape}")
        b = feats.shape[0]
        ref = np.broadcast_to(np.asarray(ref_pose, dtype=np.float64), (b, 3))
        sim = np.broadcast_to(np.asarray(sim_pose, dtype=np.float64), (b, 3))
        if not (np.isfinite(ref).all() and np.isfinite(sim).all()):
            raise WarpError(f"poses: not finite (ref {ref.tolist()}, sim {sim.tolist()})")
        feats = feats.astype(np.float32, copy=False)
        a = sampling_matrix(self.cfg, ref, sim)  # [B, 3, 3] pixel -> pixel
        if backend == "opencv":
            out = self._warp_opencv(feats, a, mode)
        else:
            out = self._warp_torch(feats, a, mode)
        rotate_vector_channels(out, wrap_angle(ref[:, 2] - sim[:, 2]), self.cfg)
        return out[0] if single else out

    def _warp_opencv(self, feats: np.ndarray, a: np.ndarray, mode: str) -> np.ndarray:
        import cv2

        out = np.empty_like(feats)
        size = (self.cfg.width, self.cfg.height)
        flags = (cv2.INTER_LINEAR if mode == "bilinear" else cv2.INTER_NEAREST) | cv2.WARP_INVERSE_MAP
        for k in range(feats.shape[0]):
            hwc = np.ascontiguousarray(feats[k].transpose(1, 2, 0))
            warped = cv2.warpAffine(hwc, a[k, :2].astype(np.float64), size, flags=flags,
                                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            if warped.ndim == 2:
                warped = warped[..., None]
            out[k] = warped.transpose(2, 0, 1)
        return out

    def _warp_torch(self, feats: np.ndarray, a: np.ndarray, mode: str) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        if self.torch_threads:
            torch.set_num_threads(int(self.torch_threads))
        w, h = self.cfg.width, self.cfg.height
        # normalised coordinate u = (2 j + 1) / W - 1 (align_corners=False)
        norm = np.array([[2.0 / w, 0.0, 1.0 / w - 1.0], [0.0, 2.0 / h, 1.0 / h - 1.0], [0.0, 0.0, 1.0]])
        theta = norm @ a @ np.linalg.inv(norm)
        with torch.no_grad():
            t_feats = torch.from_numpy(np.ascontiguousarray(feats))
            t_theta = torch.from_numpy(theta[:, :2].astype(np.float32))
            grid = F.affine_grid(t_theta, list(t_feats.shape), align_corners=False)
            out = F.grid_sample(t_feats, grid, mode=mode, padding_mode="zeros", align_corners=False)
        return out.numpy().copy()


def warp_tokens(observation, ref_pose, sim_pose):
    """Transform the token fields of a logged observation (ego frame of ``ref_pose``) into the ego frame
    of ``sim_pose`` ([3] or [B, 3] for a batched observation).

    Uses ``rad2_core.observation.transform_tokens(obs, delta_pose)`` with ``delta_pose`` the simulated
    pose expressed in the logged ego frame (``P_ref⁻¹ · P_sim``).
    """
    from rad2_core.observation import transform_tokens

    return transform_tokens(observation, relative_pose(ref_pose, sim_pose))
