"""Forms fitted side by side and stacked: every (loss law, acceptance model) form fitted to one data
set and weighted (:func:`fit_forms`), one form's fit of a data set (:func:`fit_data_set`), the
stacked mixture's T draws, and where finished fits are kept (:class:`Stages`). The closure's fits
that use them (in sample, without a draft size, forward) are in :mod:`sdsl_jax.validation.closure_fits`.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from sdsl_jax import draft_throughput
from sdsl_jax.store import StageStore, content_digest
from sdsl_jax.forecast import bayes_decision
from sdsl_jax.loss_laws import prior_key
from sdsl_jax.validation.closure import candidate_labels, decision_fields, n_star_draws, n_star_fields

__all__ = [
    "Stages",
    "FormFit",
    "fit_forms",
    "mixture_throughput",
    "mixture_n_star",
    "stack_records",
    "fit_data_set",
]


class Stages:
    """Where the closure keeps each finished fit (``<out>/stages/``), for ``--resume``.

    One :class:`sdsl_jax.store.StageStore` per data set (all runs and pairs, or one size left
    out) and form, keyed by the data's content, the form and the sampler's settings: an
    interrupted closure loses at most the fit in flight.
    """

    def __init__(self, folder: str, *, resume: bool, settings: dict, log=lambda _: None):
        self.folder, self.resume, self.settings, self.log = folder, resume, settings, log

    def store(self, runs, pairs, family, model, *, prior_width: float = 1.0):
        from sdsl_jax.infer.posterior import plane_target_accept

        # Every column counts (run labels, model names, weights): a changed label is another model.
        content = content_digest(runs, pairs)
        form = f"{family.name}+{model.name}" + ("" if prior_width == 1 else f"+priors-x{prior_width:g}")
        effects = None if pairs is None else list(pairs.model_effects_identified()[0])
        inputs = dict(self.settings, data=content, law=family.name, target_accept=family.target_accept,
                      **prior_key([family]), model=model.name, model_effects=effects,
                      model_target_accept=plane_target_accept(model, effects=bool(effects)),
                      **({} if prior_width == 1 else dict(prior_width=prior_width)))
        return StageStore(os.path.join(self.folder, content[:16], form), resume=self.resume, log=self.log,
                          inputs=inputs)


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
              propagate: int, seed: int, mean_only: bool = False, reruns: int = 0,
              rerun_weight: float | None = None, prior_width: float = 1.0, weights_by: str = "rows",
              stages: Stages | None = None, log=print) -> tuple[list[FormFit], dict]:
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
    the coefficients of each law whose point fit sits at a bound (its law is then the posterior's
    median, :func:`sdsl_jax.predict.point_for_decisions`), each posterior's diagnostics).

    ``reruns``: times a posterior that fails its checks is run again, longer. With ``rerun_weight``
    None every failing posterior is (:func:`sdsl_jax.infer.posterior.rerun_until_checked`); with a
    number, only those of forms that would carry at least that stacking weight were every
    posterior to pass (``FormWeights.unchecked_weights``), each rerun from new starts with twice
    the warm-up and the draws of the last: a form the data give no weight is not worth the time,
    and a form they favour is not dropped on one short run's R-hat. Reruns are not kept in
    ``stages``. ``prior_width``: every prior that many times as wide
    (:func:`sdsl_jax.infer.models.widened_priors`). ``pairs`` None: the paper's plane, held fixed
    (``models`` then holds it alone).

    ``weights_by="sizes"``: the laws' weights from grouped leave-one-size-out densities of these
    data (:func:`sdsl_jax.compare.size_fold_weights`, each law refitted once per size of ``runs``,
    its folds kept in ``stages``), row-wise PSIS-LOO recorded beside them; a refit for a prospective
    or forward score is then weighted by the sizes it holds, nested inside it. The acceptance
    models' weights likewise from leave-one-draft-size-out densities of the pairs
    (:func:`sdsl_jax.compare.draft_size_fold_weights`, each model refitted once per draft size),
    PSIS-LOO over pairs recorded beside them.
    """
    from sdsl_jax import compare, pipeline
    from sdsl_jax.infer.point import IdentifiabilityError, check_loss_law_data, fit_acceptance_plane
    from sdsl_jax.infer.posterior import rerun_settings

    compare.check_stacking_density(weights_by)
    skipped, points, law_runs, plane_runs, posts = {}, {}, {}, {}, {}
    for family in families:
        try:
            check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=family)
        except IdentifiabilityError as err:
            skipped[family.name] = err.problem
            continue
        starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[::starts_every]
        stores = {m.name: None if stages is None else stages.store(runs, pairs, family, m, prior_width=prior_width)
                  for m in models}
        base = pipeline.fit_point(runs, pairs, family=family, acceptance_model=models[0], starts=starts,
                                  stages=stores[models[0].name])
        for model in models:
            point = base
            if model is not models[0]:
                fit = fit_acceptance_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha,
                                           weights=pairs.regression_weights(), model=model)
                point = base._replace(plane=type(fit.plane)(*(float(v) for v in fit.plane)), acceptance_model=model,
                                      plane_r_squared=float(fit.r_squared))
            post = pipeline.sample_posterior(runs, pairs, point, num_chains=chains, num_warmup=warmup,
                                             retries=reruns if rerun_weight is None else 0,
                                             num_samples=draws, seed=seed, plane_seed=seed, prior_width=prior_width,
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
    folds = None
    if weights_by == "sizes" and len(law_runs) > 1:
        folds = compare.size_fold_weights(
            runs, [points[f, first_model].family for f in law_runs], num_chains=chains, num_warmup=warmup,
            num_samples=draws, retries=reruns if rerun_weight is None else 0, seed=seed,
            run_effects=pipeline.has_repeated_runs(runs), prior_width=prior_width,
            stages_for=lambda name: None if stages is None else stages.store(
                runs, pairs, points[name, first_model].family, models[0], prior_width=prior_width),
            log=lambda line: log("  " + line))
    acc_folds = None
    if weights_by == "sizes" and pairs is not None and len(plane_runs) > 1:
        from sdsl_jax.infer.models import sampled_effect_sides

        first_family = points[next(iter(law_runs)), first_model].family
        acc_folds = compare.draft_size_fold_weights(
            pairs, models, effect_sides=sampled_effect_sides(plane_runs[first_model].samples), num_chains=chains,
            num_warmup=warmup, num_samples=draws, seed=seed,
            stages_for=lambda name: None if stages is None else stages.store(
                runs, pairs, first_family, next(m for m in models if m.name == name), prior_width=prior_width),
            log=lambda line: log("  " + line))

    def form_weights():
        """(the laws' weights, the acceptance models', the laws' by PSIS-LOO over rows, the acceptance
        models' by PSIS-LOO over pairs)."""
        rows_w = compare.stacking_weights(runs, {f: posts[f, first_model] for f in law_runs},
                                          families={f: points[f, first_model].family for f in law_runs})
        law_w = rows_w if folds is None else compare.grouped_stacking_weights(
            folds.log_density, groups="model sizes",
            failed=[f for f in folds.log_density if folds.fold_problems[f] or f in rows_w.failed])
        pairs_w = _acceptance_weights(pairs, plane_runs, models)
        acc_w = pairs_w if acc_folds is None else compare.grouped_stacking_weights(
            acc_folds.log_density, groups="draft sizes",
            failed=[m for m in acc_folds.log_density if acc_folds.fold_problems[m] or m in pairs_w.failed])
        return law_w, acc_w, rows_w, pairs_w

    law_w, acc_w, rows_w, pairs_w = form_weights()
    for k in range(1, reruns + 1 if rerun_weight is not None else 1):
        again = [(kind, name) for kind, w in (("law", law_w), ("acceptance", acc_w))
                 for name in compare.failed_forms_worth_rerunning(w, min_weight=rerun_weight)]
        if not again:
            break
        # The target acceptance is each posterior's own; the rest follows the sampler's reruns.
        warmup_k, draws_k, _, seed_k = rerun_settings(k, num_warmup=warmup, num_samples=draws, target_accept=0.0,
                                                      seed=seed)
        for kind, name in again:
            log(f"  forms: {name}'s posterior failed its checks and would carry weight: run again from new "
                f"starts, {warmup_k} warm-up + {draws_k} draws per chain")
            if kind == "law":  # sample this law alone, beside any acceptance posterior
                form, keep = (name, first_model), dict(law_run=None, plane_run=plane_runs[first_model])
            else:  # this acceptance model alone, beside any law's posterior
                law = next(iter(law_runs))
                form, keep = (law, name), dict(law_run=law_runs[law], plane_run=None)
            post = pipeline.sample_posterior(runs, pairs, points[form], num_chains=chains, num_warmup=warmup_k,
                                             num_samples=draws_k, seed=seed_k, plane_seed=seed_k,
                                             prior_width=prior_width, **keep)
            rerun = post.law_run if kind == "law" else post.plane_run
            if rerun.diagnostics is not None:
                rerun = rerun._replace(diagnostics=rerun.diagnostics._replace(attempts=k + 1))
            (law_runs if kind == "law" else plane_runs)[name] = rerun
        changed = {name for _, name in again}
        for f, m in [form for form in posts if changed & set(form)]:  # the forms sharing a rerun posterior
            posts[f, m] = pipeline.sample_posterior(runs, pairs, points[f, m], law_run=law_runs[f],
                                                    plane_run=plane_runs.get(m), seed=seed, plane_seed=seed,
                                                    prior_width=prior_width)
        law_w, acc_w, rows_w, pairs_w = form_weights()
    if pairs is None:
        plane_runs = {}
    weights = {(f, m): float(w_law * w_acc) for f, w_law in zip(law_w.names, law_w.weights)
               for m, w_acc in zip(acc_w.names, acc_w.weights)}
    forms, at_bound = _weighted_forms(posts, points, weights, runs, pairs, propagate=propagate, seed=seed,
                                      mean_only=mean_only)
    method = next((w.method.split(";")[0] for w in (law_w, acc_w) if len(w.names) > 1), "a single form of each kind")
    summary = dict(method=method, skipped=skipped,
                   laws={n: dict(weight=float(w), elpd_loo=float(e), elpd_se=float(se), pareto_k_max=float(k),
                                 **({} if folds is None else dict(
                                     held_out_log_density=float(folds.weights.elpd_loo[folds.weights.names.index(n)]),
                                     fold_problems=folds.fold_problems[n])))
                         for n, w, e, se, k in zip(rows_w.names, law_w.weights, *rows_w[2:5])},
                   acceptance_models={n: dict(weight=float(dict(zip(acc_w.names, acc_w.weights))[n]),
                                              elpd_loo=float(e), elpd_se=float(se),
                                              pareto_k_max=float(k), **({} if acc_folds is None else dict(
                                                  held_out_log_density=float(
                                                      acc_folds.weights.elpd_loo[acc_folds.weights.names.index(n)]),
                                                  fold_problems=acc_folds.fold_problems[n])))
                                      for n, e, se, k in zip(pairs_w.names, *pairs_w[2:5])},
                   forms={form.name: form.weight for form in forms},
                   failed_checks=[*law_w.failed, *acc_w.failed], point_fit_at_bound=at_bound,
                   diagnostics={name: run.diagnostics._asdict() for name, run in {**law_runs, **plane_runs}.items()})
    return forms, summary


def _weighted_forms(posts: dict, points: dict, weights: dict, runs, pairs, *, propagate: int, seed: int,
                    mean_only: bool) -> tuple[list[FormFit], dict[str, list[str]]]:
    """The forms with weight enough for one draw of ``propagate``, highest weight first, each with
    its point fit for decisions (:func:`sdsl_jax.predict.point_for_decisions`); and, per loss law
    whose point fit had a coefficient at a bound, those coefficients."""
    from sdsl_jax import predict

    forms, at_bound = [], {}
    for (f, m), post in posts.items():
        point, bad = predict.point_for_decisions(points[f, m], post.laws)
        if bad:
            at_bound[f] = list(bad)
        if int(round(weights[f, m] * propagate)) == 0:
            continue  # contributes no draw to the mixture
        forms.append(FormFit(f"{f} + {m}", weights[f, m], point, predict.paired_draws(post, count=propagate, seed=seed),
                             None if mean_only else predict.predictive_scales(post, count=propagate, seed=seed,
                                                                              runs=runs, acceptance=pairs),
                             runs, pairs))
    forms.sort(key=lambda form: -form.weight)
    return forms, at_bound


def _acceptance_weights(pairs, plane_runs: dict, models):
    """Stacking weights over the acceptance models, or the paper's plane alone where there are no pairs."""
    from sdsl_jax import compare

    if pairs is None:  # nothing sampled or weighed on the acceptance side
        nan = np.full(1, np.nan)
        return compare.FormWeights((models[0].name,), np.ones(1), nan, nan, nan, "the paper's plane, held fixed",
                                   unchecked_weights=np.ones(1))
    return compare.acceptance_stacking_weights(pairs, plane_runs, models={m.name: m for m in models})


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


def mixture_n_star(forms: list[FormFit], *, m: float, d_target: float, d_ref: float, rho: float,
                   n_star_recipe: float, seed: int = 0) -> dict:
    """A target's N* bands (at ``d_ref`` and along D = rho N) from the stacked mixture's draws.

    Each form's posterior-predictive N* draws (:func:`sdsl_jax.validation.closure.n_star_draws`), of
    which it contributes its share (:func:`sdsl_jax.compare.mixture_draw_indices`, the rule of
    :func:`mixture_throughput` and of the fit CLI's bands), summarised as one set of draws.
    """
    from sdsl_jax.compare import mixture_draw_indices

    total = min(np.size(form.draws[0][0]) for form in forms)
    shares = dict(mixture_draw_indices([f.name for f in forms], [f.weight for f in forms], total, seed=seed))
    at_ref, along = [], []
    for form in forms:
        if form.name in shares:
            a, b = n_star_draws(form.draws, form.scales, m=m, d_target=d_target, d_ref=d_ref, rho=rho,
                                n_star_recipe=n_star_recipe, seed=seed)
            at_ref.append([x[shares[form.name]] for x in a])
            along.append([x[shares[form.name]] for x in b])
    joined = lambda parts: tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # noqa: E731
    return n_star_fields(m, joined(at_ref), joined(along))


def stack_records(records: list[dict], forms: list[FormFit], *, seed: int = 0) -> None:
    """Replace the P(best), T bands, predicted best, Bayes decision and N* bands of ``records`` by the
    stacked mixture's.

    The point columns (N*, gamma*, alpha and the law's curve) stay those of the highest-weight
    form (``lead_form``).
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
        if "n_star_band" in r:
            r.update(mixture_n_star(forms, m=r["m_target"], d_target=r["d_target"], d_ref=r["d_reference"],
                                    rho=r["recipe_tokens_per_param"], n_star_recipe=r["n_star_recipe"], seed=seed))


def fit_data_set(runs, pairs, *, family, model, starts_every: int, chains: int, warmup: int, draws: int,
                 propagate: int, seed: int, reruns: int = 0, prior_width: float = 1.0,
                 stages: Stages | None = None) -> tuple[tuple, dict]:
    """One data set fitted (point fit, then posteriors, kept in ``stages``): ``(point, paired draws,
    predictive scales, (runs, pairs))`` and its summary (each posterior's diagnostics, and the
    coefficients of a point fit at a bound, whose law is then the posterior's median,
    :func:`sdsl_jax.predict.point_for_decisions`). ``pairs`` None: the paper's plane, held fixed.
    ``prior_width`` as in :func:`fit_forms`."""
    from sdsl_jax import pipeline, predict

    starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[::starts_every]
    store = None if stages is None else stages.store(runs, pairs, family, model, prior_width=prior_width)
    point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts, stages=store)
    post = pipeline.sample_posterior(runs, pairs, point, num_chains=chains, num_warmup=warmup, num_samples=draws,
                                     seed=seed, plane_seed=seed, retries=reruns, prior_width=prior_width,
                                     stages=store)
    summary = dict(diagnostics={family.name if k == "loss_law" else model.name: v._asdict()
                                for k, v in post.diagnostics.items()})
    point, at_bound = predict.point_for_decisions(point, post.laws)
    if at_bound:
        summary["point_fit_at_bound"] = {family.name: list(at_bound)}
    return (point, predict.paired_draws(post, count=propagate, seed=seed),
            predict.predictive_scales(post, count=propagate, seed=seed, runs=runs, acceptance=pairs),
            (runs, pairs)), summary
