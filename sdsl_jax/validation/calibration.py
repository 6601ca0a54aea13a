"""Simulation-based calibration (SBC) of a posterior: does the sampler return the model's own posterior?

Talts, Betancourt, Simpson, Vehtari & Gelman (2018), "Validating Bayesian inference algorithms with
simulation-based calibration", Algorithm 1: draw parameters from the prior, data from the likelihood
at them, fit, and record the rank of the true value among ``L`` posterior draws. If the fit is the
exact posterior, the true value is one more draw from it, so its rank is uniform on ``0..L``
whatever the model, the design or the prior. A posterior too narrow piles ranks at both ends (a U),
one too wide in the middle, one biased at one end. The draws are thinned evenly to ``L`` so that
the autocorrelation of a Markov chain does not make ranks lumpy (their Sec. 5).

* :func:`prior_datasets` -- parameters and data drawn from a NumPyro model's prior predictive.
* :func:`rank_of_truth` -- the rank of a true value among evenly thinned draws.
* :func:`rank_uniformity` -- the chi-square test of ranks binned into equal groups.
* :func:`simulation_based_calibration` -- the whole study for any model and fit, resumable one
  dataset at a time (:func:`sdsl_jax.store.append_stage_line`), as a typed :class:`SBCResult`;
  :func:`loss_law_sbc` runs it for a loss-law family on a ladder's design, :func:`acceptance_sbc`
  for an acceptance model on a design of pairs.

Coverage at fixed true parameters, the older and coarser check: for each synthetic dataset drawn
from the model's own likelihood (Chinchilla-like for the loss law, SDSL2026 for the plane), whether
each parameter's central 90% interval contains its true value (:func:`plane_coverage`,
:func:`loss_law_coverage`); with a correct model and sampler and weakly informative priors the
coverage is close to 0.9, with binomial standard error ``sqrt(0.09 / k)`` over ``k`` intervals.
And N* with run effects (:func:`n_star_coverage`): synthetic ladders like ours
(:func:`synthetic_ladder`: 7 sizes, each trained once and branched at 4 budgets, so the 4 rows of a
size share a run offset and a slope in log D), fitted with the hierarchical posterior. Two claims
are checked: the mean-curve band covers the N* of the TRUE law, and the posterior-predictive band
covers the N* that a NEW draft series and a NEW target, drawn from the same process, actually have.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np
import numpyro
from scipy import stats

from sdsl_jax.acceptance import SDSL2026
from sdsl_jax.loss_laws import LossLaw, prior_key, same_prior_key
from sdsl_jax.store import append_stage_line, read_stage_lines, shard_stage_path, stage_files

__all__ = ["RankTest", "SBCResult", "prior_datasets", "rank_of_truth", "rank_uniformity", "loss_law_sbc",
           "acceptance_sbc", "simulation_based_calibration", "TRUE_LAW", "TRUE_RUN_SD", "TRUE_RUN_SLOPE_SD",
           "plane_coverage", "loss_law_coverage", "synthetic_ladder", "n_star_coverage"]


class RankTest(NamedTuple):
    """The chi-square test of one site's ranks: ``counts`` per bin, the statistic, its p-value."""

    site: str
    counts: np.ndarray
    chi_square: float
    p_value: float


class SBCResult(NamedTuple):
    """A finished SBC study.

    Attributes:
      sites: the parameters ranked.
      ranks: ``(datasets, sites)`` integer ranks in ``[0, num_draws]``.
      num_draws: ``L``, the thinned posterior draws each rank is taken among.
      tests: one :class:`RankTest` per site (``bins`` equal groups of ranks).
      failed_checks: per dataset, the posterior's failed diagnostics (empty when it passed); the
        ranks of every dataset count, since dropping the hard ones would bias the test.
    """

    sites: tuple[str, ...]
    ranks: np.ndarray
    num_draws: int
    tests: tuple[RankTest, ...]
    failed_checks: tuple[tuple[str, ...], ...]

    def min_p_value(self) -> float:
        return min(t.p_value for t in self.tests)


