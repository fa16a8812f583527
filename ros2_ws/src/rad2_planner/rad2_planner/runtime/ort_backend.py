"""ONNX Runtime backend: the exported graphs, CPU (default) or CUDA execution provider.

Candidate shards (``runtime.ort_candidate_shards``): the generator, denoiser and discriminator treat
the M candidates independently, so their calls can be split along the candidate axis into shards run
concurrently, each on its share of the intra-op threads. A graph of these sizes (d = 128, a few
hundred tokens) is made of many small operators that one call cannot spread over two threads
(measured here: 2 threads were 1.11x faster than 1 on the K = 4 generator at M = 32), whereas two
single-threaded calls on half the candidates each keep both cores busy (1.6x). The scene encoder
has no candidate axis and keeps all the threads.

Sessions per input shape (``runtime.ort_fixed_shapes``): the graphs are exported with symbolic batch
and candidate dimensions, so every reshape of a call computes its target shape at run time (``Shape``,
``Gather``, ``Unsqueeze``, ``Concat``: about 1,450 of the sampler graph's 2,280 operators after ONNX
Runtime's own optimisation). A session whose symbolic dimensions are pinned
(``SessionOptions.add_free_dimension_override_by_name``) folds all of them at load, leaving about 820
operators. :class:`ShapeSessions` opens one such session per shape a graph is called with at batch 1
and at most ``runtime.ort_fixed_shapes_max_candidates`` candidates per call (the planner's cycle, where
the per-operator cost is the cycle's), the first time it is (0.2–0.6 s), and keeps the most recent
``runtime.ort_fixed_shape_sessions`` of them. Measured interleaved in one process
(docs/performance.md): 5 % off the M = 32 cycle (16 candidates per call), nothing at 32 per call,
3 % slower at 64 per call, where the operators' own work dominates. Batched calls (rollouts of many
clips, whose batch shrinks as episodes end) use the symbolic session: a new session per batch size
would cost more than the few operators it saves per row.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import require

from rad2_planner.diffusion import NoiseSchedule, SamplerSpec
from rad2_planner.runtime.base import (
    DISCRIMINATOR_CONTEXT_INPUTS,
    DISCRIMINATOR_CONTEXT_OUTPUTS,
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

# Graphs whose calls may be split along the candidate axis (axis 1 of these inputs and of every output).
_CANDIDATE_INPUTS = {"denoiser": "x_t", "generator": "x_init", "discriminator": "trajectories",
                     "discriminator_head": "trajectories"}
# The discriminator's candidate-independent part runs on one thread beside the scene encoder.
_SIDE_GRAPHS = ("discriminator_context",)
_CONTEXT_KEY = "_discriminator_context"  # scene dict entry: a Future of the context's arrays (prefetch)


def candidate_shards(runtime_params: dict[str, Any]) -> int:
    """Concurrent calls per candidate-axis graph: ``runtime.ort_candidate_shards``, at most the
    intra-op threads (the shards share them; a Ray worker on one thread gets one shard)."""
    shards = require(runtime_params, "ort_candidate_shards", "planner.yaml", block="runtime")
    # params/ files are schema-checked at load; a worker sets the thread counts in code, checked here
    if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
        raise ValueError(f"runtime.ort_candidate_shards: must be an integer >= 1, got {shards!r}")
    return max(1, min(int(shards), int(runtime_params["ort_intra_op_threads"])))


def fixed_shape_sessions(runtime_params: dict[str, Any]) -> tuple[int, int]:
    """(sessions kept per graph with their dimensions pinned, most candidates per pinned call):
    ``runtime.ort_fixed_shapes`` / ``ort_fixed_shape_sessions`` / ``ort_fixed_shapes_max_candidates``;
    (0, 0): one session over the symbolic dimensions."""
    if not require(runtime_params, "ort_fixed_shapes", "planner.yaml", block="runtime"):
        return 0, 0
    out = []
    for key in ("ort_fixed_shape_sessions", "ort_fixed_shapes_max_candidates"):
        n = require(runtime_params, key, "planner.yaml", block="runtime")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"runtime.{key}: must be an integer >= 1, got {n!r}")
        out.append(int(n))
    return out[0], out[1]


_profiled_sessions = itertools.count()


def _session_options(ort, runtime_params: dict[str, Any], intra_op_threads: int | None = None,
                     graph: str = "graph"):
    so = ort.SessionOptions()
    prefix = require(runtime_params, "ort_profile_prefix", "planner.yaml", block="runtime")
    if prefix:  # one trace file per session: <prefix><graph>_<n>_<date>.json (ONNX Runtime adds the date)
        try:
            Path(os.path.dirname(prefix) or ".").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"runtime.ort_profile_prefix: cannot create the folder of {prefix!r} "
                             f"({e})") from e
        so.enable_profiling = True
        so.profile_file_prefix = f"{prefix}{graph}_{next(_profiled_sessions)}"
    so.intra_op_num_threads = int(intra_op_threads or runtime_params["ort_intra_op_threads"])
    so.inter_op_num_threads = int(runtime_params["ort_inter_op_threads"])
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    spin = "1" if bool(runtime_params["ort_allow_spinning"]) else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return so


class ShapeSessions:
    """One graph's ONNX Runtime sessions, each with the graph's symbolic dimensions pinned to the shape
    of the batch-1 calls of at most ``max_candidates`` candidates it serves, and one over the symbolic
    dimensions for the other calls (module docstring); ``run`` has ``InferenceSession.run``'s signature.

    ``max_sessions`` 0 keeps one session with the symbolic dimensions (any shape, nothing folded).
    """

    def __init__(self, ort, path: Path, options, providers: list[str], max_sessions: int,
                 max_candidates: int = 0):
        self._ort, self._path, self._options, self._providers = ort, str(path), options, providers
        self.max_sessions = int(max_sessions)
        self.max_candidates = int(max_candidates)
        self._sessions: OrderedDict[tuple, Any] = OrderedDict()
        self._ended_traces: list[str] = []  # operator-profile files of sessions already closed
        self._lock = threading.Lock()
        # the metadata (inputs, outputs, symbolic dimensions) of a session over the graph as exported
        self._generic = ort.InferenceSession(self._path, options(), providers=providers)
        self._symbolic = {i.name: [d if isinstance(d, str) else None for d in i.shape]
                          for i in self._generic.get_inputs()}

    def get_inputs(self):
        return self._generic.get_inputs()

    def get_outputs(self):
        return self._generic.get_outputs()

    def shape_key(self, feed: dict[str, np.ndarray]) -> tuple[tuple[str, int], ...]:
        """The values the call gives the symbolic dimensions, ``(("batch", 1), ("candidates", 16))``."""
        values: dict[str, int] = {}
        for name, dims in self._symbolic.items():
            if name in feed:
                for dim, size in zip(dims, np.shape(feed[name])):
                    if dim is not None:
                        values.setdefault(dim, int(size))
        return tuple(sorted(values.items()))

    def session_for(self, feed: dict[str, np.ndarray]):
        """The session serving ``feed``'s shape, opened on first use (the least recent one closed)."""
        if self.max_sessions <= 0:
            return self._generic
        key = self.shape_key(feed)
        dims = dict(key)
        if dims.get("batch", 1) != 1 or dims.get("candidates", 0) > self.max_candidates:
            return self._generic
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
                return session
            options = self._options()
            for dim, size in key:
                options.add_free_dimension_override_by_name(dim, size)
            session = self._ort.InferenceSession(self._path, options, providers=self._providers)
            self._sessions[key] = session
            while len(self._sessions) > self.max_sessions:
                _, closed = self._sessions.popitem(last=False)
                self._ended_traces.append(closed.end_profiling())  # "" without the profiler
            return session

    def run(self, outputs, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session_for(feed).run(outputs, feed)

    def end_profiling(self) -> list[str]:
        """Stop the operator profiler of every open session (``runtime.ort_profile_prefix``) and return
        the trace files they wrote (none when the profiler is off)."""
        with self._lock:
            sessions = [self._generic, *self._sessions.values()]
            files, self._ended_traces = self._ended_traces, []
        files += [sess.end_profiling() for sess in sessions]
        return [f for f in files if f]

    @property
    def shapes(self) -> list[tuple[tuple[str, int], ...]]:
        """The shapes with an open session, least recently used first."""
        with self._lock:
            return list(self._sessions)


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
        providers = list(providers or require(runtime_params, "ort_providers", "planner.yaml",
                                              block="runtime"))
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise BackendUnavailableError(
                f"onnxruntime backend: runtime.ort_providers {providers} names {missing}, which this "
                f"onnxruntime build ({ort.__version__}) lacks; it has {ort.get_available_providers()}")
        # Shards only where they can run side by side: on the CPU provider.
        self.shards = candidate_shards(runtime_params) if providers == ["CPUExecutionProvider"] else 1
        threads = int(runtime_params["ort_intra_op_threads"])
        shard_threads = max(1, threads // self.shards)
        max_sessions, max_candidates = fixed_shape_sessions(runtime_params)

        def sessions(graph, path, n_threads):
            options = lambda: _session_options(ort, runtime_params, n_threads, graph)  # noqa: E731
            return ShapeSessions(ort, path, options, providers, max_sessions, max_candidates)

        shard_graphs = set(_CANDIDATE_INPUTS) | set(_SIDE_GRAPHS) if self.shards > 1 else set()
        self.sessions = {g: sessions(g, p, shard_threads if g in shard_graphs else threads)
                         for g, p in onnx_paths.items()}
        self._pool = ThreadPoolExecutor(self.shards - 1, "ort-shard") if self.shards > 1 else None
        self.paths = dict(onnx_paths)
        if "generator" in self.sessions and sampler_spec is None:
            raise ValueError(
                "onnxruntime backend: a generator graph needs the sampler_spec it was exported for"
            )
        self.sampler_spec = sampler_spec if "generator" in self.sessions else None
        # the discriminator in two graphs (onnx_export.SPLIT_DISCRIMINATOR_GRAPHS) when both were given
        # and there is a shard thread to run the context on; else the one-graph discriminator (one call)
        self.split_discriminator = (
            self._pool is not None and {"discriminator_context", "discriminator_head"} <= set(self.sessions))
        # while the discriminator's context takes a shard thread, the scene encoder runs on the rest
        self._encoder_beside_context = None
        if self.split_discriminator and "scene_encoder" in onnx_paths:
            self._encoder_beside_context = sessions("scene_encoder", onnx_paths["scene_encoder"],
                                                    shard_threads)

    def end_profiling(self) -> list[str]:
        """The operator-profile trace files of every session (``runtime.ort_profile_prefix``), their
        profilers stopped; :func:`rad2_evaluation.benchmarking.operator_profile` reads them."""
        groups = list(self.sessions.values()) + [s for s in (self._encoder_beside_context,) if s is not None]
        return [f for group in groups for f in group.end_profiling()]

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

    def _run(self, graph: str, feed: dict[str, np.ndarray], outputs=None) -> list[np.ndarray]:
        """``session.run`` of a candidate-axis graph, split into ``self.shards`` concurrent calls
        along the candidates (outputs joined back in order); one call when M is below the shards."""
        key = _CANDIDATE_INPUTS[graph]
        m = feed[key].shape[1]
        session = self.sessions[graph]
        if self._pool is None or m < self.shards:
            return session.run(outputs, feed)
        parts = []
        for idx in np.array_split(np.arange(m), self.shards):
            part = dict(feed)
            part[key] = np.ascontiguousarray(feed[key][:, idx[0] : idx[-1] + 1])
            parts.append(part)
        # the calling thread runs the first shard itself: one thread hand-off fewer per call
        others = [self._pool.submit(session.run, outputs, f) for f in parts[1:]]
        results = [session.run(outputs, parts[0])] + [f.result() for f in others]
        return [np.concatenate(outs, axis=1) for outs in zip(*results)]

    def encode(self, inputs: dict[str, np.ndarray], prefetch_scores: bool = False) -> dict[str, Any]:
        """The scene encoder; with ``prefetch_scores`` (and candidate shards), the discriminator's
        context graph runs at the same time on a shard thread (it needs nothing the encoder makes)."""
        context, encoder = None, self.sessions["scene_encoder"]
        if prefetch_scores and self._encoder_beside_context is not None:
            context = self._pool.submit(self._discriminator_context, inputs)
            encoder = self._encoder_beside_context
        outs = encoder.run(None, {k: inputs[k] for k in SCENE_INPUTS})
        scene = dict(zip(SCENE_OUTPUTS, outs))
        if context is not None:
            scene[_CONTEXT_KEY] = context
        return scene

    def scene_rows(self, scene: dict[str, Any], rows: list[int]) -> dict[str, Any]:
        # the prefetched discriminator context belongs to the whole batch: score_logits on the rows
        # computes theirs from their inputs
        return {key: value[rows] for key, value in scene.items() if key != _CONTEXT_KEY}

    def _discriminator_context(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {k: inputs[k] for k in DISCRIMINATOR_CONTEXT_INPUTS}
        outs = self.sessions["discriminator_context"].run(None, feed)
        return dict(zip(DISCRIMINATOR_CONTEXT_OUTPUTS, outs))

    def denoise(self, x_t: np.ndarray, t: np.ndarray, scene: dict[str, Any]) -> np.ndarray:
        return self._run("denoiser", denoiser_feed(x_t, t, scene))[0]

    def generate(self, x_init, scene, schedule: NoiseSchedule, spec: SamplerSpec, timings=None) -> np.ndarray:
        return generate_in_one_call(self, lambda feed: self._run("generator", feed)[0], x_init, scene,
                                    schedule, spec, timings)

    def extend_scene(self, scene: dict[str, Any], trace: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        if "correction_encoder" not in self.sessions:
            return super().extend_scene(scene, trace, mask)
        tokens, bias = self.sessions["correction_encoder"].run(None, correction_feed(scene, trace, mask))
        return {**scene, "scene_tokens": tokens, "scene_bias": bias}

    def score_logits(
        self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], scene: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        traj = np.ascontiguousarray(trajectories, dtype=np.float32)
        if self.split_discriminator:
            context = scene.get(_CONTEXT_KEY)
            context = context.result() if context is not None else self._discriminator_context(inputs)
            feed = {"trajectories": traj, "bev_tokens": scene["bev_tokens"], **context}
            logits, scores = self._run("discriminator_head", feed, list(DISCRIMINATOR_OUTPUTS))
            return logits, scores
        logits, scores = self._run("discriminator", discriminator_feed(traj, inputs, scene),
                                   list(DISCRIMINATOR_OUTPUTS))
        return logits, scores
