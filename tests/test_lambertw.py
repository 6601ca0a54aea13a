"""Lambert W against mpmath at 50 digits, special values, derivatives and properties."""

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from jax.test_util import check_grads

from sdsl_jax import lambertw, lambertw_m1_log

mpmath.mp.dps = 50
INV_E = float(1 / mpmath.e)


def mp_lambertw(z, k):
    return float(mpmath.lambertw(mpmath.mpf(float(z)), k).real)


def mp_lambertw_m1_log(s):
    return float(mpmath.lambertw(-mpmath.exp(mpmath.mpf(float(s))), -1).real)


def domain_points(dtype, k):
    """Log-spaced points across the branch's whole domain plus points near -1/e."""
    tiny, huge = (1e-300, 1e308) if dtype == np.float64 else (1e-37, 3e38)
    negative = -np.geomspace(tiny, INV_E * (1 - 1e-12), 1200)
    # z = -1/e + delta: distances 1e-16 .. 1e-1 (float32: from its resolution near 1/e).
    near = -INV_E + np.geomspace(1e-16 if dtype == np.float64 else 3e-8, 1e-1, 400)
    parts = [negative, near] + ([np.geomspace(tiny, huge, 1200)] if k == 0 else [])
    z = np.concatenate(parts).astype(dtype)
    return z[(z >= -INV_E) & (z != 0)]


def around(points, offsets):
    """Each point moved by every relative offset, on both sides: ``points (1 +- offsets)``."""
    return (np.asarray(points)[:, None] * (1 + np.concatenate([-offsets, offsets])[None, :])).ravel()


def relative_error(got, want):
    return np.abs(got.astype(np.float64) - want) / np.abs(want)


@pytest.mark.parametrize("k", [0, -1])
def test_float64_matches_mpmath_across_domain(k):
    z = domain_points(np.float64, k)
    got = np.asarray(jax.jit(lambertw, static_argnums=1)(jnp.asarray(z), k))
    want = np.array([mp_lambertw(x, k) for x in z])
    assert np.all(np.isfinite(got))
    assert relative_error(got, want).max() <= 2 * np.finfo(np.float64).eps


@pytest.mark.parametrize("k", [0, -1])
def test_float32_matches_mpmath_across_domain(k):
    z = domain_points(np.float32, k)
    got = np.asarray(lambertw(jnp.asarray(z), k))
    assert got.dtype == np.float32
    want = np.array([mp_lambertw(x, k) for x in z])
    assert np.all(np.isfinite(got))
    assert relative_error(got, want).max() <= 1e-5


@pytest.mark.parametrize(("k", "max_ulp"), [(0, 1), (-1, 2)])
def test_float64_near_the_branch_point_is_within_its_ulp_bound(k, max_ulp):
    # z placed by p = sqrt(2 (e z + 1)) from 1e-4 to 1.4: where the series alone answers, across
    # the switch to the iteration, and where the iteration's rounding is divided by 1 + w ~ p; densely
    # where that division costs most (|p| 0.3-1.4). W_0's step recovers its quotient's rounding; W_{-1}'s
    # residual (s - w) - log(-w) is exact but for the logarithm's rounding and that of s = log(-z)
    # (summed as (s - log(-w)) - w, the first difference rounds, and W-1 reaches 4 ulp at |p| 0.45-0.55).
    with mpmath.workdps(50):
        p = np.concatenate([np.geomspace(1e-4, 1.4, 600), np.geomspace(0.3, 1.4, 2000)])
        z = np.array([float((mpmath.mpf(v) ** 2 / 2 - 1) / mpmath.e) for v in p])
    z = z[z >= -INV_E]
    got = np.asarray(jax.jit(lambertw, static_argnums=1)(jnp.asarray(z), k))
    want = np.array([mp_lambertw(x, k) for x in z])
    assert (np.abs(got - want) / np.spacing(np.abs(want))).max() <= max_ulp


