"""log_ndtri and the truncated-normal quantile against mpmath and SciPy, gradients against finite differences."""

import jax
import mpmath
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy import stats

from sdsl_jax import log_ndtri, truncated_normal_quantile
from sdsl_jax.normal import log_ndtr_accurate, log_unit_interval_mass


def mp_log_ndtri(log_p: float) -> float:
    """The root of log Phi(x) = log_p at 60 digits."""
    with mpmath.workdps(60):
        target = mpmath.mpf(log_p)
        start = -mpmath.sqrt(-2 * target) if log_p < -2 else mpmath.mpf(stats.norm.ppf(np.exp(log_p)))
        return float(mpmath.findroot(lambda x: mpmath.log(mpmath.ncdf(x)) - target, start))


def mp_truncated_quantile(z: float, loc: float, scale: float) -> float:
    """``loc + scale Phi^{-1}(Phi(a)(1 - u) + Phi(b) u)``, ``u = Phi(z)``, at 60 digits.

    Mirrored so that the interval lies in the lower half (no cancellation: mpmath's exponents are
    unbounded, its mantissa is not), and inverted by a root of ``log Phi(x) = log p``.
    """
    with mpmath.workdps(60):
        loc, scale, z = mpmath.mpf(loc), mpmath.mpf(scale), mpmath.mpf(z)
        a, b = -loc / scale, (1 - loc) / scale
        sign = 1
        if a + b > 0:
            a, b, z, sign = -b, -a, -z, -1
        u = mpmath.ncdf(z)
        log_p = mpmath.log(mpmath.ncdf(a) * (1 - u) + mpmath.ncdf(b) * u)
        start = -mpmath.sqrt(-2 * log_p) if log_p < -2 else mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.exp(log_p) - 1)
        x = mpmath.findroot(lambda t: mpmath.log(mpmath.ncdf(t)) - log_p, start)
        return float(loc + scale * sign * x)


# Jitted once for the module: eager calls dispatch and compile every primitive of these
# functions one by one, which costs more than one compiled program each.
quantile = jax.jit(truncated_normal_quantile)
log_ndtri_jit = jax.jit(log_ndtri)


LOG_P = [-1e4, -3000.0, -745.0, -700.0, -100.0, -50.0, -10.0, -2.0, -0.7, -0.5, -1e-3, -1e-10]


@pytest.mark.parametrize("log_p", LOG_P)
def test_log_ndtri_matches_mpmath_in_float64(log_p):
    assert float(log_ndtri_jit(np.float64(log_p))) == pytest.approx(mp_log_ndtri(log_p), rel=5e-14, abs=1e-15)


def test_log_ndtri_stays_finite_in_float32_where_ndtri_of_exp_underflows():
    log_p = np.float32([-1e4, -200.0, -90.0, -10.0, -1e-3])
    got = np.asarray(log_ndtri_jit(log_p))
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_allclose(got, [mp_log_ndtri(float(v)) for v in log_p], rtol=2e-6)


@pytest.mark.parametrize("log_p", [-3000.0, -90.0, -5.0, -0.3, -1e-3])
def test_log_ndtri_gradient_matches_finite_differences(log_p):
    check_grads(log_ndtri_jit, (np.float64(log_p),), order=2, modes=["fwd", "rev"], eps=1e-3 * abs(log_p))


CASES = [(0.5, 0.02), (0.98, 0.05), (1.5, 0.02), (-0.3, 0.1), (0.5, 3.0), (0.02, 0.2)]


@pytest.mark.parametrize("loc, scale", CASES)
def test_truncated_quantile_matches_scipy_and_stays_in_the_unit_interval(loc, scale):
    z = np.linspace(-6.0, 6.0, 25)
    got = np.asarray(truncated_normal_quantile(z, loc, scale))  # eager here, jitted in the other tests
    np.testing.assert_allclose(got, [mp_truncated_quantile(v, loc, scale) for v in z], rtol=1e-12, atol=1e-15)
    a, b = (0.0 - loc) / scale, (1.0 - loc) / scale  # SciPy's, through u = Phi(z), to its own precision
    np.testing.assert_allclose(got, stats.truncnorm.ppf(stats.norm.cdf(z), a, b, loc=loc, scale=scale), rtol=1e-7,
                               atol=1e-12)
    assert (got >= 0).all() and (got <= 1).all()


def test_far_from_the_bounds_the_draw_is_the_untruncated_normal():
    z = np.linspace(-4.0, 4.0, 17)
    np.testing.assert_allclose(np.asarray(quantile(z, 0.55, 0.02)), 0.55 + 0.02 * z, atol=1e-15)


@pytest.mark.parametrize("loc", [-3.0, -0.2, 0.5, 1.2, 3.0])
def test_float32_draws_are_probabilities_even_for_a_mean_far_outside(loc):
    z = np.linspace(-8.0, 8.0, 33, dtype=np.float32)
    got = np.asarray(quantile(z, np.float32(loc), np.float32(0.01)))
    assert np.isfinite(got).all() and (got >= 0).all() and (got <= 1).all()
    assert (np.diff(got) >= 0).all()  # a quantile function: monotone in z


def test_truncated_quantile_gradients_match_finite_differences():
    for loc, scale in [(0.9, 0.1), (1.1, 0.05), (-0.1, 0.2)]:
        check_grads(lambda z, m, s: quantile(z, m, s), (0.3, loc, scale), order=1,
                    modes=["fwd", "rev"], eps=1e-6)


