"""Runtime backend interface: the three network calls of one planning cycle.

Every backend runs the SAME three graphs — the scene encoder, ONE denoising step of the DiT, the
discriminator — with NumPy arrays in and out; the sampler loop (:mod:`rad2_planner.diffusion`), the
(de)normalisation and the selection stay in Python/NumPy in :mod:`rad2_planner.policy`, so the code
path is identical for PyTorch, ONNX Runtime and TensorRT.

Tensor names (also the ONNX input/output names):
- scene encoder: ``bev [B,C,H,W] f32, map_polylines [B,N_map,P,6] f32, map_mask [B,N_map] bool,
  agents [B,N_agents,10] f32, agents_mask [B,N_agents] bool, route [B,N_route,4] f32,
  route_mask [B,N_route] bool, ego_state [B,4] f32`` -> ``scene_tokens [B,S,D], scene_bias [B,S],
  scene_cond [B,D], bev_tokens [B,N_bev,D]``
- denoiser: ``x_t [B,M,T,2], t [B], scene_tokens, scene_bias, scene_cond`` -> ``x0 [B,M,T,2]``
- generator (optional, one per sampler configuration): ``x_init [B,M,T,2], scene_tokens, scene_bias,
  scene_cond`` -> ``x0 [B,M,T,2]``: all K steps of the sampler in one call
  (:class:`rad2_planner.networks.sampler.DiffusionSampler`); :meth:`Backend.generate` uses it when its
  configuration matches and the step-by-step loop otherwise
- discriminator: ``trajectories [B,M,T,2] (metres), map_polylines, map_mask, agents, agents_mask,
  ego_state, bev_tokens`` -> ``logits [B,M], scores [B,M]`` (scores = sigmoid(logits), both from
  the same evaluation so that no caller has to invert a saturated float32 sigmoid); also exported
  split in two, ``discriminator_context`` (the observation inputs: map, agents, ego state ->
  ``DISCRIMINATOR_CONTEXT_OUTPUTS``, once per scene) and ``discriminator_head`` (``trajectories``,
  ``bev_tokens`` + the context -> logits, scores), which ONNX Runtime runs (the context at the same
  time as the scene encoder, the head per candidate shard)
- correction encoder (self-correcting generators only, ``model.correction_trace_len`` L > 0):
  ``scene_tokens, scene_bias, correction_trace [B,L,T,2] (normalised), correction_mask [B,L] bool``
  -> ``corrected_tokens [B,S+L,D], corrected_bias [B,S+L]``; the denoiser and generator graphs of such
  a model take the S + L tokens (:meth:`Backend.extend_scene`)
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from rad2_core.config import require

from rad2_planner.diffusion import NoiseSchedule, SamplerSpec, sample

SCENE_INPUTS = (
    "bev",
    "map_polylines",
    "map_mask",
    "agents",
    "agents_mask",
    "route",
    "route_mask",
    "ego_state",
)
SCENE_OUTPUTS = ("scene_tokens", "scene_bias", "scene_cond", "bev_tokens")
DENOISER_INPUTS = ("x_t", "t", "scene_tokens", "scene_bias", "scene_cond")
DENOISER_OUTPUTS = ("x0",)
GENERATOR_INPUTS = ("x_init", "scene_tokens", "scene_bias", "scene_cond")
GENERATOR_OUTPUTS = ("x0",)
DISCRIMINATOR_INPUTS = (
    "trajectories",
    "map_polylines",
    "map_mask",
    "agents",
    "agents_mask",
    "ego_state",
    "bev_tokens",
)
DISCRIMINATOR_OUTPUTS = ("logits", "scores")
# The discriminator in two graphs (ONNX Runtime): its candidate-independent part once per scene, then
# the per-candidate part (networks.discriminator.Discriminator.context / .head); same result.
DISCRIMINATOR_CONTEXT_INPUTS = DISCRIMINATOR_INPUTS[1:-1]  # not the candidates, not the BEV tokens
DISCRIMINATOR_CONTEXT_OUTPUTS = (
    "disc_ego",
    "disc_map_keys", "disc_map_values", "disc_map_bias",
    "disc_agent_keys", "disc_agent_values", "disc_agent_bias",
    "disc_agent_map_keys", "disc_agent_map_values", "disc_agent_map_bias",
)
DISCRIMINATOR_HEAD_INPUTS = ("trajectories", "bev_tokens", *DISCRIMINATOR_CONTEXT_OUTPUTS)
CORRECTION_INPUTS = ("scene_tokens", "scene_bias", "correction_trace", "correction_mask")
CORRECTION_OUTPUTS = ("corrected_tokens", "corrected_bias")


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here (its runtime library is missing or has no device)."""


