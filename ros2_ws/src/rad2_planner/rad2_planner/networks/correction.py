"""Correction-trace encoder of the self-correcting generator (CorrectionPlanner, §3.2, on RAD-2's DiT).

When the collision critic rejects the proposal the planner was about to execute, the planner proposes
again conditioned on every proposal it rejected in this cycle: the *correction trace*. Rejection
sampling draws again from the unchanged distribution and tends to land near the rejected proposal; a
generator that sees the trace can move its distribution away from it.

- One token per rejected trajectory (normalised like the denoiser's output, flattened, through an
  MLP), plus a learned embedding of its place in the trace.
- One self-attention layer over the trace tokens, so each token knows what else was rejected.
- The tokens are appended to the scene tokens the DiT cross-attends to. Valid trace slots get a learned
  additive key bias that starts low (``INITIAL_KEY_BIAS``), so a freshly initialised encoder barely
  shifts the attention of the pretrained denoiser; padded slots get ``MASK_BIAS``, so an empty trace
  leaves the denoiser's output exactly that of the scene alone.
"""

from __future__ import annotations

import torch
from torch import nn

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.layers import MASK_BIAS, MLP, TransformerLayer, mask_to_bias

INITIAL_KEY_BIAS = -2.0


class CorrectionEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.trace_len = int(cfg.correction_trace_len)
        self.embed = MLP(cfg.plan_points * 2, 2 * d, d)
        self.order = nn.Parameter(torch.zeros(1, self.trace_len, d))
        nn.init.normal_(self.order, std=0.02)
        self.mix = TransformerLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.key_bias = nn.Parameter(torch.tensor(INITIAL_KEY_BIAS))

    def forward(
        self,
        scene_tokens: torch.Tensor,
        scene_bias: torch.Tensor,
        correction_trace: torch.Tensor,
        correction_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """scene_tokens [B, S, D], scene_bias [B, S], correction_trace [B, L, T, 2] (normalised),
        correction_mask [B, L] bool (True = a rejected proposal) -> scene tokens and key bias with the
        trace appended: [B, S + L, D], [B, S + L]."""
        b, n = correction_trace.shape[:2]
        tokens = self.embed(correction_trace.reshape(b, n, -1)) + self.order[:, :n]
        tokens = self.mix(tokens, mask_to_bias(correction_mask))
        bias = torch.where(correction_mask, self.key_bias.expand(b, n), torch.full_like(scene_bias[:, :n],
                                                                                       MASK_BIAS))
        return torch.cat([scene_tokens, tokens], dim=1), torch.cat([scene_bias, bias], dim=1)
