"""Loss-law and acceptance-plane presets, pytree behaviour, and the alpha estimators."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdsl_jax import (
    BESIROGLU2024,
    HOFFMANN2022,
    SDSL2026,
    AcceptancePlane,
    LossLaw,
    acceptance_from_counts,
    acceptance_from_distributions,
    acceptance_rate,
    perplexity,
    pretraining_loss,
)


def test_presets_hold_the_published_values():
    assert HOFFMANN2022 == LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
    assert BESIROGLU2024 == LossLaw(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
    assert SDSL2026 == AcceptancePlane(A=-0.0067, B=0.01297, C=0.642)


@pytest.mark.parametrize("law", [HOFFMANN2022, BESIROGLU2024])
def test_loss_law_formula(law, maybe_jit):
    n = np.geomspace(1e6, 1e12, 7)[:, None]
    d = np.geomspace(1e8, 1e13, 5)[None, :]
    want = law.E + law.A / n**law.alpha + law.B / d**law.beta
    np.testing.assert_allclose(maybe_jit(pretraining_loss)(n, d, law), want, rtol=1e-14)
    np.testing.assert_allclose(perplexity(n, d, law), np.exp(want), rtol=1e-13)


def test_loss_law_is_a_differentiable_pytree():
    n, d = 7e9, 1.4e11
    grads = jax.grad(pretraining_loss, argnums=2)(n, d, HOFFMANN2022)
    assert isinstance(grads, LossLaw)
    law = HOFFMANN2022
    assert float(grads.E) == 1.0
    assert float(grads.A) == pytest.approx(n**-law.alpha, rel=1e-13)
    assert float(grads.alpha) == pytest.approx(-law.A * np.log(n) * n**-law.alpha, rel=1e-12)
    assert float(grads.beta) == pytest.approx(-law.B * np.log(d) * d**-law.beta, rel=1e-12)
    # Posterior-style draws: a law whose fields are arrays broadcasts.
    draws = LossLaw(*(jnp.full((4,), v) for v in law))
    assert pretraining_loss(n, d, draws).shape == (4,)


@pytest.mark.parametrize("n, d", [(0.0, 1e9), (-1.0, 1e9), (1e9, 0.0)])
def test_loss_law_outside_model_is_nan(n, d):
    assert np.isnan(pretraining_loss(n, d))


def test_acceptance_plane():
    x, y = np.array([8.0, 20.0]), np.array([5.0, 6.0])
    np.testing.assert_allclose(acceptance_rate(x, y), -0.0067 * x + 0.01297 * y + 0.642, rtol=1e-15)
    assert np.isnan(acceptance_rate(0.5, 5.0))  # a perplexity below 1 is impossible
    g = jax.grad(acceptance_rate, argnums=2)(8.0, 5.0, SDSL2026)
    assert (float(g.A), float(g.B), float(g.C)) == (8.0, 5.0, 1.0)


@pytest.mark.parametrize("alpha, gamma", [(0.7, 5), (0.4, 3), (0.9, 8)])
def test_count_mle_recovers_alpha_where_accepted_over_drafted_does_not(alpha, gamma):
    rng = np.random.default_rng(123)
    # K = number of leading successes in gamma Bernoulli(alpha) trials.
    trials = rng.random((200_000, gamma)) < alpha
    accepted = np.where(trials.all(1), gamma, np.argmin(trials, axis=1))
    estimate = float(acceptance_from_counts(accepted, gamma))
    # Standard error of the MLE: sqrt(alpha (1 - alpha)^2 / E[sum K + R]) < 1e-3 here.
    assert estimate == pytest.approx(alpha, abs=4e-3)
    if alpha == 0.7:
        assert accepted.mean() / gamma == pytest.approx(0.39, abs=0.01)  # docs/theory.md's trap


def test_count_mle_edge_cases():
    assert np.isnan(acceptance_from_counts(np.zeros(0), 5))
    assert float(acceptance_from_counts(np.array([5, 5]), 5)) == 1.0
    assert float(acceptance_from_counts(np.array([0, 0]), 5)) == 0.0


def test_acceptance_from_distributions_is_one_minus_total_variation():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(11), size=(3, 50))
    q = rng.dirichlet(np.ones(11), size=(3, 50))
    want = 1 - 0.5 * np.abs(p - q).sum(-1).mean(-1)
    np.testing.assert_allclose(acceptance_from_distributions(p, q), want, rtol=1e-13)