def test_float64_w0_is_within_two_ulp_where_its_guess_changes_method():
    # float64 W_0 starts from z (1 - z) below |z| = 1e-4, from the series below z = -0.25 and from
    # a polynomial in log(1 + z) of its piece elsewhere.
    from sdsl_jax.lambertw import _W0_GUESS_EDGES

    rng = np.random.default_rng(0)
    edges = np.concatenate([[1e-4, -1e-4, -0.25], np.expm1(_W0_GUESS_EDGES[1:-1])])
    # XLA on CPU flushes subnormals to zero, so the domain's ends are the smallest normal and the largest float.
    tiny, huge = np.finfo(np.float64).tiny, np.finfo(np.float64).max
    extremes = np.concatenate([np.geomspace(tiny, 1e-300, 40), -np.geomspace(tiny, 1e-300, 40),
                               np.geomspace(1e300, 1e308, 40), [huge]])
    z = np.concatenate([around(edges, np.geomspace(1e-15, 1e-2, 60)), extremes, rng.uniform(-INV_E, 10.0, 2000)])
    z = z[z > -INV_E]
    got = np.asarray(jax.jit(lambertw)(jnp.asarray(z)))
    want = np.array([mp_lambertw(x, 0) for x in z])
    assert relative_error(got, want).max() <= 2 * np.finfo(np.float64).eps


def test_float64_w0_is_within_4e16_where_w_is_near_minus_a_half():
    # Near W = -0.5 (z about -0.3) two ulp of W are 4.2e-16 relative, and the last step divides its
    # logarithm's rounding by 1 + w: the step's quotient is compensated (its remainder computed
    # exactly) and the series adds its leading -1 last, so that rounding stays within 4e-16 there.
    rng = np.random.default_rng(1)
    z = np.concatenate([rng.uniform(-0.345, -0.2, 3000), -INV_E + np.geomspace(1e-3, 0.17, 300)])
    got = np.asarray(jax.jit(lambertw)(jnp.asarray(z)))
    want = np.array([mp_lambertw(x, 0) for x in z])
    assert relative_error(got, want).max() <= 4e-16


def test_points_within_1e12_of_branch_point():
    z = -INV_E + np.geomspace(1e-17, 1e-12, 60)
    for k in (0, -1):
        got = np.asarray(lambertw(jnp.asarray(z), k))
        want = np.array([mp_lambertw(x, k) for x in z])
        assert relative_error(got, want).max() <= 2 * np.finfo(np.float64).eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_entry_matches_mpmath_down_to_minus_1e6(dtype):
    s = np.concatenate([-1 - np.geomspace(1e-12, 1e-1, 100), -np.geomspace(1.1, 1e6, 800)]).astype(dtype)
    got = np.asarray(lambertw_m1_log(jnp.asarray(s)))
    assert got.dtype == dtype
    want = np.array([mp_lambertw_m1_log(x) for x in s])
    tol = 2 * np.finfo(np.float64).eps if dtype == np.float64 else 1e-5
    assert relative_error(got, want).max() <= tol


def test_log_entry_agrees_with_z_entry_where_both_apply():
    s = -np.geomspace(1.0001, 600, 200)
    np.testing.assert_allclose(lambertw_m1_log(s), lambertw(-np.exp(s), -1), rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype, maybe_jit):
    w0 = maybe_jit(lambda z: lambertw(z, 0))
    wm1 = maybe_jit(lambda z: lambertw(z, -1))
    at = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    branch_point = at(-1 / math.e)  # the dtype's nearest value to -1/e
    assert float(w0(branch_point)) == -1.0 and float(wm1(branch_point)) == -1.0
    assert float(w0(at(0.0))) == 0.0
    assert float(wm1(at(0.0))) == -np.inf
    assert float(w0(at(np.inf))) == np.inf
    assert float(w0(at(math.e))) == pytest.approx(1.0, rel=1e-6)
    # Outside the real domain: NaN, never a wrong finite number.
    assert np.isnan(w0(at(-0.5))) and np.isnan(wm1(at(-0.5)))
    assert np.isnan(wm1(at(0.1))) and np.isnan(w0(at(np.nan)))
    assert float(lambertw_m1_log(at(-1.0))) == -1.0
    assert np.isnan(lambertw_m1_log(at(-0.99)))
    assert float(lambertw_m1_log(at(-np.inf))) == -np.inf


def test_shapes_vmap_and_integer_input():
    z = jnp.linspace(-0.3, 5.0, 12).reshape(3, 4)
    assert lambertw(z).shape == (3, 4)
    np.testing.assert_allclose(jax.vmap(lambertw)(z), lambertw(z), rtol=0)
    assert float(lambertw(1)) == pytest.approx(0.5671432904097838, rel=1e-15)


