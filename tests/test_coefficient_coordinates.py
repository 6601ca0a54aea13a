"""The acceptance models' coefficients sampled scaled to the data (``coefficients="data-scaled"``):
the same prior and posterior as the prior-scaled coordinates, through an affine map."""

import jax
import numpy as np
import numpyro
import pytest
from numpyro.infer.util import log_density

from sdsl_jax import PLANE, infer, load_acceptance
from sdsl_jax.acceptance import ACCEPTANCE_MODELS
from sdsl_jax.infer.models import CoefficientFrame, coefficient_frame, widened_priors
from sdsl_jax.infer.posterior import acceptance_numpyro_model

from test_model_effects import _crossed_pairs


def _ladder_models(name):
    pairs = load_acceptance("fits/ladder/acceptance.csv")
    draft, drafts, target, _ = pairs.model_index()
    m = ACCEPTANCE_MODELS[name]
    kw = dict(weights=pairs.regression_weights(), draft=draft, target=target)
    frame = coefficient_frame(m, pairs.ppl_draft, pairs.ppl_target, pairs.alpha, weights=kw["weights"],
                              pairs_per_model=pairs.alpha.size / drafts)
    shipped = acceptance_numpyro_model(m, pairs.ppl_draft, pairs.ppl_target, **kw)
    scaled = acceptance_numpyro_model(m, pairs.ppl_draft, pairs.ppl_target, frame=frame, **kw)
    return pairs, draft, target, frame, shipped, scaled


@pytest.mark.parametrize("name", ["plane", "logit-plane"])
def test_data_scaled_coefficients_carry_the_same_posterior(name):
    # The map coefficients = origin + unit * c is affine: at any point the joint log densities of the
    # two coordinates differ by its constant log Jacobian, sum(log unit). Leaving the prior's scale
    # unmapped (Normal(stated, stated_sd) on c) would make the gap depend on the point.
    jax.config.update("jax_enable_x64", True)
    pairs, draft, target, frame, (shipped, args), (scaled, scaled_args) = _ladder_models(name)
    assert len(scaled_args) == len(args) + 2 and all(np.array_equal(a, b) for a, b in zip(args, scaled_args))
    rng = np.random.default_rng(0)
    alpha = np.asarray(pairs.alpha)
    gaps = []
    for _ in range(3):
        coef = frame.origin + frame.unit * rng.normal(size=3)
        common = dict(sigma=0.01 * (1 + rng.random()), draft_sd=0.02, target_sd=0.005,
                      draft_z=rng.normal(size=int(draft.max()) + 1), target_z=rng.normal(size=int(target.max()) + 1))
        ours = log_density(shipped, args, dict(alpha=alpha), dict(common, centre=coef[0], slope_x=coef[1],
                                                                  slope_y=coef[2]))[0]
        theirs = log_density(scaled, scaled_args, dict(alpha=alpha),
                             dict(common, coefficients_c=(coef - frame.origin) / frame.unit))[0]
        gaps.append(float(theirs - ours))
    assert np.isfinite(gaps).all()
    np.testing.assert_allclose(gaps, np.sum(np.log(frame.unit)), rtol=0, atol=1e-6)


def test_the_frame_is_the_least_squares_fit_of_the_link():
    # The logit-plane's frame: weighted least squares of logit alpha on the standardised features,
    # checked against an independent solve of the normal equations.
    pairs = load_acceptance("fits/ladder/acceptance.csv")
    m = ACCEPTANCE_MODELS["logit-plane"]
    w = pairs.regression_weights()
    frame = coefficient_frame(m, pairs.ppl_draft, pairs.ppl_target, pairs.alpha, weights=w, pairs_per_model=4.0)
    u, v = (np.asarray(f) for f in m.features(pairs.ppl_draft, pairs.ppl_target))
    x = np.column_stack([np.ones_like(u), (u - u.mean()) / u.std(), (v - v.mean()) / v.std()])
    y = np.log(pairs.alpha / (1 - pairs.alpha))
    beta = np.linalg.solve(x.T @ (w[:, None] * x), x.T @ (w * y))
    np.testing.assert_allclose(frame.origin, beta, rtol=1e-6, atol=1e-9)
    sigma2 = np.sum(w * (y - x @ beta) ** 2) / (y.size - 3)
    np.testing.assert_allclose(frame.unit, np.sqrt(4.0 * sigma2 * np.diag(np.linalg.inv(x.T @ (w[:, None] * x)))),
                               rtol=1e-6)


