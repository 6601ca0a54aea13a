"""Held-out checks of the bands: each model size left out in turn, predicted from a posterior fitted
to the others and scored (coverage of the 90% predictive bands, grouped leave-one-size-out log
density, forward extrapolation), for every loss-law family and acceptance model; stacking weights
over the families from the held-out densities. ``python -m experiments.holdout --help`` describes
the study.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "student_t_logpdf",
    "new_run_log_density",
    "loss_law_fold",
    "acceptance_fold",
    "run_holdout",
    "holdout_markdown",
]


def student_t_logpdf(y: np.ndarray, loc: np.ndarray, scale: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """log density of a Student-t (location, scale, degrees of freedom), elementwise."""
    from jax.scipy.stats import t

    return np.asarray(t.logpdf(y, nu, loc=loc, scale=scale))


def _log_mean_exp(x: np.ndarray, axis: int = 0) -> np.ndarray:
    from jax.scipy.special import logsumexp

    return np.asarray(logsumexp(x, axis=axis)) - np.log(x.shape[axis])


def new_run_log_density(samples: dict, family, test, *, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The posterior-predictive log density of runs the posterior has not seen, per row of ``test``.

    Every run of ``test`` (``run_labels``) is a NEW run: with run effects in ``samples`` each draw
    gives its rows one shared intercept and slope in log D (:func:`sdsl_jax.infer.new_run_effect`,
    Monte Carlo over the draws; the k-th run's from ``seed + 7919 k + 1``), on top of their
    Student-t residuals. Returns ``(log density per row, the law's mean log loss per draw and row,
    that mean plus the runs' effects)``.
    """
    import jax

    from sdsl_jax import infer

    theta = np.stack([np.asarray(samples[n]).reshape(-1) for n in family.theta_names], axis=1)
    sigma, nu = (np.asarray(samples[k]).reshape(-1) for k in ("sigma", "nu"))
    ln, ld = np.log(test.n_params), np.log(test.n_tokens)
    law_mean = np.asarray(jax.vmap(lambda t: family.log_prediction(t, ln, ld))(theta))  # (draws, held-out rows)
    labels = np.array(test.run_labels(), dtype=object)
    effect = np.zeros_like(law_mean)
    for k, label in enumerate(dict.fromkeys(labels)):
        rows = labels == label
        effect[:, rows] = infer.new_run_effect(samples, ld[rows], centre_log_d=float(samples.get("centre_log_d", 0.0)),
                                               seed=seed + 7919 * k + 1)
    mean = law_mean + effect
    y = np.log(test.loss)
    return _log_mean_exp(student_t_logpdf(y[None], mean, sigma[:, None], nu[:, None]), axis=0), law_mean, mean


def loss_law_fold(runs, keep, family, *, chains, warmup, draws, seed, starts_every, run_effects=False):
    """Fit ``family`` on ``runs[keep]``; predictive log densities and bands for ``runs[~keep]``.

    With ``run_effects`` the hierarchical posterior (:func:`sdsl_jax.infer.models.run_effects_model_for`):
    each held-out run is a NEW run, so each draw gives its rows one shared intercept and slope in
    log D (Monte Carlo over the draws) on top of their Student-t residuals (:func:`new_run_log_density`). ``problems``: the checks
    the fold's posterior failed, empty when it passed (a law with a failed fold gets no stacking weight).
    """
    from sdsl_jax import infer, fit_loss_law

    train, test = runs.select(keep), runs.select(~keep)
    log_d = (np.log(train.n_params), np.log(train.n_tokens), np.log(train.loss))
    starts = family.starts(*log_d)[::starts_every]
    point = fit_loss_law(train.n_params, train.n_tokens, train.loss, family=family, starts=starts)
    post = infer.sample_loss_law(train.n_params, train.n_tokens, train.loss, family=family,
                                 num_chains=chains, num_warmup=warmup, num_samples=draws, seed=seed,
                                 run=train.run_index()[0] if run_effects else None, progress_bar=False)
    log_density, law_mean, mean = new_run_log_density(post.samples, family, test, seed=seed)
    sigma, nu = (np.asarray(post.samples[k]).reshape(-1) for k in ("sigma", "nu"))
    y = np.log(test.loss)
    rng = np.random.default_rng(seed)
    predictive = mean + sigma[:, None] * rng.standard_t(nu[:, None], mean.shape)
    lo, hi = np.quantile(predictive, [0.05, 0.95], axis=0)
    lo_mean, hi_mean = np.quantile(law_mean, [0.05, 0.95], axis=0)  # the law's mean curve alone
    point_pred = np.asarray(family.log_prediction(point.theta, np.log(test.n_params), np.log(test.n_tokens)))
    return dict(log_density=log_density, covered=(lo <= y) & (y <= hi), covered_mean_only=(lo_mean <= y) & (y <= hi_mean),
                error=point_pred - y, problems=tuple(post.diagnostics.problems))