def test_bad_branch_is_a_clear_error():
    with pytest.raises(ValueError, match="branch k must be 0 or -1"):
        lambertw(1.0, k=1)


@pytest.mark.parametrize("z, k", [(-0.3, 0), (0.0, 0), (2.5, 0), (1e5, 0), (-0.3, -1), (-1e-3, -1), (-1e-30, -1)])
def test_derivatives_match_finite_differences(z, k):
    check_grads(lambda x: lambertw(x, k), (z,), order=2, modes=("fwd", "rev"), eps=abs(z) * 1e-5 or 1e-5)


def test_derivative_at_zero_is_one_and_second_is_minus_two():
    assert float(jax.grad(lambertw)(0.0)) == 1.0
    assert float(jax.grad(jax.grad(lambertw))(0.0)) == pytest.approx(-2.0, rel=1e-14)


@pytest.mark.parametrize("s", [-1.5, -10.0, -1e3, -1e6])
def test_log_entry_derivatives_match_finite_differences(s):
    check_grads(lambertw_m1_log, (s,), order=2, modes=("fwd", "rev"), eps=abs(s) * 1e-5)


def test_derivatives_do_not_differentiate_the_iterations():
    jaxpr = str(jax.make_jaxpr(jax.grad(lambertw))(1.0))
    # The custom rule's tangent is one expression in w; unrolled iterations would add many logs.
    assert jaxpr.count("log") < 8


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-INV_E, max_value=1e300))
def test_inverse_identity_branch0(z):
    w = float(lambertw(z))
    assert w >= -1.0
    assert w * math.exp(w) == pytest.approx(z, rel=1e-12, abs=1e-300) if w < 700 else math.isclose(
        math.log(z), w + math.log(w), rel_tol=1e-14
    )


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-INV_E, max_value=-1e-300))
def test_inverse_identity_and_ordering_branch_m1(z):
    w_m1, w_0 = float(lambertw(z, -1)), float(lambertw(z, 0))
    assert w_m1 <= -1.0 <= w_0
    # w + log(-w) = log(-z) is the well-conditioned form of w e^w = z on this branch.
    assert w_m1 + math.log(-w_m1) == pytest.approx(math.log(-z), rel=1e-13, abs=1e-13)


def test_the_logarithms_inside_float64_w_match_mpmath():
    """fdlibm's logarithm (the last Fritsch step's) within one ulp, the rough one (guesses, first
    steps) within 1.6e-7, from the smallest normal to the largest float and where the reduction
    switches exponent (significands near sqrt 2) and near 1 (where log x is small)."""
    from sdsl_jax.lambertw import _log, _rough_log

    rng = np.random.default_rng(2)
    tiny, huge = np.finfo(np.float64).tiny, np.finfo(np.float64).max
    near_sqrt2 = np.sqrt(2.0) * 2.0 ** rng.integers(-1000, 1000, 400) * (1 + rng.uniform(-1e-12, 1e-12, 400))
    x = np.concatenate([np.exp(rng.uniform(np.log(tiny), np.log(huge), 3000)), near_sqrt2,
                        1 + rng.uniform(-0.3, 0.45, 600), 1 + np.geomspace(1e-15, 1e-3, 100),
                        1 - np.geomspace(1e-16, 1e-3, 100), [tiny, huge, 1.0, 2.0, 0.5]])
    want = np.array([float(mpmath.log(mpmath.mpf(float(v)))) for v in x])
    got = np.asarray(jax.jit(_log)(jnp.asarray(x)))
    ulps = np.abs(got - want) / np.spacing(np.maximum(np.abs(want), np.finfo(np.float64).tiny))
    assert ulps.max() <= 1.0
    assert np.abs(np.asarray(jax.jit(_rough_log)(jnp.asarray(x))) - want).max() <= 1.6e-7


def _pieces_and_edges(edges, rng, per_piece=400):
    """Uniform points on every piece between ``edges`` and points within 1e-13..1e-3 (relative) of
    each inner edge, on both sides."""
    x = np.concatenate([rng.uniform(a, b, per_piece) for a, b in zip(edges[:-1], edges[1:])])
    return np.concatenate([x, around(edges[1:-1], np.geomspace(1e-13, 1e-3, 20))])


