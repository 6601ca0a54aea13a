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

import hashlib
import json
import os
import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from sdsl_jax import bayes
from sdsl_jax.acceptance import PLANE, SDSL2026, AcceptanceModel
from sdsl_jax.costs import SDSL_FLOPS, best_lookahead
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.fitting import fit_acceptance_plane, fit_loss_law
from sdsl_jax.loss_laws import CHINCHILLA, LossLawFamily
from sdsl_jax.objective import draft_acceptance, draft_throughput
from sdsl_jax.optimum import DraftSizeSolution, LinearLaw, fit_linear_law, solve_draft_size
from sdsl_jax.recipes import as_recipe

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
    "predictive_scales",
    "predict_draft_size",
    "rank_drafts",
    "run",
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


class StageStore:
    """Finished units of work in ``<folder>/stages/``, each keyed by a fingerprint of its inputs.

    Written atomically when a unit ends; with ``resume=True`` a unit whose fingerprint matches is
    loaded instead of recomputed, so an interruption loses at most the unit in flight.
    """

    def __init__(self, folder: str, *, resume: bool, inputs: dict):
        self.folder, self.dir, self.resume = folder, os.path.join(folder, "stages"), resume
        self.inputs = json.dumps(inputs, sort_keys=True)
        os.makedirs(self.dir, exist_ok=True)

    def _key(self, name: str) -> str:
        return hashlib.sha256(f"{name}|{self.inputs}".encode()).hexdigest()

    def load(self, name: str) -> dict | None:
        path = os.path.join(self.dir, name + ".npz")
        if not (self.resume and os.path.exists(path)):
            return None
        with np.load(path, allow_pickle=False) as data:
            if str(data["fingerprint"]) != self._key(name):
                return None
            return {k: data[k] for k in data.files if k != "fingerprint"}

    def save(self, name: str, **arrays) -> None:
        path = os.path.join(self.dir, name + ".npz")
        with open(path + ".tmp", "wb") as f:
            np.savez(f, fingerprint=self._key(name), **arrays)
        os.replace(path + ".tmp", path)

    def posterior(self, name: str, sample: Callable[[], bayes.PosteriorRun]) -> tuple[bayes.PosteriorRun, bool]:
        """``sample()`` unless a finished run is stored; the run's netCDF is ``<folder>/<name>.nc``.

        Returns:
          ``(run, reused)``.
        """
        nc_path = os.path.join(self.folder, name + ".nc")
        cached = self.load(name)
        if cached is not None and os.path.exists(nc_path):
            samples = {k[2:]: v for k, v in cached.items() if k.startswith("s_")}
            diagnostics = bayes.Diagnostics(**json.loads(str(cached["diagnostics"])))
            return bayes.PosteriorRun(samples, bayes.az.from_netcdf(nc_path), diagnostics), True
        run_ = sample()
        bayes.save_inference_data(run_.inference_data, nc_path)
        self.save(name, diagnostics=json.dumps(run_.diagnostics._asdict()),
                  **{f"s_{k}": v for k, v in run_.samples.items()})
        return run_, False


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
        cached = dict(theta=np.asarray(fit.theta), value=np.asarray(fit.result.value),
                      converged=np.asarray(fit.result.converged))
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
    return PointFit(law, theta, float(cached["value"]), bool(cached["converged"]), family, plane, acceptance_model,
                    acceptance is not None, r2)


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
    progress_bar: bool = False,
    stages: StageStore | None = None,
    log: Log = _quiet,
) -> Posterior:
    """NUTS posteriors of the loss law (and of the acceptance model when there are data).

    ``plane_seed`` defaults to ``seed + 1``. With ``stages``, each finished run is kept (and its
    netCDF written beside the stages) and reused on ``--resume``.
    """
    plane_seed = seed + 1 if plane_seed is None else plane_seed
    kw = dict(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, progress_bar=progress_bar)

    def law_sample():
        return bayes.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, init=point.law, family=point.family,
                                     seed=seed, **kw)

    law_run, reused = stages.posterior("loss_law_posterior", law_sample) if stages else (law_sample(), False)
    if reused:
        log("posterior: loss-law draws reused from an earlier run (--resume)")
    diagnostics = {"loss_law": law_run.diagnostics}
    laws = bayes.laws_from_posterior(law_run.samples, point.family)
    identified = bayes.identification(law_run.samples, point.family, seed=seed)
    for flag in identified.flags:
        log(f"posterior: loss law {flag}")
    plane_run, planes = None, point.plane
    if acceptance is not None:
        def plane_sample():
            return bayes.sample_plane(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha,
                                      weights=acceptance.regression_weights(), model=point.acceptance_model,
                                      seed=plane_seed, **kw)

        log(f"posterior: loss law done (max R-hat {law_run.diagnostics.max_rhat:.3f}); sampling the acceptance "
            "model")
        plane_run, reused = stages.posterior("plane_posterior", plane_sample) if stages else (plane_sample(), False)
        if reused:
            log("posterior: acceptance draws reused from an earlier run (--resume)")
        diagnostics["plane"] = plane_run.diagnostics
        planes = bayes.planes_from_posterior(plane_run.samples, point.acceptance_model)
    return Posterior(laws, planes, law_run, plane_run, diagnostics, identified)


