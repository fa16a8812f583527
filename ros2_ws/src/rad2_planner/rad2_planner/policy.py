"""``Rad2Policy``: the RAD-2 generator–discriminator planner behind the :class:`Planner` protocol.

One planning cycle (identical for every runtime backend, see :mod:`rad2_planner.runtime`):

1. ``encode``: the scene encoder runs ONCE on the observation
   (:func:`rad2_planner.candidates.observation_inputs`) -> scene tokens.
2. ``denoise_<i>``, i < K: M candidates start from seeded Gaussian noise ``[1, M, T, 2]`` and are
   denoised in K steps by the sampler of :mod:`rad2_planner.diffusion` (DDIM or DPM-Solver++),
   batched over the M candidates; then de-normalised to ego-frame metres.
3. ``score``: the discriminator gives logits and scores = sigmoid(logits) for each candidate
   (skipped, both NaN, when no trained discriminator is loaded and the selection does not need them,
   unless ``always_score``). With ``planner.discriminator_prior_weight`` κ > 0 the logits the selection
   uses (and the result carries) are the discriminator's plus
   κ·:func:`~rad2_planner.candidates.consensus_prior` over the candidates it may choose; the scores stay
   the discriminator's own.
4. ``select``, by ``selection`` (``planner.selection_mode``):

   - ``deterministic`` (deployment): the highest logit (with ``planner.discriminator_candidates: safe``, among
     the safe set of ``safe_medoid`` only: :func:`~rad2_planner.candidates.safe_candidates`); without a
     trained discriminator the documented fallback rule ``planner.fallback_selection``: ``medoid`` (the
     candidate with the smallest mean distance to the others — the mode of the candidate set, robust to a
     stray sample), ``first``, or ``safe_medoid`` (the medoid of the candidates whose ego box does not
     overlap any observed agent extrapolated at constant velocity from the agent tokens; when all overlap,
     the candidates whose first overlap comes latest; with ``planner.selection_progress_quantile`` q > 0,
     only the safe candidates reaching at least the q-quantile of their progress along the route count;
     :func:`~rad2_planner.candidates.safe_medoid_index`).
   - ``sample`` (RL rollouts, scenario curation): a draw from the categorical distribution of
     :mod:`rad2_planner.selection` (``planner.selection_distribution``, temperature, top-K; restricted
     to the same safe set with ``discriminator_candidates: safe``); the result carries the draw's
     log-probability and the distribution's entropy.

5. The post-planning stages (:mod:`rad2_planner.stages`, one :class:`~rad2_planner.stages.StagePipeline`,
   each stage's time in ``timings_ms`` and what it did in ``info``):
   ``safety_layer`` (the collision critic, ``safety_layer.mode``, off by default; deterministic
   selection only: :mod:`rad2_planner.safety_layer`), ``stall_recovery``, ``plan_braking`` (the plan's
   own braking held to ``comfort_limits.max_plan_decel``), ``traffic_rules`` (stop for a red signal),
   ``safety_envelope`` (room to stop behind every agent in the path), ``comfort_limits`` and
   ``drivable_area``. Each re-times the executed plan along its own path.

Determinism: cycle ``i`` after ``reset(seed=s)`` draws its noise from ``default_rng(s + i)`` (one
draw for the whole batch); an explicit ``plan(obs, seed=...)`` overrides it. ``plan_batch(...,
seeds=[...])`` gives every row its own seed instead: row ``r`` draws its noise from
``default_rng(seeds[r])`` alone, so its result does not depend on which rows share the batch. A
sampled selection uses an independent stream of the same seed, ``default_rng([seed, 1])``, and round
``r`` of rejection sampling another, ``default_rng([seed, 2, r])``.

Plan-to-plan consistency (``planner.initial_noise``): ``per_cycle`` draws new initial noise every cycle
as above; ``per_episode`` starts every cycle of an episode from the same noise (``default_rng(s)``
after ``reset(seed=s)``; per row, ``plan_batch(noise_seeds=[...])``), so consecutive plans differ only
as much as the scene does. The denoiser is a smooth function of the scene, so the candidate set and the
selected candidate drift instead of jumping between modes every cycle; selection sampling keeps its
per-cycle stream.
Timings (ms) are reported per stage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.bev import get_config as get_bev_config
from rad2_core.config import load_schema, require, resource_path, validate_value
from rad2_core.observation import ObservationError
from rad2_core.planning_interface import PlanResult
from rad2_core.route_path import observation_route

from rad2_planner.candidates import (
    consensus_prior,
    medoid_index,
    observation_inputs,
    safe_candidates,
    safe_medoid_index,
)
from rad2_planner.comfort_limits import ComfortLimitParams
from rad2_planner.diffusion import NoiseSchedule, SamplerSpec, initial_noise
from rad2_planner.drivable_area import DrivableAreaParams, candidate_exit_times
from rad2_planner.mission_pace import MissionPaceParams, mission_speed_fault
from rad2_planner.runtime.base import DISCRIMINATOR_INPUTS, SCENE_INPUTS, make_backend
from rad2_planner.safety_envelope import SafetyEnvelopeParams
from rad2_planner.safety_layer import CriticStage, SafetyLayerParams
from rad2_planner.selection import CandidateDistribution
from rad2_planner.selection import sample as sample_candidate
from rad2_planner.stages import (
    ComfortLimitStage,
    CycleContext,
    CyclePlans,
    DrivableAreaStage,
    MissionPaceStage,
    PlanBrakingStage,
    SafetyEnvelopeStage,
    StagePipeline,
    StallRecoveryStage,
    TrafficRuleStage,
    drivable_channel,
)
from rad2_planner.stall_recovery import StallRecoveryParams
from rad2_planner.traffic_rules import TrafficRuleParams

# What this module implements of planner.fallback_selection, planner.discriminator_candidates (the
# candidates the discriminator ranks and samples from: all, or the safe set of safe_medoid),
# planner.selection_mode and planner.initial_noise: the branches of the code. The schema lists the values
# a file or an override may take, and the constructor checks its settings against it;
# tests/unit/test_config_boundaries.py holds these tuples to it.
FALLBACK_RULES = ("medoid", "first", "safe_medoid")
DISCRIMINATOR_CANDIDATES = ("all", "safe")
SELECTION_MODES = ("deterministic", "sample")
INITIAL_NOISE_MODES = ("per_cycle", "per_episode")
# Discriminator inputs recorded per row for the RL update (the trajectories are the candidates).
RECORDED_DISCRIMINATOR_INPUTS = DISCRIMINATOR_INPUTS[1:]
# Recorded beside them when planner.discriminator_prior_weight > 0: the κ·prior [M] the cycle added to the
# logits, so that the RL update recomputes the same distribution (rad2_training.tc_grpo).
SELECTION_PRIOR = "selection_prior"


def resolve_path(p: str | Path) -> Path:
    """Relative paths in params are relative to the repository root: the checkout's, else the installed
    package share's (``config.resource_path``); where the checkout's would be when neither has it (for
    outputs and caches; inputs use ``resource_path``, whose error names both places)."""
    return resource_path(p, required=False)


class Rad2Policy:
    """RAD-2 planner. Build with :meth:`from_params` (loads the checkpoint ``params`` names) or directly.

    ``params``: params/planner.yaml, vehicle.yaml and bev.yaml as the entry point loaded them, merged
    (:func:`rad2_core.config.merged`): the planner's settings, the ego box and its tightest turn, and
    the BEV channels the observations carry. A params dict without a key of the current files (one
    written for an older planner.yaml) is a ParameterError naming the key. The settings it runs with
    (the file's, or an argument's that overrides one) are held to params/planner.schema.yaml: a dict
    built in code (an experiment arm, a test) is checked as a loaded file is.
    """

    name = "rad2"

    def __init__(
        self,
        model,
        params: dict[str, Any],
        backend: str | None = None,
        num_candidates: int | None = None,
        num_steps: int | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        device: str | None = None,
        onnx_dir: str | Path | None = None,
        fallback_selection: str | None = None,
        always_score: bool = False,
        selection: str | None = None,
        candidate_distribution: CandidateDistribution | None = None,
        vehicle_params: dict[str, Any] | None = None,
        safety_layer: SafetyLayerParams | None = None,
        critic=None,
    ):
        """``safety_layer`` overrides ``safety_layer.*`` of ``params``; ``critic`` gives the layer an
        in-memory :class:`~rad2_planner.networks.critic.CollisionCritic` instead of loading
        ``critic_checkpoint``."""
        from rad2_core.bicycle import VehicleParams, slip_and_curvature

        p = require(params, "planner", "planner.yaml")
        for block in ("traffic_rules", "comfort_limits", "safety_envelope", "stall_recovery", "mission_pace",
                      "safety_layer", "drivable_area"):
            require(params, block, "planner.yaml")
        # the ego box and its tightest turn for safe_medoid come from vehicle.yaml (``vehicle_params``:
        # that file when ``params`` holds no vehicle block)
        vehicle = VehicleParams.from_params(vehicle_params if vehicle_params is not None
                                            else require(params, "vehicle", "vehicle.yaml"))
        self.ego_size = (vehicle.length, vehicle.width)
        self.max_speed = float(vehicle.max_speed)  # a mission speed above it is refused
        self.max_curvature = float(slip_and_curvature(vehicle.max_steer, vehicle)[1])
        require(params, "bev", "bev.yaml")
        self.bev_cfg = get_bev_config(params)  # the observations' grid and channels
        self.observation_channels = self.bev_cfg.channels
        stage_params = (TrafficRuleParams.from_params(params), ComfortLimitParams.from_params(params),
                        SafetyEnvelopeParams.from_params(params), StallRecoveryParams.from_params(params))
        rules, comfort, envelope, recovery = stage_params
        self.params = params
        self.model = model
        self.cfg = model.cfg
        self.normalizer = model.normalizer
        self.backend_name = backend or p["backend"]
        # M and K may also change per call (RL, benchmarks): _count checks each call's against the schema
        self._schema = load_schema("planner")
        self.num_candidates = self._count("planner.num_candidates", num_candidates, p["num_candidates"])
        self.num_steps = self._count("planner.num_denoise_steps", num_steps, p["num_denoise_steps"])
        self.sampler = sampler or p["sampler"]
        self.base_seed = int(p["seed"] if seed is None else seed)
        self.initial_noise = str(require(p, "initial_noise", "planner.yaml", block="planner"))
        self.fallback = fallback_selection or p["fallback_selection"]
        quantile = require(p, "selection_progress_quantile", "planner.yaml", block="planner")
        self.discriminator_candidates = str(require(p, "discriminator_candidates", "planner.yaml",
                                                    block="planner"))
        weight = require(p, "discriminator_prior_weight", "planner.yaml", block="planner")
        self.selection = selection or require(params, "planner.selection_mode")
        for dotted, value in (("planner.sampler", self.sampler),
                              ("planner.initial_noise", self.initial_noise),
                              ("planner.fallback_selection", self.fallback),
                              ("planner.selection_progress_quantile", quantile),
                              ("planner.discriminator_candidates", self.discriminator_candidates),
                              ("planner.discriminator_prior_weight", weight),
                              ("planner.selection_mode", self.selection)):
            validate_value(self._schema, dotted, value, "Rad2Policy")
        self.progress_quantile = float(quantile)
        self.selection_drivable = bool(require(p, "selection_drivable", "planner.yaml", block="planner"))
        self.prior_weight = float(weight)
        self.always_score = always_score
        self.distribution = candidate_distribution or CandidateDistribution.from_params(p)
        self.plan_dt = float(p["plan_dt"])
        # how often per plan interval the collision checks place the agents (safe set, stages)
        step = float(require(p, "collision_time_step_s", "planner.yaml", block="planner"))
        if not np.isfinite(step) or step <= 0.0:
            raise ValueError(f"planner.collision_time_step_s: must be a positive number of seconds, "
                             f"got {step!r}")
        self.collision_substeps = max(1, int(np.ceil(self.plan_dt / step - 1e-9)))
        d = require(params, "diffusion")
        if int(d["num_train_steps"]) != self.cfg.num_train_steps:  # the file against the checkpoint
            raise ValueError(
                f"diffusion.num_train_steps={d['num_train_steps']} differs from the checkpoint's "
                f"{self.cfg.num_train_steps}"
            )
        self.schedule = NoiseSchedule(self.cfg.num_train_steps, d["schedule"])
        self.x0_clip = float(d["x0_clip"])
        self.sampler_spec = SamplerSpec(self.num_steps, self.sampler, self.x0_clip)
        runtime = dict(require(params, "runtime"))
        # explicit > beside the loaded checkpoint > runtime.onnx_dir (models built in memory)
        runtime["onnx_dir"] = str(resolve_path(onnx_dir or getattr(model, "export_dir", None)
                                               or runtime["onnx_dir"]))
        self.onnx_dir = runtime["onnx_dir"]
        runtime["tensorrt"] = dict(runtime["tensorrt"])
        runtime["tensorrt"]["engine_cache_dir"] = str(resolve_path(runtime["tensorrt"]["engine_cache_dir"]))
        self.backend = make_backend(
            self.backend_name, model, runtime, device=device or p["device"], sampler_spec=self.sampler_spec
        )
        self._cycle = 0
        self.device = device or p["device"]
        self.budget_stop_count = 0  # rows whose rejection sampling the time budget stopped (safety layer)
        self.critic_stage = CriticStage(self, critic)
        drivable = DrivableAreaParams.from_params(params)
        self._drivable = drivable  # the safe set's drivable-area preference reads its horizon and threshold
        self._channel_names = self.cfg.input_channel_names(self.bev_cfg.channels)
        self.pipeline = StagePipeline((
            self.critic_stage,
            StallRecoveryStage(recovery, self.plan_dt, vehicle, self.bev_cfg,
                               self.cfg.input_channel_names(self.bev_cfg.channels), self.ego_size,
                               self.max_curvature, drivable, self.collision_substeps),
            MissionPaceStage(MissionPaceParams.from_params(params), self.plan_dt, self.bev_cfg,
                             self.cfg.input_channel_names(self.bev_cfg.channels), self.ego_size,
                             self.max_curvature, drivable, self.collision_substeps),
            PlanBrakingStage(comfort, self.plan_dt, self.ego_size, self.max_curvature,
                             self.collision_substeps),
            TrafficRuleStage(rules, self.plan_dt, vehicle.length),
            # braking up to the vehicle's emergency limit where the envelope needs it
            SafetyEnvelopeStage(envelope, self.plan_dt, self.ego_size, -float(vehicle.min_accel),
                                float(vehicle.max_speed), self.collision_substeps),
            ComfortLimitStage(comfort, self.plan_dt),
            DrivableAreaStage(drivable, self.plan_dt, self.ego_size, self.bev_cfg,
                              self.cfg.input_channel_names(self.bev_cfg.channels), self.max_curvature),
        ))
        self.set_safety_layer(safety_layer or SafetyLayerParams.from_params(params))

    @property
    def safety(self) -> SafetyLayerParams:
        """The safety layer's settings (``safety_layer.*``, or what :meth:`set_safety_layer` set)."""
        return self.critic_stage.params

    def set_safety_layer(self, safety: SafetyLayerParams) -> None:
        """Switch the safety layer (loads the critic on first use: a missing checkpoint fails here, not
        in a planning cycle)."""
        self.critic_stage.configure(safety)

    @classmethod
    def from_params(
        cls, params: dict[str, Any], checkpoint_dir: str | Path | None = None, **kwargs
    ) -> Rad2Policy:
        """Load the checkpoint named by ``planner.checkpoint_dir`` (and the optional discriminator);
        ``params`` as for the constructor."""
        from rad2_planner.networks import PlannerModel

        p = require(params, "planner", "planner.yaml")
        ckpt = resource_path(checkpoint_dir or p["checkpoint_dir"])
        disc = require(p, "discriminator_checkpoint", "planner.yaml", block="planner") or None
        model = PlannerModel.load(ckpt, resource_path(disc) if disc else None)
        return cls(model, params=params, **kwargs)

    @property
    def has_discriminator(self) -> bool:
        return bool(self.model.discriminator_trained)

    def _count(self, dotted: str, value: Any, default: int) -> int:
        """M or K of a call (None: ``default``) within the bounds of params/planner.schema.yaml;
        ``ParameterError`` naming the parameter and the value otherwise (0 is refused, not defaulted)."""
        n = default if value is None else value
        if isinstance(n, np.integer):
            n = int(n)
        validate_value(self._schema, dotted, n, "Rad2Policy")
        return n

    def warm_up(self, num_candidates: int | None = None) -> float:
        """Run the cycle's network calls once on random inputs of the cycle's shapes (one scene, M
        candidates), so that the first real cycle does not pay for opening the runtime's sessions
        (``runtime.ort_fixed_shapes`` opens one per shape) and sizing its memory. Nothing the policy
        keeps between cycles changes. Returns the seconds it took."""
        from rad2_planner.runtime.onnx_export import example_inputs

        t0 = time.perf_counter()
        m = self._count("planner.num_candidates", num_candidates, self.num_candidates)
        ex = example_inputs(self.cfg, batch=1, m=m)
        inputs = {k: ex[k] for k in SCENE_INPUTS}
        scored = self.has_discriminator
        scene = self.backend.encode(inputs, prefetch_scores=scored)
        self.backend.generate(ex["x_t"], scene, self.schedule, self.sampler_spec)
        if scored:
            self.backend.score_logits(ex["trajectories"], inputs, scene)
        return time.perf_counter() - t0

    def reset(self, clip: Any | None = None, start_step: int = 0, seed: int | None = None) -> None:
        if seed is not None:
            self.base_seed = int(seed)
        self._cycle = 0

    def plan(
        self,
        observation: Any,
        seed: int | None = None,
        num_candidates: int | None = None,
        num_steps: int | None = None,
        **options: Any,
    ) -> PlanResult:
        """One planning cycle on one observation (unbatched or batch of 1); ``options`` as in
        :meth:`plan_batch` (``selection``, ``candidate_distribution``, ``return_discriminator_inputs``)."""
        results = self.plan_batch(
            observation, seed=seed, num_candidates=num_candidates, num_steps=num_steps, **options
        )
        if len(results) != 1:
            raise ObservationError(
                f"plan() takes one observation, got a batch of {len(results)}; use plan_batch"
            )
        return results[0]

    def plan_batch(
        self,
        observation: Any,
        seed: int | None = None,
        num_candidates: int | None = None,
        num_steps: int | None = None,
        *,
        seeds: Sequence[int] | None = None,
        noise_seeds: Sequence[int] | None = None,
        selection: str | None = None,
        candidate_distribution: CandidateDistribution | None = None,
        return_discriminator_inputs: bool = False,
        target_speeds: Sequence[float] | None = None,
    ) -> list[PlanResult]:
        """Plan for a batch of observations in one pass (B scenes × M candidates).

        ``seeds``: one per row (instead of ``seed``), see the module doc. ``noise_seeds``: one per row,
        each row's episode seed; with ``planner.initial_noise: per_episode`` the initial noise comes
        from it instead of from ``seeds`` (ignored per cycle). ``selection`` and
        ``candidate_distribution`` override the policy's (``planner.selection_*``) for this call.
        ``return_discriminator_inputs``: attach to each result what the discriminator consumed.
        ``target_speeds``: one per row, the speed (m/s) its mission asks for (NaN: none; the mission
        pace stage, :mod:`rad2_planner.mission_pace`).
        """
        t_start = time.perf_counter()
        m = self._count("planner.num_candidates", num_candidates, self.num_candidates)
        k = self._count("planner.num_denoise_steps", num_steps, self.num_steps)
        mode = _check_mode(selection or self.selection)
        dist = candidate_distribution or self.distribution
        scored = self._needs_scores(mode, dist)  # before any network call: a bad request fails fast
        timings: dict[str, float] = {}
        inputs = observation_inputs(observation, self.cfg, self.observation_channels)
        b = inputs["bev"].shape[0]
        row_seeds = None if seeds is None else _row_seeds(seeds, b, seed)
        explicit_seed = seed is not None
        if seed is None and row_seeds is None:
            seed = self.base_seed + self._cycle
        self._cycle += 1
        noise_rows = row_seeds
        noise_seed = seed
        if self.initial_noise == "per_episode":
            if noise_seeds is not None:
                noise_rows = _row_seeds(noise_seeds, b, None, "noise_seeds")
            elif row_seeds is None and not explicit_seed:
                noise_seed = self.base_seed

        t0 = time.perf_counter()
        scene = self.backend.encode({key: inputs[key] for key in SCENE_INPUTS}, prefetch_scores=scored)
        timings["encode"] = (time.perf_counter() - t0) * 1e3

        t0 = time.perf_counter()
        if noise_rows is None:
            x_init = initial_noise(b, m, self.cfg.plan_points, noise_seed)
        else:
            x_init = np.concatenate([initial_noise(1, m, self.cfg.plan_points, s) for s in noise_rows])
        candidates = self.denoise(x_init, scene, inputs, k, timings)
        timings["denoise_total"] = (time.perf_counter() - t0) * 1e3

        t0 = time.perf_counter()
        if scored:
            logits, scores = (
                np.asarray(a, dtype=np.float32) for a in self.backend.score_logits(candidates, inputs, scene)
            )
        else:
            logits, scores = np.full((2, b, m), np.nan, dtype=np.float32)
        timings["score"] = (time.perf_counter() - t0) * 1e3

        t0 = time.perf_counter()
        # the logits decide only in a draw or for a trained discriminator (else the fallback rule does)
        by_logits = scored and (mode == "sample" or self.has_discriminator)
        mask = self.discriminator_mask(candidates, inputs) if by_logits else None
        prior = self.selection_prior(candidates, mask) if by_logits else None
        if prior is not None:
            logits = logits + prior
        if mode == "sample":
            rngs = [np.random.default_rng([s, 1]) for s in (row_seeds or [seed])]
            draw = self._sample(logits, dist, rngs, mask)
            selected, rule = [int(i) for i in draw.index], f"sample:{dist.label}"
        else:
            draw = None
            selected, rule = self.select_deterministic(candidates, logits, inputs, mask)
        timings["select"] = (time.perf_counter() - t0) * 1e3
        context = CycleContext(inputs, timings, signal_stop=getattr(observation, "signal_stop", None),
                               selection=mode, scene=scene, num_steps=k, scored=scored, seed=seed,
                               row_seeds=row_seeds, t_start=t_start,
                               target_speeds=_target_speeds(target_speeds, b, self.max_speed))
        plans = self.pipeline.run(CyclePlans.of(candidates, selected, scores, logits), context)
        self.budget_stop_count += sum(bool(i.get("safety_stopped_by_budget", False)) for i in plans.info)
        recorded = self._recorded_inputs(inputs, scene) if return_discriminator_inputs else [None] * b
        if prior is not None and return_discriminator_inputs:
            for i, row in enumerate(recorded):
                row[SELECTION_PRIOR] = prior[i].astype(np.float32)
        timings["total"] = (time.perf_counter() - t_start) * 1e3
        info = {"backend": self.backend_name, "sampler": self.sampler, "M": m, "K": k, "selection": rule}
        return [
            PlanResult(
                candidates=plans.candidates[i],
                scores=plans.scores[i],
                selected=plans.selected[i],
                plan_dt=self.plan_dt,
                timings_ms=dict(timings),
                info={**info, "seed": int(seed if row_seeds is None else row_seeds[i]), **plans.info[i]},
                executed=plans.executed[i],
                logits=plans.logits[i],
                log_prob=float("nan") if draw is None else float(draw.log_prob[i]),
                entropy=float("nan") if draw is None else float(draw.entropy[i]),
                probs=None if draw is None else draw.probs[i],
                discriminator_inputs=recorded[i],
            )
            for i in range(b)
        ]

    def denoise(
        self, x_init: np.ndarray, scene: Any, inputs: dict[str, np.ndarray], k: int, timings: dict,
        backend=None,
    ) -> np.ndarray:
        """K sampler steps from ``x_init [B, M, T, 2]`` -> candidates in ego-frame metres (float32);
        ``backend``: another generator's (the self-correcting one) instead of the planner's."""
        spec = self.sampler_spec if k == self.num_steps else self.sampler_spec._replace(num_steps=k)
        z = (backend or self.backend).generate(x_init, scene, self.schedule, spec, timings)
        speed = inputs["ego_state"][:, 0][:, None]  # B 1
        return np.asarray(self.normalizer.denormalize(z, speed), dtype=np.float32)  # B M T 2

    def select_among(self, i: int, allowed: np.ndarray, candidates: np.ndarray, logits: np.ndarray,
                     inputs: dict[str, np.ndarray]) -> int:
        """The deterministic selection rule of row ``i`` restricted to the candidates ``allowed`` (the safety
        layer's candidate selection)."""
        if self.has_discriminator:
            mask = self.discriminator_mask(candidates[i:i + 1], {k: v[i:i + 1] for k, v in inputs.items()})
            both = allowed if mask is None else allowed[mask[0, allowed]]
            both = both if len(both) else allowed  # the critic's choice outranks the overlap check
            return int(both[np.argmax(logits[i, both])])
        sub = candidates[i, allowed]
        if self.fallback == "medoid":
            return int(allowed[medoid_index(sub)])
        if self.fallback == "safe_medoid":
            return int(allowed[self._safe_medoid(sub, inputs, i)])
        return int(allowed[0])

    def _needs_scores(self, mode: str, dist: CandidateDistribution) -> bool:
        """Whether this cycle runs the discriminator; a sampled draw from meaningless logits is an error."""
        if mode == "sample" and dist.needs_logits and not (self.has_discriminator or self.always_score):
            raise ValueError(
                f"selection 'sample' with distribution {dist.kind!r} needs a trained discriminator, but "
                "the loaded one is untrained (its logits mean nothing): sample with distribution "
                "'uniform', load an RL-trained discriminator, or force it with always_score=True"
            )
        if mode == "sample" and dist.needs_logits:
            return True
        return self.has_discriminator or self.always_score

    @staticmethod
    def _sample(logits: np.ndarray, dist: CandidateDistribution, rngs: list[np.random.Generator],
                allowed: np.ndarray | None = None):
        """One draw per row: with one generator per row each row uses its own; with a single generator
        for the batch the rows are drawn together from it. ``allowed [B, M]``: the candidates the draw
        may pick (None: all)."""
        if len(rngs) == 1:
            return sample_candidate(logits, rngs[0], dist, allowed=allowed)
        rows = [None] * len(logits) if allowed is None else allowed
        draws = [sample_candidate(row, rng, dist, allowed=a) for row, rng, a in zip(logits, rngs, rows)]
        return type(draws[0])(*(np.stack(field) for field in zip(*draws)))

    def select_deterministic(
        self, candidates: np.ndarray, logits: np.ndarray, inputs: dict[str, np.ndarray],
        mask: np.ndarray | None = None,
    ) -> tuple[list[int], str]:
        """``mask``: :meth:`discriminator_mask` when the caller has it already (None: computed here)."""
        b = candidates.shape[0]
        if self.has_discriminator:
            # Logits, not scores: a float32 sigmoid saturates to exact ties at 1.
            if mask is None:
                mask = self.discriminator_mask(candidates, inputs)
            if mask is not None:
                return [int(np.argmax(np.where(mask[i], logits[i], -np.inf))) for i in range(b)], \
                    "discriminator:safe"
            return [int(np.argmax(logits[i])) for i in range(b)], "discriminator"
        if self.fallback == "medoid":
            return [medoid_index(candidates[i]) for i in range(b)], "medoid"
        if self.fallback == "safe_medoid":
            return [self._safe_medoid(candidates[i], inputs, i) for i in range(b)], "safe_medoid"
        return [0] * b, "first"

    def selection_prior(self, candidates: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
        """``[B, M]`` κ·:func:`consensus_prior` added to the discriminator's logits before the draw or the
        argmax (float32), or None with ``planner.discriminator_prior_weight`` 0."""
        if self.prior_weight == 0.0:
            return None
        rows = [consensus_prior(c, None if mask is None else mask[i]) for i, c in enumerate(candidates)]
        return (self.prior_weight * np.stack(rows)).astype(np.float32)

    def discriminator_mask(self, candidates: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """``[B, M]`` the candidates the discriminator chooses among (``safe_candidates`` per row), or
        None when it chooses among all (``planner.discriminator_candidates: all``)."""
        if self.discriminator_candidates == "all":
            return None
        mask = np.zeros(candidates.shape[:2], dtype=bool)
        for i in range(candidates.shape[0]):
            mask[i, safe_candidates(candidates[i], inputs["agents"][i], inputs["agents_mask"][i],
                                    self.plan_dt, self.ego_size, self.max_curvature,
                                    self._exit_times(candidates[i], inputs, i),
                                    self.collision_substeps)] = True
        return mask

    def _exit_times(self, candidates: np.ndarray, inputs: dict[str, np.ndarray], i: int) -> np.ndarray | None:
        """[M'] when each of row ``i``'s candidates leaves the BEV's drivable area (inf: never) where the
        safe set prefers those that stay on it (``planner.selection_drivable``), else None."""
        if not self.selection_drivable or "bev" not in inputs:  # no raster, no road to judge by
            return None
        channel = drivable_channel(inputs["bev"], self._channel_names, self.bev_cfg)
        if channel is None:
            return None
        return candidate_exit_times(candidates, self.plan_dt, self.ego_size, inputs["bev"][i, channel],
                                    self.bev_cfg, self._drivable, max_curvature=self.max_curvature)

    def _safe_medoid(self, candidates: np.ndarray, inputs: dict[str, np.ndarray], i: int) -> int:
        """:func:`safe_medoid_index` of row ``i``'s candidates ``[M', T, 2]`` with this policy's settings."""
        route = None
        # where the route ends within the route tokens' look-ahead (the end of the mission, or of the
        # mapped road the expert stops at) nothing is gained by hurrying: the plain safe medoid
        if self.progress_quantile > 0.0 and inputs["route_mask"][i].all():
            route = observation_route(inputs["route"][i], inputs["route_mask"][i])
        return safe_medoid_index(candidates, inputs["agents"][i], inputs["agents_mask"][i], self.plan_dt,
                                 self.ego_size, self.max_curvature, route, self.progress_quantile,
                                 self._exit_times(candidates, inputs, i), self.collision_substeps)

    def _recorded_inputs(self, inputs: dict[str, np.ndarray], scene: dict[str, Any]) -> list[dict]:
        """Per row, the discriminator's inputs besides the trajectories (copies, float32 / bool)."""
        bev_tokens = np.asarray(self.backend.scene_outputs(scene)["bev_tokens"], dtype=np.float32)
        rows = []
        for i in range(bev_tokens.shape[0]):
            row = {name: inputs[name][i].copy() for name in RECORDED_DISCRIMINATOR_INPUTS[:-1]}
            row["bev_tokens"] = bev_tokens[i].copy()
            rows.append(row)
        return rows


def stack_discriminator_inputs(results: Sequence[PlanResult]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(candidates [B, M, T, 2], batched discriminator inputs)`` from results planned with
    ``return_discriminator_inputs=True``: what ``PlannerModel.discriminator_logits`` takes."""
    for i, r in enumerate(results):
        if r.discriminator_inputs is None:
            raise ValueError(
                f"results[{i}].discriminator_inputs is None: plan with return_discriminator_inputs=True"
            )
    candidates = np.stack([r.candidates for r in results])
    batched = {
        k: np.stack([r.discriminator_inputs[k] for r in results]) for k in RECORDED_DISCRIMINATOR_INPUTS
    }
    return candidates, batched


def _target_speeds(speeds: Sequence[float] | None, batch: int,
                   max_speed: float = float("inf")) -> np.ndarray | None:
    """``plan_batch``'s ``target_speeds`` as a [B] array (None: no row has a mission speed); a wrong
    count, or a speed that is negative, infinite or above ``max_speed``, is a ValueError naming it (NaN:
    no mission speed)."""
    if speeds is None:
        return None
    out = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if len(out) != batch:
        raise ValueError(f"target_speeds: {len(out)} values for {batch} rows")
    for value in out:
        why = mission_speed_fault(value, max_speed)
        if why:
            raise ValueError(f"target_speeds: {why}")
    return out


def _check_mode(mode: str) -> str:
    if mode not in SELECTION_MODES:
        raise ValueError(f"planner.selection_mode: unknown value {mode!r} (choose from {SELECTION_MODES})")
    return mode


def _row_seeds(seeds: Sequence[int], batch: int, seed: int | None, name: str = "seeds") -> list[int]:
    """Validate ``plan_batch(seeds=...)`` (or ``noise_seeds``): one non-negative integer per observation."""
    if seed is not None:
        raise ValueError(f"plan_batch: give seed ({seed}) or {name}, not both")
    seeds = list(seeds)
    if len(seeds) != batch:
        raise ValueError(f"{name}: {len(seeds)} given for a batch of {batch} observations")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"{name}: {s!r} is not a non-negative integer")
    return [int(s) for s in seeds]
