"""Correlated runs: the run column, the hierarchical loss law, new-run offsets, predictive N* bands."""

import jax
import numpy as np
import pytest

from sdsl_jax import SDSL2026, ResidualAcceptance, compare, infer, pipeline, predict, solve_draft_size
from sdsl_jax.data import load_pretraining, save_pretraining
from sdsl_jax.validation.calibration import TRUE_LAW, TRUE_RUN_SLOPE_SD, synthetic_ladder

jax.config.update("jax_enable_x64", True)


def test_run_column_is_optional_and_defaults_to_the_model_size(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("n_params,n_tokens,loss\n1e6,1e8,3.0\n1e6,2e8,2.9\n2e6,1e8,2.8\n")
    runs = load_pretraining(path)
    index, count = runs.run_index()
    assert count == 2 and index.tolist() == [0, 0, 1]
    assert pipeline.has_repeated_runs(runs)
    path.write_text("n_params,n_tokens,loss,run\n1e6,1e8,3.0,a\n1e6,2e8,2.9,b\n2e6,1e8,2.8,b\n")
    runs = load_pretraining(path)
    assert runs.run_labels() == ("a", "b", "b") and runs.run_index()[0].tolist() == [0, 1, 1]
    save_pretraining(runs, tmp_path / "again.csv")
    assert load_pretraining(tmp_path / "again.csv").run == ("a", "b", "b")


def test_one_row_per_run_has_no_repeated_runs(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("n_params,n_tokens,loss\n1e6,1e8,3.0\n2e6,2e8,2.9\n3e6,1e8,2.8\n")
    assert not pipeline.has_repeated_runs(load_pretraining(path))


def test_sample_loss_law_refuses_a_bad_run_index():
    n, d, loss, run, _ = synthetic_ladder(np.random.default_rng(0))
    with pytest.raises(ValueError, match="run must hold"):
        infer.sample_loss_law(n, d, loss, run=run[:-1], num_chains=1, num_warmup=5, num_samples=5)


def test_new_run_offsets_have_the_summed_variance():
    # Oracle: Var = sigma^2 nu / (nu - 2) + run_sd^2 + run_slope_sd^2 (log D - c)^2.
    k = 200_000
    samples = dict(sigma=np.full(k, 0.03), nu=np.full(k, 10.0), run_sd=np.full(k, 0.02),
                   run_slope_sd=np.full(k, 0.05))
    offsets = infer.new_run_offsets(samples, np.log(1e10), centre_log_d=np.log(1e9), seed=3)
    expected = 0.03**2 * 10 / 8 + 0.02**2 + (0.05 * np.log(10)) ** 2
    assert offsets.shape == (k,)
    np.testing.assert_allclose(offsets.var(), expected, rtol=0.02)
    iid = infer.new_run_offsets(dict(sigma=samples["sigma"], nu=samples["nu"]), 0.0, size=(2,), seed=3)
    assert iid.shape == (k, 2)
    np.testing.assert_allclose(iid.var(), 0.03**2 * 10 / 8, rtol=0.02)


def test_residual_acceptance_is_the_model_when_offsets_vanish_and_shifts_losses_otherwise():
    x, y = np.array([20.0, 40.0]), np.array([8.0, 9.0])
    np.testing.assert_allclose(ResidualAcceptance(SDSL2026).rate(x, y), SDSL2026.rate(x, y))
    moved = ResidualAcceptance(SDSL2026, 0.1, -0.05, 0.01).rate(x, y)
    # Oracle: move the log losses by hand.
    x2, y2 = np.exp(np.log(x) * np.exp(0.1)), np.exp(np.log(y) * np.exp(-0.05))
    np.testing.assert_allclose(moved, SDSL2026.rate(x2, y2) + 0.01, rtol=1e-12)


def test_residual_acceptance_goes_through_the_solver_with_derivatives():
    kw = dict(d_draft=1e12, d_target=1e12, loss=TRUE_LAW)
    base = solve_draft_size(7e10, plane=SDSL2026, **kw)
    same = solve_draft_size(7e10, plane=ResidualAcceptance(SDSL2026), **kw)
    np.testing.assert_allclose(same.n_star, base.n_star, rtol=1e-10)

    def log_n_star(offset):
        return jax.numpy.log(solve_draft_size(7e10, plane=ResidualAcceptance(SDSL2026, offset), **kw).n_star)

    grad = jax.grad(log_n_star)(0.0)
    h = 1e-5
    fd = (log_n_star(h) - log_n_star(-h)) / (2 * h)
    assert np.isfinite(grad)
    np.testing.assert_allclose(grad, fd, rtol=1e-4)


def test_hierarchical_posterior_finds_the_run_slope_and_shrinks_the_residual():
    # A ladder with a real per-run slope in log D: the hierarchical model should see the slope
    # (its 90% interval excludes zero's neighbourhood and covers the truth) and attribute less to
    # the row residual than the model with independent rows does.
    rng = np.random.default_rng(11)
    n, d, loss, run, _ = synthetic_ladder(rng)
    kw = dict(num_chains=2, num_warmup=300, num_samples=300, seed=0, progress_bar=False)
    hier = infer.sample_loss_law(n, d, loss, run=run, **kw)
    iid = infer.sample_loss_law(n, d, loss, **kw)
    slope = np.asarray(hier.samples["run_slope_sd"])
    lo, hi = np.quantile(slope, [0.05, 0.95])
    assert lo < TRUE_RUN_SLOPE_SD < hi and lo > 0.003
    assert np.median(hier.samples["sigma"]) < np.median(iid.samples["sigma"])
    assert hier.diagnostics.num_divergences <= 5
    assert "centre_log_d" in hier.samples


def test_predictive_n_star_bands_are_wider_and_centred_like_the_mean_curve():
    count = 400
    rng = np.random.default_rng(0)
    laws = type(TRUE_LAW)(*(np.asarray(v) * (1 + 0.002 * rng.standard_normal(count)) for v in TRUE_LAW))
    planes = type(SDSL2026)(*(np.full(count, v) for v in SDSL2026))
    scales = predict.PredictiveScales(np.full(count, 0.02), np.full(count, 8.0), np.full(count, 0.01),
                                       np.full(count, 0.02), np.full(count, 0.03), float(np.log(1e10)))
    point = type("P", (), dict(law=TRUE_LAW, plane=SDSL2026))
    kw = dict(m_grid=np.array([2e10, 7e10]), targets=np.array([3e10]), d_target=1e12, d_draft=1e11,
              draws=(laws, planes))
    mean_only = predict.predict_draft_size(point, **kw)
    predictive = predict.predict_draft_size(point, scales=scales, seed=1, **kw)
    q = list(mean_only.target_bands.quantiles)
    lo, mid, hi = q.index(0.05), q.index(0.5), q.index(0.95)
    width = [np.log(b.n_star[hi, 0] / b.n_star[lo, 0]) for b in (mean_only.target_bands, predictive.target_bands)]
    assert width[1] > 2 * width[0]
    np.testing.assert_allclose(predictive.target_bands.n_star[mid, 0], mean_only.target_bands.n_star[mid, 0],
                               rtol=0.1)


# Slow: stacking's weight on the generating law is tested fast by the size folds in test_compare.py
# (Chinchilla's law against the data-only law) and the weights' arithmetic there too.
@pytest.mark.slow
def test_stacking_puts_its_weight_on_the_form_that_generated_the_data():
    # Data from a law with a strong N term: the data-only form (no N) cannot predict the rows,
    # stacking must give it (almost) nothing. Weights from ArviZ's stacking over PSIS-LOO.
    from sdsl_jax import CHINCHILLA, DATA_ONLY
    from sdsl_jax.data import PretrainingRuns

    n, d, loss, _, _ = synthetic_ladder(np.random.default_rng(5), run_effects=False)
    runs = PretrainingRuns(n_params=n, n_tokens=d, loss=loss, name=(None,) * n.size, flops=np.full(n.size, np.nan),
                           source=(None,) * n.size)
    posteriors = {}
    for family in (CHINCHILLA, DATA_ONLY):
        point = pipeline.fit_point(runs, family=family)
        # The settings of the hierarchical test above (same-shaped rows): its compiled Chinchilla sampler is reused.
        # With the shipped reruns: two chains of 300 draws can miss R-hat < 1.01 by a hair, and a form whose
        # posterior fails its checks gets no weight (compare.stacking_weights), whatever its fit.
        posteriors[family.name] = pipeline.sample_posterior(runs, None, point, num_chains=2, num_warmup=300,
                                                            num_samples=300, run_effects=False, retries=2)
        assert posteriors[family.name].diagnostics.loss_law.ok, family.name
    weights = compare.stacking_weights(runs, posteriors)
    assert weights.names == ("chinchilla", "data")
    np.testing.assert_allclose(weights.weights.sum(), 1.0, atol=1e-6)
    assert weights.weights[0] > 0.95
    assert weights.elpd_loo[0] > weights.elpd_loo[1]