def _posterior_effects(samples: dict, role: str, train_labels, test_labels, rng) -> np.ndarray:
    """Each held-out pair's ``role`` ("draft" or "target") model effect per draw: a model of the training
    pairs keeps its posterior effect, a new model draws one shared by its pairs
    (:func:`sdsl_jax.predict.draws.model_effect_draws`)."""
    from sdsl_jax.predict.draws import model_effect_draws

    sd = np.asarray(samples[f"{role}_sd"]).reshape(-1)
    known = sd[:, None] * np.asarray(samples[f"{role}_z"]).reshape(sd.size, -1)
    return model_effect_draws(sd, known, tuple(dict.fromkeys(train_labels)), tuple(test_labels), rng)


def acceptance_fold(pairs, keep, model, *, chains, warmup, draws, seed, model_effects=False):
    """Fit ``model`` on ``pairs[keep]``; predictive log densities and bands for ``pairs[~keep]``.

    With ``model_effects`` (True, or the kinds of model that get effects, e.g. ``("draft",)``) the
    acceptance model with a random effect per draft and per target model
    (:func:`sdsl_jax.infer.models.model_effects_plane_model_for`): a held-out pair's model that the
    training pairs also hold keeps its posterior effect; the held-out size's models are new
    and draw theirs (one per model, shared by its pairs; Monte Carlo over the draws).
    """
    from sdsl_jax import infer, predictive_acceptance

    train, test = pairs.select(keep), pairs.select(~keep)
    groups = {}
    if model_effects:
        draft, _, target, _ = train.model_index()
        groups = dict(draft=draft, target=target,
                      effect_sides=infer.effect_sides_of(model_effects))
    post = infer.sample_plane(train.ppl_draft, train.ppl_target, train.alpha, weights=train.regression_weights(),
                              model=model, num_chains=chains, num_warmup=warmup, num_samples=draws, seed=seed,
                              progress_bar=False, **groups)
    planes = infer.planes_from_posterior(post.samples, model)
    planes = type(planes)(*(np.asarray(v)[:, None] for v in planes))
    eta = np.asarray(planes.predictor(test.ppl_draft, test.ppl_target))
    coefficients_only = np.asarray(planes.rate(test.ppl_draft, test.ppl_target))
    shift = np.zeros_like(eta)
    if model_effects:
        rng_effects = np.random.default_rng(seed + 1)
        shift = (_posterior_effects(post.samples, "draft", train.draft, test.draft, rng_effects)
                 + _posterior_effects(post.samples, "target", train.target, test.target, rng_effects))
    # The model's noise is for a row of average TRAINING weight; scale it to each held-out row's weight.
    w = test.regression_weights() / train.regression_weights().mean()
    sigma = np.asarray(post.samples["sigma"]).reshape(-1)[:, None] / np.sqrt(w)[None]
    rng = np.random.default_rng(seed)
    predictive = np.asarray(predictive_acceptance(planes, test.ppl_draft, test.ppl_target, shift=shift,
                                                  z=rng.standard_normal(eta.shape), sigma=sigma))
    mean = np.asarray(predictive_acceptance(planes, test.ppl_draft, test.ppl_target, shift=shift))
    lo, hi = np.quantile(predictive, [0.05, 0.95], axis=0)
    lo_mean, hi_mean = np.quantile(coefficients_only, [0.05, 0.95], axis=0)
    y = test.alpha
    log_density = _log_mean_exp(np.asarray(infer.acceptance_likelihood(model, eta + shift, sigma).log_prob(y)), axis=0)
    return dict(log_density=log_density, covered=(lo <= y) & (y <= hi), covered_mean_only=(lo_mean <= y) & (y <= hi_mean),
                error=np.median(mean, axis=0) - y, problems=tuple(post.diagnostics.problems))


def _summary(folds: dict, sizes: list[float]) -> dict:
    """A study's record over its folds; each fold's failed posterior checks listed with the size it held out."""
    covered = np.concatenate([f["covered"] for f in folds.values()])
    mean_only = np.concatenate([f["covered_mean_only"] for f in folds.values()])
    largest = folds[max(sizes)]
    return dict(coverage_90=float(covered.mean()), coverage_90_mean_only=float(mean_only.mean()),
                held_out_points=int(covered.size),
                log_predictive_density=float(sum(f["log_density"].sum() for f in folds.values())),
                per_size={f"{s:.6g}": dict(log_predictive_density=float(folds[s]["log_density"].sum()),
                                           coverage_90=float(folds[s]["covered"].mean()),
                                           rmse=float(np.sqrt(np.mean(folds[s]["error"] ** 2))))
                          for s in sizes},
                forward_extrapolation=dict(size=float(max(sizes)), rmse=float(np.sqrt(np.mean(largest["error"] ** 2))),
                                           log_predictive_density=float(largest["log_density"].sum())),
                failed_checks=[f"{s:.6g}" for s in sizes if folds[s]["problems"]],
                fold_problems={f"{s:.6g}": list(folds[s]["problems"]) for s in sizes if folds[s]["problems"]})


