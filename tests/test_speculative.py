"""Speculative-decoding theory against Leviathan et al., docs/theory.md check values (section 2) and brute force."""

import jax
import mpmath
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from jax.test_util import check_grads

from experiments import numpy_reference
from sdsl_jax import (
    acceptance_from_counts,
    acceptance_from_mean_length,
    acceptance_from_position_counts,
    expected_tokens,
    operations_factor,
    optimal_integer_lookahead,
    optimal_lookahead,
    optimal_throughput,
    speedup,
    throughput,
)

# Leviathan, Kalman & Matias (2023), Table 1 as printed (c = c_hat = 0): alpha, gamma,
# operations factor, walltime speed factor.
LEVIATHAN_TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]

# docs/theory.md: (alpha, c = N/M) -> gamma*.
GAMMA_STAR_CHECKS = [(0.70, 0.01, 9.34239), (0.65, 0.005, 9.47740), (0.80, 0.05, 7.85665), (0.50, 0.10, 2.24616)]


@pytest.mark.parametrize("alpha, gamma, ops, speed", LEVIATHAN_TABLE_1)
def test_leviathan_table_1(alpha, gamma, ops, speed):
    assert round(float(speedup(alpha, gamma, 0.0)), 2) == speed
    assert round(float(operations_factor(alpha, gamma, 0.0)), 2) == ops


def mp_gamma_star(alpha, c):
    """gamma* = (1 + W_{-1}(-alpha^(r-1)/e)) / ln(alpha) - r at 50 digits (docs/theory.md form)."""
    a, r = mpmath.mpf(alpha), 1 / mpmath.mpf(c)
    w = mpmath.lambertw(-(a ** (r - 1)) / mpmath.e, -1).real
    return float((1 + w) / mpmath.log(a) - r)


@pytest.mark.parametrize("alpha, c, want", GAMMA_STAR_CHECKS)
def test_gamma_star_check_values(alpha, c, want, maybe_jit):
    got = float(maybe_jit(optimal_lookahead)(alpha, c, 1.0))
    # docs/theory.md prints 5 decimals: the printed value is the rounded one ...
    assert round(got, 5) == want
    # ... and against the 50-digit closed form the error is far below 1e-6 relative.
    assert got == pytest.approx(mp_gamma_star(alpha, c), rel=1e-12)
    # The same optimum from sizes, from a cost ratio, and from latencies in seconds.
    assert float(optimal_lookahead(alpha, 1.0, 1.0 / c)) == pytest.approx(got, rel=1e-13)
    assert float(optimal_lookahead(alpha, 3e-4 * c, 3e-4)) == pytest.approx(got, rel=1e-13)


def test_gamma_star_against_scipy_closed_form_and_brute_force():
    rng = np.random.default_rng(0)
    alpha = rng.uniform(0.2, 0.97, 200)
    c = 10 ** rng.uniform(-3, -0.5, 200)
    got = np.asarray(optimal_lookahead(alpha, c, 1.0))
    scipy_closed_form = numpy_reference.optimal_lookahead(alpha, 1 / c)
    valid = np.isfinite(scipy_closed_form)  # scipy's argument alpha^(r-1)/e underflows for small alpha, large r
    assert valid.sum() > 150
    np.testing.assert_allclose(got[valid], scipy_closed_form[valid], rtol=1e-9, atol=1e-9)
    for a, cc, g in zip(alpha[:40], c[:40], got[:40]):
        res = scipy.optimize.minimize_scalar(
            lambda x: -numpy_reference.throughput(a, x, cc, 1.0), bounds=(0.0, 200.0), method="bounded",
            options={"xatol": 1e-10},
        )
        # T is flat at its maximum, so its argmax is known to ~sqrt(eps) from T values alone.
        assert g == pytest.approx(max(res.x, 0.0), rel=1e-5, abs=1e-5)


def test_optimal_throughput_is_the_maximum_over_gamma():
    rng = np.random.default_rng(1)
    gammas = np.linspace(0, 60, 60001)
    for alpha, n, m in zip(rng.uniform(0.3, 0.95, 20), 10 ** rng.uniform(5, 8, 20), 10 ** rng.uniform(9, 11, 20)):
        best = np.asarray(throughput(alpha, gammas, n, m)).max()
        t_star = float(optimal_throughput(alpha, n, m))
        g_star = float(optimal_lookahead(alpha, n, m))
        assert t_star == pytest.approx(best, rel=1e-8)
        assert t_star == pytest.approx(float(throughput(alpha, g_star, n, m)), rel=1e-12)
        assert t_star >= best * (1 - 1e-14)