class Backend(ABC):
    """One runtime. ``scene`` objects returned by :meth:`encode` are opaque to callers."""

    name: str = "?"

    @abstractmethod
    def encode(self, inputs: dict[str, np.ndarray], prefetch_scores: bool = False) -> dict[str, Any]:
        """Scene encoder on a batch of observations (keys ``SCENE_INPUTS``). ``prefetch_scores``: the
        caller will score candidates of this scene (:meth:`score_logits` with the same ``inputs``), so
        a backend may start the discriminator's candidate-independent work now."""

    def scene_rows(self, scene: dict[str, Any], rows: list[int]) -> dict[str, Any]:
        """The scene of batch rows ``rows`` of an :meth:`encode` result (e.g. the rows a safety layer
        plans again), for calls on those rows' inputs only."""
        return {key: value[rows] for key, value in scene.items()}

    @abstractmethod
    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        """One DiT evaluation: predicted clean normalised trajectories [B, M, T, 2]."""

    def generate(
        self,
        x_init: np.ndarray,
        scene: dict[str, Any],
        schedule: NoiseSchedule,
        spec: SamplerSpec,
        timings: dict[str, float] | None = None,
    ) -> np.ndarray:
        """All K sampler steps from ``x_init [B, M, T, 2]`` -> clean normalised trajectories.

        This default runs the NumPy sampler loop around :meth:`denoise` (``timings`` gets
        ``denoise_<i>`` per step); backends with a single-call sampler override it (``timings`` then
        gets ``generate``: the K steps together).
        """
        return sample(
            lambda x, t: self.denoise(x, t, scene),
            x_init,
            schedule,
            spec.num_steps,
            spec.sampler,
            spec.x0_clip,
            timings,
        )

    @abstractmethod
    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Discriminator ``(logits [B, M], scores [B, M])`` float32 of trajectories in metres."""

    def score(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> np.ndarray:
        """Discriminator scores [B, M] in (0, 1) only (the ``scores`` half of :meth:`score_logits`)."""
        return self.score_logits(trajectories, inputs, scene)[1]

    def scene_outputs(self, scene: dict[str, Any]) -> dict[str, np.ndarray]:
        """The scene encoder's outputs as NumPy arrays (for recording and consistency checks)."""
        return {k: np.asarray(scene[k]) for k in SCENE_OUTPUTS}

    def extend_scene(self, scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        """``scene`` with the correction trace appended to its tokens (self-correcting generators:
        ``trace [B, L, T, 2]`` normalised rejected proposals, ``mask [B, L]`` which slots hold one)."""
        raise BackendUnavailableError(f"{self.name} backend: no correction encoder (self-correction is "
                                      "available on the pytorch, onnxruntime and openvino backends)")


# The feeds of the exported graphs (the ONNX-file backends: ONNX Runtime, OpenVINO, TensorRT).
def denoiser_feed(x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> dict[str, np.ndarray]:
    return {"x_t": x_t, "t": t, **{k: scene[k] for k in DENOISER_INPUTS[2:]}}


def correction_feed(scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    values = (scene["scene_tokens"], scene["scene_bias"], np.ascontiguousarray(trace, dtype=np.float32),
              np.ascontiguousarray(mask, dtype=bool))
    return dict(zip(CORRECTION_INPUTS, values))


def discriminator_feed(trajectories: np.ndarray, inputs: dict[str, np.ndarray],
                       scene: dict[str, Any]) -> dict[str, np.ndarray]:
    """The one-graph discriminator's inputs; the candidates (metres) as contiguous float32."""
    feed = {k: inputs[k] for k in DISCRIMINATOR_INPUTS[1:-1]}
    feed["trajectories"] = np.ascontiguousarray(trajectories, dtype=np.float32)
    feed["bev_tokens"] = scene["bev_tokens"]
    return feed


def generate_in_one_call(backend: Backend, run_generator, x_init: np.ndarray, scene: dict[str, Any],
                         schedule: NoiseSchedule, spec: SamplerSpec, timings: dict[str, float] | None):
    """:meth:`Backend.generate` of a backend with a single-call generator graph exported for
    ``backend.sampler_spec``: ``run_generator(feed) -> x0`` when ``spec`` is that one (``timings`` gets
    ``generate``), the step-by-step loop otherwise."""
    if backend.sampler_spec != spec:
        return Backend.generate(backend, x_init, scene, schedule, spec, timings)
    t0 = time.perf_counter()
    feed = {"x_init": np.ascontiguousarray(x_init, dtype=np.float32),
            **{k: scene[k] for k in GENERATOR_INPUTS[1:]}}
    x0 = run_generator(feed)
    if timings is not None:
        timings["generate"] = (time.perf_counter() - t0) * 1e3
    return x0


def make_backend(
    name: str,
    model,
    runtime_params: dict[str, Any],
    device: str = "cpu",
    onnx_dir: str | None = None,
    sampler_spec: SamplerSpec | None = None,
) -> Backend:
    """Backend by name (``planner.backend``): ``pytorch`` | ``onnxruntime`` | ``openvino`` | ``tensorrt``.

    ``sampler_spec``: the planner's sampler; with ``runtime.fused_sampler`` true, the PyTorch, ONNX
    Runtime and OpenVINO backends run its K steps as one call (:meth:`Backend.generate`).
    """
    fused = sampler_spec if bool(require(runtime_params, "fused_sampler", "planner.yaml",
                                         block="runtime")) else None
    if name == "pytorch":
        from rad2_planner.runtime.torch_backend import TorchBackend

        return TorchBackend(model, device=device, sampler_spec=fused,
                            cuda_graphs=bool(require(runtime_params, "torch_cuda_graphs", "planner.yaml",
                                                     block="runtime")))
    if name == "onnxruntime":
        from rad2_planner.runtime.ort_backend import OrtBackend

        return OrtBackend.from_model(model, runtime_params, onnx_dir=onnx_dir, sampler_spec=fused)
    if name == "openvino":
        from rad2_planner.runtime.openvino_backend import OpenVinoBackend

        return OpenVinoBackend.from_model(model, runtime_params, onnx_dir=onnx_dir, sampler_spec=fused)
    if name == "tensorrt":
        from rad2_planner.runtime.trt_backend import TensorRTBackend

        return TensorRTBackend.from_model(model, runtime_params, onnx_dir=onnx_dir)
    # planner.backend is checked against its schema's choices where it is read or overridden
    raise ValueError(f"planner.backend: no backend named {name!r}")
