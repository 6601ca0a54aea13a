"""Close the loop on the ladder: does the SDSL law, fitted on our models, pick the draft that measures best?

    python -m experiments.closure --data fits/ladder --posterior      # the committed table
    python -m experiments.closure --data out/ladder/micro/measure     # micro ladder (tests)

From ``pretraining.csv`` and ``acceptance.csv`` (``experiments.measure``): fit the loss law
L(N, D) (Epoch method) and the acceptance plane alpha = A x + B y + C (weighted least squares),
and with ``--posterior`` their NUTS posteriors. Then for every target of ``speculative.csv``:

* predicted: T*(N) = max_gamma T for each of the ladder's drafts, from its own (N, D) and the
  target's (M, D') through L and the plane [SDSL, eqs. for T and gamma*]; the predicted best draft,
  and with the posterior the probability that each draft is the best; the continuous N* (solved
  by Newton on the gradient, ``solve_draft_size``) with its 90% band, at a draft budget D equal
  to the geometric mean of the candidate drafts' budgets (the law's N* assumes one D for all N);
* measured: tokens per FLOP under the SDSL cost model (2N per draft token, 2M per verification)
  at each measured gamma; the best (draft, gamma); the fastest wall-clock (draft, gamma);
* predicted vs measured alpha (the plane's alpha against the MLE from the speculative runs) and
  T* at the measured-best draft.

With ``--stack`` every loss-law form and acceptance model is fitted and the forms are weighted
by Bayesian stacking (:func:`fit_forms`); P(best), the T bands and the predicted best are then the
stacked mixture's, and with ``--prospective`` each fit without a draft size chooses its forms and
weights again without it, so the forecast scored is the whole procedure's, form choice included.

Writes ``closure.json``, ``closure.md`` (the table) and ``closure.png`` to ``--out``
(``<data>/closure``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any, NamedTuple

import numpy as np

from experiments.runlog import (Log, UsageError, check_arguments, configure_jax, make_output_folder, run_command,
                               versions, write_json, write_text)
from sdsl_jax import (ACCEPTANCE_MODELS, FAMILIES, SDSL_FLOPS, TokensPerParameter, best_lookahead, draft_throughput,
                      solve_draft_size)
from sdsl_jax.data import DataError, SpeculativeRuns, load_acceptance, load_pretraining, load_speculative
from sdsl_jax.store import atomic_write, content_digest


def measured_perplexities(pairs) -> dict[str, float]:
    """Each model's measured perplexity from an acceptance table (as draft or as target)."""
    out = dict(zip(pairs.draft, map(float, pairs.ppl_draft)))
    out.update(zip(pairs.target, map(float, pairs.ppl_target)))
    return out


def run_label_of(runs, n: float, d: float) -> str | None:
    """The loss-law run of a model of size ``n`` trained on ``d`` tokens, if the data hold it:
    the run of its own row, else the one run of its size (None when the size has none or several)."""
    labels = runs.run_labels()
    exact = [labels[i] for i in np.flatnonzero((runs.n_params == n) & (runs.n_tokens == d))]
    same_size = {labels[i] for i in np.flatnonzero(runs.n_params == n)}
    if exact:
        return exact[0]
    return same_size.pop() if len(same_size) == 1 else None


def candidate_labels(runs, pairs, drafts, n, d, target: str, m: float, d_target: float):
    """Who the candidates and the target are in ``runs`` and ``pairs``
    (:class:`sdsl_jax.pipeline.CandidateLabels`): their runs and acceptance-model labels, None
    where the data do not hold them (a new model)."""
    from sdsl_jax import pipeline

    return pipeline.CandidateLabels(
        draft_runs=tuple(run_label_of(runs, float(a), float(b)) for a, b in zip(n, d)),
        target_run=run_label_of(runs, m, d_target),
        draft_models=tuple(dr if dr in set(pairs.draft) else None for dr in drafts),
        target_model=target if target in set(pairs.target) else None)


