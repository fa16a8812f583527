"""RAD-2 networks: scene encoder, DiT generator (denoiser), discriminator, and checkpoint I/O."""

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.discriminator import Discriminator
from rad2_planner.networks.encoders import SceneEncoder
from rad2_planner.networks.generator import DiTDenoiser
from rad2_planner.networks.model import PlannerModel
from rad2_planner.networks.normalization import TrajectoryNormalizer

__all__ = [
    "ModelConfig",
    "SceneEncoder",
    "DiTDenoiser",
    "Discriminator",
    "PlannerModel",
    "TrajectoryNormalizer",
]
