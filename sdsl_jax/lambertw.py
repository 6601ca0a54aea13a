"""Real Lambert W, branches 0 and -1, with a log-space entry point for the lower branch.

The Lambert W function solves ``w * exp(w) = z``. On the reals it has two branches: ``W_0``
on ``[-1/e, inf)`` with ``W_0 >= -1`` and ``W_{-1}`` on ``[-1/e, 0)`` with ``W_{-1} <= -1``.

Algorithm (a fixed number of steps, so that it jits and vmaps):

1. An initial guess: near the branch point ``z = -1/e`` a polynomial in
   ``p = ±sqrt(2 (e z + 1))``, the interpolant of the branch-point series [Corless et al. 1996,
   eqs. 4.22-4.24] at the Chebyshev points of ``0 <= ±p <= 0.45``. Away from it (``z >= -0.25``),
   in float64, ``x P_k(x)`` with ``P_k`` a degree-7 polynomial fitted to ``W / x`` on each piece of
   ``x``: ``x = log(1 + z)`` on ``W_0`` (five pieces up to the largest float64), ``x = log(-z)`` on
   ``W_{-1}`` (two pieces down to ``x = -20``, below which the asymptotic series
   ``L1 - L2 + L2 / L1 + L2 (L2 - 2) / (2 L1^2)``, ``L1 = log(-z)``, ``L2 = log(-L1)`` [Corless et al.
   1996, eq. 4.19]); within 5e-5 of W (:func:`_branch0_start`, :func:`_branch_m1_start`). In float32,
   Winitzki's approximation ``L (1 - log(1 + L) / (2 + L))``, ``L = log(1 + z)`` [Winitzki 2003] on
   ``W_0`` and the asymptotic series to its third term on ``W_{-1}``.
2. Steps of Fritsch's iteration [Fritsch, Shafer & Crowley 1973; Veberic 2012, eq. 21], which is
   fourth order and works on ``log(z / w) - w`` so it never forms ``exp(w)`` and cannot overflow:
   a step from a relative error e leaves about 0.015 e^4, so one step from the float64 guesses ends
   at rounding; float32 takes two. The float64 guesses take a cheaper logarithm (:func:`_rough_log`,
   a polynomial within 1.5e-7) and the step fdlibm's (:func:`_log`, within one ulp; XLA's float64
   logarithm does not vectorise on CPUs)::

       zn  = log(z / w) - w
       q   = 2 (1 + w) (1 + w + 2 zn / 3)
       w  <- w + w zn (q - zn) / ((1 + w) (q - 2 zn))

   On float64 ``W_0`` the last step recovers the rounding of ``z / w`` exactly (its remainder, from
   products split into 26-bit halves), so that ``zn`` carries only the logarithm's rounding:
   :func:`_compensated_fritsch_step`.

3. Within ``|p| < 0.45`` of the branch point the polynomial is the answer: there it is within
   4e-18 of W (15 coefficients on ``W_0``, 17 on ``W_{-1}``, against 32 terms of the series
   itself), whereas the iteration divides rounding noise by ``1 + w ~ p``.
   ``e z + 1`` is formed as ``e (z + hi + lo)`` with ``1/e = hi + lo`` split in the working
   dtype, so the distance to the branch point is exact for inputs near it.

Derivatives are defined by ``custom_jvp`` (never by differentiating the iterations):
``W'(z) = W / (z (1 + W))``, written ``exp(-W) / (1 + W)`` on ``W_0`` so that ``W'(0) = 1`` and
higher derivatives at ``z = 0`` are right. For the log-space entry ``w(s) = W_{-1}(-exp(s))``,
``w + log(-w) = s`` gives ``dw/ds = w / (1 + w)``.

References:
  Corless, Gonnet, Hare, Jeffrey & Knuth (1996), "On the Lambert W function", Adv. Comput.
  Math. 5, 329-359. Dekker (1971), "A floating-point technique for extending the available
  precision", Numer. Math. 18, 224-242. Fritsch, Shafer & Crowley (1973), "Solution of the
  transcendental equation w e^w = x", Commun. ACM 16, 123-124. Sun Microsystems (1993), fdlibm
  5.3, e_log.c (the logarithm's reduction, arrangement and coefficients). Veberic (2012), "Lambert W
  function for applications in physics", Comput. Phys. Commun. 183, 2622-2628. Winitzki (2003),
  "Uniform approximations for transcendental functions", LNCS 2667, 780-789.
"""