class PredictiveScales(NamedTuple):
    """Residual scales per posterior draw, aligned with :func:`paired_draws`.

    Attributes:
      loss_sigma, loss_nu: scale and degrees of freedom of the loss law's Student-t residual on
        log loss (a new model's log loss scatters around the law's curve by this much).
      alpha_sigma: the acceptance model's residual standard deviation (a row of average weight);
        zeros when the plane is fixed (no acceptance data, no residual known).
    """

    loss_sigma: np.ndarray
    loss_nu: np.ndarray
    alpha_sigma: np.ndarray


def _draw_indices(total: int, count: int | None, rng_seed: int, size: int) -> np.ndarray:
    if count is None or count >= total:
        return np.arange(size)
    return np.random.default_rng(rng_seed).choice(total, size=count, replace=False)


def predictive_scales(posterior: Posterior, *, count: int | None = None, seed: int = 0) -> PredictiveScales:
    """The residual scales of the draws :func:`paired_draws` returns for the same ``count`` and ``seed``."""
    law_samples = posterior.law_run.samples
    n_laws = np.size(posterior.laws[0])
    n_planes = np.size(posterior.planes[0]) if posterior.plane_run is not None else None
    size = n_laws if n_planes is None else min(n_laws, n_planes)
    idx = _draw_indices(n_laws, count, seed, size)
    sigma, nu = (np.asarray(law_samples[k]).reshape(-1)[idx] for k in ("sigma", "nu"))
    if n_planes is None:
        alpha_sigma = np.zeros_like(sigma)
    else:
        alpha_sigma = np.asarray(posterior.plane_run.samples["sigma"]).reshape(-1)[
            _draw_indices(n_planes, count, seed + 1, size)]
    return PredictiveScales(sigma, nu, alpha_sigma)


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
    progress: Callable[[int, int], None] | None = None,
) -> DraftSizePrediction:
    """N*(M) at the point fit on ``m_grid`` and for ``targets``; with ``draws`` (laws, planes), bands."""
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
    seed: int = 0,
) -> DraftRanking:
    """Each candidate draft's predicted alpha and T for one target, the best, and P(best).

    A candidate is a real model: its own size and training tokens. With ``draws`` alone, P(best)
    and the T band carry the uncertainty of the law's mean curve and the plane's coefficients.
    With ``scales`` (:func:`predictive_scales`) they are posterior-predictive: each draw also
    draws every candidate's log loss residual (Student-t), the target's (one, shared by the
    candidates) and each pair's acceptance residual (Gaussian), so a new model's scatter around
    the law counts as it does in the data. A candidate inadmissible in a draw (alpha outside
    (0, 1)) cannot win that draw; a draw where none is admissible is left out.
    """
    n, d = np.asarray(n_drafts, np.float64), np.asarray(d_drafts, np.float64)
    kw = dict(d_draft=d, d_target=d_target, cost=cost)
    alpha = np.asarray(draft_acceptance(n, m_target, loss=point.law, plane=point.plane, d_draft=d, d_target=d_target))
    t = np.asarray(draft_throughput(n, m_target, loss=point.law, plane=point.plane, **kw))
    best = int(np.nanargmax(t)) if np.isfinite(t).any() else None
    p_best = band = None
    if draws is not None:
        laws, planes = (jax.tree.map(lambda v: np.asarray(v)[:, None], x) for x in draws)
        if scales is None:
            t_draws = np.asarray(draft_throughput(n, m_target, loss=laws, plane=planes, **kw))
        else:
            t_draws = _predictive_throughput(laws, planes, scales, n, d, m_target, d_target, cost, seed)
        ok = np.isfinite(t_draws).any(axis=1)
        winner = np.argmax(np.where(np.isfinite(t_draws), t_draws, -np.inf), axis=1)
        p_best = np.array([np.mean(winner[ok] == i) if ok.any() else np.nan for i in range(len(n))])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            band = np.nanpercentile(t_draws, [5, 95], axis=0).T
    return DraftRanking(alpha, t, best, p_best, band)