def run_holdout(runs, pairs, *, laws, acceptance_models, chains=4, warmup=500, draws=500, seed=0, starts_every=1,
                run_effects=False, model_effects=False, log=print) -> dict:
    """Every size held out in turn for every law (and acceptance model): the record of coverage, grouped
    leave-one-size-out log densities, forward extrapolation and the stacking weights over the laws."""
    from sdsl_jax import ACCEPTANCE_MODELS, FAMILIES
    from sdsl_jax.compare import grouped_stacking_weights, mixture_log_density
    from sdsl_jax.infer.point import IdentifiabilityError

    sizes = sorted(set(map(float, runs.n_params)))
    record = dict(laws={}, acceptance_models={})
    pointwise = {}
    for name in laws:
        family = FAMILIES[name]
        folds = {}
        for s in sizes:
            keep = runs.n_params != s
            try:
                folds[s] = loss_law_fold(runs, keep, family, chains=chains, warmup=warmup, draws=draws, seed=seed,
                                         starts_every=starts_every, run_effects=run_effects)
            except IdentifiabilityError as err:
                log(f"  {name}: size {s:.6g} held out: {err.problem}; family skipped")
                folds = None
                break
            log(f"  {name}: size {s:.6g} held out, log density {folds[s]['log_density'].sum():.2f}, "
                f"covered {folds[s]['covered'].mean():.2f}")
        if folds is None:
            continue
        record["laws"][name] = _summary(folds, sizes)
        pointwise[name] = np.concatenate([folds[s]["log_density"] for s in sizes])
    if len(pointwise) > 1:
        failed = [name for name in pointwise if record["laws"][name]["failed_checks"]]
        weights = grouped_stacking_weights(pointwise, groups="model sizes", failed=failed)
        record["stacking_weights"] = dict(zip(weights.names, map(float, weights.weights)))
        record["stacking_method"] = weights.method
        record["stacked_log_predictive_density"] = mixture_log_density(np.stack(list(pointwise.values())),
                                                                       weights.weights)
    if pairs is not None:
        model_sizes = sorted(set(map(float, pairs.n_draft)) | set(map(float, pairs.n_target)))
        for name in acceptance_models:
            model = ACCEPTANCE_MODELS[name]
            folds = {}
            for s in model_sizes:
                keep = (pairs.n_draft != s) & (pairs.n_target != s)
                if keep.all() or not keep.any():
                    continue
                folds[s] = acceptance_fold(pairs, keep, model, chains=chains, warmup=warmup, draws=draws, seed=seed,
                                           model_effects=model_effects)
                log(f"  acceptance {name}: size {s:.6g} held out ({int((~keep).sum())} pairs), log density "
                    f"{folds[s]['log_density'].sum():.2f}, covered {folds[s]['covered'].mean():.2f}")
            log(f"  acceptance {name}: {len(folds)} sizes held out")
            record["acceptance_models"][name] = _summary(folds, sorted(folds))
    return record


def holdout_markdown(record: dict) -> str:
    """holdout.md: per law and per acceptance model, coverage, grouped log density, RMSE, stacking weight."""
    lines = ["Loss laws, each size held out in turn (posterior predictive):", "",
             "| law | coverage of 90% bands (mean only) | grouped LOSO log density | forward: RMSE on the largest | "
             "stacking weight |", "|---|---|---|---|---|"]
    weights = record.get("stacking_weights", {})
    for name, r in record["laws"].items():
        lines.append(f"| {name} | {r['coverage_90']:.2f} ({r['coverage_90_mean_only']:.2f}) of {r['held_out_points']} | "
                     f"{r['log_predictive_density']:.1f} | {r['forward_extrapolation']['rmse']:.3f} | "
                     f"{weights.get(name, float('nan')):.2f} |")
    failed = {name: r["fold_problems"] for name, r in record["laws"].items() if r.get("fold_problems")}
    failed.update({f"acceptance {name}": r["fold_problems"] for name, r in record["acceptance_models"].items()
                   if r.get("fold_problems")})
    if failed:
        lines += ["", "Posteriors that failed their checks (a law with one gets no stacking weight):", "",
                  "| form | size held out | failed checks |", "|---|---|---|"]
        lines += [f"| {name} | {size} | {'; '.join(problems)} |"
                  for name, folds in failed.items() for size, problems in folds.items()]
    if "stacked_log_predictive_density" in record:
        lines.append(f"\nStacked mixture: grouped LOSO log density {record['stacked_log_predictive_density']:.1f}.")
    if record["acceptance_models"]:
        lines += ["", "Acceptance models, each size's pairs held out in turn:", "",
                  "| model | coverage of 90% bands (mean only) | LOSO log density | RMSE |", "|---|---|---|---|"]
        for name, r in record["acceptance_models"].items():
            rmse = np.sqrt(np.mean([v["rmse"] ** 2 for v in r["per_size"].values()]))
            lines.append(f"| {name} | {r['coverage_90']:.2f} ({r['coverage_90_mean_only']:.2f}) of "
                         f"{r['held_out_points']} | {r['log_predictive_density']:.1f} | {rmse:.3f} |")
    return "\n".join(lines) + "\n"