def close_loop(speculative: SpeculativeRuns, point, *, draws=None, scales=None,
               perplexities: dict[str, float] | None = None, seed: int = 0, runs=None, pairs=None) -> list[dict]:
    """One record per target: predicted vs measured best draft, N*, alpha and T*.

    ``point`` is a :class:`sdsl_jax.pipeline.PointFit`; ``draws`` the paired posterior draws
    ``(laws, planes)`` (:func:`sdsl_jax.pipeline.paired_draws`). With ``perplexities`` (model name
    -> measured perplexity) also the acceptance-model-only prediction: T* from the acceptance model
    at the measured perplexities, bypassing L(N, D), which tells which link of the chain (loss law
    or acceptance) a miss comes from. With ``runs`` and ``pairs`` (the data of the fit, whose
    effects ``scales.known`` holds), each candidate and the target are predicted conditionally on
    their own runs and pairs where the data hold them.
    """
    from sdsl_jax import bayes, pipeline

    law, plane = point.law, point.plane
    out = []
    spec = speculative
    targets = sorted(set(spec.target), key=lambda t: spec.n_target[spec.target.index(t)])
    for target in targets:
        rows = np.flatnonzero(np.asarray(spec.target) == target)
        m, d_prime = float(spec.n_target[rows[0]]), float(spec.d_target[rows[0]])
        by_draft: dict[str, list[int]] = {}
        for i in rows:
            by_draft.setdefault(spec.draft[i], []).append(int(i))
        drafts = sorted(by_draft, key=lambda dr: spec.n_draft[by_draft[dr][0]])
        n = np.array([spec.n_draft[by_draft[dr][0]] for dr in drafts])
        d = np.array([spec.d_draft[by_draft[dr][0]] for dr in drafts])
        best_runs = [max(by_draft[dr], key=lambda i: spec.tokens_per_flop_sdsl[i]) for dr in drafts]  # best gamma
        measured_t = np.array([spec.tokens_per_flop_sdsl[i] for i in best_runs])
        measured_alpha = np.array([np.mean([spec.alpha_mle[i] for i in by_draft[dr]]) for dr in drafts])
        measured_best_freq = measured_best_bootstrap(spec, by_draft, drafts, seed=seed)
        labels = None if runs is None else candidate_labels(runs, pairs, drafts, n, d, target, m, d_prime)
        ranking = pipeline.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=m, d_target=d_prime, draws=draws,
                                       scales=scales, labels=labels, seed=seed)
        pred_idx = ranking.best
        best_measured = int(np.argmax(measured_t))
        fastest = max(rows, key=lambda i: spec.wallclock_speedup[i])
        d_ref = float(np.exp(np.mean(np.log(d))))
        sol = solve_draft_size(m, d_draft=d_ref, d_target=d_prime, loss=law, plane=plane)
        # The ladder trains drafts on D = rho N (rho = 40 or 20 bytes per parameter), not on one D
        # for every N: N* along that recipe, rho the candidates' median.
        rho = float(np.median(d / n))
        along = solve_draft_size(m, recipe=TokensPerParameter(rho), d_target=d_prime, loss=law, plane=plane)
        rec = dict(
            target=target, m_target=m, d_target=d_prime, drafts=drafts, n_drafts=n.tolist(),
            d_drafts=d.tolist(), d_reference=d_ref,
            measured_tokens_per_flop=measured_t.tolist(), measured_alpha_mle=measured_alpha.tolist(),
            predicted_tokens_per_flop=ranking.throughput.tolist(), predicted_alpha=ranking.alpha.tolist(),
            predicted_best=drafts[pred_idx] if pred_idx is not None else None,
            measured_best=drafts[best_measured], measured_best_gamma=int(spec.gamma[best_runs[best_measured]]),
            fastest_wallclock=spec.draft[fastest], fastest_wallclock_gamma=int(spec.gamma[fastest]),
            fastest_wallclock_speedup=float(spec.wallclock_speedup[fastest]),
            n_star=float(sol.n_star), n_star_status=int(sol.status), t_star=float(sol.throughput),
            recipe_tokens_per_param=rho, n_star_recipe=float(along.n_star), n_star_recipe_status=int(along.status),
            gamma_star=float(sol.gamma_star), target_alone_tokens_per_flop=1 / SDSL_FLOPS.verification(m, 1),
            # What following the law costs: measured T of the predicted-best draft over the best measured T.
            measured_fraction_of_best=(float(measured_t[pred_idx] / measured_t.max()) if pred_idx is not None
                                       else float("nan")),
            # The measured side's own uncertainty: P(best) over prompts resampled (None without per-prompt counts).
            measured_best_bootstrap=None if measured_best_freq is None else measured_best_freq.tolist(),
        )
        if perplexities is not None:
            alpha_plane = plane.rate(np.array([perplexities[dr] for dr in drafts]), perplexities[target])
            t_plane = np.asarray(best_lookahead(SDSL_FLOPS, alpha_plane, n, m).throughput)
            rec["plane_only_tokens_per_flop"] = t_plane.tolist()
            rec["plane_only_best"] = drafts[int(np.nanargmax(t_plane))] if np.isfinite(t_plane).any() else None
        if draws is not None:
            rec["p_best"] = ranking.p_best.tolist()
            if scales is not None:  # the same draws without the residuals: what the bands were before
                mean_only = pipeline.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=m, d_target=d_prime,
                                                 draws=draws)
                rec["p_best_mean_only"] = mean_only.p_best.tolist()
            rec["predicted_tokens_per_flop_band"] = ranking.throughput_band.tolist()
            laws, planes = draws
            # Posterior-predictive N* bands as in the fit CLI: a new draft series' and target's residuals.
            fixed_planes = planes if scales is None else pipeline.predictive_planes(
                planes, scales, d_draft=d_ref, d_target=d_prime, seed=seed)
            bands = bayes.propagate_draft_size(np.array([m]), laws, fixed_planes, d_draft=d_ref, d_target=d_prime,
                                               quantiles=(0.05, 0.5, 0.95))
            rec["n_star_band"] = np.asarray(bands.n_star)[:, 0].tolist()
            rec["n_star_failed_fraction"] = float(np.asarray(bands.failed_fraction)[0])
            recipe_planes = planes if scales is None else pipeline.predictive_planes(
                planes, scales, d_draft=float(rho * along.n_star) if np.isfinite(along.n_star) else d_ref,
                d_target=d_prime, seed=seed)
            recipe_bands = bayes.propagate_draft_size(np.array([m]), laws, recipe_planes, recipe=TokensPerParameter(rho),
                                                      d_target=d_prime, quantiles=(0.05, 0.5, 0.95))
            rec["n_star_recipe_band"] = np.asarray(recipe_bands.n_star)[:, 0].tolist()
        # The law's curve at D_ref, reaching down past N* and its band for the figure.
        low = min([n.min() / 4] + [v / 2 for v in [rec["n_star"], *rec.get("n_star_band", [])[:1]] if np.isfinite(v)])
        grid = np.geomspace(low, m, 80)
        rec["curve_n"] = grid.tolist()
        rec["curve_tokens_per_flop"] = np.asarray(
            draft_throughput(grid, m, d_draft=d_ref, d_target=d_prime, loss=law, plane=plane)).tolist()
        out.append(rec)
    return out