def test_data_scaled_coefficients_carry_the_stated_prior_and_its_widening():
    # Prior draws of the coefficients in the data's coordinates are the stated prior's
    # (intercept Normal(0.5, 0.5), slopes Normal(0, 0.5) for the plane), and twice as wide
    # priors keep their means and double their sds, as the prior-scaled sites do.
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(1), drafts=6, targets=4)
    frame = coefficient_frame(PLANE, x, y, alpha, pairs_per_model=4.0)
    assert np.all(np.abs(frame.origin - np.array([0.5, 0.0, 0.0])) > 2 * frame.unit)  # far from the prior's centre
    model, args = acceptance_numpyro_model(PLANE, x, y, draft=di, target=ti, frame=frame)
    n = 8000
    for factor in (1.0, 2.0):
        draws = numpyro.infer.Predictive(widened_priors(model, factor), num_samples=n, parallel=True)(
            jax.random.PRNGKey(0), *args)
        coef = np.column_stack([draws["centre"], draws["slope_x"], draws["slope_y"]])
        sd = factor * np.array([0.5, 0.5, 0.5])
        assert np.all(np.abs(coef.mean(0) - np.array([0.5, 0.0, 0.0])) < 5 * sd / np.sqrt(n))
        np.testing.assert_allclose(coef.std(0), sd, rtol=0.03)


def test_data_scaled_draws_give_the_prior_scaled_likelihood():
    # The deterministic coefficient sites carry their prior-scaled meaning, so stacking and LOO read
    # a data-scaled posterior through the shipped model.
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(2), drafts=6, targets=4)
    frame = coefficient_frame(PLANE, x, y, alpha, pairs_per_model=4.0)
    model, args = acceptance_numpyro_model(PLANE, x, y, draft=di, target=ti, frame=frame)
    draws = numpyro.infer.Predictive(model, num_samples=40, parallel=True)(jax.random.PRNGKey(3), *args)
    draws.pop("alpha_obs")
    via_shipped = infer.acceptance_pointwise_log_likelihood(draws, PLANE, x, y, alpha, draft=di, target=ti)
    with jax.numpy_dtype_promotion("standard"):
        own = numpyro.infer.log_likelihood(model, dict(draws), *args, alpha=np.asarray(alpha))["alpha_obs"]
    assert np.all(np.isfinite(via_shipped)) and np.allclose(via_shipped, np.asarray(own), rtol=1e-9, atol=1e-9)


def test_an_undetermined_fit_keeps_the_stated_prior():
    stated = CoefficientFrame(np.array([0.5, 0.0, 0.0]), np.array([0.5, 0.5, 0.5]))
    three = coefficient_frame(PLANE, [10.0, 12.0, 14.0], [3.0, 3.5, 3.2], [0.6, 0.55, 0.5])
    constant = coefficient_frame(PLANE, [10.0, 12.0, 14.0, 16.0, 18.0], [3.0] * 5, [0.6, 0.55, 0.5, 0.45, 0.4])
    for frame in (three, constant):
        np.testing.assert_array_equal(frame.origin, stated.origin)
        np.testing.assert_array_equal(frame.unit, stated.unit)
    exact = coefficient_frame(PLANE, [10.0, 12.0, 14.0, 16.0], [3.0, 3.5, 3.2, 3.4],
                              0.9 - 0.02 * np.array([10.0, 12.0, 14.0, 16.0]) + 0.01 * np.array([3.0, 3.5, 3.2, 3.4]))
    assert np.all(np.isfinite(exact.unit)) and np.all(exact.unit > 0)


