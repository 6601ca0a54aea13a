"""Forms fitted side by side and stacked for the closure: every (loss law, acceptance model) form fitted to
one data set and weighted (:func:`fit_forms`), the stacked mixture's T draws, the in-sample fit, and
the prospective refits that leave a draft size out.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from sdsl_jax import ACCEPTANCE_MODELS, FAMILIES, draft_throughput
from sdsl_jax.data import DataError
from sdsl_jax.store import StageStore, content_digest
from sdsl_jax.forecast import bayes_decision
from sdsl_jax.validation.closure import candidate_labels, decision_fields

__all__ = [
    "Stages",
    "FormFit",
    "fit_forms",
    "mixture_throughput",
    "stack_records",
    "fit_data_set",
    "leave_size_out_fits",
    "add_prospective",
    "ClosureSettings",
    "forward_fits",
    "add_forward",
    "InSampleFit",
    "fit_in_sample",
    "prospective",
    "log_point",
]


class Stages:
    """Where the closure keeps each finished fit (``<out>/stages/``), for ``--resume``.

    One :class:`sdsl_jax.store.StageStore` per data set (all runs and pairs, or one size left
    out) and form, keyed by the data's content, the form and the sampler's settings: an
    interrupted closure loses at most the fit in flight.
    """

    def __init__(self, folder: str, *, resume: bool, settings: dict, log=lambda _: None):
        self.folder, self.resume, self.settings, self.log = folder, resume, settings, log

    def store(self, runs, pairs, family, model):

        # Every column counts (run labels, model names, weights): a changed label is another model.
        content = content_digest(runs, pairs)
        return StageStore(os.path.join(self.folder, content[:16], f"{family.name}+{model.name}"),
                                   resume=self.resume, log=self.log,
                                   inputs=dict(self.settings, data=content, law=family.name, model=model.name))


class FormFit(NamedTuple):
    """One form (loss law, acceptance model) fitted to one data set, with its stacking weight.

    ``weight`` is the product of the law's and the acceptance model's stacking weights: the two
    are fitted to different data (pre-training rows, acceptance pairs), so the stacking objective
    over (law, model) combinations depends only on those two marginals, and the product is one of
    its optima. ``draws``/``scales`` as :func:`sdsl_jax.predict.draws.paired_draws` and
    :func:`sdsl_jax.predict.draws.predictive_scales` (``scales`` None: mean curve only); ``runs`` and
    ``pairs`` the data of the fit (whose runs and models ``scales.known`` conditions on).
    """

    name: str
    weight: float
    point: Any
    draws: tuple
    scales: Any
    runs: Any
    pairs: Any


def fit_forms(runs, pairs, *, families, models, starts_every: int, chains: int, warmup: int, draws: int,
              propagate: int, seed: int, mean_only: bool = False, reruns: int = 0, stages: Stages | None = None,
              log=print) -> tuple[list[FormFit], dict]:
    """Every (loss law, acceptance model) form fitted to ``runs``/``pairs`` and weighted by stacking.

    Each law's posterior is sampled once and shared by the acceptance models, each acceptance
    model's once and shared by the laws. Weights: Bayesian stacking of PSIS-LOO predictive
    densities (:func:`sdsl_jax.compare.stacking_weights` over the laws on the pre-training rows,
    :func:`sdsl_jax.compare.acceptance_stacking_weights` over the acceptance models on the
    pairs), computed from these data only, so that a fit without a draft size also chooses its
    forms without it. A law the data cannot identify is skipped. With ``stages`` each point fit and
    posterior is kept when it ends and reused on ``--resume``. Returns the forms, highest
    weight first, and a summary (weights and PSIS-LOO per law and per acceptance model, the forms'
    weights, laws skipped, the forms given no weight because their posterior failed its checks,
    each posterior's diagnostics).
    """
    from sdsl_jax import compare, pipeline, predict
    from sdsl_jax.infer.point import IdentifiabilityError, check_loss_law_data, fit_acceptance_plane

    skipped, points, law_runs, plane_runs, posts = {}, {}, {}, {}, {}
    for family in families:
        try:
            check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=family)
        except IdentifiabilityError as err:
            skipped[family.name] = err.problem
            continue
        starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[::starts_every]
        stores = {m.name: None if stages is None else stages.store(runs, pairs, family, m) for m in models}
        base = pipeline.fit_point(runs, pairs, family=family, acceptance_model=models[0], starts=starts,
                                  stages=stores[models[0].name])
        for model in models:
            point = base
            if model is not models[0]:
                fit = fit_acceptance_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha,
                                           weights=pairs.regression_weights(), model=model)
                point = base._replace(plane=type(fit.plane)(*(float(v) for v in fit.plane)), acceptance_model=model,
                                      plane_r_squared=float(fit.r_squared))
            post = pipeline.sample_posterior(runs, pairs, point, num_chains=chains, num_warmup=warmup, retries=reruns,
                                             num_samples=draws, seed=seed, plane_seed=seed,
                                             law_run=law_runs.get(family.name), plane_run=plane_runs.get(model.name),
                                             stages=stores[model.name])
            law_runs.setdefault(family.name, post.law_run)
            plane_runs.setdefault(model.name, post.plane_run)
            points[family.name, model.name], posts[family.name, model.name] = point, post
        log(f"  forms: {family.name} fitted with " + ", ".join(m.name for m in models))
    if not points:
        raise IdentifiabilityError(None, "no loss-law form is identified by these data (" + "; ".join(
            f"{k}: {v}" for k, v in skipped.items()) + ")")
    first_model = models[0].name
    law_w = compare.stacking_weights(runs, {f: posts[f, first_model] for f in law_runs},
                                      families={f: points[f, first_model].family for f in law_runs})
    acc_w = compare.acceptance_stacking_weights(pairs, plane_runs, models={m.name: m for m in models})
    lw, aw = dict(zip(law_w.names, law_w.weights)), dict(zip(acc_w.names, acc_w.weights))
    forms = []
    for (f, m), post in posts.items():
        weight = float(lw[f] * aw[m])
        if int(round(weight * propagate)) == 0:
            continue  # contributes no draw to the mixture
        forms.append(FormFit(f"{f} + {m}", weight, points[f, m], predict.paired_draws(post, count=propagate,
                                                                                        seed=seed),
                             None if mean_only else predict.predictive_scales(post, count=propagate, seed=seed,
                                                                              runs=runs, acceptance=pairs),
                             runs, pairs))
    forms.sort(key=lambda form: -form.weight)
    method = next((w.method.split(";")[0] for w in (law_w, acc_w) if len(w.names) > 1), "a single form of each kind")
    summary = dict(method=method, skipped=skipped,
                   laws={n: dict(weight=float(w), elpd_loo=float(e), elpd_se=float(se), pareto_k_max=float(k))
                         for n, w, e, se, k in zip(*law_w[:5])},
                   acceptance_models={n: dict(weight=float(w), elpd_loo=float(e), elpd_se=float(se),
                                              pareto_k_max=float(k)) for n, w, e, se, k in zip(*acc_w[:5])},
                   forms={form.name: form.weight for form in forms},
                   failed_checks=[*law_w.failed, *acc_w.failed],
                   diagnostics={name: run.diagnostics._asdict() for name, run in {**law_runs, **plane_runs}.items()})
    return forms, summary


def mixture_throughput(forms: list[FormFit], *, drafts, n, d, target: str, m: float, d_target: float,
                       predictive: bool = True, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """T draws ``(draws, candidates)`` of the stacked mixture, and its point T per candidate.

    Each form contributes its share of its own draws (:func:`sdsl_jax.compare.mixture_draw_indices`,
    as for N* bands), each conditioned on the runs and models of its
    own data; the point T is the weight-averaged point T of the forms (over the forms where the
    candidate is admissible; NaN where it is in none).
    """
    from sdsl_jax import predict
    from sdsl_jax.compare import mixture_draw_indices

    total = min(np.size(form.draws[0][0]) for form in forms)
    shares = dict(mixture_draw_indices([f.name for f in forms], [f.weight for f in forms], total, seed=seed))
    columns, weighted, weight = [], np.zeros(len(n)), np.zeros(len(n))
    for form in forms:
        labels = candidate_labels(form.runs, form.pairs, drafts, n, d, target, m, d_target)
        if form.name in shares:
            t = predict.throughput_draws(form.draws, n_drafts=n, d_drafts=d, m_target=m, d_target=d_target,
                                         scales=form.scales if predictive else None, labels=labels, seed=seed)
            columns.append(t[shares[form.name]])
        t_point = np.asarray(draft_throughput(n, m, d_draft=d, d_target=d_target, loss=form.point.law,
                                              plane=form.point.plane))
        finite = np.isfinite(t_point)  # a form where a candidate is inadmissible says nothing of its T
        weighted += np.where(finite, form.weight * t_point, 0.0)
        weight += np.where(finite, form.weight, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.concatenate(columns), np.where(weight > 0, weighted / weight, np.nan)


def stack_records(records: list[dict], forms: list[FormFit], *, seed: int = 0) -> None:
    """Replace the P(best), T bands and predicted best of ``records`` by the stacked mixture's.

    N*, gamma*, alpha and the law's curve stay those of the highest-weight form (``lead_form``).
    """
    from sdsl_jax import predict

    for r in records:
        n, d = np.asarray(r["n_drafts"]), np.asarray(r["d_drafts"])
        kw = dict(drafts=r["drafts"], n=n, d=d, target=r["target"], m=r["m_target"], d_target=r["d_target"],
                  seed=seed)
        t_draws, point_t = mixture_throughput(forms, **kw)
        p_best, band = predict.best_draft_probabilities(t_draws)
        r.update(p_best=p_best.tolist(), predicted_tokens_per_flop_band=band.tolist(),
                 predicted_tokens_per_flop=point_t.tolist(), lead_form=forms[0].name)
        if "p_best_mean_only" in r:
            r["p_best_mean_only"] = predict.best_draft_probabilities(
                mixture_throughput(forms, predictive=False, **kw)[0])[0].tolist()
        best = int(np.nanargmax(point_t)) if np.isfinite(point_t).any() else None
        measured = np.asarray(r["measured_tokens_per_flop"])
        r["predicted_best"] = r["drafts"][best] if best is not None else None
        r["measured_fraction_of_best"] = float(measured[best] / measured.max()) if best is not None else float("nan")
        r.update(decision_fields(bayes_decision(t_draws), r["drafts"], measured))


def fit_data_set(runs, pairs, *, family, model, starts_every: int, chains: int, warmup: int, draws: int,
                 propagate: int, seed: int, reruns: int = 0, stages: Stages | None = None) -> tuple[tuple, dict]:
    """One data set fitted (point fit, then posteriors, kept in ``stages``): ``(point, paired draws,
    predictive scales, (runs, pairs))`` and its summary (each posterior's diagnostics). ``pairs``
    None: the paper's plane, held fixed."""
    from sdsl_jax import pipeline, predict

    starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[::starts_every]
    store = None if stages is None else stages.store(runs, pairs, family, model)
    point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts, stages=store)
    post = pipeline.sample_posterior(runs, pairs, point, num_chains=chains, num_warmup=warmup, num_samples=draws,
                                     seed=seed, plane_seed=seed, retries=reruns, stages=store)
    summary = dict(diagnostics={family.name if k == "loss_law" else model.name: v._asdict()
                                for k, v in post.diagnostics.items()})
    return (point, predict.paired_draws(post, count=propagate, seed=seed),
            predict.predictive_scales(post, count=propagate, seed=seed, runs=runs, acceptance=pairs),
            (runs, pairs)), summary


def leave_size_out_fits(runs, pairs, sizes, *, family, model, starts_every: int, chains: int, warmup: int,
                        draws: int, propagate: int, seed: int, stack: tuple | None = None, reruns: int = 0,
                        stages: Stages | None = None, summaries: dict | None = None,
                        log=print) -> dict[float, tuple | list[FormFit]]:
    """For each draft size, the law and the acceptance model fitted WITHOUT that size's models.

    The size's pre-training runs leave the loss-law fit and every acceptance pair with a model of
    that size (as draft or as target) leaves the acceptance fit: the prediction for a draft of
    that size is then prospective, as for a draft not yet trained. Returns
    ``{size: (point, draws, scales, (runs, pairs))}`` (:mod:`sdsl_jax.pipeline`; the data it was fitted to);
    with ``stack = (families, models)``, ``{size: [FormFit, ...]}`` (:func:`fit_forms`: the forms
    and their weights chosen without that size too; ``summaries``, when given, receives each size's
    :func:`fit_forms` summary: weights, PSIS-LOO, diagnostics). With ``stages``, finished fits are
    kept and reused on ``--resume``.
    """
    out = {}
    for k, size in enumerate(sizes, 1):
        train = runs.select(runs.n_params != size)
        kept = pairs.select((pairs.n_draft != size) & (pairs.n_target != size))
        log(f"prospective: {k}/{len(sizes)}: fitting without the {size:.4g}-parameter models "
            f"({len(train)} runs, {len(kept)} pairs)")
        if stack is not None:
            out[float(size)], weights = fit_forms(train, kept, families=stack[0], models=stack[1],
                                                  starts_every=starts_every, chains=chains, warmup=warmup,
                                                  draws=draws, propagate=propagate, seed=seed, reruns=reruns,
                                                  stages=stages, log=log)
            log("  weights: " + ", ".join(f"{name} {w:.2f}" for name, w in weights["forms"].items()))
            if summaries is not None:
                summaries[float(size)] = weights
            continue
        out[float(size)], summary = fit_data_set(train, kept, family=family, model=model, starts_every=starts_every,
                                                 chains=chains, warmup=warmup, draws=draws, propagate=propagate,
                                                 seed=seed, reruns=reruns, stages=stages)
        if summaries is not None:
            summaries[float(size)] = summary
    return out


def add_prospective(records: list[dict], fits: dict[float, tuple], *, seed: int = 0) -> None:
    """Each candidate's T predicted by the fit that left its size out: P(best), best, regret.

    The draws of different candidates come from different fits, paired by index (the posteriors
    are independent); every fit draws its residuals from the same seed, so a draw's offsets are
    aligned across candidates as in :func:`sdsl_jax.predict.ranking.rank_drafts`. The candidate is a new
    model to its fit; the target, whose runs and pairs that fit keeps, is conditioned on them.
    """
    from sdsl_jax import predict
    from sdsl_jax.objective import draft_throughput

    for r in records:
        n, d = np.asarray(r["n_drafts"]), np.asarray(r["d_drafts"])
        columns, point_t = [], []
        for j, size in enumerate(n):
            fit = fits[float(size)]
            if isinstance(fit, list):  # stacked forms, weighted without this size
                t, t_point = mixture_throughput(fit, drafts=r["drafts"], n=n, d=d, target=r["target"],
                                                m=r["m_target"], d_target=r["d_target"], seed=seed)
                columns.append(t[:, j])
                point_t.append(float(t_point[j]))
                continue
            point, draws, scales, *data = fit  # data: (runs, pairs) of the fit, when known
            labels = candidate_labels(*data[0], r["drafts"], n, d, r["target"], r["m_target"], r["d_target"]) \
                if data else None
            t = predict.throughput_draws(draws, n_drafts=n, d_drafts=d, m_target=r["m_target"],
                                          d_target=r["d_target"], scales=scales, labels=labels, seed=seed)
            columns.append(t[:, j])
            point_t.append(float(draft_throughput(n[j], r["m_target"], d_draft=d[j], d_target=r["d_target"],
                                                  loss=point.law, plane=point.plane)))
        count = min(c.size for c in columns)
        t_draws = np.stack([c[:count] for c in columns], axis=1)
        p_best, band = predict.best_draft_probabilities(t_draws)
        point_t = np.asarray(point_t)
        best = int(np.nanargmax(point_t)) if np.isfinite(point_t).any() else None
        measured = np.asarray(r["measured_tokens_per_flop"])
        r.update(prospective_tokens_per_flop=point_t.tolist(), prospective_p_best=p_best.tolist(),
                 prospective_tokens_per_flop_band=band.tolist(),
                 prospective_best=r["drafts"][best] if best is not None else None,
                 prospective_regret=float(1 - measured[best] / measured.max()) if best is not None else float("nan"),
                 # The draft the prospective P(best) favours, and what choosing it costs.
                 prospective_most_probable=r["drafts"][int(np.nanargmax(p_best))],
                 prospective_most_probable_regret=float(1 - measured[int(np.nanargmax(p_best))] / measured.max()),
                 **decision_fields(bayes_decision(t_draws), r["drafts"], measured, prefix="prospective_"))


def forward_fits(runs, pairs, targets: dict[str, float], *, family, model, starts_every: int, chains: int,
                 warmup: int, draws: int, propagate: int, seed: int, reruns: int = 0,
                 stages: Stages | None = None, summaries: dict | None = None, log=print) -> dict[str, tuple | str]:
    """For each target, one fit of what a lab would have before pairing it: every pre-training run of
    the target and of smaller models, and the acceptance pairs whose target is smaller.

    ``targets`` maps a target's name to its size M. Where those pairs cannot identify the acceptance
    model yet (none, or too few), it is the paper's plane, held fixed, as it would be for that lab. Returns ``{target: (point, draws, scales, (runs, pairs))}``
    (as :func:`leave_size_out_fits`), or ``{target: reason}`` where those data cannot identify the
    loss law. ``summaries`` receives each fit's diagnostics.
    """
    from sdsl_jax.infer.point import IdentifiabilityError, check_acceptance_data, check_loss_law_data

    out = {}
    for k, (name, m) in enumerate(sorted(targets.items(), key=lambda item: item[1]), 1):
        train = runs.select(runs.n_params <= m)
        earlier = pairs.select(pairs.n_target < m)
        kept = earlier
        try:
            check_acceptance_data(earlier.ppl_draft, earlier.ppl_target, earlier.alpha, model=model)
        except IdentifiabilityError:
            kept = None  # too few pairs yet: the paper's plane
        log(f"forward: {k}/{len(targets)}: target {name}, fitting the {len(train)} runs up to its size and the "
            f"{len(earlier)} pairs of smaller targets")
        try:
            check_loss_law_data(train.n_params, train.n_tokens, train.loss, family=family)
        except IdentifiabilityError as err:
            out[name] = f"the runs up to this target cannot identify the loss law: {err.problem}"
            log(f"  skipped ({out[name]})")
            continue
        out[name], summary = fit_data_set(train, kept, family=family, model=model, starts_every=starts_every,
                                          chains=chains, warmup=warmup, draws=draws, propagate=propagate, seed=seed,
                                          reruns=reruns, stages=stages)
        if summaries is not None:
            summaries[name] = summary
    return out


def add_forward(records: list[dict], fits: dict[str, tuple | str], *, seed: int = 0) -> None:
    """Each target's candidates predicted by its forward fit (:func:`forward_fits`): P(best), the T band,
    the Bayes decision and its regret, the point fit's pick and its regret (``forward_`` keys), or the
    reason the target has no forward forecast (``forward_skipped``)."""
    from sdsl_jax import predict

    for r in records:
        fit = fits.get(r["target"])
        if fit is None or isinstance(fit, str):
            r["forward_skipped"] = fit or "no forward fit"
            continue
        point, draws, scales, (runs, pairs) = fit
        n, d = np.asarray(r["n_drafts"]), np.asarray(r["d_drafts"])
        labels = candidate_labels(runs, pairs, r["drafts"], n, d, r["target"], r["m_target"], r["d_target"])
        ranking = predict.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=r["m_target"], d_target=r["d_target"],
                                      draws=draws, scales=scales, labels=labels, seed=seed)
        measured = np.asarray(r["measured_tokens_per_flop"])
        best = ranking.best
        r.update(forward_p_best=ranking.p_best.tolist(), forward_tokens_per_flop=ranking.throughput.tolist(),
                 forward_tokens_per_flop_band=ranking.throughput_band.tolist(),
                 forward_best=r["drafts"][best] if best is not None else None,
                 forward_regret=float(1 - measured[best] / measured.max()) if best is not None else float("nan"),
                 **decision_fields(ranking.decision, r["drafts"], measured, prefix="forward_"))


