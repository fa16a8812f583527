"""Speed-aware trajectory normalisation: the space the diffusion generator works in.

A plan ``traj [.., T, 2]`` (ego-frame metres at times (k+1)·dt) is expressed as its residual from
constant-velocity straight motion at the current ego speed v, ``prior_k = (v·(k+1)·dt, 0)``, then
standardised per time step and axis with the training set's statistics:

    z = (traj − prior(v) − mean) / std

so a unit of z means the same "surprise" at every speed and horizon. Works on NumPy arrays and torch
tensors alike (only broadcasting arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


@dataclass
class TrajectoryNormalizer:
    mean: np.ndarray  # [T, 2]
    std: np.ndarray  # [T, 2]
    plan_dt: float

    def __post_init__(self):
        self.mean = np.asarray(self.mean, dtype=np.float32)
        self.std = np.asarray(self.std, dtype=np.float32)
        if self.mean.shape != self.std.shape or self.mean.ndim != 2 or self.mean.shape[1] != 2:
            raise ValueError(
                f"normaliser mean/std must both be [T, 2], got {self.mean.shape}/{self.std.shape}"
            )
        if not np.all(self.std > 0):
            raise ValueError(f"normaliser std must be positive, got min {self.std.min()}")

    @classmethod
    def identity(cls, plan_points: int, plan_dt: float, scale: float = 1.0) -> TrajectoryNormalizer:
        return cls(np.zeros((plan_points, 2)), np.full((plan_points, 2), scale), plan_dt)

    @property
    def plan_points(self) -> int:
        return self.mean.shape[0]

    def prior(self, speed):
        """[..., T, 2] constant-velocity positions for speeds ``[...]`` (negative speeds count as 0)."""
        times = (np.arange(self.plan_points, dtype=np.float32) + 1.0) * self.plan_dt
        base = np.stack([times, np.zeros_like(times)], axis=-1)  # T 2
        if _is_torch(speed):
            import torch

            return speed.clamp(min=0.0)[..., None, None] * torch.as_tensor(base, device=speed.device)
        return np.maximum(np.asarray(speed, dtype=np.float32), 0.0)[..., None, None] * base

    def _stats(self, like):
        if _is_torch(like):
            import torch

            return (
                torch.as_tensor(self.mean, device=like.device),
                torch.as_tensor(self.std, device=like.device),
            )
        return self.mean, self.std

    def normalize(self, traj, speed):
        """traj [..., T, 2] metres, speed [...] -> z [..., T, 2]."""
        mean, std = self._stats(traj)
        return (traj - self.prior(speed) - mean) / std

    def denormalize(self, z, speed):
        mean, std = self._stats(z)
        return z * std + mean + self.prior(speed)

    def to_dict(self) -> dict:
        return {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "plan_dt": float(self.plan_dt),
            "kind": "constant_velocity_residual",
        }

    @classmethod
    def from_dict(cls, d: dict) -> TrajectoryNormalizer:
        return cls(np.asarray(d["mean"]), np.asarray(d["std"]), float(d["plan_dt"]))

    @classmethod
    def fit(
        cls, trajectories: np.ndarray, speeds: np.ndarray, plan_dt: float, min_std: float = 0.05
    ) -> TrajectoryNormalizer:
        """Statistics of the residuals of ``trajectories [N, T, 2]`` given ``speeds [N]``."""
        tmp = cls.identity(trajectories.shape[1], plan_dt)
        r = trajectories - tmp.prior(speeds)
        return cls(r.mean(axis=0), np.maximum(r.std(axis=0), min_std), plan_dt)
