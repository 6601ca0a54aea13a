"""One pipeline from data to N*: point fits -> posteriors -> propagation -> one typed result.

Every caller (the ``experiments.fit`` and ``experiments.closure`` CLIs, the notebooks, the tests)
runs the same steps, each a small function that can also be called alone:

1. :func:`fit_point` -- the loss law (any :class:`~sdsl_jax.loss_laws.LossLawFamily`, multi-start
   summed Huber on log L) and the acceptance model (weighted least squares; the paper's plane,
   held fixed, when there are no acceptance data);
2. :func:`sample_posterior` -- NUTS posteriors of both, with diagnostics;
3. :func:`paired_draws` -- the one rule pairing loss-law draws with acceptance draws;
4. :func:`predict_draft_size` -- N*(M) on a grid and for named targets under any cost model and
   draft recipe, the linear law ``N* ~ mu M + M0``, and with draws, bands;
5. :func:`rank_drafts` -- for a list of candidate drafts, each one's predicted alpha and T, the
   predicted best, and with draws P(best) and a band on T.

:func:`run` chains 1-4 into a :class:`PipelineResult`. Finished units of work can be kept in a
:class:`StageStore` so that an interrupted run resumes where it stopped.

Everything here needs float64 (the Huber fit and N*): enable x64 before calling.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from sdsl_jax import bayes
from sdsl_jax.acceptance import PLANE, SDSL2026, AcceptanceModel, ResidualAcceptance, predictive_acceptance
from sdsl_jax.costs import SDSL_FLOPS, best_lookahead
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.fitting import NEAR_OPTIMUM, fit_acceptance_plane, fit_loss_law, rival_optima
from sdsl_jax.loss_laws import CHINCHILLA, LossLawFamily
from sdsl_jax.objective import draft_acceptance, draft_throughput
from sdsl_jax.optimum import DraftSizeSolution, LinearLaw, fit_linear_law, solve_draft_size
from sdsl_jax.recipes import as_recipe
from sdsl_jax.store import StageStore

__all__ = [
    "PointFit",
    "Posterior",
    "DraftSizePrediction",
    "DraftRanking",
    "PipelineResult",
    "StageStore",
    "fit_point",
    "sample_posterior",
    "paired_draws",
    "PredictiveScales",
    "KnownEffects",
    "CandidateLabels",
    "predictive_scales",
    "predictive_planes",
    "acceptance_draws",
    "has_repeated_runs",
    "predict_draft_size",
    "rank_drafts",
    "throughput_draws",
    "best_draft_probabilities",
    "run",
    "FormWeights",
    "stacking_weights",
    "acceptance_stacking_weights",
    "mixture_bands",
]

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class PointFit(NamedTuple):
    """Point estimates of the chain's fitted links.

    Attributes:
      law: the loss law (the family's law type).
      theta: the law in fitting coordinates (``family.theta_names``).
      objective: the summed Huber loss at ``theta``.
      converged: whether the best start stopped by a tolerance.
      family: the loss-law family.
      plane: the acceptance model's coefficients (fitted, or the paper's plane held fixed).
      acceptance_model: the acceptance model.
      plane_fitted: False when ``plane`` is the fixed preset (no acceptance data).
      plane_r_squared: weighted R^2 of the fitted acceptance model (NaN when fixed).
      not_unique: the law's fitting coordinates that differ between starts ending within
        ``NEAR_OPTIMUM`` of the best objective (by more than 0.05): the point fit is one of several
        near-equivalent optima there, which a machine's rounding can swap (trust the posterior).
    """

    law: Any
    theta: np.ndarray
    objective: float
    converged: bool
    family: LossLawFamily
    plane: Any
    acceptance_model: AcceptanceModel
    plane_fitted: bool
    plane_r_squared: float
    not_unique: tuple[str, ...] = ()


class Posterior(NamedTuple):
    """Posterior draws of the chain's fitted links.

    Attributes:
      laws: loss-law draws (fields of shape ``(draws,)``).
      planes: acceptance-model draws, or the fixed plane when there are no acceptance data.
      law_run, plane_run: the NUTS runs (:class:`sdsl_jax.bayes.PosteriorRun`; ``plane_run`` None
        when the plane is fixed).
      diagnostics: ``{"loss_law": Diagnostics, "plane": Diagnostics}`` for the runs made.
      identification: :class:`sdsl_jax.bayes.Identification` of the loss law's parameters
        (which ones the data do not pin down).
    """

    laws: Any
    planes: Any
    law_run: bayes.PosteriorRun
    plane_run: bayes.PosteriorRun | None
    diagnostics: dict
    identification: Any = None


class DraftSizePrediction(NamedTuple):
    """N*(M) at the point fit, and with draws its bands.

    Attributes:
      m_grid, grid: target sizes of the grid and their :class:`DraftSizeSolution`.
      targets, named: named target sizes and their solution.
      linear_law: ``N* ~ mu M + M0`` over the grid (None with fewer than two solved targets).
      bands, target_bands: :class:`sdsl_jax.bayes.DraftSizeBands` over the grid and the named
        targets (None without draws).
    """

    m_grid: np.ndarray
    grid: DraftSizeSolution
    targets: np.ndarray
    named: DraftSizeSolution
    linear_law: LinearLaw | None
    bands: bayes.DraftSizeBands | None
    target_bands: bayes.DraftSizeBands | None


class DraftRanking(NamedTuple):
    """Candidate drafts for one target, ranked by the law.

    Attributes:
      alpha: predicted acceptance per candidate.
      throughput: predicted throughput at the best lookahead per candidate.
      best: index of the predicted best candidate (None when none is admissible).
      p_best: probability under the draws that each candidate is the best (None without draws).
      throughput_band: 5% and 95% quantiles of T per candidate, shape ``(candidates, 2)``.
    """

    alpha: np.ndarray
    throughput: np.ndarray
    best: int | None
    p_best: np.ndarray | None
    throughput_band: np.ndarray | None


class PipelineResult(NamedTuple):
    """What :func:`run` returns: the point fits, the posterior (or None) and the N* prediction."""

    point: PointFit
    posterior: Posterior | None
    prediction: DraftSizePrediction
    sensitivity: dict | None  # elasticities of N* to a fixed plane's coefficients
    draws: tuple[Any, Any] | None = None  # the paired (laws, planes) behind the bands
    scales: PredictiveScales | None = None  # their residual scales (None: mean-curve bands)


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
    """
    cached = stages.load("point_fit") if stages is not None else None
    if cached is None:
        fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, starts=starts, progress=progress)
        rivals = rival_optima(fit.result.all_params, fit.result.all_values, tuple(family.theta_names))
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
    model_effects: bool | None = None,
    plane_run: bayes.PosteriorRun | None = None,
    law_run: bayes.PosteriorRun | None = None,
    progress_bar: bool = False,
    stages: StageStore | None = None,
    log: Log = _quiet,
) -> Posterior:
    """NUTS posteriors of the loss law (and of the acceptance model when there are data).

    ``plane_seed`` defaults to ``seed + 1``. ``run_effects``: the hierarchical loss law with a
    random intercept and slope in log D per training run (:func:`sdsl_jax.bayes.run_effects_model_for`;
    runs from :meth:`PretrainingRuns.run_index`); None (default) uses it when some run has rows
    at two or more budgets D, where the effects are identified. ``model_effects``: the acceptance
    model with a random effect per draft and per target model
    (:func:`sdsl_jax.bayes.model_effects_plane_model_for`; models from
    :meth:`AcceptanceMeasurements.model_index`); None uses it when some model is in two or more
    pairs. ``plane_run``: an acceptance posterior of the same data and model to reuse instead of
    sampling one (it does not depend on the loss law: forms compared side by side share it);
    ``law_run`` likewise a loss-law posterior of the same data and family (acceptance models
    compared side by side share it). With ``stages``, each finished run
    is kept (and its netCDF written beside the stages) and reused on ``--resume``.
    """
    plane_seed = seed + 1 if plane_seed is None else plane_seed
    kw = dict(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, progress_bar=progress_bar)
    if run_effects is None:
        run_effects = has_repeated_runs(runs)
    run = runs.run_index()[0] if run_effects else None

    def law_sample():
        return bayes.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, init=point.law, family=point.family,
                                     seed=seed, run=run, progress=_nuts_progress(log, "loss law", num_warmup + num_samples), **kw)

    if law_run is not None:
        reused = False
    elif stages:
        law_run, reused = stages.posterior("loss_law_posterior", law_sample)
    else:
        law_run, reused = law_sample(), False
    if reused:
        log("posterior: loss-law draws reused from an earlier run (--resume)")
    diagnostics = {"loss_law": law_run.diagnostics}
    laws = bayes.laws_from_posterior(law_run.samples, point.family)
    identified = bayes.identification(law_run.samples, point.family, seed=seed)
    for flag in identified.flags:
        log(f"posterior: loss law {flag}")
    planes = point.plane
    if acceptance is None:
        plane_run = None
    elif plane_run is not None:
        diagnostics["plane"] = plane_run.diagnostics
        planes = bayes.planes_from_posterior(plane_run.samples, point.acceptance_model)
    else:
        if model_effects is None:
            model_effects, why = acceptance.model_effects_identified()
            log(f"posterior: per-model acceptance effects {'on' if model_effects else 'off'} ({why})")
        groups = {}
        if model_effects:
            draft, _, target, _ = acceptance.model_index()
            groups = dict(draft=draft, target=target)

        def plane_sample():
            return bayes.sample_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                                      weights=acceptance.regression_weights(), model=point.acceptance_model,
                                      seed=plane_seed, progress=_nuts_progress(log, "acceptance", num_warmup + num_samples),
                                      **groups, **kw)

        log(f"posterior: loss law done (max R-hat {law_run.diagnostics.max_rhat:.3f}); sampling the acceptance "
            "model")
        plane_run, reused = stages.posterior("plane_posterior", plane_sample) if stages else (plane_sample(), False)
        if reused:
            log("posterior: acceptance draws reused from an earlier run (--resume)")
        diagnostics["plane"] = plane_run.diagnostics
        planes = bayes.planes_from_posterior(plane_run.samples, point.acceptance_model)
    return Posterior(laws, planes, law_run, plane_run, diagnostics, identified)


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