class InSampleFit(NamedTuple):
    """The closure's fit to all the data: the point fit (the highest-weight form's with ``--stack``),
    the forms and their stacking summary (None without ``--stack``), the paired draws and residual
    scales (None without a posterior, or with ``--mean-only``) and the posteriors' diagnostics."""

    point: Any
    forms: list | None
    stacking: dict | None
    draws: tuple | None
    scales: Any
    diagnostics: dict


class ClosureSettings(NamedTuple):
    """How the closure fits: the lead loss law and acceptance model (names), every ``starts_every``-th
    multi-start point, NUTS chains x (warmup + draws), draws propagated per form, the seed, bands of
    the law's mean only (``mean_only``), whether to sample posteriors at all, and how many times a
    posterior that fails its checks is run again (``reruns``, :func:`sdsl_jax.pipeline.sample_posterior`)."""

    law: str = "chinchilla"
    acceptance_model: str = "plane"
    starts_every: int = 1
    chains: int = 4
    warmup: int = 500
    draws: int = 500
    propagate: int = 1000
    seed: int = 0
    mean_only: bool = False
    posterior: bool = True
    reruns: int = 0


def fit_in_sample(runs, pairs, settings: ClosureSettings, *, stack=None, stages: Stages | None = None,
                  log=print) -> InSampleFit:
    """The closure's fit to all the data: with ``stack`` (families, models) every form, stacked
    (:func:`fit_forms`); else the point fit of ``settings``' law and acceptance model and, with
    ``settings.posterior``, their posteriors and predictive draws."""
    from sdsl_jax import pipeline, predict

    family, model = FAMILIES[settings.law], ACCEPTANCE_MODELS[settings.acceptance_model]
    if stack is not None:
        log(f"stacking: fitting {len(stack[0])} loss-law form(s) x {len(stack[1])} acceptance model(s)")
        forms, stacking = fit_forms(runs, pairs, families=stack[0], models=stack[1], starts_every=settings.starts_every,
                                    chains=settings.chains, warmup=settings.warmup, draws=settings.draws,
                                    propagate=settings.propagate, seed=settings.seed, mean_only=settings.mean_only,
                                    reruns=settings.reruns, stages=stages, log=log)
        log("stacking: weights " + ", ".join(f"{name} {w:.3f}" for name, w in stacking["forms"].items()))
        log_point(forms[0].point, len(pairs), log)
        return InSampleFit(forms[0].point, forms, stacking, forms[0].draws, forms[0].scales, stacking["diagnostics"])
    starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[:: settings.starts_every]
    store = stages.store(runs, pairs, family, model) if settings.posterior and stages is not None else None
    point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts, stages=store)
    log_point(point, len(pairs), log)
    if not settings.posterior:
        return InSampleFit(point, None, None, None, None, {})
    # One seed for both posteriors: what the committed closure used.
    post = pipeline.sample_posterior(runs, pairs, point, num_chains=settings.chains, num_warmup=settings.warmup,
                                     num_samples=settings.draws, seed=settings.seed, plane_seed=settings.seed,
                                     retries=settings.reruns, stages=store)
    log(f"posteriors: loss law R-hat {post.diagnostics.loss_law.max_rhat:.3f}, acceptance R-hat "
        f"{post.diagnostics.plane.max_rhat:.3f}")
    scales = None if settings.mean_only else predict.predictive_scales(post, count=settings.propagate, seed=settings.seed,
                                                                     runs=runs, acceptance=pairs)
    return InSampleFit(point, None, None, predict.paired_draws(post, count=settings.propagate, seed=settings.seed), scales,
                       {k: v._asdict() for k, v in post.diagnostics.items()})