class Stages:
    """Where the closure keeps each finished fit (``<out>/stages/``), for ``--resume``.

    One :class:`sdsl_jax.pipeline.StageStore` per data set (all runs and pairs, or one size left
    out) and form, keyed by the data's content, the form and the sampler's settings: an
    interrupted closure loses at most the fit in flight.
    """

    def __init__(self, folder: str, *, resume: bool, settings: dict, log=lambda _: None):
        self.folder, self.resume, self.settings, self.log = folder, resume, settings, log

    def store(self, runs, pairs, family, model):
        from sdsl_jax import pipeline

        # Every column counts (run labels, model names, weights): a changed label is another model.
        content = content_digest(runs, pairs)
        return pipeline.StageStore(os.path.join(self.folder, content[:16], f"{family.name}+{model.name}"),
                                   resume=self.resume, log=self.log,
                                   inputs=dict(self.settings, data=content, law=family.name, model=model.name))


class FormFit(NamedTuple):
    """One form (loss law, acceptance model) fitted to one data set, with its stacking weight.

    ``weight`` is the product of the law's and the acceptance model's stacking weights: the two
    are fitted to different data (pre-training rows, acceptance pairs), so the stacking objective
    over (law, model) combinations depends only on those two marginals, and the product is one of
    its optima. ``draws``/``scales`` as :func:`sdsl_jax.pipeline.paired_draws` and
    :func:`sdsl_jax.pipeline.predictive_scales` (``scales`` None: mean curve only); ``runs`` and
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
              propagate: int, seed: int, mean_only: bool = False, stages: Stages | None = None,
              log=print) -> tuple[list[FormFit], dict]:
    """Every (loss law, acceptance model) form fitted to ``runs``/``pairs`` and weighted by stacking.

    Each law's posterior is sampled once and shared by the acceptance models, each acceptance
    model's once and shared by the laws. Weights: Bayesian stacking of PSIS-LOO predictive
    densities (:func:`sdsl_jax.pipeline.stacking_weights` over the laws on the pre-training rows,
    :func:`sdsl_jax.pipeline.acceptance_stacking_weights` over the acceptance models on the
    pairs), computed from these data only, so that a fit without a draft size also chooses its
    forms without it. A law the data cannot identify is skipped. With ``stages`` each point fit and
    posterior is kept when it ends and reused on ``--resume``. Returns the forms, highest
    weight first, and a summary (weights and PSIS-LOO per law and per acceptance model, the forms'
    weights, laws skipped, each posterior's diagnostics).
    """
    from sdsl_jax import pipeline
    from sdsl_jax.fitting import IdentifiabilityError, check_loss_law_data, fit_acceptance_plane

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
            post = pipeline.sample_posterior(runs, pairs, point, num_chains=chains, num_warmup=warmup,
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
    law_w = pipeline.stacking_weights(runs, {f: posts[f, first_model] for f in law_runs},
                                      families={f: points[f, first_model].family for f in law_runs})
    acc_w = pipeline.acceptance_stacking_weights(pairs, plane_runs, models={m.name: m for m in models})
    lw, aw = dict(zip(law_w.names, law_w.weights)), dict(zip(acc_w.names, acc_w.weights))
    forms = []
    for (f, m), post in posts.items():
        weight = float(lw[f] * aw[m])
        if int(round(weight * propagate)) == 0:
            continue  # contributes no draw to the mixture
        forms.append(FormFit(f"{f} + {m}", weight, points[f, m], pipeline.paired_draws(post, count=propagate,
                                                                                        seed=seed),
                             None if mean_only else pipeline.predictive_scales(post, count=propagate, seed=seed,
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
                   diagnostics={name: run.diagnostics._asdict() for name, run in {**law_runs, **plane_runs}.items()})
    return forms, summary


def mixture_throughput(forms: list[FormFit], *, drafts, n, d, target: str, m: float, d_target: float,
                       predictive: bool = True, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """T draws ``(draws, candidates)`` of the stacked mixture, and its point T per candidate.

    Each form contributes ``round(weight x draws)`` of its own draws (a random subset, as
    :func:`sdsl_jax.pipeline.mixture_bands` does), each conditioned on the runs and models of its
    own data; the point T is the weight-averaged point T of the forms (over the forms where the
    candidate is admissible; NaN where it is in none).
    """
    from sdsl_jax import pipeline

    total = min(np.size(form.draws[0][0]) for form in forms)
    columns, weighted, weight = [], np.zeros(len(n)), np.zeros(len(n))
    for form in forms:
        count = int(round(form.weight * total))
        labels = candidate_labels(form.runs, form.pairs, drafts, n, d, target, m, d_target)
        t = pipeline.throughput_draws(form.draws, n_drafts=n, d_drafts=d, m_target=m, d_target=d_target,
                                      scales=form.scales if predictive else None, labels=labels, seed=seed)
        idx = np.random.default_rng(seed).choice(t.shape[0], size=min(count, t.shape[0]), replace=False)
        columns.append(t[np.sort(idx)])
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
    from sdsl_jax import pipeline

    for r in records:
        n, d = np.asarray(r["n_drafts"]), np.asarray(r["d_drafts"])
        kw = dict(drafts=r["drafts"], n=n, d=d, target=r["target"], m=r["m_target"], d_target=r["d_target"],
                  seed=seed)
        t_draws, point_t = mixture_throughput(forms, **kw)
        p_best, band = pipeline.best_draft_probabilities(t_draws)
        r.update(p_best=p_best.tolist(), predicted_tokens_per_flop_band=band.tolist(),
                 predicted_tokens_per_flop=point_t.tolist(), lead_form=forms[0].name)
        if "p_best_mean_only" in r:
            r["p_best_mean_only"] = pipeline.best_draft_probabilities(
                mixture_throughput(forms, predictive=False, **kw)[0])[0].tolist()
        best = int(np.nanargmax(point_t)) if np.isfinite(point_t).any() else None
        measured = np.asarray(r["measured_tokens_per_flop"])
        r["predicted_best"] = r["drafts"][best] if best is not None else None
        r["measured_fraction_of_best"] = float(measured[best] / measured.max()) if best is not None else float("nan")


def leave_size_out_fits(runs, pairs, sizes, *, family, model, starts_every: int, chains: int, warmup: int,
                        draws: int, propagate: int, seed: int, stack: tuple | None = None,
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
    from sdsl_jax import pipeline

    out = {}
    for k, size in enumerate(sizes, 1):
        train = runs.select(runs.n_params != size)
        kept = pairs.select((pairs.n_draft != size) & (pairs.n_target != size))
        log(f"prospective: {k}/{len(sizes)}: fitting without the {size:.4g}-parameter models "
            f"({len(train)} runs, {len(kept)} pairs)")
        if stack is not None:
            out[float(size)], weights = fit_forms(train, kept, families=stack[0], models=stack[1],
                                                  starts_every=starts_every, chains=chains, warmup=warmup,
                                                  draws=draws, propagate=propagate, seed=seed, stages=stages,
                                                  log=log)
            log("  weights: " + ", ".join(f"{name} {w:.2f}" for name, w in weights["forms"].items()))
            if summaries is not None:
                summaries[float(size)] = weights
            continue
        starts = family.starts(np.log(train.n_params), np.log(train.n_tokens), np.log(train.loss))[::starts_every]
        store = None if stages is None else stages.store(train, kept, family, model)
        point = pipeline.fit_point(train, kept, family=family, acceptance_model=model, starts=starts, stages=store)
        post = pipeline.sample_posterior(train, kept, point, num_chains=chains, num_warmup=warmup,
                                         num_samples=draws, seed=seed, plane_seed=seed, stages=store)
        if summaries is not None:
            summaries[float(size)] = dict(diagnostics={family.name if k == "loss_law" else model.name: v._asdict()
                                                       for k, v in post.diagnostics.items()})
        out[float(size)] = (point, pipeline.paired_draws(post, count=propagate, seed=seed),
                            pipeline.predictive_scales(post, count=propagate, seed=seed, runs=train, acceptance=kept),
                            (train, kept))
    return out


def add_prospective(records: list[dict], fits: dict[float, tuple], *, seed: int = 0) -> None:
    """Each candidate's T predicted by the fit that left its size out: P(best), best, regret.

    The draws of different candidates come from different fits, paired by index (the posteriors
    are independent); every fit draws its residuals from the same seed, so a draw's offsets are
    aligned across candidates as in :func:`sdsl_jax.pipeline.rank_drafts`. The candidate is a new
    model to its fit; the target, whose runs and pairs that fit keeps, is conditioned on them.
    """
    from sdsl_jax import pipeline
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
            t = pipeline.throughput_draws(draws, n_drafts=n, d_drafts=d, m_target=r["m_target"],
                                          d_target=r["d_target"], scales=scales, labels=labels, seed=seed)
            columns.append(t[:, j])
            point_t.append(float(draft_throughput(n[j], r["m_target"], d_draft=d[j], d_target=r["d_target"],
                                                  loss=point.law, plane=point.plane)))
        count = min(c.size for c in columns)
        p_best, band = pipeline.best_draft_probabilities(np.stack([c[:count] for c in columns], axis=1))
        point_t = np.asarray(point_t)
        best = int(np.nanargmax(point_t)) if np.isfinite(point_t).any() else None
        measured = np.asarray(r["measured_tokens_per_flop"])
        r.update(prospective_tokens_per_flop=point_t.tolist(), prospective_p_best=p_best.tolist(),
                 prospective_tokens_per_flop_band=band.tolist(),
                 prospective_best=r["drafts"][best] if best is not None else None,
                 prospective_regret=float(1 - measured[best] / measured.max()) if best is not None else float("nan"),
                 # The draft the prospective P(best) favours, and what choosing it costs.
                 prospective_most_probable=r["drafts"][int(np.nanargmax(p_best))],
                 prospective_most_probable_regret=float(1 - measured[int(np.nanargmax(p_best))] / measured.max()))


def measured_best_bootstrap(speculative: SpeculativeRuns, rows_by_draft: dict[str, list[int]], drafts: list[str],
                            *, replicates: int = 2000, seed: int = 0) -> np.ndarray | None:
    """How often each draft measures best when the prompts are resampled (a paired bootstrap).

    Every (draft, gamma) run of a target decoded the same prompts, so one resample of prompt
    indices is applied to all of them; each draft's T is its best gamma's tokens per FLOP
    (SDSL cost) on the resampled prompts. None when the file has no per-prompt counts.
    """
    per_prompt = {i: speculative.per_prompt(i) for rows in rows_by_draft.values() for i in rows}
    if any(v is None for v in per_prompt.values()):
        return None
    prompts = {v[0].size for v in per_prompt.values()}
    if len(prompts) != 1:
        return None  # runs over different prompt sets cannot be paired
    num_prompts = prompts.pop()
    picks = np.random.default_rng(seed).integers(0, num_prompts, size=(replicates, num_prompts))
    best_t = np.full((replicates, len(drafts)), -np.inf)
    for j, draft in enumerate(drafts):
        for i in rows_by_draft[draft]:
            its, acc = per_prompt[i]
            iterations, accepted = its[picks].sum(1), acc[picks].sum(1)
            cost = (SDSL_FLOPS.draft_step(float(speculative.n_draft[i])) * float(speculative.gamma[i])
                    + SDSL_FLOPS.verification(float(speculative.n_target[i]), float(speculative.gamma[i]) + 1))
            t = (accepted + iterations) / (iterations * cost)
            best_t[:, j] = np.maximum(best_t[:, j], t)
    winners = np.argmax(best_t, axis=1)
    return np.bincount(winners, minlength=len(drafts)) / replicates


def forecast_scores(records: list[dict], key: str = "p_best") -> dict | None:
    """P(best) scored as a forecast of the measured-best draft, against the uniform guess.

    Log score: sum over targets of log P(measured best) (higher is better; 0 is perfect). Brier:
    mean over targets of sum_i (p_i - [i is the measured best])^2 (lower is better). A probability
    of 0 is floored at 1e-3 (a draw count of 1,000 cannot tell smaller ones apart).
    """
    if not records or any(key not in r for r in records):
        return None
    log_score = brier = uniform_log = uniform_brier = 0.0
    in_set = 0
    for r in records:
        p = np.asarray(r[key], np.float64)
        hit = np.array([dr == r["measured_best"] for dr in r["drafts"]], np.float64)
        order = np.argsort(-p, kind="stable")  # the 90% credible set: most probable drafts up to 0.9
        chosen = order[: int(np.searchsorted(np.cumsum(p[order]), 0.9 - 1e-12)) + 1]
        in_set += int(hit[chosen].sum() > 0)
        k = len(p)
        log_score += float(np.log(max(p[hit > 0][0], 1e-3)))
        brier += float(np.sum((p - hit) ** 2))
        uniform_log += float(np.log(1 / k))
        uniform_brier += float(np.sum((1 / k - hit) ** 2))
    t = len(records)
    extra = {}
    if all(r.get("measured_best_bootstrap") is not None for r in records):
        # The measured best is itself uncertain (prompts resampled): the log score expected over it.
        extra["log_score_over_measured_uncertainty"] = float(sum(
            np.dot(r["measured_best_bootstrap"], np.log(np.maximum(np.asarray(r[key], np.float64), 1e-3)))
            for r in records))
    return dict(**extra, log_score=log_score, uniform_log_score=uniform_log, brier=brier / t,
                uniform_brier=uniform_brier / t,
                measured_best_in_90_credible_set=in_set, targets=t,
                measured_best_probabilities=[float(np.asarray(r[key])[r["drafts"].index(r["measured_best"])])
                                             for r in records])


def _fmt(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n:.3g}"


def markdown_table(records: list[dict]) -> str:
    lines = ["| target (M, D'/M) | predicted best draft (plane only) | P(best): predicted / measured best | N* at D_ref [90%] | "
             "N* along D = rho N [90%] | "
             "measured best (gamma) | measured T of predicted best / of measured best | "
             "fastest wall-clock (gamma, speedup) | alpha pred / MLE at measured best | T* pred / measured at "
             "measured best (x target alone) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        i = r["drafts"].index(r["measured_best"])
        p_best = "-"
        if "p_best" in r and r["predicted_best"] is not None:
            p_best = f"{r['p_best'][r['drafts'].index(r['predicted_best'])]:.2f} / {r['p_best'][i]:.2f}"
        band = (f"[{_fmt(r['n_star_band'][0])}, {_fmt(r['n_star_band'][2])}]" if "n_star_band" in r else "")
        n_star = _fmt(r["n_star"]) if np.isfinite(r["n_star"]) else f"none (status {r['n_star_status']})"
        n_star += OUTSIDE_MARK if outside_band(r["n_star"], r.get("n_star_band")) else ""
        along = (_fmt(r["n_star_recipe"]) if np.isfinite(r["n_star_recipe"])
                 else f"none (status {r['n_star_recipe_status']})")
        along += (OUTSIDE_MARK if outside_band(r["n_star_recipe"], r.get("n_star_recipe_band")) else "") \
            + f" (rho {r['recipe_tokens_per_param']:.0f})"
        if "n_star_recipe_band" in r:
            along += f" [{_fmt(r['n_star_recipe_band'][0])}, {_fmt(r['n_star_recipe_band'][2])}]"
        base = r["target_alone_tokens_per_flop"]
        lines.append(
            f"| {r['target']} ({_fmt(r['m_target'])}, {r['d_target'] / r['m_target']:.0f}) | {r['predicted_best']}"
            + (f" ({r['plane_only_best']})" if "plane_only_best" in r else "") + " | "
            f"{p_best} | {n_star} {band} | {along} | {r['measured_best']} ({r['measured_best_gamma']}) | "
            f"{r['measured_fraction_of_best']:.3f} | "
            f"{r['fastest_wallclock']} ({r['fastest_wallclock_gamma']}, x{r['fastest_wallclock_speedup']:.2f}) | "
            f"{r['predicted_alpha'][i]:.3f} / {r['measured_alpha_mle'][i]:.3f} | "
            f"x{r['predicted_tokens_per_flop'][i] / base:.2f} / x{r['measured_tokens_per_flop'][i] / base:.2f} |")
    outside = sum(outside_band(r["n_star"], r.get("n_star_band"))
                  + outside_band(r["n_star_recipe"], r.get("n_star_recipe_band")) for r in records)
    note = (f"\n{OUTSIDE_MARK.strip()} {outside} point N* outside its own 90% band: the point fit sits where the data do "
            "not pin the law down (a coefficient at a bound, or an N term the data do not identify: see the fit "
            "CLI's identification flags); the band, which averages over what the data allow, is the answer to "
            "read.\n") if outside else ""
    return "\n".join(lines) + "\n" + note


OUTSIDE_MARK = " (!)"


def outside_band(value: float, band) -> bool:
    """Whether a finite point lies outside a finite ``[lo, median, hi]`` band (False without one)."""
    if band is None or not np.isfinite(value) or not np.all(np.isfinite([band[0], band[2]])):
        return False
    return not band[0] <= value <= band[2]


def figure(records: list[dict], path: str) -> None:
    """One panel per target (measured and predicted T over the drafts, the bands, N*), one legend
    for all of them below the grid: readable at its committed size."""
    from matplotlib.figure import Figure

    cols = min(3, len(records))
    rows = -(-len(records) // cols)
    fig = Figure(figsize=(5.2 * cols, 4.0 * rows + 1.0))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, r in zip(axes.flat, records):
        base = r["target_alone_tokens_per_flop"]
        n = np.array(r["n_drafts"])
        ax.plot(n, np.array(r["measured_tokens_per_flop"]) / base, "o-", label="measured (best gamma)")
        ax.plot(n, np.array(r["predicted_tokens_per_flop"]) / base, "s--", label="predicted T* (own D)")
        if "plane_only_tokens_per_flop" in r:
            ax.plot(n, np.array(r["plane_only_tokens_per_flop"]) / base, "^:", color="C3",
                    label="plane at measured ppl")
        ax.plot(r["curve_n"], np.array(r["curve_tokens_per_flop"]) / base, color="C2", lw=0.8,
                label="law at D = D_ref")
        if "predicted_tokens_per_flop_band" in r:
            band = np.array(r["predicted_tokens_per_flop_band"]) / base
            ax.fill_between(n, band[:, 0], band[:, 1], alpha=0.2, color="C1", label="90% band")
        if "n_star_band" in r:
            ax.axvspan(r["n_star_band"][0], r["n_star_band"][2], color="C2", alpha=0.15, label="N* at D_ref, 90%")
        if "n_star_recipe_band" in r:  # the recipe the ladder trains its drafts with
            ax.axvspan(r["n_star_recipe_band"][0], r["n_star_recipe_band"][2], color="C4", alpha=0.2,
                       label=f"N* along D = {r['recipe_tokens_per_param']:.0f} N, 90%")
        if np.isfinite(r["n_star"]):
            ax.axvline(r["n_star"], color="C2", lw=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(f"target {r['target']} (M = {_fmt(r['m_target'])})", fontsize=11)
        ax.set_xlabel("draft parameters N", fontsize=10)
        ax.set_ylabel("tokens/FLOP vs target alone", fontsize=10)
    for ax in list(axes.flat)[len(records):]:
        ax.axis("off")
    labels = {}  # every entry any panel has, once (not every panel draws every band)
    for ax in axes.flat[:len(records)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    fig.legend(list(labels.values()), list(labels), loc="lower center", ncol=min(4, len(labels)), fontsize=10,
               frameon=False)
    fig.tight_layout(rect=(0, 0.9 / (4.0 * rows + 1.0) + 0.02, 1, 1))
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.closure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder", help="folder with pretraining.csv, acceptance.csv and "
                   "speculative.csv (fits/ladder)")
    p.add_argument("--text", choices=("heldout", "hellaswag"), default="heldout",
                   help="which evaluation text's perplexities and alpha to fit (heldout)")
    p.add_argument("--law", choices=sorted(FAMILIES), default="chinchilla",
                   help="loss-law form: " + ", ".join(FAMILIES) + " (chinchilla)")
    p.add_argument("--acceptance-model", choices=sorted(ACCEPTANCE_MODELS), default="plane",
                   help="acceptance model: " + ", ".join(ACCEPTANCE_MODELS) + " (plane)")
    p.add_argument("--posterior", action="store_true", help="NUTS posteriors: P(best draft) and bands")
    p.add_argument("--stack", nargs="?", const="all", default=None, metavar="FORMS",
                   help="with --posterior: fit every loss-law form and acceptance model (or the comma-separated FORMS, "
                        "names of either kind; a kind not named keeps --law / --acceptance-model), weight them by "
                        "Bayesian stacking (PSIS-LOO) and score the stacked mixture; with --prospective the forms "
                        "and weights are chosen again without each left-out size")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--propagate", type=int, default=1000, help="posterior draws pushed through N* (1000)")
    p.add_argument("--starts", type=int, default=1, metavar="K", help="use every K-th start of the law's grid (1: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (<data>/closure)")
    p.add_argument("--mean-only", action="store_true", help="P(best) and the T bands from the law's mean and the "
                   "plane's coefficients only, without the residual scatter of new models")
    p.add_argument("--prospective", action="store_true",
                   help="with --posterior: also predict each draft with its own size left out of both fits (one "
                        "refit per draft size), scored like the in-sample P(best)")
    p.add_argument("--resume", action="store_true",
                   help="with --posterior: reuse the point fits and posteriors an interrupted run with the same data "
                        "and settings kept in <out>/stages/ (every finished fit is kept there)")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def failed_diagnostics(in_sample: dict, refits: dict | None, stacking: dict | None) -> list[str]:
    """One line per posterior (in-sample or a refit without a size) whose checks failed."""
    def weight_of(name, forms):
        if not forms:
            return ""
        w = sum(v for k, v in forms.items() if name in k.split(" + "))
        return f", weight {w:.2f}"

    out = []
    fits = [("all data", in_sample, None if stacking is None else stacking["forms"])]
    fits += [(f"without N = {size}", r.get("diagnostics", {}), r.get("forms")) for size, r in (refits or {}).items()]
    for where, diagnostics, forms in fits:
        for name, d in diagnostics.items():
            if not d["ok"]:
                out.append(f"{where}: {name} (R-hat {d['max_rhat']:.3f}, ESS {d['min_ess_bulk']:.0f}, "
                           f"{d['num_divergences']} divergent{weight_of(name, forms)})")
    return out


def stacked_forms(args) -> tuple[list, list] | None:
    """``--stack``'s (loss-law families, acceptance models); None without it."""
    if args.stack is None:
        return None
    if not args.posterior:
        raise ValueError("--stack weights the forms' posteriors: add --posterior")
    names = list(FAMILIES) + list(ACCEPTANCE_MODELS) if args.stack == "all" else args.stack.split(",")
    unknown = [n for n in names if n not in FAMILIES and n not in ACCEPTANCE_MODELS]
    if unknown:
        raise ValueError(f"--stack {args.stack}: unknown form(s) {', '.join(unknown)} (loss laws: "
                         f"{', '.join(FAMILIES)}; acceptance models: {', '.join(ACCEPTANCE_MODELS)})")
    families = [FAMILIES[n] for n in names if n in FAMILIES] or [FAMILIES[args.law]]
    models = [ACCEPTANCE_MODELS[n] for n in names if n in ACCEPTANCE_MODELS] or [ACCEPTANCE_MODELS[args.acceptance_model]]
    return families, models


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_jax()
    return run_command(lambda: _close(args, argv), "the closure writes its tables only when it ends; its finished "
                                                   "fits are kept in <out>/stages/: rerun the same command with "
                                                   "--resume to reuse them")


def validate_args(args) -> None:
    """Every argument checked before any work or file (UsageError names the argument)."""
    check_arguments(args, at_least_one=("chains", "warmup", "draws", "propagate", "starts"), out=args.out)
    try:
        stacked_forms(args)
    except ValueError as err:
        raise UsageError(str(err)) from None


def check_named_models(speculative, pairs) -> None:
    """Every draft and target of the speculative runs must have a measured perplexity in the pairs."""
    known = set(pairs.draft) | set(pairs.target)
    for i, (target, draft) in enumerate(zip(speculative.target, speculative.draft)):
        for column, name in (("target", target), ("draft", draft)):
            if name not in known:
                raise DataError(speculative.path, i + 2, column, f"{name!r} is in no row of {pairs.path} (its "
                                "perplexity is needed): the two files must name the same models")


def _close(args, argv) -> int:
    from sdsl_jax import pipeline

    validate_args(args)
    log = Log(args.quiet)
    suffix = "" if args.text == "heldout" else "_hellaswag"
    paths = dict(pretraining=os.path.join(args.data, f"pretraining{suffix}.csv"),
                 acceptance=os.path.join(args.data, f"acceptance{suffix}.csv"),
                 speculative=os.path.join(args.data, "speculative.csv"))
    runs, pairs = load_pretraining(paths["pretraining"]), load_acceptance(paths["acceptance"])
    speculative = load_speculative(paths["speculative"])
    check_named_models(speculative, pairs)
    stack = stacked_forms(args)
    out = make_output_folder(args.out or os.path.join(args.data, "closure"))
    family, model = FAMILIES[args.law], ACCEPTANCE_MODELS[args.acceptance_model]
    stages = Stages(os.path.join(out, "stages"), resume=args.resume, log=log.warning, settings=dict(
        seed=args.seed, chains=args.chains, warmup=args.warmup, draws=args.draws, starts=args.starts))
    forms = stacking = None
    if stack is not None:
        log(f"stacking: fitting {len(stack[0])} loss-law form(s) x {len(stack[1])} acceptance model(s)")
        forms, stacking = fit_forms(runs, pairs, families=stack[0], models=stack[1], starts_every=args.starts,
                                    chains=args.chains, warmup=args.warmup, draws=args.draws,
                                    propagate=args.propagate, seed=args.seed, mean_only=args.mean_only,
                                    stages=stages, log=log)
        log("stacking: weights " + ", ".join(f"{name} {w:.3f}" for name, w in stacking["forms"].items()))
        point = forms[0].point
        family, model = point.family, point.acceptance_model
    else:
        starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[:: args.starts]
        store = stages.store(runs, pairs, family, model) if args.posterior else None
        point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts, stages=store)
    law, plane = point.law, point.plane
    log(f"loss law ({family.name}): " + " ".join(f"{k} {v:.4g}" for k, v in law._asdict().items())
        + f"; {model.name}: " + " ".join(f"{k} {v:.4g}" for k, v in plane._asdict().items())
        + f" R^2 {point.plane_r_squared:.3f} ({len(pairs)} pairs)")
    draws = scales = None
    diagnostics = {}
    if forms is not None:
        draws, scales, diagnostics = forms[0].draws, forms[0].scales, stacking["diagnostics"]
    elif args.posterior:
        # One seed for both posteriors: what the committed closure used.
        post = pipeline.sample_posterior(runs, pairs, point, num_chains=args.chains, num_warmup=args.warmup,
                                         num_samples=args.draws, seed=args.seed, plane_seed=args.seed, stages=store)
        diagnostics = {k: v._asdict() for k, v in post.diagnostics.items()}
        draws = pipeline.paired_draws(post, count=args.propagate, seed=args.seed)
        scales = None if args.mean_only else pipeline.predictive_scales(post, count=args.propagate, seed=args.seed,
                                                                         runs=runs, acceptance=pairs)
        log(f"posteriors: loss law R-hat {post.diagnostics['loss_law'].max_rhat:.3f}, acceptance R-hat "
            f"{post.diagnostics['plane'].max_rhat:.3f}")
    records = close_loop(speculative, point, draws=draws, scales=scales, perplexities=measured_perplexities(pairs),
                         seed=args.seed, runs=runs, pairs=pairs)
    if forms is not None:
        stack_records(records, forms, seed=args.seed)
    prospective_skipped = prospective_weights = None
    if args.prospective and draws is not None:
        sizes = sorted({float(v) for v in speculative.n_draft})
        refits = {}
        try:
            fits = leave_size_out_fits(runs, pairs, sizes, family=family, model=model, starts_every=args.starts,
                                       chains=args.chains, warmup=args.warmup, draws=args.draws,
                                       propagate=args.propagate, seed=args.seed, stack=stack, stages=stages,
                                       summaries=refits, log=log)
        except DataError as err:  # too few sizes: without one of them the rest cannot identify the law
            prospective_skipped = f"without one draft size the data cannot identify the models: {err.problem}"
            log(f"prospective: skipped ({prospective_skipped})")
        else:
            add_prospective(records, fits, seed=args.seed)
            # Each refit's diagnostics (and with --stack its own weights: the form choice without that size).
            prospective_weights = {f"{size:.6g}": {k: summary[k] for k in ("forms", "diagnostics") if k in summary}
                                   for size, summary in refits.items()}
    elif args.prospective:
        prospective_skipped = "needs --posterior"
        log("prospective: skipped (it compares posterior forecasts: add --posterior)")
    table = markdown_table(records)
    scores = {k: forecast_scores(records, key) for k, key in (("predictive", "p_best"),
                                                               ("mean_only", "p_best_mean_only"),
                                                               ("prospective", "prospective_p_best"))}
    scores = {k: v for k, v in scores.items() if v is not None}
    if "mean_only" in scores:
        scores["mean_only"]["meaning"] = "the same draws without the residual terms (law mean and plane only)"
    if draws is not None:
        s = scores.get("predictive" if scales is not None else "mean_only") or forecast_scores(records)
        table += (f"\nP(best) scored as a forecast of the measured best over {len(records)} targets: log score "
                  f"{s['log_score']:.2f} (uniform {s['uniform_log_score']:.2f}), Brier {s['brier']:.3f} (uniform "
                  f"{s['uniform_brier']:.3f}), measured best inside the 90% credible set of drafts for "
                  f"{s['measured_best_in_90_credible_set']} of {s['targets']}" + ("" if scales is None else
                                                  f"; without the residual terms: log score "
                                                  f"{scores['mean_only']['log_score']:.2f}, Brier "
                                                  f"{scores['mean_only']['brier']:.3f}") + ".\n")
    if "prospective" in scores:
        s = scores["prospective"]
        s["regret"] = [r["prospective_regret"] for r in records]
        s["meaning"] = "each draft predicted by fits that left its own size out (loss law and acceptance)"
        table += ("\nProspective (each draft's own size left out of both fits): " + "; ".join(
            f"{r['target']}: best {r['prospective_best']}, P(measured best {r['measured_best']}) "
            f"{r['prospective_p_best'][r['drafts'].index(r['measured_best'])]:.2f}, regret "
            f"{100 * r['prospective_regret']:.1f}%" for r in records)
            + f". Log score {s['log_score']:.2f} (uniform {s['uniform_log_score']:.2f}), Brier {s['brier']:.3f} "
              f"(uniform {s['uniform_brier']:.3f}), measured best in the 90% credible set for "
              f"{s['measured_best_in_90_credible_set']} of {s['targets']}.\n")
    failed = failed_diagnostics(diagnostics, prospective_weights, stacking)
    if failed:
        table += ("\nPosteriors that failed their checks (R-hat < 1.01, bulk ESS >= 400, no divergences), with the "
                  "weight their form carries in that fit: " + "; ".join(failed) + ". Their draws are used as sampled; "
                  "read the scores that depend on them with that in mind.\n")
        log(f"diagnostics: {len(failed)} posterior(s) failed their checks (listed in closure.md)")
    if stacking is not None:
        table += ("\nStacked forms (" + stacking["method"] + "; loss laws on the pre-training rows, acceptance models "
                  "on the pairs): " + ", ".join(f"{name} {w:.3f}" for name, w in stacking["forms"].items())
                  + (" (the rest below one draw in " + str(args.propagate) + ")" if len(stacking["forms"]) <
                     len(stacking["laws"]) * len(stacking["acceptance_models"]) else "")
                  + ". P(best), the T bands and the predicted best are the mixture's; N*, alpha and the curve are "
                  f"the highest-weight form's ({forms[0].name})."
                  + (" Prospective: forms and weights chosen again by each fit without a size." if "prospective"
                     in scores else "") + "\n")
    print(table)
    write_text(os.path.join(out, "closure.md"), table)
    write_json(os.path.join(out, "closure.json"), dict(
        command="python -m experiments.closure " + " ".join(argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), seed=args.seed,
        versions=versions(), data={k: dict(path=v, sha256=t.sha256) for (k, v), t in zip(
            paths.items(), (runs, pairs, speculative))},
        law_family=family.name, acceptance_model=model.name, stacking=stacking,
        prospective_fits=prospective_weights, failed_diagnostics=failed,
        loss_law={k: float(v) for k, v in law._asdict().items()},
        plane={k: float(v) for k, v in plane._asdict().items()}, plane_r_squared=point.plane_r_squared,
        diagnostics=diagnostics, forecast_scores=scores if draws is not None else None,
        prospective_skipped=prospective_skipped,
        bands="posterior-predictive (residuals of log loss and alpha drawn per candidate)"
        if draws is not None and scales is not None else ("law mean and plane only" if draws is not None else None),
        targets=records))
    if not args.no_figure:
        figure(records, os.path.join(out, "closure.png"))
    log(f"wrote {out}/closure.json, closure.md" + ("" if args.no_figure else ", closure.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
