"""Batched, grouped closed-loop rollouts: the one driving loop of evaluation, scenario curation and RL.

``run_rollouts(sim, decider, clips, group_size=G)`` starts ``G`` rollouts from each (clip, start step)
— identical initial states, the GRPO group — and drives them all to the end with latched execution
(``latch.h_reuse`` steps per decision, cut short by the simulator's safety check). Rows are stepped
together in chunks of whole groups; at every step the rows that need a decision are observed and
planned for in ONE call of the decision maker (``Rad2Policy.plan_batch`` for the learned policy), the
plans are tracked by one batched iLQR solve and every running row advances one step.

**Determinism.** Decision ``k`` of member ``m`` of group ``g`` plans with the seed
:func:`decision_seed` ``(seed, g, m, k)``: a row's noise and candidate sampling do not depend on which
chunk, batch or worker process ran it, so a Ray worker and this process produce the same rollouts
for the same chunks.

**What is recorded.** Each :class:`Rollout` holds the immutable :class:`~bev_warp_sim.trace.EpisodeTrace`
(ego track, TTC, collisions, decision points with candidates, executed index, log-probability, entropy,
logits and the discriminator's compact inputs), its :class:`~bev_warp_sim.metrics.EpisodeResult` and the
requested rewards of :data:`bev_warp_sim.rewards.REWARDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from rad2_core.planning_interface import PlanResult

from bev_warp_sim.metrics import EpisodeResult, episode_outcome
from bev_warp_sim.rewards import compute_rewards
from bev_warp_sim.simulator import Simulator
from bev_warp_sim.state import SimState, SimulationError
from bev_warp_sim.trace import EpisodeTrace


@dataclass(frozen=True)
class RowSpec:
    """One rollout to run: member ``member`` of group ``group`` (the index of its initial state)."""

    clip: Any
    start_step: int
    group: int
    member: int


@dataclass(frozen=True)
class Rollout:
    group: int
    member: int
    trace: EpisodeTrace
    result: EpisodeResult
    rewards: dict[str, float]
    agent_track: tuple[np.ndarray, ...] = ()  # reactive agents: per step [N, 3] simulated poses


@dataclass
class RolloutStats:
    """Counts and wall time per stage of a batch of rollouts (the benchmark reads them)."""

    env_steps: int = 0  # row-steps simulated
    decisions: int = 0  # plans committed
    rows: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("init", "observe", "plan", "commit", "step", "finish"), 0.0))

    def add(self, other: RolloutStats) -> None:
        self.env_steps += other.env_steps
        self.decisions += other.decisions
        self.rows += other.rows
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v

    @property
    def wall_s(self) -> float:
        return float(sum(self.seconds.values()))


class DecisionMaker(Protocol):
    """Plans for the rows of a chunk that need a decision (one call per simulation step)."""

    def start_chunk(self, sim: Simulator, state: SimState, rows: Sequence[RowSpec],
                    seeds: Sequence[int]) -> None:
        ...

    def decide(self, sim: Simulator, state: SimState, indices: np.ndarray, observations: list,
               seeds: Sequence[int]) -> list[PlanResult]:
        ...


def decision_seed(seed: int, group: int, member: int, decision: int) -> int:
    """The planning seed of one decision: a function of its identity only (not of batching)."""
    entropy = [int(seed), int(group), int(member), int(decision)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


class PerRowPlanners:
    """Any ``Planner`` (reference policies): one instance per row, ``plan`` called row by row.

    ``factory()`` builds a planner; ``reset(clip, start, seed)`` is called at the start of each chunk
    and privileged planners get the simulator context (``set_sim_context``) before each plan.
    """

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.planners: list[Any] = []

    def start_chunk(self, sim, state, rows, seeds) -> None:
        self.planners = []
        for spec, seed in zip(rows, seeds):
            planner = self.factory()
            planner.reset(spec.clip, spec.start_step, seed=seed)
            self.planners.append(planner)

    def decide(self, sim, state, indices, observations, seeds) -> list[PlanResult]:
        out = []
        for b, obs in zip(indices, observations):
            planner = self.planners[int(b)]
            if hasattr(planner, "set_sim_context"):
                planner.set_sim_context(sim.context(state, int(b)))
            out.append(planner.plan(obs))
        return out


class BatchedPolicy:
    """A policy with ``plan_batch`` (``Rad2Policy``): every decision of a step in one batched call.

    ``selection``: ``deterministic`` (deployment: argmax of the discriminator or the fallback rule) or
    ``sample`` (the training-time stochastic policy); ``plan_kwargs`` go to every ``plan_batch`` call
    (e.g. ``candidate_distribution=CandidateDistribution(kind="uniform")``, ``num_candidates``).
    """

    def __init__(self, policy, selection: str = "deterministic", record_discriminator_inputs: bool = False,
                 **plan_kwargs: Any):
        self.policy = policy
        self.selection = selection
        self.record_inputs = bool(record_discriminator_inputs)
        self.plan_kwargs = plan_kwargs
        # (sim, state, rows) -> the speed each row's mission asks for (NaN: none), or None: no mission
        self.mission_speeds: Callable[[Any, Any, np.ndarray], list[float]] | None = None

    def start_chunk(self, sim, state, rows, seeds) -> None:
        # each row's first decision seed names its episode: the noise seed of planner.initial_noise:
        # per_episode (the policy ignores it per cycle)
        self.episode_seeds = list(seeds)

    def decide(self, sim, state, indices, observations, seeds) -> list[PlanResult]:
        from rad2_core.observation import stack_observations

        batch = stack_observations(observations)
        mission = {} if self.mission_speeds is None else {
            "target_speeds": self.mission_speeds(sim, state, np.asarray(indices))}
        return self.policy.plan_batch(batch, seeds=list(seeds), selection=self.selection,
                                      noise_seeds=[self.episode_seeds[int(b)] for b in indices],
                                      return_discriminator_inputs=self.record_inputs, **mission,
                                      **self.plan_kwargs)


def expand_rows(clips: Sequence[Any], group_size: int = 1,
                start_steps: int | Sequence[int] = 0) -> list[RowSpec]:
    """``group_size`` rows per (clip, start step); group ``g`` is the g-th clip."""
    if group_size < 1:
        raise SimulationError(f"group_size: must be >= 1, got {group_size}")
    starts = np.broadcast_to(np.asarray(start_steps, dtype=np.int64), (len(clips),))
    return [RowSpec(c, int(s), g, m)
            for g, (c, s) in enumerate(zip(clips, starts)) for m in range(group_size)]


def chunk_rows(rows: Sequence[RowSpec], batch_size: int) -> list[list[RowSpec]]:
    """Chunks of whole groups with at most ``max(batch_size, G)`` rows (a group is never split)."""
    if batch_size < 1:
        raise SimulationError(f"batch_size: must be >= 1, got {batch_size}")
    chunks: list[list[RowSpec]] = []
    current: list[RowSpec] = []
    for g in dict.fromkeys(r.group for r in rows):
        members = [r for r in rows if r.group == g]
        if current and len(current) + len(members) > batch_size:
            chunks.append(current)
            current = []
        current.extend(members)
    if current:
        chunks.append(current)
    return chunks


def run_chunk(sim: Simulator, decider: DecisionMaker, rows: Sequence[RowSpec], *, seed: int = 0,
              h_reuse: int | None = None, max_steps: int | None = None, rewards: Sequence[str] | None = None,
              keep_observations: bool = False,
              progress: Callable[[int], None] | None = None) -> tuple[list[Rollout], RolloutStats]:
    """Drive one chunk of rows to the end; returns its rollouts (in row order) and stage timings."""
    stats = RolloutStats(rows=len(rows))
    clock = time.perf_counter
    t0 = clock()
    state = sim.init([r.clip for r in rows], [r.start_step for r in rows], max_steps=max_steps)
    decider.start_chunk(sim, state, rows, [decision_seed(seed, r.group, r.member, 0) for r in rows])
    n_decisions = np.zeros(len(rows), np.int64)
    stats.seconds["init"] += clock() - t0
    while not state.done.all():
        need = np.flatnonzero(sim.needs_decision(state))
        if len(need):
            t0 = clock()
            obs = sim.observe(state, need)
            t1 = clock()
            seeds = [decision_seed(seed, rows[b].group, rows[b].member, n_decisions[b]) for b in need]
            plans = decider.decide(sim, state, need, obs, seeds)
            if len(plans) != len(need):
                raise SimulationError(f"decide: {len(plans)} plans returned for {len(need)} rows")
            t2 = clock()
            kept = dict(zip(need.tolist(), obs)) if keep_observations else None
            state = sim.commit(state, dict(zip(need.tolist(), plans)), kept, h_reuse=h_reuse)
            n_decisions[need] += 1
            stats.decisions += len(need)
            t3 = clock()
            stats.seconds["observe"] += t1 - t0
            stats.seconds["plan"] += t2 - t1
            stats.seconds["commit"] += t3 - t2
        t0 = clock()
        running = int((~state.done).sum())
        before = int(state.done.sum())
        state, _ = sim.step(state)
        stats.env_steps += running
        stats.seconds["step"] += clock() - t0
        if progress is not None and int(state.done.sum()) > before:
            progress(int(state.done.sum()) - before)
    t0 = clock()
    out = []
    for b, r in enumerate(rows):
        trace = sim.trace(state, b)
        out.append(Rollout(group=r.group, member=r.member, trace=trace,
                           result=episode_outcome(trace, sim.params),
                           rewards=compute_rewards(trace, sim.params, rewards),
                           agent_track=tuple(state.agent_track(b)) if sim.reactive else ()))
    stats.seconds["finish"] += clock() - t0
    return out, stats


def run_rollouts(sim: Simulator, decider: DecisionMaker, clips: Sequence[Any], group_size: int = 1,
                 start_steps: int | Sequence[int] = 0, *, batch_size: int = 16, seed: int = 0,
                 h_reuse: int | None = None, max_steps: int | None = None,
                 rewards: Sequence[str] | None = None, keep_observations: bool = False,
                 progress: Callable[[int], None] | None = None) -> tuple[list[Rollout], RolloutStats]:
    """``group_size`` rollouts of every clip in chunks of ``batch_size`` rows, in this process."""
    rows = expand_rows(clips, group_size, start_steps)
    stats = RolloutStats()
    out: list[Rollout] = []
    for chunk in chunk_rows(rows, batch_size):
        res, st = run_chunk(sim, decider, chunk, seed=seed, h_reuse=h_reuse, max_steps=max_steps,
                            rewards=rewards, keep_observations=keep_observations, progress=progress)
        out += res
        stats.add(st)
    return out, stats