def test_integer_lookahead_matches_integer_search():
    rng = np.random.default_rng(2)
    gammas = np.arange(0, 200)
    for alpha, c in zip(rng.uniform(0.1, 0.95, 100), 10 ** rng.uniform(-3, 0, 100)):
        want = gammas[np.argmax(numpy_reference.throughput(alpha, gammas, c, 1.0))]
        assert float(optimal_integer_lookahead(alpha, c, 1.0)) == want


def test_no_gain_regime_gives_zero_lookahead_and_target_alone():
    # r = M/N <= 1 has no stationary point; alpha small makes the stationary point negative.
    for alpha, n, m in [(0.9, 2.0, 1.0), (0.9, 1.0, 1.0), (0.05, 1.0, 3.0)]:
        assert float(optimal_lookahead(alpha, n, m)) == 0.0
        assert float(optimal_throughput(alpha, n, m)) == pytest.approx(1 / (2 * m), rel=1e-15)
        assert float(optimal_integer_lookahead(alpha, n, m)) == 0.0


def test_float32_is_finite_and_correct_up_to_ratio_1e4(maybe_jit):
    alpha = np.linspace(0.05, 0.99, 40)
    for r in [1.5, 10.0, 300.0, 3e3, 1e4]:
        g64 = np.asarray(optimal_lookahead(alpha, 1.0, r))
        t64 = np.asarray(optimal_throughput(alpha, 1.0, r))
        a32, one, r32 = jnp.asarray(alpha, jnp.float32), jnp.float32(1.0), jnp.float32(r)
        g32 = np.asarray(maybe_jit(optimal_lookahead)(a32, one, r32))
        t32 = np.asarray(maybe_jit(optimal_throughput)(a32, one, r32))
        assert g32.dtype == np.float32 and np.all(np.isfinite(g32)) and np.all(np.isfinite(t32))
        np.testing.assert_allclose(g32, g64, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(t32, t64, rtol=2e-5)


def test_stable_as_alpha_tends_to_one_and_zero():
    gamma = 7.0
    for alpha in [1 - 1e-6, 1 - 1e-10, 1 - 1e-14]:
        assert float(expected_tokens(alpha, gamma)) == pytest.approx(sum(alpha**i for i in range(8)), rel=1e-13)
        assert np.isfinite(jax.grad(expected_tokens)(alpha, gamma))
        assert np.isfinite(optimal_lookahead(alpha, 1.0, 100.0))
        assert np.isfinite(jax.grad(optimal_throughput)(alpha, 1.0, 100.0))
    # T* = log(alpha) / (2 N (1 - alpha) w) at 50 digits, alpha = 1 - 1e-12, r = 100.
    with mpmath.workdps(50):  # set here: the suite's other modules must not decide it
        a = mpmath.mpf(1 - 1e-12)  # the float input, exactly
        w = mpmath.lambertw(-(a**99) / mpmath.e, -1).real
        t_star = float(mpmath.log(a) / (2 * (1 - a) * w))
    assert float(optimal_throughput(1 - 1e-12, 1.0, 100.0)) == pytest.approx(t_star, rel=1e-12)
    for alpha in [1e-6, 1e-100, 1e-300]:
        assert float(expected_tokens(alpha, gamma)) == pytest.approx(sum(alpha**i for i in range(8)), rel=1e-14)
        assert float(optimal_lookahead(alpha, 1.0, 100.0)) == 0.0


@pytest.mark.parametrize("args", [(0.0, 3.0), (1.0, 3.0), (-0.2, 3.0), (1.5, 3.0), (0.7, -1.0), (np.nan, 3.0)])
def test_expected_tokens_outside_model_is_nan(args):
    assert np.isnan(expected_tokens(*args))


@pytest.mark.parametrize("args", [(0.7, 3.0, 0.0, 10.0), (0.7, 3.0, 1.0, -10.0), (1.2, 3.0, 1.0, 10.0), (0.7, -1.0, 1.0, 10.0)])
def test_throughput_outside_model_is_nan(args):
    assert np.isnan(throughput(*args))
    assert np.isnan(optimal_lookahead(args[0], args[2], args[3])) or args[1] < 0


def test_gradients_match_finite_differences():
    # Compiled: check_grads differentiates them to second order both ways, and eagerly every
    # operation of each derivative (Lambert W's iterations included) would compile on its own.
    check_grads(jax.jit(lambda a, g: throughput(a, g, 1e7, 1e9)), (0.7, 4.3), order=2, modes=("fwd", "rev"), eps=1e-6)
    check_grads(jax.jit(lambda a, r: optimal_lookahead(a, 1.0, r)), (0.7, 150.0), order=2, modes=("fwd", "rev"),
                eps=1e-6)
    check_grads(jax.jit(lambda a, r: optimal_throughput(a, 1.0, r)), (0.7, 150.0), order=2, modes=("fwd", "rev"),
                eps=1e-6)


def test_vmapped_over_a_grid(maybe_jit):
    alpha = jnp.linspace(0.3, 0.9, 7)[:, None]
    c = jnp.geomspace(1e-3, 1e-1, 5)[None, :]
    got = maybe_jit(optimal_lookahead)(alpha, c, 1.0)
    assert got.shape == (7, 5)
    vm = jax.vmap(jax.vmap(optimal_lookahead, (None, 0, None)), (0, None, None))(alpha[:, 0], c[0], 1.0)
    np.testing.assert_allclose(got, vm, rtol=1e-14)


@pytest.mark.parametrize("alpha, gamma", [(0.01, 1.0), (0.3, 3.0), (0.62, 5.0), (0.9, 7.0), (0.999, 12.0), (0.5, 2.5)])
def test_mean_acceptance_length_inverts_expected_tokens(alpha, gamma):
    tau = float(expected_tokens(alpha, gamma))
    # Oracle: SciPy's bracketing root finder on the forward map.
    oracle = scipy.optimize.brentq(lambda a: float(expected_tokens(a, gamma)) - tau, 1e-12, 1 - 1e-12, xtol=1e-15)
    got = float(acceptance_from_mean_length(tau, gamma))
    assert got == pytest.approx(alpha, abs=1e-12) and got == pytest.approx(oracle, abs=1e-11)


def test_mean_acceptance_length_gradients_match_finite_differences():
    def f(tau, gamma):
        return float(acceptance_from_mean_length(tau, gamma))

    for tau, gamma in [(1.3, 1.5), (2.2, 5.0), (6.5, 7.0)]:  # inside the domain (gamma >= 1) for central differences
        d_tau, d_gamma = (float(d) for d in jax.grad(acceptance_from_mean_length, (0, 1))(tau, gamma))
        h = 1e-6
        assert d_tau == pytest.approx((f(tau + h, gamma) - f(tau - h, gamma)) / (2 * h), rel=1e-6)
        assert d_gamma == pytest.approx((f(tau, gamma + h) - f(tau, gamma - h)) / (2 * h), rel=1e-6)
    batched = jax.jit(jax.vmap(jax.grad(acceptance_from_mean_length)))(jnp.array([1.5, 3.0]), jnp.array([3.0, 3.0]))
    assert np.all(np.isfinite(batched))


def test_mean_acceptance_length_edges_and_bad_input():
    got = acceptance_from_mean_length(jnp.array([1.0, 4.0, 0.5, 5.0, 2.0]), jnp.array([3.0, 3.0, 3.0, 3.0, 0.0]))
    assert got[0] == pytest.approx(0.0, abs=1e-12) and got[1] == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.isnan(got[2:]))  # tau < 1, tau > gamma + 1, gamma < 1


def test_position_counts_give_the_same_alpha_as_per_iteration_counts():
    rng = np.random.default_rng(0)
    gamma, steps = 5, 20_000
    accepted = np.minimum(rng.geometric(1 - 0.7, steps) - 1, gamma)
    counts = np.array([(accepted >= k).sum() for k in range(1, gamma + 1)])
    assert float(acceptance_from_position_counts(counts, steps)) == pytest.approx(
        float(acceptance_from_counts(accepted, gamma)), rel=1e-12)
    assert float(acceptance_from_position_counts(counts, steps)) == pytest.approx(0.7, abs=0.01)
    assert np.isnan(acceptance_from_position_counts(np.array([10, 20]), 30))  # counts cannot rise with k
    assert np.isnan(acceptance_from_position_counts(np.array([40, 20]), 30))  # more than the steps
