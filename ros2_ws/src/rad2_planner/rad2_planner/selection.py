"""The stochastic policy over one cycle's candidates: a categorical distribution from discriminator logits.

RAD-2 trains its discriminator by reinforcement learning (§3.1.2, §3.3.2): in a training rollout the
trajectory the ego executes is *drawn* from a distribution over the M candidates the generator
proposed, weighted by the discriminator's preference, so that the update can raise the probability
of candidates that led to good closed-loop outcomes. Deployment keeps the deterministic argmax
(:mod:`rad2_planner.policy`); this module (NumPy only) defines the training-time distribution, how to
draw from it, and the log-probabilities and entropy the policy-gradient update needs.

Distributions over candidates m = 0..M-1 given logits l_m (``CandidateDistribution.kind``):

- ``softmax`` (default): p_m ∝ exp(l_m / T) with temperature T > 0 (small T approaches the argmax,
  large T the uniform distribution).
- ``normalized_sigmoid``: p_m ∝ σ(l_m / T), the discriminator's own scores renormalised over the set
  (at T = 1 exactly σ(l_m) / Σ_j σ(l_j)). Flatter than softmax because every score is at most 1.
- ``uniform``: p_m = 1/M whatever the logits (they may be NaN, i.e. not computed). A random
  candidate: for scenario curation and for rollouts before the discriminator has been trained.

Optional entropy-adaptive top-K (``top_k="entropy"``, in the spirit of R1Sim's adaptive sampling):
with H the entropy (nats) of the full distribution above,
``K = round(k_min + (k_max - k_min) * σ(H))``, clipped to [1, M]; the K most probable candidates
keep their probabilities, renormalised, the others get probability 0. A peaked distribution (small
H) is thus sampled among fewer candidates than a flat one. Because H ≥ 0, σ(H) ≥ 1/2, so K is never
below the midpoint (k_min + k_max) / 2. Rounding is half-up; ties in probability go to the lower
candidate index (stable sort), so the result is deterministic.

Optional ``allowed`` mask ``[..., M]`` (bool): the distribution is restricted to the allowed candidates
(renormalised over them; the others get probability 0) before top-K. The planner passes the candidates
that its constant-velocity overlap check keeps (``planner.discriminator_candidates: safe``), so the
discriminator learns and decides among those only. A row must allow at least one candidate.

Every function takes logits ``[..., M]`` (one row or a batch of rows) and works on the last axis; all
quantities are computed in log space with log-sum-exp, so large logits neither overflow nor lose
the small probabilities. ``log_probs``, ``entropy``, ``sample`` and ``log_prob_of`` all describe the
distribution actually sampled from (after top-K). Logits that are NaN or infinite raise ValueError
naming the field (for the scored distributions; ``uniform`` ignores their values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

DISTRIBUTIONS = ("softmax", "normalized_sigmoid", "uniform")
TOP_K_MODES = ("off", "entropy")


@dataclass(frozen=True)
class CandidateDistribution:
    """How a cycle's candidate is drawn: ``kind`` (see module doc), ``temperature`` (> 0, divides the
    logits of the scored kinds), ``top_k`` ``"off"`` | ``"entropy"`` with ``top_k_min`` ≤
    ``top_k_max`` (candidate counts, ≥ 1; required for ``"entropy"``)."""

    kind: str = "softmax"
    temperature: float = 1.0
    top_k: str = "off"
    top_k_min: int | None = None
    top_k_max: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ValueError(f"distribution: unknown value {self.kind!r} (choose from {DISTRIBUTIONS})")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float, np.number)) or not np.isfinite(t) or t <= 0:
            raise ValueError(f"temperature: must be a finite number > 0, got {t!r}")
        if self.top_k not in TOP_K_MODES:
            hint = ' (an unquoted YAML off is the boolean False: write "off")' if self.top_k is False else ""
            raise ValueError(f"top_k: unknown value {self.top_k!r} (choose from {TOP_K_MODES}){hint}")
        if self.top_k == "entropy":
            self._check_top_k_bounds()

    def _check_top_k_bounds(self) -> None:
        for name in ("top_k_min", "top_k_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: top_k 'entropy' needs an integer >= 1, got {v!r}")
        if self.top_k_min > self.top_k_max:
            raise ValueError(f"top_k_min ({self.top_k_min}) must not exceed top_k_max ({self.top_k_max})")
        if self.kind == "uniform":
            # Every candidate ties under the uniform distribution: "the K most probable" is undefined.
            raise ValueError("top_k 'entropy' needs a scored distribution (softmax | normalized_sigmoid)")

    @classmethod
    def from_params(cls, planner: dict[str, Any]) -> CandidateDistribution:
        """From the ``planner:`` block of params/planner.yaml (``selection_*`` keys)."""

        def get(key: str) -> Any:
            if key not in planner:
                raise ValueError(f"missing parameter 'planner.{key}' (params/planner.yaml)")
            return planner[key]

        entropy_k = get("selection_top_k") == "entropy"
        return cls(
            kind=get("selection_distribution"),
            temperature=get("selection_temperature"),
            top_k=get("selection_top_k"),
            top_k_min=get("selection_top_k_min") if entropy_k else None,
            top_k_max=get("selection_top_k_max") if entropy_k else None,
        )

    @property
    def needs_logits(self) -> bool:
        """Whether the distribution depends on the discriminator (everything but ``uniform``)."""
        return self.kind != "uniform"

    @property
    def label(self) -> str:
        """Short name for logs, e.g. ``softmax`` or ``softmax+topk``."""
        return self.kind + ("+topk" if self.top_k == "entropy" else "")


SOFTMAX = CandidateDistribution()


class Draw(NamedTuple):
    """One draw per row: ``index [...]`` int64, ``log_prob [...]`` and ``entropy [...]`` (nats) of the
    distribution sampled from, ``probs [..., M]`` that distribution."""

    index: np.ndarray
    log_prob: np.ndarray
    entropy: np.ndarray
    probs: np.ndarray


def _check_logits(logits: Any, dist: CandidateDistribution, name: str) -> np.ndarray:
    a = np.asarray(logits, dtype=np.float64)
    if a.ndim < 1 or a.shape[-1] < 1:
        raise ValueError(f"{name}: shape {a.shape}, expected [..., M] with M >= 1 candidates")
    if dist.needs_logits and not np.all(np.isfinite(a)):
        bad = "NaN" if np.isnan(a).any() else "infinite"
        raise ValueError(
            f"{name}: contains {bad} values (the {dist.kind} distribution needs finite discriminator "
            "logits; were the candidates scored?)"
        )
    return a


def _log_normalize(x: np.ndarray) -> np.ndarray:
    """``x - logsumexp(x)`` over the last axis; -inf entries stay -inf (need one finite entry)."""
    top = np.max(x, axis=-1, keepdims=True)
    return x - (top + np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True)))


def _full_log_probs(a: np.ndarray, dist: CandidateDistribution) -> np.ndarray:
    """Log-probabilities of the distribution before top-K truncation."""
    if dist.kind == "uniform":
        return np.full(a.shape, -np.log(a.shape[-1]))
    z = a / dist.temperature
    if dist.kind == "normalized_sigmoid":
        z = -np.logaddexp(0.0, -z)  # log σ(z), exact for large |z|
    return _log_normalize(z)


def _entropy_of(logp: np.ndarray) -> np.ndarray:
    # 0·log 0 = 0: excluded candidates (log p = -inf) contribute nothing (and 0·-inf would be NaN).
    finite = np.where(np.isfinite(logp), logp, 0.0)
    return -np.sum(np.exp(logp) * finite, axis=-1)


def adaptive_top_k(entropy_nats: Any, k_min: int, k_max: int, m: int) -> np.ndarray:
    """``round(k_min + (k_max - k_min)·σ(H))`` half-up, clipped to [1, m] (an int array like H)."""
    sig = 1.0 / (1.0 + np.exp(-np.asarray(entropy_nats, dtype=np.float64)))
    k = np.floor(k_min + (k_max - k_min) * sig + 0.5).astype(np.int64)
    return np.clip(k, 1, m)


def _truncate_top_k(logp: np.ndarray, dist: CandidateDistribution) -> np.ndarray:
    k = adaptive_top_k(_entropy_of(logp), dist.top_k_min, dist.top_k_max, logp.shape[-1])
    order = np.argsort(-logp, axis=-1, kind="stable")  # most probable first, ties by lower index
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(logp.shape[-1]), axis=-1)
    kept = np.where(rank < k[..., None], logp, -np.inf)
    return _log_normalize(kept)


def _restrict(logp: np.ndarray, allowed: Any) -> np.ndarray:
    mask = np.asarray(allowed)
    if mask.dtype != bool or mask.shape != logp.shape:
        raise ValueError(f"allowed: expected a bool mask of shape {logp.shape}, "
                         f"got {mask.dtype} {mask.shape}")
    if not mask.any(axis=-1).all():
        raise ValueError("allowed: a row allows no candidate (at least one must be allowed)")
    return _log_normalize(np.where(mask, logp, -np.inf))


def log_probs(logits: Any, dist: CandidateDistribution | None = None, name: str = "logits",
              allowed: Any = None) -> np.ndarray:
    """Log-probabilities ``[..., M]`` (float64) of the distribution sampled from; -inf when not
    ``allowed`` or excluded by top-K."""
    dist = dist or SOFTMAX
    logp = _full_log_probs(_check_logits(logits, dist, name), dist)
    if allowed is not None:
        logp = _restrict(logp, allowed)
    return _truncate_top_k(logp, dist) if dist.top_k == "entropy" else logp


def probabilities(logits: Any, dist: CandidateDistribution | None = None, name: str = "logits",
                  allowed: Any = None) -> np.ndarray:
    """Probabilities ``[..., M]`` (rows sum to 1) of the distribution sampled from."""
    return np.exp(log_probs(logits, dist, name, allowed))


def entropy(logits: Any, dist: CandidateDistribution | None = None, name: str = "logits",
            allowed: Any = None) -> np.ndarray:
    """Entropy ``[...]`` in nats of the distribution sampled from (after top-K)."""
    return _entropy_of(log_probs(logits, dist, name, allowed))


def log_prob_of(
    logits: Any, index: Any, dist: CandidateDistribution | None = None, name: str = "logits",
    allowed: Any = None,
) -> np.ndarray:
    """Log-probability ``[...]`` of candidate ``index [...]`` (one per row; -inf if not allowed or
    excluded by top-K).

    The RL importance ratio compares this under the current logits with the recorded ``log_prob``.
    """
    logp = log_probs(logits, dist, name, allowed)
    idx = np.asarray(index)
    m = logp.shape[-1]
    if idx.shape != logp.shape[:-1] or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"index: expected integers of shape {logp.shape[:-1]}, got {idx.dtype} {idx.shape}")
    if np.any((idx < 0) | (idx >= m)):
        raise ValueError(f"index: values {idx.tolist()} out of range [0, {m})")
    return np.take_along_axis(logp, idx[..., None], axis=-1)[..., 0]


def sample(
    logits: Any, rng: np.random.Generator, dist: CandidateDistribution | None = None, name: str = "logits",
    allowed: Any = None,
) -> Draw:
    """Draw one candidate per row with ``rng`` (one uniform number per row, inverse CDF)."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    logp = log_probs(logits, dist, name, allowed)
    p = np.exp(logp)
    cdf = np.cumsum(p, axis=-1)
    # Scale u by the row's total so rounding in the cumsum can never push the draw past the last
    # candidate with p > 0; zero-probability candidates are never chosen (their CDF step is flat).
    u = rng.random(logp.shape[:-1])[..., None] * cdf[..., -1:]
    index = np.sum(cdf <= u, axis=-1).astype(np.int64)
    log_prob = np.take_along_axis(logp, index[..., None], axis=-1)[..., 0]
    return Draw(index=index, log_prob=log_prob, entropy=_entropy_of(logp), probs=p)
