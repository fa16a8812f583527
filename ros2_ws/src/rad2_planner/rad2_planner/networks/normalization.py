"""Speed-aware trajectory normalisation: the space the diffusion generator works in.

A plan ``traj [.., T, 2]`` (ego-frame metres at times (k+1)·dt) is expressed as its residual from
constant-velocity straight motion at the current ego speed v, ``prior_k = (v·(k+1)·dt, 0)``, then
standardised per time step and axis with the training set's statistics:

    z = (traj − prior(v) − mean(v)) / std(v)

so a unit of z means the same "surprise" at every speed and horizon.

``mean`` and ``std`` are either one ``[T, 2]`` table for all speeds, or ``[K, T, 2]`` tables at the speeds
``k · speed_step`` (k = 0..K−1), interpolated linearly in v and held constant beyond the last one. Why
the tables exist: drivers slow down on average, so the residual mean over all speeds is a braking one
(about −6 m at 4 s on the SUMO training set), which centres a standing ego on a plan that reverses.
Fine-tuning the shipped generator with them did not stop its reversing plans at rest
(docs/results.md, "Imitation, data and inputs"), so they are opt-in. Works on NumPy arrays and torch
tensors alike (only broadcasting arithmetic and a gather).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


@dataclass
class TrajectoryNormalizer:
    mean: np.ndarray  # [T, 2] or [K, T, 2]
    std: np.ndarray  # same shape as mean
    plan_dt: float
    speed_step: float = 0.0  # m/s between the K tables; 0 with [T, 2] tables (speed-independent)

    def __post_init__(self):
        self.mean = np.asarray(self.mean, dtype=np.float32)
        self.std = np.asarray(self.std, dtype=np.float32)
        self.speed_step = float(self.speed_step)
        if self.mean.shape != self.std.shape or self.mean.ndim not in (2, 3) or self.mean.shape[-1] != 2:
            raise ValueError(
                "normaliser mean/std must both be [T, 2] or [K, T, 2], "
                f"got {self.mean.shape}/{self.std.shape}"
            )
        if not np.all(self.std > 0):
            raise ValueError(f"normaliser std must be positive, got min {self.std.min()}")
        if self.mean.ndim == 3 and not (self.speed_step > 0 and np.isfinite(self.speed_step)):
            raise ValueError(
                f"normaliser speed_step must be > 0 with [K, T, 2] tables, got {self.speed_step}"
            )
        if self.mean.ndim == 2 and self.speed_step != 0.0:
            raise ValueError(f"normaliser speed_step must be 0 with [T, 2] tables, got {self.speed_step}")

    @classmethod
    def identity(cls, plan_points: int, plan_dt: float, scale: float = 1.0) -> TrajectoryNormalizer:
        return cls(np.zeros((plan_points, 2)), np.full((plan_points, 2), scale), plan_dt)

    @property
    def plan_points(self) -> int:
        return self.mean.shape[-2]

    @property
    def speed_conditioned(self) -> bool:
        return self.mean.ndim == 3

    @property
    def speed_knots(self) -> np.ndarray:
        """Speeds [K] of the tables (one 0 for a speed-independent normaliser)."""
        k = self.mean.shape[0] if self.speed_conditioned else 1
        return np.arange(k, dtype=np.float32) * self.speed_step

    def prior(self, speed):
        """[..., T, 2] constant-velocity positions for speeds ``[...]`` (negative speeds count as 0)."""
        times = (np.arange(self.plan_points, dtype=np.float32) + 1.0) * self.plan_dt
        base = np.stack([times, np.zeros_like(times)], axis=-1)  # T 2
        if _is_torch(speed):
            import torch

            return speed.clamp(min=0.0)[..., None, None] * torch.as_tensor(base, device=speed.device)
        return np.maximum(np.asarray(speed, dtype=np.float32), 0.0)[..., None, None] * base

    def _stats(self, like, speed):
        """(mean, std) broadcastable against ``[..., T, 2]`` for speeds ``[...]``."""
        if _is_torch(like):
            import torch

            mean = torch.as_tensor(self.mean, device=like.device)
            std = torch.as_tensor(self.std, device=like.device)
            if not self.speed_conditioned:
                return mean, std
            # a NaN speed picks table 0 here and still yields NaN through the prior, as before
            scaled = torch.as_tensor(speed, device=like.device).float() / self.speed_step
            pos = torch.nan_to_num(scaled).clamp(0.0, self.mean.shape[0] - 1.0)
            lo = pos.floor().clamp(max=max(self.mean.shape[0] - 2, 0)).long()
            hi = (lo + 1).clamp(max=self.mean.shape[0] - 1)
            w = (pos - lo.float())[..., None, None]
            return mean[lo] * (1 - w) + mean[hi] * w, std[lo] * (1 - w) + std[hi] * w
        if not self.speed_conditioned:
            return self.mean, self.std
        k = self.mean.shape[0]
        pos = np.clip(np.nan_to_num(np.asarray(speed, dtype=np.float32) / self.speed_step), 0.0, k - 1.0)
        lo = np.minimum(np.floor(pos).astype(np.int64), max(k - 2, 0))
        hi = np.minimum(lo + 1, k - 1)
        w = (pos - lo)[..., None, None].astype(np.float32)
        return self.mean[lo] * (1 - w) + self.mean[hi] * w, self.std[lo] * (1 - w) + self.std[hi] * w

    def normalize(self, traj, speed):
        """traj [..., T, 2] metres, speed [...] -> z [..., T, 2]."""
        mean, std = self._stats(traj, speed)
        return (traj - self.prior(speed) - mean) / std

    def denormalize(self, z, speed):
        mean, std = self._stats(z, speed)
        return z * std + mean + self.prior(speed)

    def to_dict(self) -> dict:
        d = {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "plan_dt": float(self.plan_dt),
            "kind": "constant_velocity_residual",
        }
        if self.speed_conditioned:
            d.update(kind="constant_velocity_residual_by_speed", speed_step=self.speed_step)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrajectoryNormalizer:
        return cls(np.asarray(d["mean"]), np.asarray(d["std"]), float(d["plan_dt"]),
                   float(d.get("speed_step", 0.0)))

    @classmethod
    def fit(
        cls, trajectories: np.ndarray, speeds: np.ndarray, plan_dt: float, min_std: float = 0.05,
        speed_step: float = 0.0, prior_samples: float = 50.0,
    ) -> TrajectoryNormalizer:
        """Statistics of the residuals of ``trajectories [N, T, 2]`` given ``speeds [N]``.

        ``speed_step > 0``: tables at 0, speed_step, … up to the 99th speed percentile, each a
        Gaussian-kernel (bandwidth ``speed_step / 2``) weighted mean/std of the residuals, shrunk towards the
        all-speed statistics by ``prior_samples`` pseudo-samples so sparsely covered speeds stay sane."""
        tmp = cls.identity(trajectories.shape[1], plan_dt)
        speeds = np.asarray(speeds, dtype=np.float64)
        r = (trajectories - tmp.prior(speeds)).astype(np.float64)
        mean_all, var_all = r.mean(axis=0), r.var(axis=0)
        if speed_step <= 0:
            return cls(mean_all, np.maximum(np.sqrt(var_all), min_std), plan_dt)
        top = float(np.percentile(np.maximum(speeds, 0.0), 99.0))
        knots = np.arange(int(np.ceil(top / speed_step)) + 1) * speed_step
        if len(knots) < 2:
            knots = np.array([0.0, speed_step])
        bandwidth = 0.5 * speed_step  # half a step: the stop-and-go end must not borrow cruising statistics
        w = np.exp(-0.5 * ((np.maximum(speeds, 0.0)[None, :] - knots[:, None]) / bandwidth) ** 2)  # K N
        n = w.sum(axis=1)[:, None, None] + prior_samples
        mean = (np.einsum("kn,ntc->ktc", w, r) + prior_samples * mean_all) / n
        second = (np.einsum("kn,ntc->ktc", w, r**2) + prior_samples * (var_all + mean_all**2)) / n
        std = np.sqrt(np.maximum(second - mean**2, 0.0))
        return cls(mean, np.maximum(std, min_std), plan_dt, speed_step)
