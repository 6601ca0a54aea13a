"""Correlated acceptance pairs: per-draft and per-target model effects, and conditioning on models in the data."""

import numpy as np
import pytest

from sdsl_jax import PLANE as SDSL2026_MODEL
from sdsl_jax import SDSL2026, compare, infer, predict
from sdsl_jax.data import load_acceptance
from sdsl_jax.validation.closure import candidate_labels, run_label_of

HEADER = "draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha\n"
TRUE = dict(A=-0.04, B=0.06, C=0.70, sigma=0.008, draft_sd=0.03, target_sd=0.01)


def _crossed_pairs(rng, drafts=12, targets=5):
    """Every draft model with every target: alpha from the plane plus each model's effect."""
    x = np.exp(rng.uniform(1.5, 3.0, drafts))  # draft perplexities
    y = np.exp(rng.uniform(0.8, 1.4, targets))
    di, ti = (a.ravel() for a in np.meshgrid(np.arange(drafts), np.arange(targets), indexing="ij"))
    a_draft = TRUE["draft_sd"] * rng.standard_normal(drafts)
    a_target = TRUE["target_sd"] * rng.standard_normal(targets)
    alpha = (TRUE["A"] * x[di] + TRUE["B"] * y[ti] + TRUE["C"] + a_draft[di] + a_target[ti]
             + TRUE["sigma"] * rng.standard_normal(di.size))
    return x[di], y[ti], alpha, di.astype(np.int32), ti.astype(np.int32)


def test_model_index_numbers_labels_in_order_of_appearance(tmp_path):
    path = tmp_path / "acc.csv"
    path.write_text(HEADER + "s1,t1,1e5,1e6,1e7,1e8,10,5,0.5\ns2,t1,1e5,1e6,1e7,1e8,9,5,0.55\n"
                    "s1,t2,1e5,1e6,1e7,1e8,10,4,0.45\n")
    pairs = load_acceptance(path)
    draft, drafts, target, targets = pairs.model_index()
    assert draft.tolist() == [0, 1, 0] and drafts == 2 and target.tolist() == [0, 0, 1] and targets == 2
    assert pairs.has_repeated_models()
    assert not pairs.select(np.array([True, False, False])).has_repeated_models()


def test_sample_plane_refuses_half_or_bad_model_indices():
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(0))
    with pytest.raises(ValueError, match="both draft and target"):
        infer.sample_plane(x, y, alpha, draft=di, num_chains=1, num_warmup=5, num_samples=5)
    with pytest.raises(ValueError, match="target must hold"):
        infer.sample_plane(x, y, alpha, draft=di, target=ti[:-1], num_chains=1, num_warmup=5, num_samples=5)


# Slow: a kind of model left out (the drafts' effects alone, the targets' recorded as zero) is tested
# fast end to end in test_fit_cli.py (the ladder's six targets: model_effects == ['draft'], no target scale).
@pytest.mark.slow
def test_a_kind_of_model_left_out_records_zero_effects_that_predictions_read():
    # Five targets: their effects' scale would rest on three contrasts; the drafts' alone are sampled.
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(3))
    run = infer.sample_plane(x, y, alpha, draft=di, target=ti, effect_sides=("draft",), num_chains=1,
                             num_warmup=150, num_samples=150, seed=0, progress_bar=False)
    assert np.all(run.samples["target_sd"] == 0) and run.samples["target_z"].shape == (150, 5)
    assert np.all(run.samples["target_z"] == 0) and np.all(run.samples["draft_sd"] > 0)
    assert infer.sampled_effect_sides(run.samples) == ("draft",)
    # The drafts' scale is found (true 0.03); the targets' scatter (0.01) joins the pair residual (0.008).
    assert 0.015 < np.median(run.samples["draft_sd"]) < 0.06
    assert 0.010 < np.median(run.samples["sigma"]) < 0.017
    with pytest.raises(ValueError, match="projected effects need both"):
        infer.sample_plane(x, y, alpha, draft=di, target=ti, effect_sides=("draft",), effects="projected")
    with pytest.raises(ValueError, match="sides must name"):
        infer.model_effects_plane_model_for(SDSL2026_MODEL, ("drafts",))


