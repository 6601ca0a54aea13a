"""Speculative-decoding theory: expected tokens, cost, throughput and the optimal lookahead.

One iteration: the draft proposes ``gamma`` tokens, the target verifies them in one pass. With
i.i.d. per-token acceptance ``alpha`` [Leviathan, Kalman & Matias 2023, eq. 1]::

    E[tokens / iteration] = (1 - alpha^(gamma+1)) / (1 - alpha)

Cost model. An iteration costs ``gamma`` draft steps and one target step. A step of a model with
``n`` parameters costs ``flops_per_param * n`` (2 FLOPs per parameter per token by default, the
SDSL FLOP model), so::

    T(gamma; N, M, alpha) = E[tokens] / (2 N gamma + 2 M)                  tokens per FLOP

Only ``c = N / M`` matters for the optimum, so ``n_draft`` and ``m_target`` may be any per-token
costs of the two models (parameters, measured FLOPs, or latencies in seconds with
``flops_per_param=1`` to get tokens per second): the same optimum serves a wall-clock model.

Continuous optimum (dT/dgamma = 0, ``r = M / N``), with ``w = W_{-1}(-alpha^(r-1)/e)`` [docs/theory.md]::

    gamma* = (1 + w) / log(alpha) - r = log(-w) / log(1/alpha) - 1
    T*     = log(alpha) / (2 N (1 - alpha) w)

The second form of gamma* follows from ``w + log(-w) = (r - 1) log(alpha) - 1`` and avoids the
cancellation of two numbers of size ``r``: it stays exact in float32 for ``r`` up to 1e4 and far
beyond. ``w`` is evaluated from log space (:func:`lambertw_m1_log`), since ``alpha^(r-1)``
underflows.

Outside the model (``alpha`` not in (0, 1), a non-positive size or cost, ``gamma < 0``) these
pure functions return NaN; the user-facing helpers in :mod:`sdsl_jax.optimum` raise instead.

References:
  Leviathan, Kalman & Matias (2023), "Fast Inference from Transformers via Speculative
  Decoding", ICML, eq. 1, Thm 3.8 (walltime), Thm 3.11 (arithmetic operations), Table 1.
  Chen et al. (2023), "Accelerating Large Language Model Decoding with Speculative Sampling".
  SDSL (2026), arXiv 2603.11053: the FLOP model and the Lambert-W optimum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float
from sdsl_jax.lambertw import lambertw_m1_log_shifted

__all__ = [
    "expected_tokens",
    "acceptance_from_mean_length",
    "acceptance_from_position_counts",
    "iteration_cost",
    "throughput",
    "speedup",
    "operations_factor",
    "optimal_lookahead",
    "optimal_integer_lookahead",
    "optimal_throughput",
    "optimal_lookahead_and_throughput",
]


def _valid_alpha(alpha: jax.Array) -> jax.Array:
    return (alpha > 0) & (alpha < 1)


def _nan_unless(ok: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.where(ok, x, jnp.nan)


def _expected_tokens(alpha: jax.Array, gamma: jax.Array) -> jax.Array:
    # (1 - a^(g+1)) / (1 - a) as a ratio of expm1's: both keep full relative precision as
    # log(a) -> 0, so the alpha -> 1 limit (g + 1) is reached smoothly, gradients included.
    log_a = jnp.log(jnp.where(_valid_alpha(alpha), alpha, 0.5))
    return jnp.expm1((gamma + 1.0) * log_a) / jnp.expm1(log_a)


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike) -> jax.Array:
    """Expected tokens produced per iteration, ``(1 - alpha^(gamma+1)) / (1 - alpha)``.

    Args:
      alpha: per-token acceptance rate in (0, 1).
      gamma: lookahead (drafted tokens per iteration), >= 0; need not be an integer.

    Returns:
      The expectation, broadcast over the inputs; NaN outside the model.

    References:
      Leviathan et al. (2023), eq. 1.
    """
    alpha, gamma = as_float(alpha, gamma)
    ok = _valid_alpha(alpha) & (gamma >= 0)
    return _nan_unless(ok, _expected_tokens(alpha, jnp.where(ok, gamma, 0.0)))


@jax.custom_jvp
def _invert_expected_tokens(tau: jax.Array, gamma: jax.Array) -> jax.Array:
    # E(alpha) = 1 + alpha + ... + alpha^gamma rises strictly on (0, 1): bisection, 100 halvings
    # (below float64 resolution), fully vectorised; the derivative comes from the jvp rule.
    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        below = _expected_tokens(mid, gamma) < tau
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 100, halve, (jnp.zeros_like(tau), jnp.ones_like(tau)))
    return 0.5 * (lo + hi)


@_invert_expected_tokens.defjvp
def _invert_expected_tokens_jvp(primals, tangents):
    # Implicit function theorem on E(alpha, gamma) = tau:
    # d alpha = (d tau - dE/dgamma d gamma) / (dE/dalpha).
    tau, gamma = primals
    d_tau, d_gamma = tangents
    alpha = _invert_expected_tokens(tau, gamma)
    inner = jnp.clip(alpha, 1e-12, 1 - 1e-12)  # the derivatives' limits at 0 and 1 are finite
    _, de_dalpha = jax.jvp(lambda a: _expected_tokens(a, gamma), (inner,), (jnp.ones_like(inner),))
    _, de_dgamma = jax.jvp(lambda g: _expected_tokens(inner, g), (gamma,), (jnp.ones_like(gamma),))
    return alpha, (d_tau - de_dgamma * d_gamma) / de_dalpha


def acceptance_from_mean_length(mean_length: ArrayLike, gamma: ArrayLike) -> jax.Array:
    """Alpha from a mean acceptance length: the root of ``(1 - alpha^(gamma+1)) / (1 - alpha) = tau``.

    Serving engines (vLLM, SGLang, HF assisted generation) report the mean number of tokens
    produced per speculative step at a fixed lookahead; under i.i.d. acceptance that is
    :func:`expected_tokens`, which rises strictly in alpha, so alpha is unique.

    Args:
      mean_length: tau, tokens per step INCLUDING the target's own token (1 + mean accepted
        drafts), in ``[1, gamma + 1]``. An engine that reports accepted drafts only gives tau - 1.
      gamma: the lookahead the engine used, >= 1.

    Returns:
      alpha in [0, 1]; NaN outside the model. Differentiable in both arguments (implicit
      function theorem, a ``custom_jvp``).

    References:
      Leviathan et al. (2023), eq. 1 (the forward map).
    """
    tau, gamma = as_float(mean_length, gamma)
    ok = (gamma >= 1) & (tau >= 1) & (tau <= gamma + 1)
    alpha = _invert_expected_tokens(jnp.where(ok, tau, 1.5), jnp.where(ok, gamma, 1.0))
    # The ends exactly: nothing accepted is alpha = 0, everything accepted alpha = 1.
    alpha = jnp.where(tau == 1, 0.0, jnp.where(tau == gamma + 1, 1.0, alpha))
    return _nan_unless(ok, alpha)


def acceptance_from_position_counts(position_counts: ArrayLike, iterations: ArrayLike) -> jax.Array:
    """Maximum-likelihood alpha from per-position acceptance counts.

    ``position_counts[..., k - 1]`` = number of steps whose k-th drafted token was accepted
    (k = 1 .. gamma; vLLM's and SGLang's per-position acceptance counters), ``iterations`` the
    number of steps. Each step accepts drafts until its first rejection, so accepted tokens total
    ``S = sum_k n_k`` and rejections ``iterations - n_gamma``; the likelihood
    ``alpha^S (1 - alpha)^(iterations - n_gamma)`` peaks at
    ``alpha = S / (S + iterations - n_gamma) = sum_{k=1..gamma} n_k / sum_{k=0..gamma-1} n_k``
    with ``n_0 = iterations`` (the same estimator as :func:`sdsl_jax.acceptance_from_counts`).

    Returns:
      alpha over the last axis; NaN for counts that cannot come from such steps (negative,
      increasing with k, or above ``iterations``) or with no data.
    """
    n, steps = as_float(position_counts, iterations)
    steps = jnp.asarray(steps)[..., None]
    previous = jnp.concatenate([steps, n[..., :-1]], axis=-1)
    ok = jnp.all((n >= 0) & (n <= previous), axis=-1) & (steps[..., 0] >= 1)
    denominator = previous.sum(-1)
    return _nan_unless(ok & (denominator > 0), n.sum(-1) / jnp.where(denominator > 0, denominator, 1.0))


def iteration_cost(
    gamma: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike, *, flops_per_param: float = 2.0
) -> jax.Array:
    """Cost of one iteration, ``flops_per_param * (n_draft * gamma + m_target)``.

    ``gamma`` draft forward passes and ONE target verification pass (SDSL's FLOP model). With
    latencies for ``n_draft``, ``m_target`` and ``flops_per_param=1`` this is seconds.
    """
    gamma, n, m = as_float(gamma, n_draft, m_target)
    ok = (gamma >= 0) & (n > 0) & (m > 0)
    return _nan_unless(ok, flops_per_param * (n * gamma + m))


def throughput(
    alpha: ArrayLike,
    gamma: ArrayLike,
    n_draft: ArrayLike,
    m_target: ArrayLike,
    *,
    flops_per_param: float = 2.0,
) -> jax.Array:
    """Tokens per FLOP, ``T = (1 - alpha^(gamma+1)) / ((1 - alpha) (2 N gamma + 2 M))``.

    Args:
      alpha: per-token acceptance rate in (0, 1).
      gamma: lookahead >= 0 (continuous).
      n_draft: draft size N (or any per-token cost of the draft).
      m_target: target size M (or the target's per-token cost, in the same unit).
      flops_per_param: cost of one token per unit of size (2 FLOPs per parameter).

    Returns:
      Tokens per unit cost; NaN outside the model.

    References:
      SDSL (2026), arXiv 2603.11053; Leviathan et al. (2023), eq. 1.
    """
    return expected_tokens(alpha, gamma) / iteration_cost(
        gamma, n_draft, m_target, flops_per_param=flops_per_param
    )


def speedup(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike) -> jax.Array:
    """Leviathan's expected walltime improvement ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))``.

    Args:
      alpha: acceptance rate in (0, 1).
      gamma: lookahead >= 0.
      c: cost ratio, the time of one draft step over one target step, >= 0.

    References:
      Leviathan et al. (2023), Theorem 3.8.
    """
    alpha, gamma, c = as_float(alpha, gamma, c)
    return _nan_unless(c >= 0, expected_tokens(alpha, gamma) / (gamma * c + 1.0))


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike) -> jax.Array:
    """Expected factor of increase in arithmetic operations, ``(1-alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))``.

    ``c_hat`` is the draft's arithmetic operations per token over the target's.

    References:
      Leviathan et al. (2023), Theorem 3.11.
    """
    alpha, gamma, c_hat = as_float(alpha, gamma, c_hat)
    ops = (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)
    return _nan_unless(c_hat >= 0, ops)


def _lower_branch(alpha: jax.Array, n: jax.Array, m: jax.Array):
    """Return (w, log_alpha, ok) with w = W_{-1}(-alpha^(r-1)/e); ok marks a stationary point."""
    ok = _valid_alpha(alpha) & (n > 0) & (m > 0)
    log_a = jnp.log(jnp.where(ok, alpha, 0.5))
    r = jnp.where(ok, m / jnp.where(ok, n, 1.0), 2.0)
    # w = W_{-1}(-exp(t - 1)), t = (r - 1) log(alpha), passed without forming t - 1 so that
    # the branch-point distance stays exact as alpha -> 1.
    t = (r - 1.0) * log_a
    # t > 0 (r < 1) has no stationary point: drafting never pays. Clamp so the NaN of the
    # Lambert W cannot leak into gradients through the where below.
    has_stationary = t <= 0.0
    w = lambertw_m1_log_shifted(jnp.minimum(t, 0.0))
    return w, log_a, ok, has_stationary


def optimal_lookahead(alpha: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike) -> jax.Array:
    """Continuous lookahead maximising throughput over ``gamma >= 0``.

    ``gamma* = log(-w) / log(1/alpha) - 1`` with ``w = W_{-1}(-alpha^(r-1)/e)``, ``r = M/N``;
    equal to docs/theory.md's ``(1 + w)/log(alpha) - r`` but without its cancellation. ``T`` is
    unimodal in gamma, so when the stationary point is negative, or absent (``r <= 1``), the
    maximiser over ``gamma >= 0`` is 0: drafting does not pay.

    Args:
      alpha: acceptance rate in (0, 1).
      n_draft, m_target: per-token costs of draft and target (only ``M/N`` matters).

    Returns:
      gamma* >= 0; NaN outside the model.

    References:
      SDSL (2026), arXiv 2603.11053; docs/theory.md check values (section 2).
    """
    alpha, n, m = as_float(alpha, n_draft, m_target)
    return optimal_lookahead_and_throughput(alpha, n, m)[0]


def optimal_throughput(alpha: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike, *, flops_per_param: float = 2.0) -> jax.Array:
    """Throughput at the continuous optimal lookahead, ``T* = log(alpha) / (2 N (1 - alpha) w)``.

    When drafting does not pay (gamma* = 0) this is the target alone, ``1 / (2 M)``.

    Args:
      alpha: acceptance rate in (0, 1).
      n_draft, m_target: sizes (or per-token costs) of draft and target.
      flops_per_param: cost per unit of size per token (2 FLOPs per parameter).

    Returns:
      Tokens per unit cost; NaN outside the model.
    """
    alpha, n, m = as_float(alpha, n_draft, m_target)
    return optimal_lookahead_and_throughput(alpha, n, m, flops_per_param=flops_per_param)[1]


def optimal_lookahead_and_throughput(alpha: jax.Array, n: jax.Array, m: jax.Array, *,
                                     flops_per_param: float = 2.0) -> tuple[jax.Array, jax.Array]:
    """``(gamma*, T*)`` of :func:`optimal_lookahead` and :func:`optimal_throughput` from one Lambert W
    evaluation (float arrays; what the N* solver evaluates at every step)."""
    w, log_a, ok, has_stationary = _lower_branch(alpha, n, m)
    log_minus_w = jnp.log(-w)
    gamma = jnp.where(has_stationary, jnp.maximum(log_minus_w / (-log_a) - 1.0, 0.0), 0.0)
    # log(a)/(1-a) written as log(a)/(-expm1(log a)) keeps precision as alpha -> 1.
    t_star = log_a / (-jnp.expm1(log_a) * w) / (flops_per_param * jnp.where(ok, n, 1.0))
    drafting_pays = has_stationary & (log_minus_w > -log_a)  # gamma* > 0
    target_alone = 1.0 / (flops_per_param * jnp.where(ok, m, 1.0))
    return _nan_unless(ok, gamma), _nan_unless(ok, jnp.where(drafting_pays, t_star, target_alone))


def optimal_integer_lookahead(alpha: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike) -> jax.Array:
    """Best integer lookahead: ``floor(gamma*)`` or ``ceil(gamma*)``, whichever has higher T.

    T is unimodal in gamma, so the integer optimum is a neighbour of the continuous one.

    Returns:
      The best integer gamma >= 0 as a float array (NaN outside the model).
    """
    alpha, n, m = as_float(alpha, n_draft, m_target)
    gamma = optimal_lookahead(alpha, n, m)
    lo, hi = jnp.floor(gamma), jnp.ceil(gamma)
    t_lo = throughput(alpha, lo, n, m)
    t_hi = throughput(alpha, hi, n, m)
    return jnp.where(t_hi > t_lo, hi, lo)
