"""Draft training recipes: how many tokens D a draft of N parameters is trained on.

The law's N* depends on the draft's training budget. SDSL fixes one D for every draft size
(:class:`FixedTokens`, the paper's setting); labs, and our ladder, train drafts at a fixed ratio
of tokens per parameter (:class:`TokensPerParameter`, D = rho N; Chinchilla-optimal is rho ~ 20),
or within a fixed training compute (:class:`FixedCompute`, D = C / (6 N), the 6 N D FLOPs of
Kaplan et al. 2020, section 2.1). A recipe is a NamedTuple with ``draft_tokens(n)``; its fields
may be arrays, and N* is differentiable with respect to them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = ["FixedTokens", "TokensPerParameter", "FixedCompute", "as_recipe", "RECIPES", "parse_recipe"]


class FixedTokens(NamedTuple):
    """Every draft is trained on ``tokens`` tokens (SDSL's setting)."""

    tokens: ArrayLike

    def draft_tokens(self, n_params: ArrayLike) -> jax.Array:
        n, d = as_float(n_params, self.tokens)
        return d + 0.0 * n


class TokensPerParameter(NamedTuple):
    """``D = ratio * N``: a fixed number of training tokens per parameter."""

    ratio: ArrayLike

    def draft_tokens(self, n_params: ArrayLike) -> jax.Array:
        n, rho = as_float(n_params, self.ratio)
        return rho * n


class FixedCompute(NamedTuple):
    """``D = flops / (flops_per_param_token * N)``: every draft gets the same training compute.

    References:
      Kaplan et al. (2020), section 2.1: training costs about 6 N D FLOPs.
    """

    flops: ArrayLike
    flops_per_param_token: ArrayLike = 6.0

    def draft_tokens(self, n_params: ArrayLike) -> jax.Array:
        n, c, k = as_float(n_params, self.flops, self.flops_per_param_token)
        return c / (k * jnp.where(n > 0, n, jnp.nan))


def as_recipe(d_draft=None, recipe=None):
    """One recipe from the two ways of saying it: ``d_draft`` (a fixed D) or ``recipe``."""
    if (d_draft is None) == (recipe is None):
        raise ValueError("give exactly one of d_draft (a fixed draft budget) and recipe")
    return FixedTokens(d_draft) if recipe is None else recipe


RECIPES = "fixed (every draft trained on --d-draft tokens; the paper's), tokens-per-param=RHO (D = RHO N), " \
          "compute=C (D = C / (6 N))"
"""The recipe specs :func:`parse_recipe` reads (the ``--recipe`` of ``experiments.fit``)."""


def parse_recipe(spec: str, d_draft: float):
    """``fixed`` | ``tokens-per-param=RHO`` | ``compute=C`` -> a recipe (``fixed``: every draft on ``d_draft``
    tokens); a ValueError says what is wrong with ``spec``."""
    name, _, value = spec.partition("=")
    if name == "fixed" and not value:
        return FixedTokens(d_draft)
    if name in ("tokens-per-param", "compute") and value:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--recipe {spec}: {value!r} is not a number") from None
        if not (np.isfinite(number) and number > 0):
            raise ValueError(f"--recipe {spec}: the value must be a positive finite number")
        return TokensPerParameter(number) if name == "tokens-per-param" else FixedCompute(number)
    raise ValueError(f"--recipe {spec!r} is not one of: {RECIPES}")
