"""Normal-distribution special functions that keep bounded quantities bounded.

* :func:`log_ndtri` -- the standard normal quantile of a probability given by its logarithm,
  ``x = Phi^{-1}(exp(log_p))``, finite in float32 and float64 down to ``log_p`` of -1e4 and below
  (``ndtri(exp(log_p))`` is -inf once ``exp`` underflows), with a custom JVP.
* :func:`truncated_normal_quantile` -- the draw of ``Normal(loc, scale)`` truncated to
  ``[low, high]`` that a standard normal ``z`` maps to (inverse-CDF transform,
  ``u = Phi(z)``). Every draw lies in ``[low, high]`` without clipping, and a residual far from the
  bounds is ``loc + scale z`` to rounding, so acceptance draws stay probabilities while a pair
  at alpha = 0.6 with a residual of 0.02 is drawn exactly as by an untruncated normal.

Derivations. The truncated variable's CDF is ``(Phi((x - loc)/scale) - Phi(a)) / (Phi(b) - Phi(a))``
with ``a, b`` the standardised bounds; solving for ``x`` at ``u``:
``x = loc + scale Phi^{-1}(Phi(a) (1 - u) + Phi(b) u)``. Evaluated in log space
(``log Phi`` is :func:`jax.scipy.special.log_ndtr`) when the interval lies in the lower half
(``a + b <= 0``) and through the mirror ``x -> -x`` otherwise, so neither tail cancels.
``d log_ndtri / d log_p = Phi(x) / phi(x) = exp(log_p - log phi(x))`` (inverse-function rule).

The draw's derivatives, from differentiating ``Phi(t) = Phi(a)(1 - u) + Phi(b) u`` with
``t = (x - loc)/scale``, ``du = phi(z) dz``, ``Z = Phi(b) - Phi(a)``:
``dx = (1 - w_a - w_b) dloc + (t - a w_a - b w_b) dscale + scale w_z dz`` with
``w_a = (1 - u) phi(a) / phi(t)``, ``w_b = u phi(b) / phi(t)``, ``w_z = Z phi(z) / phi(t)``
(``dloc + z dscale + scale dz`` far from the bounds, where the weights are 0, 0 and 1).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.scipy.special import log_ndtr, ndtri
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = ["log_ndtr_accurate", "log_ndtri", "log_unit_interval_mass", "truncated_normal_quantile"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_NEWTON_STEPS = 4
_FAR = 1e4


def _log_phi(x: jax.Array) -> jax.Array:
    return -0.5 * x * x - _LOG_SQRT_2PI


def log_ndtr_accurate(x: ArrayLike) -> jax.Array:
    """``log Phi(x)`` to rounding on the whole line.

    :func:`jax.scipy.special.log_ndtr` takes ``log(ndtr(x))`` for moderate positive x, which keeps
    only the absolute precision of ``ndtr`` near 1 (relative error 5e-8 at x = 6, 7% at x = 8);
    ``log1p(-exp(log_ndtr(-x)))`` keeps it relative.
    """
    (x,) = as_float(x)
    return _log_ndtr_both(x)[0]


def _log_ndtr_both(z: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log Phi(z), log Phi(-z))``, each as :func:`log_ndtr_accurate` gives it, from one tail."""
    lower = z <= 0
    near = jnp.where(lower, z, -z)  # -|z|, with the right derivative of both at z = 0
    # One log_ndtr, no ndtr beside it: each is a large program (branches and series), compiled
    # once per use and again in every derivative; exp(log Phi) is Phi to an ulp at near <= 0.
    log_tail = log_ndtr(near)
    log_rest = jnp.log1p(-jnp.exp(log_tail))  # Phi(near) <= 1/2: no cancellation
    return jnp.where(lower, log_tail, log_rest), jnp.where(lower, log_rest, log_tail)


