"""The planner's networks as one object, and the checkpoint format.

A checkpoint is a directory:
- ``config.json``: ``{"format_version", "model": ModelConfig, "normalizer": TrajectoryNormalizer,
  "discriminator_trained": bool, "training": {...command, seed, steps, metrics...}}``
- ``generator.safetensors``: ``encoder.*`` and ``denoiser.*`` weights (and ``correction.*``, the
  correction-trace encoder, when ``model.correction_trace_len`` > 0: a self-correcting generator)
- ``discriminator.safetensors``: ``discriminator.*`` weights (optional; written when its encoders were
  initialised from the generator or after RL training; ``discriminator_trained`` says whether its
  scores mean anything).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rad2_planner.networks.config import ModelConfig
from rad2_planner.networks.correction import CorrectionEncoder
from rad2_planner.networks.discriminator import Discriminator
from rad2_planner.networks.encoders import SceneEncoder
from rad2_planner.networks.generator import DiTDenoiser
from rad2_planner.networks.normalization import TrajectoryNormalizer
from rad2_planner.runtime.base import DISCRIMINATOR_INPUTS

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or inconsistent."""


class PlannerModel(nn.Module):
    def __init__(self, cfg: ModelConfig, normalizer: TrajectoryNormalizer | None = None):
        super().__init__()
        self.cfg = cfg
        self.encoder = SceneEncoder(cfg)
        self.denoiser = DiTDenoiser(cfg)
        self.discriminator = Discriminator(cfg)
        self.correction = CorrectionEncoder(cfg) if cfg.correction_trace_len > 0 else None
        self.normalizer = normalizer or TrajectoryNormalizer.identity(cfg.plan_points, cfg.plan_dt, 5.0)
        self.discriminator_trained = False
        self.training_info: dict[str, Any] = {}
        # where exported graphs of these weights are cached (set by load; None for in-memory models)
        self.export_dir: Path | None = None

    def generator_parts(self) -> tuple[tuple[str, nn.Module], ...]:
        """(prefix, module) of what ``generator.safetensors`` holds."""
        parts = (("encoder", self.encoder), ("denoiser", self.denoiser))
        return parts if self.correction is None else (*parts, ("correction", self.correction))

    def generator_state(self) -> dict[str, torch.Tensor]:
        sd = {}
        for prefix, mod in self.generator_parts():
            sd.update({f"{prefix}.{k}": v.detach().contiguous().cpu() for k, v in mod.state_dict().items()})
        return sd

    def config_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "model": self.cfg.to_dict(),
            "normalizer": self.normalizer.to_dict(),
            "discriminator_trained": bool(self.discriminator_trained),
            "training": self.training_info,
        }

    def save(self, directory: str | Path, dtype: torch.dtype | str = torch.float32) -> Path:
        """Write the checkpoint; ``dtype=torch.float16`` halves the files (loading casts back to fp32).

        ``dtype="lossless"``: each weights file in float16 when every one of its values is exactly a
        float16 (e.g. a generator that RL kept frozen at a float16 checkpoint's weights), else float32,
        so the written checkpoint computes exactly what this model does."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if isinstance(dtype, str) and dtype != "lossless":
            raise ValueError(f"dtype: a torch floating dtype or 'lossless', got {dtype!r}")

        def file_dtype(sd) -> torch.dtype:
            if dtype != "lossless":
                return dtype
            exact = all(torch.equal(v.to(torch.float16).to(v.dtype), v)
                        for v in sd.values() if v.is_floating_point())
            return torch.float16 if exact else torch.float32

        def cast(sd, to):
            return {k: (v.to(to) if v.is_floating_point() else v) for k, v in sd.items()}

        gen = self.generator_state()
        disc_sd = self.discriminator.state_dict()
        disc = {f"discriminator.{k}": v.detach().contiguous().cpu() for k, v in disc_sd.items()}
        dtypes = {"generator": file_dtype(gen), "discriminator": file_dtype(disc)}
        save_file(cast(gen, dtypes["generator"]), str(d / "generator.safetensors"))
        save_file(cast(disc, dtypes["discriminator"]), str(d / "discriminator.safetensors"))
        meta = self.config_dict()
        names = {k: str(v).replace("torch.", "") for k, v in dtypes.items()}
        # one name when both files share it (the usual case), else the dtype of each file
        meta["weights_dtype"] = names["generator"] if len(set(names.values())) == 1 else names
        tmp = d / "config.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(d / "config.json")
        return d

    @classmethod
    def load(cls, directory: str | Path, discriminator_dir: str | Path | None = None) -> PlannerModel:
        d = Path(directory)
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"checkpoint {d}: no config.json")
        meta = _read_json(cfg_path)
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {d}: format_version {meta.get('format_version')} != {FORMAT_VERSION}"
            )
        model = cls(ModelConfig.from_dict(meta["model"]), TrajectoryNormalizer.from_dict(meta["normalizer"]))
        model.training_info = meta.get("training", {})
        gen_path = d / "generator.safetensors"
        if not gen_path.is_file():
            raise CheckpointError(f"checkpoint {d}: no generator.safetensors")
        sd = _read_weights(gen_path)
        for prefix, mod in model.generator_parts():
            part = {k[len(prefix) + 1 :]: v for k, v in sd.items() if k.startswith(prefix + ".")}
            _load_into(mod, part, gen_path)
        disc_dir = Path(discriminator_dir) if discriminator_dir else d
        disc_meta = meta
        if discriminator_dir:
            p = disc_dir / "config.json"
            if not p.is_file():
                raise CheckpointError(f"discriminator checkpoint {disc_dir}: no config.json")
            disc_meta = _read_json(p)
        disc_path = disc_dir / "discriminator.safetensors"
        if disc_path.is_file():
            dsd = _read_weights(disc_path)
            part = {k[len("discriminator.") :]: v for k, v in dsd.items()}
            _load_into(model.discriminator, part, disc_path)
            model.discriminator_trained = bool(disc_meta.get("discriminator_trained", False))
        elif discriminator_dir:
            raise CheckpointError(f"discriminator checkpoint {disc_dir}: no discriminator.safetensors")
        # The ONNX cache lives beside the weights it was exported from: the discriminator checkpoint's
        # folder when one is loaded separately (it changes the graphs), else the checkpoint's own, so
        # another checkpoint never overwrites it.
        model.export_dir = (Path(discriminator_dir) if discriminator_dir else d) / "onnx"
        model.eval()
        return model

    def takes_inputs_of(self, cfg: ModelConfig) -> bool:
        """Whether this model takes the BEV channels and map-point features ``cfg`` names."""
        names = self.cfg.input_channel_names(cfg.bev_channel_names)
        return names == list(cfg.bev_channel_names) and self.cfg.map_point_dim == cfg.map_point_dim

    def with_inputs_of(self, cfg: ModelConfig) -> PlannerModel:
        """A copy that takes ``cfg``'s BEV channels (by name) and map-point features and still computes
        what this model does (up to float rounding): the weights of the inputs it did not take start at
        zero, so a fine-tune (``rad2 train il --init-from``) begins from this model's behaviour.
        Only inputs can be added, none removed; a checkpoint without channel names takes the first
        ``bev_channels`` of ``cfg``'s."""
        import dataclasses

        old = self.cfg
        new_names = list(cfg.bev_channel_names)
        old_names = old.input_channel_names(new_names)
        dropped = [c for c in old_names if c not in new_names]
        if dropped or cfg.map_point_dim < old.map_point_dim:
            raise CheckpointError(f"with_inputs_of: the model takes BEV channels {dropped} or map-point "
                                  f"features {old.map_point_dim} that {new_names} / {cfg.map_point_dim} lack")
        old_scale = dict(zip(old_names, old.bev_channel_scale))
        new_cfg = dataclasses.replace(
            old, bev_channels=len(new_names), bev_channel_names=new_names,
            bev_channel_scale=[float(old_scale.get(c, 1.0)) for c in new_names],
            map_point_dim=cfg.map_point_dim,
            input_scale={**old.input_scale, "map_point": list(old.input_scale["map_point"])
                         + list(cfg.input_scale["map_point"][old.map_point_dim:])})
        out = PlannerModel(new_cfg, self.normalizer)
        channel_at = torch.tensor([new_names.index(c) for c in old_names])
        for name in ("encoder", "denoiser", "discriminator", "correction"):
            src, dst = getattr(self, name), getattr(out, name)
            if src is None:
                continue
            buffers = {k for k, _ in dst.named_buffers()}
            state = dst.state_dict()
            for key, value in src.state_dict().items():
                target = state[key]
                if key in buffers or target.shape == value.shape:
                    if target.shape == value.shape and key not in buffers:
                        state[key] = value.clone()
                    continue  # input scales: already the new config's
                widened = torch.zeros_like(target)
                bev_in = target.ndim == 4 and (target.shape[1], value.shape[1]) == (new_cfg.bev_channels,
                                                                                  old.bev_channels)
                map_in = target.ndim == 2 and (target.shape[1], value.shape[1]) == (new_cfg.map_point_dim,
                                                                                   old.map_point_dim)
                if bev_in:
                    widened[:, channel_at] = value  # the first BEV convolution [out, C, k, k]
                elif map_in:
                    widened[..., : old.map_point_dim] = value  # the first map-point layer [hidden, F]
                else:
                    raise CheckpointError(f"with_inputs_of: cannot widen {name}.{key} from "
                                          f"{tuple(value.shape)} to {tuple(target.shape)}")
                state[key] = widened
            dst.load_state_dict(state)
        out.discriminator_trained = self.discriminator_trained
        out.training_info = dict(self.training_info)
        return out

    def discriminator_logits(self, candidates, discriminator_inputs: dict[str, Any]) -> torch.Tensor:
        """Discriminator logits ``[B, M]`` (with gradients) of ``candidates [B, M, T, 2]`` (metres).

        ``discriminator_inputs``: batched arrays or tensors ``map_polylines, map_mask, agents,
        agents_mask, ego_state, bev_tokens`` as recorded by ``Rad2Policy.plan_batch(...,
        return_discriminator_inputs=True)`` (stack rows with ``policy.stack_discriminator_inputs``).
        The RL update recomputes the policy's logits from exactly what the runtime backend was fed.
        """
        device = next(self.parameters()).device
        traj = torch.as_tensor(candidates, device=device, dtype=torch.float32)
        if traj.ndim != 4 or traj.shape[-1] != 2:
            raise ValueError(f"candidates: shape {tuple(traj.shape)}, expected [B, M, T, 2]")
        args = []
        for name in DISCRIMINATOR_INPUTS[1:]:
            if name not in discriminator_inputs:
                raise ValueError(f"discriminator_inputs: missing {name!r} (need {DISCRIMINATOR_INPUTS[1:]})")
            a = torch.as_tensor(discriminator_inputs[name], device=device)
            a = a.bool() if name.endswith("_mask") else a.float()
            if a.ndim == 0 or a.shape[0] != traj.shape[0]:
                raise ValueError(
                    f"discriminator_inputs.{name}: shape {tuple(a.shape)} does not match the batch "
                    f"B={traj.shape[0]} of the candidates"
                )
            args.append(a)
        return self.discriminator.logits(traj, *args)

    def weights_hash(self) -> str:
        """Content hash of the weights + config (keys the ONNX export cache)."""
        h = hashlib.sha256(json.dumps(self.config_dict()["model"], sort_keys=True).encode())
        h.update(json.dumps(self.normalizer.to_dict(), sort_keys=True).encode())
        for k, v in sorted(self.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: unreadable checkpoint metadata ({type(exc).__name__}: {exc})") \
            from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """float32 tensors of a safetensors file; a truncated or foreign file is an error naming it."""
    try:
        sd = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 -- safetensors raises its own and OS errors alike
        raise CheckpointError(f"{path}: unreadable weights ({type(exc).__name__}: {exc})") from exc
    return {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:  # missing/unexpected keys or shapes that do not match config.json
        raise CheckpointError(f"{path}: weights do not fit the model of config.json ({exc})") from exc


def same_scene_encoder(a: PlannerModel, b: PlannerModel) -> bool:
    """Whether two models encode scenes identically (same encoder weights and normalisation)."""
    sa, sb = a.encoder.state_dict(), b.encoder.state_dict()
    return (sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
            and a.normalizer.to_dict() == b.normalizer.to_dict())
