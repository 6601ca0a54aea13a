"""Pre-training loss laws ``L(N, D)`` and their named presets.

Chinchilla form [Hoffmann et al. 2022, Approach 3, eq. 2], in nats per token::

    L(N, D) = E + A / N^alpha + B / D^beta,        perplexity = exp(L)

``N`` is the number of parameters, ``D`` the number of training tokens. A law is a NamedTuple of
arrays, hence a pytree: it can be differentiated, vmapped over posterior draws, or replaced by
a fitted one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = ["LossLaw", "HOFFMANN2022", "BESIROGLU2024", "pretraining_loss", "perplexity"]


class LossLaw(NamedTuple):
    """Coefficients of ``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token)."""

    E: ArrayLike
    A: ArrayLike
    B: ArrayLike
    alpha: ArrayLike
    beta: ArrayLike


HOFFMANN2022 = LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
"""Hoffmann et al. (2022), "Training Compute-Optimal Large Language Models", arXiv 2203.15556,
Approach 3 (eq. 10). The preset SDSL starts from."""

BESIROGLU2024 = LossLaw(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
"""Besiroglu, Erdil, Barnett & You (2024), "Chinchilla Scaling: A replication attempt",
arXiv 2404.10102: refit of Approach 3 on the data read off Hoffmann et al.'s Figure 4
(``fits/data`` ships it) by Huber loss on log L."""


def pretraining_loss(n_params: ArrayLike, n_tokens: ArrayLike, law: LossLaw = HOFFMANN2022) -> jax.Array:
    """Final pre-training loss ``L(N, D) = E + A / N^alpha + B / D^beta`` in nats per token.

    Args:
      n_params: model size N (parameters), > 0.
      n_tokens: training tokens D, > 0.
      law: coefficients (a :class:`LossLaw`; fields may be arrays that broadcast).

    Returns:
      The loss, broadcast over the inputs; NaN for non-positive N or D.

    References:
      Hoffmann et al. (2022), eq. 2 and Approach 3.
    """
    n, d, *_ = as_float(n_params, n_tokens, *law)
    ok = (n > 0) & (d > 0)
    n, d = jnp.where(ok, n, 1.0), jnp.where(ok, d, 1.0)
    loss = law.E + law.A * jnp.exp(-law.alpha * jnp.log(n)) + law.B * jnp.exp(-law.beta * jnp.log(d))
    return jnp.where(ok, loss, jnp.nan)


def perplexity(n_params: ArrayLike, n_tokens: ArrayLike, law: LossLaw = HOFFMANN2022) -> jax.Array:
    """Perplexity ``exp(L(N, D))`` predicted by the loss law."""
    return jnp.exp(pretraining_loss(n_params, n_tokens, law))