@jax.custom_jvp
def log_ndtri(log_p: ArrayLike) -> jax.Array:
    """``Phi^{-1}(exp(log_p))`` for ``log_p <= 0``: the standard normal quantile from a log probability.

    Three regions: ``p`` above 1/2 through the complement ``-Phi^{-1}(-expm1(log_p))`` (no
    cancellation near 1); ``p`` a normal float through ``ndtri(p)``; below that (``exp`` would
    underflow) Newton's method on ``log_ndtr(x) = log_p`` from the tail asymptote
    ``x ~ -sqrt(t - ln t - ln 2 pi)``, ``t = -2 log_p``, whose relative error is below 1% there, so
    four steps reach rounding. NaN for ``log_p > 0``.
    """
    (lp,) = as_float(log_p)
    tiny_log = math.log(jnp.finfo(lp.dtype).tiny) + 10.0
    upper = lp > -math.log(2.0)
    mid_lp = jnp.clip(lp, tiny_log, 0.0)
    # One ndtri for both central regions: of p below 1/2, of 1 - p above (and the sign flipped).
    central = jnp.where(upper, -1.0, 1.0) * ndtri(jnp.where(upper, -jnp.expm1(mid_lp), jnp.exp(mid_lp)))
    deep_lp = jnp.minimum(lp, tiny_log)
    t = -2.0 * deep_lp

    def newton(_, x):
        log_cdf = log_ndtr(x)
        return x - (log_cdf - deep_lp) * jnp.exp(log_cdf - _log_phi(x))

    deep = jax.lax.fori_loop(0, _NEWTON_STEPS, newton, -jnp.sqrt(t - jnp.log(t) - 2.0 * _LOG_SQRT_2PI))
    out = jnp.where(lp < tiny_log, deep, central)
    return jnp.where(lp > 0, jnp.nan, out)


@log_ndtri.defjvp
def _log_ndtri_jvp(primals, tangents):
    (lp,), (dlp,) = primals, tangents
    x = log_ndtri(lp)
    return x, jnp.exp(jnp.asarray(lp, x.dtype) - _log_phi(x)) * dlp


def _lower_standard_quantile(a: jax.Array, b: jax.Array, log_u: jax.Array, log_1mu: jax.Array) -> jax.Array:
    """``Phi^{-1}(Phi(a)(1 - u) + Phi(b) u)`` from ``log u`` and ``log(1 - u)``, in log space (accurate for ``a + b <= 0``)."""
    # a <= 0 here (a < b and a + b <= 0), where log_ndtr is accurate as it stands.
    log_p = jnp.logaddexp(log_1mu + log_ndtr(a), log_u + log_ndtr_accurate(b))
    return log_ndtri(jnp.minimum(log_p, 0.0))


def truncated_normal_quantile(z: ArrayLike, loc: ArrayLike, scale: ArrayLike, *, low: float = 0.0,
                              high: float = 1.0) -> jax.Array:
    """The draw of ``Normal(loc, scale)`` truncated to ``[low, high]`` at the standard normal ``z``.

    ``u = Phi(z)`` is the draw's quantile, so ``z ~ Normal(0, 1)`` gives truncated-normal draws; far
    from the bounds the result is ``loc + scale z``. ``loc`` may lie outside ``[low, high]`` (the
    draw then sits near the nearer bound, never beyond it); ``scale`` must be positive.
    Differentiable in ``z``, ``loc`` and ``scale`` by a closed-form rule (module docstring), so
    derivatives of any order never pass through the quantile's own branches and iterations.
    """
    z, loc, scale = as_float(z, loc, scale)
    low, high = float(low), float(high)
    # The quantile is computed once, outside differentiation; its derivatives of every order come
    # from the closed-form rule of _with_quantile_derivatives, which takes the computed draw as
    # an input and so never evaluates the quantile again (in a Newton step's second derivative the
    # quantile's branches and iterations would otherwise be compiled several times over).
    x = jax.lax.stop_gradient(_truncated_quantile(z, loc, scale, low, high))
    return _with_quantile_derivatives(x, z, loc, scale, low, high)


def _truncated_quantile(z: jax.Array, loc: jax.Array, scale: jax.Array, low: float, high: float) -> jax.Array:
    a, b = (low - loc) / scale, (high - loc) / scale
    # More than FAR scales outside, the draw's distance to the bound is exponential with rate |a|
    # (relative error 1/a^2), where the exact form cancels (loc + scale s with s ~ a: error eps a^2).
    below, above = a > _FAR, b < -_FAR
    far = below | above
    a_in, b_in = jnp.where(far, -1.0, a), jnp.where(far, 1.0, b)
    # u = Phi(z) in logs, once: log u and log(1 - u) serve the exact form and both tails.
    log_u, log_1mu = _log_ndtr_both(z)
    # The interval in the lower half as it stands, else its mirror x -> -x (then u <-> 1 - u, s -> -s).
    mirror = a_in + b_in > 0
    s = jnp.where(mirror, -1.0, 1.0) * _lower_standard_quantile(
        jnp.where(mirror, -b_in, a_in), jnp.where(mirror, -a_in, b_in), jnp.where(mirror, log_1mu, log_u),
        jnp.where(mirror, log_u, log_1mu))
    exact = loc + scale * s
    from_low = low + scale * (-log_1mu) / jnp.where(below, a, 1.0)
    from_high = high - scale * (-log_u) / jnp.where(above, -b, 1.0)
    draw = jnp.where(below, from_low, jnp.where(above, from_high, exact))
    # The draw lies in [low, high] exactly; rounding can step an ulp past a bound when it sits on
    # it, which min/max undo (a no-op everywhere else).
    return jnp.minimum(jnp.maximum(draw, low), high)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _with_quantile_derivatives(x: jax.Array, z: jax.Array, loc: jax.Array, scale: jax.Array, low: float,
                               high: float) -> jax.Array:
    """``x``, the truncated quantile at ``(z, loc, scale)``, carrying its derivatives in those."""
    return jnp.broadcast_to(x, jnp.broadcast_shapes(x.shape, z.shape, loc.shape, scale.shape))


