"""Posterior-predictive rankings: new models' residual scatter in P(best) and the T bands."""

import types

import numpy as np
import pytest

from sdsl_jax import HOFFMANN2022, SDSL2026, LossLaw, infer, predict

N = np.array([3e7, 1e8, 3e8])
D = np.array([6e11, 1e12, 2e12])
M, D_TARGET = 7e10, 1.4e12


def _point():
    return types.SimpleNamespace(law=HOFFMANN2022, plane=SDSL2026)


def _draws(count, seed=0):
    rng = np.random.default_rng(seed)
    law = LossLaw(*(np.asarray(v) * (1 + 0.01 * rng.standard_normal(count)) for v in HOFFMANN2022))
    plane = type(SDSL2026)(*(np.full(count, v) for v in SDSL2026))
    return law, plane


def test_zero_residuals_reproduce_the_mean_only_ranking():
    draws = _draws(400)
    zeros = predict.PredictiveScales(np.zeros(400), np.full(400, 5.0), np.zeros(400))
    kw = dict(n_drafts=N, d_drafts=D, m_target=M, d_target=D_TARGET, draws=draws)
    mean_only = predict.rank_drafts(_point(), **kw)
    predictive = predict.rank_drafts(_point(), scales=zeros, **kw)
    np.testing.assert_allclose(predictive.p_best, mean_only.p_best)
    np.testing.assert_allclose(predictive.throughput_band, mean_only.throughput_band, rtol=1e-9)


def test_residuals_spread_p_best_and_widen_the_bands():
    draws = _draws(2000)
    kw = dict(n_drafts=N, d_drafts=D, m_target=M, d_target=D_TARGET, draws=draws)
    mean_only = predict.rank_drafts(_point(), **kw)
    scales = predict.PredictiveScales(np.full(2000, 0.05), np.full(2000, 10.0), np.full(2000, 0.02))
    predictive = predict.rank_drafts(_point(), scales=scales, seed=1, **kw)
    assert np.isclose(predictive.p_best.sum(), 1.0)
    entropy = [-np.sum(p[p > 0] * np.log(p[p > 0])) for p in (mean_only.p_best, predictive.p_best)]
    assert entropy[1] > entropy[0] + 0.1
    widths = [b[:, 1] - b[:, 0] for b in (mean_only.throughput_band, predictive.throughput_band)]
    assert np.all(widths[1] > 1.5 * widths[0])


def test_an_inadmissible_candidate_loses_its_draw_instead_of_dropping_it():
    # Acceptance noise so large that some candidates leave (0, 1) in some draws: before, those
    # whole draws were dropped from P(best); now only that candidate cannot win them.
    draws = _draws(1000)
    scales = predict.PredictiveScales(np.zeros(1000), np.full(1000, 5.0), np.full(1000, 0.3))
    ranking = predict.rank_drafts(_point(), n_drafts=N, d_drafts=D, m_target=M, d_target=D_TARGET, draws=draws,
                                   scales=scales)
    assert np.isclose(ranking.p_best.sum(), 1.0) and np.all(ranking.p_best > 0)


def test_predictive_scales_are_aligned_with_paired_draws():
    count = 50
    sigma, nu, alpha_sigma = np.arange(count) + 0.5, np.arange(count) + 100.0, np.arange(count) + 1000.0
    law = LossLaw(E=sigma.copy(), A=nu.copy(), B=np.ones(count), alpha=np.ones(count), beta=np.ones(count))
    plane = type(SDSL2026)(A=alpha_sigma.copy(), B=np.ones(count), C=np.ones(count))
    post = infer.Posterior(law, plane, types.SimpleNamespace(samples=dict(sigma=sigma, nu=nu)),
                              types.SimpleNamespace(samples=dict(sigma=alpha_sigma)), {})
    for count_kw in (None, 20):
        laws, planes = predict.paired_draws(post, count=count_kw, seed=3)
        scales = predict.predictive_scales(post, count=count_kw, seed=3)
        np.testing.assert_array_equal(scales.loss_sigma, laws.E)
        np.testing.assert_array_equal(scales.loss_nu, laws.A)
        np.testing.assert_array_equal(scales.alpha_sigma, planes.A)


def test_forecast_scores_against_hand_computed_values():
    from sdsl_jax.validation.closure import forecast_scores

    records = [dict(drafts=["a", "b"], measured_best="b", p_best=[0.25, 0.75]),
               dict(drafts=["a", "b", "c"], measured_best="a", p_best=[0.0, 1.0, 0.0])]
    s = forecast_scores(records)
    assert s["log_score"] == pytest.approx(np.log(0.75) + np.log(1e-3))  # a zero is floored at 1e-3
    assert s["uniform_log_score"] == pytest.approx(np.log(1 / 2) + np.log(1 / 3))
    assert s["brier"] == pytest.approx(((0.25**2 + 0.25**2) + (1 + 1 + 0)) / 2)
    assert s["uniform_brier"] == pytest.approx(((0.25 + 0.25) + (4 / 9 + 1 / 9 + 1 / 9)) / 2)
    assert s["measured_best_in_90_credible_set"] == 1  # first: the set {b, a} holds b; second: {b} misses a
    assert forecast_scores([dict(drafts=["a"], measured_best="a")]) is None  # no P(best): nothing to score


