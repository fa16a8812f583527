"""The planner's safety layer (``safety_layer.*`` of params/planner.yaml): a learned collision critic
judges the selected candidates, as the first post-planning stage (:class:`CriticStage`).

The critic (:mod:`rad2_planner.networks.critic`) predicts for candidates the probability of a collision
within their horizon; ``threshold`` splits accepted (p < threshold) from rejected ones.

- ``candidate_selection``: the critic scores all M candidates; the planner's selection rule picks among
  the accepted ones (discriminator argmax, or the fallback rule on that subset); when none is
  accepted, the least risky candidate is executed.
- ``rejection_sampling``: the critic judges the selected candidate only; while it is rejected, a new
  set of M is drawn from the unchanged generator (fresh noise, the same scene encoding) and selected
  from as before, at most ``max_rounds`` times; the least risky selected candidate seen is executed
  when none was accepted. Deadline-aware: a round starts only if the time spent since the cycle began
  plus the estimated cost of one round fits within ``round_budget_ms`` (:func:`next_round_fits`; the
  estimate is the costliest extra round of this cycle so far, before the first one the cost of the
  first pass: generator, discriminator, selection and critic). When the budget stops the rounds, the
  least risky selected candidate seen is executed and ``info["safety_stopped_by_budget"]`` is True.
  ``round_budget_ms=None`` (the dataclass default, not the file's) disables the check, so results do
  not depend on the machine's speed (tests, batched closed-loop evaluation).
- ``self_correction``: like rejection sampling, but each new set comes from the self-correcting
  generator (``correction_checkpoint``) conditioned on the row's correction trace, every proposal
  rejected so far, the newest last.

``info["corrections"]``: resampling rounds or 1 when the critic changed the selection (candidate
selection); ``info["critic_p"]``: the executed candidate's predicted risk; ``info["critic_accepted"]``:
whether it is below the threshold; ``timings_ms["critic"]`` the critic's time,
``timings_ms["corrections"]`` that of the extra rounds (without their critic calls). A sampled
selection (RL rollouts) skips the layer: its log-probability must describe the draw that was executed.
Round ``r`` of rejection sampling draws its noise from ``default_rng([seed, 2, r])``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import require, resource_path

from rad2_planner.candidates import correction_inputs
from rad2_planner.runtime.base import make_backend
from rad2_planner.stages import CycleContext, CyclePlans

# What this module implements of safety_layer.mode (the schema lists the values a file or an override
# may take; tests/unit/test_config_boundaries.py holds the two to each other).
SAFETY_MODES = ("off", "rejection_sampling", "candidate_selection", "self_correction")


@dataclass(frozen=True)
class SafetyLayerParams:
    """``safety_layer.*`` of params/planner.yaml; build it with :meth:`from_params` (and
    ``dataclasses.replace`` for a variant), so every value is the file's."""

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


