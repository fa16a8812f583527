"""OpenVINO backend: the same exported ONNX graphs as ONNX Runtime, compiled by OpenVINO's CPU plugin.

Why a second CPU runtime: on batched calls OpenVINO spreads one call over the threads better than
ONNX Runtime does, and on CPUs with native bfloat16 it can run the matrix products in it. Measured on
the shipped K = 4 generator (AMD EPYC Zen 5, 2 vCPUs; docs/performance.md "Runtimes"): 16 scenes x 32
candidates took 110 ms in f32 and 67 ms in bf16 against ONNX Runtime's 149 ms (one call, 2 threads).
In the planner's batch-1 cycle it is not faster: ONNX Runtime's candidate shards and pinned-shape
sessions (ort_backend.py) fit that call better, so ONNX Runtime stays the default.

Precision (``runtime.openvino.precision``): ``f32`` keeps every backend's outputs within the 1e-4 of
the parity tests. ``bf16`` runs the matrix products in bfloat16 where the CPU has native support
(AVX512-BF16 or AMX: Zen 4/5, Sapphire Rapids and later), about 1.4-2.2x faster again on the
generator, at about 3 significant digits: the outputs then differ from the FP32 ones by up to
~0.1 normalised units, like TensorRT's FP16 engines on a GPU. It is a deployment choice for a CPU
that has it, never the default. A CPU without it runs f32: the backend's ``precision`` is what the
plugin compiled (``requested_precision`` what was asked), and the fallback is logged.

Calls are serialised per graph (an infer request is not reentrant); the planner calls from one thread.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import require

from rad2_planner.diffusion import NoiseSchedule, SamplerSpec
from rad2_planner.runtime.base import (
    DISCRIMINATOR_OUTPUTS,
    SCENE_INPUTS,
    SCENE_OUTPUTS,
    Backend,
    BackendUnavailableError,
    correction_feed,
    denoiser_feed,
    discriminator_feed,
    generate_in_one_call,
)
from rad2_planner.runtime.onnx_export import ensure_onnx

log = logging.getLogger(__name__)

# the graphs this backend runs; the split discriminator is ONNX Runtime's (it serves its shards)
_GRAPHS = ("scene_encoder", "denoiser", "generator", "discriminator", "correction_encoder")


def openvino_settings(runtime_params: dict[str, Any]) -> tuple[str, int, bool]:
    """(precision, threads, cpu pinning) of ``runtime.openvino``. The precision comes from the schema-checked
    file (or an override checked against the schema); the thread settings are also set in code from a
    worker's thread count, so they are checked here."""
    p = require(runtime_params, "openvino", "planner.yaml", block="runtime")
    precision = require(p, "precision", "planner.yaml", block="runtime.openvino")
    threads = require(p, "threads", "planner.yaml", block="runtime.openvino")
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= 256:
        raise ValueError(f"runtime.openvino.threads: must be an integer in [1, 256], got {threads!r}")
    pinning = require(p, "cpu_pinning", "planner.yaml", block="runtime.openvino")
    if not isinstance(pinning, bool):
        raise ValueError(f"runtime.openvino.cpu_pinning: must be true or false, got {pinning!r}")
    return str(precision), int(threads), pinning


def _import_openvino():
    try:
        import openvino
    except ImportError as e:
        raise BackendUnavailableError(
            f"openvino backend: cannot import openvino ({e}); pip install -r tools/requirements.txt"
        ) from e
    return openvino


class _CompiledGraph:
    """One compiled graph with its infer request; ``run(feed)`` -> outputs by name (copies)."""

    def __init__(self, core, path: Path, config: dict[str, Any]):
        self.compiled = core.compile_model(str(path), "CPU", config)
        # a port has several names once OpenVINO fuses operators into it (a bool input's Cast: the
        # port of "map_mask" is also "/Cast_output_0"); feeds and outputs use the ONNX names among them
        self.inputs = {name for port in self.compiled.inputs for name in port.get_names()}
        self.outputs = [(port, sorted(port.get_names())) for port in self.compiled.outputs]
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # OpenVINO drops graph inputs that no output depends on; the rest are fed by name
        feed = {k: np.ascontiguousarray(v) for k, v in feed.items() if k in self.inputs}
        with self._lock:
            result = self._request.infer(feed, share_inputs=False, share_outputs=False)
        return {name: np.asarray(result[port]) for port, names in self.outputs for name in names}