def test_identification_flags_what_the_data_leave_to_the_prior():
    import jax
    import numpyro
    from numpyro.infer import Predictive  # noqa: F401  (loads numpyro.infer)

    from sdsl_jax import CHINCHILLA, infer
    from sdsl_jax.loss_laws import DataCentre

    rng = np.random.default_rng(0)
    centre = dict(centre_log_n=np.asarray(13.0), centre_log_d=np.asarray(15.0))
    # A "posterior" that is the prior: nothing identified.
    draws = numpyro.infer.Predictive(CHINCHILLA.prior, num_samples=4000, parallel=True)(jax.random.PRNGKey(1),
                                                                                       DataCentre(13.0, 15.0))
    sites = ("a_ref", "b_ref", "e", "alpha", "beta")
    as_prior = {n: np.asarray(draws[n]).reshape(-1) for n in sites} | centre
    result = infer.identification(as_prior, CHINCHILLA)
    assert sorted(result.names) == sorted(sites)
    assert len([f for f in result.flags if "weakly identified" in f]) == 5
    # Tight in every coordinate, the term's size and alpha trading off (correlation ~1): identified.
    x = rng.standard_normal(4000)
    tight = dict(a_ref=-1.0 + 0.01 * x, b_ref=rng.normal(-1.4, 0.01, 4000), e=rng.normal(0.6, 0.005, 4000),
                 alpha=0.35 + 0.001 * x + 1e-6 * rng.standard_normal(4000), beta=rng.normal(0.37, 0.001, 4000),
                 **centre)
    result = infer.identification(tight, CHINCHILLA)
    i, j = result.names.index("a_ref"), result.names.index("alpha")
    assert result.flags == () and np.all(result.contraction > 0.99) and result.correlation[i, j] > 0.99
    # The N exponent left to its prior (the ladder's case): flagged by name.
    loose = dict(tight, alpha=as_prior["alpha"])
    assert any(f.startswith("alpha: weakly identified") for f in infer.identification(loose, CHINCHILLA).flags)


def _records():
    return [dict(target="T", m_target=M, d_target=D_TARGET, drafts=["a", "b", "c"], n_drafts=N.tolist(),
                 d_drafts=D.tolist(), measured_tokens_per_flop=[1.0, 2.0, 1.5], measured_best="b")]


def test_prospective_ranking_with_one_shared_fit_is_the_in_sample_ranking():
    from sdsl_jax.validation.closure_fits import add_prospective

    draws = _draws(500)
    scales = predict.PredictiveScales(np.full(500, 0.03), np.full(500, 8.0), np.full(500, 0.01))
    fits = {float(n): (_point(), draws, scales) for n in N}
    records = _records()
    add_prospective(records, fits, seed=4)
    in_sample = predict.rank_drafts(_point(), n_drafts=N, d_drafts=D, m_target=M, d_target=D_TARGET, draws=draws,
                                     scales=scales, seed=4)
    np.testing.assert_allclose(records[0]["prospective_p_best"], in_sample.p_best)
    best = records[0]["prospective_best"]
    assert best == ["a", "b", "c"][in_sample.best]
    assert records[0]["prospective_regret"] == pytest.approx(1 - [1.0, 2.0, 1.5][in_sample.best] / 2.0)


def test_prospective_ranking_takes_each_candidate_from_the_fit_that_left_it_out():
    from sdsl_jax.validation.closure_fits import add_prospective

    draws = _draws(300)
    # The fit without "b" believes in a plane where acceptance is 0.2 lower: "b" can no longer win.
    worse = (draws[0], type(SDSL2026)(draws[1].A, draws[1].B, draws[1].C - 0.2))
    fits = {float(N[0]): (_point(), draws, None), float(N[1]): (_point(), worse, None),
            float(N[2]): (_point(), draws, None)}
    records = _records()
    add_prospective(records, fits)
    assert records[0]["prospective_p_best"][1] == 0.0
    assert np.isclose(sum(records[0]["prospective_p_best"]), 1.0)