class PredictiveScales(NamedTuple):
    """Residual scales per posterior draw, aligned with :func:`paired_draws`.

    Attributes:
      loss_sigma, loss_nu: scale and degrees of freedom of the loss law's Student-t residual on
        log loss (a new model's log loss scatters around the law's curve by this much).
      alpha_sigma: the acceptance model's residual standard deviation (a row of average weight, on
        its link's scale); zeros when the plane is fixed (no acceptance data, no residual known).
      run_sd, run_slope_sd: a new training run's random intercept and slope in log D (None
        for the model without run effects); ``centre_log_d``: the data's mean log D.
      alpha_draft_sd, alpha_target_sd: the acceptance model's per-draft and per-target model
        effects (None for the model without them): a new model's shift of alpha in every pair.
      known: the posterior effects of the runs and models in the data (:class:`KnownEffects`;
        None: every model is treated as new), for candidates that are in the data.
    """

    loss_sigma: np.ndarray
    loss_nu: np.ndarray
    alpha_sigma: np.ndarray
    run_sd: np.ndarray | None = None
    run_slope_sd: np.ndarray | None = None
    centre_log_d: float = 0.0
    alpha_draft_sd: np.ndarray | None = None
    alpha_target_sd: np.ndarray | None = None
    known: "KnownEffects | None" = None

    def log_loss_offsets(self, log_d: Any, *, size: tuple[int, ...] = (), seed: int = 0,
                         runs: tuple[str | None, ...] | None = None) -> np.ndarray:
        """Draws of a model's log-loss offset from the law, shape ``(draws, *size)``.

        A new model's (:func:`sdsl_jax.bayes.new_run_offsets`); with ``runs`` (one run label per
        entry of ``size``, flattened) an entry whose run is in the data (``known``) keeps its
        run's posterior intercept and slope and draws only its own Student-t residual.
        """
        samples = dict(sigma=self.loss_sigma, nu=self.loss_nu)
        if self.run_sd is not None:
            samples.update(run_sd=self.run_sd, run_slope_sd=self.run_slope_sd)
        offsets = bayes.new_run_offsets(samples, log_d, centre_log_d=self.centre_log_d, size=size, seed=seed)
        known = self.known
        if runs is None or known is None or known.run_intercept is None:
            return offsets
        flat = offsets.reshape(offsets.shape[0], -1)
        log_d = np.broadcast_to(np.asarray(log_d, np.float64), offsets.shape).reshape(flat.shape)
        residual = bayes.new_run_offsets(dict(sigma=self.loss_sigma, nu=self.loss_nu), 0.0,
                                         size=(flat.shape[1],), seed=seed + 7919)
        for j, label in enumerate(runs):
            r = known.run_labels.index(label) if label in known.run_labels else None
            if r is not None:
                flat[:, j] = (residual[:, j] + known.run_intercept[:, r]
                              + known.run_slope[:, r] * (log_d[:, j] - self.centre_log_d))
        return flat.reshape(offsets.shape)

    def residual_sigma(self) -> np.ndarray | None:
        """``alpha_sigma``, or None where no draw has a residual (a fixed plane): predictive acceptance
        then skips the truncated quantile, which is costly to compile into the N* solver."""
        return self.alpha_sigma if np.any(np.asarray(self.alpha_sigma) > 0) else None

    def alpha_residuals(self, rng: np.random.Generator, candidates: int, *,
                        drafts: tuple[str | None, ...] | None = None,
                        target: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draws of alpha's deviations for ``candidates`` drafts paired with ONE target: ``(shift, z)``,
        each ``(draws, candidates)``, on the acceptance model's link scale.

        ``shift``: each draft's model effect plus the target's, shared by all the candidates of a
        draw (zero without model effects); a draft (labels ``drafts``) or the ``target`` that is in
        the data (``known``) keeps its posterior effect, others are new. ``z``: each pair's own
        residual as a standard normal, of scale ``alpha_sigma``
        (:func:`sdsl_jax.acceptance.predictive_acceptance` turns both into a probability).
        """
        count = self.alpha_sigma.shape[0]
        z = rng.standard_normal((count, candidates))
        if self.alpha_draft_sd is None:
            return np.zeros_like(z), z
        draft = self.alpha_draft_sd[:, None] * rng.standard_normal((count, candidates))
        target_effect = self.alpha_target_sd[:, None] * rng.standard_normal((count, 1))
        known = self.known
        if known is not None and known.draft_effect is not None:
            for j, label in enumerate(drafts or ()):
                if label in known.draft_labels:
                    draft[:, j] = known.draft_effect[:, known.draft_labels.index(label)]
            if target in known.target_labels:
                target_effect = known.target_effect[:, known.target_labels.index(target)][:, None]
        return draft + target_effect, z


class CandidateLabels(NamedTuple):
    """Who the candidates and the target are in the data, so that :class:`KnownEffects` apply.

    Attributes:
      draft_runs: each candidate's loss-law run (:meth:`PretrainingRuns.run_labels`), or None.
      target_run: the target's run, or None.
      draft_models: each candidate's label as a draft in the acceptance data, or None.
      target_model: the target's label as a target in the acceptance data, or None.
    """

    draft_runs: tuple[str | None, ...] | None = None
    target_run: str | None = None
    draft_models: tuple[str | None, ...] | None = None
    target_model: str | None = None


class KnownEffects(NamedTuple):
    """Posterior effects of the runs and models in the data, per draw (aligned with
    :class:`PredictiveScales`): a candidate that is one of them is predicted conditionally on
    its own data instead of as a new model.

    Attributes:
      run_labels: the loss-law runs (:meth:`PretrainingRuns.run_labels` order of first appearance).
      run_intercept, run_slope: ``(draws, runs)``: each run's ``u_r`` and ``v_r`` (None without run effects).
      draft_labels, target_labels: the acceptance data's draft and target models.
      draft_effect, target_effect: ``(draws, models)``: each model's effect on alpha (None without
        model effects).
    """

    run_labels: tuple[str, ...] = ()
    run_intercept: np.ndarray | None = None
    run_slope: np.ndarray | None = None
    draft_labels: tuple[str, ...] = ()
    draft_effect: np.ndarray | None = None
    target_labels: tuple[str, ...] = ()
    target_effect: np.ndarray | None = None


def _draw_indices(total: int, count: int | None, rng_seed: int, size: int) -> np.ndarray:
    if count is None or count >= total:
        return np.arange(size)
    return np.random.default_rng(rng_seed).choice(total, size=count, replace=False)


def predictive_scales(posterior: Posterior, *, count: int | None = None, seed: int = 0,
                      runs: PretrainingRuns | None = None,
                      acceptance: AcceptanceMeasurements | None = None) -> PredictiveScales:
    """The residual scales of the draws :func:`paired_draws` returns for the same ``count`` and ``seed``.

    With ``runs`` and ``acceptance`` (the data the posterior was fitted to), also the posterior
    effects of their runs and models (:class:`KnownEffects`), so that candidates in the data
    are predicted conditionally on them (``rank_drafts(draft_runs=..., draft_models=...)``).
    """
    law_samples = posterior.law_run.samples
    n_laws = np.size(posterior.laws[0])
    n_planes = np.size(posterior.planes[0]) if posterior.plane_run is not None else None
    size = n_laws if n_planes is None else min(n_laws, n_planes)
    idx = _draw_indices(n_laws, count, seed, size)
    sigma, nu = (np.asarray(law_samples[k]).reshape(-1)[idx] for k in ("sigma", "nu"))
    run_sd = run_slope_sd = None
    if "run_sd" in law_samples:
        run_sd, run_slope_sd = (np.asarray(law_samples[k]).reshape(-1)[idx] for k in bayes.RUN_EFFECT_SITES)
    draft_sd = target_sd = None
    if n_planes is None:
        alpha_sigma = np.zeros_like(sigma)
    else:
        plane_samples = posterior.plane_run.samples
        plane_idx = _draw_indices(n_planes, count, seed + 1, size)
        alpha_sigma = np.asarray(plane_samples["sigma"]).reshape(-1)[plane_idx]
        if "draft_sd" in plane_samples:
            draft_sd, target_sd = (np.asarray(plane_samples[k]).reshape(-1)[plane_idx]
                                   for k in bayes.MODEL_EFFECT_SITES)
    known = None
    if runs is not None or acceptance is not None:
        kw = {}
        if runs is not None and run_sd is not None:
            flat = lambda k: np.asarray(law_samples[k]).reshape(n_laws, -1)[idx]  # noqa: E731
            kw.update(run_labels=tuple(dict.fromkeys(runs.run_labels())),
                      run_intercept=run_sd[:, None] * flat("run_z"), run_slope=run_slope_sd[:, None] * flat("run_slope_z"))
        if acceptance is not None and draft_sd is not None:
            flat = lambda k: np.asarray(plane_samples[k]).reshape(n_planes, -1)[plane_idx]  # noqa: E731
            kw.update(draft_labels=tuple(dict.fromkeys(acceptance.draft)), draft_effect=draft_sd[:, None] * flat("draft_z"),
                      target_labels=tuple(dict.fromkeys(acceptance.target)),
                      target_effect=target_sd[:, None] * flat("target_z"))
        known = KnownEffects(**kw)
    return PredictiveScales(sigma, nu, alpha_sigma, run_sd, run_slope_sd,
                            float(law_samples.get("centre_log_d", 0.0)), draft_sd, target_sd, known)


def predictive_planes(planes: Any, scales: PredictiveScales, *, d_draft: float, d_target: float,
                      seed: int = 0) -> ResidualAcceptance:
    """Acceptance draws that carry a new draft's, a new target's and a new pair's residuals.

    One offset of the draft's log loss per draw, shared by every draft size N of that draw (the
    draft series is trained by one recipe on one corpus, so its deviation from the law moves
    the whole curve T(N), which is what moves N*); one for the target; one on alpha (with
    per-model effects: the pair's residual plus a new draft's and a new target's effect). The draft's
    offset is drawn at the training budget ``d_draft`` (with a recipe: the budget near N*),
    since a run's slope effect grows with the distance of log D from the data's centre.
    """
    count = scales.loss_sigma.shape[0]
    dx = scales.log_loss_offsets(np.log(d_draft), seed=seed)
    dy = scales.log_loss_offsets(np.log(d_target), seed=seed + 1)
    shift, z = (v[:, 0] for v in scales.alpha_residuals(np.random.default_rng(seed + 2), 1))
    planes = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v, np.float64), (count,)), planes)
    sigma = scales.residual_sigma()
    return ResidualAcceptance(planes, dx, dy, shift, None if sigma is None else z, sigma)


def paired_draws(posterior: Posterior, *, count: int | None = None, seed: int = 0) -> tuple[Any, Any]:
    """Loss-law and acceptance draws paired one to one (the two posteriors are independent).

    ``count=None`` (or at least the number of draws) keeps every draw, paired in order and
    truncated to the shorter posterior; a smaller ``count`` takes a random subset of each
    posterior without replacement (``seed`` for the law's, ``seed + 1`` for the plane's).
    """
    laws, planes = posterior.laws, posterior.planes
    n_laws = np.size(laws[0])
    n_planes = np.size(planes[0]) if posterior.plane_run is not None else None

    def take(draws, total, rng_seed):
        idx = _draw_indices(total, count, rng_seed, total if n_planes is None else min(n_laws, n_planes))
        return type(draws)(*(np.asarray(v)[idx] for v in draws))

    laws = take(laws, n_laws, seed)
    if n_planes is not None:
        planes = take(planes, n_planes, seed + 1)
    return laws, planes


def _draft_budget_near(n_star, recipe, fallback_n: float) -> float:
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
            d_ref = _draft_budget_near(both.n_star, recipe, float(np.median(m_all)))
            planes = predictive_planes(planes, scales, d_draft=d_ref, d_target=d_target, seed=seed)
        n_star, gamma, thr = bayes.solve_draws(m_all, laws, planes, progress=progress, **kw)
        bands = bayes.summarize_draws(m_grid, n_star[:, :k], gamma[:, :k], thr[:, :k])
        target_bands = bayes.summarize_draws(targets, n_star[:, k:], gamma[:, k:], thr[:, k:])
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
    p_best = band = None
    if draws is not None:
        t_draws = throughput_draws(draws, n_drafts=n, d_drafts=d, m_target=m_target, d_target=d_target, cost=cost,
                                   scales=scales, labels=labels, seed=seed)
        p_best, band = best_draft_probabilities(t_draws)
    return DraftRanking(alpha, t, best, p_best, band)


def throughput_draws(draws: tuple[Any, Any], *, n_drafts: np.ndarray, d_drafts: np.ndarray, m_target: float,
                     d_target: float, cost: Any = SDSL_FLOPS, scales: PredictiveScales | None = None,
                     labels: CandidateLabels | None = None, seed: int = 0) -> np.ndarray:
    """T of each candidate draft under each posterior draw, shape ``(draws, candidates)``.

    With ``scales``, posterior-predictive (see :func:`rank_drafts`); NaN where a candidate is
    inadmissible in a draw.
    """
    n, d = np.asarray(n_drafts, np.float64), np.asarray(d_drafts, np.float64)
    laws, planes = (jax.tree.map(lambda v: np.asarray(v)[:, None], x) for x in draws)
    if scales is None:
        return np.asarray(draft_throughput(n, m_target, loss=laws, plane=planes, d_draft=d, d_target=d_target,
                                           cost=cost))
    return _predictive_throughput(laws, planes, scales, n, d, m_target, d_target, cost, seed,
                                  labels or CandidateLabels())


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
    laws, planes = (jax.tree.map(lambda v: np.asarray(v)[:, None], x) for x in draws)
    return _predictive_alpha(laws, planes, scales, n, d, m_target, d_target, seed, labels or CandidateLabels())


class FormWeights(NamedTuple):
    """Forms (loss laws, or acceptance models) compared by PSIS-LOO and their Bayesian stacking weights.

    Attributes:
      names: the forms (loss-law family or acceptance-model names).
      weights: stacking weights (sum to 1) [Yao, Vehtari, Simpson & Gelman 2018].
      elpd_loo, elpd_se: expected log predictive density by PSIS-LOO and its standard error.
      pareto_k_max: the largest Pareto k of each form's PSIS (above 0.7: LOO unreliable there).
      method: how the weights were computed.
    """

    names: tuple[str, ...]
    weights: np.ndarray
    elpd_loo: np.ndarray
    elpd_se: np.ndarray
    pareto_k_max: np.ndarray
    method: str


def stacking_weights(runs: PretrainingRuns, posteriors: dict[str, Posterior], *,
                     families: dict[str, LossLawFamily] | None = None) -> FormWeights:
    """Stacking weights over loss-law forms from their posteriors, by ArviZ's ``az.compare``.

    ArviZ does the work (PSIS-LOO per form, then the stacking optimisation over the pointwise
    predictive densities). Its LOO leaves out one ROW: with per-run effects the row's run keeps
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
        pointwise[name] = (bayes.pointwise_log_likelihood(samples, families[name], runs.n_params, runs.n_tokens,
                                                          runs.loss, run=run), samples["sigma"])
    return _stacked(pointwise, "rows")


def acceptance_stacking_weights(acceptance: AcceptanceMeasurements, plane_runs: dict[str, bayes.PosteriorRun], *,
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
        ll = bayes.acceptance_pointwise_log_likelihood(run.samples, models[name], acceptance.ppl_draft,
                                                       acceptance.ppl_target, acceptance.alpha,
                                                       weights=acceptance.regression_weights(), **groups)
        pointwise[name] = (ll, run.samples["sigma"])
    return _stacked(pointwise, "pairs")


def _stacked(pointwise: dict[str, tuple[np.ndarray, np.ndarray]], rows: str) -> FormWeights:
    """az.compare(method="stacking") over forms from ``{name: (log-likelihood (draws, rows), sigma draws)}``."""
    idata, k_max = {}, {}
    for name, (ll, sigma) in pointwise.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata[name] = bayes.az.from_dict(posterior={"sigma": np.asarray(sigma)[None]},
                                             log_likelihood={"obs": ll[None]})
            k_max[name] = float(np.max(bayes.az.loo(idata[name], pointwise=True).pareto_k))
    names = tuple(pointwise)
    if len(names) == 1:  # nothing to compare: az.compare needs two
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loo = bayes.az.loo(idata[names[0]])
        return FormWeights(names, np.ones(1), np.array([float(loo.elpd_loo)]), np.array([float(loo.se)]),
                           np.array([k_max[names[0]]]), "a single form (weight 1)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = bayes.az.compare(idata, ic="loo", method="stacking")
    return FormWeights(names, np.array([float(table.loc[n, "weight"]) for n in names]),
                       np.array([float(table.loc[n, "elpd_loo"]) for n in names]),
                       np.array([float(table.loc[n, "se"]) for n in names]),
                       np.array([k_max[n] for n in names]),
                       "Bayesian stacking of PSIS-LOO predictive densities (az.compare, method='stacking'); "
                       f"{rows} left out one at a time")


def mixture_bands(results: dict[str, PipelineResult], weights: FormWeights, *, m_grid: np.ndarray,
                  targets: np.ndarray, d_target: float, d_draft: float | None = None, recipe: Any = None,
                  cost: Any = SDSL_FLOPS, seed: int = 0) -> tuple[bayes.DraftSizeBands, bayes.DraftSizeBands]:
    """Bands on N* (grid, named targets) from the stacked mixture of the forms' predictive draws.

    Each form contributes ``round(weight x draws)`` of its own posterior-predictive draws (its
    laws, its paired acceptance draws and residual scales), the mixture is summarised as one.
    """
    recipe = as_recipe(d_draft, recipe)
    m_grid, targets = np.asarray(m_grid, np.float64), np.asarray(targets, np.float64)
    m_all, k = np.concatenate([m_grid, targets]), m_grid.size
    total = min(np.size(r.draws[0][0]) for r in results.values())
    solved = []
    for name, w in zip(weights.names, weights.weights):
        count = int(round(w * total))
        if count == 0:
            continue
        res = results[name]
        # A random subset (the draws are stored chain after chain).
        idx = np.random.default_rng(seed).choice(total, size=count, replace=False)
        laws, planes = (jax.tree.map(lambda v: np.asarray(v)[idx] if np.ndim(v) else v, x) for x in res.draws)
        if res.posterior is not None and res.scales is not None:
            scales = PredictiveScales(*(np.asarray(v)[idx] if isinstance(v, np.ndarray) else v
                                        for v in res.scales))
            d_ref = _draft_budget_near(res.prediction.named.n_star, recipe, float(np.median(m_all)))
            planes = predictive_planes(planes, scales, d_draft=d_ref, d_target=d_target, seed=seed)
        solved.append(bayes.solve_draws(m_all, laws, planes, d_target=d_target, recipe=recipe, cost=cost))
    n_star, gamma, thr = (np.concatenate([s[i] for s in solved]) for i in range(3))
    return (bayes.summarize_draws(m_grid, n_star[:, :k], gamma[:, :k], thr[:, :k]),
            bayes.summarize_draws(targets, n_star[:, k:], gamma[:, k:], thr[:, k:]))


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
    model_effects: bool | None = None,
    plane_run: bayes.PosteriorRun | None = None,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
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
      num_chains, num_warmup, num_samples, seed: NUTS settings.
      starts: loss-law multi-start grid (default the family's).
      stages: a :class:`StageStore` for resumable runs.
      progress_bar: NumPyro's progress bars.
      fit_progress: the multi-start fitter's callback.
      log: receives progress lines.
    """
    recipe = as_recipe(d_draft, recipe)
    point = fit_point(runs, acceptance, family=family, acceptance_model=acceptance_model, starts=starts,
                      stages=stages, progress=fit_progress, log=log)
    log("loss law ({}): {} (objective {:.6g}, {})".format(
        family.name, " ".join(f"{k}={v:.5g}" for k, v in point.law._asdict().items()), point.objective,
        "converged" if point.converged else "NOT converged"))
    if point.not_unique:
        log(f"loss law: the point fit is not unique: starts ending within {NEAR_OPTIMUM:.0%} of the best objective "
            f"disagree on {', '.join(point.not_unique)} (a machine's rounding can pick another of them; the "
            "posterior bands carry this, the point does not)")
    if point.plane_fitted:
        log("acceptance ({}): {} R^2={:.3f}".format(
            acceptance_model.name, " ".join(f"{k}={v:.5g}" for k, v in point.plane._asdict().items()),
            point.plane_r_squared))
    post = draws = scales = None
    if posterior:
        log(f"posterior: NUTS on the loss law{' and the acceptance model' if acceptance is not None else ''}, "
            f"{num_chains} chains x ({num_warmup} warm-up + {num_samples} draws)")
        post = sample_posterior(runs, acceptance, point, num_chains=num_chains, num_warmup=num_warmup,
                                num_samples=num_samples, seed=seed, run_effects=run_effects,
                                model_effects=model_effects, plane_run=plane_run,
                                progress_bar=progress_bar, stages=stages, log=log)
        draws = paired_draws(post)
        scales = predictive_scales(post) if predictive else None
    log(f"N*: solving {len(np.atleast_1d(m_grid)) + len(np.atleast_1d(targets))} targets at the point fit"
        + (" and for every posterior draw" if draws is not None else "") + " (compiling the solver first)")
    prediction = predict_draft_size(point, m_grid=m_grid, targets=targets, d_target=d_target, recipe=recipe,
                                    cost=cost, draws=draws, scales=scales, seed=seed,
                                    progress=lambda d, t: log(f"  {d}/{t} draws solved"))
    sensitivity = None
    if not point.plane_fitted:
        log("sensitivity: d log N* / d log |A, B, C| of the fixed plane, by implicit derivatives")
        sensitivity = bayes.plane_sensitivity(targets, law=point.law, plane=point.plane, d_target=d_target,
                                              recipe=recipe, cost=cost)
    return PipelineResult(point, post, prediction, sensitivity, draws, scales)