def test_model_effects_posterior_finds_the_draft_effect_and_shrinks_the_pair_residual():
    # Pairs that share a draft share its effect: the crossed model should see the draft effect
    # (its 90% interval covers the truth, away from zero) and leave the pair residual near its
    # true scale, where the model with independent pairs lumps both into sigma.
    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(3))
    kw = dict(num_chains=2, num_warmup=300, num_samples=300, seed=0, progress_bar=False)
    crossed = infer.sample_plane(x, y, alpha, draft=di, target=ti, **kw)
    iid = infer.sample_plane(x, y, alpha, **kw)
    lo, hi = np.quantile(crossed.samples["draft_sd"], [0.05, 0.95])
    assert lo < TRUE["draft_sd"] < hi and lo > 0.01
    assert np.median(crossed.samples["sigma"]) < 0.5 * np.median(iid.samples["sigma"])
    assert crossed.diagnostics.num_divergences <= 5
    # The coefficients' band is wider once pairs are not counted as independent (the review's 3-4x).
    width = lambda s: np.subtract(*np.quantile(s["A"], [0.95, 0.05]))  # noqa: E731
    assert width(crossed.samples) > 1.5 * width(iid.samples)


def _scales(count=4000, known=None):
    return predict.PredictiveScales(np.full(count, 1e-9), np.full(count, 30.0), np.full(count, 0.01),
                                     alpha_draft_sd=np.full(count, 0.03), alpha_target_sd=np.full(count, 0.02),
                                     known=known)


def test_alpha_residuals_of_new_models_add_the_three_variances_and_share_the_target():
    scales = _scales()
    shift, z = scales.alpha_residuals(np.random.default_rng(0), 3)
    off = shift + scales.alpha_sigma[:, None] * z
    assert np.var(off, axis=0) == pytest.approx(np.full(3, 0.01**2 + 0.03**2 + 0.02**2), rel=0.1)
    # Candidates share the target's effect: covariance between two candidates is target_sd^2.
    assert np.cov(off[:, 0], off[:, 1])[0, 1] == pytest.approx(0.02**2, rel=0.2)


def test_known_models_keep_their_posterior_effects():
    count = 4000
    rng = np.random.default_rng(1)
    known = predict.KnownEffects(draft_labels=("a", "b"), draft_effect=rng.normal(0.05, 0.001, (count, 2)),
                                  target_labels=("T",), target_effect=np.full((count, 1), -0.02))
    scales = _scales(count, known)
    shift, z = scales.alpha_residuals(np.random.default_rng(0), 2, drafts=("b", None), target="T")
    off = shift + scales.alpha_sigma[:, None] * z
    # "b" is known: its effect (mean 0.05) plus the pair's residual and the known target's -0.02.
    assert np.mean(off[:, 0]) == pytest.approx(0.03, abs=1e-3)
    assert np.std(off[:, 0]) == pytest.approx(np.hypot(0.01, 0.001), rel=0.1)
    # The second candidate is new: a fresh draft effect, the same known target.
    assert np.mean(off[:, 1]) == pytest.approx(-0.02, abs=2e-3)
    assert np.std(off[:, 1]) == pytest.approx(np.hypot(0.01, 0.03), rel=0.1)


def test_a_known_run_keeps_its_intercept_and_slope():
    count = 3000
    known = predict.KnownEffects(run_labels=("r0",), run_intercept=np.full((count, 1), 0.1),
                                  run_slope=np.full((count, 1), 0.02))
    scales = predict.PredictiveScales(np.full(count, 1e-6), np.full(count, 30.0), np.zeros(count),
                                       run_sd=np.full(count, 0.05), run_slope_sd=np.full(count, 0.05),
                                       centre_log_d=10.0, known=known)
    log_d = np.array([[12.0, 12.0]])
    off = scales.log_loss_offsets(log_d, size=(2,), seed=0, runs=("r0", None))
    np.testing.assert_allclose(off[:, 0], 0.1 + 0.02 * 2.0, atol=1e-4)
    assert np.std(off[:, 1]) == pytest.approx(np.hypot(0.05, 0.05 * 2.0), rel=0.1)