def test_measured_best_bootstrap_resamples_prompts_jointly(tmp_path):
    from sdsl_jax.validation.closure import measured_best_bootstrap
    from sdsl_jax.data import load_speculative

    header = ("target,draft,n_target,n_draft,d_target,d_draft,gamma,prompts,iterations,accepted,alpha_mle,"
              "tokens_per_flop_sdsl,iterations_per_prompt,accepted_per_prompt")
    # Draft a is far better on every prompt; b and c tie on average but each wins on other prompts.
    rows = ["T,a,1e6,1e4,1e8,1e7,2,3,30,50,0.7,1e-6,10;10;10,20;15;15",  # alpha_mle within its counts' range
            "T,b,1e6,2e4,1e8,1e7,2,3,30,10,0.27,1e-6,10;10;10,10;0;0",
            "T,c,1e6,2e4,1e8,1e7,2,3,30,10,0.27,1e-6,10;10;10,0;10;0"]
    path = tmp_path / "spec.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    spec = load_speculative(path)
    freq = measured_best_bootstrap(spec, {"a": [0], "b": [1], "c": [2]}, ["a", "b", "c"], replicates=500)
    np.testing.assert_allclose(freq, [1.0, 0.0, 0.0])
    freq = measured_best_bootstrap(spec, {"b": [1], "c": [2]}, ["b", "c"], replicates=20000, seed=1)
    # Oracle by enumeration of the 27 resamples: b wins (ties go to the first) when it draws prompt 0
    # at least as often as prompt 1.
    import itertools

    draws = list(itertools.product(range(3), repeat=3))
    p_b = np.mean([d.count(0) >= d.count(1) for d in draws])
    assert abs(freq[0] - p_b) < 0.02 and np.isclose(freq.sum(), 1.0)
    # Per-prompt counts that do not add up to the row's totals are refused, naming the column.
    path.write_text(header + "\n" + rows[0].replace("20;15;15", "20;15;14") + "\n")
    with pytest.raises(Exception, match="accepted_per_prompt.*adds up to 49"):
        load_speculative(path)


def test_a_point_fit_at_a_bound_gives_way_to_the_posterior_median_law():
    """A coefficient at a bound of the fit (E driven to 0, a term's coefficient in the 1e200s) makes
    the point law's curve an artefact: decisions then use the posterior's median law."""
    from sdsl_jax.infer.point import degenerate_coefficients
    from sdsl_jax.infer.results import PointFit
    from sdsl_jax.loss_laws import CHINCHILLA

    assert degenerate_coefficients(HOFFMANN2022) == ()
    assert degenerate_coefficients(HOFFMANN2022._replace(E=0.0, A=5.8e207)) == ("E", "A")
    assert degenerate_coefficients(HOFFMANN2022._replace(B=float("nan"), beta=2.5e-72)) == ("B", "beta")

    def point(law):
        return PointFit(law, np.asarray(CHINCHILLA.to_theta(law)), 1e-3, True, CHINCHILLA, SDSL2026, None, False,
                        float("nan"))

    laws, _ = _draws(401, seed=2)
    same, bad = predict.point_for_decisions(point(HOFFMANN2022), laws)
    assert bad == () and same.law is HOFFMANN2022
    replaced, bad = predict.point_for_decisions(point(HOFFMANN2022._replace(E=0.0)), laws)
    assert bad == ("E",)
    for name in ("E", "A", "alpha"):
        assert float(getattr(replaced.law, name)) == pytest.approx(float(np.median(getattr(laws, name))), rel=1e-12)
    np.testing.assert_allclose(replaced.theta, np.asarray(CHINCHILLA.to_theta(replaced.law)))
    assert replaced.objective == 1e-3 and replaced.family is CHINCHILLA  # the rest of the point fit as it was


def test_a_point_fit_far_outside_its_posterior_gives_way_to_the_posterior_median_law():
    """A point fit that ran along a direction the data leave open stops short of any bound (an N
    term with A in the 1e18s and alpha 4.5; E at 1e-15): it is set aside when a fitting coordinate
    lies beyond the posterior's central 99% by more than that interval's width, and kept within it."""
    from sdsl_jax.infer.point import coordinates_beyond_posterior, degenerate_coefficients
    from sdsl_jax.infer.results import PointFit
    from sdsl_jax.loss_laws import CHINCHILLA

    def point(law):
        return PointFit(law, np.asarray(CHINCHILLA.to_theta(law)), 1e-3, True, CHINCHILLA, SDSL2026, None, False,
                        float("nan"))

    laws, _ = _draws(2001, seed=3)
    alpha = np.asarray(laws.alpha)
    lo, hi = np.quantile(alpha, [0.005, 0.995])  # the oracle: the interval and its width, directly
    inside = HOFFMANN2022._replace(alpha=hi + 0.9 * (hi - lo))
    outside = HOFFMANN2022._replace(alpha=hi + 1.1 * (hi - lo))
    assert coordinates_beyond_posterior(CHINCHILLA, point(HOFFMANN2022).theta, laws) == ()
    assert coordinates_beyond_posterior(CHINCHILLA, point(inside).theta, laws) == ()
    assert coordinates_beyond_posterior(CHINCHILLA, point(outside).theta, laws) == ("alpha",)
    # E at 1e-15: finite and above 1e-30, so no bound of the fit, but e = log E is 35 away from the draws.
    tiny_e = HOFFMANN2022._replace(E=1e-15)
    assert degenerate_coefficients(tiny_e) == ()
    assert coordinates_beyond_posterior(CHINCHILLA, point(tiny_e).theta, laws) == ("e",)

    replaced, bad = predict.point_for_decisions(point(outside), laws)
    assert bad == ("alpha",)
    assert float(replaced.law.alpha) == pytest.approx(float(np.median(alpha)), rel=1e-12)
    kept, bad = predict.point_for_decisions(point(inside), laws)
    assert bad == () and kept.law is inside
