"""The closure's fits: the in-sample fit (one form, or every form stacked), the prospective refits
that leave a draft size out, the forward fits that see only what came before a target, and the
in-sample fit again with every prior widened; each adds its forecast to the closure's records.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sdsl_jax import ACCEPTANCE_MODELS, FAMILIES
from sdsl_jax.data import DataError
from sdsl_jax.forecast import bayes_decision
from sdsl_jax.validation.closure import candidate_labels, close_loop, decision_fields, measured_perplexities
from sdsl_jax.validation.forms import FormFit, Stages, fit_data_set, fit_forms, mixture_throughput, stack_records

__all__ = [
    "leave_size_out_fits",
    "add_prospective",
    "forward_fits",
    "add_forward",
    "InSampleFit",
    "ClosureSettings",
    "fit_in_sample",
    "prospective",
    "prior_sensitivity",
    "log_point",
]


def leave_size_out_fits(runs, pairs, sizes, *, family, model, starts_every: int, chains: int, warmup: int,
                        draws: int, propagate: int, seed: int, stack: tuple | None = None, reruns: int = 0,
                        stack_by: str = "rows", stages: Stages | None = None, summaries: dict | None = None,
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
                                                  weights_by=stack_by, stages=stages, log=log)
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
                 warmup: int, draws: int, propagate: int, seed: int, stack: tuple | None = None, reruns: int = 0,
                 stack_by: str = "rows", stages: Stages | None = None, summaries: dict | None = None,
                 log=print) -> dict[str, tuple | list[FormFit] | str]:
    """For each target, one fit of what a lab would have before pairing it: every pre-training run of
    the target and of smaller models, and the acceptance pairs whose target is smaller.

    ``targets`` maps a target's name to its size M. Where those pairs cannot identify the acceptance
    model yet (none, or too few), it is the paper's plane, held fixed, as it would be for that lab. Returns ``{target: (point, draws, scales, (runs, pairs))}``
    (as :func:`leave_size_out_fits`), or ``{target: reason}`` where those data cannot identify the
    loss law. With ``stack = (families, models)`` each target's fit is every form, weighted from those
    data alone (:func:`fit_forms`; the laws alone with the paper's plane where the pairs cannot
    identify an acceptance model): ``{target: [FormFit, ...]}``. ``summaries`` receives each fit's
    diagnostics (with ``stack``, its :func:`fit_forms` summary).
    """
    from sdsl_jax.infer.point import IdentifiabilityError, check_acceptance_data, check_loss_law_data

    out = {}
    for k, (name, m) in enumerate(sorted(targets.items(), key=lambda item: item[1]), 1):
        train = runs.select(runs.n_params <= m)
        earlier = pairs.select(pairs.n_target < m)
        kept = earlier
        try:
            for m in (model,) if stack is None else stack[1]:
                check_acceptance_data(earlier.ppl_draft, earlier.ppl_target, earlier.alpha, model=m)
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
        if stack is not None:
            try:
                out[name], summary = fit_forms(train, kept, families=stack[0],
                                               models=stack[1] if kept is not None else (ACCEPTANCE_MODELS["plane"],),
                                               starts_every=starts_every, chains=chains, warmup=warmup, draws=draws,
                                               propagate=propagate, seed=seed, reruns=reruns, weights_by=stack_by,
                                               stages=stages, log=log)
            except IdentifiabilityError as err:
                out[name] = f"the runs up to this target cannot identify any loss-law form: {err.problem}"
                log(f"  skipped ({out[name]})")
                continue
            log("  weights: " + ", ".join(f"{form} {w:.2f}" for form, w in summary["forms"].items()))
        else:
            out[name], summary = fit_data_set(train, kept, family=family, model=model, starts_every=starts_every,
                                              chains=chains, warmup=warmup, draws=draws, propagate=propagate,
                                              seed=seed, reruns=reruns, stages=stages)
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
        n, d = np.asarray(r["n_drafts"]), np.asarray(r["d_drafts"])
        measured = np.asarray(r["measured_tokens_per_flop"])
        if isinstance(fit, list):  # stacked forms, weighted from the forward data alone
            t_draws, point_t = mixture_throughput(fit, drafts=r["drafts"], n=n, d=d, target=r["target"],
                                                  m=r["m_target"], d_target=r["d_target"], seed=seed)
            p_best, band = predict.best_draft_probabilities(t_draws)
            best = int(np.nanargmax(point_t)) if np.isfinite(point_t).any() else None
            decision = bayes_decision(t_draws)
            r["forward_lead_form"] = fit[0].name
        else:
            point, draws, scales, (runs, pairs) = fit
            labels = candidate_labels(runs, pairs, r["drafts"], n, d, r["target"], r["m_target"], r["d_target"])
            ranking = predict.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=r["m_target"],
                                          d_target=r["d_target"], draws=draws, scales=scales, labels=labels, seed=seed)
            p_best, point_t, band, best, decision = (ranking.p_best, ranking.throughput, ranking.throughput_band,
                                                     ranking.best, ranking.decision)
        r.update(forward_p_best=np.asarray(p_best).tolist(), forward_tokens_per_flop=np.asarray(point_t).tolist(),
                 forward_tokens_per_flop_band=np.asarray(band).tolist(),
                 forward_best=r["drafts"][best] if best is not None else None,
                 forward_regret=float(1 - measured[best] / measured.max()) if best is not None else float("nan"),
                 **decision_fields(decision, r["drafts"], measured, prefix="forward_"))


class InSampleFit(NamedTuple):
    """The closure's fit to all the data: the point fit (the highest-weight form's with ``--stack``),
    the forms and their stacking summary (None without ``--stack``), the paired draws and residual
    scales (None without a posterior, or with ``--mean-only``), the posteriors' diagnostics, and
    what the data did not pin down in the point fit's law (``point_fit_at_bound``; ``point``
    then holds the posterior's median law, :func:`sdsl_jax.predict.point_for_decisions`)."""

    point: Any
    forms: list | None
    stacking: dict | None
    draws: tuple | None
    scales: Any
    diagnostics: dict
    point_fit_at_bound: tuple[str, ...] = ()


