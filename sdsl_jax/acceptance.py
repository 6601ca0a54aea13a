"""Acceptance: the SDSL acceptance plane and estimators of alpha from speculative runs.

Acceptance plane [SDSL 2026, arXiv 2603.11053]::

    alpha = A x + B y + C,      x = draft perplexity, y = target perplexity

(raw perplexities measured on HellaSwag text). Only pairs with ``0 < alpha < 1`` are admissible;
the plane itself is linear and returns whatever value it gives, the throughput model turns
inadmissible values into NaN.

Estimators. ``accepted / drafted`` is NOT alpha (with alpha = 0.7, gamma = 5 it reads about 0.39).
With i.i.d. acceptance, the accepted count K of an iteration is a geometric variable truncated at
gamma; its maximum-likelihood estimate is ``sum K / (sum K + #iterations that hit a rejection)``.
The exact per-token rate along a text is ``1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))]``
[Leviathan et al. 2023, Cor. 3.6].
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = [
    "AcceptancePlane",
    "SDSL2026",
    "acceptance_rate",
    "acceptance_from_counts",
    "acceptance_from_distributions",
]


class AcceptancePlane(NamedTuple):
    """Coefficients of ``alpha = A x + B y + C`` (x, y: draft and target perplexity)."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike


SDSL2026 = AcceptancePlane(A=-0.0067, B=0.01297, C=0.642)
"""SDSL (2026), arXiv 2603.11053: plane fitted on HellaSwag perplexities, R^2 = 0.602."""


def acceptance_rate(ppl_draft: ArrayLike, ppl_target: ArrayLike, plane: AcceptancePlane = SDSL2026) -> jax.Array:
    """Acceptance predicted by the plane, ``A x + B y + C``.

    Args:
      ppl_draft: draft perplexity x (>= 1).
      ppl_target: target perplexity y (>= 1).
      plane: coefficients (fields may be arrays that broadcast).

    Returns:
      The plane's value (not clipped to (0, 1)); NaN for a perplexity below 1.
    """
    x, y, *_ = as_float(ppl_draft, ppl_target, *plane)
    return jnp.where((x >= 1) & (y >= 1), plane.A * x + plane.B * y + plane.C, jnp.nan)


def acceptance_from_counts(accepted: ArrayLike, gamma: ArrayLike) -> jax.Array:
    """Maximum-likelihood alpha from accepted counts per iteration.

    An iteration drafting ``gamma`` tokens accepts ``K`` of them; ``K < gamma`` means it hit a
    rejection. Under i.i.d. acceptance the likelihood is ``alpha^sum(K) (1 - alpha)^R`` with R the
    number of iterations that hit a rejection, so ``alpha_hat = sum K / (sum K + R)``.

    Args:
      accepted: accepted draft tokens per iteration, shape ``(..., iterations)``.
      gamma: lookahead of each iteration (broadcast against ``accepted``).

    Returns:
      alpha_hat over the last axis (NaN when there is no data: no accepted token and no rejection).
    """
    k, gamma = as_float(accepted, gamma)
    rejected = (k < gamma).astype(k.dtype)
    total, r = k.sum(-1), rejected.sum(-1)
    return jnp.where(total + r > 0, total / jnp.where(total + r > 0, total + r, 1.0), jnp.nan)


def acceptance_from_distributions(p_target: ArrayLike, q_draft: ArrayLike) -> jax.Array:
    """Exact acceptance ``1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))]`` over positions.

    Args:
      p_target: target next-token probabilities, shape ``(..., positions, vocab)``.
      q_draft: draft next-token probabilities, same shape.

    Returns:
      The mean over positions of ``sum_x min(p, q)``, shape ``(...)``.

    References:
      Leviathan et al. (2023), Corollary 3.6.
    """
    return jnp.minimum(jnp.asarray(p_target), jnp.asarray(q_draft)).sum(-1).mean(-1)
