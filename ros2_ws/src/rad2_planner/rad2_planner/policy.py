"""``Rad2Policy``: the RAD-2 generator–discriminator planner behind the :class:`Planner` protocol.

One planning cycle (identical for every runtime backend, see :mod:`rad2_planner.runtime`):

1. ``encode``: the scene encoder runs ONCE on the observation -> scene tokens.
2. ``denoise_<i>``, i < K: M candidates start from seeded Gaussian noise ``[1, M, T, 2]`` and are
   denoised in K steps by the sampler of :mod:`rad2_planner.diffusion` (DDIM or DPM-Solver++),
   batched over the M candidates; then de-normalised to ego-frame metres.
3. ``score``: the discriminator gives logits and scores = sigmoid(logits) for each candidate
   (skipped, both NaN, when no trained discriminator is loaded and the selection does not need them,
   unless ``always_score``). With ``planner.discriminator_prior_weight`` κ > 0 the logits the selection
   uses (and the result carries) are the discriminator's plus κ·:func:`consensus_prior` over the
   candidates it may choose; the scores stay the discriminator's own.
4. ``select``, by ``selection`` (``planner.selection_mode``):

   - ``deterministic`` (deployment): the highest logit (with ``planner.discriminator_candidates: safe``, among
     the safe set of ``safe_medoid`` only: ``safe_candidates``); without a trained discriminator the
     documented fallback rule ``planner.fallback_selection``: ``medoid`` (the candidate with the smallest mean
     distance to the others — the mode of the candidate set, robust to a stray sample), ``first``, or
     ``safe_medoid`` (the medoid of the candidates whose ego box does not overlap any observed agent
     extrapolated at constant velocity from the agent tokens; when all overlap, the candidates whose first
     overlap comes latest; with ``planner.selection_progress_quantile`` q > 0, only the safe candidates
     reaching at least the q-quantile of their progress along the route count).
   - ``sample`` (RL rollouts, scenario curation): a draw from the categorical distribution of
     :mod:`rad2_planner.selection` (``planner.selection_distribution``, temperature, top-K; restricted
     to the same safe set with ``discriminator_candidates: safe``); the result carries the draw's
     log-probability and the distribution's entropy.

5. ``safety`` (``safety_layer.mode``, off by default; deterministic selection only): a learned
   collision critic (:mod:`rad2_planner.networks.critic`) predicts for candidates the probability of a
   collision within its horizon; ``threshold`` splits accepted (p < threshold) from rejected ones.

   - ``candidate_selection``: the critic scores all M candidates; the selection rule above picks among
     the accepted ones (discriminator argmax, or the fallback rule on that subset); when none is
     accepted, the least risky candidate is executed.
   - ``rejection_sampling``: the critic judges the selected candidate only; while it is rejected, a
     new set of M is drawn from the unchanged generator (fresh noise, the same scene encoding) and
     selected from as before, at most ``max_rounds`` times; the least risky selected candidate seen is
     executed when none was accepted. Deadline-aware: a round starts only if the time spent since the
     cycle began (the start of ``plan_batch``) plus the estimated cost of one round fits within
     ``round_budget_ms`` (:func:`next_round_fits`; the estimate is the costliest extra round of this
     cycle so far, before the first one the cost of the first pass: generator, discriminator, selection
     and critic). When the budget stops the rounds, the least risky selected candidate seen is executed
     and ``info["safety_stopped_by_budget"]`` is True (``budget_stop_count`` counts such rows).
     ``round_budget_ms=None`` (the dataclass default, not the file's) disables the check, so results
     do not depend on the machine's speed (tests, batched closed-loop evaluation).

   ``info["corrections"]``: resampling rounds (rejection sampling) or 1 when the critic changed the
   selection (candidate selection); ``info["critic_p"]``: the executed candidate's predicted risk;
   ``info["critic_accepted"]``: whether it is below the threshold; ``timings_ms["critic"]`` the
   critic's time, ``timings_ms["corrections"]`` that of the extra rounds (without their critic calls).
   A sampled selection (RL rollouts) skips the layer: its log-probability must describe the draw that
   was executed.
6. ``stall_recovery`` (:mod:`rad2_planner.stall_recovery`): below ``start_speed`` a selected
   candidate that holds its speed and accelerates later is re-timed along its path to accelerate
   evenly from now (replanned every cycle, it would never get going, or lag behind after a corner); a
   candidate that asks for reversing (the vehicle has none) is replaced by the route followed forwards
   within the vehicle's limits, when that stays on the BEV's drivable area; ``info["stall_recovery"]``
   says which. On by default (``stall_recovery.enabled``).
7. ``traffic_rules``: the executed plan re-timed to stop for a red signal (after the safety stage).
8. ``safety_envelope``: the executed plan re-timed along its path so that at every point the ego could
   still stop behind every agent in its path (constant-velocity prediction) if that agent braked hard,
   braking up to the vehicle's emergency limit where needed (:mod:`rad2_planner.safety_envelope`);
   ``info["safety_envelope"]`` says why when it changed the plan.
9. ``comfort_limits``: the executed plan re-timed along its path so that its speed keeps
   ``comfort_limits.max_lateral_accel`` in curves (0, the default: no lateral limit) and it accelerates
   from the ego's speed within ``max_accel`` and ``max_jerk`` (braking never limited; the speed never
   exceeds the plan's, so stops are kept), :mod:`rad2_planner.comfort_limits`.

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

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.bev import get_config as get_bev_config
from rad2_core.config import (
    load_schema,
    require,
    resource_path,
    validate_value,
)
from rad2_core.geometry import tracks_overlap
from rad2_core.lane_map import SIGNAL_STATE_NAMES
from rad2_core.observation import BOOL_FIELDS, FIELD_RANKS, ObservationError
from rad2_core.open_loop_metrics import plan_headings
from rad2_core.planning_interface import PlanResult
from rad2_core.route_path import RoutePath, observation_route

# at import, not in the first planning cycle: scipy.spatial's first import took 150-340 ms, the first
# cycle's selection stage of every planner start (a deadline miss at each start of make demo)
from scipy.spatial.distance import cdist

from rad2_planner.comfort_limits import ComfortLimitParams, limit_acceleration, limit_curve_speed
from rad2_planner.diffusion import SAMPLERS, NoiseSchedule, SamplerSpec, initial_noise
from rad2_planner.runtime.base import DISCRIMINATOR_INPUTS, SCENE_INPUTS, make_backend
from rad2_planner.safety_envelope import SafetyEnvelopeParams, apply_envelope, constant_velocity_boxes
from rad2_planner.selection import CandidateDistribution
from rad2_planner.selection import sample as sample_candidate
from rad2_planner.stall_recovery import (
    StallRecoveryParams,
    asks_for_reversing,
    even_start,
    recovery_plan,
)
from rad2_planner.traffic_rules import TrafficRuleParams, allowed_distance, limit_progress

# What this module implements of planner.fallback_selection, planner.discriminator_candidates (the
# candidates the discriminator ranks and samples from: all, or the safe set of safe_medoid),
# planner.selection_mode, planner.initial_noise and safety_layer.mode. The schema lists the values a
# file or an override may take (tests/unit/test_config_boundaries.py holds these to it); these tuples
# check what code hands a policy (a kwarg, a dict built for a benchmark or an experiment arm).
FALLBACK_RULES = ("medoid", "first", "safe_medoid")
DISCRIMINATOR_CANDIDATES = ("all", "safe")
SELECTION_MODES = ("deterministic", "sample")
INITIAL_NOISE_MODES = ("per_cycle", "per_episode")
SAFETY_MODES = ("off", "rejection_sampling", "candidate_selection", "self_correction")
# Discriminator inputs recorded per row for the RL update (the trajectories are the candidates).
RECORDED_DISCRIMINATOR_INPUTS = DISCRIMINATOR_INPUTS[1:]
# Recorded beside them when planner.discriminator_prior_weight > 0: the κ·prior [M] the cycle added to the
# logits, so that the RL update recomputes the same distribution (rad2_training.tc_grpo).
SELECTION_PRIOR = "selection_prior"
# Largest planner.discriminator_prior_weight (the schema's bound): beyond it the prior alone decides and
# the float32 logits lose the discriminator's differences, so a larger value is a typo, not a setting.
MAX_PRIOR_WEIGHT = 1000.0


def resolve_path(p: str | Path) -> Path:
    """Relative paths in params are relative to the repository root: the checkout's, else the installed
    package share's (``config.resource_path``); where the checkout's would be when neither has it (for
    outputs and caches; inputs use ``resource_path``, whose error names both places)."""
    return resource_path(p, required=False)


def observation_inputs(observation: Any, cfg=None, observation_channels=None) -> dict[str, np.ndarray]:
    """An Observation (object or dict, single or batched) -> the scene-encoder input batch.

    With the model config ``cfg``: the model is fed the BEV channels it names (of ``observation_channels``,
    default ``bev.channels`` of params/bev.yaml) and its first ``map_point_dim`` map-token features, so a
    checkpoint trained before a channel or feature was added keeps working; then every field's shape is
    checked against ``cfg`` and the offending field named.
    """
    out = {}
    for name, unbatched_ndim in FIELD_RANKS.items():
        v = observation[name] if isinstance(observation, dict) else getattr(observation, name, None)
        if v is None:
            raise ObservationError(f"observation has no field {name!r}")
        a = np.asarray(v)
        if a.ndim == unbatched_ndim:
            a = a[None]
        elif a.ndim != unbatched_ndim + 1:
            raise ObservationError(
                f"observation.{name}: shape {a.shape} has {a.ndim} dims, expected "
                f"{unbatched_ndim} (or {unbatched_ndim + 1} batched)"
            )
        a = a.astype(bool if name in BOOL_FIELDS else np.float32, copy=False)
        if name not in BOOL_FIELDS and not np.all(np.isfinite(a)):
            raise ObservationError(f"observation.{name}: contains non-finite values")
        out[name] = np.ascontiguousarray(a)
    if cfg is not None:
        try:
            out = cfg.select_inputs(out, observation_channels)
        except ValueError as e:
            raise ObservationError(str(e)) from None
        expect = {
            "bev": (cfg.bev_channels, *cfg.bev_hw),
            "map_polylines": (cfg.n_map, cfg.map_points, cfg.map_point_dim),
            "map_mask": (cfg.n_map,),
            "agents": (cfg.n_agents, 10),
            "agents_mask": (cfg.n_agents,),
            "route": (cfg.n_route, 4),
            "route_mask": (cfg.n_route,),
            "ego_state": (4,),
        }
        b = out["bev"].shape[0]
        for name, shp in expect.items():
            if out[name].shape != (b, *shp):
                raise ObservationError(
                    f"observation.{name}: shape {out[name].shape[1:]} does not match the model's {shp}"
                )
    return out


def correction_inputs(traces: list[list[np.ndarray]], speeds, normalizer, trace_len: int, plan_points: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Correction-encoder inputs of rows' rejected proposals (lists of ``[T, 2]`` ego-frame metres, oldest
    first): the newest ``trace_len`` of each, normalised like the generator's output at the row's speed,
    zero-padded, and the mask of the filled slots -> ``(trace [B, L, T, 2], mask [B, L])``."""
    trace = np.zeros((len(traces), trace_len, plan_points, 2), np.float32)
    mask = np.zeros((len(traces), trace_len), bool)
    for j, rejected in enumerate(traces):
        kept = list(rejected)[-trace_len:]
        if kept:
            trace[j, :len(kept)] = normalizer.normalize(np.stack(kept).astype(np.float32), float(speeds[j]))
            mask[j, :len(kept)] = True
    return trace, mask


