"""N* at the point fit and with bands; candidate drafts ranked by predicted throughput.

:func:`predict_draft_size` solves N*(M) on a grid and for named targets under any cost model and
draft recipe, with the linear law ``N* ~ mu M + M0`` and, given draws, bands;
:func:`rank_drafts` gives each candidate draft's predicted alpha and T for one target, the
predicted best and, given draws, P(best) and a band on T.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from sdsl_jax.acceptance import predictive_acceptance
from sdsl_jax.costs import SDSL_FLOPS, best_lookahead
from sdsl_jax.forecast import Decision, bayes_decision
from sdsl_jax.infer.point import coordinates_beyond_posterior, degenerate_coefficients
from sdsl_jax.infer.results import PointFit
from sdsl_jax.objective import draft_acceptance, draft_throughput
from sdsl_jax.optimum import DraftSizeSolution, LinearLaw, fit_linear_law, solve_draft_size
from sdsl_jax.predict.draws import CandidateLabels, PredictiveScales, predictive_planes
from sdsl_jax.predict.propagate import DraftSizeBands, solve_draws, summarize_draws
from sdsl_jax.recipes import as_recipe

__all__ = [
    "DraftSizePrediction",
    "DraftRanking",
    "predict_draft_size",
    "rank_drafts",
    "throughput_draws",
    "best_draft_probabilities",
    "acceptance_draws",
    "point_for_decisions",
    "NOT_PINNED_DOWN",
]


class DraftSizePrediction(NamedTuple):
    """N*(M) at the point fit, and with draws its bands.

    Attributes:
      m_grid, grid: target sizes of the grid and their :class:`DraftSizeSolution`.
      targets, named: named target sizes and their solution.
      linear_law: ``N* ~ mu M + M0`` over the grid (None with fewer than two solved targets).
      bands, target_bands: :class:`sdsl_jax.predict.propagate.DraftSizeBands` over the grid and the named
        targets (None without draws).
    """

    m_grid: np.ndarray
    grid: DraftSizeSolution
    targets: np.ndarray
    named: DraftSizeSolution
    linear_law: LinearLaw | None
    bands: DraftSizeBands | None
    target_bands: DraftSizeBands | None


class DraftRanking(NamedTuple):
    """Candidate drafts for one target, ranked by the law.

    Attributes:
      alpha: predicted acceptance per candidate.
      throughput: predicted throughput at the best lookahead per candidate.
      best: index of the predicted best candidate (None when none is admissible).
      p_best: probability under the draws that each candidate is the best (None without draws).
      throughput_band: 5% and 95% quantiles of T per candidate, shape ``(candidates, 2)``.
      decision: the Bayes decision over the same draws (:func:`sdsl_jax.forecast.bayes_decision`: the
        candidate with the highest posterior-expected T; None without draws). ``best`` is the point
        fit's pick, kept for comparison.
    """

    alpha: np.ndarray
    throughput: np.ndarray
    best: int | None
    p_best: np.ndarray | None
    throughput_band: np.ndarray | None
    decision: Decision | None = None



def draft_budget_near(n_star, recipe, fallback_n: float) -> float:
    """The recipe's draft budget at the geometric mean of the finite N* (``fallback_n`` when none is):
    where predictive draft offsets are drawn (a run's slope effect depends on log D)."""
    v = np.asarray(n_star, np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    n_ref = float(np.exp(np.mean(np.log(v)))) if v.size else fallback_n
    return float(np.asarray(recipe.draft_tokens(n_ref)))


def predict_draft_size(
    point: PointFit,
    *,
    m_grid: np.ndarray,
    targets: np.ndarray,
    d_target: float,
    d_draft: float | None = None,
    recipe: Any = None,
    cost: Any = SDSL_FLOPS,
    draws: tuple[Any, Any] | None = None,
    scales: PredictiveScales | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> DraftSizePrediction:
    """N*(M) at the point fit on ``m_grid`` and for ``targets``; with ``draws`` (laws, planes), bands.

    With ``scales`` as well the bands are posterior-predictive (:func:`predictive_planes`): each
    draw also carries a new draft series', a new target's and a new pair's residuals, so the
    band is on the N* of models that will be trained, not only on the law's mean curve.
    """
    recipe = as_recipe(d_draft, recipe)
    kw = dict(d_target=d_target, recipe=recipe, cost=cost)
    m_grid, targets = np.asarray(m_grid, np.float64), np.asarray(targets, np.float64)
    # Grid and named targets in one solve each: one compilation instead of two.
    m_all, k = np.concatenate([m_grid, targets]), m_grid.size
    both = solve_draft_size(m_all, loss=point.law, plane=point.plane, **kw)
    grid, named = (jax.tree.map(lambda x, s=s: x[s], both) for s in (slice(None, k), slice(k, None)))
    line = fit_linear_law(m_grid, grid.n_star) if np.isfinite(np.asarray(grid.n_star)).sum() >= 2 else None
    bands = target_bands = None
    if draws is not None:
        laws, planes = draws
        if scales is not None:
            d_ref = draft_budget_near(both.n_star, recipe, float(np.median(m_all)))
            planes = predictive_planes(planes, scales, d_draft=d_ref, d_target=d_target, seed=seed)
        n_star, gamma, thr = solve_draws(m_all, laws, planes, progress=progress, **kw)
        bands = summarize_draws(m_grid, n_star[:, :k], gamma[:, :k], thr[:, :k])
        target_bands = summarize_draws(targets, n_star[:, k:], gamma[:, k:], thr[:, k:])
    return DraftSizePrediction(m_grid, grid, targets, named, line, bands, target_bands)


def rank_drafts(
    point: PointFit,
    *,
    n_drafts: np.ndarray,
    d_drafts: np.ndarray,
    m_target: float,
    d_target: float,
    cost: Any = SDSL_FLOPS,
    draws: tuple[Any, Any] | None = None,
    scales: PredictiveScales | None = None,
    labels: CandidateLabels | None = None,
    seed: int = 0,
) -> DraftRanking:
    """Each candidate draft's predicted alpha and T for one target, the best, and P(best).

    A candidate is a real model: its own size and training tokens. With ``draws`` alone, P(best)
    and the T band carry the uncertainty of the law's mean curve and the plane's coefficients.
    With ``scales`` (:func:`predictive_scales`) they are posterior-predictive: each draw also
    draws every candidate's log loss residual (Student-t), the target's (one, shared by the
    candidates) and each pair's acceptance residual (truncated to [0, 1], or on the logit scale;
    with per-model effects also each candidate's draft effect and the target's, shared), so a new
    model's scatter around
    the law counts as it does in the data. With ``labels`` and ``scales.known``, a candidate
    (or the target) whose run or model is in the data keeps that run's or model's posterior
    effect and draws only its own residual. A candidate inadmissible in a draw (alpha outside
    (0, 1)) cannot win that draw; a draw where none is admissible is left out.
    """
    n, d = np.asarray(n_drafts, np.float64), np.asarray(d_drafts, np.float64)
    kw = dict(d_draft=d, d_target=d_target, cost=cost)
    alpha = np.asarray(draft_acceptance(n, m_target, loss=point.law, plane=point.plane, d_draft=d, d_target=d_target))
    t = np.asarray(draft_throughput(n, m_target, loss=point.law, plane=point.plane, **kw))
    best = int(np.nanargmax(t)) if np.isfinite(t).any() else None
    p_best = band = decision = None
    if draws is not None:
        t_draws = throughput_draws(draws, n_drafts=n, d_drafts=d, m_target=m_target, d_target=d_target, cost=cost,
                                   scales=scales, labels=labels, seed=seed)
        p_best, band = best_draft_probabilities(t_draws)
        decision = bayes_decision(t_draws)
    return DraftRanking(alpha, t, best, p_best, band, decision)


def throughput_draws(draws: tuple[Any, Any], *, n_drafts: np.ndarray, d_drafts: np.ndarray, m_target: float,
                     d_target: float, cost: Any = SDSL_FLOPS, scales: PredictiveScales | None = None,
                     labels: CandidateLabels | None = None, seed: int = 0) -> np.ndarray:
    """T of each candidate draft under each posterior draw, shape ``(draws, candidates)``.

    With ``scales``, posterior-predictive (see :func:`rank_drafts`); NaN where a candidate is
    inadmissible in a draw.
    """
    n, d = np.asarray(n_drafts, np.float64), np.asarray(d_drafts, np.float64)
    laws, planes = _draw_columns(draws)
    if scales is None:
        return np.asarray(draft_throughput(n, m_target, loss=laws, plane=planes, d_draft=d, d_target=d_target,
                                           cost=cost))
    return _predictive_throughput(laws, planes, scales, n, d, m_target, d_target, cost, seed,
                                  labels or CandidateLabels())


def _draw_columns(draws: tuple) -> tuple:
    """The paired draws as columns ``(draws, 1)`` against candidates; a fixed plane (no acceptance data)
    is repeated for every draw of the law."""
    count = np.size(draws[0][0])
    return tuple(jax.tree.map(lambda v: np.broadcast_to(np.asarray(v, np.float64), (count,))[:, None], x)
                 for x in draws)


def best_draft_probabilities(t_draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(best) per candidate and the 5%-95% band of T from ``(draws, candidates)`` throughputs.

    A candidate inadmissible in a draw (NaN) cannot win it; a draw where none is admissible is
    left out of P(best).
    """
    ok = np.isfinite(t_draws).any(axis=1)
    winner = np.argmax(np.where(np.isfinite(t_draws), t_draws, -np.inf), axis=1)
    p_best = np.array([np.mean(winner[ok] == i) if ok.any() else np.nan for i in range(t_draws.shape[1])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        band = np.nanpercentile(t_draws, [5, 95], axis=0).T
    return p_best, band


def _predictive_throughput(laws, planes, scales: PredictiveScales, n, d, m_target, d_target, cost, seed: int,
                           labels: CandidateLabels):
    """T per (draw, candidate) with residuals drawn on log loss and on alpha (new models', or
    conditioned on the posterior effects of the runs and models ``labels`` names)."""
    alpha = _predictive_alpha(laws, planes, scales, n, d, m_target, d_target, seed, labels)
    return np.asarray(best_lookahead(cost, alpha, n[None, :], m_target).throughput)


def _predictive_alpha(laws, planes, scales: PredictiveScales, n, d, m_target, d_target, seed: int,
                      labels: CandidateLabels) -> np.ndarray:
    rng = np.random.default_rng(seed)
    log_x = np.log(np.asarray(laws.loss(n[None, :], d[None, :]))) + scales.log_loss_offsets(
        np.log(d)[None, :], size=(n.size,), seed=seed, runs=labels.draft_runs)
    log_y = np.log(np.asarray(laws.loss(m_target, d_target))) + scales.log_loss_offsets(
        np.log(d_target), size=(1,), seed=seed + 1, runs=None if labels.target_run is None else (labels.target_run,))
    shift, z = scales.alpha_residuals(rng, n.size, drafts=labels.draft_models, target=labels.target_model)
    sigma = scales.residual_sigma()
    return np.asarray(predictive_acceptance(planes, np.exp(np.exp(log_x)), np.exp(np.exp(log_y)), shift=shift, z=z,
                                            sigma=None if sigma is None else sigma[:, None]))


def acceptance_draws(draws: tuple[Any, Any], *, n_drafts: np.ndarray, d_drafts: np.ndarray, m_target: float,
                     d_target: float, scales: PredictiveScales, labels: CandidateLabels | None = None,
                     seed: int = 0) -> np.ndarray:
    """Posterior-predictive alpha of each candidate paired with the target, shape ``(draws, candidates)``:
    the draws :func:`throughput_draws` turns into T for the same ``seed`` (every draw in [0, 1])."""
    n, d = np.asarray(n_drafts, np.float64), np.asarray(d_drafts, np.float64)
    laws, planes = _draw_columns(draws)
    return _predictive_alpha(laws, planes, scales, n, d, m_target, d_target, seed, labels or CandidateLabels())


NOT_PINNED_DOWN = "at a bound of the fit or far outside the posterior (the data do not pin it down)"
"""How reports say why :func:`point_for_decisions` set a point fit's law aside."""


def point_for_decisions(point: PointFit, laws: Any) -> tuple[PointFit, tuple[str, ...]]:
    """The point fit to predict the point-fit rule's draft, N* and curves with, and what the data
    did not pin down in it: the law's fields at a bound of the fit, else its fitting coordinates far
    outside the posterior.

    Where the point fit's law has a coefficient at a bound (:func:`sdsl_jax.infer.point.degenerate_coefficients`:
    zero, not finite, or beyond 1e30 in magnitude), or lies beyond the posterior's central 99% by
    more than its width in some fitting coordinate (:func:`sdsl_jax.infer.point.coordinates_beyond_posterior`:
    the optimiser ran along a direction the data leave open and the prior closes), its law is
    replaced by the posterior's median law (per field, over the draws ``laws``): the curve between
    and beyond the data is then the posterior's, not an artefact of where the optimiser stopped.
    Otherwise the point fit is returned as it is, with an empty tuple.
    """
    bad = degenerate_coefficients(point.law) or coordinates_beyond_posterior(point.family, point.theta, laws)
    if not bad:
        return point, ()
    median = type(point.law)(*(float(np.nanmedian(np.asarray(v, np.float64))) for v in laws))
    return point._replace(law=median, theta=np.asarray(point.family.to_theta(median), np.float64)), bad

