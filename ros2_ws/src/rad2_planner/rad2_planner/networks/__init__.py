"""RAD-2 networks: scene encoder, DiT generator (denoiser), discriminator, and checkpoint I/O."""

from .config import ModelConfig
from .discriminator import Discriminator
from .encoders import SceneEncoder
from .generator import DiTDenoiser
from .model import PlannerModel
from .normalization import TrajectoryNormalizer

__all__ = [
    "ModelConfig",
    "SceneEncoder",
    "DiTDenoiser",
    "Discriminator",
    "PlannerModel",
    "TrajectoryNormalizer",
]