def mean_pairwise_distance(candidates: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """``[M]``: each candidate's mean point-wise distance (m) to the ``allowed`` candidates ``[M]`` (bool;
    None: all), over every plan point. The medoid minimises it.

    One distance matrix per time step (scipy's cdist) rather than an [M, M, T, 2] difference array:
    0.4 instead of 4 ms at M = 128.
    """
    c = np.asarray(candidates, np.float64)
    others = c if allowed is None else c[np.asarray(allowed, bool)]
    if not len(others):
        raise ValueError("allowed: no candidate allowed (at least one must be)")
    total = np.zeros(len(c))
    for t in range(c.shape[1]):
        total += cdist(c[:, t], others[:, t]).sum(axis=1)
    return total / (len(others) * max(c.shape[1], 1))


def medoid_index(candidates: np.ndarray) -> int:
    """Index of the candidate [M, T, 2] with the smallest mean point-wise distance to the others."""
    return int(np.argmin(mean_pairwise_distance(candidates)))


def consensus_prior(candidates: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """``[M]`` log-preference of each candidate ``[M, T, 2]`` for the consensus of the ``allowed`` set:
    ``−(d_m − min d) / std d`` over the allowed candidates, with ``d`` the :func:`mean_pairwise_distance`
    to them (0 for the medoid and where not allowed: the draw never picks those; all 0 when the allowed
    candidates are equally far from each other).

    Added with a weight κ (``planner.discriminator_prior_weight``) to the discriminator's logits, it
    makes the selection distribution ``softmax(l + κ·prior)``: with a constant ``l`` (an untrained head)
    its argmax is the medoid of the allowed set (``safe_medoid`` with the safe set), so RL starts from
    the best hand-written rule and learns where to leave it instead of starting from a uniform choice.
    Standardised, so κ means the same in a tight and in a spread set.
    """
    mask = np.ones(len(candidates), bool) if allowed is None else np.asarray(allowed, bool)
    d = mean_pairwise_distance(candidates, mask)
    spread = float(d[mask].std())
    if spread <= 1e-9 * max(float(d[mask].max()), 1e-9):  # rounding noise, not a preference
        return np.zeros(len(d))
    return np.where(mask, -(d - d[mask].min()) / spread, 0.0)


def safe_candidates(
    candidates: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, plan_dt: float,
    ego_size: tuple[float, float], max_curvature: float,
) -> np.ndarray:
    """Indices of the candidates ``[M, T, 2]`` whose ego box overlaps no observed agent extrapolated at
    constant velocity; when every candidate overlaps one, those whose first overlap comes latest (never
    empty). The safe set of ``safe_medoid`` and of ``planner.discriminator_candidates: safe``."""
    m, t = candidates.shape[:2]
    a = agents[agents_mask.astype(bool)]
    if not len(a):
        return np.arange(m)
    agent_boxes = constant_velocity_boxes(a, (np.arange(t) + 1.0) * plan_dt)  # N T 5
    yaw = plan_headings(candidates, max_curvature=max_curvature)
    # M T 5
    ego = np.stack(np.broadcast_arrays(candidates[..., 0], candidates[..., 1], yaw, *ego_size), -1)
    hit = tracks_overlap(ego, agent_boxes)  # M T
    first = np.where(hit.any(1), hit.argmax(1), t)
    return np.nonzero(first == first.max())[0]


def safe_medoid_index(
    candidates: np.ndarray, agents: np.ndarray, agents_mask: np.ndarray, plan_dt: float,
    ego_size: tuple[float, float], max_curvature: float, route: np.ndarray | None = None,
    progress_quantile: float = 0.0,
) -> int:
    """Medoid of the candidates that avoid the constant-velocity extrapolation of the observed agents.

    ``agents [N, 10]`` are observation agent tokens (x, y, cos, sin, vx, vy, length, width, ...), ego
    frame. Candidates overlapping an agent are dropped; if none is left, those whose first overlap is
    latest are kept.

    ``progress_quantile`` q in [0, 1) (``planner.selection_progress_quantile``): of the safe candidates,
    only those whose end point gets at least as far along ``route`` (``[P >= 2, 2]`` ego-frame points,
    :func:`rad2_core.route_path.observation_route`) as the q-quantile of them are kept before the
    medoid is taken. Why: the generator's samples spread around a mode that is slower than the logged
    drivers (it imitates their average, and more so where it is unsure, e.g. before a sharp turn), and
    the medoid of the whole set sits at that mode; q = 0 keeps every safe candidate. Progress is
    counted up to the route's last point only.
    """
    keep = safe_candidates(candidates, agents, agents_mask, plan_dt, ego_size, max_curvature)
    if progress_quantile > 0.0 and route is not None and len(keep) > 1:
        path = RoutePath(route)
        # past the route's last point there is nothing to gain (RoutePath extrapolates beyond it)
        end = np.minimum(path.project(candidates[keep, -1].astype(np.float64))[0], path.length)
        progress = end - path.project(np.zeros(2))[0]
        keep = keep[progress >= np.quantile(progress, progress_quantile)]
    return int(keep[medoid_index(candidates[keep])])


@dataclass(frozen=True)
class SafetyLayerParams:
    """``safety_layer.*`` of params/planner.yaml (see the module doc, stage 5); build it with
    :meth:`from_params` (and ``dataclasses.replace`` for a variant), so every value is the file's."""

    mode: str
    threshold: float  # probability: p >= threshold rejects a candidate
    max_rounds: int  # resampling rounds of rejection sampling
    critic_checkpoint: str
    # the self-correcting generator (mode self_correction; rad2 train self-correction)
    correction_checkpoint: str
    # ms from the start of the planning cycle by which an extra round must end; None (set in code, e.g.
    # for closed-loop evaluation): no time budget
    round_budget_ms: float | None

    def __post_init__(self):
        # the threshold and the rounds are bounded by the schema; the mode and the budget are also set
        # in code (a mode per evaluated layer, no budget), so they are checked here
        if self.mode not in SAFETY_MODES:
            raise ValueError(f"safety_layer.mode: unknown value {self.mode!r} (choose from {SAFETY_MODES})")
        b = self.round_budget_ms
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b)
                              or b <= 0.0):
            raise ValueError(f"safety_layer.round_budget_ms: {b!r} must be a finite number of ms > 0 "
                             "(or None for no budget)")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> SafetyLayerParams:
        c = require(params, "safety_layer", "planner.yaml")
        budget = require(c, "round_budget_ms", "planner.yaml", block="safety_layer")
        try:
            budget = float(budget)
        except (TypeError, ValueError):
            raise ValueError(f"safety_layer.round_budget_ms: {budget!r} is not a number of ms") from None
        correction = require(c, "correction_checkpoint", "planner.yaml", block="safety_layer")
        return cls(str(c["mode"]), float(c["threshold"]), int(c["max_rounds"]), str(c["critic_checkpoint"]),
                   str(correction), budget)