from __future__ import annotations

import fractions
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = ["lambertw", "lambertw_m1_log"]

# The polynomial alone is the answer below |p| = 0.45 (within 4e-18 of W there); above it the
# iteration's rounding, divided by 1 + w ~ p, is below 4e-16 relative.
_SERIES_ONLY_BELOW = 0.45
_SERIES_GUESS_BELOW_Z = -0.25  # z below which the polynomial seeds the iteration (|p| < 0.81)
_NUM_FRITSCH_STEPS = 2
# Terms of the exact series that the interpolants are made from: at |p| = 0.45 the first one left
# out is below 1e-25 (the coefficients fall like 0.71^k).
_NUM_SERIES_TERMS = 50
# Coefficients of (W + 1) / p per branch: W within 3.1e-18 (W_0) and 2.1e-19 (W_{-1}) relative on
# 0 <= ±p <= 0.45, a few hundredths of an ulp, with one coefficient fewer 5.9e-18 and 6.2e-18
# (W_{-1}'s side lies nearer the series' singularity at p = -sqrt 2, so it needs more).
_NUM_INTERPOLANT_COEFFICIENTS = {0: 15, -1: 17}


def _branch_point_coefficients(num_terms: int) -> tuple[fractions.Fraction, ...]:
    """Coefficients mu_k of W = sum_k mu_k p^k, p = ±sqrt(2 (e z + 1)) [Corless 1996, eq. 4.23].

    Exact rational recurrence:
    mu_k = (k-1)/(k+1) (mu_{k-2}/2 + alpha_{k-2}/4) - alpha_k/2 - mu_{k-1}/(k+1),
    alpha_k = sum_{j=2}^{k-1} mu_j mu_{k+1-j}, mu_0 = -1, mu_1 = 1, alpha_0 = 2, alpha_1 = -1.
    """
    F = fractions.Fraction
    mu = [F(-1), F(1)]
    alpha = [F(2), F(-1)]
    for k in range(2, num_terms):
        alpha.append(sum((mu[j] * mu[k + 1 - j] for j in range(2, k)), F(0)))
        mu.append(
            F(k - 1, k + 1) * (mu[k - 2] / 2 + alpha[k - 2] / 4) - alpha[k] / 2 - mu[k - 1] / (k + 1)
        )
    return tuple(mu)


