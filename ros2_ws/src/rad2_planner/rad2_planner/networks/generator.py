"""DiT denoiser of the RAD-2 generator (§3.1.1, eq. 3).

One call is ONE denoising step for all M candidates of each scene: ``x0_hat = G(x_t, t, E_scene)``.

- Parameterisation: the network predicts the **clean trajectory x0** (not the noise) in the
  normalised trajectory space of :class:`rad2_planner.networks.normalization.TrajectoryNormalizer`
  (a speed-aware residual w.r.t. constant-velocity motion, scaled per time step). The samplers in
  :mod:`rad2_planner.diffusion` convert x0 to ε where they need it.
- Tokens: each of the T_plan points of a candidate is a token (linear embedding + learned position).
- Conditioning: adaLN-Zero (shift/scale/gate from the diffusion-time embedding plus the scene's global
  vector) around self-attention within a candidate, cross-attention to the scene tokens, and an MLP.
  The cross-attention folds the M candidates into the query sequence, so the scene tokens are
  neither copied nor re-projected per candidate; :meth:`DiTDenoiser.scene_context` projects them
  once per planning cycle rather than once per denoising step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.layers import MLP, Attention, Linear, sinusoidal_embedding


class SceneContext(NamedTuple):
    """Scene-only part of a denoising step (see :meth:`DiTDenoiser.scene_context`)."""

    kv: tuple  # per block: (kᵀ [B, h, dh, S], v [B, h, S, dh])
    bias: torch.Tensor  # [B, S] additive key bias of the scene tokens
    cond: torch.Tensor  # [B, D] scene part of the adaLN conditioning


class DiTBlock(nn.Module):
    def __init__(self, d: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.n1 = nn.LayerNorm(d, elementwise_affine=False)
        self.self_attn = Attention(d, heads)
        self.n2 = nn.LayerNorm(d, elementwise_affine=False)
        self.nctx = nn.LayerNorm(d)
        self.cross_attn = Attention(d, heads)
        self.n3 = nn.LayerNorm(d, elementwise_affine=False)
        self.mlp = MLP(d, d * mlp_ratio, d)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 9 * d))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, ctx_kv: tuple, bias: torch.Tensor) -> torch.Tensor:
        """x [B, M, T, D]; c [B, D]; ctx_kv: this block's projected scene keys/values
        (``cross_attn.project_kv`` of the normalised scene tokens); bias [B, S]."""
        b, m, t, d = x.shape
        mod = self.ada(c)[:, None, None, :].chunk(9, dim=-1)
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = mod
        h = (self.n1(x) * (1.0 + sc1) + sh1).reshape(b * m, t, d)
        x = x + g1 * self.self_attn(h, h).reshape(b, m, t, d)
        h = (self.n2(x) * (1.0 + sc2) + sh2).reshape(b, m * t, d)
        x = x + g2 * self.cross_attn.attend(h, *ctx_kv, bias).reshape(b, m, t, d)
        h = self.n3(x) * (1.0 + sc3) + sh3
        return x + g3 * self.mlp(h)


class DiTDenoiser(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.d = d
        self.embed = Linear(2, d)
        self.pos = nn.Parameter(torch.zeros(1, 1, cfg.plan_points, d))
        nn.init.normal_(self.pos, std=0.02)
        self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.c_proj = nn.Linear(d, d)
        self.ctx_norm = nn.LayerNorm(d)
        self.blocks = nn.ModuleList(
            DiTBlock(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.generator_layers)
        )
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.head = Linear(d, 2)
        for lin in (self.final_ada[1], self.head):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(
        self,
        x_t: torch.Tensor,
        t: torch.Tensor,
        scene_tokens: torch.Tensor,
        scene_bias: torch.Tensor,
        scene_cond: torch.Tensor,
    ) -> torch.Tensor:
        """x_t [B, M, T, 2] noisy normalised trajectories, t [B] diffusion time (training-step units)
        -> predicted clean normalised trajectories [B, M, T, 2]."""
        return self.step(x_t, t, self.scene_context(scene_tokens, scene_bias, scene_cond))

    def scene_context(
        self, scene_tokens: torch.Tensor, scene_bias: torch.Tensor, scene_cond: torch.Tensor
    ) -> SceneContext:
        """Everything of a step that depends on the scene only: the per-block cross-attention keys and
        values and the scene part of the conditioning. A sampler computes it once per planning cycle
        and reuses it for its K steps (it does not depend on x_t or t)."""
        ctx = self.ctx_norm(scene_tokens)
        kv = tuple(blk.cross_attn.project_kv(ctx) for blk in self.blocks)
        return SceneContext(kv=kv, bias=scene_bias, cond=self.c_proj(scene_cond))

    def step(self, x_t: torch.Tensor, t: torch.Tensor, scene: SceneContext) -> torch.Tensor:
        """One denoising evaluation given a precomputed :meth:`scene_context`."""
        c = self.t_mlp(sinusoidal_embedding(t, self.d)) + scene.cond
        x = self.embed(x_t) + self.pos
        for blk, kv in zip(self.blocks, scene.kv):
            x = blk(x, c, kv, scene.bias)
        shift, scale = self.final_ada(c)[:, None, None, :].chunk(2, dim=-1)
        return self.head(self.final_norm(x) * (1.0 + scale) + shift)
