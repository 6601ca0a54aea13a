"""One pipeline from data to N*: point fits -> posteriors -> propagation -> one typed result.

Every caller (the ``experiments.fit`` and ``experiments.closure`` CLIs, the notebooks, the tests)
runs the same steps, each a function that can also be called alone:

1. :func:`fit_point` -- the loss law (any :class:`~sdsl_jax.loss_laws.LossLawFamily`, multi-start
   summed Huber on log L) and the acceptance model (weighted least squares; the paper's plane,
   held fixed, when there are no acceptance data);
2. :func:`sample_posterior` -- NUTS posteriors of both, with diagnostics;
3. :func:`sdsl_jax.predict.paired_draws` -- the one rule pairing loss-law draws with acceptance draws;
4. :func:`sdsl_jax.predict.predict_draft_size` -- N*(M) on a grid and for named targets under any
   cost model and draft recipe, the linear law ``N* ~ mu M + M0``, and with draws, bands.

:func:`run` chains 1-4 into a :class:`PipelineResult`. Finished units of work can be kept in a
:class:`~sdsl_jax.store.StageStore` so that an interrupted run resumes where it stopped. The
fits live in :mod:`sdsl_jax.infer`, the predictions in :mod:`sdsl_jax.predict`, the comparison
of forms in :mod:`sdsl_jax.compare`; this module only orchestrates them.

Everything here needs float64 (the Huber fit and N*): enable x64 before calling.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from sdsl_jax.acceptance import PLANE, SDSL2026, AcceptanceModel
from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.infer.models import effect_sides_of
from sdsl_jax.infer.point import NEAR_OPTIMUM, degenerate_coefficients, fit_acceptance_plane, fit_loss_law, rival_optima
from sdsl_jax.infer.posterior import identification, laws_from_posterior, planes_from_posterior, sample_loss_law, sample_plane
from sdsl_jax.infer.results import PointFit, Posterior, PosteriorChecks
from sdsl_jax.infer.sampler import PosteriorRun
from sdsl_jax.loss_laws import CHINCHILLA, LossLawFamily
from sdsl_jax.predict.draws import PredictiveScales, paired_draws, predictive_scales
from sdsl_jax.predict.propagate import plane_sensitivity
from sdsl_jax.predict.ranking import NOT_PINNED_DOWN, DraftSizePrediction, point_for_decisions, predict_draft_size
from sdsl_jax.protocols import AcceptanceRateModel, LossLawModel
from sdsl_jax.recipes import as_recipe
from sdsl_jax.store import StageStore


__all__ = [
    "PipelineResult",
    "fit_point",
    "sample_posterior",
    "has_repeated_runs",
    "run",
]

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass



class PipelineResult(NamedTuple):
    """What :func:`run` returns: the point fits, the posterior (or None) and the N* prediction."""

    point: PointFit
    posterior: Posterior | None
    prediction: DraftSizePrediction
    sensitivity: dict[str, np.ndarray] | None  # elasticities of N* to a fixed plane's coefficients
    draws: tuple[LossLawModel, AcceptanceRateModel] | None = None  # the paired (laws, planes) behind the bands
    scales: PredictiveScales | None = None  # their residual scales (None: mean-curve bands)
    # The point fit's law fields at a bound of the fit (:func:`~sdsl_jax.infer.point.degenerate_coefficients`);
    # with a posterior, ``point.law`` is then its median law (:func:`~sdsl_jax.predict.point_for_decisions`).
    point_at_bound: tuple[str, ...] = ()


def fit_point(
    runs: PretrainingRuns,
    acceptance: AcceptanceMeasurements | None = None,
    *,
    family: LossLawFamily = CHINCHILLA,
    acceptance_model: AcceptanceModel = PLANE,
    fixed_plane: Any = SDSL2026,
    starts: np.ndarray | None = None,
    stages: StageStore | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    log: Log = _quiet,
    require_identified: bool = True,
) -> PointFit:
    """Point fits of the loss law and the acceptance model.

    Args:
      runs: pre-training runs (N, D, L).
      acceptance: acceptance measurements; None keeps ``fixed_plane`` (the paper's plane).
      family: loss-law family.
      acceptance_model: acceptance model fitted to ``acceptance``.
      fixed_plane: the plane used without acceptance data.
      starts: multi-start grid (rows of the family's theta); default the family's.
      stages: where a finished loss-law fit is kept for ``--resume``.
      progress: the multi-start fitter's ``(round, active, total)`` callback.
      log: receives one line per finished step.
      require_identified: refuse runs that cannot identify ``family`` (see :func:`fit_loss_law`).
    """
    cached = stages.load("point_fit") if stages is not None else None
    if cached is None:
        fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, starts=starts, progress=progress,
                           require_identified=require_identified)
        rivals = rival_optima(fit.result.all_params, fit.result.all_values, tuple(family.theta_names),
                              converged=fit.result.all_converged)
        cached = dict(theta=np.asarray(fit.theta), value=np.asarray(fit.result.value),
                      converged=np.asarray(fit.result.converged), not_unique=np.asarray(",".join(rivals)))
        if stages is not None:
            stages.save("point_fit", **cached)
    else:
        log("loss law: point fit reused from an earlier run (--resume)")
    theta = np.asarray(cached["theta"], np.float64)
    law_arrays = family.from_theta(theta)
    law = type(law_arrays)(*(float(v) for v in law_arrays))
    if acceptance is not None:
        plane_fit = fit_acceptance_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                                         weights=acceptance.regression_weights(), model=acceptance_model)
        plane = type(plane_fit.plane)(*(float(v) for v in plane_fit.plane))
        r2 = float(plane_fit.r_squared)
    else:
        plane, r2 = fixed_plane, float("nan")
    not_unique = tuple(n for n in str(cached.get("not_unique", "")).split(",") if n)
    return PointFit(law, theta, float(cached["value"]), bool(cached["converged"]), family, plane, acceptance_model,
                    acceptance is not None, r2, not_unique)


def sample_posterior(
    runs: PretrainingRuns,
    acceptance: AcceptanceMeasurements | None,
    point: PointFit,
    *,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    plane_seed: int | None = None,
    run_effects: bool | None = None,
    model_effects: bool | tuple[str, ...] | None = None,
    plane_run: PosteriorRun | None = None,
    law_run: PosteriorRun | None = None,
    retries: int = 0,
    prior_width: float = 1.0,
    progress_bar: bool = False,
    stages: StageStore | None = None,
    log: Log = _quiet,
) -> Posterior:
    """NUTS posteriors of the loss law (and of the acceptance model when there are data).

    ``plane_seed`` defaults to ``seed + 1``. ``run_effects``: the hierarchical loss law with a
    random intercept and slope in log D per training run (:func:`sdsl_jax.infer.models.run_effects_model_for`;
    runs from :meth:`PretrainingRuns.run_index`); None (default) uses it when some run has rows
    at two or more budgets D, where the effects are identified. ``model_effects``: the acceptance
    model with a random effect per draft and per target model
    (:func:`sdsl_jax.infer.models.model_effects_plane_model_for`; models from
    :meth:`AcceptanceMeasurements.model_index`): True for both kinds of model, or the kinds to give
    effects (``("draft",)``); None gives them to each kind whose effects' scale the design identifies
    (:meth:`AcceptanceMeasurements.model_effects_identified`). ``plane_run``: an acceptance posterior of the same data and model to reuse instead of
    sampling one (it does not depend on the loss law: forms compared side by side share it);
    ``law_run`` likewise a loss-law posterior of the same data and family (acceptance models
    compared side by side share it). ``retries``: a run that fails its checks is run again, at
    most this many times, longer (:func:`sdsl_jax.infer.posterior.rerun_until_checked`). ``prior_width``: every prior
    that many times as wide (:func:`sdsl_jax.infer.models.widened_priors`). With ``stages``, each finished run
    is kept (and its netCDF written beside the stages) and reused on ``--resume``.
    """
    plane_seed = seed + 1 if plane_seed is None else plane_seed
    kw = dict(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, progress_bar=progress_bar,
              retries=retries, prior_width=prior_width)
    if law_run is None:
        law_run = _law_posterior(runs, point, run_effects=run_effects, seed=seed, stages=stages, log=log, **kw)
    laws = laws_from_posterior(law_run.samples, point.family)
    identified = identification(law_run.samples, point.family, seed=seed)
    for flag in identified.flags:
        log(f"posterior: loss law {flag}")
    if acceptance is None:
        return Posterior(laws, point.plane, law_run, None, PosteriorChecks(law_run.diagnostics), identified)
    if plane_run is None:
        log(f"posterior: loss law done (max R-hat {law_run.diagnostics.max_rhat:.3f}); sampling the acceptance "
            "model")
        plane_run = _acceptance_posterior(acceptance, point, model_effects=model_effects, seed=plane_seed,
                                          stages=stages, log=log, **kw)
    planes = planes_from_posterior(plane_run.samples, point.acceptance_model)
    checks = PosteriorChecks(law_run.diagnostics, plane_run.diagnostics)
    return Posterior(laws, planes, law_run, plane_run, checks, identified)


def _law_posterior(runs: PretrainingRuns, point: PointFit, *, run_effects: bool | None, seed: int,
                   stages: StageStore | None, log: Log, **kw) -> PosteriorRun:
    """The loss law's NUTS run (with per-run effects where asked, or where identified), or the
    stored one on ``--resume``."""
    if run_effects is None:
        run_effects = has_repeated_runs(runs)
    run = runs.run_index()[0] if run_effects else None
    progress = _nuts_progress(log, "loss law", kw["num_warmup"] + kw["num_samples"])

    def draw():
        return sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=point.family,
                               seed=seed, run=run, progress=progress, **kw)

    law_run, reused = stages.posterior("loss_law_posterior", draw) if stages else (draw(), False)
    if reused:
        log("posterior: loss-law draws reused from an earlier run (--resume)")
    return law_run


def _acceptance_posterior(acceptance: AcceptanceMeasurements, point: PointFit, *,
                          model_effects: bool | tuple[str, ...] | None,
                          seed: int, stages: StageStore | None, log: Log, **kw) -> PosteriorRun:
    """The acceptance model's NUTS run (with per-model effects where asked, or where identified), or
    the stored one on ``--resume``."""
    if model_effects is None:
        model_effects, why = acceptance.model_effects_identified()
        log(f"posterior: per-model acceptance effects {' and '.join(model_effects) or 'off'} ({why})")
    groups = {}
    if model_effects:
        draft, _, target, _ = acceptance.model_index()
        groups = dict(draft=draft, target=target, effect_sides=effect_sides_of(model_effects))
    progress = _nuts_progress(log, "acceptance", kw["num_warmup"] + kw["num_samples"])

    def draw():
        return sample_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                            weights=acceptance.regression_weights(), model=point.acceptance_model, seed=seed,
                            progress=progress, **groups, **kw)

    plane_run, reused = stages.posterior("plane_posterior", draw) if stages else (draw(), False)
    if reused:
        log("posterior: acceptance draws reused from an earlier run (--resume)")
    return plane_run


PROGRESS_MIN_ITERATIONS = 1000
"""NUTS runs of at least this many iterations per chain (warm-up + draws) report their progress; shorter
ones finish in seconds and run in one piece (the pieces compile a second loop)."""


def _nuts_progress(log: Log, what: str, iterations: int) -> Callable[[str], None] | None:
    """NUTS's progress lines as continuations of the current step (None when nobody reads them, or
    the run is short: the sampler then runs in one piece)."""
    if log is _quiet or iterations < PROGRESS_MIN_ITERATIONS:
        return None
    return lambda msg: log(f"  ... {what} NUTS {msg}")


def has_repeated_runs(runs: PretrainingRuns) -> bool:
    """Whether some training run has rows at two or more budgets D (run effects are identified)."""
    index, count = runs.run_index()
    return any(np.unique(runs.n_tokens[index == r]).size >= 2 for r in range(count))



def run(
    runs: PretrainingRuns,
    acceptance: AcceptanceMeasurements | None = None,
    *,
    m_grid: np.ndarray,
    targets: np.ndarray,
    d_target: float,
    d_draft: float | None = None,
    recipe: Any = None,
    family: LossLawFamily = CHINCHILLA,
    acceptance_model: AcceptanceModel = PLANE,
    cost: Any = SDSL_FLOPS,
    posterior: bool = False,
    predictive: bool = True,
    run_effects: bool | None = None,
    model_effects: bool | tuple[str, ...] | None = None,
    plane_run: PosteriorRun | None = None,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    retries: int = 0,
    starts: np.ndarray | None = None,
    stages: StageStore | None = None,
    progress_bar: bool = False,
    fit_progress: Callable[[int, int, int], None] | None = None,
    log: Log = _quiet,
) -> PipelineResult:
    """Fit -> posterior -> propagation: everything ``python -m experiments.fit`` reports.

    Args:
      runs, acceptance: the data (``acceptance`` None: the paper's plane, held fixed, and the
        sensitivity of N* to it instead of a band).
      m_grid, targets: target sizes for N*(M) and the linear law, and the named ones.
      d_target, d_draft, recipe: training budgets of target and drafts.
      family, acceptance_model, cost: the chain's links.
      posterior: also sample NUTS posteriors and report bands.
      predictive: posterior-predictive bands (the residuals of new models, :func:`predictive_planes`);
        False: bands of the law's mean curve only.
      run_effects: per-run random effects in the loss law (None: where identified; see
        :func:`sample_posterior`).
      model_effects: per-draft and per-target model effects in the acceptance model (None: where
        identified; see :func:`sample_posterior`).
      plane_run: an acceptance posterior to reuse (see :func:`sample_posterior`).
      num_chains, num_warmup, num_samples, seed: NUTS settings; retries: reruns of a posterior that
        fails its checks (:func:`sample_posterior`).
      starts: loss-law multi-start grid (default the family's).
      stages: a :class:`StageStore` for resumable runs.
      progress_bar: NumPyro's progress bars.
      fit_progress: the multi-start fitter's callback.
      log: receives progress lines.
    """
    recipe = as_recipe(d_draft, recipe)
    point = fit_point(runs, acceptance, family=family, acceptance_model=acceptance_model, starts=starts,
                      stages=stages, progress=fit_progress, log=log)
    _log_point(point, log)
    post = draws = scales = None
    if posterior:
        log(f"posterior: NUTS on the loss law{' and the acceptance model' if acceptance is not None else ''}, "
            f"{num_chains} chains x ({num_warmup} warm-up + {num_samples} draws)")
        post = sample_posterior(runs, acceptance, point, num_chains=num_chains, num_warmup=num_warmup,
                                num_samples=num_samples, seed=seed, run_effects=run_effects,
                                model_effects=model_effects, plane_run=plane_run, retries=retries,
                                progress_bar=progress_bar, stages=stages, log=log)
        draws = paired_draws(post)
        scales = predictive_scales(post) if predictive else None
    if post is not None:
        point, at_bound = point_for_decisions(point, draws[0])  # the draws behind the bands: the median they report
        if at_bound:
            log(f"loss law: the point fit's {', '.join(at_bound)} {NOT_PINNED_DOWN}; the point N* is the posterior "
                "median law's")
    else:  # the report warns instead (report.add_data_checks): there is no law to replace it with
        at_bound = degenerate_coefficients(point.law)
    log(f"N*: solving {len(np.atleast_1d(m_grid)) + len(np.atleast_1d(targets))} targets at the point fit"
        + (" and for every posterior draw" if draws is not None else "") + " (compiling the solver first)")
    prediction = predict_draft_size(point, m_grid=m_grid, targets=targets, d_target=d_target, recipe=recipe,
                                    cost=cost, draws=draws, scales=scales, seed=seed,
                                    progress=lambda d, t: log(f"  {d}/{t} draws solved"))
    sensitivity = None
    if not point.plane_fitted:
        log("sensitivity: d log N* / d log |A, B, C| of the fixed plane, by implicit derivatives")
        sensitivity = plane_sensitivity(targets, law=point.law, plane=point.plane, d_target=d_target,
                                        recipe=recipe, cost=cost, n_star=prediction.named.n_star)
    return PipelineResult(point, post, prediction, sensitivity, draws, scales, at_bound)


def _log_point(point: PointFit, log: Log) -> None:
    """The point fits, one line each, with the warning when the loss law's optimum is not unique."""
    log("loss law ({}): {} (objective {:.6g}, {})".format(
        point.family.name, " ".join(f"{k}={v:.5g}" for k, v in point.law._asdict().items()), point.objective,
        "converged" if point.converged else "NOT converged"))
    if point.not_unique:
        log(f"loss law: the point fit is not unique: starts ending within {NEAR_OPTIMUM:.0%} of the best objective "
            f"disagree on {', '.join(point.not_unique)} (a machine's rounding can pick another of them; the "
            "posterior bands carry this, the point does not)")
    if point.plane_fitted:
        log("acceptance ({}): {} R^2={:.3f}".format(
            point.acceptance_model.name, " ".join(f"{k}={v:.5g}" for k, v in point.plane._asdict().items()),
            point.plane_r_squared))
