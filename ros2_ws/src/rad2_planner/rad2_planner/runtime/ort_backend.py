"""ONNX Runtime backend: the three exported graphs, CPU (default) or CUDA execution provider."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..diffusion import NoiseSchedule, SamplerSpec
from .base import (
    DENOISER_INPUTS,
    DISCRIMINATOR_INPUTS,
    DISCRIMINATOR_OUTPUTS,
    GENERATOR_INPUTS,
    SCENE_INPUTS,
    SCENE_OUTPUTS,
    Backend,
    BackendUnavailableError,
)
from .onnx_export import ensure_onnx


def _session_options(ort, runtime_params: dict[str, Any]):
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(runtime_params["ort_intra_op_threads"])
    so.inter_op_num_threads = int(runtime_params["ort_inter_op_threads"])
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    spin = "1" if bool(runtime_params["ort_allow_spinning"]) else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return so


class OrtBackend(Backend):
    name = "onnxruntime"

    def __init__(
        self,
        onnx_paths: dict[str, Path],
        runtime_params: dict[str, Any],
        providers: list[str] | None = None,
        sampler_spec: SamplerSpec | None = None,
    ):
        """``onnx_paths``: graph name -> file; a ``generator`` graph must come with the
        ``sampler_spec`` it was exported for."""
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover - onnxruntime is a pinned dependency
            raise BackendUnavailableError(f"onnxruntime backend: cannot import onnxruntime ({e})") from e
        so = _session_options(ort, runtime_params)
        providers = providers or ["CPUExecutionProvider"]
        self.sessions = {
            g: ort.InferenceSession(str(p), so, providers=providers) for g, p in onnx_paths.items()
        }
        self.paths = dict(onnx_paths)
        if "generator" in self.sessions and sampler_spec is None:
            raise ValueError(
                "onnxruntime backend: a generator graph needs the sampler_spec it was exported for"
            )
        self.sampler_spec = sampler_spec if "generator" in self.sessions else None

    @classmethod
    def from_model(
        cls,
        model,
        runtime_params: dict[str, Any],
        onnx_dir: str | None = None,
        sampler_spec: SamplerSpec | None = None,
    ) -> OrtBackend:
        """Export (or reuse the cached export of) ``model`` and open sessions on it; with a
        ``sampler_spec``, also the single-call generator graph of that sampler."""
        d = onnx_dir or runtime_params["onnx_dir"]
        return cls(ensure_onnx(model, d, sampler_spec), runtime_params, sampler_spec=sampler_spec)

    def encode(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        outs = self.sessions["scene_encoder"].run(None, {k: inputs[k] for k in SCENE_INPUTS})
        return dict(zip(SCENE_OUTPUTS, outs))

    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        feed = {"x_t": x_t, "t": t}
        feed.update({k: scene[k] for k in DENOISER_INPUTS[2:]})
        return self.sessions["denoiser"].run(None, feed)[0]

    def generate(self, x_init, scene, schedule: NoiseSchedule, spec: SamplerSpec, timings=None) -> np.ndarray:
        if self.sampler_spec != spec:
            return super().generate(x_init, scene, schedule, spec, timings)
        t0 = time.perf_counter()
        feed = {"x_init": np.ascontiguousarray(x_init, dtype=np.float32)}
        feed.update({k: scene[k] for k in GENERATOR_INPUTS[1:]})
        x0 = self.sessions["generator"].run(None, feed)[0]
        if timings is not None:
            timings["generate"] = (time.perf_counter() - t0) * 1e3
        return x0

    def extend_scene(self, scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        if "correction_encoder" not in self.sessions:
            return super().extend_scene(scene, trace, mask)
        feed = {"scene_tokens": scene["scene_tokens"], "scene_bias": scene["scene_bias"],
                "correction_trace": np.ascontiguousarray(trace, dtype=np.float32),
                "correction_mask": np.ascontiguousarray(mask, dtype=bool)}
        tokens, bias = self.sessions["correction_encoder"].run(None, feed)
        return {**scene, "scene_tokens": tokens, "scene_bias": bias}

    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        feed = {k: inputs[k] for k in DISCRIMINATOR_INPUTS[1:-1]}
        feed["trajectories"] = np.ascontiguousarray(trajectories, dtype=np.float32)
        feed["bev_tokens"] = scene["bev_tokens"]
        logits, scores = self.sessions["discriminator"].run(list(DISCRIMINATOR_OUTPUTS), feed)
        return logits, scores