class CriticStage:
    """The safety layer as a post-planning stage of ``planner`` (a :class:`rad2_planner.policy.Rad2Policy`:
    its generator draws the new candidate sets, its selection rule picks among them).

    ``critic``: an in-memory :class:`~rad2_planner.networks.critic.CollisionCritic` instead of loading
    ``critic_checkpoint``. :meth:`configure` switches the layer."""

    name = "safety_layer"
    timing_key = None  # it records the critic's and the extra rounds' time itself

    def __init__(self, planner, critic=None):
        self.planner = planner
        self.params: SafetyLayerParams | None = None
        self._critic_model = critic
        self.critic = None
        self._critic_source = ""
        self.corrector = None  # the self-correcting generator's backend
        self._corrector_source = ""
        self.corrector_trace_len = 0

    def configure(self, safety: SafetyLayerParams) -> None:
        """Switch the layer (loads the critic on first use: a missing checkpoint fails here, not in a
        planning cycle)."""
        self.params = safety
        if safety.mode == "self_correction":
            self._load_corrector(safety.correction_checkpoint)
        source = ("given" if self._critic_model is not None
                  else str(resource_path(safety.critic_checkpoint, required=False)))
        if safety.mode == "off" or (self.critic is not None and self._critic_source == source):
            return
        from rad2_planner.networks.critic import CollisionCritic, CriticRunner

        planner = self.planner
        model = self._critic_model
        if model is None:
            model = CollisionCritic.load(resource_path(safety.critic_checkpoint))
        cfg = model.cfg
        if cfg.plan_points != planner.cfg.plan_points or abs(cfg.plan_dt - planner.plan_dt) > 1e-9:
            raise ValueError(
                f"safety_layer.critic_checkpoint: the critic was built for {model.cfg.plan_points} points at "
                f"{model.cfg.plan_dt} s, the planner plans {planner.cfg.plan_points} at {planner.plan_dt} s")
        onnx_dir = None
        if getattr(model, "checkpoint_dir", None) is None:  # in memory: export beside the planner's graphs
            onnx_dir = Path(planner.onnx_dir) / "critic"
        self.critic = CriticRunner(model, planner.backend_name, require(planner.params, "runtime"),
                                   onnx_dir=onnx_dir)
        self._critic_source = source

    def _load_corrector(self, checkpoint: str) -> None:
        """The self-correcting generator's backend (mode ``self_correction``), once per checkpoint."""
        from rad2_planner.networks import PlannerModel
        from rad2_planner.networks.model import same_scene_encoder

        planner = self.planner
        path = resource_path(checkpoint)
        if self.corrector is not None and self._corrector_source == str(path):
            return
        if planner.backend_name == "tensorrt":
            raise ValueError("safety_layer.mode self_correction: the correction encoder has no TensorRT "
                             "engine yet; use planner.backend onnxruntime or pytorch")
        model = PlannerModel.load(path)
        if model.correction is None:
            raise ValueError(f"safety_layer.correction_checkpoint: {path} is a plain generator (no "
                             "correction encoder); train one with rad2 train self-correction")
        if not same_scene_encoder(model, planner.model):
            # one encoding per cycle feeds both denoisers, so the two must read scenes identically
            raise ValueError(f"safety_layer.correction_checkpoint: {path} was not fine-tuned from this "
                             "planner's checkpoint (its scene encoder or normalisation differs)")
        runtime = dict(require(planner.params, "runtime"))
        runtime["onnx_dir"] = str(model.export_dir)
        self.corrector = make_backend(planner.backend_name, model, runtime, device=str(planner.device),
                                      sampler_spec=planner.sampler_spec)
        self.corrector_trace_len = int(model.cfg.correction_trace_len)
        self._corrector_source = str(path)

    def applies(self, context: CycleContext) -> bool:
        return self.params.mode != "off" and context.selection == "deterministic"

    def _critic_probs(self, trajectories: np.ndarray, inputs: dict[str, np.ndarray], rows,
                      timings: dict) -> np.ndarray:
        """Critic probabilities [len(rows), M'] of ``trajectories [len(rows), M', T, 2]`` of batch rows."""
        t0 = time.perf_counter()
        _, probs = self.critic(trajectories, inputs["agents"][rows], inputs["agents_mask"][rows],
                               inputs["ego_state"][rows])
        timings["critic"] = timings.get("critic", 0.0) + (time.perf_counter() - t0) * 1e3
        return np.asarray(probs, dtype=np.float64)

    def _correction_trace(self, traces: list[list[np.ndarray]], inputs: dict[str, np.ndarray]
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Rows' rejected proposals (metres) as the correction encoder's input (:func:`correction_inputs`)."""
        return correction_inputs(traces, inputs["ego_state"][:, 0], self.planner.normalizer,
                                 self.corrector_trace_len, self.planner.cfg.plan_points)

    def apply(self, plans: CyclePlans, context: CycleContext) -> CyclePlans:
        """The plans after the critic; rows whose candidate set was redrawn get that set's arrays."""
        out = (self._select_accepted if self.params.mode == "candidate_selection" else self._redraw)(
            plans, context)
        return replace(out, info=tuple({**before, **after} for before, after in zip(plans.info, out.info)))

    def _select_accepted(self, plans: CyclePlans, context: CycleContext) -> CyclePlans:
        """``candidate_selection``: the selection rule among the candidates the critic accepts."""
        inputs, timings = context.inputs, context.timings
        candidates, logits = plans.candidates, plans.logits
        thr = float(self.params.threshold)
        timings["critic"] = 0.0
        timings["corrections"] = 0.0
        selected = list(plans.selected)
        rows = list(range(len(selected)))
        p = self._critic_probs(candidates, inputs, rows, timings)  # B M
        t0 = time.perf_counter()
        out = []
        for i in rows:
            ok = np.flatnonzero(p[i] < thr)
            pick = int(np.argmin(p[i])) if len(ok) == 0 else self.planner.select_among(
                i, ok, candidates, logits, inputs)
            out.append({"safety_layer": self.params.mode, "corrections": int(pick != selected[i]),
                        "critic_p": float(p[i, pick]), "critic_accepted": bool(p[i, pick] < thr),
                        "safety_stopped_by_budget": False})
            selected[i] = pick
        timings["select"] += (time.perf_counter() - t0) * 1e3
        return replace(plans, selected=tuple(selected), info=tuple(out))

    def _redraw(self, plans: CyclePlans, context: CycleContext) -> CyclePlans:
        """``rejection_sampling`` / ``self_correction``: the critic judges the selected proposal; a
        rejected row draws a new set (from the self-correcting generator conditioned on the row's
        correction trace with ``self_correction``)."""
        planner, inputs, timings = self.planner, context.inputs, context.timings
        seed, row_seeds, k = context.seed, context.row_seeds, context.num_steps
        b = plans.batch_size
        thr = float(self.params.threshold)
        timings["critic"] = 0.0
        timings["corrections"] = 0.0
        selected = list(plans.selected)
        rows = list(range(b))
        correcting = self.params.mode == "self_correction"
        candidates, scores, logits = plans.candidates.copy(), plans.scores.copy(), plans.logits.copy()
        p_sel = self._critic_probs(candidates[rows, selected][:, None], inputs, rows, timings)[:, 0]
        traces: list[list[np.ndarray]] = [[candidates[i, selected[i]]] if p_sel[i] >= thr else []
                                          for i in rows]
        rounds = np.zeros(b, np.int64)
        stopped = np.zeros(b, bool)
        m = candidates.shape[1]
        # before any extra round: the first pass (generator, discriminator, selection, critic) is the estimate
        first_pass_ms = sum(timings.get(key, 0.0) for key in ("denoise_total", "score", "select", "critic"))
        round_ms: list[float] = []
        for r in range(1, int(self.params.max_rounds) + 1):
            todo = [i for i in rows if p_sel[i] >= thr]
            if not todo:
                break
            spent_ms = (time.perf_counter() - context.t_start) * 1e3
            if not next_round_fits(spent_ms, round_ms or [first_pass_ms], self.params.round_budget_ms):
                stopped[todo] = True
                break
            t0 = time.perf_counter()
            if row_seeds is None:
                x_init = np.random.default_rng([seed, 2, r]).standard_normal(
                    (len(todo), m, planner.cfg.plan_points, 2)).astype(np.float32)
            else:
                x_init = np.concatenate([np.random.default_rng([row_seeds[i], 2, r]).standard_normal(
                    (1, m, planner.cfg.plan_points, 2)).astype(np.float32) for i in todo])
            sub_inputs = {key: v[todo] for key, v in inputs.items()}
            sub_scene = planner.backend.scene_rows(context.scene, todo)
            if correcting:
                trace, trace_mask = self._correction_trace([traces[i] for i in todo], sub_inputs)
                gen_scene = self.corrector.extend_scene(sub_scene, trace, trace_mask)
                new = planner.denoise(x_init, gen_scene, sub_inputs, k, {}, self.corrector)
            else:
                new = planner.denoise(x_init, sub_scene, sub_inputs, k, {})
            new_mask = None
            if context.scored:
                new_logits, new_scores = (np.asarray(a, dtype=np.float32)
                                          for a in planner.backend.score_logits(new, sub_inputs, sub_scene))
                new_mask = planner.discriminator_mask(new, sub_inputs)
                new_prior = planner.selection_prior(new, new_mask)
                new_logits = new_logits if new_prior is None else new_logits + new_prior
            else:
                new_logits, new_scores = np.full((2, len(todo), m), np.nan, dtype=np.float32)
            new_sel, _ = planner.select_deterministic(new, new_logits, sub_inputs, new_mask)
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
        out = [{"safety_layer": self.params.mode, "corrections": int(rounds[i]), "critic_p": float(p_sel[i]),
                "critic_accepted": bool(p_sel[i] < thr), "safety_stopped_by_budget": bool(stopped[i]),
                "correction_trace": (np.stack(traces[i]).astype(np.float32) if traces[i]
                                     else np.zeros((0, planner.cfg.plan_points, 2), np.float32))}
               for i in rows]
        return replace(plans, candidates=candidates, scores=scores, logits=logits, selected=tuple(selected),
                       info=tuple(out))
