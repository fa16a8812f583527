"""Rollout collection in Ray actors: each worker holds its own simulator and policy copy.

A :class:`PolicySpec` is the picklable recipe of a decision maker (the learned ``rad2`` policy from a
checkpoint with its selection mode, or a reference policy by name). :class:`RolloutPool` starts
``num_workers`` actors — on a local Ray instance by default, or on an existing cluster when
``rollout.ray_address`` (params/training.yaml) names one — hands each the parameters the driver
loaded (a worker reads no file of params/, so every process of a run uses the same values), splits a
request into the same chunks of whole groups as :func:`bev_warp_sim.rollout.run_rollouts` and runs
them on the actors. Seeds are a
function of each decision's identity (:func:`~bev_warp_sim.rollout.decision_seed`), so the pool returns
exactly what the single-process engine returns for the same request. After each training step
:meth:`RolloutPool.set_weights` sends the new weights to every worker (one object-store copy).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bev_warp_sim.rollout import (
    BatchedPolicy,
    PerRowPlanners,
    Rollout,
    RolloutStats,
    chunk_rows,
    expand_rows,
    run_chunk,
)
from bev_warp_sim.simulator import Simulator


@dataclass(frozen=True)
class PolicySpec:
    """How a worker builds its decision maker.

    ``name``: ``rad2`` or a reference policy of ``bev_warp_sim.reference_policies.POLICIES``;
    ``selection``: ``deterministic`` | ``sample``; ``distribution``: overrides
    ``planner.selection_distribution`` (e.g. ``uniform`` for scenario curation); ``threads``: CPU threads
    of the worker's network runtime (workers × threads should not exceed the cores).
    """

    name: str = "rad2"
    checkpoint_dir: str | None = None
    backend: str | None = None
    selection: str = "deterministic"
    distribution: str | None = None
    record_discriminator_inputs: bool = False
    threads: int | None = None
    always_score: bool = False  # score with the discriminator even when it is untrained (benchmarks)
    # select by planner.fallback_selection even where the checkpoint's discriminator is trained (the
    # rule arms of rad2 eval experiments on an RL checkpoint)
    ignore_discriminator: bool = False
    planner_overrides: dict[str, Any] = field(default_factory=dict)  # planner.* keys
    # the networks alone: every rule stage after selection off (rad2_planner.stages.RULE_STAGE_BLOCKS),
    # to show what is learned beside what the rules add
    rule_stages_off: bool = False
    # runtime.* keys; a dict value updates that block's keys ({"openvino": {"precision": "bf16"}})
    runtime_overrides: dict[str, Any] = field(default_factory=dict)

    def planner_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` (every file of params/ as loaded, merged) with this spec's planner and runtime
        overrides (the blocks it changes are copies)."""
        from rad2_core.config import merge_runtime_overrides

        params = {**params, "planner": {**params["planner"], **self.planner_overrides},
                  "runtime": dict(params["runtime"])}
        if self.rule_stages_off:
            from rad2_planner.stages import RULE_STAGE_BLOCKS

            params.update({block: {**params[block], "enabled": False} for block in RULE_STAGE_BLOCKS})
        merge_runtime_overrides(params["runtime"], self.runtime_overrides)
        if self.threads is not None:
            params["runtime"]["ort_intra_op_threads"] = int(self.threads)
            # a worker shares the cores with the others: pinned threads of several workers would pile
            # onto the same cores
            params["runtime"]["openvino"] = dict(params["runtime"]["openvino"], threads=int(self.threads),
                                                 cpu_pinning=False)
        return params

    def build(self, params: dict[str, Any]):
        """The decision maker (in the calling process; ``params`` as for :meth:`planner_params`)."""
        from bev_warp_sim.reference_policies import make_policy

        if self.name != "rad2":
            return PerRowPlanners(lambda: make_policy(self.name, params))
        from rad2_planner.policy import Rad2Policy
        from rad2_planner.selection import CandidateDistribution

        if self.threads is not None:
            import torch

            torch.set_num_threads(int(self.threads))
        params = self.planner_params(params)
        kwargs: dict[str, Any] = {"always_score": self.always_score}
        if self.backend:
            kwargs["backend"] = self.backend
        policy = Rad2Policy.from_params(params, checkpoint_dir=self.checkpoint_dir, **kwargs)
        if self.ignore_discriminator:
            policy.model.discriminator_trained = False
        plan_kwargs = {}
        if self.distribution:  # the other selection_* settings (temperature, top-K) stay those of params/
            block = {**params["planner"], "selection_distribution": self.distribution}
            if self.distribution == "uniform":
                block["selection_top_k"] = "off"  # every candidate ties: nothing to truncate
            plan_kwargs["candidate_distribution"] = CandidateDistribution.from_params(block)
        return BatchedPolicy(policy, selection=self.selection,
                             record_discriminator_inputs=self.record_discriminator_inputs, **plan_kwargs)


