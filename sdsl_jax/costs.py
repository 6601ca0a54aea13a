"""Cost models of one speculative iteration, and the best lookahead under any of them.

An iteration runs ``gamma`` draft steps and one verification of ``gamma + 1`` positions (the
``gamma`` drafted tokens and the bonus token) [Leviathan et al. 2023, Algorithm 1]. A *cost
model* is a NamedTuple of coefficients (a pytree: it can be fitted, sampled and differentiated)
with two methods::

    draft_step(n)        cost of one draft forward step of an N-parameter draft
    verification(m, k)   cost of one target pass verifying k positions

so that ``cost(gamma) = gamma draft_step(N) + verification(M, gamma + 1)``, the target alone costs
``verification(M, 1)`` per token, and throughput is ``E[tokens](alpha, gamma) / cost(gamma)``.

When the cost is affine in gamma, ``cost = slope gamma + intercept``, a model says so with an
``affine(n, m) -> (slope, intercept)`` method and the optimum is the Lambert-W closed form with
``r = intercept / slope`` (docs/theory.md, section 2). Otherwise :func:`best_lookahead` solves
``d log T / d gamma = 0`` by bisection on ``[0, max_lookahead]`` with implicit derivatives
(``jax.lax.custom_root``), assuming ``T`` unimodal in gamma.

Shipped models:

* :class:`SDSLFlops` (default, :data:`SDSL_FLOPS`): ``2 N gamma + 2 M``, one target pass whatever
  gamma is (the SDSL paper's model: verification is memory-bound).
* :class:`AllPositionsFlops`: ``2 N gamma + 2 M (gamma + 1)``, the target charged for every
  verified position (Leviathan et al. 2023, Thm 3.11's arithmetic count).
* :class:`LatencyCost`: measured seconds, ``t_draft(N) = a0 + a1 N`` and
  ``t_verify(M, k) = b0 + b1 M + b2 M k``; throughput in tokens per second.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float
from sdsl_jax.speculative import expected_tokens, optimal_lookahead_and_throughput

__all__ = [
    "SDSLFlops",
    "AllPositionsFlops",
    "LatencyCost",
    "SDSL_FLOPS",
    "COST_MODELS",
    "Lookahead",
    "iteration_cost_under",
    "throughput_under",
    "target_alone_throughput",
    "target_alone_cost",
    "best_lookahead",
]


class SDSLFlops(NamedTuple):
    """SDSL's FLOP model: a step costs ``flops_per_param`` per parameter; ONE verification pass.

    References:
      SDSL (2026), arXiv 2603.11053: ``2 N gamma + 2 M`` FLOPs per iteration.
    """

    flops_per_param: ArrayLike = 2.0

    def draft_step(self, n):
        return self.flops_per_param * n

    def verification(self, m, k):
        return self.flops_per_param * m + 0.0 * k

    def affine(self, n, m):
        return self.flops_per_param * n, self.flops_per_param * m


class AllPositionsFlops(NamedTuple):
    """Arithmetic count: the target pays ``flops_per_param * M`` for each of the ``gamma + 1`` positions.

    References:
      Leviathan et al. (2023), Theorem 3.11 (the expected arithmetic operations).
    """

    flops_per_param: ArrayLike = 2.0

    def draft_step(self, n):
        return self.flops_per_param * n

    def verification(self, m, k):
        return self.flops_per_param * m * k

    def affine(self, n, m):
        return self.flops_per_param * (n + m), self.flops_per_param * m


class LatencyCost(NamedTuple):
    """Measured seconds: ``t_draft(N) = draft_fixed + draft_per_param N`` and
    ``t_verify(M, k) = verify_fixed + verify_per_position k + verify_per_param M + verify_per_token M k``.

    The fixed terms are a step's overheads (kernel launches, dispatch), the per-parameter terms
    the weight traffic of a memory-bound pass, the per-token term the arithmetic of each extra
    verified position, the per-position term what each position costs whatever the model size
    (embedding, sampling, attention bookkeeping). :func:`sdsl_jax.latency.fit_latency_cost` fits
    them from measured calls.
    """

    draft_fixed: ArrayLike
    draft_per_param: ArrayLike
    verify_fixed: ArrayLike
    verify_per_param: ArrayLike
    verify_per_token: ArrayLike = 0.0
    verify_per_position: ArrayLike = 0.0
    alone_offset: ArrayLike = 0.0

    def draft_step(self, n):
        return self.draft_fixed + self.draft_per_param * n

    def verification(self, m, k):
        return (self.verify_fixed + self.verify_per_position * k + self.verify_per_param * m
                + self.verify_per_token * m * k)

    def target_alone(self, m):
        """Seconds per token of the target decoding alone: a verification of one position plus
        ``alone_offset`` (a plain decoding loop's own overhead differs from a speculative one's)."""
        return self.verification(m, 1) + self.alone_offset

    def affine(self, n, m):
        # gamma draft steps + a verification of k = gamma + 1 positions.
        per_position = self.verify_per_position + self.verify_per_token * m
        slope = self.draft_fixed + self.draft_per_param * n + per_position
        return slope, self.verify_fixed + self.verify_per_param * m + per_position


SDSL_FLOPS = SDSLFlops()
"""The paper's cost model, ``2 N gamma + 2 M`` FLOPs per iteration."""