def test_unknown_coefficient_coordinates_are_refused():
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(0))
    with pytest.raises(ValueError, match="coefficients must be one of prior-scaled, data-scaled"):
        infer.sample_plane(x, y, alpha, draft=di, target=ti, coefficients="scaled", num_chains=1)
    with pytest.raises(ValueError, match="use effects='non-centred'"):
        infer.sample_plane(x, y, alpha, draft=di, target=ti, coefficients="data-scaled", effects="projected",
                           num_chains=1)


@pytest.mark.slow
def test_data_scaled_posterior_matches_the_prior_scaled_one():
    # Effects on the drafts only (the targets' scale on five targets diverges in any coordinates,
    # docs/benchmarks.md), so both posteriors pass their checks and their means can be compared
    # within their Monte Carlo errors.
    import arviz as az

    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(3))
    kw = dict(draft=di, target=ti, effect_sides=("draft",), num_chains=4, num_warmup=500, num_samples=500, seed=0,
              retries=2, progress_bar=False)
    old = infer.sample_plane(x, y, alpha, **kw)
    new = infer.sample_plane(x, y, alpha, coefficients="data-scaled", **kw)
    assert old.diagnostics.ok and new.diagnostics.ok, (old.diagnostics.problems, new.diagnostics.problems)
    for site in ("A", "B", "C", "draft_sd", "sigma"):
        a, b = (np.asarray(run.samples[site]).reshape(4, -1) for run in (old, new))  # chains x draws
        mcse = np.hypot(*(float(az.mcse(az.convert_to_dataset(v[None] if v.ndim == 1 else v))["x"]) for v in (a, b)))
        assert abs(a.mean() - b.mean()) < 4 * mcse, site


def test_chains_start_dispersed_about_the_frame():
    # Starts: the data-scaled coefficients from Normal(0, 3) in the frame's units (not the stated prior,
    # which lies far away in them), every other site from its prior; the sampled model keeps its prior.
    from sdsl_jax.infer.models import dispersed_about_frame
    from sdsl_jax.infer.sampler import prior_starts

    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(1), drafts=6, targets=4)
    frame = coefficient_frame(PLANE, x, y, alpha, pairs_per_model=4.0)
    model, args = acceptance_numpyro_model(PLANE, x, y, draft=di, target=ti, frame=frame)
    starts_model = dispersed_about_frame(model)
    assert dispersed_about_frame(model) is starts_model  # compiled once
    draws = numpyro.infer.Predictive(starts_model, num_samples=4000, parallel=True)(jax.random.PRNGKey(0), *args)
    stated = numpyro.infer.Predictive(model, num_samples=4000, parallel=True)(jax.random.PRNGKey(1), *args)
    c = np.asarray(draws["coefficients_c"])
    assert c.shape == (4000, 3)
    assert np.all(np.abs(c.mean(0)) < 5 * 3.0 / np.sqrt(4000)) and np.allclose(c.std(0), 3.0, rtol=0.05)
    # the stated prior in these units, far wider
    np.testing.assert_allclose(np.asarray(stated["coefficients_c"]).std(0), 0.5 / frame.unit, rtol=0.05)
    assert np.all(0.5 / frame.unit > 10 * 3.0)
    for site in ("sigma", "draft_sd", "target_sd"):
        assert np.asarray(draws[site]).std() == pytest.approx(np.asarray(stated[site]).std(), rel=0.1), site
    with pytest.raises(ValueError, match="observes nothing with these arguments"):
        prior_starts(starts_model, args, 2, 0)  # without alpha, alpha itself would be a start's latent site
    starts = prior_starts(starts_model, (*args, np.asarray(alpha)), 2, 0)  # unconstrained, one per chain
    c = np.asarray(starts["coefficients_c"])
    assert "alpha_obs" not in starts and c.shape == (2, 3) and np.all(np.abs(c) < 20)
