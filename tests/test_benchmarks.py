"""The benchmarks compare equal things: points inside the domain, starts that reach the optimum."""

import numpy as np
import pytest
import scipy.special

from experiments.benchmarks.inference import reached_share
from experiments.benchmarks.numerics import lambertw_points


def test_lambert_w_points_lie_inside_the_real_domain_of_both_branches():
    for k in (0, -1):
        z = lambertw_points(k, 1000)
        assert z.min() >= -1 / np.e and np.isfinite(scipy.special.lambertw(z, k).real).all()


def test_the_share_of_starts_reaching_the_optimum_counts_only_those_within_the_tolerance():
    best = 1.0e-3
    values = np.array([best, best * (1 + 5e-10), best * (1 + 1e-6), np.nan, 2 * best])
    assert reached_share(values, best) == 2 / 5


def test_scaling_runs_only_the_tables_asked_for(monkeypatch, capsys):
    from experiments import bench
    from experiments.benchmarks import scaling

    ran = []
    for part in ("_scaling_point_fit", "_scaling_nuts"):
        monkeypatch.setattr(scaling, part, lambda part=part: ran.append(part) or [])
    monkeypatch.setattr(scaling, "_scaling_n_star", lambda repeats: ran.append("_scaling_n_star") or [])
    assert bench.main(["--only", "scaling", "--scaling-parts", "nuts,n_star"]) == 0
    assert ran == ["_scaling_n_star", "_scaling_nuts"]
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--only", "scaling", "--scaling-parts", "nstar"])
    assert exit_.value.code == 2 and "nstar" in capsys.readouterr().err


def test_every_family_of_the_forms_benchmark_is_fitted_to_runs_that_identify_it():
    from experiments.benchmarks.numerics import forms_pretraining
    from sdsl_jax import FAMILIES, load_pretraining
    from sdsl_jax.infer.point import check_loss_law_data

    for family in FAMILIES.values():
        runs = load_pretraining(forms_pretraining(family.name))
        check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=family)  # raises if not


def test_the_data_scaled_acceptance_coordinates_carry_the_shipped_posterior():
    """The warm-up benchmark's coefficients scaled to the data are an affine map of the shipped ones:
    at any point the two models' joint log densities differ by the map's constant log Jacobian."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer.util import log_density

    from experiments.benchmarks.inference import _data_scaled_plane_model, _least_squares_coefficients
    from sdsl_jax import load_acceptance
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.infer.models import _feature_scales
    from sdsl_jax.infer.posterior import acceptance_numpyro_model

    jax.config.update("jax_enable_x64", True)
    pairs = load_acceptance("fits/ladder/acceptance.csv")
    draft, _, target, _ = pairs.model_index()
    rng = np.random.default_rng(0)
    for name in ("plane", "logit-plane"):
        m = ACCEPTANCE_MODELS[name]
        shipped, args = acceptance_numpyro_model(m, pairs.ppl_draft, pairs.ppl_target, weights=pairs.regression_weights(),
                                                 draft=draft, target=target)
        u, v, scales = _feature_scales(m, *args[:2])
        centre, unit = _least_squares_coefficients(m, u, v, scales, pairs.alpha, pairs.regression_weights(), 5.0)
        scaled = _data_scaled_plane_model(m, scales, jnp.asarray(centre), jnp.asarray(unit))
        alpha = jnp.asarray(pairs.alpha)
        gaps = []
        for _ in range(2):
            coef = centre + unit * rng.normal(size=3)
            common = dict(sigma=0.01 * (1 + rng.random()), draft_sd=0.02, target_sd=0.005,
                          draft_z=rng.normal(size=int(draft.max()) + 1), target_z=rng.normal(size=int(target.max()) + 1))
            ours = log_density(shipped, args, dict(alpha=alpha),
                               dict(common, centre=coef[0], slope_x=coef[1], slope_y=coef[2]))[0]
            theirs = log_density(scaled, (u, v, *args[2:]), dict(alpha=alpha), dict(common, c=(coef - centre) / unit))[0]
            gaps.append(float(theirs - ours))
        assert np.isfinite(gaps).all()
        np.testing.assert_allclose(gaps, np.sum(np.log(unit)), rtol=0, atol=1e-6)