def mp_truncated_quantile_exact(z, loc, scale):
    """:func:`mp_truncated_quantile` as an mpf (for mpmath's own derivatives), at the caller's precision."""
    loc, scale, z = mpmath.mpf(loc), mpmath.mpf(scale), mpmath.mpf(z)
    a, b, sign = -loc / scale, (1 - loc) / scale, 1
    if a + b > 0:
        a, b, z, sign = -b, -a, -z, -1
    u = mpmath.ncdf(z)
    log_p = mpmath.log(mpmath.ncdf(a) * (1 - u) + mpmath.ncdf(b) * u)
    start = -mpmath.sqrt(-2 * log_p) if log_p < -2 else mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.exp(log_p) - 1)
    x = mpmath.findroot(lambda t: mpmath.log(mpmath.ncdf(t)) - log_p, start, tol=mpmath.mpf(10) ** (-70))
    return loc + scale * sign * x


# Inside, near a bound, a few dozen and hundreds of scales out, and past FAR (10^4 scales) on
# both sides, where the draw follows the tail form.
DERIVATIVE_CASES = [(0.3, 0.9, 0.1), (-1.2, -0.1, 0.2), (0.0, 0.5, 3.0), (-3.0, 0.02, 0.2), (1.0, -40.0, 0.5),
                    (0.5, 300.0, 0.01), (1.0, -2e4, 0.01), (-0.5, 2e4, 0.01)]


def mp_derivative(z, loc, scale, orders):
    with mpmath.workdps(80):
        return float(mpmath.diff(mp_truncated_quantile_exact, (z, loc, scale), orders))


@pytest.mark.parametrize("z, loc, scale", DERIVATIVE_CASES)
def test_truncated_quantile_gradient_matches_mpmath(z, loc, scale):
    grad = np.asarray(jax.grad(lambda v: quantile(v[0], v[1], v[2]))(np.array([z, loc, scale])))
    want = np.array([mp_derivative(z, loc, scale, tuple(int(i == j) for j in range(3))) for i in range(3)])
    # Entries that vanish by symmetry come out as rounding: absolute against the largest.
    np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-12 * np.abs(want).max())


# Inside (z = 0: the log-CDF pair's kink at 0 must not reach the derivatives), a few dozen scales
# out, and past FAR.
@pytest.mark.parametrize("z, loc, scale", [(0.0, 0.5, 3.0), (1.0, -40.0, 0.5), (1.0, -2e4, 0.01)])
def test_truncated_quantile_second_derivatives_match_mpmath(z, loc, scale):
    hess = np.asarray(jax.hessian(lambda v: quantile(v[0], v[1], v[2]))(np.array([z, loc, scale])))
    want = np.array([[mp_derivative(z, loc, scale, tuple(int(i == k) + int(j == k) for k in range(3)))
                      for j in range(i + 1)] + [0.0] * (2 - i) for i in range(3)])
    want = want + np.tril(want, -1).T
    np.testing.assert_allclose(hess, want, rtol=1e-5, atol=1e-10 * np.abs(want).max())


def test_draws_of_standard_normals_have_the_truncated_distribution():
    z = np.random.default_rng(0).standard_normal(20000)
    draws = np.asarray(quantile(z, 0.9, 0.15))
    result = stats.kstest(draws, stats.truncnorm((0 - 0.9) / 0.15, (1 - 0.9) / 0.15, loc=0.9, scale=0.15).cdf)
    assert result.pvalue > 0.01


def test_gradient_through_jit_and_vmap():
    f = jax.jit(jax.vmap(jax.grad(lambda m: quantile(0.5, m, 0.1))))
    g = np.asarray(f(np.array([0.2, 0.5, 0.95, 1.3])))
    assert np.isfinite(g).all() and (g > 0).all()


@pytest.mark.parametrize("loc, scale", [(0.5, 0.02), (-1.1, 0.05), (2.0, 0.01), (0.99, 0.3), (-40.0, 0.5)])
def test_log_unit_interval_mass_matches_mpmath_far_outside(loc, scale):
    with mpmath.workdps(60):
        m, s = mpmath.mpf(loc), mpmath.mpf(scale)
        a, b = -m / s, (1 - m) / s
        expected = float(mpmath.log(mpmath.ncdf(-a) - mpmath.ncdf(-b) if a + b > 0 else mpmath.ncdf(b) - mpmath.ncdf(a)))
    # JAX's log_ndtr below -20 is an asymptotic series good to about 1e-11.
    assert float(log_unit_interval_mass(loc, scale)) == pytest.approx(expected, rel=1e-10)


def test_log_ndtr_accurate_where_jax_loses_digits():
    x = np.array([-40.0, -5.0, 0.0, 3.0, 6.0, 7.5, 9.0])
    with mpmath.workdps(60):
        expected = [float(mpmath.log(mpmath.ncdf(v))) for v in x]
    np.testing.assert_allclose(np.asarray(log_ndtr_accurate(x)), expected, rtol=1e-13)


@pytest.mark.parametrize("loc", [-1e9, -2e4, -50.0, 51.0, 2e4, 1e9, -np.inf])
def test_a_mean_absurdly_far_outside_gives_a_draw_at_its_bound(loc):
    # A solver's grid reaches draft sizes of one parameter, where the plane's mean is -1e7.
    z = np.linspace(-5.0, 5.0, 11)
    got = np.asarray(quantile(z, loc, 0.01))
    bound = 0.0 if loc < 0 else 1.0
    assert np.isfinite(got).all() and (np.abs(got - bound) <= 0.01 * 10 / max(abs(loc - bound), 1.0) + 1e-300).all()
    assert (np.diff(got) >= 0).all()
    if np.isfinite(loc):  # mpmath's exact quantile, where it can be computed
        for v in (-2.0, 0.0, 2.0):
            expected = mp_truncated_quantile(v, loc, 0.01)
            # Thousands of scales out the draw's distance to the bound keeps ~eps a^2 relative error.
            assert float(quantile(v, loc, 0.01)) == pytest.approx(expected, rel=1e-7, abs=1e-300)
