"""Tiny planner networks for CPU tests: a small ModelConfig and a model with every path active."""

from __future__ import annotations

import torch
from rad2_core.config import load_params
from rad2_planner.networks import ModelConfig, PlannerModel


def tiny_config(**kw) -> ModelConfig:
    """A small ModelConfig (32x32 BEV, 4 map polylines, 3 agents, d_model 32); ``kw`` overrides fields."""
    planner = load_params("planner")
    args = dict(
        bev_channels=10,
        bev_hw=(32, 32),
        n_map=4,
        map_points=5,
        n_agents=3,
        n_route=5,
        plan_points=8,
        plan_dt=0.5,
        d_model=32,
        num_heads=2,
        mlp_ratio=2,
        bev_stages=[8, 16],
        point_mlp_hidden=16,
        fusion_layers=1,
        generator_layers=2,
        discriminator_layers=1,
        trajectory_scale_m=[40.0, 10.0],
        num_train_steps=int(planner["diffusion"]["num_train_steps"]),
        input_scale=planner["model"]["input_scale"],
    )
    args.update(kw)
    return ModelConfig(**args)


def randomised_model(cfg: ModelConfig | None = None, seed: int = 0) -> PlannerModel:
    """A model (in eval mode) whose zero-initialised (adaLN-Zero) layers are randomised so every path
    matters; ``cfg`` defaults to :func:`tiny_config`."""
    torch.manual_seed(seed)
    model = PlannerModel(cfg if cfg is not None else tiny_config())
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0.0, 0.1)
    return model.eval()
