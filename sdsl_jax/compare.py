"""Forms compared and mixed: stacking weights over loss-law forms or acceptance models, and
N* bands from the stacked mixture of their predictive draws.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import jax
import numpy as np

from sdsl_jax.acceptance import AcceptanceModel
from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.infer.posterior import acceptance_pointwise_log_likelihood, pointwise_log_likelihood
from sdsl_jax.infer.results import Posterior
from sdsl_jax.infer.sampler import PosteriorRun, az
from sdsl_jax.loss_laws import LossLawFamily
from sdsl_jax.pipeline import PipelineResult
from sdsl_jax.predict.draws import PredictiveScales, predictive_planes
from sdsl_jax.predict.propagate import DraftSizeBands, solve_draws, summarize_draws
from sdsl_jax.predict.ranking import draft_budget_near
from sdsl_jax.recipes import as_recipe
from sdsl_jax.store import StageStore


__all__ = [
    "FormWeights",
    "stacking_weights",
    "acceptance_stacking_weights",
    "grouped_stacking_weights",
    "stack",
    "mixture_log_density",
    "loo_log_densities",
    "mixture_draw_indices",
    "mixture_bands",
    "stack_forms",
]


class FormWeights(NamedTuple):
    """Forms (loss laws, or acceptance models) compared by PSIS-LOO and their Bayesian stacking weights.

    Attributes:
      names: the forms (loss-law family or acceptance-model names).
      weights: stacking weights (sum to 1) [Yao, Vehtari, Simpson & Gelman 2018].
      elpd_loo, elpd_se: expected log predictive density by PSIS-LOO and its standard error.
      pareto_k_max: the largest Pareto k of each form's PSIS (above 0.7: LOO unreliable there).
      method: how the weights were computed.
      failed: forms whose posterior failed its checks (after the sampler's reruns): they get
        weight 0 and the others are stacked, unless every form failed (then all are stacked, and
        the method says so).
      unchecked_weights: the stacking weights over every form, as if every posterior had passed
        its checks: which failed forms would carry weight, and so are worth running again
        (:func:`sdsl_jax.validation.forms.fit_forms` with ``rerun_weight``).
    """

    names: tuple[str, ...]
    weights: np.ndarray
    elpd_loo: np.ndarray
    elpd_se: np.ndarray
    pareto_k_max: np.ndarray
    method: str
    failed: tuple[str, ...] = ()
    unchecked_weights: np.ndarray | None = None


def stacking_weights(runs: PretrainingRuns, posteriors: dict[str, Posterior], *,
                     families: dict[str, LossLawFamily] | None = None) -> FormWeights:
    """Stacking weights over loss-law forms from their posteriors: PSIS-LOO per row
    (:func:`loo_log_densities`), then :func:`stack`.

    Its LOO leaves out one ROW: with per-run effects the row's run keeps
    its other rows, so this scores interpolation within runs. Whether a form predicts a size it
    has not seen needs leave-one-size-out, which PSIS cannot approximate (a whole group's
    weight is too large for importance sampling): ``experiments.holdout`` does that fold loop
    and its grouped stacking weights are the ones to trust for extrapolation.

    ``families`` maps each name to its family (default: the shipped ``FAMILIES`` by name).
    """
    from sdsl_jax.loss_laws import FAMILIES

    families = FAMILIES if families is None else families
    pointwise = {}
    for name, post in posteriors.items():
        samples = post.law_run.samples
        run = runs.run_index()[0] if "run_sd" in samples else None
        pointwise[name] = (pointwise_log_likelihood(samples, families[name], runs.n_params, runs.n_tokens,
                                                          runs.loss, run=run), samples["sigma"])
    return _stacked(pointwise, "rows", failed=_failed(post.law_run for post in posteriors.values()))


def acceptance_stacking_weights(acceptance: AcceptanceMeasurements, plane_runs: dict[str, PosteriorRun], *,
                                models: dict[str, AcceptanceModel] | None = None) -> FormWeights:
    """Stacking weights over acceptance models from their posteriors, as :func:`stacking_weights`.

    ``plane_runs`` maps a model's name to its acceptance posterior (``Posterior.plane_run``);
    with per-model effects each pair is scored conditionally on its models' effects (pairs left
    out one at a time). ``models`` maps each name to its model (default ``ACCEPTANCE_MODELS``).
    """
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS

    models = ACCEPTANCE_MODELS if models is None else models
    pointwise = {}
    for name, run in plane_runs.items():
        groups = {}
        if "draft_sd" in run.samples:
            draft, _, target, _ = acceptance.model_index()
            groups = dict(draft=draft, target=target)
        ll = acceptance_pointwise_log_likelihood(run.samples, models[name], acceptance.ppl_draft,
                                                       acceptance.ppl_target, acceptance.alpha,
                                                       weights=acceptance.regression_weights(), **groups)
        pointwise[name] = (ll, run.samples["sigma"])
    return _stacked(pointwise, "pairs", failed=_failed(plane_runs.values()))


def stack(log_density: np.ndarray, *, tol: float = 1e-12, max_iterations: int = 100_000) -> np.ndarray:
    """Bayesian stacking weights: w on the simplex maximising ``sum_i log sum_k w_k p_k(y_i)``.

    Yao, Vehtari, Simpson & Gelman (2018), "Using stacking to average Bayesian predictive
    distributions", eq. 4, with ``log_density[k, i] = log p_k(y_i)`` the out-of-sample log
    predictive density of point i under form k: PSIS-LOO's per row (:func:`loo_log_densities`),
    or a held-out fold's per point. The objective is concave in w; it is maximised by EM for
    mixture weights (each step cannot lower it) until it gains less than ``tol``. The one stacking
    optimiser of the project: every weighting of forms calls it.
    """
    log_density = np.asarray(log_density, np.float64)
    if log_density.ndim != 2 or not np.isfinite(log_density).all():
        raise ValueError(f"log_density must be a finite (forms, points) array; got shape {log_density.shape} "
                         f"with {np.size(log_density) - np.isfinite(log_density).sum()} non-finite entries")
    k = log_density.shape[0]
    p = np.exp(log_density - log_density.max(axis=0, keepdims=True))  # a common factor per point cancels
    w, last = np.full(k, 1.0 / k), -np.inf
    for _ in range(max_iterations):
        mix = w @ p
        objective = float(np.sum(np.log(mix)))
        if objective - last < tol:
            break
        w, last = w * np.mean(p / mix, axis=1), objective
        w = w / w.sum()
    return w


def mixture_log_density(log_density: np.ndarray, weights: np.ndarray) -> float:
    """``sum_i log sum_k w_k p_k(y_i)``: the stacked mixture's log predictive density."""
    log_density = np.asarray(log_density, np.float64)
    top = log_density.max(axis=0)
    return float(np.sum(top + np.log(np.asarray(weights) @ np.exp(log_density - top))))


