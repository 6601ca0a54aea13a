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
    "STACKING_DENSITIES",
    "check_stacking_density",
    "FormWeights",
    "stacking_weights",
    "acceptance_stacking_weights",
    "grouped_stacking_weights",
    "SizeFolds",
    "size_fold_weights",
    "draft_size_fold_weights",
    "stack",
    "mixture_log_density",
    "loo_log_densities",
    "mixture_draw_indices",
    "mixture_bands",
    "stack_forms",
]


STACKING_DENSITIES = ("rows", "sizes")
"""What the forms' stacking weights are computed from (``weights_by`` of :func:`stack_forms` and
:func:`sdsl_jax.validation.forms.fit_forms`, ``--stack-by`` of the commands): ``"rows"``, row-wise
PSIS-LOO predictive densities (one posterior per form; scores interpolation within the sizes
fitted); ``"sizes"``, grouped leave-one-size-out densities (each form refitted once per size;
scores what N* for a new target asks of a form)."""


def check_stacking_density(weights_by: str) -> str:
    """``weights_by`` if it is one of :data:`STACKING_DENSITIES`, else a ``ValueError`` naming it."""
    if weights_by not in STACKING_DENSITIES:
        raise ValueError(f"weights_by: {weights_by!r} is not a stacking density; choose one of "
                         + ", ".join(repr(d) for d in STACKING_DENSITIES))
    return weights_by


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
    in ``failed`` (a posterior of theirs failed its checks) get weight 0 (:func:`_stack_passing`); so does
    a form whose densities are not all finite (not scored: :func:`size_fold_weights` does not refit a
    failed form), also in the weights as if every posterior had passed."""
    names = tuple(log_density)
    stacked = np.stack([np.asarray(log_density[n], np.float64) for n in names])
    scored = np.isfinite(stacked).all(axis=1)
    if not scored.any():
        raise ValueError("no form has a finite held-out log density for every row")
    weights, unchecked = np.zeros(len(names)), np.zeros(len(names))
    weights[scored], note, unchecked[scored] = _stack_passing(
        stacked[scored], [n in failed for n, s in zip(names, scored) if s])
    if not scored.all() and "get weight 0" not in note:
        note += "; forms whose posterior failed its checks get weight 0"
    return FormWeights(names, weights, stacked.sum(axis=1), np.sqrt(stacked.shape[1] * stacked.var(axis=1)),
                       np.full(len(names), np.nan),
                       f"Bayesian stacking of held-out predictive densities (compare.stack); {groups} left out one "
                       "at a time" + note, tuple(n for n in names if n in failed), unchecked)


class SizeFolds(NamedTuple):
    """Grouped leave-one-size-out predictive densities of forms: loss laws by model size
    (:func:`size_fold_weights`), acceptance models by draft size (:func:`draft_size_fold_weights`).

    Attributes:
      weights: the stacking weights over the forms from these densities (:func:`grouped_stacking_weights`).
      log_density: per form, the log predictive density of each row (pair) when its model (draft)
        size was left out (rows in the data's order).
      fold_problems: per form, the folds whose posterior failed its checks (the size left out, ``"%.6g"``,
        or ``"first-last"`` of a group of sizes), with the checks; a form with any gets no weight.
    """

    weights: FormWeights
    log_density: dict[str, np.ndarray]
    fold_problems: dict[str, dict[str, list[str]]]


def size_fold_weights(runs: PretrainingRuns, families: Sequence[LossLawFamily], *, num_chains: int = 4,
                      num_warmup: int = 500, num_samples: int = 500, retries: int = 0, seed: int = 0,
                      run_effects: bool = False, failed: Sequence[str] = (), max_folds: int = 10,
                      prior_width: float = 1.0,
                      stages_for: Callable[[str], StageStore | None] = lambda name: None,
                      log: Callable[[str], None] = print) -> SizeFolds | None:
    """Stacking weights over loss-law forms for sizes the data do not hold: grouped leave-one-size-out.

    For every form and every model size (or, with more than ``max_folds`` sizes, every one of
    ``max_folds`` groups of neighbouring sizes), the form's posterior on the other sizes (NUTS as
    :func:`sdsl_jax.infer.sample_loss_law`, ``retries`` reruns of a fold that fails its checks)
    and the log predictive density of the left-out rows, each of their runs a new run
    (:func:`sdsl_jax.validation.holdout.new_run_log_density`); then Bayesian stacking of those
    densities [Yao, Vehtari, Simpson & Gelman 2018]. Row-wise PSIS-LOO scores a form on a row of a
    size whose other rows it has seen; a form is used here to predict sizes it has not, which only
    leaving out a whole size measures (PSIS cannot approximate it: a size's weight is too large for
    importance sampling). A form one of whose fold posteriors fails its checks, or named in
    ``failed`` (its posterior on all the data failed), gets no weight (all are stacked if every
    form fails). A form named in ``failed`` is not refitted by size while another form is not:
    its folds could not give it weight (its log densities are NaN, ``fold_problems`` empty).

    ``stages_for(name)``: a :class:`~sdsl_jax.store.StageStore` per form, in which each fold's
    densities are kept when it ends (``fold-<sizes>``), so an interrupted run resumes fold by fold.
    ``prior_width``: every prior that many times as wide, as the forms' own posteriors were sampled.
    Returns None when some fold's data cannot identify a form (forms are stacked only on the same
    folds; the log says which) or there are fewer than two forms.
    """
    from sdsl_jax.infer import sample_loss_law
    from sdsl_jax.infer.point import IdentifiabilityError, check_loss_law_data
    from sdsl_jax.validation.holdout import new_run_log_density

    sizes = np.array(sorted(set(map(float, runs.n_params))))
    groups = [g for g in np.array_split(sizes, min(max_folds, sizes.size)) if g.size]
    labels = [f"{g[0]:.6g}" if g.size == 1 else f"{g[0]:.6g}-{g[-1]:.6g}" for g in groups]
    masks = [~np.isin(np.asarray(runs.n_params, np.float64), group) for group in groups]
    folds = [(keep, label, runs.select(keep), runs.select(~keep)) for keep, label in zip(masks, labels)]
    if len(families) < 2:
        return None
    for family in families:  # every form on every fold, or none: forms are stacked on the same folds
        for _, label, train, _ in folds:
            try:
                check_loss_law_data(train.n_params, train.n_tokens, train.loss, family=family)
            except IdentifiabilityError as err:
                log(f"stacking by size: {family.name} cannot be fitted without size(s) {label} ({err.problem})")
                return None
    by_name = {family.name: family for family in families}

    def fit_fold(name, keep):
        train, test = runs.select(keep), runs.select(~keep)
        post = sample_loss_law(train.n_params, train.n_tokens, train.loss, family=by_name[name],
                               run=train.run_index()[0] if run_effects else None, num_chains=num_chains,
                               num_warmup=num_warmup, num_samples=num_samples, seed=seed, retries=retries,
                               prior_width=prior_width, progress_bar=False)
        return new_run_log_density(post.samples, by_name[name], test, seed=seed)[0], post.diagnostics.problems

    return _stacked_folds(tuple(by_name), [(keep, label) for keep, label, _, _ in folds], fit_fold, num_rows=len(runs),
                          failed=failed, stages_for=stages_for, stage="fold", what="size", without="size(s) {}",
                          groups="model sizes", log=log)


def draft_size_fold_weights(pairs: AcceptanceMeasurements, models: Sequence[AcceptanceModel], *,
                            effect_sides: tuple[str, ...] = (), num_chains: int = 4, num_warmup: int = 500,
                            num_samples: int = 500, seed: int = 0, failed: Sequence[str] = (),
                            stages_for: Callable[[str], StageStore | None] = lambda name: None,
                            log: Callable[[str], None] = print) -> SizeFolds | None:
    """Stacking weights over acceptance models for draft sizes the pairs do not hold: grouped
    leave-one-draft-size-out, the acceptance side of :func:`size_fold_weights`.

    For every model and every draft size of ``pairs``, the model's posterior on the pairs of the other
    draft sizes (:func:`sdsl_jax.validation.holdout.acceptance_fold`, with per-model effects of
    ``effect_sides``: the left-out drafts are new models and draw theirs) and the log predictive
    density of the left-out pairs; then Bayesian stacking of those densities. PSIS-LOO over pairs
    scores a pair whose draft the fit has seen in its other pairs; choosing a draft for a target asks
    how a model predicts a draft size it has not, which only leaving out the size measures. Each pair
    is left out once (with its draft). A model whose fold posterior fails its checks, or named in
    ``failed``, gets no weight; a model named in ``failed`` is not refitted while another is not.
    ``stages_for(name)``: each fold's densities kept there (``draft-fold-<size>``) as it ends.
    Returns None with fewer than two models or two draft sizes.
    """
    from sdsl_jax.validation.holdout import acceptance_fold

    sizes = sorted(set(map(float, pairs.n_draft)))
    if len(models) < 2 or len(sizes) < 2:
        return None
    by_name = {model.name: model for model in models}

    def fit_fold(name, keep):
        fold = acceptance_fold(pairs, keep, by_name[name], chains=num_chains, warmup=num_warmup, draws=num_samples,
                               seed=seed, model_effects=effect_sides)
        return fold["log_density"], fold["problems"]

    folds = [(np.asarray(pairs.n_draft, np.float64) != size, f"{size:.6g}") for size in sizes]
    return _stacked_folds(tuple(by_name), folds, fit_fold, num_rows=len(pairs), failed=failed, stages_for=stages_for,
                          stage="draft-fold", what="draft size", without="drafts of {}", groups="draft sizes",
                          log=log)


def _stacked_folds(names: tuple[str, ...], folds: list[tuple[np.ndarray, str]], fit_fold, *, num_rows: int,
                   failed: Sequence[str], stages_for, stage: str, what: str, without: str, groups: str,
                   log: Callable[[str], None]) -> SizeFolds:
    """Every form's held-out densities over ``folds`` (``(keep, label)``: the rows kept), fold by fold
    (``fit_fold(name, keep) -> (log densities of the rows left out, the posterior's problems)``, each
    kept in ``stages_for(name)`` as ``<stage>-<label>`` when it ends), and their stacking weights.
    A form named in ``failed`` is not refitted while another form is not."""
    density, problems = {}, {}
    unscored = set(failed) if any(name not in failed for name in names) else set()
    for name in names:
        stages, rows, failed_folds = stages_for(name), np.full(num_rows, np.nan), {}
        density[name], problems[name] = rows, failed_folds
        if name in unscored:
            log(f"stacking by {what}: {name} not refitted by {what} (its posterior on all the data failed its "
                "checks: no weight)")
            continue
        for keep, label in folds:
            stored = stages.load(f"{stage}-{label}") if stages is not None else None
            if stored is None:
                log_density, fold_problems = fit_fold(name, keep)
                stored = dict(log_density=np.asarray(log_density, np.float64),
                              problems=np.array(list(fold_problems), dtype=str))
                if stages is not None:
                    stages.save(f"{stage}-{label}", **stored)
            rows[~keep] = stored["log_density"]
            if len(stored["problems"]):
                failed_folds[label] = [str(p) for p in stored["problems"]]
            log(f"stacking by {what}: {name} without {without.format(label)}: held-out log density "
                f"{float(np.sum(stored['log_density'])):.2f}" + (" (its posterior failed its checks)" if
                                                                 len(stored["problems"]) else ""))
    weights = grouped_stacking_weights(density, groups=groups, failed=[n for n in density if problems[n] or n in failed])
    return SizeFolds(weights, density, problems)


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
                weights_by: str = "rows", **run_kwargs) -> tuple[PipelineResult, dict]:
    """Every other identifiable form of ``families`` run as ``result`` was, all weighted by stacking,
    and the mixture's bands put in ``result``.

    ``weights_by``: ``"sizes"``, stacking of grouped leave-one-size-out predictive densities
    (:func:`size_fold_weights`: how each form predicts a size it has not seen, what N* for a new
    target asks of it; each form refitted once per size), with row-wise PSIS-LOO recorded beside
    them; ``"rows"``, stacking of row-wise PSIS-LOO densities (:func:`stacking_weights`: one
    posterior per form, but it scores interpolation within sizes).

    The acceptance posterior, which does not depend on the loss law's form, is ``result``'s, shared;
    ``stages_for(name)`` gives each form its resumable stages; ``run_kwargs`` (NUTS settings, effects,
    ``predictive``) go to :func:`sdsl_jax.pipeline.run`. Returns the result with the mixture's bands
    and the record of the stacking (weights, PSIS-LOO, forms skipped, each form's N*, and each form's
    identification: 1 - posterior variance / prior variance per parameter of its prior,
    :func:`sdsl_jax.infer.posterior.identification`).
    """
    from sdsl_jax import pipeline
    from sdsl_jax.infer.point import IdentifiabilityError, check_loss_law_data

    check_stacking_density(weights_by)
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
    by_rows = stacking_weights(runs, {k: r.posterior for k, r in results.items()},
                               families={k: r.point.family for k, r in results.items()})
    folds = None
    if weights_by == "sizes":
        run_effects = run_kwargs.get("run_effects")
        folds = size_fold_weights(
            runs, [r.point.family for r in results.values()], num_chains=run_kwargs.get("num_chains", 4),
            num_warmup=run_kwargs.get("num_warmup", 500), num_samples=run_kwargs.get("num_samples", 500),
            retries=run_kwargs.get("retries", 0), seed=seed, failed=by_rows.failed,
            run_effects=pipeline.has_repeated_runs(runs) if run_effects is None else bool(run_effects),
            stages_for=stages_for, log=log)
        if folds is None:
            log("stacking: the forms cannot all be fitted without each size: weights from PSIS-LOO over rows")
    weights = by_rows if folds is None else folds.weights
    for i, name in enumerate(weights.names):
        note = failed_form_note(name, weights.names, weights.failed)
        j = by_rows.names.index(name)
        held_out = "" if folds is None else f"held-out log density {weights.elpd_loo[i]:.1f}, "
        log(f"stacking: {name:>10}: weight {weights.weights[i]:.3f}, {held_out}elpd_loo {by_rows.elpd_loo[j]:.1f} "
            f"(se {by_rows.elpd_se[j]:.1f}), max Pareto k {by_rows.pareto_k_max[j]:.2f}{note}")
    grid_bands, named_bands = mixture_bands(results, weights, m_grid=m_grid, targets=targets, d_target=d_target,
                                            recipe=recipe, cost=cost, seed=seed)
    q = list(named_bands.quantiles)
    rows_order = [by_rows.names.index(name) for name in weights.names]
    entry = dict(
        method=weights.method, forms=list(weights.names), weights=weights.weights.tolist(),
        elpd_loo=by_rows.elpd_loo[rows_order].tolist(), elpd_se=by_rows.elpd_se[rows_order].tolist(),
        pareto_k_max=by_rows.pareto_k_max[rows_order].tolist(), skipped=skipped, failed_checks=list(weights.failed),
        **({} if folds is None else dict(
            weights_psis_loo_rows=by_rows.weights[rows_order].tolist(),
            held_out_log_density=weights.elpd_loo.tolist(), held_out_se=weights.elpd_se.tolist(),
            fold_problems=folds.fold_problems)),
        meaning="the bands (targets, grid, linear law) are those of the stacked mixture of the forms' draws; the point "
                "fit is --law's. " + ("Weights from each model size left out in turn (held_out_log_density); "
                                      "elpd_loo and weights_psis_loo_rows are row-wise PSIS-LOO's, for comparison."
                                      if folds is not None else
                                      "Weights from row-wise PSIS-LOO, which scores rows of sizes the fit has seen: "
                                      "for unseen sizes use --stack-by sizes."),
        n_star_point={name: np.asarray(r.prediction.named.n_star).tolist() for name, r in results.items()},
        n_star_median={name: np.asarray(r.prediction.target_bands.n_star[q.index(0.5)]).tolist()
                       for name, r in results.items()},
        identification={name: dict(zip(r.posterior.identification.names,
                                       map(float, r.posterior.identification.contraction)))
                        for name, r in results.items() if r.posterior.identification is not None},
        diagnostics={name: r.posterior.diagnostics.loss_law._asdict() for name, r in results.items()
                     if r.posterior.diagnostics is not None})
    pred = result.prediction._replace(bands=grid_bands, target_bands=named_bands)
    return result._replace(prediction=pred), entry
