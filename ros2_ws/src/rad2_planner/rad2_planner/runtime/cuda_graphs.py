"""CUDA graphs for the PyTorch backend: capture a network call once per input signature, replay it.

A planning cycle on a GPU is bound by kernel launches, not arithmetic: the fused sampler alone issues
several hundred small kernels for K = 4 steps, each costing microseconds of CPU-side launch work
while the GPU waits. A captured graph replays the whole sequence with one launch. Graphs need fixed
shapes and fixed memory: each distinct signature (shapes and dtypes of the inputs, e.g. one per M)
gets its own graph with static input buffers that every call copies into.

Why outputs are cloned: the outputs of a graph live in its private memory pool and the next replay
overwrites them; a caller (``plan_batch`` keeps a scene across calls) must not see them change.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable

import torch


def _signature(tensors: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


class CudaGraphCache:
    """``fn(*tensors) -> tensor | tuple[tensor, ...]`` replayed from one CUDA graph per signature.

    ``max_graphs`` bounds the graphs kept (least recently used evicted), since every graph holds its
    own memory pool. A capture that fails (an operator that cannot be captured, say) is reported once
    and the call runs eagerly from then on: a slower planner, never a dead one.
    """

    def __init__(self, fn: Callable, name: str, max_graphs: int = 16, warmup_calls: int = 2):
        if max_graphs < 1:
            raise ValueError(f"CudaGraphCache {name}: max_graphs must be >= 1, got {max_graphs}")
        self.fn = fn
        self.name = name
        self.max_graphs = max_graphs
        self.warmup_calls = warmup_calls
        self.graphs: OrderedDict[tuple, tuple] = OrderedDict()
        self.disabled_reason: str | None = None
        self.captures = 0
        self.replays = 0

    def _capture(self, args: tuple[torch.Tensor, ...]) -> tuple:
        static_in = tuple(a.clone() for a in args)
        # Warm-up on a side stream, as CUDA graph capture requires (lazy initialisation, autotuning).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_calls):
                self.fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*static_in)
        single = isinstance(out, torch.Tensor)
        static_out = (out,) if single else tuple(out)
        self.captures += 1
        return graph, static_in, static_out, single

    def __call__(self, *args: torch.Tensor):
        if self.disabled_reason is not None:
            return self.fn(*args)
        key = _signature(args)
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(args)
            except Exception as e:  # noqa: BLE001 - any capture failure means: run eagerly
                self.disabled_reason = f"{type(e).__name__}: {e}"
                warnings.warn(f"CUDA graph capture of {self.name} failed ({self.disabled_reason}); "
                              "running it eagerly", RuntimeWarning, stacklevel=2)
                torch.cuda.synchronize()
                return self.fn(*args)
            self.graphs[key] = entry
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        graph, static_in, static_out, single = entry
        for dst, src in zip(static_in, args):
            dst.copy_(src)
        graph.replay()
        self.replays += 1
        out = tuple(o.clone() for o in static_out)
        return out[0] if single else out