def prior_datasets(model: Callable, model_args: tuple, *, obs_site: str, sites: tuple[str, ...], count: int,
                   seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``count`` draws of ``sites`` from the prior of ``model(*model_args)`` (observation not given)
    and the data ``obs_site`` simulated at each: ``({site: (count,)}, (count, *obs_shape))``.

    The draws are vectorised (``Predictive(parallel=True)``): a loop over them (NumPyro's default)
    compiles several times slower, the model traced inside a scan."""
    draws = numpyro.infer.Predictive(model, num_samples=count, parallel=True)(jax.random.PRNGKey(seed), *model_args)
    missing = [s for s in (*sites, obs_site) if s not in draws]
    if missing:
        raise ValueError(f"the model has no site(s) {missing} to calibrate; it has {sorted(draws)}")
    truths = {s: np.asarray(draws[s], np.float64).reshape(count) for s in sites}
    return truths, np.asarray(draws[obs_site], np.float64)


def rank_of_truth(draws: np.ndarray, truth: float, *, keep: int) -> int:
    """How many of ``keep`` evenly spaced ``draws`` lie below ``truth`` (an integer in ``[0, keep]``)."""
    draws = np.asarray(draws, np.float64).reshape(-1)
    if draws.size < keep:
        raise ValueError(f"{draws.size} posterior draws cannot be thinned to {keep}")
    thinned = draws[np.round(np.linspace(0, draws.size - 1, keep)).astype(int)]
    return int(np.sum(thinned < truth))


def rank_uniformity(ranks: np.ndarray, num_draws: int, *, bins: int) -> tuple[np.ndarray, float, float]:
    """``(counts, chi_square, p_value)`` of ranks on ``0..num_draws`` in ``bins`` equal groups.

    ``num_draws + 1`` must be a multiple of ``bins`` so that every group holds as many rank values
    (uneven groups would make a uniform rank look non-uniform).
    """
    ranks = np.asarray(ranks)
    if (num_draws + 1) % bins:
        raise ValueError(f"{num_draws + 1} rank values do not split into {bins} equal bins")
    if ranks.size == 0 or ranks.min() < 0 or ranks.max() > num_draws:
        raise ValueError(f"ranks must lie in [0, {num_draws}]")
    counts = np.bincount(ranks // ((num_draws + 1) // bins), minlength=bins)
    chi_square, p_value = stats.chisquare(counts)
    return counts, float(chi_square), float(p_value)


def simulation_based_calibration(
    model: Callable,
    model_args: tuple,
    fit: Callable[[np.ndarray, int], tuple[dict[str, np.ndarray], tuple[str, ...]]],
    *,
    obs_site: str,
    sites: tuple[str, ...],
    datasets: int,
    seed: int = 0,
    keep: int = 99,
    bins: int = 10,
    stage_path: str | None = None,
    study: dict | None = None,
    shard: tuple[int, int] = (0, 1),
    log: Callable[[str], None] | None = None,
) -> SBCResult | None:
    """SBC of ``fit`` for ``model``: ``datasets`` prior draws, each fitted and ranked.

    Args:
      model, model_args: the NumPyro model the fit claims to sample, and its arguments before the
        observation (the design: fixed across datasets).
      fit: ``fit(data, seed) -> (samples, problems)``: posterior draws per site (at least ``keep``
        of each) of one simulated dataset, and its failed diagnostics.
      obs_site, sites: the observed site, and the parameters to rank.
      datasets, seed: how many datasets, and the seed of the prior draws (dataset ``i`` is fitted
        with seed ``seed + i``); the same arguments give the same study.
      keep, bins: the thinned draws per rank (``L``) and the chi-square's bins.
      stage_path: a JSON-lines file of finished datasets: a rerun with the same arguments fits
        only the datasets not in it (another seed, count, ``keep`` or set of sites is another study).
      study: what else makes the study (JSON-ready; for example the priors' and the sampler's
        settings): a stage line fitted under another is not reused.
      shard: ``(I, K)``: fit only the datasets whose index is ``I`` modulo ``K`` (K processes share
        the study), appending to ``stage_path``'s sibling ``<stem>-IofK.jsonl`` and reading every
        sibling's lines; None is returned while another shard's datasets are unfinished.
      log: receives a line per dataset.
    """
    truths, data = prior_datasets(model, model_args, obs_site=obs_site, sites=sites, count=datasets, seed=seed)
    index, shards = shard
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} of {shards}: needs 0 <= I < K")
    if shards > 1 and stage_path is None:
        raise ValueError("a sharded study needs a stage_path: its shards meet there")

    def finished() -> dict:
        done = {}
        for path in stage_files(stage_path):
            for unit in read_stage_lines(path, warn=log):
                # The prior draws depend on their count as well as the seed: only the same study is reused.
                if ((unit.get("seed"), unit.get("datasets"), unit.get("keep"), unit.get("sites"))
                        == (seed, datasets, keep, list(sites)) and same_prior_key(unit.get("study"), study)):
                    done[unit["dataset"]] = unit
        return done

    done = finished()
    own_path = stage_path if shards == 1 else shard_stage_path(stage_path, index, shards)
    for i in range(datasets):
        if i in done or i % shards != index:
            continue
        samples, problems = fit(data[i], seed + i)
        ranks = [rank_of_truth(samples[s], truths[s][i], keep=keep) for s in sites]
        done[i] = dict(dataset=i, seed=seed, datasets=datasets, keep=keep, sites=list(sites), ranks=ranks,
                       problems=list(problems), **({} if study is None else dict(study=study)))
        if own_path is not None:
            append_stage_line(own_path, done[i])
        if log is not None:
            log(f"  dataset {i + 1}/{datasets}: ranks {ranks}"
                + (f"; failed: {'; '.join(problems)}" if problems else ""))
    if shards > 1:
        done = finished()
        if len(done) < datasets:
            return None
    ranks = np.array([done[i]["ranks"] for i in range(datasets)], np.int64)
    tests = tuple(RankTest(s, *rank_uniformity(ranks[:, j], keep, bins=bins)) for j, s in enumerate(sites))
    return SBCResult(tuple(sites), ranks, keep, tests, tuple(tuple(done[i]["problems"]) for i in range(datasets)))


def _sampler_study(*, num_chains: int, num_warmup: int, num_samples: int, retries: int, target_accept: float,
                   families=()) -> dict:
    """The sampler's settings as a part of an SBC study's key (ranks under other settings are
    another study's), with the priors (:func:`~sdsl_jax.loss_laws.prior_key` of ``families``) and
    NUTS's target acceptance (a family's or an acceptance model's may change)."""
    return dict(**prior_key(families), chains=num_chains, warmup=num_warmup, draws=num_samples, reruns=retries,
                target_accept=target_accept)


def loss_law_sbc(family, n_params: np.ndarray, n_tokens: np.ndarray, *, run: np.ndarray | None = None,
                 datasets: int, seed: int = 0, num_chains: int = 4, num_warmup: int = 500, num_samples: int = 500,
                 retries: int = 2, keep: int = 99, bins: int = 10, stage_path: str | None = None,
                 shard: tuple[int, int] = (0, 1), log: Callable[[str], None] | None = None) -> SBCResult | None:
    """SBC of a loss-law family's posterior (:func:`sdsl_jax.infer.sample_loss_law`) on a design.

    The design is the runs' ``(N, D)`` and, with ``run``, their training runs (the hierarchical
    model with per-run effects): the data are simulated where the real ones were measured, with
    the priors stated at that design's centre, so the study checks the posteriors we ship on the
    ladder we have. Every parameter of the family, the residual scale and degrees of freedom, and
    the run effects' scales are ranked. ``num_chains x num_samples`` must be at least ``keep``.

    The sampler's defaults are what ``experiments.fit`` and ``experiments.closure`` run (4 chains of
    500 warm-up and 500 draws, a failing posterior run again up to twice, longer), so the ranks
    check the procedure we ship, reruns included; ``shard`` as in
    :func:`simulation_based_calibration`.
    """
    from sdsl_jax.infer.models import loss_law_sites
    from sdsl_jax.infer.posterior import loss_law_numpyro_model, sample_loss_law

    model, args = loss_law_numpyro_model(family, n_params, n_tokens, run=run)

    def fit(log_loss, fit_seed):
        out = sample_loss_law(n_params, n_tokens, np.exp(log_loss), family=family, run=run, num_chains=num_chains,
                              num_warmup=num_warmup, num_samples=num_samples, seed=fit_seed, progress_bar=False,
                              retries=retries)
        return out.samples, out.diagnostics.problems

    study = _sampler_study(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, retries=retries,
                           target_accept=family.target_accept, families=(family,))
    return simulation_based_calibration(model, args, fit, obs_site="log_loss",
                                        sites=loss_law_sites(family, run_effects=run is not None),
                                        datasets=datasets, seed=seed, keep=keep, bins=bins,
                                        stage_path=stage_path, study=study, shard=shard, log=log)


def acceptance_sbc(model, ppl_draft: np.ndarray, ppl_target: np.ndarray, *, weights: np.ndarray | None = None,
                   draft: np.ndarray | None = None, target: np.ndarray | None = None,
                   effect_sides: tuple[str, ...] = ("draft", "target"), datasets: int, seed: int = 0,
                   num_chains: int = 4, num_warmup: int = 500, num_samples: int = 500, retries: int = 2,
                   keep: int = 99, bins: int = 10, stage_path: str | None = None, shard: tuple[int, int] = (0, 1),
                   log: Callable[[str], None] | None = None, coefficients: str = "prior-scaled") -> SBCResult | None:
    """SBC of an acceptance model's posterior (:func:`sdsl_jax.infer.sample_plane`) on a design of pairs.

    The design is the pairs' perplexities and weights and, with ``draft`` and ``target`` (an integer
    model per pair), the per-model effects of the kinds in ``effect_sides`` that the ladder's fits
    use; the alphas are simulated from the model there. The coefficients A, B, C, the residual scale
    and the effects' scales are ranked. The sampler's settings and ``shard`` as in :func:`loss_law_sbc`;
    ``coefficients``, the coordinates NUTS samples the coefficients in (:func:`sample_plane`), is part
    of the study's key where it is not the default.
    """
    from sdsl_jax.infer.models import PLANE_SITES, effect_scale_sites
    from sdsl_jax.infer.posterior import acceptance_numpyro_model, plane_target_accept, sample_plane

    numpyro_model, args = acceptance_numpyro_model(model, ppl_draft, ppl_target, weights=weights, draft=draft,
                                                   target=target, effect_sides=effect_sides)
    groups = {} if draft is None else dict(draft=draft, target=target, effect_sides=effect_sides)

    def fit(alpha, fit_seed):
        out = sample_plane(ppl_draft, ppl_target, alpha, weights=weights, model=model, num_chains=num_chains,
                           num_warmup=num_warmup, num_samples=num_samples, seed=fit_seed, progress_bar=False,
                           retries=retries, coefficients=coefficients, **groups)
        return out.samples, out.diagnostics.problems

    sites = PLANE_SITES + (effect_scale_sites(effect_sides) if draft is not None else ())
    study = _sampler_study(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, retries=retries,
                           target_accept=plane_target_accept(model, effects=draft is not None))
    if coefficients != "prior-scaled":  # the studies sampled before the option keep their key
        study["coefficients"] = coefficients
    return simulation_based_calibration(numpyro_model, args, fit, obs_site="alpha_obs", sites=sites,
                                        datasets=datasets, seed=seed, keep=keep, bins=bins, stage_path=stage_path,
                                        study=study, shard=shard, log=log)


TRUE_LAW = LossLaw(E=1.82, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
TRUE_LOSS_SIGMA, TRUE_NU = 0.02, 8.0
TRUE_PLANE_SIGMA = 0.03


def plane_coverage(num_datasets: int, *, num_points: int = 40, num_warmup: int = 300, num_samples: int = 300,
                   seed: int = 0, level: float = 0.9) -> dict[str, float]:
    """Coverage of the plane's A, B, C over synthetic datasets (x ~ U(5, 60), y ~ U(3, 20))."""
    from sdsl_jax.infer import sample_plane
    from sdsl_jax.predict import interval_coverage

    rng = np.random.default_rng(seed)
    hits = {k: [] for k in ("A", "B", "C")}
    for i in range(num_datasets):
        x, y = rng.uniform(5, 60, num_points), rng.uniform(3, 20, num_points)
        w = rng.uniform(50, 500, num_points)
        alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, TRUE_PLANE_SIGMA, num_points) / np.sqrt(
            w / w.mean())
        run = sample_plane(x, y, alpha, weights=w, num_chains=1, num_warmup=num_warmup, num_samples=num_samples,
                           seed=seed + i, progress_bar=False, summarize=False)
        for k in hits:
            hits[k].append(interval_coverage(run.samples[k], getattr(SDSL2026, k), level=level))
    return {k: float(np.mean(v)) for k, v in hits.items()}


def loss_law_coverage(num_datasets: int, *, num_runs: int = 60, num_warmup: int = 300, num_samples: int = 300,
                      seed: int = 0, level: float = 0.9) -> dict[str, float]:
    """Coverage of E, A, B, alpha, beta over synthetic Chinchilla-like runs (Student-t noise)."""
    from sdsl_jax.infer import laws_from_posterior, sample_loss_law
    from sdsl_jax.infer.point import loss_law_log_prediction, theta_from_law
    from sdsl_jax.predict import interval_coverage

    rng = np.random.default_rng(seed)
    theta = theta_from_law(TRUE_LAW)
    hits = {k: [] for k in LossLaw._fields}
    for i in range(num_datasets):
        n = 10 ** rng.uniform(7.5, 10.5, num_runs)
        d = 10 ** rng.uniform(9, 12, num_runs)
        mean = np.asarray(loss_law_log_prediction(theta, np.log(n), np.log(d)))
        loss = np.exp(mean + TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU, num_runs))
        run = sample_loss_law(n, d, loss, num_chains=1, num_warmup=num_warmup,
                              num_samples=num_samples, seed=seed + i, progress_bar=False, summarize=False)
        draws = laws_from_posterior(run.samples)._asdict()
        for k in hits:
            hits[k].append(interval_coverage(draws[k], getattr(TRUE_LAW, k), level=level))
    return {k: float(np.mean(v)) for k, v in hits.items()}


TRUE_RUN_SD, TRUE_RUN_SLOPE_SD = 0.02, 0.03


def synthetic_ladder(rng: np.random.Generator, *, sizes=(2e7, 5e7, 1.2e8, 3e8, 7e8, 1.6e9, 4e9),
                     budgets_per_param=(5.0, 10.0, 20.0, 40.0), run_effects: bool = True):
    """One synthetic ladder: each size one run, branched at ``budgets_per_param`` tokens per parameter.

    Log losses are the true law's plus the run's intercept and slope in log D (when ``run_effects``)
    plus Student-t noise. Returns ``(n, d, loss, run_index, centre_log_d)``.
    """
    from sdsl_jax.infer.point import loss_law_log_prediction, theta_from_law

    n = np.repeat(np.asarray(sizes, np.float64), len(budgets_per_param))
    d = n * np.tile(np.asarray(budgets_per_param, np.float64), len(sizes))
    run = np.repeat(np.arange(len(sizes)), len(budgets_per_param)).astype(np.int32)
    centre = float(np.mean(np.log(d)))
    mean = np.asarray(loss_law_log_prediction(theta_from_law(TRUE_LAW), np.log(n), np.log(d)))
    noise = TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU, n.size)
    if run_effects:
        u, v = rng.normal(0, TRUE_RUN_SD, len(sizes)), rng.normal(0, TRUE_RUN_SLOPE_SD, len(sizes))
        noise = noise + u[run] + v[run] * (np.log(d) - centre)
    return n, d, np.exp(mean + noise), run, centre


def _release_compiled_code() -> None:
    """Drop every compiled program so that its machine code is freed.

    Before ``sdsl_jax.infer`` reused NumPyro's compiled sampling loop across datasets, every run
    compiled it again (a few MB of machine code per dataset) and after ~90 datasets LLVM ran out
    of code memory ("Unable to allocate section memory"). The loop is now compiled once; the
    caches are still cleared every 20 datasets (one recompilation) so that a long study's memory
    stays bounded whatever else compiles per dataset (the N* solver's draws).
    """
    import gc

    from sdsl_jax import infer

    infer.clear_sampler_caches()
    gc.collect()


def n_star_coverage(num_datasets: int, *, m_target: float = 3e10, d_target: float = 6e11, d_draft: float = 2e10,
                    num_warmup: int = 300, num_samples: int = 300, seed: int = 0, level: float = 0.9,
                    log=None, return_intervals: bool = False):
    """Coverage of 90% N* bands on synthetic ladders with run effects (fixed, known plane).

    For each dataset: the hierarchical posterior of the law; the mean-curve band of N* (law
    draws only) against the true law's N*; the predictive band (:func:`sdsl_jax.predict.draws.predictive_planes`)
    against the N* of one new draft series and new target drawn from the true process (a new
    run's intercept and slope at their budgets, and the Student-t residual).

    Returns:
      ``{claim: coverage, claim: median log width}``; with ``return_intervals`` also
      ``{claim: [(lo, hi, truth) per dataset]}`` (:func:`sdsl_jax.figures.n_star_coverage_figure`'s input).
    """
    from sdsl_jax import ResidualAcceptance, solve_draft_size
    from sdsl_jax.infer import laws_from_posterior, sample_loss_law
    from sdsl_jax.predict import PredictiveScales, interval_coverage, predictive_planes, solve_draws

    rng = np.random.default_rng(seed)
    truth_mean = float(solve_draft_size(m_target, d_draft=d_draft, d_target=d_target, loss=TRUE_LAW,
                                        plane=SDSL2026).n_star)
    hits = {"mean curve vs true law": [], "predictive vs new models": []}
    widths = {k: [] for k in hits}
    intervals = {k: [] for k in hits}  # (lo, hi, truth) per dataset, for the figure
    for i in range(num_datasets):
        if i and i % 20 == 0:
            _release_compiled_code()
        n, d, loss, run, centre = synthetic_ladder(rng)
        fit = sample_loss_law(n, d, loss, run=run, num_chains=1, num_warmup=num_warmup,
                              num_samples=num_samples, seed=seed + i, progress_bar=False, summarize=False)
        laws = laws_from_posterior(fit.samples)
        s = fit.samples
        scales = PredictiveScales(s["sigma"], s["nu"], np.zeros_like(s["sigma"]), s["run_sd"], s["run_slope_sd"],
                                  float(s["centre_log_d"]))
        planes = jax.tree.map(lambda v: np.full(np.size(laws[0]), v), SDSL2026)
        kw = dict(d_draft=d_draft, d_target=d_target)
        mean_draws = solve_draws(np.array([m_target]), laws, planes, **kw)[0][:, 0]
        pred_draws = solve_draws(np.array([m_target]), laws,
                                 predictive_planes(planes, scales, seed=seed + i, **kw), **kw)[0][:, 0]
        # One new draft series and one new target from the true process.
        new = [TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU) + rng.normal(0, TRUE_RUN_SD)
               + rng.normal(0, TRUE_RUN_SLOPE_SD) * (np.log(b) - centre) for b in (d_draft, d_target)]
        truth_new = float(solve_draft_size(m_target, loss=TRUE_LAW, plane=ResidualAcceptance(SDSL2026, *new, 0.0),
                                           **kw).n_star)
        for key, draws, truth in (("mean curve vs true law", mean_draws, truth_mean),
                                  ("predictive vs new models", pred_draws, truth_new)):
            draws = draws[np.isfinite(draws)]
            hits[key].append(interval_coverage(draws, truth, level=level))
            lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
            widths[key].append(np.log(hi / lo))
            intervals[key].append((float(lo), float(hi), truth))
        if log is not None:
            log(f"  dataset {i + 1}/{num_datasets}: " + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in hits.items()))
    out = {k: float(np.mean(v)) for k, v in hits.items()}
    out.update({f"{k}: median log width": float(np.median(v)) for k, v in widths.items()})
    return (out, intervals) if return_intervals else out
