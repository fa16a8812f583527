"""Join the generator of one RL stage with the discriminator of another into one planner checkpoint.

RAD-2's schedule alternates discriminator and generator updates in one run. A staged schedule reaches
the same pair in two runs: TC-GRPO on the discriminator with the imitation generator frozen, then
On-policy Generator Optimization of the generator (the discriminator of that second run drives the
rollouts and is then discarded). This module writes the resulting pair as one checkpoint: the
generator (encoder, denoiser, normaliser) of ``generator_dir`` and the discriminator weights of
``discriminator_dir``, with both runs' training records under ``training`` so the checkpoint says how
it was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rad2_planner.networks import PlannerModel
from rad2_planner.networks.model import CheckpointError, _read_json


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory}: no config.json")
    meta = _read_json(path)
    if not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{path}: no model section")
    return meta


def compose_checkpoint(generator_dir: str | Path, discriminator_dir: str | Path, out: str | Path,
                       dtype: torch.dtype | str = torch.float16, command: str = "") -> Path:
    """Write ``out`` = generator of ``generator_dir`` + discriminator of ``discriminator_dir``.

    Both checkpoints must have the same network configuration (the discriminator reads the
    generator's candidates and the same scene inputs); a difference is refused, naming the keys."""
    gen_dir, disc_dir, out = Path(generator_dir), Path(discriminator_dir), Path(out)
    if out.resolve() in (gen_dir.resolve(), disc_dir.resolve()):
        raise ValueError(f"out = {out}: must differ from both inputs (they are read while it is written)")
    disc_meta = _config(disc_dir)
    gen_cfg, disc_cfg = _config(gen_dir)["model"], disc_meta["model"]
    differ = sorted(k for k in set(gen_cfg) | set(disc_cfg) if gen_cfg.get(k) != disc_cfg.get(k))
    if differ:
        raise CheckpointError(
            f"generator {gen_dir} and discriminator {disc_dir} differ in model config keys {differ}: "
            + ", ".join(f"{k}: {gen_cfg.get(k)!r} vs {disc_cfg.get(k)!r}" for k in differ[:4]))
    model = PlannerModel.load(gen_dir, discriminator_dir=disc_dir)
    if not model.discriminator_trained:
        raise CheckpointError(f"discriminator checkpoint {disc_dir}: discriminator_trained is false "
                              "(an untrained discriminator would rank at random)")
    disc_training = disc_meta.get("training", {})
    model.training_info = {
        "composed": {"generator_from": str(gen_dir), "discriminator_from": str(disc_dir),
                     "command": command},
        "generator_training": model.training_info,
        "discriminator_training": disc_training,
    }
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / "onnx").glob("*"):  # graphs exported from other weights
        stale.unlink()
    return model.save(out, dtype=dtype)