def next_round_fits(spent_ms: float, round_costs_ms: Sequence[float], budget_ms: float | None) -> bool:
    """Whether one more rejection-sampling round may start: ``spent_ms`` (the cycle so far) plus the
    estimated cost of a round, the largest of ``round_costs_ms`` (the rounds measured in this cycle),
    stays within ``budget_ms``. No budget (None) always fits."""
    if budget_ms is None:
        return True
    return spent_ms + max(round_costs_ms, default=0.0) <= budget_ms


class Rad2Policy:
    """RAD-2 planner. Build with :meth:`from_params` (loads the checkpoint ``params`` names) or directly.

    ``params``: params/planner.yaml, vehicle.yaml and bev.yaml as the entry point loaded them, merged
    (:func:`rad2_core.config.merged`): the planner's settings, the ego box and its tightest turn, and
    the BEV channels the observations carry. A params dict without a key of the current files (one
    written for an older planner.yaml) is a ParameterError naming the key.
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
        for block in ("traffic_rules", "comfort_limits", "safety_envelope", "stall_recovery", "safety_layer"):
            require(params, block, "planner.yaml")
        # the ego box and its tightest turn for safe_medoid come from vehicle.yaml (``vehicle_params``:
        # that file when ``params`` holds no vehicle block)
        vehicle = VehicleParams.from_params(vehicle_params if vehicle_params is not None
                                            else require(params, "vehicle", "vehicle.yaml"))
        self.ego_size = (vehicle.length, vehicle.width)
        self.max_curvature = float(slip_and_curvature(vehicle.max_steer, vehicle)[1])
        require(params, "bev", "bev.yaml")
        self.bev_cfg = get_bev_config(params)  # the observations' grid and channels
        self.observation_channels = self.bev_cfg.channels
        self.rules = TrafficRuleParams.from_params(params)
        self.comfort = ComfortLimitParams.from_params(params)
        self.envelope = SafetyEnvelopeParams.from_params(params)
        self.recovery = StallRecoveryParams.from_params(params)
        self.vehicle = vehicle
        self.emergency_decel = -float(vehicle.min_accel)
        self.max_speed = float(vehicle.max_speed)
        self.params = params
        self.model = model
        self.cfg = model.cfg
        self.normalizer = model.normalizer
        self.backend_name = backend or p["backend"]
        # M and K may be changed per call (RL, benchmarks): their bounds from the schema, checked at
        # every call (the schema's bounds only; the values are the params')
        schema = load_schema("planner")
        self._count_specs = {key: schema[key]
                             for key in ("planner.num_candidates", "planner.num_denoise_steps")}
        self.num_candidates = self._count("planner.num_candidates", num_candidates, p["num_candidates"])
        self.num_steps = self._count("planner.num_denoise_steps", num_steps, p["num_denoise_steps"])
        self.sampler = sampler or p["sampler"]
        if self.sampler not in SAMPLERS:
            raise ValueError(f"planner.sampler: unknown value {self.sampler!r} (choose from {SAMPLERS})")
        self.base_seed = int(p["seed"] if seed is None else seed)
        self.initial_noise = str(require(p, "initial_noise", "planner.yaml", block="planner"))
        if self.initial_noise not in INITIAL_NOISE_MODES:
            raise ValueError(f"planner.initial_noise: unknown value {self.initial_noise!r} "
                             f"(choose from {INITIAL_NOISE_MODES})")
        self.fallback = fallback_selection or p["fallback_selection"]
        if self.fallback not in FALLBACK_RULES:
            raise ValueError(f"planner.fallback_selection: unknown value {self.fallback!r} {FALLBACK_RULES}")
        self.progress_quantile = float(require(p, "selection_progress_quantile", "planner.yaml",
                                               block="planner"))
        if not 0.0 <= self.progress_quantile < 1.0:
            raise ValueError("planner.selection_progress_quantile: must be in [0, 1), got "
                             f"{self.progress_quantile!r}")
        self.discriminator_candidates = str(require(p, "discriminator_candidates", "planner.yaml",
                                                    block="planner"))
        if self.discriminator_candidates not in DISCRIMINATOR_CANDIDATES:
            raise ValueError("planner.discriminator_candidates: unknown value "
                             f"{self.discriminator_candidates!r} (choose from {DISCRIMINATOR_CANDIDATES})")
        w = require(p, "discriminator_prior_weight", "planner.yaml", block="planner")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= MAX_PRIOR_WEIGHT:
            raise ValueError("planner.discriminator_prior_weight: must be a number in "
                             f"[0, {MAX_PRIOR_WEIGHT:g}], got {w!r}")
        self.prior_weight = float(w)
        self.always_score = always_score
        self.selection = _check_mode(selection or require(params, "planner.selection_mode"))
        self.distribution = candidate_distribution or CandidateDistribution.from_params(p)
        self.plan_dt = float(p["plan_dt"])
        d = require(params, "diffusion")
        if int(d["num_train_steps"]) != self.cfg.num_train_steps:
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
        self._onnx_dir = runtime["onnx_dir"]
        runtime["tensorrt"] = dict(runtime["tensorrt"])
        runtime["tensorrt"]["engine_cache_dir"] = str(resolve_path(runtime["tensorrt"]["engine_cache_dir"]))
        self.backend = make_backend(
            self.backend_name, model, runtime, device=device or p["device"], sampler_spec=self.sampler_spec
        )
        self._cycle = 0
        self._critic_model = critic
        self._critic = None
        self._critic_source = ""
        self._corrector = None
        self._corrector_source = ""
        self._corrector_trace_len = 0
        self.device = device or p["device"]
        self.budget_stop_count = 0  # rows whose rejection sampling the time budget stopped (stage 5)
        self.set_safety_layer(safety_layer or SafetyLayerParams.from_params(params))

    def set_safety_layer(self, safety: SafetyLayerParams) -> None:
        """Switch the safety layer (loads the critic on first use: a missing checkpoint fails here, not
        in a planning cycle)."""
        self.safety = safety
        if safety.mode == "self_correction":
            self._load_corrector(safety.correction_checkpoint)
        source = "given" if self._critic_model is not None else str(resolve_path(safety.critic_checkpoint))
        if safety.mode == "off" or (self._critic is not None and self._critic_source == source):
            return
        from rad2_planner.networks.critic import CollisionCritic, CriticRunner

        model = self._critic_model
        if model is None:
            model = CollisionCritic.load(resource_path(safety.critic_checkpoint))
        if model.cfg.plan_points != self.cfg.plan_points or abs(model.cfg.plan_dt - self.plan_dt) > 1e-9:
            raise ValueError(
                f"safety_layer.critic_checkpoint: the critic was built for {model.cfg.plan_points} points at "
                f"{model.cfg.plan_dt} s, the planner plans {self.cfg.plan_points} at {self.plan_dt} s")
        onnx_dir = None
        if getattr(model, "checkpoint_dir", None) is None:  # in memory: export beside the planner's graphs
            onnx_dir = Path(self._onnx_dir) / "critic"
        self._critic = CriticRunner(model, self.backend_name, require(self.params, "runtime"),
                                    onnx_dir=onnx_dir)
        self._critic_source = source

    def _load_corrector(self, checkpoint: str) -> None:
        """The self-correcting generator's backend (stage 5, ``self_correction``), once per checkpoint."""
        from rad2_planner.networks import PlannerModel
        from rad2_planner.networks.model import same_scene_encoder

        path = resource_path(checkpoint)
        if self._corrector is not None and self._corrector_source == str(path):
            return
        if self.backend_name == "tensorrt":
            raise ValueError("safety_layer.mode self_correction: the correction encoder has no TensorRT "
                             "engine yet; use planner.backend onnxruntime or pytorch")
        model = PlannerModel.load(path)
        if model.correction is None:
            raise ValueError(f"safety_layer.correction_checkpoint: {path} is a plain generator (no "
                             "correction encoder); train one with rad2 train self-correction")
        if not same_scene_encoder(model, self.model):
            # one encoding per cycle feeds both denoisers, so the two must read scenes identically
            raise ValueError(f"safety_layer.correction_checkpoint: {path} was not fine-tuned from this "
                             "planner's checkpoint (its scene encoder or normalisation differs)")
        runtime = dict(require(self.params, "runtime"))
        runtime["onnx_dir"] = str(model.export_dir)
        self._corrector = make_backend(self.backend_name, model, runtime, device=str(self.device),
                                       sampler_spec=self.sampler_spec)
        self._corrector_trace_len = int(model.cfg.correction_trace_len)
        self._corrector_source = str(path)

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
        validate_value(self._count_specs, dotted, n, "Rad2Policy")
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
    ) -> list[PlanResult]:
        """Plan for a batch of observations in one pass (B scenes × M candidates).

        ``seeds``: one per row (instead of ``seed``), see the module doc. ``noise_seeds``: one per row,
        each row's episode seed; with ``planner.initial_noise: per_episode`` the initial noise comes
        from it instead of from ``seeds`` (ignored per cycle). ``selection`` and
        ``candidate_distribution`` override the policy's (``planner.selection_*``) for this call.
        ``return_discriminator_inputs``: attach to each result what the discriminator consumed.
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
        candidates = self._denoise(x_init, scene, inputs, k, timings)
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
        mask = self._discriminator_mask(candidates, inputs) if by_logits else None
        prior = self._selection_prior(candidates, mask) if by_logits else None
        if prior is not None:
            logits = logits + prior
        if mode == "sample":
            rngs = [np.random.default_rng([s, 1]) for s in (row_seeds or [seed])]
            draw = self._sample(logits, dist, rngs, mask)
            selected, rule = [int(i) for i in draw.index], f"sample:{dist.label}"
        else:
            draw = None
            selected, rule = self._select_deterministic(candidates, logits, inputs, mask)
        timings["select"] = (time.perf_counter() - t0) * 1e3
        safety_info: list[dict[str, Any]] = [{} for _ in range(b)]
        if self.safety.mode != "off" and mode == "deterministic":
            candidates, scores, logits, selected, safety_info = self._safety_stage(
                candidates, scores, logits, selected, inputs, scene, k, scored, seed, row_seeds, timings,
                t_start)
        t0 = time.perf_counter()
        executed, recovery_notes = self._stall_recovery(candidates, selected, inputs)
        timings["stall_recovery"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        executed, rule_notes = self._traffic_rules(observation, candidates, selected, executed, inputs)
        timings["traffic_rules"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        executed, envelope_notes = self._safety_envelope(candidates, selected, executed, inputs)
        timings["safety_envelope"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        executed = self._comfort_limits(candidates, selected, executed, inputs)
        timings["comfort_limits"] = (time.perf_counter() - t0) * 1e3
        recorded = self._recorded_inputs(inputs, scene) if return_discriminator_inputs else [None] * b
        if prior is not None and return_discriminator_inputs:
            for i, row in enumerate(recorded):
                row[SELECTION_PRIOR] = prior[i].astype(np.float32)
        timings["total"] = (time.perf_counter() - t_start) * 1e3
        info = {"backend": self.backend_name, "sampler": self.sampler, "M": m, "K": k, "selection": rule}
        return [
            PlanResult(
                candidates=candidates[i],
                scores=scores[i],
                selected=selected[i],
                plan_dt=self.plan_dt,
                timings_ms=dict(timings),
                info={**info, "seed": int(seed if row_seeds is None else row_seeds[i]), **safety_info[i],
                      **({"stall_recovery": recovery_notes[i]} if recovery_notes[i] else {}),
                      **({"traffic_rule": rule_notes[i]} if rule_notes[i] else {}),
                      **({"safety_envelope": envelope_notes[i]} if envelope_notes[i] else {})},
                executed=executed[i],
                logits=logits[i],
                log_prob=float("nan") if draw is None else float(draw.log_prob[i]),
                entropy=float("nan") if draw is None else float(draw.entropy[i]),
                probs=None if draw is None else draw.probs[i],
                discriminator_inputs=recorded[i],
            )
            for i in range(b)
        ]

    def _denoise(
        self, x_init: np.ndarray, scene: Any, inputs: dict[str, np.ndarray], k: int, timings: dict,
        backend=None,
    ) -> np.ndarray:
        """K sampler steps from ``x_init [B, M, T, 2]`` -> candidates in ego-frame metres (float32);
        ``backend``: another generator's (the self-correcting one) instead of the planner's."""
        spec = self.sampler_spec if k == self.num_steps else self.sampler_spec._replace(num_steps=k)
        z = (backend or self.backend).generate(x_init, scene, self.schedule, spec, timings)
        speed = inputs["ego_state"][:, 0][:, None]  # B 1
        return np.asarray(self.normalizer.denormalize(z, speed), dtype=np.float32)  # B M T 2

    def _critic_probs(self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], rows,
                      timings: dict) -> np.ndarray:
        """Critic probabilities [len(rows), M'] of ``trajectories [len(rows), M', T, 2]`` of batch rows."""
        t0 = time.perf_counter()
        _, probs = self._critic(trajectories, inputs["agents"][rows], inputs["agents_mask"][rows],
                                inputs["ego_state"][rows])
        timings["critic"] = timings.get("critic", 0.0) + (time.perf_counter() - t0) * 1e3
        return np.asarray(probs, dtype=np.float64)

    def _safety_stage(self, candidates, scores, logits, selected, inputs, scene, k, scored, seed, row_seeds,
                      timings, t_start):
        """Stage 5 of the module doc: ``(candidates, scores, logits, selected, per-row info)`` after the
        critic; rows whose candidate set was redrawn get that set's arrays. ``t_start``: the cycle's
        start (``time.perf_counter()``), for the round budget."""
        b = candidates.shape[0]
        thr = float(self.safety.threshold)
        timings["critic"] = 0.0
        timings["corrections"] = 0.0
        selected = list(selected)
        rows = list(range(b))
        if self.safety.mode == "candidate_selection":
            p = self._critic_probs(candidates, inputs, rows, timings)  # B M
            t0 = time.perf_counter()
            out = []
            for i in rows:
                ok = np.flatnonzero(p[i] < thr)
                pick = int(np.argmin(p[i])) if len(ok) == 0 else self._select_among(
                    i, ok, candidates, logits, inputs)
                out.append({"safety_layer": self.safety.mode, "corrections": int(pick != selected[i]),
                            "critic_p": float(p[i, pick]), "critic_accepted": bool(p[i, pick] < thr),
                            "safety_stopped_by_budget": False})
                selected[i] = pick
            timings["select"] += (time.perf_counter() - t0) * 1e3
            return candidates, scores, logits, selected, out
        # rejection sampling: the critic judges the selected proposal; a rejected row draws a new set.
        # self_correction: the same loop, but the new set comes from the self-correcting generator
        # conditioned on the row's correction trace (every proposal rejected so far, the newest last).
        correcting = self.safety.mode == "self_correction"
        candidates, scores, logits = candidates.copy(), scores.copy(), logits.copy()
        p_sel = self._critic_probs(candidates[rows, selected][:, None], inputs, rows, timings)[:, 0]
        traces: list[list[np.ndarray]] = [[candidates[i, selected[i]]] if p_sel[i] >= thr else []
                                          for i in rows]
        rounds = np.zeros(b, np.int64)
        stopped = np.zeros(b, bool)
        m = candidates.shape[1]
        # before any extra round: the first pass (generator, discriminator, selection, critic) is the estimate
        first_pass_ms = sum(timings.get(key, 0.0) for key in ("denoise_total", "score", "select", "critic"))
        round_ms: list[float] = []
        for r in range(1, int(self.safety.max_rounds) + 1):
            todo = [i for i in rows if p_sel[i] >= thr]
            if not todo:
                break
            spent_ms = (time.perf_counter() - t_start) * 1e3
            if not next_round_fits(spent_ms, round_ms or [first_pass_ms], self.safety.round_budget_ms):
                stopped[todo] = True
                self.budget_stop_count += len(todo)
                break
            t0 = time.perf_counter()
            if row_seeds is None:
                x_init = np.random.default_rng([seed, 2, r]).standard_normal(
                    (len(todo), m, self.cfg.plan_points, 2)).astype(np.float32)
            else:
                x_init = np.concatenate([np.random.default_rng([row_seeds[i], 2, r]).standard_normal(
                    (1, m, self.cfg.plan_points, 2)).astype(np.float32) for i in todo])
            sub_inputs = {key: v[todo] for key, v in inputs.items()}
            sub_scene = self.backend.scene_rows(scene, todo)
            if correcting:
                trace, trace_mask = self._correction_trace([traces[i] for i in todo], sub_inputs)
                gen_scene = self._corrector.extend_scene(sub_scene, trace, trace_mask)
                new = self._denoise(x_init, gen_scene, sub_inputs, k, {}, self._corrector)
            else:
                new = self._denoise(x_init, sub_scene, sub_inputs, k, {})
            new_mask = None
            if scored:
                new_logits, new_scores = (np.asarray(a, dtype=np.float32)
                                          for a in self.backend.score_logits(new, sub_inputs, sub_scene))
                new_mask = self._discriminator_mask(new, sub_inputs)
                new_prior = self._selection_prior(new, new_mask)
                new_logits = new_logits if new_prior is None else new_logits + new_prior
            else:
                new_logits, new_scores = np.full((2, len(todo), m), np.nan, dtype=np.float32)
            new_sel, _ = self._select_deterministic(new, new_logits, sub_inputs, new_mask)
            timings["corrections"] += (time.perf_counter() - t0) * 1e3
            proposals = new[np.arange(len(todo)), new_sel][:, None]  # B' 1 T 2
            p_new = self._critic_probs(proposals, inputs, todo, timings)[:, 0]
            round_ms.append((time.perf_counter() - t0) * 1e3)
            for j, i in enumerate(todo):
                rounds[i] = r
                if p_new[j] >= thr:
                    traces[i].append(proposals[j, 0])
                # every earlier proposal of this row was rejected, so a lower risk is the least risky
                # seen, and an accepted proposal is always one
                if p_new[j] < p_sel[i]:
                    candidates[i], scores[i], logits[i] = new[j], new_scores[j], new_logits[j]
                    selected[i], p_sel[i] = int(new_sel[j]), float(p_new[j])
        # the rejected proposals ride along in the cycle's info (ego-frame metres, oldest first): the
        # closed-loop fine-tuning of the corrector (rad2_training.correction_rl) conditions on them again
        out = [{"safety_layer": self.safety.mode, "corrections": int(rounds[i]), "critic_p": float(p_sel[i]),
                "critic_accepted": bool(p_sel[i] < thr), "safety_stopped_by_budget": bool(stopped[i]),
                "correction_trace": (np.stack(traces[i]).astype(np.float32) if traces[i]
                                     else np.zeros((0, self.cfg.plan_points, 2), np.float32))}
               for i in rows]
        return candidates, scores, logits, selected, out

    def _correction_trace(self, traces: list[list[np.ndarray]], inputs: dict[str, np.ndarray]
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Rows' rejected proposals (metres) as the correction encoder's input (:func:`correction_inputs`)."""
        return correction_inputs(traces, inputs["ego_state"][:, 0], self.normalizer,
                                 self._corrector_trace_len, self.cfg.plan_points)

    def _select_among(self, i: int, allowed: np.ndarray, candidates: np.ndarray, logits: np.ndarray,
                      inputs: dict[str, np.ndarray]) -> int:
        """The deterministic selection rule of row ``i`` restricted to the candidates ``allowed``."""
        if self.has_discriminator:
            mask = self._discriminator_mask(candidates[i:i + 1], {k: v[i:i + 1] for k, v in inputs.items()})
            both = allowed if mask is None else allowed[mask[0, allowed]]
            both = both if len(both) else allowed  # the critic's choice outranks the overlap check
            return int(both[np.argmax(logits[i, both])])
        sub = candidates[i, allowed]
        if self.fallback == "medoid":
            return int(allowed[medoid_index(sub)])
        if self.fallback == "safe_medoid":
            return int(allowed[self._safe_medoid(sub, inputs, i)])
        return int(allowed[0])

    def _stall_recovery(self, candidates: np.ndarray, selected: list[int], inputs: dict[str, np.ndarray]
                        ) -> tuple[list, list[str]]:
        """Per row (:mod:`rad2_planner.stall_recovery`): the selected candidate evenly accelerated from
        now when a slow ego's plan holds its speed and accelerates later; the route followed forwards
        where it asks for reversing and that plan stays on the BEV's drivable area; else None. And a
        note saying which."""
        b = candidates.shape[0]
        executed, notes = [None] * b, [""] * b
        if not self.recovery.enabled:
            return executed, notes
        bev_cfg = self.bev_cfg
        # ``inputs`` are the model's: its BEV channels, in its order (ModelConfig.select_inputs). Without a
        # drivable area to check a recovery plan against, a reversing plan is kept as it is.
        names = self.cfg.input_channel_names(bev_cfg.channels)
        drivable = (names.index("drivable_area")
                    if "drivable_area" in names
                    and inputs["bev"].shape[1:] == (len(names), bev_cfg.height, bev_cfg.width) else None)
        for i in range(b):
            plan = candidates[i, selected[i]]
            speed, _, _, steer = (float(v) for v in inputs["ego_state"][i])
            if not asks_for_reversing(plan, self.recovery):
                started = even_start(plan, speed, self.plan_dt, self.recovery)
                if started is not None:
                    executed[i] = started.astype(np.float32)
                    notes[i] = "late acceleration: the plan's acceleration evened out from now"
                continue
            if drivable is None:
                continue
            route = observation_route(inputs["route"][i], inputs["route_mask"][i])
            bev = inputs["bev"][i, drivable]
            forward, straight, lookahead = recovery_plan(
                route, speed, steer, self.plan_dt, plan.shape[0], self.vehicle, self.recovery, bev, bev_cfg)
            if forward is None:
                notes[i] = "plan asks for reversing; following the route would leave the drivable area"
                continue
            executed[i] = forward.astype(np.float32)
            notes[i] = (f"plan asks for reversing (x {float(plan[:, 0].min()):.1f} m): following the route "
                        f"(straight {straight:g} m, look-ahead {lookahead:g} m)")
        return executed, notes

    def _traffic_rules(self, observation: Any, candidates: np.ndarray, selected: list[int], executed: list,
                       inputs: dict[str, np.ndarray]) -> tuple[list, list[str]]:
        """Per row: the executed plan (the selected candidate unless an earlier stage replaced it)
        re-timed to stop before a red (or stoppable yellow) signal's stop line (``traffic_rules``), as it
        was where no signal constrains it; and a note saying why."""
        b = candidates.shape[0]
        stops = getattr(observation, "signal_stop", None)
        if stops is None or not self.rules.enabled:
            return list(executed), [""] * b
        stops = np.asarray(stops, np.float64).reshape(b, 2)
        executed, notes = list(executed), [""] * b
        for i in range(b):
            speed = float(inputs["ego_state"][i, 0])
            limit = allowed_distance(stops[i], speed, self.ego_size[0], self.rules)
            if limit is None:
                continue
            plan = candidates[i, selected[i]] if executed[i] is None else executed[i]
            executed[i] = limit_progress(plan, self.plan_dt, speed, limit,
                                         self.rules.comfort_decel).astype(np.float32)
            notes[i] = f"stop for {SIGNAL_STATE_NAMES[int(stops[i, 1])]} signal in {limit:.1f} m"
        return executed, notes

    def _safety_envelope(self, candidates: np.ndarray, selected: list[int], executed: list,
                         inputs: dict[str, np.ndarray]) -> tuple[list, list[str]]:
        """Per row: the executed plan re-timed within the longitudinal safety envelope (unchanged where
        the envelope did not bind), and a note saying why where it did."""
        b = candidates.shape[0]
        if not self.envelope.enabled:
            return executed, [""] * b
        out, notes = list(executed), [""] * b
        for i in range(b):
            plan = candidates[i, selected[i]] if executed[i] is None else executed[i]
            res = apply_envelope(plan, self.plan_dt, float(inputs["ego_state"][i, 0]), inputs["agents"][i],
                                 inputs["agents_mask"][i], self.ego_size, self.emergency_decel, self.envelope,
                                 max_speed=self.max_speed)
            if res.fired:
                out[i], notes[i] = res.plan.astype(np.float32), res.note()
        return out, notes

    def _comfort_limits(self, candidates: np.ndarray, selected: list[int], executed: list,
                        inputs: dict[str, np.ndarray]) -> list:
        """Per row: the executed plan re-timed within ``comfort_limits`` (None where it already was
        within them and no rule changed it)."""
        if not self.comfort.enabled:
            return executed
        out = list(executed)
        for i in range(candidates.shape[0]):
            plan = candidates[i, selected[i]] if executed[i] is None else executed[i]
            speed, accel = (float(v) for v in inputs["ego_state"][i, :2])
            limited = limit_curve_speed(plan, self.plan_dt, self.comfort)
            limited = limit_acceleration(limited, self.plan_dt, speed, accel, self.comfort)
            if not np.array_equal(limited, plan):
                out[i] = limited.astype(np.float32)
        return out

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

    def _select_deterministic(
        self, candidates: np.ndarray, logits: np.ndarray, inputs: dict[str, np.ndarray],
        mask: np.ndarray | None = None,
    ) -> tuple[list[int], str]:
        """``mask``: :meth:`_discriminator_mask` when the caller has it already (None: computed here)."""
        b = candidates.shape[0]
        if self.has_discriminator:
            # Logits, not scores: a float32 sigmoid saturates to exact ties at 1.
            if mask is None:
                mask = self._discriminator_mask(candidates, inputs)
            if mask is not None:
                return [int(np.argmax(np.where(mask[i], logits[i], -np.inf))) for i in range(b)], \
                    "discriminator:safe"
            return [int(np.argmax(logits[i])) for i in range(b)], "discriminator"
        if self.fallback == "medoid":
            return [medoid_index(candidates[i]) for i in range(b)], "medoid"
        if self.fallback == "safe_medoid":
            return [self._safe_medoid(candidates[i], inputs, i) for i in range(b)], "safe_medoid"
        return [0] * b, "first"

    def _selection_prior(self, candidates: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
        """``[B, M]`` κ·:func:`consensus_prior` added to the discriminator's logits before the draw or the
        argmax (float32), or None with ``planner.discriminator_prior_weight`` 0."""
        if self.prior_weight == 0.0:
            return None
        rows = [consensus_prior(c, None if mask is None else mask[i]) for i, c in enumerate(candidates)]
        return (self.prior_weight * np.stack(rows)).astype(np.float32)

    def _discriminator_mask(self, candidates: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """``[B, M]`` the candidates the discriminator chooses among (``safe_candidates`` per row), or
        None when it chooses among all (``planner.discriminator_candidates: all``)."""
        if self.discriminator_candidates == "all":
            return None
        mask = np.zeros(candidates.shape[:2], dtype=bool)
        for i in range(candidates.shape[0]):
            mask[i, safe_candidates(candidates[i], inputs["agents"][i], inputs["agents_mask"][i],
                                    self.plan_dt, self.ego_size, self.max_curvature)] = True
        return mask

    def _safe_medoid(self, candidates: np.ndarray, inputs: dict[str, np.ndarray], i: int) -> int:
        """:func:`safe_medoid_index` of row ``i``'s candidates ``[M', T, 2]`` with this policy's settings."""
        route = None
        # where the route ends within the route tokens' look-ahead (the end of the mission, or of the
        # mapped road the expert stops at) nothing is gained by hurrying: the plain safe medoid
        if self.progress_quantile > 0.0 and inputs["route_mask"][i].all():
            route = observation_route(inputs["route"][i], inputs["route_mask"][i])
        return safe_medoid_index(candidates, inputs["agents"][i], inputs["agents_mask"][i], self.plan_dt,
                                 self.ego_size, self.max_curvature, route, self.progress_quantile)

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