def _predictive_throughput(laws, planes, scales: PredictiveScales, n, d, m_target, d_target, cost, seed: int):
    """T per (draw, candidate) with new-model residuals drawn on log loss and on alpha."""
    rng = np.random.default_rng(seed)
    count = scales.loss_sigma.shape[0]
    sigma, nu = scales.loss_sigma[:, None], scales.loss_nu[:, None]
    log_x = np.log(np.asarray(laws.loss(n[None, :], d[None, :]))) + sigma * rng.standard_t(nu, (count, n.size))
    log_y = np.log(np.asarray(laws.loss(m_target, d_target))) + sigma * rng.standard_t(nu, (count, 1))
    alpha = np.asarray(planes.rate(np.exp(np.exp(log_x)), np.exp(np.exp(log_y))))
    alpha = alpha + scales.alpha_sigma[:, None] * rng.standard_normal((count, n.size))
    return np.asarray(best_lookahead(cost, alpha, n[None, :], m_target).throughput)


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
    if point.plane_fitted:
        log("acceptance ({}): {} R^2={:.3f}".format(
            acceptance_model.name, " ".join(f"{k}={v:.5g}" for k, v in point.plane._asdict().items()),
            point.plane_r_squared))
    post = draws = None
    if posterior:
        log(f"posterior: NUTS on the loss law{' and the acceptance model' if acceptance is not None else ''}, "
            f"{num_chains} chains x ({num_warmup} warm-up + {num_samples} draws)")
        post = sample_posterior(runs, acceptance, point, num_chains=num_chains, num_warmup=num_warmup,
                                num_samples=num_samples, seed=seed, progress_bar=progress_bar, stages=stages,
                                log=log)
        draws = paired_draws(post)
    log(f"N*: solving {len(np.atleast_1d(m_grid)) + len(np.atleast_1d(targets))} targets at the point fit"
        + (" and for every posterior draw" if draws is not None else "") + " (compiling the solver first)")
    prediction = predict_draft_size(point, m_grid=m_grid, targets=targets, d_target=d_target, recipe=recipe,
                                    cost=cost, draws=draws,
                                    progress=lambda d, t: log(f"  {d}/{t} draws solved"))
    sensitivity = None
    if not point.plane_fitted:
        log("sensitivity: d log N* / d log |A, B, C| of the fixed plane, by implicit derivatives")
        sensitivity = bayes.plane_sensitivity(targets, law=point.law, plane=point.plane, d_target=d_target,
                                              recipe=recipe, cost=cost)
    return PipelineResult(point, post, prediction, sensitivity, draws)