class RolloutWorker:
    """One process's simulator + decision maker; the body of a Ray actor (usable directly too).
    ``params``: every file of params/ as the driver loaded it, merged."""

    def __init__(self, spec: PolicySpec, params: dict[str, Any]):
        self.spec = spec
        self.params = params
        self.sim = Simulator(params)
        self.decider = spec.build(params)
        self._onnx_dir = None

    def run_chunk(self, rows, kwargs: dict[str, Any]) -> tuple[list[Rollout], RolloutStats]:
        return run_chunk(self.sim, self.decider, rows, **kwargs)

    def set_weights(self, state_dict: dict[str, Any], discriminator_trained: bool | None = None) -> None:
        """Load new network weights (a ``PlannerModel.state_dict()`` of NumPy arrays or tensors)."""
        import torch
        from rad2_planner.runtime.base import make_backend

        policy = getattr(self.decider, "policy", None)
        if policy is None:
            raise ValueError(f"set_weights: policy {self.spec.name!r} has no weights")
        policy.model.load_state_dict({k: torch.as_tensor(v) for k, v in state_dict.items()})
        if discriminator_trained is not None:
            policy.model.discriminator_trained = bool(discriminator_trained)
        if policy.backend_name != "pytorch":
            # exported graphs must follow the weights; a private directory keeps the checkpoint's cache
            if self._onnx_dir is None:
                self._onnx_dir = tempfile.mkdtemp(prefix=f"rad2_worker_{os.getpid()}_onnx_")
            runtime = dict(self.spec.planner_params(self.params)["runtime"])
            policy.backend = make_backend(policy.backend_name, policy.model, runtime, onnx_dir=self._onnx_dir,
                                          sampler_spec=policy.sampler_spec)


class RolloutPool:
    """``num_workers`` Ray actors collecting rollouts (see the module docstring); ``params``: every file
    of params/ as loaded, merged (``rollout.*`` configures the pool, the rest goes to the workers)."""

    def __init__(self, spec: PolicySpec, params: dict[str, Any], num_workers: int | None = None,
                 address: str | None = None):
        import ray

        cfg = params["rollout"]
        self.num_workers = int(num_workers if num_workers is not None else cfg["num_workers"])
        if self.num_workers < 1:
            raise ValueError(f"rollout.num_workers: must be >= 1, got {self.num_workers}")
        address = cfg["ray_address"] if address is None else address
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            # workers inherit this process's environment (PYTHONPATH of the sourced workspace)
            env = {k: os.environ[k] for k in ("PYTHONPATH", "RAD2_PARAMS_DIR", "AMENT_PREFIX_PATH")
                   if k in os.environ}
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": env}, configure_logging=False)
        actor = ray.remote(num_cpus=float(cfg["cpus_per_worker"]))(RolloutWorker)
        params_ref = ray.put(params)  # one object-store copy for all workers
        self.actors = [actor.remote(spec, params_ref) for _ in range(self.num_workers)]

    def run(self, clips: Sequence[Any], group_size: int = 1, start_steps: int | Sequence[int] = 0, *,
            batch_size: int = 16, progress=None, **kwargs: Any) -> tuple[list[Rollout], RolloutStats]:
        """Same request and result as :func:`bev_warp_sim.rollout.run_rollouts`, on the workers."""
        chunks = chunk_rows(expand_rows(clips, group_size, start_steps), batch_size)
        results: dict[int, tuple[list[Rollout], RolloutStats]] = {}
        self.run_chunks(chunks, on_chunk=lambda i, rollouts, st: results.__setitem__(i, (rollouts, st)),
                        progress=progress, **kwargs)
        stats = RolloutStats()
        out: list[Rollout] = []
        for i in range(len(chunks)):
            out += results[i][0]
            stats.add(results[i][1])
        return out, stats

    def run_chunks(self, chunks: Sequence[Sequence[Any]], *, on_chunk, progress=None, **kwargs: Any) -> None:
        """Run chunks of rows (:func:`bev_warp_sim.rollout.chunk_rows`) on the workers;
        ``on_chunk(i, rollouts, stats)`` is called in this process as soon as chunk ``i`` is back (in
        completion order), so a caller can keep each finished chunk before the others end."""
        import ray

        queue = list(enumerate(chunks))
        pending: dict[Any, tuple[int, Any]] = {}

        def submit(actor) -> None:  # the next chunk goes to whichever worker is free (no straggler)
            if queue:
                i, chunk = queue.pop(0)
                pending[actor.run_chunk.remote(list(chunk), kwargs)] = (i, actor)

        for actor in self.actors:
            submit(actor)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i, actor = pending.pop(ref)
                rollouts, stats = ray.get(ref)
                submit(actor)
                on_chunk(i, rollouts, stats)
                if progress is not None:
                    progress(len(rollouts))

    def set_weights(self, state_dict: dict[str, Any], discriminator_trained: bool | None = None) -> None:
        import ray

        arrays = {k: v.detach().cpu().numpy() if hasattr(v, "detach") else v for k, v in state_dict.items()}
        ref = ray.put(arrays)
        ray.get([a.set_weights.remote(ref, discriminator_trained) for a in self.actors])

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
