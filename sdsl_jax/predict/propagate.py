"""Posterior draws propagated to N*: every draw gives a loss law (and a plane).

:func:`solve_draws` solves N*(M) for each with the vectorised, differentiable solver, in chunks
of draws so memory stays bounded; :func:`summarize_draws` and :func:`propagate_draft_size`
summarise N*, M/N*, gamma*, T* and the linear law (mu, M0) by quantiles. Where the plane has no
data it stays at the paper's values and :func:`plane_sensitivity` reports the implicit
derivatives of N* with respect to A, B, C instead of inventing an uncertainty.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.optimum import LinearLaw, draft_size_gradient, fit_linear_law, solve_draft_size
from sdsl_jax.recipes import as_recipe

with warnings.catch_warnings():  # ArviZ announces its refactor on import
    warnings.simplefilter("ignore", FutureWarning)

__all__ = [
    "DraftSizeBands",
    "propagate_draft_size",
    "solve_draws",
    "summarize_draws",
    "plane_sensitivity",
    "interval_coverage",
]


class DraftSizeBands(NamedTuple):
    """Posterior summaries over target sizes; quantile arrays have shape (len(quantiles), len(m)).

    Attributes:
      m_target: target sizes M.
      quantiles: the probability levels of the rows below.
      n_star, m_over_n, gamma_star, throughput: quantiles over draws (failed solves excluded).
      failed_fraction: share of draws whose solve did not succeed, per M.
      linear_law: (mu, M0) per draw (NaN where a draw had too few successful solves).
      n_star_draws: N* per draw and M, shape (draws, len(m)).
    """

    m_target: np.ndarray
    quantiles: np.ndarray
    n_star: np.ndarray
    m_over_n: np.ndarray
    gamma_star: np.ndarray
    throughput: np.ndarray
    failed_fraction: np.ndarray
    linear_law: LinearLaw
    n_star_draws: np.ndarray


def propagate_draft_size(
    m_target: ArrayLike,
    laws,
    planes,
    *,
    d_target: float,
    d_draft: float | None = None,
    recipe=None,
    cost=SDSL_FLOPS,
    quantiles=(0.05, 0.25, 0.5, 0.75, 0.95),
    chunk_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    **solver_options,
) -> DraftSizeBands:
    """Push posterior draws through N*(M): bands on N*, M/N*, gamma*, T*, and (mu, M0) draws.

    Args:
      m_target: target sizes (1-D).
      laws: loss-law draws (any family; fields of shape ``(draws,)``) or a single law.
      planes: acceptance-model draws (fields ``(draws,)``) or a single model (e.g. ``SDSL2026``).
      d_target: training tokens of the target.
      d_draft, recipe: the draft's training budget, as in :func:`sdsl_jax.solve_draft_size`.
      cost: cost model (its fields may also be draws).
      quantiles: probability levels to report.
      chunk_size: draws solved per vectorised call (memory is ``chunk_size x len(m)`` solves).
      progress: called as ``progress(done_draws, total_draws)``.
    """
    m = np.asarray(m_target, np.float64)
    solved = solve_draws(m, laws, planes, d_target=d_target, d_draft=d_draft, recipe=recipe, cost=cost,
                         chunk_size=chunk_size, progress=progress, **solver_options)
    return summarize_draws(m, *solved, quantiles=quantiles)


def solve_draws(
    m_target: ArrayLike,
    laws,
    planes,
    *,
    d_target: float,
    d_draft: float | None = None,
    recipe=None,
    cost=SDSL_FLOPS,
    chunk_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    **solver_options,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N*, gamma* and T* for every draw and target, each of shape ``(draws, len(m_target))``.

    Arguments as in :func:`propagate_draft_size`. Solving every target of a run in one call
    compiles the solver once (compilation, not solving, dominates at a few hundred draws).
    """
    m = np.asarray(m_target, np.float64)
    recipe = as_recipe(d_draft, recipe)
    draws = (laws, planes, cost, recipe)
    num_draws = max(np.size(v) for v in jax.tree.leaves(draws))
    draws = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v, np.float64), (num_draws,)), draws)
    outputs = {k: [] for k in ("n_star", "gamma_star", "throughput")}
    for start in range(0, num_draws, chunk_size):
        stop = min(start + chunk_size, num_draws)
        idx = np.resize(np.arange(start, stop), chunk_size)  # fixed shape: one compilation
        law, plane, cost_i, recipe_i = jax.tree.map(lambda v: v[idx][:, None], draws)
        sol = solve_draft_size(m[None, :], d_target=d_target, recipe=recipe_i, loss=law, plane=plane, cost=cost_i,
                               **solver_options)
        for k in outputs:
            outputs[k].append(np.asarray(getattr(sol, k))[: stop - start])
        if progress is not None:
            progress(stop, num_draws)
    return tuple(np.concatenate(outputs[k]) for k in ("n_star", "gamma_star", "throughput"))


def summarize_draws(m_target: ArrayLike, n_star: np.ndarray, gamma_star: np.ndarray, throughput: np.ndarray, *,
                    quantiles=(0.05, 0.25, 0.5, 0.75, 0.95)) -> DraftSizeBands:
    """Quantile bands over draws (failed solves excluded) and the linear law per draw."""
    m = np.asarray(m_target, np.float64)
    q = np.asarray(quantiles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN quantiles
        bands = [np.nanquantile(x, q, axis=0) for x in (n_star, m / n_star, gamma_star, throughput)]
        law = jax.vmap(fit_linear_law, (None, 0))(jnp.asarray(m), jnp.asarray(n_star))
    enough = np.isfinite(n_star).sum(1) >= 2
    law = LinearLaw(np.where(enough, law.mu, np.nan), np.where(enough, law.m0, np.nan))
    return DraftSizeBands(m, q, *bands, np.mean(~np.isfinite(n_star), axis=0), law, n_star)


def plane_sensitivity(
    m_target: ArrayLike, *, law, plane, d_target: float, d_draft: float | None = None, recipe=None,
    cost=SDSL_FLOPS, n_star: ArrayLike | None = None,
) -> dict[str, np.ndarray]:
    """Elasticities ``d log N* / d log |theta|`` for theta = A, B, C, by implicit derivatives.

    An elasticity of -7 means a 1% larger |A| gives a 7% different N* (here: smaller). ``n_star``:
    N* already solved for these arguments (else solved here); the derivatives are taken at it
    (:func:`sdsl_jax.draft_size_gradient`).
    """
    kw = dict(d_draft=d_draft, d_target=d_target, recipe=recipe, loss=law, plane=plane, cost=cost)
    if n_star is None:
        n_star = solve_draft_size(m_target, **kw).n_star
    gradient = draft_size_gradient(n_star, m_target, **kw).plane
    return {name: np.asarray(getattr(gradient, name)) * float(getattr(plane, name)) for name in ("A", "B", "C")}


def interval_coverage(draws: np.ndarray, truth: float, *, level: float = 0.9) -> bool:
    """Whether ``truth`` lies in the central ``level`` interval of ``draws``."""
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return bool(lo <= truth <= hi)
