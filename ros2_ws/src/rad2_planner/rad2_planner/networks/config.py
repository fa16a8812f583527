"""Model configuration: the sizes every network is built from, saved as JSON next to the weights.

``ModelConfig.from_params`` builds it from ``params/planner.yaml`` (``model`` + ``planner`` +
``diffusion``) and ``params/bev.yaml`` (grid and token sizes); a checkpoint's ``config.json`` stores the
same fields plus the trajectory normalisation, so a checkpoint is self-describing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rad2_core.config import ParameterError, require
from rad2_core.tokens import MAP_FEATURES


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

    # Map-token features per point the network takes: the first map_point_dim of tokens.MAP_FEATURES (6 for
    # checkpoints from before the per-lane signal features, 8 with them; every config.json records it).
    map_point_dim: int = MAP_FEATURES
    agent_dim: int = 10
    route_dim: int = 4
    ego_dim: int = 4
    # Names of the BEV channels the network takes, in its input order; empty (checkpoints from before it was
    # recorded): the first bev_channels of bev.channels in params/bev.yaml. Observations with other or more
    # channels are fed the ones named here (observation_inputs), so a checkpoint keeps working when a
    # channel is added to params/bev.yaml.
    bev_channel_names: list[str] = field(default_factory=list)

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
        if self.bev_channel_names and len(self.bev_channel_names) != self.bev_channels:
            raise ParameterError(f"bev_channel_names has {len(self.bev_channel_names)} names, expected "
                                 f"{self.bev_channels}")
        if not 1 <= int(self.map_point_dim) <= MAP_FEATURES:
            raise ParameterError(f"map_point_dim: {self.map_point_dim} must be in [1, {MAP_FEATURES}]")
        for key, dim in (("map_point", self.map_point_dim), ("agent", 10), ("route", 4), ("ego_state", 4)):
            if len(self.input_scale.get(key, [])) != dim:
                raise ParameterError(f"model.input_scale.{key} must have {dim} entries")

    def input_channel_names(self, observation_channels) -> list[str]:
        """The BEV channels this model takes, in its order: ``bev_channel_names``, or for checkpoints written
        before those were recorded the first ``bev_channels`` of ``observation_channels``."""
        return [str(c) for c in (self.bev_channel_names or list(observation_channels)[: self.bev_channels])]

    def bev_input_index(self, observation_channels) -> np.ndarray | None:
        """Indices, among an observation's BEV channels (names, ``bev.channels``), of the ones this model
        takes, in its order (None: all of them, in order)."""
        have = [str(c) for c in observation_channels]
        want = self.input_channel_names(have)
        if want == have:
            return None
        missing = [c for c in want if c not in have]
        if missing:
            raise ValueError(f"bev: the model takes channels {missing} that the observation's channels "
                             f"{have} (bev.channels) do not include")
        return np.array([have.index(c) for c in want], np.int64)

    def select_inputs(self, inputs: dict[str, np.ndarray], observation_channels) -> dict[str, np.ndarray]:
        """Batched scene inputs (``bev [B, C, H, W]``, ``map_polylines [B, N, P, F]``, ...) built with
        ``observation_channels`` (``bev.channels`` of the params/bev.yaml the observation was rendered
        with) -> what this model takes: its BEV channels, its first ``map_point_dim`` map features.
        Other fields pass through; a BEV with another channel count (already the model's) is left for
        the caller's shape check. ``observation_channels`` None: the caller does not know them, so the
        BEV must already be the model's (else the shape check names the mismatch)."""
        out = dict(inputs)
        bev = out.get("bev")
        if bev is not None and observation_channels is not None and bev.shape[1] == len(observation_channels):
            pick = self.bev_input_index(observation_channels)
            if pick is not None:
                out["bev"] = np.ascontiguousarray(bev[:, pick])
        mp = out.get("map_polylines")
        if mp is not None and mp.shape[-1] > self.map_point_dim:
            out["map_polylines"] = np.ascontiguousarray(mp[..., : self.map_point_dim])
        return out

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
        """From params/planner.yaml and params/bev.yaml as loaded."""
        m = require(planner, "model")
        return cls(
            bev_channels=len(require(bev, "bev.channels")),
            bev_channel_names=[str(c) for c in require(bev, "bev.channels")],
            map_point_dim=MAP_FEATURES,
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