def _with_quantile_derivatives_jvp(low, high, primals, tangents):
    """``dx = (1 - w_a - w_b) dloc + (t - a w_a - b w_b) dscale + scale w_z dz`` (module docstring).

    Each weight is a ratio of normal densities formed in logs, its exponent a product of
    differences (``(t^2 - a^2)/2 = (x - low)(x + low - 2 loc)/(2 scale^2)``) so that it does not
    cancel when the draw sits at a bound. More than FAR scales outside, the derivative of the
    tail form the primal uses there instead. ``x`` is used through this function itself, so that
    higher derivatives take its derivative from this rule. Terms whose input does not move are
    left out of the program (the N* solver moves ``loc`` alone, so ``w_z`` and its normaliser
    are never compiled there).
    """
    x, z, loc, scale = primals
    _, dz, dloc, dscale = (None if isinstance(t, SymbolicZero) else t for t in tangents)
    x = _with_quantile_derivatives(x, z, loc, scale, low, high)
    a, b = (low - loc) / scale, (high - loc) / scale
    below, above = a > _FAR, b < -_FAR
    log_u, log_1mu = _log_ndtr_both(z)
    # Tails: x = low + scale^2 E / g with g = low - loc, E = -log(1 - u), dE/dz = phi(z) / (1 - u);
    # at the upper bound x = high - scale^2 E / g with g = loc - high, E = -log u, dE/dz = -phi(z) / u.
    gap = jnp.where(below, low - loc, jnp.where(above, loc - high, 1.0))
    log_rest = jnp.where(below, log_1mu, log_u)
    tail = -log_rest
    exact, far = jnp.zeros_like(x), jnp.zeros_like(x)
    if dloc is not None or dscale is not None:
        two_var = 2.0 * scale * scale
        w_a = jnp.exp(log_1mu + (x - low) * (x + low - 2.0 * loc) / two_var)
        w_b = jnp.exp(log_u + (x - high) * (x + high - 2.0 * loc) / two_var)
        if dloc is not None:
            exact = exact + (1.0 - w_a - w_b) * dloc
            far = far + scale * scale * tail / (gap * gap) * dloc
        if dscale is not None:
            t = (x - loc) / scale
            exact = exact + (t - a * w_a - b * w_b) * dscale
            far = far + jnp.where(below, 2.0, -2.0) * scale * tail / gap * dscale
    if dz is not None:
        t = (x - loc) / scale
        w_z = jnp.exp(log_unit_interval_mass(loc, scale, low=low, high=high) + 0.5 * (t - z) * (t + z))
        exact = exact + scale * w_z * dz
        far = far + scale * scale / gap * jnp.exp(_log_phi(z) - log_rest) * dz
    return x, jnp.where(below | above, far, exact)


_with_quantile_derivatives.defjvp(_with_quantile_derivatives_jvp, symbolic_zeros=True)


def log_unit_interval_mass(loc: ArrayLike, scale: ArrayLike, *, low: float = 0.0, high: float = 1.0) -> jax.Array:
    """``log(Phi(b) - Phi(a))``, the log probability of ``Normal(loc, scale)`` on ``[low, high]``.

    Through the mirror so that the interval lies in the lower half (``a + b <= 0``), then
    ``log Phi(b) + log1p(-exp(log Phi(a) - log Phi(b)))``: finite however far ``loc`` lies outside
    (a truncated normal's normaliser, where ``log(ndtr(b) - ndtr(a))`` is ``log 0``).
    """
    loc, scale = as_float(loc, scale)
    a, b = (low - loc) / scale, (high - loc) / scale
    lower = a + b <= 0
    a, b = jnp.where(lower, a, -b), jnp.where(lower, b, -a)
    # a <= 0 here (a <= b and a + b <= 0), where log_ndtr is accurate as it stands.
    log_b, log_a = log_ndtr_accurate(b), log_ndtr(a)
    return log_b + jnp.log1p(-jnp.exp(log_a - log_b))
