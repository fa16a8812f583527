"""RAD-2 discriminator (§3.1.2, eqs. 5–8): scores each candidate trajectory in [0, 1].

:meth:`Discriminator.logits` returns the pre-sigmoid fusion output; ``forward`` is its sigmoid. The
logits are what the stochastic policy of :mod:`rad2_planner.selection` and the RL update consume (a
float32 sigmoid saturates, so scores cannot be inverted back to logits reliably).

- Trajectory encoding: a shared per-point MLP over (x, y, Δx, Δy) (scaled), a learned [CLS] token
  prepended, a transformer encoder over [CLS] + T_plan points; the [CLS] output is the query Q_τ.
  The ego state embedding is added to Q_τ (the score of a path depends on the current speed).
- Scene conditioning: its own map and agent encoders E*_m, E*_a (same architecture as the
  generator's, independent parameters; :meth:`Discriminator.init_from_scene_encoder` copies them),
  plus the generator's BEV tokens T_b.
- Interaction: O_m = Ψ(Q, T*_m), O_b = Ψ(Q, T_b), O_a = Ψ(Q, T*_a), T_a∩m = Ψ(T*_a, T*_m),
  O_a∩m = Ψ(Q, T_a∩m); E_fusion = Φ([O_m; O_b; O_a; O_a∩m]) (concatenation + MLP) -> sigmoid.
  Each key set gets a learned always-valid "null" token so that scenes without agents stay defined.
"""

from __future__ import annotations

import torch
from torch import nn

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.encoders import PolylineEncoder, SceneEncoder, VectorEncoder
from rad2_planner.networks.layers import MLP, CrossAttentionLayer, TransformerLayer, mask_to_bias


class Discriminator(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        s = cfg.input_scale
        sx, sy = cfg.trajectory_scale_m
        self.register_buffer(
            "traj_scale", torch.tensor([1 / sx, 1 / sy, 4 / sx, 4 / sy], dtype=torch.float32)
        )
        self.point_mlp = MLP(4, cfg.point_mlp_hidden, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, cfg.plan_points + 1, d))
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.pos, std=0.02)
        self.traj_layers = nn.ModuleList(
            TransformerLayer(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.discriminator_layers)
        )
        self.traj_norm = nn.LayerNorm(d)
        self.map = PolylineEncoder(cfg, cfg.map_point_dim, s["map_point"])
        self.agents = VectorEncoder(cfg, cfg.agent_dim, s["agent"])
        self.ego = VectorEncoder(cfg, cfg.ego_dim, s["ego_state"])
        self.null = nn.Parameter(torch.zeros(4, 1, d))  # map, bev-unused, agents, agent∩map
        nn.init.normal_(self.null, std=0.02)
        self.psi_m = CrossAttentionLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.psi_b = CrossAttentionLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.psi_a = CrossAttentionLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.psi_am_tokens = CrossAttentionLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.psi_am = CrossAttentionLayer(d, cfg.num_heads, cfg.mlp_ratio)
        self.fusion = MLP(4 * d, d, 1, layers=3)

    def init_from_scene_encoder(self, enc: SceneEncoder) -> None:
        """Initialise E*_m, E*_a (and the ego encoder) from the generator's trained encoders."""
        self.map.load_state_dict(enc.map.state_dict())
        self.agents.load_state_dict(enc.agents.state_dict())
        self.ego.load_state_dict(enc.ego.state_dict())

    @staticmethod
    def _with_null(tokens: torch.Tensor, bias: torch.Tensor, null: torch.Tensor):
        b = tokens.shape[0]
        t = torch.cat([null.expand(b, 1, tokens.shape[2]), tokens], dim=1)
        z = torch.zeros(b, 1, dtype=bias.dtype, device=bias.device)
        return t, torch.cat([z, bias], dim=1)

    def logits(
        self,
        trajectories: torch.Tensor,
        map_polylines: torch.Tensor,
        map_mask: torch.Tensor,
        agents: torch.Tensor,
        agents_mask: torch.Tensor,
        ego_state: torch.Tensor,
        bev_tokens: torch.Tensor,
    ) -> torch.Tensor:
        """trajectories [B, M, T, 2] ego-frame metres -> logits [B, M] (real, pre-sigmoid)."""
        return self.head(trajectories, bev_tokens,
                         *self.context(map_polylines, map_mask, agents, agents_mask, ego_state))

    def context(
        self,
        map_polylines: torch.Tensor,
        map_mask: torch.Tensor,
        agents: torch.Tensor,
        agents_mask: torch.Tensor,
        ego_state: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """What :meth:`logits` computes from the observation alone (neither the candidates nor the
        scene encoder's BEV tokens): the ego embedding and, for the map, agent and agent∩map
        cross-attentions Ψ, the projected keys/values and key bias of their contexts
        (``DISCRIMINATOR_CONTEXT_OUTPUTS`` order). A runtime can compute it once per scene, at the
        same time as the scene encoder, and only :meth:`head` per candidate shard."""
        t_m, bias_m = self._with_null(self.map(map_polylines), mask_to_bias(map_mask), self.null[0])
        t_a_raw = self.agents(agents)
        t_a, bias_a = self._with_null(t_a_raw, mask_to_bias(agents_mask), self.null[2])
        t_am = self.psi_am_tokens(t_a_raw, t_m, bias_m)
        t_am, bias_am = self._with_null(t_am, mask_to_bias(agents_mask), self.null[3])
        return (self.ego(ego_state), *self.psi_m.project_context(t_m), bias_m,
                *self.psi_a.project_context(t_a), bias_a, *self.psi_am.project_context(t_am), bias_am)

    def head(
        self, trajectories: torch.Tensor, bev_tokens: torch.Tensor, ego: torch.Tensor,
        k_m: torch.Tensor, v_m: torch.Tensor, bias_m: torch.Tensor,
        k_a: torch.Tensor, v_a: torch.Tensor, bias_a: torch.Tensor,
        k_am: torch.Tensor, v_am: torch.Tensor, bias_am: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [B, M] of trajectories [B, M, T, 2] given the BEV tokens and the scene's :meth:`context`
        (the BEV tokens' projection is small: 16 tokens)."""
        b, m, t, _ = trajectories.shape
        prev = torch.cat([torch.zeros_like(trajectories[:, :, :1]), trajectories[:, :, :-1]], dim=2)
        feats = torch.cat([trajectories, trajectories - prev], dim=-1) * self.traj_scale
        e = self.point_mlp(feats).reshape(b * m, t, -1)
        x = torch.cat([self.cls.expand(b * m, 1, e.shape[-1]), e], dim=1) + self.pos
        for layer in self.traj_layers:
            x = layer(x)
        q = self.traj_norm(x[:, 0]).reshape(b, m, -1) + ego[:, None, :]
        o_m = self.psi_m.attend(q, k_m, v_m, bias_m)
        o_b = self.psi_b(q, bev_tokens, None)
        o_a = self.psi_a.attend(q, k_a, v_a, bias_a)
        o_am = self.psi_am.attend(q, k_am, v_am, bias_am)
        return self.fusion(torch.cat([o_m, o_b, o_a, o_am], dim=-1))[..., 0]

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        """Same inputs as :meth:`logits` -> scores [B, M] = sigmoid(logits) in (0, 1)."""
        return torch.sigmoid(self.logits(*args, **kwargs))

    def logits_and_scores(
        self, *args: torch.Tensor, **kwargs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both outputs from one evaluation: what every runtime backend (and the ONNX graph) returns."""
        logits = self.logits(*args, **kwargs)
        return logits, torch.sigmoid(logits)