def prospective(records, speculative, runs, pairs, fit: InSampleFit, settings: ClosureSettings, *, stack=None,
                stages: Stages | None = None, log=print) -> tuple[str | None, dict | None]:
    """Each draft size left out in turn, the forecast added to ``records``; returns why it was
    skipped (or None) and each refit's diagnostics (with ``--stack`` also its own form weights)."""
    if fit.draws is None:
        log("prospective: skipped (it compares posterior forecasts: add --posterior)")
        return "needs --posterior", None
    sizes = sorted({float(v) for v in speculative.n_draft})
    refits = {}
    try:
        fits = leave_size_out_fits(runs, pairs, sizes, family=fit.point.family, model=fit.point.acceptance_model,
                                   starts_every=settings.starts_every, chains=settings.chains, warmup=settings.warmup,
                                   draws=settings.draws, propagate=settings.propagate, seed=settings.seed, stack=stack,
                                   reruns=settings.reruns, stages=stages, summaries=refits, log=log)
    except DataError as err:  # too few sizes: without one of them the rest cannot identify the law
        skipped = f"without one draft size the data cannot identify the models: {err.problem}"
        log(f"prospective: skipped ({skipped})")
        return skipped, None
    add_prospective(records, fits, seed=settings.seed)
    return None, {f"{size:.6g}": {k: summary[k] for k in ("forms", "diagnostics") if k in summary}
                  for size, summary in refits.items()}


def log_point(point, pairs: int, log) -> None:
    """One line: the point fit's law and acceptance model with its R^2."""
    log(f"loss law ({point.family.name}): " + " ".join(f"{k} {v:.4g}" for k, v in point.law._asdict().items())
        + f"; {point.acceptance_model.name}: " + " ".join(f"{k} {v:.4g}" for k, v in point.plane._asdict().items())
        + f" R^2 {point.plane_r_squared:.3f} ({pairs} pairs)")