@pytest.mark.parametrize("branch", [0, -1])
def test_float64_guesses_are_within_their_budget_and_the_step_ends_at_rounding(branch):
    """The guess the last Fritsch step starts from, against mpmath: within 5.1e-5 relative (the step
    then ends at rounding from anything below 1e-4) on each piece of the guess's polynomials, on both
    sides of every edge and where the pieces end; and W itself within two ulp there. W_0's pieces lie
    in y = log(1 + z) from z = -0.25 to the largest float; W_{-1}'s in s = log(-z) from z = -0.25 down
    to s = -20, below which the asymptotic series guesses (here to s = -1e6)."""
    from sdsl_jax.lambertw import _W0_GUESS_EDGES, _WM1_GUESS_EDGES, _branch0_start, _branch_m1_start

    rng = np.random.default_rng(3)
    if branch == 0:
        ends = [-0.25, np.finfo(np.float64).max]
        z = np.concatenate([np.expm1(_pieces_and_edges(_W0_GUESS_EDGES, rng)), ends])
        z = z[np.abs(z) >= 1e-4]  # below, the start is z (1 - z)
        guess = np.asarray(jax.jit(lambda v: _branch0_start(v, jnp.zeros_like(v)))(jnp.asarray(z)))
        want = np.array([mp_lambertw(x, 0) for x in z])
        got = np.asarray(jax.jit(lambertw)(jnp.asarray(z)))
    else:
        far = -np.exp(rng.uniform(np.log(20.0), np.log(1e6), 400))
        s = np.concatenate([_pieces_and_edges(_WM1_GUESS_EDGES, rng), far, [math.log(0.25) - 1e-12]])
        delta = -np.expm1(s + 1.0)  # e z + 1 at z = -e^s
        start = jax.jit(lambda v, d: _branch_m1_start(v, d, jnp.zeros_like(v)))
        guess = np.asarray(start(jnp.asarray(s), jnp.asarray(delta)))
        want = np.array([mp_lambertw_m1_log(x) for x in s])
        got = np.asarray(jax.jit(lambertw_m1_log)(jnp.asarray(s)))
    assert relative_error(guess, want).max() <= 5.1e-5
    assert relative_error(got, want).max() <= 2 * np.finfo(np.float64).eps


@pytest.mark.parametrize("branch", [0, -1])
def test_branch_point_polynomial_matches_mpmath(branch):
    """The interpolant's float64 coefficients, summed in 40 digits, against W at the same p: within
    4e-18 where it is the answer (|p| <= 0.45), within 2e-7 where it seeds the iteration (to 0.81)."""
    from sdsl_jax.lambertw import _branch_point_polynomial_coefficients

    coefficients = [mpmath.mpf(c) for c in _branch_point_polynomial_coefficients(branch)]
    sign = 1 if branch == 0 else -1
    with mpmath.workdps(40):
        def error(p):
            p = mpmath.mpf(sign * p)
            exact = mpmath.lambertw((p**2 / 2 - 1) / mpmath.e, branch).real
            return float(abs((-1 + p * sum(c * p**j for j, c in enumerate(coefficients))) / exact - 1))

        assert max(error(p) for p in np.linspace(0.0, 0.45, 301)) <= 4e-18
        assert max(error(p) for p in np.linspace(0.45, 0.81, 40)) <= 2e-7


@pytest.mark.parametrize("k", [0, -1])
def test_wide_cpu_vectors_give_the_same_bits(k):
    # WIDE_CPU_VECTORS is offered to speed up programs like these: it must not move a bit.
    from sdsl_jax.runtime import WIDE_CPU_VECTORS

    z = jnp.asarray(np.concatenate([domain_points(np.float64, k), np.linspace(-1 / math.e, 0.0 if k else 5.0, 4001)[1:-1]]))
    default = jax.jit(lambda x: lambertw(x, k))(z)
    wide = jax.jit(lambda x: lambertw(x, k), compiler_options=WIDE_CPU_VECTORS)(z)
    np.testing.assert_array_equal(np.asarray(wide), np.asarray(default))
