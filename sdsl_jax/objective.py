"""The composite objective T(N; M, D', recipe): loss law -> perplexities -> acceptance -> cost -> T*.

A draft of N parameters trained on ``D = recipe.draft_tokens(N)`` tokens and a target of M
parameters trained on D' tokens have perplexities ``x = exp L(N, D)`` and ``y = exp L(M, D')``
(any loss law, :mod:`sdsl_jax.loss_laws`), acceptance ``alpha = acceptance.rate(x, y)`` (any
acceptance model, :mod:`sdsl_jax.acceptance`), and at the best lookahead under the cost model
(:mod:`sdsl_jax.costs`) [SDSL 2026, arXiv 2603.11053; docs/theory.md, section 4]::

    T(N, M, D, D') = max_gamma E[tokens](alpha, gamma) / cost(gamma; N, M)

With the defaults (Chinchilla law, the paper's plane, SDSL FLOPs, one fixed D) this is the
paper's ``log(alpha) / (2 N (1 - alpha) W_{-1}(-alpha^(M/N - 1) / e))``.
"""

from __future__ import annotations

import jax
from jax.typing import ArrayLike

from sdsl_jax.acceptance import SDSL2026
from sdsl_jax.costs import SDSL_FLOPS, best_lookahead
from sdsl_jax.loss_laws import HOFFMANN2022, perplexity
from sdsl_jax.protocols import AcceptanceRateModel, DraftRecipe, IterationCostModel, LossLawModel
from sdsl_jax.recipes import as_recipe

__all__ = ["draft_acceptance", "draft_throughput"]


def draft_acceptance(
    n_draft: ArrayLike,
    m_target: ArrayLike,
    *,
    d_target: ArrayLike,
    d_draft: ArrayLike | None = None,
    recipe: DraftRecipe | None = None,
    loss: LossLawModel = HOFFMANN2022,
    plane: AcceptanceRateModel = SDSL2026,
) -> jax.Array:
    """Acceptance ``alpha(exp L(N, D), exp L(M, D'))`` predicted by the loss law and the acceptance model.

    Args:
      n_draft, m_target: draft and target sizes.
      d_target: target training tokens D'.
      d_draft: draft training tokens D (a fixed budget); or give ``recipe`` instead.
      recipe: how D follows N (:mod:`sdsl_jax.recipes`).
      loss: loss-law coefficients (any family).
      plane: acceptance-model coefficients (any model with ``rate``).
    """
    recipe = as_recipe(d_draft, recipe)
    x = perplexity(n_draft, recipe.draft_tokens(n_draft), loss)
    return plane.rate(x, perplexity(m_target, d_target, loss))


def draft_throughput(
    n_draft: ArrayLike,
    m_target: ArrayLike,
    *,
    d_target: ArrayLike,
    d_draft: ArrayLike | None = None,
    recipe: DraftRecipe | None = None,
    loss: LossLawModel = HOFFMANN2022,
    plane: AcceptanceRateModel = SDSL2026,
    cost: IterationCostModel = SDSL_FLOPS,
) -> jax.Array:
    """Composite objective ``T(N, M, D, D')``: throughput at the best lookahead under ``cost``.

    Tokens per FLOP with the default cost (tokens per second with a latency cost). NaN where the
    pair is inadmissible (alpha outside (0, 1)); the target alone's throughput where drafting does
    not pay (the best lookahead is 0). Arguments as in :func:`draft_acceptance`.
    """
    alpha = draft_acceptance(n_draft, m_target, d_target=d_target, d_draft=d_draft, recipe=recipe, loss=loss,
                             plane=plane)
    return best_lookahead(cost, alpha, n_draft, m_target).throughput
