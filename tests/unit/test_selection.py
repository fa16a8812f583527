"""Candidate distribution (rad2_planner.selection): hand-computed probabilities, entropy, top-K, draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rad2_core.config import load_params
from rad2_planner.selection import (
    CandidateDistribution,
    adaptive_top_k,
    entropy,
    log_prob_of,
    log_probs,
    probabilities,
    sample,
)

LN3 = math.log(3.0)


def test_softmax_of_zero_and_ln3_is_quarter_three_quarters():
    assert np.allclose(probabilities([0.0, LN3]), [0.25, 0.75], atol=1e-12)
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - (3/4) ln 3
    assert entropy([0.0, LN3]) == pytest.approx(math.log(4.0) - 0.75 * LN3, abs=1e-12)
    assert log_prob_of([0.0, LN3], 1) == pytest.approx(math.log(0.75), abs=1e-12)


def test_temperature_divides_the_logits():
    d = CandidateDistribution("softmax", temperature=2.0)
    assert np.allclose(probabilities([0.0, 2 * LN3], d), [0.25, 0.75], atol=1e-12)


def test_normalized_sigmoid_renormalises_the_scores():
    # sigma(0) = 1/2, sigma(ln 3) = 3/4 -> [0.5, 0.75] / 1.25
    d = CandidateDistribution("normalized_sigmoid")
    assert np.allclose(probabilities([0.0, LN3], d), [0.4, 0.6], atol=1e-12)


def test_uniform_ignores_the_logits_and_has_entropy_ln_m():
    d = CandidateDistribution("uniform")
    logits = np.full(5, np.nan)  # not scored: allowed for the uniform distribution
    assert np.allclose(probabilities(logits, d), 0.2)
    assert entropy(logits, d) == pytest.approx(math.log(5.0))
    draw = sample(logits, np.random.default_rng(0), d)
    assert draw.log_prob == pytest.approx(-math.log(5.0)) and draw.entropy == pytest.approx(math.log(5.0))


def test_large_logits_are_stable_in_log_space():
    assert np.allclose(probabilities([1000.0, 1000.0 + LN3]), [0.25, 0.75], atol=1e-12)
    # log sigma(-1000) = -1000 (to 1e-300) and log sigma(0) = -ln 2, so log p_0 = -1000 + ln 2.
    d = CandidateDistribution("normalized_sigmoid")
    assert log_prob_of([-1000.0, 0.0], 0, d) == pytest.approx(-1000.0 + math.log(2.0), abs=1e-9)
    assert np.isfinite(entropy([-1e6, 0.0, 1e6]))


def test_non_finite_logits_are_a_clear_error():
    with pytest.raises(ValueError, match="logits: contains NaN"):
        probabilities([0.0, np.nan])
    with pytest.raises(ValueError, match="row_logits: contains infinite"):
        sample([0.0, np.inf], np.random.default_rng(0), name="row_logits")
    with pytest.raises(ValueError, match=r"logits: shape \(0,\)"):
        probabilities(np.zeros(0))


def test_adaptive_k_formula_rounds_half_up_and_clips():
    assert adaptive_top_k(0.0, 2, 6, 32) == 4  # 2 + 4 * 1/2
    assert adaptive_top_k(0.0, 2, 3, 32) == 3  # 2.5 rounds up (np.round would give 2)
    assert adaptive_top_k(50.0, 2, 40, 8) == 8  # clipped to M
    assert np.array_equal(adaptive_top_k(np.array([0.0, 50.0]), 1, 5, 32), [3, 5])


def test_top_k_with_known_entropy():
    # p = [1/2, 1/4, 1/8, 1/8]: H = 1.75 ln 2, sigma(H) = 1 / (1 + 2^-1.75) = 0.7708
    logits = np.log([4.0, 2.0, 1.0, 1.0])
    h = 1.75 * math.log(2.0)
    assert entropy(logits) == pytest.approx(h)
    k3 = CandidateDistribution(top_k="entropy", top_k_min=1, top_k_max=3)  # K = round(2.54) = 3
    assert np.allclose(probabilities(logits, k3), [4 / 7, 2 / 7, 1 / 7, 0.0], atol=1e-12)
    assert entropy(logits, k3) == pytest.approx(-sum(p * math.log(p) for p in (4 / 7, 2 / 7, 1 / 7)))
    assert log_prob_of(logits, 3, k3) == -np.inf
    k2 = CandidateDistribution(top_k="entropy", top_k_min=1, top_k_max=2)  # K = round(1.77) = 2
    assert np.allclose(probabilities(logits, k2), [2 / 3, 1 / 3, 0.0, 0.0], atol=1e-12)


def test_top_k_ties_go_to_the_lower_index():
    # six equal logits: H = ln 6, sigma = 6/7, K = round(1 + 3 * 6/7) = 4 -> candidates 0..3
    d = CandidateDistribution(top_k="entropy", top_k_min=1, top_k_max=4)
    assert np.allclose(probabilities(np.zeros(6), d), [0.25] * 4 + [0.0] * 2)
    assert entropy(np.zeros(6), d) == pytest.approx(math.log(4.0))


def test_sampling_frequencies_with_a_seeded_generator():
    n = 20000
    draw = sample(np.tile([0.0, LN3], (n, 1)), np.random.default_rng(123))
    assert draw.index.shape == (n,) and abs(draw.index.mean() - 0.75) < 0.015  # 5 sigma
    assert np.allclose(draw.log_prob, np.log(np.where(draw.index == 1, 0.75, 0.25)))
    again = sample(np.tile([0.0, LN3], (n, 1)), np.random.default_rng(123))
    assert np.array_equal(draw.index, again.index)
    k3 = CandidateDistribution(top_k="entropy", top_k_min=1, top_k_max=3)
    top = sample(np.tile(np.log([4.0, 2.0, 1.0, 1.0]), (n, 1)), np.random.default_rng(7), k3)
    freq = np.bincount(top.index, minlength=4) / n
    assert freq[3] == 0.0 and np.allclose(freq[:3], [4 / 7, 2 / 7, 1 / 7], atol=0.02)


def test_batched_shapes_and_log_prob_of_rows():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 5))
    assert probabilities(logits).shape == (2, 3, 5) and np.allclose(probabilities(logits).sum(-1), 1.0)
    assert entropy(logits).shape == (2, 3)
    draw = sample(logits, rng)
    assert draw.index.shape == (2, 3) and draw.probs.shape == (2, 3, 5)
    assert np.allclose(log_prob_of(logits, draw.index), draw.log_prob)
    assert np.allclose(log_probs(logits), np.log(draw.probs))
    with pytest.raises(ValueError, match=r"index: values .* out of range \[0, 5\)"):
        log_prob_of(logits[0, 0], 5)
    with pytest.raises(ValueError, match="index: expected integers of shape"):
        log_prob_of(logits, 0)


def test_configuration_errors_name_the_field():
    with pytest.raises(ValueError, match="distribution: unknown value 'gumbel'"):
        CandidateDistribution("gumbel")
    with pytest.raises(ValueError, match="temperature: must be a finite number > 0, got 0"):
        CandidateDistribution(temperature=0.0)
    with pytest.raises(ValueError, match='top_k: unknown value False .*write "off"'):
        CandidateDistribution(top_k=False)
    with pytest.raises(ValueError, match="top_k_min: top_k 'entropy' needs an integer >= 1, got None"):
        CandidateDistribution(top_k="entropy", top_k_max=4)
    with pytest.raises(ValueError, match=r"top_k_min \(5\) must not exceed top_k_max \(4\)"):
        CandidateDistribution(top_k="entropy", top_k_min=5, top_k_max=4)
    with pytest.raises(ValueError, match="needs a scored distribution"):
        CandidateDistribution("uniform", top_k="entropy", top_k_min=1, top_k_max=4)
    with pytest.raises(ValueError, match="rng: expected a numpy.random.Generator"):
        sample([0.0, 1.0], np.random.RandomState(0))


def test_from_params_reads_planner_yaml():
    p = dict(load_params("planner")["planner"])
    d = CandidateDistribution.from_params(p)
    assert d.kind == p["selection_distribution"] and d.temperature == p["selection_temperature"]
    assert d.top_k == p["selection_top_k"] == "off"
    p.update(selection_top_k="entropy", selection_distribution="normalized_sigmoid")
    d = CandidateDistribution.from_params(p)
    assert (d.top_k_min, d.top_k_max) == (p["selection_top_k_min"], p["selection_top_k_max"])
    assert d.label == "normalized_sigmoid+topk"
    del p["selection_temperature"]
    with pytest.raises(ValueError, match="missing parameter 'planner.selection_temperature'"):
        CandidateDistribution.from_params(p)


def test_medoid_is_the_candidate_nearest_the_others_on_average():
    from rad2_planner.candidates import medoid_index

    t = np.arange(1, 9, dtype=np.float64)[:, None]
    straight = np.hstack([t * 2.0, 0 * t])
    fan = np.stack([straight + [0.0, dy] for dy in (-3.0, -1.0, 0.2, 1.0, 3.0)]).astype(np.float32)
    assert medoid_index(fan) == 2  # the lateral offsets' median
    rng = np.random.default_rng(3)
    for m in (1, 2, 7, 40):
        c = rng.normal(0.0, 5.0, (m, 8, 2)).astype(np.float32)
        brute = [np.mean([np.linalg.norm(c[i] - c[j], axis=-1).mean() for j in range(m)]) for i in range(m)]
        assert medoid_index(c) == int(np.argmin(brute))


def test_allowed_mask_restricts_and_renormalises_the_distribution():
    allowed = np.array([True, False, True])
    # softmax over the allowed [0, ln 3] only: 1/4, 0, 3/4 (the excluded one had the largest logit)
    assert np.allclose(probabilities([0.0, 5.0, LN3], allowed=allowed), [0.25, 0.0, 0.75], atol=1e-12)
    assert log_prob_of([0.0, 5.0, LN3], 1, allowed=allowed) == -np.inf
    u = CandidateDistribution("uniform")
    assert np.allclose(probabilities([0.0, 0.0, 0.0], u, allowed=allowed), [0.5, 0.0, 0.5])
    assert entropy([0.0, 0.0, 0.0], u, allowed=allowed) == pytest.approx(math.log(2.0))
    draws = sample(np.zeros((500, 3)), np.random.default_rng(0), allowed=np.tile(allowed, (500, 1)))
    assert set(draws.index.tolist()) == {0, 2} and np.all(draws.probs[:, 1] == 0.0)
    with pytest.raises(ValueError, match="allowed"):
        probabilities([0.0, 1.0], allowed=np.array([False, False]))
    with pytest.raises(ValueError, match="allowed"):
        probabilities([0.0, 1.0], allowed=np.array([1, 0]))