def test_zero_known_effects_rank_like_new_models_without_scatter():
    # Known models whose effects are exactly zero, with no residuals: the ranking is the law's.
    from sdsl_jax import HOFFMANN2022

    count = 200
    n, d = np.array([3e7, 1e8, 3e8]), np.array([6e11, 1e12, 2e12])
    known = predict.KnownEffects(draft_labels=("a", "b", "c"), draft_effect=np.zeros((count, 3)),
                                  target_labels=("T",), target_effect=np.zeros((count, 1)))
    scales = predict.PredictiveScales(np.full(count, 1e-12), np.full(count, 30.0), np.zeros(count),
                                       alpha_draft_sd=np.full(count, 0.5), alpha_target_sd=np.full(count, 0.5),
                                       known=known)
    law = type(HOFFMANN2022)(*(np.full(count, v) for v in HOFFMANN2022))
    plane = type(SDSL2026)(*(np.full(count, v) for v in SDSL2026))
    labels = predict.CandidateLabels(draft_models=("a", "b", "c"), target_model="T")
    t = predict.throughput_draws((law, plane), n_drafts=n, d_drafts=d, m_target=7e10, d_target=1.4e12,
                                  scales=scales, labels=labels)
    t_mean = predict.throughput_draws((law, plane), n_drafts=n, d_drafts=d, m_target=7e10, d_target=1.4e12)
    np.testing.assert_allclose(t, t_mean, rtol=1e-6)


def test_model_effects_keep_known_models_and_share_a_new_models_draw():
    """The one rule for a model's effect in predictive draws (ranking and the held-out study alike)."""
    sd = np.full(500, 2.0)
    known = sd[:, None] * np.tile([[1.0, -1.0]], (500, 1))  # models a, b
    eff = predict.model_effect_draws(sd, known, ("a", "b"), ("b", "new", "new", "a", None, None),
                                     np.random.default_rng(0))
    np.testing.assert_allclose(eff[:, 0], -2.0)
    np.testing.assert_allclose(eff[:, 3], 2.0)
    np.testing.assert_allclose(eff[:, 1], eff[:, 2])  # one new model, one draw shared by its pairs
    assert np.std(eff[:, 1]) == pytest.approx(2.0, rel=0.15)
    assert not np.allclose(eff[:, 4], eff[:, 5])  # unlabelled entries are models of their own
    np.testing.assert_allclose(np.corrcoef(eff[:, 1], eff[:, 4])[0, 1], 0.0, atol=0.15)


def test_candidate_labels_find_runs_and_models_in_the_data(tmp_path):
    from sdsl_jax.data import load_pretraining

    pre = tmp_path / "pre.csv"
    pre.write_text("n_params,n_tokens,loss\n1e6,1e8,3.0\n1e6,2e8,2.9\n2e6,1e8,2.8\n")
    acc = tmp_path / "acc.csv"
    acc.write_text(HEADER + "d1,T,1e5,1e6,1e7,1e8,10,5,0.5\n")
    runs, pairs = load_pretraining(pre), load_acceptance(acc)
    assert run_label_of(runs, 1e6, 4e8) == runs.run_labels()[0]  # the size's one run, at a new budget
    assert run_label_of(runs, 3e6, 1e8) is None
    labels = candidate_labels(runs, pairs, ["d1", "d2"], [1e6, 3e6], [1e8, 1e8], "T", 2e6, 1e8)
    assert labels.draft_models == ("d1", None) and labels.target_model == "T"
    assert labels.draft_runs == (runs.run_labels()[0], None) and labels.target_run == runs.run_labels()[2]