class OpenVinoBackend(Backend):
    name = "openvino"

    def __init__(self, onnx_paths: dict[str, Path], runtime_params: dict[str, Any],
                 sampler_spec: SamplerSpec | None = None):
        """``onnx_paths``: graph name -> file; a ``generator`` graph must come with the
        ``sampler_spec`` it was exported for."""
        ov = _import_openvino()
        self.precision, self.threads, pinning = openvino_settings(runtime_params)
        core = ov.Core()
        if "CPU" not in core.available_devices:
            raise BackendUnavailableError(f"openvino backend: no CPU device (has {core.available_devices})")
        config = {
            "INFERENCE_PRECISION_HINT": self.precision,
            "INFERENCE_NUM_THREADS": self.threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            # off by default: the planner shares the cores with the rest of the stack (workers: always)
            "ENABLE_CPU_PINNING": pinning,
        }
        self.paths = {g: Path(p) for g, p in onnx_paths.items() if g in _GRAPHS}
        self.networks = {g: _CompiledGraph(core, p, config) for g, p in self.paths.items()}
        # what the plugin compiled: bf16 asked of a CPU without native bfloat16 runs in f32
        self.requested_precision = self.precision
        effective = {str(g.compiled.get_property("INFERENCE_PRECISION_HINT")) for g in self.networks.values()}
        self.precision = "bf16" if effective == {"<Type: 'bfloat16'>"} else "f32"
        if self.precision != self.requested_precision:
            log.warning("openvino backend: runtime.openvino.precision %s is not available on this CPU; "
                        "running in %s", self.requested_precision, self.precision)
        if "generator" in self.networks and sampler_spec is None:
            raise ValueError("openvino backend: a generator graph needs the sampler_spec it was exported for")
        self.sampler_spec = sampler_spec if "generator" in self.networks else None
        self.version = ov.get_version()

    @classmethod
    def from_model(cls, model, runtime_params: dict[str, Any], onnx_dir: str | None = None,
                   sampler_spec: SamplerSpec | None = None) -> OpenVinoBackend:
        """Export (or reuse the cached export of) ``model`` and compile its graphs."""
        _import_openvino()  # fail fast with the clear error before exporting anything
        d = onnx_dir or runtime_params["onnx_dir"]
        return cls(ensure_onnx(model, d, sampler_spec), runtime_params, sampler_spec=sampler_spec)

    def encode(self, inputs: dict[str, np.ndarray], prefetch_scores: bool = False) -> dict[str, Any]:
        outs = self.networks["scene_encoder"].run({k: inputs[k] for k in SCENE_INPUTS})
        return {k: outs[k] for k in SCENE_OUTPUTS}

    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        return self.networks["denoiser"].run(denoiser_feed(x_t, t, scene))["x0"]

    def generate(self, x_init, scene, schedule: NoiseSchedule, spec: SamplerSpec, timings=None) -> np.ndarray:
        return generate_in_one_call(self, lambda feed: self.networks["generator"].run(feed)["x0"],
                                    x_init, scene, schedule, spec, timings)

    def extend_scene(self, scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        if "correction_encoder" not in self.networks:
            return super().extend_scene(scene, trace, mask)
        outs = self.networks["correction_encoder"].run(correction_feed(scene, trace, mask))
        return {**scene, "scene_tokens": outs["corrected_tokens"], "scene_bias": outs["corrected_bias"]}

    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        outs = self.networks["discriminator"].run(discriminator_feed(trajectories, inputs, scene))
        logits, scores = (outs[k] for k in DISCRIMINATOR_OUTPUTS)
        return logits, scores
