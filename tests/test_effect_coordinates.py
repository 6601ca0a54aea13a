"""The projected coordinates of the acceptance model with per-model effects: the same prior and likelihood
as the non-centred model, in coordinates where an effect cannot trade against a coefficient."""

import jax
import numpy as np
import numpyro
import pytest

from sdsl_jax import PLANE, infer
from sdsl_jax.infer.models import effect_basis, model_effects_plane_model_for, widened_priors
from sdsl_jax.infer.posterior import acceptance_numpyro_model

from test_model_effects import _crossed_pairs


def test_effect_basis_is_orthogonal_and_spans_the_group_design():
    rng = np.random.default_rng(0)
    group = rng.integers(0, 7, 40)
    group[:7] = np.arange(7)
    feature = rng.standard_normal(7)[group]  # one value per group, as a draft's perplexity is
    inside, rest, coefficients = effect_basis(group, feature, 9)  # slots 7 and 8 have no rows
    basis = np.hstack([inside, rest])
    assert basis.shape == (9, 9) and np.allclose(basis.T @ basis, np.eye(9), atol=1e-12)
    means = np.array([feature[group == g].mean() if np.any(group == g) else 0.0 for g in range(9)])
    design = np.column_stack([np.ones(9), means])
    assert inside.shape == (9, 2) and np.allclose(design @ coefficients, inside, atol=1e-12)
    assert np.allclose(rest.T @ design, 0.0, atol=1e-12)  # the rest cannot move the intercept or the slope


def test_effect_basis_of_a_constant_feature_has_rank_one():
    inside, rest, coefficients = effect_basis(np.arange(5), np.full(5, 2.0), 5)
    assert inside.shape == (5, 1) and rest.shape == (5, 4) and coefficients.shape == (2, 1)
    assert np.allclose(np.column_stack([np.ones(5), np.full(5, 2.0)]) @ coefficients, inside)


def _design(effects):
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(1), drafts=6, targets=4)
    model, args = acceptance_numpyro_model(PLANE, x, y, weights=np.linspace(1, 2, x.size), draft=di, target=ti,
                                           effects=effects)
    return model, args, alpha


def _prior_draws(model, args, n, seed):
    draws = numpyro.infer.Predictive(model, num_samples=n, parallel=True)(jax.random.PRNGKey(seed), *args)
    return np.column_stack([draws["A"], draws["B"], draws["C"], draws["draft_sd"], draws["target_sd"],
                            draws["draft_sd"][:, None] * draws["draft_z"],
                            draws["target_sd"][:, None] * draws["target_z"]])


def test_projected_coordinates_carry_the_same_prior():
    # The same prior in other coordinates: the coefficients, the scales and every model's effect
    # have the same means, sds and correlations (A and the draft effects are independent a priori,
    # whatever the coordinates couple).
    n = 20000
    old = _prior_draws(*_design("non-centred")[:2], n, 0)
    new = _prior_draws(*_design("projected")[:2], n, 1)
    se = old.std(0) / np.sqrt(n)
    assert np.all(np.abs(new.mean(0) - old.mean(0)) < 5 * np.sqrt(2) * se)
    # The coefficients and scales to 3% (about 6 standard errors); each effect is a scale times a
    # normal, heavy-tailed and sharing its scale with the other effects, so to 8%.
    assert np.allclose(new.std(0)[:5], old.std(0)[:5], rtol=0.03)
    assert np.allclose(new.std(0)[5:], old.std(0)[5:], rtol=0.08)
    assert np.allclose(np.corrcoef(new, rowvar=False), np.corrcoef(old, rowvar=False), atol=0.05)
    # The effects keep their prior variance, E[sd^2] = effect_prior_sd^2: a coordinate change that
    # forgot the conditional's covariance would shrink them.
    assert np.var(new[:, 5:11]) == pytest.approx(PLANE.effect_prior_sd**2, rel=0.05)


def test_projected_draws_give_the_non_centred_likelihood():
    # Deterministic sites carry the non-centred model's meaning: its likelihood of the projected
    # draws equals the projected model's own.
    model, args, alpha = _design("projected")
    draws = numpyro.infer.Predictive(model, num_samples=50, parallel=True)(jax.random.PRNGKey(2), *args)
    draws.pop("alpha_obs")
    x, y, _, di, ti = _crossed_pairs(np.random.default_rng(1), drafts=6, targets=4)
    via_old = infer.acceptance_pointwise_log_likelihood(draws, PLANE, x, y, alpha, weights=np.linspace(1, 2, x.size),
                                                        draft=di, target=ti)
    with jax.numpy_dtype_promotion("standard"):
        own = numpyro.infer.log_likelihood(model, {k: v for k, v in draws.items()}, *args,
                                           alpha=np.asarray(alpha))["alpha_obs"]
    assert np.all(np.isfinite(via_old)) and np.allclose(via_old, np.asarray(own), rtol=1e-9, atol=1e-9)


def test_wider_priors_widen_the_coefficients_held_in_the_transform():
    model, args, _ = _design("projected")
    base = _prior_draws(model, args, 8000, 3)
    wide = _prior_draws(widened_priors(model, 2.0), args, 8000, 3)
    old_wide = _prior_draws(widened_priors(model_effects_plane_model_for(PLANE), 2.0),
                            _design("non-centred")[1], 8000, 4)
    # A, B, C and both scales twice as wide, as the non-centred model's sites are.
    assert np.allclose(wide[:, :5].std(0) / base[:, :5].std(0), 2.0, rtol=0.06)
    assert np.allclose(wide[:, :5].std(0), old_wide[:, :5].std(0), rtol=0.06)


def test_unknown_effect_coordinates_are_refused():
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(0))
    with pytest.raises(ValueError, match="effects must be one of non-centred, projected"):
        infer.sample_plane(x, y, alpha, draft=di, target=ti, effects="centred", num_chains=1)


@pytest.mark.slow
def test_projected_posterior_matches_the_non_centred_one():
    # The same model in other coordinates, so the same posterior, where both runs have mixed: their
    # chains agree and hold enough effective draws (the library's checks), after the shipped policy's
    # reruns (without them a chain of either run can stick, and the means of a stuck run say nothing).
    # On this design a few divergent transitions remain in both coordinates at every target acceptance
    # the reruns reach (0.975): the comparison tolerates them, under 0.5% of the draws.
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(3))
    kw = dict(draft=di, target=ti, num_chains=2, num_warmup=400, num_samples=600, seed=0, progress_bar=False,
              retries=2)
    old = infer.sample_plane(x, y, alpha, effects="non-centred", **kw)
    new = infer.sample_plane(x, y, alpha, effects="projected", **kw)
    for run in (old, new):  # every check passed but for those few divergences
        d = run.diagnostics
        assert all("divergent" in problem for problem in d.problems), d
        assert d.num_divergences < 0.005 * run.samples["A"].size, d
    for site in ("A", "B", "C", "draft_sd", "sigma"):
        a, b = old.samples[site], new.samples[site]
        assert abs(a.mean() - b.mean()) < 0.25 * a.std(), site
    assert new.diagnostics.median_steps <= old.diagnostics.median_steps