def loo_log_densities(log_likelihood: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSIS-LOO's log predictive density of each row and its Pareto k, from the pointwise
    log-likelihood ``(draws, rows)`` of one posterior (ArviZ's ``az.loo``; ``sigma``, any one
    posterior site, only gives ArviZ the draws' shape)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.from_dict(posterior={"sigma": np.asarray(sigma)[None]},
                             log_likelihood={"obs": np.asarray(log_likelihood)[None]})
        loo = az.loo(idata, pointwise=True)
    return np.asarray(loo.loo_i, np.float64), np.asarray(loo.pareto_k, np.float64)


def _failed(runs: Iterable[PosteriorRun]) -> tuple[bool, ...]:
    """Whether each run failed its checks (a run without diagnostics counts as passed)."""
    return tuple(run.diagnostics is not None and not run.diagnostics.ok for run in runs)


def _stack_passing(log_density: np.ndarray, failed: Sequence[bool]) -> tuple[np.ndarray, str, np.ndarray]:
    """:func:`stack` over the forms that passed their checks (weight 0 for the others), and a
    note for the method; all forms when every one failed. Also the weights over every form, as
    if all had passed (``FormWeights.unchecked_weights``)."""
    failed = np.asarray(failed, bool) if len(failed) else np.zeros(log_density.shape[0], bool)
    if log_density.shape[0] == 1:
        return np.ones(1), "", np.ones(1)
    unchecked = stack(log_density)
    if failed.all() or not failed.any():
        note = "; every form failed its posterior checks, all stacked" if failed.all() else ""
        return unchecked, note, unchecked
    weights = np.zeros(log_density.shape[0])
    weights[~failed] = stack(log_density[~failed]) if (~failed).sum() > 1 else 1.0
    return weights, "; forms whose posterior failed its checks get weight 0", unchecked


def failed_forms_worth_rerunning(weights: FormWeights, *, min_weight: float) -> tuple[str, ...]:
    """The forms whose posterior failed its checks but that would carry at least ``min_weight`` of
    the stacking weight were every posterior to pass (``weights.unchecked_weights``): the ones a
    longer run could bring back into the decision. A failed form the data give no weight is not
    worth the time; one they favour should not be dropped on one short run's diagnostics."""
    unchecked = weights.weights if weights.unchecked_weights is None else weights.unchecked_weights
    return tuple(name for name, w in zip(weights.names, unchecked) if name in weights.failed and w >= min_weight)


def failed_form_note(name: str, names: Sequence[str], failed: Sequence[str]) -> str:
    """What a form's line says of its failed checks: no weight, unless every form failed, when all
    are stacked (:func:`_stack_passing`)."""
    if name not in failed:
        return ""
    if len(names) > 1 and set(failed) >= set(names):
        return " (its posterior failed its checks, as every form's did: stacked all the same)"
    return " (its posterior failed its checks: no weight)"


def _stacked(pointwise: dict[str, tuple[np.ndarray, np.ndarray]], rows: str, *,
             failed: Sequence[bool] = ()) -> FormWeights:
    """:func:`stack` over forms from ``{name: (log-likelihood (draws, rows), sigma draws)}`` by
    PSIS-LOO; ``failed[k]``: form k's posterior failed its checks (:func:`_stack_passing`)."""
    names = tuple(pointwise)
    loo = [loo_log_densities(*pointwise[n]) for n in names]
    elpd_i = np.stack([v for v, _ in loo])
    weights, note, unchecked = _stack_passing(elpd_i, failed)
    rows_count = elpd_i.shape[1]
    method = ("a single form (weight 1)" if len(names) == 1 else
              f"Bayesian stacking of PSIS-LOO predictive densities (compare.stack); {rows} left out one at a time"
              + note)
    return FormWeights(names, weights, elpd_i.sum(axis=1), np.sqrt(rows_count * elpd_i.var(axis=1)),
                       np.array([float(np.max(k)) for _, k in loo]), method,
                       tuple(n for n, f in zip(names, failed) if f), unchecked)


def grouped_stacking_weights(log_density: dict[str, np.ndarray], *, groups: str,
                             failed: Sequence[str] = ()) -> FormWeights:
    """Stacking weights over forms from held-out log densities: ``{name: log p(y_i)}`` of the points
    of folds that each left out a whole group (``groups`` names them, e.g. "model sizes"), where
    PSIS-LOO, which leaves out one row, cannot say how a form predicts a new group. Forms named
    in ``failed`` (a posterior of theirs failed its checks) get weight 0 (:func:`_stack_passing`)."""
    names = tuple(log_density)
    stacked = np.stack([np.asarray(log_density[n], np.float64) for n in names])
    weights, note, unchecked = _stack_passing(stacked, [n in failed for n in names])
    return FormWeights(names, weights, stacked.sum(axis=1), np.sqrt(stacked.shape[1] * stacked.var(axis=1)),
                       np.full(len(names), np.nan),
                       f"Bayesian stacking of held-out predictive densities (compare.stack); {groups} left out one "
                       "at a time" + note, tuple(n for n in names if n in failed), unchecked)


def mixture_draw_indices(names: Sequence[str], weights: np.ndarray, total: int, *,
                         seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """The stacked mixture's draws: ``(form, indices)`` for each form that contributes, ``round(weight x
    total)`` of its ``total`` draws, a random subset in stored order (the draws are stored chain after
    chain, so a prefix would over-represent the first chains). The one mixing rule of the project."""
    out = []
    for name, w in zip(names, weights):
        count = min(int(round(float(w) * total)), total)
        if count:
            out.append((name, np.random.default_rng(seed).choice(total, size=count, replace=False)))
    return out


def mixture_bands(results: dict[str, PipelineResult], weights: FormWeights, *, m_grid: np.ndarray,
                  targets: np.ndarray, d_target: float, d_draft: float | None = None, recipe: Any = None,
                  cost: Any = SDSL_FLOPS, seed: int = 0) -> tuple[DraftSizeBands, DraftSizeBands]:
    """Bands on N* (grid, named targets) from the stacked mixture of the forms' predictive draws.

    Each form contributes its share of its own posterior-predictive draws (its laws, its paired
    acceptance draws and residual scales; :func:`mixture_draw_indices`), the mixture is summarised
    as one.
    """
    recipe = as_recipe(d_draft, recipe)
    m_grid, targets = np.asarray(m_grid, np.float64), np.asarray(targets, np.float64)
    m_all, k = np.concatenate([m_grid, targets]), m_grid.size
    total = min(np.size(r.draws[0][0]) for r in results.values())
    solved = []
    for name, idx in mixture_draw_indices(weights.names, weights.weights, total, seed=seed):
        res = results[name]
        laws, planes = (jax.tree.map(lambda v: np.asarray(v)[idx] if np.ndim(v) else v, x) for x in res.draws)
        if res.posterior is not None and res.scales is not None:
            scales = PredictiveScales(*(np.asarray(v)[idx] if isinstance(v, np.ndarray) else v
                                        for v in res.scales))
            d_ref = draft_budget_near(res.prediction.named.n_star, recipe, float(np.median(m_all)))
            planes = predictive_planes(planes, scales, d_draft=d_ref, d_target=d_target, seed=seed)
        solved.append(solve_draws(m_all, laws, planes, d_target=d_target, recipe=recipe, cost=cost))
    n_star, gamma, thr = (np.concatenate([s[i] for s in solved]) for i in range(3))
    return (summarize_draws(m_grid, n_star[:, :k], gamma[:, :k], thr[:, :k]),
            summarize_draws(targets, n_star[:, k:], gamma[:, k:], thr[:, k:]))


def stack_forms(result: PipelineResult, runs: PretrainingRuns, acceptance: AcceptanceMeasurements | None, *,
                families: Sequence[LossLawFamily], m_grid: np.ndarray, targets: np.ndarray, d_target: float,
                recipe: Any, cost: Any = SDSL_FLOPS, seed: int = 0,
                stages_for: Callable[[str], StageStore | None] = lambda name: None, log: Callable[[str], None] = print,
                **run_kwargs) -> tuple[PipelineResult, dict]:
    """Every other identifiable form of ``families`` run as ``result`` was, all weighted by stacking
    (:func:`stacking_weights`), and the mixture's bands put in ``result``.

    The acceptance posterior, which does not depend on the loss law's form, is ``result``'s, shared;
    ``stages_for(name)`` gives each form its resumable stages; ``run_kwargs`` (NUTS settings, effects,
    ``predictive``) go to :func:`sdsl_jax.pipeline.run`. Returns the result with the mixture's bands
    and the record of the stacking (weights, PSIS-LOO, forms skipped, each form's N*, and each form's
    identification: 1 - posterior variance / prior variance per parameter of its prior,
    :func:`sdsl_jax.infer.posterior.identification`).
    """
    from sdsl_jax import pipeline
    from sdsl_jax.infer.point import IdentifiabilityError, check_loss_law_data

    family = result.point.family
    results, skipped = {family.name: result}, {}
    for other in families:
        if other is family:
            continue
        try:
            check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=other)
        except IdentifiabilityError as err:
            skipped[other.name] = err.problem
            log(f"stacking: {other.name} skipped ({err.problem})")
            continue
        log(f"stacking: fitting the {other.name} form (point fit, posterior, N* draws)")
        results[other.name] = pipeline.run(
            runs, acceptance, m_grid=m_grid, targets=targets, d_target=d_target, recipe=recipe, family=other,
            acceptance_model=result.point.acceptance_model, cost=cost, posterior=True, seed=seed,
            stages=stages_for(other.name), plane_run=result.posterior.plane_run, log=lambda _: None, **run_kwargs)
    weights = stacking_weights(runs, {k: r.posterior for k, r in results.items()},
                               families={k: r.point.family for k, r in results.items()})
    for name, w, elpd, se, k in zip(weights.names, weights.weights, weights.elpd_loo, weights.elpd_se,
                                    weights.pareto_k_max):
        note = failed_form_note(name, weights.names, weights.failed)
        log(f"stacking: {name:>10}: weight {w:.3f}, elpd_loo {elpd:.1f} (se {se:.1f}), max Pareto k {k:.2f}{note}")
    grid_bands, named_bands = mixture_bands(results, weights, m_grid=m_grid, targets=targets, d_target=d_target,
                                            recipe=recipe, cost=cost, seed=seed)
    q = list(named_bands.quantiles)
    entry = dict(
        method=weights.method, forms=list(weights.names), weights=weights.weights.tolist(),
        elpd_loo=weights.elpd_loo.tolist(), elpd_se=weights.elpd_se.tolist(),
        pareto_k_max=weights.pareto_k_max.tolist(), skipped=skipped, failed_checks=list(weights.failed),
        meaning="the bands (targets, grid, linear law) are those of the stacked mixture of the forms' draws; the point "
                "fit is --law's. For extrapolation to unseen sizes see experiments.holdout (grouped folds).",
        n_star_point={name: np.asarray(r.prediction.named.n_star).tolist() for name, r in results.items()},
        n_star_median={name: np.asarray(r.prediction.target_bands.n_star[q.index(0.5)]).tolist()
                       for name, r in results.items()},
        identification={name: dict(zip(r.posterior.identification.names,
                                       map(float, r.posterior.identification.contraction)))
                        for name, r in results.items() if r.posterior.identification is not None})
    pred = result.prediction._replace(bands=grid_bands, target_bands=named_bands)
    return result._replace(prediction=pred), entry
