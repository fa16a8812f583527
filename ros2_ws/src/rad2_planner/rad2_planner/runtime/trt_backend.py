"""TensorRT backend: engines built from the SAME ONNX files as the ONNX Runtime backend.

Written against the TensorRT 10 Python API (name-based tensor I/O: ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``). It is NOT exercised by this project's CI — TensorRT
cannot be installed there; run ``rad2 eval consistency`` on the target to compare it with ONNX
Runtime. Device buffers are torch CUDA tensors (no pycuda / cuda-python dependency).

- Precision: FP16 when ``runtime.tensorrt.fp16`` (the attention mask bias is −1e4, finite in FP16).
- Optimisation profiles: the scene encoder has one profile for B ∈ [1, max_batch]. The denoiser and
  the discriminator get one profile per M in ``runtime.tensorrt.profile_candidates`` covering
  (previous M, M] with opt = M; each profile gets its own execution context, chosen per call by M.
- Engine cache: ``<engine_cache_dir>/<graph>-<key>.engine`` with key = SHA-256 over the ONNX bytes,
  ``tensorrt.__version__``, the GPU name/compute capability and the build settings; a changed model,
  TensorRT version or GPU builds a new engine, an unchanged one is deserialised.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import writable_dir

from rad2_planner.runtime.base import (
    DISCRIMINATOR_OUTPUTS,
    SCENE_INPUTS,
    SCENE_OUTPUTS,
    Backend,
    BackendUnavailableError,
    denoiser_feed,
    discriminator_feed,
)
from rad2_planner.runtime.onnx_export import ensure_onnx

log = logging.getLogger(__name__)


def _import_tensorrt():
    try:
        import tensorrt as trt  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken placeholder wheel raising at import
        raise BackendUnavailableError(
            "planner.backend = 'tensorrt' but the TensorRT Python package cannot be imported "
            f"({type(e).__name__}: {e}). Install TensorRT 10 for your CUDA/driver (NVIDIA's wheel or "
            "JetPack), or choose backend 'onnxruntime' or 'pytorch'."
        ) from e
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover
        raise BackendUnavailableError(f"tensorrt backend needs torch for CUDA buffers ({e})") from e
    if not torch.cuda.is_available():
        raise BackendUnavailableError("tensorrt backend: TensorRT imported but no CUDA device is available")
    return trt, torch


class _Engine:
    """One deserialised engine with one execution context per optimisation profile."""

    def __init__(
        self,
        trt,
        torch,
        engine_bytes: bytes,
        dynamic_dim: tuple[str, int] | None,
        profile_ranges: list[tuple[int, int]],
    ):
        self.trt, self.torch = trt, torch
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialise the engine")
        self.stream = torch.cuda.Stream()
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.dynamic_dim = dynamic_dim  # (input name, axis) whose size picks the profile
        self.profile_ranges = profile_ranges
        self.contexts = []
        for p in range(self.engine.num_optimization_profiles):
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(p, self.stream.cuda_stream)
            self.contexts.append(ctx)
        self.stream.synchronize()

    def _context_for(self, feed: dict[str, np.ndarray]):
        if self.dynamic_dim is None:
            return self.contexts[0]
        name, axis = self.dynamic_dim
        size = feed[name].shape[axis]
        for ctx, (lo, hi) in zip(self.contexts, self.profile_ranges):
            if lo <= size <= hi:
                return ctx
        raise ValueError(
            f"tensorrt: {name} dimension {axis} = {size} is outside every optimisation profile "
            f"{self.profile_ranges}; add it to runtime.tensorrt.profile_candidates"
        )

    def run(self, feed: dict[str, Any]) -> list[np.ndarray]:
        torch, trt = self.torch, self.trt
        ctx = self._context_for(feed)
        keep = []
        with torch.cuda.stream(self.stream):
            for n in self.inputs:
                a = feed[n]
                want = trt.nptype(self.engine.get_tensor_dtype(n))
                if isinstance(a, torch.Tensor):
                    t = a.to("cuda", non_blocking=True).contiguous()
                else:
                    t = torch.from_numpy(np.ascontiguousarray(np.asarray(a).astype(want, copy=False))).to(
                        "cuda", non_blocking=True
                    )
                ctx.set_input_shape(n, tuple(t.shape))
                ctx.set_tensor_address(n, t.data_ptr())
                keep.append(t)
            outs = []
            for n in self.outputs:
                shape = tuple(ctx.get_tensor_shape(n))
                dtype = trt.nptype(self.engine.get_tensor_dtype(n))
                t = torch.empty(shape, dtype=torch.from_numpy(np.zeros(0, dtype=dtype)).dtype, device="cuda")
                ctx.set_tensor_address(n, t.data_ptr())
                outs.append(t)
            if not ctx.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed")
        self.stream.synchronize()
        return [o.cpu().numpy().astype(np.float32) for o in outs]


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, onnx_paths: dict[str, Path], runtime_params: dict[str, Any], plan_points: int):
        trt, torch = _import_tensorrt()
        self.trt, self.torch = trt, torch
        p = runtime_params["tensorrt"]
        self.fp16 = bool(p["fp16"])
        self.workspace = int(p["workspace_mb"]) << 20
        self.max_batch = int(p["max_batch"])
        ms = sorted({int(v) for v in p["profile_candidates"]})
        if not ms or ms[0] < 1:
            raise ValueError(f"runtime.tensorrt.profile_candidates must be positive integers, got {ms}")
        self.m_ranges = [((ms[i - 1] + 1) if i else 1, m) for i, m in enumerate(ms)]
        # the user's cache when engine_cache_dir is read-only (an installed package share)
        self.cache_dir = writable_dir(Path(p["engine_cache_dir"]), "tensorrt")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.plan_points = plan_points
        self.engines = {
            "scene_encoder": self._engine("scene_encoder", onnx_paths["scene_encoder"], None),
            "denoiser": self._engine("denoiser", onnx_paths["denoiser"], ("x_t", 1)),
            "discriminator": self._engine("discriminator", onnx_paths["discriminator"], ("trajectories", 1)),
        }

    @classmethod
    def from_model(
        cls, model, runtime_params: dict[str, Any], onnx_dir: str | None = None
    ) -> TensorRTBackend:
        _import_tensorrt()  # fail fast with the clear error before exporting anything
        d = onnx_dir or runtime_params["onnx_dir"]
        return cls(ensure_onnx(model, d), runtime_params, model.cfg.plan_points)

    def _cache_key(self, onnx_bytes: bytes, graph: str) -> str:
        props = self.torch.cuda.get_device_properties(0)
        h = hashlib.sha256(onnx_bytes)
        h.update(
            json.dumps(
                {
                    "trt": self.trt.__version__,
                    "gpu": props.name,
                    "cc": [props.major, props.minor],
                    "fp16": self.fp16,
                    "max_batch": self.max_batch,
                    "m_ranges": self.m_ranges,
                    "graph": graph,
                },
                sort_keys=True,
            ).encode()
        )
        return h.hexdigest()[:24]

    def engine(self, graph: str, onnx_path: Path, dynamic_dim: tuple[str, int] | None) -> _Engine:
        """An engine of one more graph, built or loaded from the cache (runtime.consistency checks the
        fused generator this way: ``dynamic_dim`` ("x_init", 1))."""
        return self._engine(graph, onnx_path, dynamic_dim)

    def _engine(self, graph: str, onnx_path: Path, dynamic_dim: tuple[str, int] | None) -> _Engine:
        onnx_bytes = Path(onnx_path).read_bytes()
        path = self.cache_dir / f"{graph}-{self._cache_key(onnx_bytes, graph)}.engine"
        ranges = [(1, self.max_batch)] if dynamic_dim is None else self.m_ranges
        if path.is_file():
            data = path.read_bytes()
        else:
            log.info("building TensorRT engine %s (fp16=%s); cached at %s", graph, self.fp16, path)
            data = self._build(onnx_bytes, graph, dynamic_dim)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return _Engine(self.trt, self.torch, data, dynamic_dim, ranges)

    def _build(self, onnx_bytes: bytes, graph: str, dynamic_dim: tuple[str, int] | None) -> bytes:
        trt = self.trt
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_bytes):
            errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT ONNX parser failed on {graph}: {errs}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace)
        if self.fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        ranges = [None] if dynamic_dim is None else self.m_ranges
        for rng in ranges:
            profile = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                inp = network.get_input(i)
                shape = list(inp.shape)
                lo, opt, hi = list(shape), list(shape), list(shape)
                lo[0], opt[0], hi[0] = 1, 1, self.max_batch  # batch
                if rng is not None and inp.name == dynamic_dim[0]:
                    ax = dynamic_dim[1]
                    lo[ax], opt[ax], hi[ax] = rng[0], rng[1], rng[1]
                if any(v < 0 for v in lo[1:] + hi[1:]):
                    raise RuntimeError(
                        f"TensorRT build of {graph}: input {inp.name} has unexpected dynamic dims {shape}"
                    )
                profile.set_shape(inp.name, tuple(lo), tuple(opt), tuple(hi))
            config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError(f"TensorRT failed to build the {graph} engine")
        return bytes(serialized)

    def encode(self, inputs: dict[str, np.ndarray], prefetch_scores: bool = False) -> dict[str, Any]:
        eng = self.engines["scene_encoder"]
        outs = dict(zip(eng.outputs, eng.run({k: inputs[k] for k in SCENE_INPUTS})))
        return {k: outs[k] for k in SCENE_OUTPUTS}

    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        return self.engines["denoiser"].run(denoiser_feed(x_t, t, scene))[0]

    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        eng = self.engines["discriminator"]
        feed = discriminator_feed(trajectories, inputs, scene)
        # By name: the engine's I/O tensor order is TensorRT's, not necessarily the ONNX output order.
        outs = dict(zip(eng.outputs, eng.run(feed)))
        logits, scores = (outs[k] for k in DISCRIMINATOR_OUTPUTS)
        return logits, scores
