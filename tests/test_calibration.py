"""Simulation-based calibration of the posteriors' 90% intervals (the fast version of
`python -m experiments.calibration`; its own module, so that under `make test`'s per-module
distribution it runs beside the other Bayesian tests instead of after them)."""

from sdsl_jax.validation.calibration import n_star_coverage, plane_coverage


def test_calibration_of_90_percent_intervals():
    """Simulation-based check at a size that runs in under a minute (larger: `make bench`,
    `python -m experiments.calibration`).

    Intervals: 15 plane datasets x 3 coefficients, and 2 synthetic ladders with per-run effects x
    2 bands on N* (the mean-curve band against the true law's N*, the predictive band against
    the N* of a new draft series and target) = 49. At the nominal 0.9 the pooled coverage has s.e.
    0.043; failing needs < 0.75 or > 0.99 (too wide). The loss law's i.i.d. calibration is in
    `make bench` (same sampler and priors, without run effects).
    """
    plane = plane_coverage(15, num_points=40, num_warmup=150, num_samples=250, seed=11)
    n_star = n_star_coverage(2, num_warmup=150, num_samples=250, seed=11)
    claims = ("mean curve vs true law", "predictive vs new models")
    hits = sum(v * 15 for v in plane.values()) + sum(n_star[k] * 2 for k in claims)
    pooled = hits / 49
    assert 0.75 <= pooled <= 0.99, (plane, n_star)
    # The predictive band is wider than the mean curve's: it carries the new models' residuals.
    assert n_star["predictive vs new models: median log width"] > n_star["mean curve vs true law: median log width"]


def test_n_star_coverage_figure_is_written_with_its_command(tmp_path):
    from sdsl_jax.figures import n_star_coverage_figure

    intervals = {"mean curve vs true law": [(1e8, 2e8, 1.5e8), (1e8, 2e8, 3e8)],
                 "predictive vs new models": [(5e7, 4e8, 1.5e8)]}
    path = n_star_coverage_figure(intervals, str(tmp_path / "n_star_coverage.png"),
                                  caption="python -m experiments.calibration --only n-star")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
