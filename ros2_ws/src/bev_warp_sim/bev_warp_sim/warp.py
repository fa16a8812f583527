"""BEV-Warp (RAD-2 §3.2, Eq. 9): resample logged BEV features into the simulated ego frame.

The logged features ``B_ref`` at step t were rasterised in the ego frame of the logged pose ``P_ref``;
the simulated ego sits at ``P_sim``. ``M = P_sim⁻¹ · P_ref`` maps logged-ego coordinates to simulated-ego
coordinates, so each output cell centre ``p_sim`` reads the logged raster at ``M⁻¹ · p_sim =
P_ref⁻¹ · P_sim · p_sim`` (bilinear; cells that fall outside the logged raster read 0). Vector channels
(``bev.vector_channels`` pairs, e.g. agent velocity) are expressed in the ego frame, so after the
spatial resampling they are rotated by the yaw deviation ``yaw_ref − yaw_sim``.

Two interchangeable backends: OpenCV ``warpAffine`` (one call per frame, channels-last) and torch
``grid_sample`` (one call for a whole batch). ``tools/bench_sim.py`` measures both; ``sim.warp_backend``
picks the default. Scene tokens are transformed by the same SE(2) with
``rad2_planner.observation.transform_tokens`` (see :func:`warp_tokens`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rad2_planner.geometry import se2_compose, se2_inverse, se2_matrix, wrap_angle

BACKENDS = ("opencv", "torch")


class WarpError(ValueError):
    """Bad warp input (shape, pose, backend)."""


def warp_matrix(ref_pose, sim_pose) -> np.ndarray:
    """``M = P_sim⁻¹ · P_ref`` as ``[..., 3, 3]``: logged-ego coordinates -> simulated-ego coordinates."""
    return se2_matrix(se2_compose(se2_inverse(sim_pose), ref_pose))


class BevGrid:
    """Pixel <-> ego-frame metric geometry of the BEV raster (``params/bev.yaml`` ``bev`` block)."""

    def __init__(self, bev: dict[str, Any]):
        try:
            self.resolution = float(bev["resolution_m"])
            self.height = int(bev["height"])
            self.width = int(bev["width"])
            self.origin_x = float(bev["origin_x"])
            self.origin_y = float(bev["origin_y"])
            self.channels = [str(c) for c in bev["channels"]]
            vec = [str(c) for c in bev.get("vector_channels", [])]
        except KeyError as exc:
            raise WarpError(f"bev parameters: missing {exc.args[0]!r}") from None
        if len(vec) % 2:
            raise WarpError(f"bev.vector_channels: needs (x, y) pairs, got {len(vec)} names: {vec}")
        unknown = [c for c in vec if c not in self.channels]
        if unknown:
            raise WarpError(f"bev.vector_channels: {unknown} not in bev.channels {self.channels}")
        self.vector_pairs = [
            (self.channels.index(vec[k]), self.channels.index(vec[k + 1])) for k in range(0, len(vec), 2)
        ]
        r = self.resolution
        # pixel (col j, row i) with centres at integers -> ego metric (x, y)
        self.pixel_to_metric = np.array(
            [[r, 0.0, self.origin_x + 0.5 * r], [0.0, r, self.origin_y + 0.5 * r], [0.0, 0.0, 1.0]]
        )
        self.metric_to_pixel = np.linalg.inv(self.pixel_to_metric)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.channels), self.height, self.width)

    def cell_centres(self) -> np.ndarray:
        """``[H, W, 2]`` ego-frame (x, y) of every cell centre."""
        j, i = np.meshgrid(np.arange(self.width), np.arange(self.height))
        x = self.origin_x + (j + 0.5) * self.resolution
        y = self.origin_y + (i + 0.5) * self.resolution
        return np.stack([x, y], -1)

    def sampling_matrix(self, ref_pose, sim_pose) -> np.ndarray:
        """``[..., 3, 3]`` output pixel -> logged-raster pixel (the inverse map the samplers use)."""
        delta = se2_matrix(se2_compose(se2_inverse(ref_pose), sim_pose))  # = M⁻¹
        return self.metric_to_pixel @ delta @ self.pixel_to_metric


def _rotate_vector_channels(out: np.ndarray, pairs, dyaw) -> None:
    """In place: rotate (x, y) channel pairs of ``out [B, C, H, W]`` by ``dyaw [B]``."""
    if not pairs:
        return
    c = np.cos(dyaw).astype(out.dtype)[:, None, None]
    s = np.sin(dyaw).astype(out.dtype)[:, None, None]
    for ix, iy in pairs:
        vx = out[:, ix].copy()
        vy = out[:, iy]
        out[:, ix] = c * vx - s * vy
        out[:, iy] = s * vx + c * vy


class BevWarper:
    """Warp ``[C, H, W]`` or ``[B, C, H, W]`` float32 features from logged to simulated poses."""

    def __init__(self, bev: dict[str, Any], backend: str = "opencv", torch_threads: int | None = None):
        if backend not in BACKENDS:
            raise WarpError(f"sim.warp_backend: {backend!r} is not one of {BACKENDS}")
        self.grid = BevGrid(bev)
        self.backend = backend
        self.torch_threads = torch_threads

    def __call__(self, features, ref_pose, sim_pose, backend: str | None = None) -> np.ndarray:
        backend = backend or self.backend
        if backend not in BACKENDS:
            raise WarpError(f"backend: {backend!r} is not one of {BACKENDS}")
        feats = np.asarray(features)
        single = feats.ndim == 3
        if single:
            feats = feats[None]
        if feats.ndim != 4 or feats.shape[1:] != self.grid.shape:
            raise WarpError(f"features: expected [C, H, W] or [B, C, H, W] with (C, H, W) = "
                            f"{self.grid.shape}, got {np.asarray(features).shape}")
        b = feats.shape[0]
        ref = np.broadcast_to(np.asarray(ref_pose, dtype=np.float64), (b, 3))
        sim = np.broadcast_to(np.asarray(sim_pose, dtype=np.float64), (b, 3))
        if not (np.isfinite(ref).all() and np.isfinite(sim).all()):
            raise WarpError(f"poses: not finite (ref {ref.tolist()}, sim {sim.tolist()})")
        feats = feats.astype(np.float32, copy=False)
        if backend == "opencv":
            out = self._warp_opencv(feats, ref, sim)
        else:
            out = self._warp_torch(feats, ref, sim)
        _rotate_vector_channels(out, self.grid.vector_pairs, wrap_angle(ref[:, 2] - sim[:, 2]))
        return out[0] if single else out

    def _warp_opencv(self, feats: np.ndarray, ref: np.ndarray, sim: np.ndarray) -> np.ndarray:
        import cv2

        a = self.grid.sampling_matrix(ref, sim)  # [B, 3, 3]
        out = np.empty_like(feats)
        size = (self.grid.width, self.grid.height)
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        for k in range(feats.shape[0]):
            hwc = np.ascontiguousarray(feats[k].transpose(1, 2, 0))
            warped = cv2.warpAffine(hwc, a[k, :2].astype(np.float64), size, flags=flags,
                                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            if warped.ndim == 2:
                warped = warped[..., None]
            out[k] = warped.transpose(2, 0, 1)
        return out

    def _warp_torch(self, feats: np.ndarray, ref: np.ndarray, sim: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        if self.torch_threads:
            torch.set_num_threads(int(self.torch_threads))
        a = self.grid.sampling_matrix(ref, sim)  # pixel -> pixel
        w, h = self.grid.width, self.grid.height
        # normalised coordinate u = (2 j + 1) / W - 1 (align_corners=False)
        norm = np.array([[2.0 / w, 0.0, 1.0 / w - 1.0], [0.0, 2.0 / h, 1.0 / h - 1.0], [0.0, 0.0, 1.0]])
        theta = norm @ a @ np.linalg.inv(norm)
        with torch.no_grad():
            t_feats = torch.from_numpy(np.ascontiguousarray(feats))
            t_theta = torch.from_numpy(theta[:, :2].astype(np.float32))
            grid = F.affine_grid(t_theta, list(t_feats.shape), align_corners=False)
            out = F.grid_sample(t_feats, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return out.numpy().copy()


def warp_tokens(observation, ref_pose, sim_pose):
    """Transform the token fields of a logged observation (ego frame of ``ref_pose``) into the ego frame
    of ``sim_pose`` ([3] or [B, 3] for a batched observation).

    Uses ``rad2_planner.observation.transform_tokens(obs, delta_pose)`` with ``delta_pose`` the simulated
    pose expressed in the logged ego frame (``P_ref⁻¹ · P_sim``).
    """
    from rad2_planner.observation import transform_tokens

    delta = se2_compose(se2_inverse(np.asarray(ref_pose, dtype=np.float64)),
                        np.asarray(sim_pose, dtype=np.float64))
    return transform_tokens(observation, delta)
