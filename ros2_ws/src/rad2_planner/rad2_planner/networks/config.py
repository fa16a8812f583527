"""Model configuration: the sizes every network is built from, saved as JSON next to the weights.

``ModelConfig.from_params`` builds it from ``params/planner.yaml`` (``model`` + ``planner`` +
``diffusion``) and ``params/bev.yaml`` (grid and token sizes); a checkpoint's ``config.json`` stores the
same fields plus the trajectory normalisation, so a checkpoint is self-describing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rad2_planner.config import ParameterError, require


@dataclass
class ModelConfig:
    bev_channels: int
    bev_hw: tuple[int, int]
    n_map: int
    map_points: int
    n_agents: int
    n_route: int
    plan_points: int
    plan_dt: float
    d_model: int
    num_heads: int
    mlp_ratio: int
    bev_stages: list[int]
    point_mlp_hidden: int
    fusion_layers: int
    generator_layers: int
    discriminator_layers: int
    trajectory_scale_m: list[float]
    num_train_steps: int
    input_scale: dict[str, list[float]]
    # Per-channel multiplier of the BEV raster (set from the training data's statistics).
    bev_channel_scale: list[float] = field(default_factory=list)

    # Rejected proposals the self-correcting generator attends to (networks/correction.py); 0: a plain
    # generator without a correction encoder (every checkpoint written before it existed).
    correction_trace_len: int = 0

    map_point_dim: int = 6
    agent_dim: int = 10
    route_dim: int = 4
    ego_dim: int = 4

    def __post_init__(self):
        self.bev_hw = tuple(int(v) for v in self.bev_hw)
        if not self.bev_channel_scale:
            self.bev_channel_scale = [1.0] * self.bev_channels
        if len(self.bev_channel_scale) != self.bev_channels:
            raise ParameterError(
                f"bev_channel_scale has {len(self.bev_channel_scale)} entries, expected {self.bev_channels}"
            )
        stride = 2 ** (len(self.bev_stages) + 1)
        if self.bev_hw[0] % stride or self.bev_hw[1] % stride:
            raise ParameterError(f"bev_hw={self.bev_hw} must be divisible by the CNN stride {stride}")
        if not 0 <= int(self.correction_trace_len) <= 16:
            raise ParameterError(f"correction_trace_len: {self.correction_trace_len} must be in [0, 16]")
        for key, dim in (("map_point", 6), ("agent", 10), ("route", 4), ("ego_state", 4)):
            if len(self.input_scale.get(key, [])) != dim:
                raise ParameterError(f"model.input_scale.{key} must have {dim} entries")

    @property
    def bev_tokens(self) -> int:
        stride = 2 ** (len(self.bev_stages) + 1)
        return (self.bev_hw[0] // stride) * (self.bev_hw[1] // stride)

    @property
    def scene_tokens(self) -> int:
        return self.bev_tokens + self.n_map + self.n_agents + self.n_route + 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bev_hw"] = list(self.bev_hw)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        names = set(cls.__dataclass_fields__)
        unknown = set(d) - names
        if unknown:
            raise ParameterError(f"model config has unknown fields {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_params(cls, planner: dict[str, Any], bev: dict[str, Any]) -> ModelConfig:
        """From ``load_params('planner')`` and ``load_params('bev')``."""
        m = require(planner, "model")
        return cls(
            bev_channels=len(require(bev, "bev.channels")),
            bev_hw=(int(require(bev, "bev.height")), int(require(bev, "bev.width"))),
            n_map=int(require(bev, "tokens.map.num_polylines")),
            map_points=int(require(bev, "tokens.map.points_per_polyline")),
            n_agents=int(require(bev, "tokens.agents.num_agents")),
            n_route=int(require(bev, "tokens.route.num_points")),
            plan_points=int(require(planner, "planner.plan_points")),
            plan_dt=float(require(planner, "planner.plan_dt")),
            d_model=int(m["d_model"]),
            num_heads=int(m["num_heads"]),
            mlp_ratio=int(m["mlp_ratio"]),
            bev_stages=[int(v) for v in m["bev_channels_stages"]],
            point_mlp_hidden=int(m["point_mlp_hidden"]),
            fusion_layers=int(m["fusion_layers"]),
            generator_layers=int(m["generator_layers"]),
            discriminator_layers=int(m["discriminator_layers"]),
            trajectory_scale_m=[float(v) for v in m["trajectory_scale_m"]],
            num_train_steps=int(require(planner, "diffusion.num_train_steps")),
            input_scale={k: [float(x) for x in v] for k, v in m["input_scale"].items()},
        )