def test_acceptance_pointwise_log_likelihood_matches_the_truncated_normal_density():
    """Per draw and pair: Normal(A u + B v + C [+ draft and target effects], sigma / sqrt(w / mean w))
    truncated to [0, 1], checked against scipy for both acceptance models' likelihoods."""
    from scipy.stats import truncnorm

    def norm_logpdf(a, mean, scale):
        return truncnorm.logpdf(a, (0 - mean) / scale, (1 - mean) / scale, loc=mean, scale=scale)

    import jax
    from numpyro.infer import Predictive

    x, y, alpha, di, ti = _crossed_pairs(np.random.default_rng(4), drafts=6, targets=3)
    w = np.random.default_rng(5).uniform(50, 500, alpha.size)
    scale = lambda s: s["sigma"][:, None] / np.sqrt(w / w.mean())[None]  # noqa: E731

    def draws(model, *args):  # prior draws of every site (any draws will do for a likelihood check)
        with jax.numpy_dtype_promotion("standard"):
            out = Predictive(model, num_samples=20, parallel=True)(jax.random.PRNGKey(0), *args)
        return {k: np.asarray(v) for k, v in out.items() if k != "alpha_obs"}

    plane = draws(infer.plane_model_for(SDSL2026_MODEL), x, y, w)
    mean = plane["A"][:, None] * x + plane["B"][:, None] * y + plane["C"][:, None]
    np.testing.assert_allclose(infer.acceptance_pointwise_log_likelihood(plane, SDSL2026_MODEL, x, y, alpha, weights=w),
                               norm_logpdf(alpha, mean, scale(plane)), rtol=1e-9)
    crossed = draws(infer.model_effects_plane_model_for(SDSL2026_MODEL), x, y, w, di, np.zeros(6), ti, np.zeros(3))
    mean = (crossed["A"][:, None] * x + crossed["B"][:, None] * y + crossed["C"][:, None]
            + crossed["draft_sd"][:, None] * crossed["draft_z"][:, di]
            + crossed["target_sd"][:, None] * crossed["target_z"][:, ti])
    np.testing.assert_allclose(infer.acceptance_pointwise_log_likelihood(crossed, SDSL2026_MODEL, x, y, alpha,
                                                                         weights=w, draft=di, target=ti),
                               norm_logpdf(alpha, mean, scale(crossed)), rtol=1e-9)


def test_logit_plane_likelihood_is_a_density_on_alpha():
    """logit alpha ~ Normal(eta, s): the density of alpha carries the Jacobian 1 / (alpha (1 - alpha)),
    so it integrates to one over (0, 1) and compares with the identity-linked models' densities."""
    from scipy.integrate import quad
    from scipy.stats import norm

    from sdsl_jax import LOGIT_PLANE

    samples = dict(slope_x=np.array([-0.8]), slope_y=np.array([0.3]), centre=np.array([0.9]), sigma=np.array([0.4]))
    x, y = np.array([20.0, 40.0, 80.0]), np.array([8.0, 9.0, 10.0])
    alpha = np.array([0.7, 0.5, 0.3])
    got = infer.acceptance_pointwise_log_likelihood(samples, LOGIT_PLANE, x, y, alpha)
    u, v = np.log(x), np.log(y)
    eta = 0.9 - 0.8 * (u - u.mean()) / u.std() + 0.3 * (v - v.mean()) / v.std()
    logit = np.log(alpha / (1 - alpha))
    np.testing.assert_allclose(got[0], norm.logpdf(logit, eta, 0.4) - np.log(alpha * (1 - alpha)), rtol=1e-10)
    total, _ = quad(lambda a: np.exp(float(infer.acceptance_likelihood(LOGIT_PLANE, eta[0], 0.4).log_prob(a))), 0, 1)
    assert total == pytest.approx(1.0, abs=1e-8)


# Slow: stacking's weight on the acceptance model that generated the pairs is tested fast in
# test_extending.py (a new model against the paper's plane, through the same acceptance_stacking_weights).
@pytest.mark.slow
def test_acceptance_stacking_puts_its_weight_on_the_model_that_generated_the_pairs(tmp_path):
    # alpha linear in log perplexities, over a wide range of draft perplexities: the raw plane
    # cannot follow the curve, the log-plane can; stacking (PSIS-LOO over pairs) must see it.
    from sdsl_jax import ACCEPTANCE_MODELS, LOG_PLANE

    rng = np.random.default_rng(6)
    x, y = np.exp(rng.uniform(0.7, 4.0, 40)), np.exp(rng.uniform(0.5, 1.5, 40))
    alpha = -0.12 * np.log(x) + 0.08 * np.log(y) + 0.9 + 0.004 * rng.standard_normal(40)
    rows = "".join(f"d{i},t{i},1e5,1e6,1e7,1e8,{x[i]:.17g},{y[i]:.17g},{alpha[i]:.17g}\n" for i in range(40))
    (tmp_path / "acc.csv").write_text(HEADER + rows)
    pairs = load_acceptance(tmp_path / "acc.csv")
    assert not pairs.has_repeated_models()
    runs = {}
    for model in ACCEPTANCE_MODELS.values():
        runs[model.name] = infer.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, model=model,
                                              weights=pairs.regression_weights(), num_chains=2, num_warmup=200,
                                              num_samples=200, seed=0, progress_bar=False, summarize=False)
    # Short chains, not checked (summarize=False): a run that failed its checks would get no weight.
    weights = compare.acceptance_stacking_weights(pairs, runs)
    assert weights.names == tuple(ACCEPTANCE_MODELS)
    np.testing.assert_allclose(weights.weights.sum(), 1.0, atol=1e-6)
    assert weights.weights[weights.names.index(LOG_PLANE.name)] > 0.95
    assert weights.elpd_loo[weights.names.index(LOG_PLANE.name)] > weights.elpd_loo[weights.names.index("plane")]