class ClosureSettings(NamedTuple):
    """How the closure fits: the lead loss law and acceptance model (names), every ``starts_every``-th
    multi-start point, NUTS chains x (warmup + draws), draws propagated per form, the seed, bands of
    the law's mean only (``mean_only``), whether to sample posteriors at all, how many times a
    posterior that fails its checks is run again (``reruns``, :func:`sdsl_jax.pipeline.sample_posterior`),
    how many times as wide as stated every prior is (``prior_width``,
    :func:`sdsl_jax.infer.models.widened_priors`), and with stacked forms, the weight a failing form
    must stand to carry to be run again (``rerun_weight``, :func:`fit_forms`; None: every one) and
    how the laws are weighted (``stack_by``: ``"rows"``, PSIS-LOO; ``"sizes"``, each size of the fit's
    data left out in turn, :func:`sdsl_jax.compare.size_fold_weights`)."""

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
    prior_width: float = 1.0
    rerun_weight: float | None = None
    stack_by: str = "rows"


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
                                    reruns=settings.reruns, rerun_weight=settings.rerun_weight,
                                    prior_width=settings.prior_width, weights_by=settings.stack_by, stages=stages,
                                    log=log)
        log("stacking: weights " + ", ".join(f"{name} {w:.3f}" for name, w in stacking["forms"].items()))
        log_point(forms[0].point, len(pairs), log)
        return InSampleFit(forms[0].point, forms, stacking, forms[0].draws, forms[0].scales, stacking["diagnostics"],
                           tuple(stacking["point_fit_at_bound"].get(forms[0].point.family.name, ())))
    starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[:: settings.starts_every]
    store = stages.store(runs, pairs, family, model, prior_width=settings.prior_width) \
        if settings.posterior and stages is not None else None
    point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts, stages=store)
    log_point(point, len(pairs), log)
    if not settings.posterior:
        return InSampleFit(point, None, None, None, None, {})
    # One seed for both posteriors: what the committed closure used.
    post = pipeline.sample_posterior(runs, pairs, point, num_chains=settings.chains, num_warmup=settings.warmup,
                                     num_samples=settings.draws, seed=settings.seed, plane_seed=settings.seed,
                                     retries=settings.reruns, prior_width=settings.prior_width, stages=store)
    log(f"posteriors: loss law R-hat {post.diagnostics.loss_law.max_rhat:.3f}, acceptance R-hat "
        f"{post.diagnostics.plane.max_rhat:.3f}")
    scales = None if settings.mean_only else predict.predictive_scales(post, count=settings.propagate, seed=settings.seed,
                                                                     runs=runs, acceptance=pairs)
    point, at_bound = predict.point_for_decisions(point, post.laws)
    if at_bound:
        log(f"point fit: {', '.join(at_bound)} {predict.NOT_PINNED_DOWN}; its curve and pick are the posterior "
            "median law's")
    return InSampleFit(point, None, None, predict.paired_draws(post, count=settings.propagate, seed=settings.seed), scales,
                       {k: v._asdict() for k, v in post.diagnostics.items()}, at_bound)


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
                                   reruns=settings.reruns, stack_by=settings.stack_by, stages=stages,
                                   summaries=refits, log=log)
    except DataError as err:  # too few sizes: without one of them the rest cannot identify the law
        skipped = f"without one draft size the data cannot identify the models: {err.problem}"
        log(f"prospective: skipped ({skipped})")
        return skipped, None
    add_prospective(records, fits, seed=settings.seed)
    return None, {f"{size:.6g}": {k: summary[k] for k in ("forms", "diagnostics") if k in summary}
                  for size, summary in refits.items()}


