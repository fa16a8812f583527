"""PyTorch backend (CPU or CUDA): runs the modules of a :class:`PlannerModel` directly."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rad2_planner.diffusion import NoiseSchedule, SamplerSpec
from rad2_planner.runtime.base import (
    DISCRIMINATOR_INPUTS,
    SCENE_INPUTS,
    SCENE_OUTPUTS,
    Backend,
    BackendUnavailableError,
)


class TorchBackend(Backend):
    name = "pytorch"

    def __init__(self, model, device: str = "cpu", sampler_spec: SamplerSpec | None = None,
                 cuda_graphs: bool = False):
        """``cuda_graphs``: on a CUDA device, replay the scene encoder, the fused sampler and the
        discriminator from captured CUDA graphs (runtime/cuda_graphs.py); ignored on the CPU."""
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"pytorch backend: device {device!r} requested but CUDA is not available"
            )
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.fused = None
        if sampler_spec is not None:
            from rad2_planner.networks.sampler import DiffusionSampler

            self.fused = DiffusionSampler(self.model.denoiser, model.cfg.num_train_steps, sampler_spec).eval()
        self._encoder = self.model.encoder
        self._sampler = self.fused
        self._discriminator = self.model.discriminator.logits_and_scores
        self.graphs: dict[str, Any] = {}
        if cuda_graphs and self.device.type == "cuda":
            from rad2_planner.runtime.cuda_graphs import CudaGraphCache

            self._encoder = self.graphs["encoder"] = CudaGraphCache(self.model.encoder, "scene encoder")
            if self.fused is not None:
                self._sampler = self.graphs["sampler"] = CudaGraphCache(self.fused, "fused sampler")
            self._discriminator = self.graphs["discriminator"] = CudaGraphCache(
                self.model.discriminator.logits_and_scores, "discriminator")

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), device=self.device)

    @torch.inference_mode()
    def encode(self, inputs: dict[str, np.ndarray], prefetch_scores: bool = False) -> dict[str, Any]:
        outs = self._encoder(*(self._t(inputs[k]) for k in SCENE_INPUTS))
        return dict(zip(SCENE_OUTPUTS, outs))

    @torch.inference_mode()
    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        x0 = self.model.denoiser(
            self._t(x_t), self._t(t), scene["scene_tokens"], scene["scene_bias"], scene["scene_cond"]
        )
        return x0.float().cpu().numpy()

    @torch.inference_mode()
    def generate(self, x_init, scene, schedule: NoiseSchedule, spec: SamplerSpec, timings=None) -> np.ndarray:
        if self.fused is None or self.fused.spec != spec:
            return super().generate(x_init, scene, schedule, spec, timings)
        t0 = time.perf_counter()
        x0 = self._sampler(self._t(x_init), scene["scene_tokens"], scene["scene_bias"], scene["scene_cond"])
        x0 = x0.float().cpu().numpy()
        if timings is not None:
            timings["generate"] = (time.perf_counter() - t0) * 1e3
        return x0

    @torch.inference_mode()
    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        logits, scores = self._discriminator(
            self._t(trajectories.astype(np.float32)),
            *(self._t(inputs[k]) for k in DISCRIMINATOR_INPUTS[1:-1]),
            scene["bev_tokens"],
        )
        return logits.float().cpu().numpy(), scores.float().cpu().numpy()

    @torch.inference_mode()
    def extend_scene(self, scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        if self.model.correction is None:
            return super().extend_scene(scene, trace, mask)
        tokens, bias = self.model.correction(scene["scene_tokens"], scene["scene_bias"],
                                             self._t(trace.astype(np.float32)), self._t(mask.astype(bool)))
        return {**scene, "scene_tokens": tokens, "scene_bias": bias}

    def scene_outputs(self, scene: dict[str, Any]) -> dict[str, np.ndarray]:
        return {k: scene[k].float().cpu().numpy() for k in SCENE_OUTPUTS}
