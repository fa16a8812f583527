"""Building blocks shared by the scene encoder, the DiT generator and the discriminator.

Attention is written with plain matmul/softmax (no fused kernels) so that the same graph exports to
ONNX with dynamic batch/candidate dimensions and runs identically under PyTorch, ONNX Runtime and
TensorRT. Key masks are passed as *additive biases* ``[B, S]`` (0 for valid, ``MASK_BIAS`` for padded
keys); every key set used here contains at least one always-valid token, so no softmax row is empty.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Large enough to zero a softmax weight in fp32, small enough to stay finite in fp16 (TensorRT).
MASK_BIAS = -1.0e4


def mask_to_bias(mask: torch.Tensor) -> torch.Tensor:
    """bool ``[..., S]`` (True = valid) -> float additive attention bias."""
    return (1.0 - mask.to(torch.float32)) * MASK_BIAS


class Linear(nn.Linear):
    """``nn.Linear`` applied to the rows of a 2-D view of its input.

    Same parameters and result; the point is the exported graph: a product on a 2-D input exports as
    one ``Gemm`` with its bias fused, whereas on a 3-D or 4-D input it becomes ``MatMul`` followed by
    a separate ``Add`` over the whole activation, which costs ONNX Runtime a pass over memory per
    layer.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() <= 2:
            return super().forward(x)
        y = nn.functional.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


class MLP(nn.Module):
    """Linear → GELU → Linear (→ optional extra hidden layers)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, layers: int = 2):
        super().__init__()
        dims = [d_in] + [d_hidden] * (layers - 1) + [d_out]
        mods: list[nn.Module] = []
        for i in range(len(dims) - 1):
            mods.append(Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                mods.append(nn.GELU())
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    """Multi-head attention ``softmax(QKᵀ/√d + bias) V`` with separate query and key/value inputs."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.h = num_heads
        self.dh = d_model // num_heads
        self.q = Linear(d_model, d_model)
        self.kv = Linear(d_model, 2 * d_model)
        self.out = Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[B, L, D]`` queries; ctx ``[B, S, D]`` keys/values; bias ``[B, S]`` additive key bias."""
        return self.attend(x, *self.project_kv(ctx), bias)

    def project_kv(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values ``(kᵀ [B, h, dh, S], v [B, h, S, dh])`` of a context ``[B, S, D]``.

        Split from :meth:`attend` so that a context attended to many times (the scene, by every
        denoising step of a planning cycle) is projected once. Keys come pre-transposed for QKᵀ.
        """
        b, s, _ = ctx.shape
        kv = self.kv(ctx).reshape(b, s, 2, self.h, self.dh)
        return kv[:, :, 0].permute(0, 2, 3, 1), kv[:, :, 1].transpose(1, 2)

    def attend(
        self, x: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of queries ``x [B, L, D]`` to projected keys/values from :meth:`project_kv`."""
        b, n_q, d = x.shape
        q = self.q(x).reshape(b, n_q, self.h, self.dh).transpose(1, 2)  # B h L dh
        logits = torch.matmul(q, k_t) * (1.0 / math.sqrt(self.dh))
        if bias is not None:
            logits = logits + bias[:, None, None, :]
        w = torch.softmax(logits, dim=-1)
        y = torch.matmul(w, v).transpose(1, 2).reshape(b, n_q, d)
        return self.out(y)


class TransformerLayer(nn.Module):
    """Pre-norm transformer layer: self-attention (optional key bias) + MLP."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.n1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, num_heads)
        self.n2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_model * mlp_ratio, d_model)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h, bias)
        return x + self.mlp(self.n2(x))


class CrossAttentionLayer(nn.Module):
    """Pre-norm cross-attention from queries to a context, followed by an MLP."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.nq = nn.LayerNorm(d_model)
        self.nc = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, num_heads)
        self.n2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_model * mlp_ratio, d_model)

    def forward(self, q: torch.Tensor, ctx: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.attend(q, *self.project_context(ctx), bias)

    def project_context(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The context's normalised, projected keys and values (:meth:`Attention.project_kv`): the part
        that does not depend on the queries, computed once for a context queried many times."""
        return self.attn.project_kv(self.nc(ctx))

    def attend(self, q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """The layer on queries ``q`` given :meth:`project_context` of its context."""
        x = q + self.attn.attend(self.nq(q), k_t, v, bias)
        return x + self.mlp(self.n2(x))


def sinusoidal_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """``[B]`` float timesteps -> ``[B, dim]`` sin/cos features (the usual diffusion embedding)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.to(torch.float32)[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
