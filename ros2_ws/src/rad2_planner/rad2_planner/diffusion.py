"""Noise schedule and few-step samplers for the trajectory diffusion generator (NumPy).

The forward process is variance preserving: ``x_t = √ᾱ(t)·x0 + √(1−ᾱ(t))·ε`` with the cosine schedule
``ᾱ(t) = f((t+1)/N)/f(0)``, ``f(u) = cos²(((u+s)/(1+s))·π/2)``, ``s = 0.008``, for continuous
``t ∈ [0, N−1]`` (N = ``diffusion.num_train_steps``). The denoiser predicts x0 (clean, normalised).

Samplers (all deterministic given the initial noise, hence given a seed; K network evaluations):
- ``ddim``: DDIM with η = 0 on the evaluation times ``t_i = (N−1)(1 − i/K)``, i = 0..K−1; the last
  evaluation's x0 is the result.
- ``dpmpp_2m``: DPM-Solver++(2M) (multistep, second order, data prediction) on the same times, with
  a first-order final step (the usual choice for few steps).

The loop is plain NumPy around a ``denoise(x_t, t) -> x0`` callable, so it is shared by every runtime
backend (PyTorch, ONNX Runtime, TensorRT).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

SAMPLERS = ("ddim", "dpmpp_2m")
_ALPHA_BAR_MIN = 1e-5


class NoiseSchedule:
    def __init__(self, num_train_steps: int, kind: str = "cosine", s: float = 0.008):
        if kind != "cosine":
            raise ValueError(f"diffusion.schedule: unsupported value {kind!r} (supported: 'cosine')")
        if num_train_steps < 2:
            raise ValueError(f"diffusion.num_train_steps must be >= 2, got {num_train_steps}")
        self.n = int(num_train_steps)
        self.s = float(s)

    def _f(self, u):
        return np.cos((u + self.s) / (1.0 + self.s) * np.pi / 2.0) ** 2

    def alpha_bar(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        ab = self._f((t + 1.0) / self.n) / self._f(0.0)
        return np.clip(ab, _ALPHA_BAR_MIN, 1.0)

    def add_noise(self, x0, eps, t):
        """q(x_t | x0) for numpy or torch ``x0, eps [B, ...]`` and ``t [B]``."""
        ab = self.alpha_bar(t if isinstance(t, np.ndarray) else t.detach().cpu().numpy())
        shape = (-1,) + (1,) * (x0.ndim - 1)
        a = np.sqrt(ab).reshape(shape).astype(np.float32)
        s = np.sqrt(1.0 - ab).reshape(shape).astype(np.float32)
        if not isinstance(x0, np.ndarray):
            import torch

            a, s = torch.as_tensor(a, device=x0.device), torch.as_tensor(s, device=x0.device)
        return a * x0 + s * eps

    def sampling_times(self, k: int) -> np.ndarray:
        if k < 1:
            raise ValueError(f"number of denoising steps K must be >= 1, got {k}")
        return (self.n - 1) * (1.0 - np.arange(k, dtype=np.float64) / k)


def initial_noise(batch: int, m: int, t_plan: int, seed: int | None) -> np.ndarray:
    """Standard normal ``[B, M, T, 2]`` float32 from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).standard_normal((batch, m, t_plan, 2)).astype(np.float32)


class SamplerStep(NamedTuple):
    """One network evaluation of a sampler and the linear update that follows it.

    Both samplers are linear in the current sample and the network's clean predictions, so a step is
    ``x_next = c_x·x + c_x0·x0 + c_prev·x0_prev`` (``x0_prev``: the previous step's prediction). The
    last step has ``c_x = c_prev = 0, c_x0 = 1``: the result is its prediction.
    """

    t: float
    c_x: float
    c_x0: float
    c_prev: float


class SamplerSpec(NamedTuple):
    """One sampler configuration: K, the solver and the x0 clip (the key of a fused sampler graph)."""

    num_steps: int
    sampler: str
    x0_clip: float | None

    def to_dict(self) -> dict:
        return {"num_steps": self.num_steps, "sampler": self.sampler, "x0_clip": self.x0_clip}

    @classmethod
    def from_dict(cls, d: dict) -> SamplerSpec:
        clip = d.get("x0_clip")
        return cls(int(d["num_steps"]), str(d["sampler"]), None if clip is None else float(clip))


def sampler_steps(schedule: NoiseSchedule, num_steps: int, sampler: str = "ddim") -> list[SamplerStep]:
    """The K evaluations of ``sampler`` (times and update coefficients), shared by the NumPy loop
    :func:`sample` and the single-graph sampler :class:`rad2_planner.networks.sampler.DiffusionSampler`."""
    if sampler not in SAMPLERS:
        raise ValueError(f"planner.sampler: unknown value {sampler!r} (choose from {SAMPLERS})")
    ts = schedule.sampling_times(num_steps)
    steps, prev_h = [], None
    for i, t in enumerate(ts):
        if i == len(ts) - 1:
            steps.append(SamplerStep(float(t), 0.0, 1.0, 0.0))
            break
        ab, ab_next = float(schedule.alpha_bar(t)), float(schedule.alpha_bar(ts[i + 1]))
        a, s = np.sqrt(ab), np.sqrt(1.0 - ab)
        a_n, s_n = np.sqrt(ab_next), np.sqrt(1.0 - ab_next)
        if sampler == "ddim":
            # η = 0: ε = (x − a·x0)/s, x_next = a_n·x0 + s_n·ε
            steps.append(SamplerStep(float(t), s_n / s, a_n - s_n * a / s, 0.0))
            continue
        # DPM-Solver++(2M): x_next = (s_n/s)·x − a_n·expm1(−h)·D, D = x0 on the first step, else the
        # second-order combination (1 + 1/2r)·x0 − (1/2r)·x0_prev with r = h_prev/h.
        h = np.log(a_n / s_n) - np.log(a / s)
        w0, wp = (1.0, 0.0) if prev_h is None else (1.0 + 0.5 * h / prev_h, -0.5 * h / prev_h)
        g = -a_n * np.expm1(-h)
        steps.append(SamplerStep(float(t), float(s_n / s), float(g * w0), float(g * wp)))
        prev_h = h
    return steps


def sample(
    denoise: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x_init: np.ndarray,
    schedule: NoiseSchedule,
    num_steps: int,
    sampler: str = "ddim",
    x0_clip: float | None = None,
    timings: dict[str, float] | None = None,
) -> np.ndarray:
    """Run K denoising steps from ``x_init [B, M, T, 2]``; returns the clean sample (normalised).

    ``timings`` (optional) receives ``denoise_<i>`` in ms for each network evaluation.
    """
    x = x_init.astype(np.float32, copy=True)
    b = x.shape[0]
    x0 = prev_x0 = x
    for i, step in enumerate(sampler_steps(schedule, num_steps, sampler)):
        t0 = time.perf_counter()
        x0 = np.asarray(denoise(x, np.full((b,), step.t, dtype=np.float32)), dtype=np.float32)
        if x0_clip is not None:
            x0 = np.clip(x0, -x0_clip, x0_clip)
        if timings is not None:
            timings[f"denoise_{i}"] = (time.perf_counter() - t0) * 1e3
        x = (step.c_x * x + step.c_x0 * x0 + step.c_prev * prev_x0).astype(np.float32)
        prev_x0 = x0
    return x0