def test_predictive_acceptance_draws_stay_probabilities_near_one():
    """A pair whose plane sits at alpha 0.93 with a residual of 0.05: Gaussian offsets put a fifth of
    the draws above one; the truncated residual keeps every draw in [0, 1], and far from the bound
    draws exactly as the Gaussian."""
    from sdsl_jax import ResidualAcceptance

    count = 4000
    planes = type(SDSL2026)(*(np.full(count, v) for v in SDSL2026))
    scales = predict.PredictiveScales(np.full(count, 1e-9), np.full(count, 30.0), np.full(count, 0.05),
                                       alpha_draft_sd=np.full(count, 0.03), alpha_target_sd=np.full(count, 0.02))
    draws = predict.predictive_planes(planes, scales, d_draft=1e11, d_target=1e12, seed=0)
    x, y = 5.0, 22.0  # the plane gives 0.642 - 0.0335 + 0.285 = 0.894
    rate = np.asarray(draws.rate(x, y))
    assert np.isfinite(rate).all() and (rate >= 0).all() and (rate <= 1).all()
    gaussian = np.asarray(SDSL2026.rate(x, y)) + draws.alpha + 0.05 * draws.alpha_z
    assert (gaussian > 1).mean() > 0.01
    # A pair near alpha 0.59: with the mean at least 8 residual scales inside, the Gaussian's draw.
    eta = np.asarray(SDSL2026.rate(30.0, 10.0)) + draws.alpha
    inside = (eta > 8 * 0.05) & (eta < 1 - 8 * 0.05)
    assert inside.mean() > 0.5
    np.testing.assert_allclose(np.asarray(draws.rate(30.0, 10.0))[inside], (eta + 0.05 * draws.alpha_z)[inside],
                               atol=1e-12)
    assert np.asarray(ResidualAcceptance(SDSL2026, 0.0, 0.0, 0.3, 3.0, 0.05).rate(x, y)) <= 1


def test_logit_plane_is_recovered_and_its_draws_are_probabilities():
    from sdsl_jax import LOGIT_PLANE, fit_acceptance_plane, predictive_acceptance

    rng = np.random.default_rng(3)
    x, y = np.exp(rng.uniform(1.0, 4.0, 60)), np.exp(rng.uniform(0.8, 1.6, 60))
    truth = LOGIT_PLANE.params_type(-1.2, 0.9, 2.5)
    alpha = np.asarray(predictive_acceptance(truth, x, y, z=rng.standard_normal(60), sigma=0.05))
    point = fit_acceptance_plane(x, y, alpha, model=LOGIT_PLANE)
    np.testing.assert_allclose(np.asarray(point.plane), np.asarray(truth), atol=0.1)
    run = infer.sample_plane(x, y, alpha, model=LOGIT_PLANE, num_chains=2, num_warmup=200, num_samples=200,
                             seed=0, progress_bar=False)
    planes = infer.planes_from_posterior(run.samples, LOGIT_PLANE)
    for name, value in zip("ABC", truth):
        assert np.quantile(getattr(planes, name), 0.005) < value < np.quantile(getattr(planes, name), 0.995)
    far = np.asarray(predictive_acceptance(type(planes)(*(v[:, None] for v in planes)), np.array([1.01, 500.0]), 3.0,
                                           z=rng.standard_normal((planes.A.size, 2)), sigma=run.samples["sigma"][:, None]))
    assert ((far > 0) & (far < 1)).all()