@functools.cache
def _branch_point_polynomial_coefficients(branch: int) -> tuple[float, ...]:
    """Coefficients c_j of ``W ~ -1 + p sum_j c_j p^j`` near the branch point, for ``branch`` 0
    (``p >= 0``) or -1 (``p <= 0``).

    The polynomial interpolates ``(W + 1) / p`` at the Chebyshev points of ``[0, ±0.45]``: close to
    the best polynomial of its degree there, it needs half the terms of the truncated series for the
    same accuracy (15 against 32 on ``W_0``). Made once per process, in exact rational arithmetic from
    :data:`_NUM_SERIES_TERMS` terms of the series (the nodes are the float64 Chebyshev points, so
    the interpolation is exact and only the coefficients' final rounding to float64 remains).
    Beyond ``|p| = 0.45`` it extrapolates smoothly: within 1.2e-7 of W up to ``|p| = 0.81``, where
    it seeds the iteration.
    """
    F = fractions.Fraction
    mu = _branch_point_coefficients(_NUM_SERIES_TERMS)
    n = _NUM_INTERPOLANT_COEFFICIENTS[branch]
    edge = _SERIES_ONLY_BELOW if branch == 0 else -_SERIES_ONLY_BELOW
    nodes = [F(edge / 2 * (1 - math.cos(math.pi * (2 * i + 1) / (2 * n)))) for i in range(n)]

    def w_plus_one_over_p(p):
        value = F(0)
        for m in reversed(mu[1:]):
            value = value * p + m
        return value

    # Gauss-Jordan elimination on the Vandermonde system, exact.
    rows = [[p**j for j in range(n)] + [w_plus_one_over_p(p)] for p in nodes]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows[col] = [v / rows[col][col] for v in rows[col]]
        for r in range(n):
            if r != col and rows[r][col]:
                factor = rows[r][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return tuple(float(row[n]) for row in rows)


_INV_E = fractions.Fraction(
    # 1/e to 40 digits; the split below needs more than a float64 carries.
    "0.3678794411714423215955237701614608674458"
)


def _inv_e_split(dtype) -> tuple[jax.Array, jax.Array]:
    hi = float(np.asarray(float(_INV_E), dtype))
    lo = float(_INV_E - fractions.Fraction(hi))
    return jnp.asarray(hi, dtype), jnp.asarray(lo, dtype)


def _distance_to_branch_point(z: jax.Array) -> jax.Array:
    """``e z + 1``, exact to rounding for z near -1/e (z + hi is exact there, by Sterbenz)."""
    hi, lo = _inv_e_split(z.dtype)
    # e (z + hi) + e lo, not e ((z + hi) + lo): XLA would fold hi + lo into one constant, undoing
    # the split; it does not distribute the product. (An optimisation barrier would also stop
    # that, but it stops XLA fusing the whole function into one loop as well.)
    return jnp.maximum(math.e * (z + hi) + math.e * lo, 0.0)


def _branch_point_series(p: jax.Array, branch: int) -> jax.Array:
    """W near the branch point from ``p`` (:func:`_branch_point_polynomial_coefficients`). The
    leading -1 is added last: summed into the chain, its rounding (an ulp of 1) would be two ulps
    of W near |p| = 0.45, where W is about -0.63 (W_0)."""
    coefficients = _branch_point_polynomial_coefficients(branch)
    value = jnp.full_like(p, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        value = value * p + c
    return -1.0 + p * value


def _fritsch_step(w: jax.Array, log_z_over_w: jax.Array) -> jax.Array:
    return _fritsch_update(w, log_z_over_w - w)


def _over(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a / b`` as ``a (1 / b)``. XLA's CPU fusion keeps a quotient whose value has several users
    in a loop of its own, and every extra loop over a large array is a pass through memory, which
    on large arrays costs more than W's arithmetic; a reciprocal does not stop the fusion. One more
    rounding, in terms the steps correct (a guess, a step's correction) or recover
    (the last step's quotient, whose remainder is computed exactly whatever its rounding)."""
    return a * (1.0 / b)


def _fritsch_update(w: jax.Array, zn: jax.Array) -> jax.Array:
    """One Fritsch step from ``w`` given its residual ``zn = log(z / w) - w``."""
    wp1 = 1.0 + w
    q = 2.0 * wp1 * (wp1 + (2.0 / 3.0) * zn)
    return w + _over(w * zn * (q - zn), wp1 * (q - 2.0 * zn))  # one division, not two


def _high_bits(x: jax.Array) -> jax.Array:
    """float64 ``x`` with the low 27 bits of its significand cleared: 26 significant bits, so that
    its product with any float64 of at most 27 significant bits is exact."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint64)
    return jax.lax.bitcast_convert_type(bits & np.uint64(0xFFFFFFFFF8000000), jnp.float64)


def _compensated_fritsch_step(w: jax.Array, z: jax.Array) -> jax.Array:
    """The last float64 Fritsch step on W_0, with ``zn = log(z / w) - w`` rounded only by the logarithm.

    ``w`` is first cut to 26 significant bits, ``w_h`` (its error of about 1e-8 grows by 1.5e-8 at
    most, and the step leaves 0.015 e^4). Then the rounding of ``q = z / w_h`` is recovered exactly:
    ``r = z - q w_h = (z - q_h w_h) - q_l w_h`` with ``q_h`` the top 26 bits of ``q`` and ``q_l = q -
    q_h`` the other 27: both products are exact, both differences exact by Sterbenz' lemma, and the
    remainder of a rounded quotient is representable [Dekker 1971]. So ``log(z / w_h) = log q + r / z``
    to second order in ``r / z ~ 1e-16``, and ``zn = (log q - w_h) + r / z``: ``log q - w_h`` is exact
    (Sterbenz again), so ``zn`` carries only the logarithm's rounding, which the step multiplies by
    ``w / (1 + w)``. Near ``W = -0.5`` the rounding of ``q`` and that of a sum ``log q + r / z`` would
    add up to two ulps. Bit operations, not Veltkamp's split: a compiler that contracts the split's
    multiply-subtract into a fused multiply-add would break it; here a contraction only makes an
    exact step exact again.
    """
    # Below |z| = 1e-290 the products' low parts, and the step's correction of a cut w, fall under
    # the smallest normal, which XLA on CPU flushes to zero: there w (= z (1 - z) to rounding) is
    # kept whole and the step is the plain one.
    compensate = jnp.abs(z) > 1e-290
    w_h = jnp.where(compensate, _high_bits(w), w)
    q = _over(z, w_h)
    q_h = _high_bits(q)
    r = jnp.where(compensate, (z - q_h * w_h) - (q - q_h) * w_h, 0.0)
    return _fritsch_update(w_h, (_log(q) - w_h) + _over(r, z))


def _split_exponent(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(k, f)`` with ``x = 2^k (1 + f)`` and ``1 + f`` in [sqrt(1/2), sqrt 2), for positive normal
    float64 ``x``, by integer operations on its bits (fdlibm's reduction [Sun 1993, e_log.c]:
    adding ``0x3ff00000 - 0x3fe6a09e`` to the high word carries into the exponent exactly when the
    significand is at least sqrt 2). ``f`` is exact."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint64) + np.uint64((0x3FF00000 - 0x3FE6A09E) << 32)
    k = (bits >> np.uint64(52)).astype(jnp.int64) - 1023
    m = (bits & np.uint64(0x000FFFFFFFFFFFFF)) + np.uint64(0x3FE6A09E << 32)
    return k.astype(x.dtype), jax.lax.bitcast_convert_type(m, jnp.float64) - 1.0


@functools.cache
def _log1p_over_x_fit(degree: int) -> tuple[float, ...]:
    """Coefficients (ascending) of a polynomial P with ``log(1 + f) ~ f P(f)`` on the reduced range
    [sqrt(1/2) - 1, sqrt 2 - 1]: the least-squares Chebyshev fit of ``log(1 + f) / f``, made once per
    degree. Absolute error of ``f P(f)``: 2.2e-4 for degree 3, 5.7e-6 for degree 5, 1.5e-7 for 7."""
    f = np.linspace(math.sqrt(0.5) - 1.0, math.sqrt(2.0) - 1.0, 4001)
    f = f[f != 0]
    fit = np.polynomial.chebyshev.chebfit(f, np.log1p(f) / f, degree)
    return tuple(float(c) for c in np.polynomial.chebyshev.cheb2poly(fit))


def _rough_log(x: jax.Array, degree: int = 7) -> jax.Array:
    """log(x) for positive normal float64 x to the absolute error of :func:`_log1p_over_x_fit`'s
    ``degree`` (1.5e-7 by default): the exponent from the bits (:func:`_split_exponent`) and
    ``f P(f)`` with ``degree + 1`` multiply-adds, no division. Enough for the float64 guesses, which
    the Fritsch step corrects (module docstring)."""
    coefficients = _log1p_over_x_fit(degree)
    k, f = _split_exponent(x)
    poly = jnp.full_like(f, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        poly = poly * f + c
    return k * math.log(2.0) + f * poly


# fdlibm's log [Sun 1993, e_log.c]: ln 2 split so that k ln2_hi is exact, and the minimax
# coefficients of R(z) ~ log((1 + s) / (1 - s)) / s - 2 in z = s^2, |error| < 2^-58.45.
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
       1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)


def _log(x: jax.Array) -> jax.Array:
    """log(x) for positive normal float64 x, within one ulp: fdlibm's algorithm [Sun 1993, e_log.c].

    ``x = 2^k (1 + f)`` (:func:`_split_exponent`), ``s = f / (2 + f)``, ``log(1 + f) = f - s (f - R)``
    arranged as ``f - (f^2/2 - s (f^2/2 + R))`` so that the leading terms cancel exactly. XLA's CPU
    logarithm does not vectorise in float64; this one does (docs/benchmarks.md). No special values:
    callers pass positive normal numbers (or patch the others after).
    """
    k, f = _split_exponent(x)
    half_f2 = 0.5 * f * f
    s = _over(f, 2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG[0] + w * (_LG[2] + w * (_LG[4] + w * _LG[6]))) + w * (_LG[1] + w * (_LG[3] + w * _LG[5]))
    return k * _LN2_HI - ((half_f2 - (s * (half_f2 + r) + k * _LN2_LO)) - f)


def _winitzki_or_series(z: jax.Array, series: jax.Array) -> jax.Array:
    """The first guess on float32 ``W_0``: the branch-point polynomial below z = -0.25, Winitzki's
    approximation ``L (1 - log(1 + L) / (2 + L))``, ``L = log(1 + z)``, above (within 3.6% of W)."""
    log1pz = jnp.log1p(jnp.maximum(z, _SERIES_GUESS_BELOW_Z))
    winitzki = log1pz * (1.0 - _over(jnp.log1p(log1pz), 2.0 + log1pz))
    return jnp.where(z < _SERIES_GUESS_BELOW_Z, series, winitzki)


# float64 guesses away from the branch point (:func:`_branch0_start`, :func:`_branch_m1_start`): W / x
# as one polynomial per piece of x between these edges, of degree _GUESS_DEGREE. W_0: x = log(1 + z)
# from z = -0.25 to the largest float64. W_{-1}: x = log(-z) from -20, below which the asymptotic series
# is the guess, to z = -0.25.
_W0_GUESS_EDGES = (math.log(0.75), 0.5, 4.0, 20.0, 110.0, math.log(np.finfo(np.float64).max))
_WM1_GUESS_EDGES = (-20.0, -3.3, math.log(0.25))
_GUESS_DEGREE = 7


def _w0_of_log1p_reference(y: np.ndarray) -> np.ndarray:
    """``W_0(e^y - 1)`` in float64 NumPy, to rounding, for ``y >= log(0.75)`` up to the largest float64's
    logarithm: from Winitzki's approximation, 40 steps of Halley's iteration on ``w e^w = z`` where
    ``y <= 1``, and of Newton's on ``w + log w = log z`` above (``e^w`` there could overflow; from
    within a few percent of the root either converges in a handful of steps)."""
    y = np.asarray(y, np.float64)
    w = y * (1.0 - np.log1p(y) / (2.0 + y))
    small = y <= 1.0
    z = np.expm1(np.where(small, y, 0.0))
    log_z = y + np.log(-np.expm1(-np.where(small, 1.0, y)))
    for _ in range(40):
        f = w * np.exp(np.where(small, w, 0.0)) - z
        halley = w - f / (np.exp(np.where(small, w, 0.0)) * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0))
        newton = w - (w + np.log(np.where(small, 1.0, w)) - log_z) / (1.0 + 1.0 / w)
        w = np.where(small, halley, newton)
    return w


def _wm1_of_log_reference(s: np.ndarray) -> np.ndarray:
    """``W_{-1}(-e^s)`` in float64 NumPy, to rounding, for ``s <= log(0.25)``: 40 Newton steps on
    ``w + log(-w) = s`` from ``s - log(-s)`` (the function is increasing and concave in ``w <= -1``,
    so from the first step on the iterates rise to the root)."""
    s = np.asarray(s, np.float64)
    w = s - np.log(-s)
    for _ in range(40):
        w = w - (w + np.log(-w) - s) / (1.0 + 1.0 / w)
    return w


@functools.cache
def _guess_coefficients(branch: int) -> tuple[tuple[float, ...], ...]:
    """Per piece of ``branch``'s guess edges, the coefficients (ascending powers of x) of a polynomial
    ``P`` of degree :data:`_GUESS_DEGREE` with ``W ~ x P(x)``: the least-squares Chebyshev fit of
    ``W / x`` at 200 Chebyshev points of the piece, from :func:`_w0_of_log1p_reference` or
    :func:`_wm1_of_log_reference`, made once per process. Within 5.0e-5 of W relative on every piece
    (``tests/test_lambertw.py`` checks the guesses against mpmath)."""
    edges, reference = ((_W0_GUESS_EDGES, _w0_of_log1p_reference) if branch == 0
                        else (_WM1_GUESS_EDGES, _wm1_of_log_reference))
    nodes = np.cos(np.pi * (np.arange(200) + 0.5) / 200)
    pieces = []
    for a, b in zip(edges[:-1], edges[1:]):
        x = 0.5 * (a + b) + 0.5 * (b - a) * nodes
        fit = np.polynomial.chebyshev.chebfit(nodes, reference(x) / x, _GUESS_DEGREE)
        monomial = np.polynomial.Chebyshev(fit, domain=[a, b]).convert(kind=np.polynomial.Polynomial)
        pieces.append(tuple(float(c) for c in monomial.coef))
    return tuple(pieces)


def _piecewise_polynomial(x: jax.Array, edges: tuple[float, ...],
                          pieces: tuple[tuple[float, ...], ...]) -> jax.Array:
    """The polynomial of x's piece (``pieces[k]`` between ``edges[k]`` and ``edges[k + 1]``, ascending
    coefficients) at x. The piece's coefficients are chosen by selects and summed in one Horner chain:
    no branch, no gather, so the loop stays one vectorised pass."""
    coefficients = [jnp.full_like(x, c) for c in pieces[0]]
    for edge, piece in zip(edges[1:-1], pieces[1:]):
        above = x >= edge
        coefficients = [jnp.where(above, new, c) for new, c in zip(piece, coefficients)]
    value = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        value = value * x + c
    return value


def _branch0_start(z: jax.Array, series: jax.Array) -> jax.Array:
    """W_0 to within 5.1e-5 relative for float64 ``z``, for the compensated Fritsch step to finish.

    The error budget: a Fritsch step from a relative error e leaves about 0.015 e^4, so the last step
    (with the accurate logarithm) ends at rounding from any e below 1e-4. Above z = -0.25 the guess is
    ``y P_k(y)`` with ``y = log(1 + z)`` from the rough logarithm (within 1.6e-7, which moves W by as
    much relative at most) and ``P_k`` the polynomial of y's piece (:func:`_guess_coefficients`,
    5.0e-5): one logarithm and one polynomial, no division. Below z = -0.25 the branch-point
    polynomial (1.2e-7). Below |z| = 1e-4 the start is ``z (1 - z)`` (relative error 1.5 z^2), where
    ``1 + z`` would round ``log(1 + z)`` too coarsely.
    """
    y = _rough_log(1.0 + jnp.maximum(z, _SERIES_GUESS_BELOW_Z))
    away = y * _piecewise_polynomial(y, _W0_GUESS_EDGES, _guess_coefficients(0))
    w = jnp.where(z < _SERIES_GUESS_BELOW_Z, series, away)
    return jnp.where(jnp.abs(z) < 1e-4, z * (1.0 - z), w)  # not z - z*z, which underflows (slowly)


def _branch0(z: jax.Array) -> jax.Array:
    hi, _ = _inv_e_split(z.dtype)
    delta = _distance_to_branch_point(z)
    p = jnp.sqrt(2.0 * delta)
    series = _branch_point_series(p, 0)
    # z/w -> 1 as z -> 0; keep the ratio defined there and patch z == 0 below.
    z_nz = jnp.where(z == 0, 1.0, z)
    if z.dtype == jnp.float64:
        w = _compensated_fritsch_step(jnp.where(z == 0, 1.0, _branch0_start(z, series)), z_nz)
    else:
        w = jnp.where(z == 0, 1.0, _winitzki_or_series(z, series))
        for _ in range(_NUM_FRITSCH_STEPS):
            w = _fritsch_step(w, jnp.log(_over(z_nz, w)))
    w = jnp.where(p < _SERIES_ONLY_BELOW, series, w)
    w = jnp.where(z == 0, 0.0, w)
    w = jnp.where(z == jnp.inf, jnp.inf, w)
    return jnp.where(z >= -hi, w, jnp.nan)  # -hi is the dtype's nearest value to -1/e


def _branch_m1_start(s: jax.Array, delta: jax.Array, series: jax.Array) -> jax.Array:
    """W_{-1}(-e^s) to within 5.1e-5 relative for float64 ``s``, for one Fritsch step to finish (the
    budget of :func:`_branch0_start`): the branch-point polynomial above s = log(0.25) (1.2e-7), ``s
    P_k(s)`` with ``P_k`` the polynomial of s's piece down to s = -20 (:func:`_guess_coefficients`,
    5.0e-5), and below it the asymptotic series to its fourth term, ``L1 - L2 + (L2 / L1) (1 + (L2 - 2)
    / (2 L1))`` with ``L1 = s``, ``L2 = log(-s)`` [Corless et al. 1996, eq. 4.19] (6.8e-6 at s = -20,
    less below; the rough logarithm's 1.5e-7 moves it by less)."""
    l1 = jnp.minimum(s, _WM1_GUESS_EDGES[0])
    l2 = _rough_log(-l1)
    over_l1 = 1.0 / l1
    asymptotic = l1 - l2 + l2 * over_l1 * (1.0 + 0.5 * (l2 - 2.0) * over_l1)
    x = jnp.clip(s, _WM1_GUESS_EDGES[0], _WM1_GUESS_EDGES[-1])
    pieces = x * _piecewise_polynomial(x, _WM1_GUESS_EDGES, _guess_coefficients(-1))
    w = jnp.where(s < _WM1_GUESS_EDGES[0], asymptotic, pieces)
    return jnp.where(delta < 1.0 + math.e * _SERIES_GUESS_BELOW_Z, series, w)


def _branch_m1(s: jax.Array, delta: jax.Array) -> jax.Array:
    """Shared W_{-1} solver from s = log(-z) and delta = e z + 1 (exact near the branch point).

    The iteration uses log(z / w) = s - log(-w): the ratio z / w itself underflows for tiny z.
    float64: one step with fdlibm's logarithm from :func:`_branch_m1_start`; -w is at least 1, a
    positive normal number. Its residual ``zn = log(z / w) - w`` is summed as ``(s - w) - log(-w)``:
    ``w <= s <= 0`` with ``|w| <= 2 |s|`` (``w^2 e^w <= 4 / e^2`` on ``w <= -1``), so ``s - w`` is exact
    by Sterbenz' lemma, and so is its difference with ``log(-w)`` near the root; ``zn`` then carries
    only the logarithm's rounding (and s's own), which the step multiplies by ``w / (1 + w)``.
    float32: two steps with XLA's logarithm from the asymptotic series.
    """
    p = -jnp.sqrt(2.0 * jnp.maximum(delta, 0.0))
    series = _branch_point_series(p, -1)
    if s.dtype == jnp.float64:
        w = _branch_m1_start(s, delta, series)
        w = _fritsch_update(w, (s - w) - _log(-w))
    else:
        l1 = jnp.minimum(s, -1.0)
        l2 = jnp.log(-l1)
        w = jnp.where(delta < 1.0 + math.e * _SERIES_GUESS_BELOW_Z, series, l1 - l2 + _over(l2, l1))
        for _ in range(_NUM_FRITSCH_STEPS):
            w = _fritsch_step(w, s - jnp.log(-w))
    return jnp.where(-p < _SERIES_ONLY_BELOW, series, w)


def _branch_m1_of_z(z: jax.Array) -> jax.Array:
    hi, _ = _inv_e_split(z.dtype)
    delta = _distance_to_branch_point(z)
    z_neg = jnp.where(z < 0, z, -1.0)
    if z.dtype == jnp.float64:  # fdlibm's log vectorises, XLA's float64 one does not (see _log)
        s = _log(jnp.maximum(-z_neg, np.finfo(np.float64).tiny))  # subnormal z reads as 0 (flushed), patched below
    else:
        s = jnp.log(-z_neg)
    w = _branch_m1(s, delta)
    w = jnp.where(z == 0, -jnp.inf, w)
    return jnp.where((z >= -hi) & (z <= 0), w, jnp.nan)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _lambertw(z: jax.Array, k: int) -> jax.Array:
    return _branch0(z) if k == 0 else _branch_m1_of_z(z)


@_lambertw.defjvp
def _lambertw_jvp(k, primals, tangents):
    (z,), (dz,) = primals, tangents
    w = _lambertw(z, k)
    if k == 0:
        dw_dz = jnp.exp(-w) / (1.0 + w)
    else:
        dw_dz = w / (z * (1.0 + w))
    return w, dw_dz * dz


def lambertw(z: ArrayLike, k: int = 0) -> jax.Array:
    """Real Lambert W: the solution w of ``w exp(w) = z`` on branch ``k``.

    Args:
      z: real array of any shape, float32 or float64 (integers are promoted).
      k: branch, ``0`` (``W_0 >= -1``, defined for ``z >= -1/e``) or ``-1``
        (``W_{-1} <= -1``, defined for ``-1/e <= z < 0``). A Python int, not traced.

    Returns:
      ``W_k(z)`` with the dtype of ``z``. NaN outside the real domain, ``-inf`` at ``z = 0`` on
      ``k = -1``, exactly ``-1`` at the dtype's nearest value to ``-1/e`` on both branches.

    The algorithm and its references are in the module docstring. Derivatives by ``custom_jvp``
    (``W' = W / (z (1 + W))``), so ``jax.grad`` of any order works and never differentiates
    through the iterations.
    """
    if k not in (0, -1):
        raise ValueError(f"lambertw: branch k must be 0 or -1 (real branches), got k={k!r}")
    (z,) = as_float(z)
    return _lambertw(z, k)


@jax.custom_jvp
def lambertw_m1_log_shifted(t: jax.Array) -> jax.Array:
    """``W_{-1}(-exp(t - 1))`` for ``t <= 0``: :func:`lambertw_m1_log` at ``s = t - 1``.

    For callers that hold ``t = s + 1`` exactly, such as ``t = (r - 1) log(alpha)`` in the
    optimal lookahead: near the branch point (``t -> 0``, alpha -> 1) the distance
    ``e z + 1 = -expm1(t)`` is then exact, whereas forming ``s`` first would round it away.
    Derivative ``dw/dt = w / (1 + w)``.
    """
    delta = -jnp.expm1(jnp.minimum(t, 0.0))
    w = _branch_m1(t - 1.0, delta)
    w = jnp.where(t == -jnp.inf, -jnp.inf, w)
    return jnp.where(t <= 0.0, w, jnp.nan)


@lambertw_m1_log_shifted.defjvp
def _lambertw_m1_log_shifted_jvp(primals, tangents):
    (t,), (dt,) = primals, tangents
    w = lambertw_m1_log_shifted(t)
    return w, w / (1.0 + w) * dt


def lambertw_m1_log(s: ArrayLike) -> jax.Array:
    """Lower branch from log space: ``W_{-1}(-exp(s))`` for ``s <= -1``.

    Solves ``w + log(-w) = s`` with ``w <= -1`` without forming ``-exp(s)``, which underflows
    for the arguments the optimal lookahead needs (docs/theory.md: ``s = (r - 1) log(alpha) - 1``
    reaches ``-1e4`` and beyond). Accurate for ``s`` down to ``-1e6`` and further in float32 and
    float64. Same algorithm as :func:`lambertw`, with ``log(z / w) = s - log(-w)``.

    Args:
      s: real array, float32 or float64.

    Returns:
      ``w`` with the dtype of ``s``; NaN for ``s > -1``, ``-1`` at ``s = -1``, ``-inf`` at
      ``s = -inf``. Derivative ``dw/ds = w / (1 + w)`` by ``custom_jvp``.
    """
    (s,) = as_float(s)
    return lambertw_m1_log_shifted(s + 1.0)