def prior_sensitivity(records, speculative, runs, pairs, settings: ClosureSettings, *, width: float = 2.0,
                      stack=None, stages: Stages | None = None, log=print) -> dict:
    """The in-sample fit again with every prior ``width`` times as wide: how much P(best) and the
    Bayes decision owe to the priors.

    Adds ``p_best_wide_priors`` and ``bayes_decision_wide_priors`` to each record of ``records``
    (the in-sample forecasts, stacked or not) and returns the summary: ``width``, the largest change
    of any candidate's P(best) (``max_abs_change_p_best``, and per target), the targets whose Bayes
    decision changed, and the wide fit's diagnostics (the posteriors that failed their checks) and
    stacking weights.
    """
    log(f"prior sensitivity: the in-sample fit again with every prior {width:g} times as wide")
    wide = fit_in_sample(runs, pairs, settings._replace(prior_width=width), stack=stack, stages=stages, log=log)
    wide_records = close_loop(speculative, wide.point, draws=wide.draws, scales=wide.scales,
                              perplexities=measured_perplexities(pairs), seed=settings.seed, runs=runs, pairs=pairs)
    if wide.forms is not None:
        stack_records(wide_records, wide.forms, seed=settings.seed)
    by_target = {w["target"]: w for w in wide_records}
    change, changed = {}, []
    for r in records:
        w = by_target[r["target"]]
        r.update(p_best_wide_priors=w["p_best"], bayes_decision_wide_priors=w.get("bayes_decision"))
        change[r["target"]] = float(np.nanmax(np.abs(np.subtract(w["p_best"], r["p_best"]))))
        if w.get("bayes_decision") != r.get("bayes_decision"):
            changed.append(r["target"])
    log(f"prior sensitivity: P(best) moves by at most {max(change.values()):.3f}; Bayes decision changed for "
        f"{len(changed)} of {len(records)} targets")
    return dict(width=width, max_abs_change_p_best=max(change.values()), max_abs_change_p_best_per_target=change,
                bayes_decisions_changed=changed, diagnostics=wide.diagnostics,
                failed_checks=[name for name, d in wide.diagnostics.items() if not d["ok"]],
                forms=None if wide.stacking is None else wide.stacking["forms"])


def log_point(point, pairs: int, log) -> None:
    """One line: the point fit's law and acceptance model with its R^2."""
    log(f"loss law ({point.family.name}): " + " ".join(f"{k} {v:.4g}" for k, v in point.law._asdict().items())
        + f"; {point.acceptance_model.name}: " + " ".join(f"{k} {v:.4g}" for k, v in point.plane._asdict().items())
        + f" R^2 {point.plane_r_squared:.3f} ({pairs} pairs)")