COST_MODELS: dict[str, Any] = {"flops": SDSL_FLOPS, "all-positions": AllPositionsFlops()}
"""Cost models the CLIs name (``--cost``); ``latency`` needs measured coefficients."""


class Lookahead(NamedTuple):
    """The best continuous lookahead and the throughput there (tokens per unit of cost)."""

    gamma: jax.Array
    throughput: jax.Array


def iteration_cost_under(cost, gamma: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike) -> jax.Array:
    """``gamma draft_step(N) + verification(M, gamma + 1)``; NaN outside the model."""
    gamma, n, m = as_float(gamma, n_draft, m_target)
    value = gamma * cost.draft_step(n) + cost.verification(m, gamma + 1.0)
    return jnp.where((gamma >= 0) & (n > 0) & (m > 0) & (value > 0), value, jnp.nan)


def throughput_under(cost, alpha: ArrayLike, gamma: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike) -> jax.Array:
    """Tokens per unit of cost at lookahead ``gamma``: ``E[tokens](alpha, gamma) / cost(gamma)``.

    References:
      Leviathan et al. (2023), eq. 1 (expected tokens); SDSL (2026) for the FLOP cost.
    """
    return expected_tokens(alpha, gamma) / iteration_cost_under(cost, gamma, n_draft, m_target)


def target_alone_cost(cost, m_target: ArrayLike) -> jax.Array:
    """Cost per token of the target decoding alone: ``cost.target_alone(M)`` where the model
    defines it (a measured latency model), else ``verification(M, 1)``."""
    if hasattr(cost, "target_alone"):
        return cost.target_alone(m_target)
    return cost.verification(m_target, 1)


def target_alone_throughput(cost, m_target: ArrayLike) -> jax.Array:
    """Tokens per unit of cost of the target decoding alone, ``1 / target_alone_cost(cost, M)``."""
    (m,) = as_float(m_target)
    if hasattr(cost, "target_alone"):
        return 1.0 / cost.target_alone(m)
    return 1.0 / cost.verification(m, jnp.ones_like(m))


def best_lookahead(cost, alpha: ArrayLike, n_draft: ArrayLike, m_target: ArrayLike, *,
                   max_lookahead: float = 1024.0) -> Lookahead:
    """The continuous lookahead maximising throughput under ``cost``, and that throughput.

    Closed form (Lambert W_{-1}) when the cost model has ``affine``; otherwise a bisection on
    ``d log T / d gamma`` over ``[0, max_lookahead]`` with implicit derivatives. When drafting does
    not pay, gamma* = 0 and the throughput is the target alone's.

    Returns:
      :class:`Lookahead` broadcast over the inputs (and the cost's coefficients); NaN outside
      the model.

    References:
      SDSL (2026), arXiv 2603.11053 (closed form); docs/theory.md, sections 2-3.
    """
    if hasattr(cost, "affine"):
        alpha, n, m = as_float(alpha, n_draft, m_target)
        slope, intercept = cost.affine(n, m)
        return Lookahead(*optimal_lookahead_and_throughput(alpha, slope, intercept, flops_per_param=1.0))
    leaves, treedef = jax.tree.flatten(cost)
    arrays = jnp.broadcast_arrays(*as_float(alpha, n_draft, m_target, *leaves))
    shape = arrays[0].shape
    flat = [x.reshape(-1) for x in arrays]
    costs = jax.tree.unflatten(treedef, flat[3:])
    gamma, thr = jax.vmap(_bisect_lookahead, (0, 0, 0, 0, None))(flat[0], flat[1], flat[2], costs,
                                                                 float(max_lookahead))
    return Lookahead(gamma.reshape(shape), thr.reshape(shape))


_BISECTION_STEPS = 64  # halves [0, max_lookahead] to below float64's resolution


def _bisect_lookahead(alpha, n, m, cost, max_lookahead):
    ok = (alpha > 0) & (alpha < 1) & (n > 0) & (m > 0)
    # Solve on safe stand-ins outside the model, so no NaN reaches the implicit derivatives.
    alpha_s, n_s, m_s = jnp.where(ok, alpha, 0.5), jnp.where(ok, n, 1.0), jnp.where(ok, m, 2.0)

    def log_t(g):
        return jnp.log(throughput_under(cost, alpha_s, g, n_s, m_s))

    slope = jax.grad(log_t)

    def solve(f, g0):
        def body(_, bracket):
            lo, hi = bracket
            mid = 0.5 * (lo + hi)
            rising = f(mid) > 0
            return jnp.where(rising, mid, lo), jnp.where(rising, hi, mid)

        lo, hi = jax.lax.fori_loop(0, _BISECTION_STEPS, body, (jnp.zeros_like(g0), jnp.full_like(g0, max_lookahead)))
        return 0.5 * (lo + hi)

    zero = jnp.zeros_like(alpha_s)
    pays = slope(zero) > 0  # T unimodal: rising at 0 means an interior optimum
    interior = jax.lax.custom_root(slope, jax.lax.stop_gradient(zero), solve, lambda g, y: y / g(1.0))
    gamma = jnp.where(pays, interior, 0.0)
    thr = throughput_under(cost, alpha_s, gamma, n_s, m_s)
    return jnp.where(ok, gamma, jnp.nan), jnp.where(ok, thr, jnp.nan)
