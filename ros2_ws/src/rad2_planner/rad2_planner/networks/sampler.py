"""All K denoising steps of a planning cycle as one module (one exported graph, one runtime call).

The step-by-step path (``diffusion.sample`` around ``Backend.denoise``) pays, at every step, a
runtime call's fixed cost and the projection of the scene keys/values of every cross-attention
block, although neither depends on the step. :class:`DiffusionSampler` projects the scene once
(``DiTDenoiser.scene_context``) and unrolls the sampler's K evaluations with the update
coefficients of :func:`rad2_planner.diffusion.sampler_steps` baked in as constants, so it computes
exactly what the NumPy loop computes (parity tests at 1e-4) in a single call.

A graph is specific to ``(K, sampler, x0_clip)``; the exporter records them in the ONNX manifest and
a backend falls back to the step-by-step path for any other request.
"""

from __future__ import annotations

import torch
from torch import nn

from rad2_planner.diffusion import NoiseSchedule, SamplerSpec, sampler_steps


class DiffusionSampler(nn.Module):
    """``(x_init [B, M, T, 2], scene_tokens, scene_bias, scene_cond) -> x0 [B, M, T, 2]`` (normalised)."""

    def __init__(self, denoiser: nn.Module, num_train_steps: int, spec: SamplerSpec):
        super().__init__()
        self.denoiser = denoiser
        self.spec = spec
        self.steps = sampler_steps(NoiseSchedule(num_train_steps), spec.num_steps, spec.sampler)

    def forward(
        self,
        x_init: torch.Tensor,
        scene_tokens: torch.Tensor,
        scene_bias: torch.Tensor,
        scene_cond: torch.Tensor,
    ) -> torch.Tensor:
        scene = self.denoiser.scene_context(scene_tokens, scene_bias, scene_cond)
        b = x_init.shape[0]
        x = x_init
        x0 = prev_x0 = x_init
        for i, step in enumerate(self.steps):
            t = torch.full((b,), step.t, dtype=torch.float32, device=x_init.device)
            x0 = self.denoiser.step(x, t, scene)
            if self.spec.x0_clip is not None:
                x0 = torch.clamp(x0, -self.spec.x0_clip, self.spec.x0_clip)
            if i == len(self.steps) - 1:  # the last prediction is the result
                break
            x = step.c_x * x + step.c_x0 * x0 + step.c_prev * prev_x0
            prev_x0 = x0
        return x0
