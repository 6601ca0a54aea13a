"""Point fits: the Epoch replication reproduced, synthetic recovery, the multi-start machinery."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdsl_jax import (ACCEPTANCE_MODELS, CHINCHILLA, FAMILIES, HOFFMANN2022, SDSL2026, IdentifiabilityError,
                      acceptance_rate, check_loss_law_data, pretraining_loss)
from sdsl_jax.data import load_pretraining
from sdsl_jax.infer.point import EPOCH_GRID, fit_acceptance_plane, fit_loss_law, fit_multistart

# Besiroglu et al. 2024, Huber fit on the 240 runs kept (their Table / notebook values).
EPOCH_HUBER = dict(A=477.84, B=2143.86, E=1.8172, alpha=0.34731, beta=0.36718)


def chinchilla_240():
    runs = load_pretraining("fits/data/chinchilla_fig4.csv")
    return runs.select(np.sort(np.argsort(runs.loss)[:-5]))  # drop the 5 highest-loss runs


def test_epoch_grid_is_their_4500_starts():
    assert EPOCH_GRID.shape == (4500, 5)
    assert sorted(set(EPOCH_GRID[:, 0])) == [0, 5, 10, 15, 20, 25]
    assert sorted(set(EPOCH_GRID[:, 3])) == [0, 0.5, 1, 1.5, 2]


def test_reproduces_epoch_huber_fit_from_4500_starts():
    runs = chinchilla_240()
    assert len(runs) == 240
    rounds = []
    fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, progress=lambda r, a, n: rounds.append((r, a, n)))
    law = fit.law
    assert bool(fit.result.converged)
    for name in ("E", "alpha", "beta"):
        assert float(getattr(law, name)) == pytest.approx(EPOCH_HUBER[name], rel=1e-3), name
    for name in ("A", "B"):
        assert float(getattr(law, name)) == pytest.approx(EPOCH_HUBER[name], rel=1e-2), name
    assert rounds[-1][1] == 0 and rounds[0][2] == 4500  # progress reported until no start is left
    assert fit.result.all_values.shape == (4500,)
    assert float(fit.result.value) == float(jnp.min(fit.result.all_values))
    # Every start that ends within 1% of the best objective ends at the same law: a unique point fit.
    from sdsl_jax.infer.point import rival_optima

    assert rival_optima(fit.result.all_params, fit.result.all_values, CHINCHILLA.theta_names,
                        converged=fit.result.all_converged) == ()


def test_rival_optima_names_the_coordinates_near_optimal_starts_disagree_on():
    from sdsl_jax.infer.point import rival_optima

    theta = np.array([[1.0, 2.0, -np.inf], [1.01, 3.0, -700.0], [5.0, 9.0, 0.0]])
    values = np.array([1.000, 1.005, 1.5])  # the third start is 50% worse: not a rival
    assert rival_optima(theta, values, ("a", "b", "e")) == ("b",)
    assert rival_optima(theta, np.array([1.0, np.inf, np.nan]), ("a", "b", "e")) == ()
    # A start that stopped short of a stationary point is no optimum, rival or not.
    assert rival_optima(theta, values, ("a", "b", "e"), converged=np.array([True, False, True])) == ()


def test_recovers_a_known_law_from_synthetic_runs():
    rng = np.random.default_rng(0)
    n = 10 ** rng.uniform(7, 10, 150)
    d = 10 ** rng.uniform(9, 12, 150)
    loss = np.asarray(pretraining_loss(n, d, HOFFMANN2022)) * np.exp(rng.normal(0, 1e-4, 150))
    # The summed loss is ~1e-6 here: SciPy's ftol rule (relative to max(|f|, 1)) would stop at
    # once, so the gradient rule decides.
    near = EPOCH_GRID[(EPOCH_GRID[:, 3] == 0.5) & (EPOCH_GRID[:, 4] == 0.5)]  # 180 of the 4,500 starts
    fit = fit_loss_law(n, d, loss, starts=near, ftol=0.0, gtol=1e-12)
    for name, true in HOFFMANN2022._asdict().items():
        assert float(getattr(fit.law, name)) == pytest.approx(true, rel=5e-3), name


def rosenbrock(theta, scale):
    x, y = theta
    return (1 - x) ** 2 + scale * (y - x**2) ** 2


def test_multistart_keeps_the_best_and_reports_convergence():
    starts = jnp.array([[-1.5, 2.0], [0.0, 0.0], [2.0, 2.0], [1.2, 1.2]])
    res = fit_multistart(rosenbrock, starts, args=(jnp.asarray(100.0),), gtol=1e-12, ftol=0.0)
    np.testing.assert_allclose(res.params, [1.0, 1.0], atol=1e-6)
    assert bool(res.converged) and np.all(res.all_converged)
    capped = fit_multistart(rosenbrock, starts, args=(jnp.asarray(100.0),), max_steps=3)
    assert not np.any(capped.all_converged) and int(capped.all_num_steps.max()) == 3


def test_progress_counts_starts_that_have_run_not_starts_dispatched(monkeypatch):
    from sdsl_jax.infer import point

    events = []
    real_wait = point.jax.block_until_ready
    monkeypatch.setattr(point.jax, "block_until_ready", lambda x: events.append("waited") or real_wait(x))
    starts = jnp.tile(jnp.array([[-1.5, 2.0], [1.2, 1.2]]), (70, 1))  # 140 starts: three compiled calls
    fit_multistart(rosenbrock, starts, args=(jnp.asarray(100.0),), one_by_one=True,
                   progress=lambda r, a, n: events.append((r, a)))
    reports = [i for i, e in enumerate(events) if e != "waited"]
    assert [events[i] for i in reports] == [(1, 76), (2, 12), (3, 0)]
    assert all(events[i - 1] == "waited" for i in reports)  # each report after its call has run


def regularised_logistic_loss(theta, features, labels):
    # Strictly convex and smooth: every start converges to the one minimum, superlinearly at the end,
    # so the step at which a start's gradient falls below a gtol well above the rounding floor (about
    # 1e-7 for this summed loss of ~40) does not move with rounding.
    margins = features @ theta
    return jnp.sum(jnp.logaddexp(0.0, margins) - labels * margins) + 0.5 * jnp.sum(theta**2)


def test_starts_run_one_by_one_end_where_they_end_vectorised():
    # Starts do not interact: one by one or in vmapped rounds (retired at different rounds, repacked,
    # padded), each ends at the same point after the same number of steps. A path that depends on
    # rounding (a line search on the edge of accepting a step) can end elsewhere when the vectorised
    # program rounds differently, so the objective is one where no start's path does.
    rng = np.random.default_rng(1)
    features = rng.normal(size=(60, 5))
    labels = (rng.uniform(size=60) < 0.5).astype(np.float64)
    starts = rng.normal(size=(100, 5)) * np.geomspace(0.1, 30, 100)[:, None]  # from a few steps to many
    fits = [fit_multistart(regularised_logistic_loss, starts, args=(jnp.asarray(features), jnp.asarray(labels)),
                           chunk_size=64, ftol=0.0, gtol=1e-5, one_by_one=flag) for flag in (True, False)]
    steps = [np.asarray(fit.all_num_steps) for fit in fits]
    assert np.ptp(steps[0]) >= 3  # the starts retire at different rounds
    np.testing.assert_array_equal(steps[0], steps[1])
    assert np.all(fits[0].all_converged) and np.all(fits[1].all_converged)
    np.testing.assert_allclose(np.asarray(fits[0].all_params), np.asarray(fits[1].all_params), rtol=1e-7, atol=1e-9)


def test_a_start_whose_line_search_finds_no_lower_point_is_not_reported_converged():
    # 60 runs with 1% scatter: every residual sits on Huber's linear part, where Armijo backtracking
    # stores curvature pairs with y.s <= 0 and its starts stall after a few steps, far from a
    # stationary point. Those starts did not converge, and the fit says so.
    import sdsl_jax.infer.point as point

    rng = np.random.default_rng(1)
    n, d = 10 ** rng.uniform(7, 10, 60), 10 ** rng.uniform(9, 12, 60)
    loss = np.asarray(pretraining_loss(n, d, HOFFMANN2022)) * np.exp(rng.normal(0, 0.01, 60))
    args = tuple(jnp.log(v) for v in (n, d, loss))
    starts = EPOCH_GRID[::45]
    fits = {ls: fit_multistart(point.loss_law_objective, starts, args=args, linesearch=ls, polish_steps=0)
            for ls in ("backtracking", "zoom")}
    for ls, fit in fits.items():
        grad_norm = np.linalg.norm(np.asarray(jax.vmap(jax.grad(point.loss_law_objective), (0, None, None, None))(
            fit.all_params, *args)), axis=1)
        converged = np.asarray(fit.all_converged)
        # No start that ended away from a stationary point is reported converged (the stalled ones end
        # near 6e-2, Huber's slope 1e-3 times the 60 rows; converged ones here at 1e-7 to 3e-5).
        assert not np.any(converged[grad_norm > 1e-3]), ls
        assert np.any(grad_norm > 1e-3), ls  # stalled starts exist under both line searches
    assert np.mean(fits["backtracking"].all_converged) < 0.5 < np.mean(fits["zoom"].all_converged)
    assert float(fits["zoom"].value) < 0.5 * float(fits["backtracking"].value)


def test_fit_needs_x64():
    with jax.enable_x64(False):
        with pytest.raises(RuntimeError, match="float64"):
            fit_loss_law([1e6, 1e7], [1e9, 1e9], [3.0, 2.9])


def test_acceptance_plane_recovery_and_weights():
    rng = np.random.default_rng(1)
    x, y = rng.uniform(5, 60, 80), rng.uniform(3, 20, 80)
    alpha = np.asarray(acceptance_rate(x, y, SDSL2026))
    exact = fit_acceptance_plane(x, y, alpha)
    np.testing.assert_allclose(exact.plane, SDSL2026, rtol=1e-10)
    assert float(exact.r_squared) == pytest.approx(1.0, abs=1e-12)

    noisy = alpha + rng.normal(0, 0.02, 80)
    w = rng.uniform(0.5, 2.0, 80)
    fit = fit_acceptance_plane(x, y, noisy, weights=w)
    design = np.stack([x, y, np.ones_like(x)], 1) * np.sqrt(w)[:, None]
    want, *_ = np.linalg.lstsq(design, noisy * np.sqrt(w), rcond=None)
    np.testing.assert_allclose(fit.plane, want, rtol=1e-10)
    np.testing.assert_allclose(fit_acceptance_plane(x, y, noisy, weights=3 * w).plane, want, rtol=1e-10)
    assert 0 < float(fit.r_squared) < 1


def _grid_runs(sizes, budgets):
    n, d = (np.array(v, np.float64).ravel() for v in np.meshgrid(sizes, budgets))
    return n, d, HOFFMANN2022.loss(n, d)


@pytest.mark.parametrize("family, sizes, budgets, column, fragment", [
    ("chinchilla", [1e7, 1e8], [1e9, 1e10, 1e11], "n_params", "at least 3 distinct model sizes N"),
    ("chinchilla", [1e7, 1e8, 1e9], [1e9, 1e10], "n_tokens", "at least 3 distinct token budgets D"),
    ("broken", [1e7, 1e8, 1e9], [1e9, 3e9, 1e10, 3e10, 1e11], "n_tokens", "at least 6 distinct token budgets D"),
    ("kaplan", [1e7, 1e8], [1e9, 1e10, 1e11], "n_params", "N term needs at least 3"),
    ("data", [1e7, 1e8], [1e9, 1e10], "n_tokens", "at least 3 distinct token budgets"),
])
def test_loss_law_data_that_cannot_identify_the_family_are_refused(family, sizes, budgets, column, fragment):
    n, d, loss = _grid_runs(sizes, budgets)
    with pytest.raises(IdentifiabilityError, match=fragment) as info:
        fit_loss_law(n, d, loss, family=FAMILIES[family], starts=FAMILIES[family].starts(
            np.log(n), np.log(d), np.log(loss))[:1])
    assert info.value.column == column


def test_loss_law_identifiability_accepts_enough_data_and_counts_rows():
    n, d, loss = _grid_runs([1e7, 1e8, 1e9], [1e9, 1e10, 1e11])
    check_loss_law_data(n, d, loss, family=CHINCHILLA)  # 9 runs, 3 x 3: identified
    one_size = np.full(4, 1e8), np.array([1e9, 1e10, 1e11, 1e12])
    check_loss_law_data(*one_size, HOFFMANN2022.loss(*one_size), family=FAMILIES["data"])  # no N term: one N is fine
    with pytest.raises(IdentifiabilityError, match="5 run.s. cannot identify the chinchilla law's 5"):
        check_loss_law_data(n[:5], d[:5], loss[:5], family=CHINCHILLA)
    with pytest.raises(IdentifiabilityError, match="takes one value"):
        check_loss_law_data(n, d, np.full_like(loss, 3.0), family=CHINCHILLA)


def test_budgets_within_one_percent_of_each_other_count_as_one_budget():
    # Five budgets a doubling apart, each also run 0.3% and 0.6% off (token counts rounded to
    # whole batches, as in the factorial ladder): 15 exact values, five points of the D curve.
    budgets = np.ravel(np.array([1e9, 2e9, 4e9, 8e9, 1.6e10])[:, None] * np.array([1.0, 1.003, 1.006]))
    n, d, loss = _grid_runs([1e7, 1e8, 1e9], budgets)
    check_loss_law_data(n, d, loss, family=CHINCHILLA)
    with pytest.raises(IdentifiabilityError, match=r"has 5 distinct value\(s\) \(15 before merging") as info:
        check_loss_law_data(n, d, loss, family=FAMILIES["broken"])
    assert info.value.column == "n_tokens"
    broken = FAMILIES["broken"]
    fit = fit_loss_law(n, d, loss, family=broken, starts=broken.starts(np.log(n), np.log(d), np.log(loss))[:2],
                       require_identified=False)  # a synthetic study's truth: any law that fits will do
    assert np.isfinite(float(fit.result.value))
    # A sixth budget makes the break identifiable; 1.1% apart is already another budget.
    n6, d6, loss6 = _grid_runs([1e7, 1e8, 1e9], np.append(budgets, 1.6e10 * 1.017))
    check_loss_law_data(n6, d6, loss6, family=FAMILIES["broken"])


@pytest.mark.parametrize("model", ["plane", "log-plane"])
def test_acceptance_data_that_cannot_identify_the_plane_are_refused(model):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(8, 40, 30), rng.uniform(4, 12, 30)
    alpha = 0.7 - 0.005 * x + 0.01 * y
    m = ACCEPTANCE_MODELS[model]
    fit_acceptance_plane(x, y, alpha, model=m)  # well posed
    for args, column, fragment in [
        ((x[:3], y[:3], alpha[:3]), None, "3 acceptance row"),
        ((x, np.full_like(y, 9.0), alpha), "ppl_target", "B cannot be identified"),
        ((np.full_like(x, 20.0), y, alpha), "ppl_draft", "A cannot be identified"),
        ((x, x, alpha), "ppl_target", "collinear"),
    ]:
        with pytest.raises(IdentifiabilityError, match=fragment) as info:
            fit_acceptance_plane(*args, model=m)
        assert info.value.column == column


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_states_its_priors_at_the_data_centre_and_returns_theta(name):
    """Every name of theta is a site of the prior's trace, and the returned theta is those sites;
    the power-law families' coefficient at N = 1 follows the centre (the term's size there is sampled)."""
    import numpyro
    import numpyro.distributions  # noqa: F401

    from sdsl_jax import DataCentre

    family = FAMILIES[name]

    def draw(centre):
        with numpyro.handlers.trace() as trace, numpyro.handlers.seed(rng_seed=3):
            theta = family.prior(centre)
        return theta, trace

    theta, trace = draw(DataCentre(13.0, 16.0, 14.0, 18.0))
    np.testing.assert_allclose(theta, [trace[n]["value"] for n in family.theta_names])
    moved, _ = draw(DataCentre(20.0, 24.0, 22.0, 26.0))  # same draws, another centre and span of D
    sampled = [n for n in family.theta_names if trace[n]["type"] == "sample"]
    np.testing.assert_allclose([moved[family.theta_names.index(n)] for n in sampled],
                               [theta[family.theta_names.index(n)] for n in sampled])
    if name in ("chinchilla", "broken"):
        i, alpha = family.theta_names.index("a"), theta[family.theta_names.index("alpha")]
        np.testing.assert_allclose(moved[i] - theta[i], alpha * 7.0, rtol=1e-12)  # a = a_ref + alpha log N_ref
    if name == "broken":  # the break moves with the data's span of D and stays inside it
        i = family.theta_names.index("log_d_break")
        np.testing.assert_allclose(moved[i] - theta[i], 8.0, rtol=1e-12)
        assert 14.0 < theta[i] < 18.0


def test_a_direction_that_does_not_descend_is_not_searched():
    # A curvature pair with y . s < 0 (the gradient fell along the step: negative curvature) makes
    # L-BFGS's direction point uphill; the guarded transformation returns a zero step instead, which
    # the line search accepts at its first trial and the decrease rule then stops.
    import optax

    from sdsl_jax.infer.point import _stop_without_descent

    plain, guarded = optax.scale_by_lbfgs(), _stop_without_descent(optax.scale_by_lbfgs())
    with jax.numpy_dtype_promotion("standard"):  # optax's counters mix int32 and int64, as in fit_multistart
        _check_descent_guard(plain, guarded)


def _check_descent_guard(plain, guarded):
    p0, p1 = jnp.array([0.0, 0.0]), jnp.array([1.0, 0.0])
    g0, g1 = jnp.array([1.0, 0.5]), jnp.array([0.5, 0.5])  # s = (1, 0), y = (-0.5, 0): y . s < 0
    for transform in (plain, guarded):
        _, state = transform.update(g0, transform.init(p0), p0)
        direction, _ = transform.update(g1, state, p1)
        slope = float(jnp.vdot(g1, direction))
        if transform is plain:
            assert slope <= 0  # uphill: what the guard is for
        else:
            np.testing.assert_array_equal(np.asarray(direction), 0.0)
    _, state = guarded.update(g0, guarded.init(p0), p0)
    np.testing.assert_allclose(np.asarray(guarded.update(jnp.array([2.0, 0.5]), state, p1)[0]),
                               np.asarray(plain.update(jnp.array([2.0, 0.5]), plain.update(g0, plain.init(p0), p0)[1],
                                                       p1)[0]))  # a descent direction passes unchanged


def test_the_first_ladders_chinchilla_fit_ends_at_a_minimum_scipy_cannot_improve():
    # Armijo backtracking stopped every start of this fit 0.45% above the optimum (a curvature pair
    # with y.s <= 0 stalls L-BFGS); the reported optimum must be one the independent SciPy fit,
    # started there with tight tolerances, cannot lower.
    import scipy.optimize

    from experiments.numpy_reference import loss_law_objective_and_grad
    from sdsl_jax.data import load_pretraining

    runs = load_pretraining("fits/ladder-v1/pretraining.csv")
    data = tuple(np.log(v) for v in (runs.n_params, runs.n_tokens, runs.loss))
    fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, starts=EPOCH_GRID[::5])
    stalled = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, starts=EPOCH_GRID[::5], linesearch="backtracking")
    assert float(fit.result.value) < float(stalled.result.value) * (1 - 1e-3)
    polished = scipy.optimize.minimize(loss_law_objective_and_grad, np.asarray(fit.result.params), args=(*data, 1e-3),
                                       jac=True, method="L-BFGS-B", options=dict(ftol=1e-15, gtol=1e-12))
    assert polished.fun >= float(fit.result.value) * (1 - 1e-9)
