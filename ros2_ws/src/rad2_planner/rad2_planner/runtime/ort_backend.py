"""ONNX Runtime backend: the three exported graphs, CPU (default) or CUDA execution provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .base import (
    DENOISER_INPUTS,
    DISCRIMINATOR_INPUTS,
    DISCRIMINATOR_OUTPUTS,
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
        self, onnx_paths: dict[str, Path], runtime_params: dict[str, Any], providers: list[str] | None = None
    ):
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

    @classmethod
    def from_model(cls, model, runtime_params: dict[str, Any], onnx_dir: str | None = None) -> OrtBackend:
        """Export (or reuse the cached export of) ``model`` and open sessions on it."""
        d = onnx_dir or runtime_params["onnx_dir"]
        return cls(ensure_onnx(model, d), runtime_params)

    def encode(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        outs = self.sessions["scene_encoder"].run(None, {k: inputs[k] for k in SCENE_INPUTS})
        return dict(zip(SCENE_OUTPUTS, outs))

    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        feed = {"x_t": x_t, "t": t}
        feed.update({k: scene[k] for k in DENOISER_INPUTS[2:]})
        return self.sessions["denoiser"].run(None, feed)[0]

    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        feed = {k: inputs[k] for k in DISCRIMINATOR_INPUTS[1:-1]}
        feed["trajectories"] = np.ascontiguousarray(trajectories, dtype=np.float32)
        feed["bev_tokens"] = scene["bev_tokens"]
        logits, scores = self.sessions["discriminator"].run(list(DISCRIMINATOR_OUTPUTS), feed)
        return logits, scores
