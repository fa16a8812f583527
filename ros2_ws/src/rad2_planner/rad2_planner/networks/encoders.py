"""Scene encoding (RAD-2 §3.1.1, eqs. 1–2): T_b from a small BEV CNN, T_m/T_a/T_n from lightweight
token encoders, fused by a transformer F into the scene embedding E_scene that conditions the DiT.

Outputs of :class:`SceneEncoder` (all float32):
- ``scene_tokens [B, S, D]``: fused tokens, S = bev tokens + N_map + N_agents + N_route + 1 (ego)
- ``scene_bias [B, S]``: additive attention bias (0 valid, ``MASK_BIAS`` padded)
- ``scene_cond [B, D]``: a global vector (the fused ego token) used for adaLN conditioning
- ``bev_tokens [B, N_bev, D]``: the un-fused BEV tokens T_b, shared with the discriminator
"""

from __future__ import annotations

import torch
from torch import nn

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.layers import MLP, Linear, TransformerLayer, mask_to_bias


class BevEncoder(nn.Module):
    """Strided 3×3 conv stack: [B, C, H, W] -> [B, (H/2^n)(W/2^n), D] tokens with a learned position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        chans = [cfg.bev_channels] + list(cfg.bev_stages) + [cfg.d_model]
        layers: list[nn.Module] = []
        for i in range(len(chans) - 1):
            layers.append(nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1))
            if i < len(chans) - 2:
                layers.append(nn.ReLU())
        self.cnn = nn.Sequential(*layers)
        self.register_buffer(
            "channel_scale", torch.tensor(cfg.bev_channel_scale, dtype=torch.float32).view(1, -1, 1, 1)
        )
        self.pos = nn.Parameter(torch.zeros(1, cfg.bev_tokens, cfg.d_model))
        self.norm = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, bev: torch.Tensor) -> torch.Tensor:
        f = self.cnn(bev * self.channel_scale)  # B D h w
        tokens = f.flatten(2).transpose(1, 2)
        return self.norm(tokens + self.pos)


class PolylineEncoder(nn.Module):
    """Per-point MLP followed by a max-pool over the points of each polyline (PointNet/VectorNet style)."""

    def __init__(self, cfg: ModelConfig, point_dim: int, scale: list[float]):
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.point_mlp = MLP(point_dim, cfg.point_mlp_hidden, cfg.d_model)
        self.out = nn.Sequential(nn.LayerNorm(cfg.d_model), Linear(cfg.d_model, cfg.d_model))

    def forward(self, polylines: torch.Tensor) -> torch.Tensor:
        """[B, N, P, F] -> [B, N, D]."""
        f = self.point_mlp(polylines * self.scale)
        return self.out(f.max(dim=2).values)


class VectorEncoder(nn.Module):
    """MLP over one feature vector per token (agents, route points, ego state)."""

    def __init__(self, cfg: ModelConfig, dim: int, scale: list[float]):
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.mlp = MLP(dim, cfg.point_mlp_hidden, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.mlp(x * self.scale))


class SceneEncoder(nn.Module):
    """E_b (BEV CNN), E_m, E_a, E_n, ego encoder, and the fusion module F (transformer layers)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        s = cfg.input_scale
        self.bev = BevEncoder(cfg)
        self.map = PolylineEncoder(cfg, cfg.map_point_dim, s["map_point"])
        self.agents = VectorEncoder(cfg, cfg.agent_dim, s["agent"])
        self.route = VectorEncoder(cfg, cfg.route_dim, s["route"])
        self.ego = VectorEncoder(cfg, cfg.ego_dim, s["ego_state"])
        self.route_pos = nn.Parameter(torch.zeros(1, cfg.n_route, cfg.d_model))
        # One learned embedding per token type: bev, map, agent, route, ego.
        self.type_emb = nn.Parameter(torch.zeros(5, cfg.d_model))
        nn.init.normal_(self.route_pos, std=0.02)
        nn.init.normal_(self.type_emb, std=0.02)
        self.fusion = nn.ModuleList(
            TransformerLayer(cfg.d_model, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.fusion_layers)
        )
        self.out_norm = nn.LayerNorm(cfg.d_model)

    def forward(
        self,
        bev: torch.Tensor,
        map_polylines: torch.Tensor,
        map_mask: torch.Tensor,
        agents: torch.Tensor,
        agents_mask: torch.Tensor,
        route: torch.Tensor,
        route_mask: torch.Tensor,
        ego_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t_b = self.bev(bev)
        t_m = self.map(map_polylines) + self.type_emb[1]
        t_a = self.agents(agents) + self.type_emb[2]
        t_n = self.route(route) + self.route_pos + self.type_emb[3]
        t_e = self.ego(ego_state)[:, None, :] + self.type_emb[4]
        tokens = torch.cat([t_b + self.type_emb[0], t_m, t_a, t_n, t_e], dim=1)
        ones_b = torch.ones(t_b.shape[0], t_b.shape[1], dtype=torch.bool, device=bev.device)
        ones_e = torch.ones(t_b.shape[0], 1, dtype=torch.bool, device=bev.device)
        mask = torch.cat(
            [ones_b, map_mask.to(torch.bool), agents_mask.to(torch.bool), route_mask.to(torch.bool), ones_e],
            dim=1,
        )
        bias = mask_to_bias(mask)
        for layer in self.fusion:
            tokens = layer(tokens, bias)
        tokens = self.out_norm(tokens)
        cond = tokens[:, -1, :]
        return tokens, bias, cond, t_b
