"""The loop closed on measured models: for every target, the law's predicted best draft, alpha, T and N*
against the measured ones, with the measured side's own uncertainty (a bootstrap over prompts) and
the forecast scored (log score, Brier, credible sets).
"""

from __future__ import annotations

import numpy as np

from sdsl_jax import SDSL_FLOPS, TokensPerParameter, best_lookahead, draft_throughput, solve_draft_size
from sdsl_jax.data import SpeculativeRuns
from sdsl_jax.speculative import optimal_integer_lookahead, throughput

__all__ = [
    "expected_speculative_runs",
    "measured_perplexities",
    "run_label_of",
    "candidate_labels",
    "close_loop",
    "posterior_forecast",
    "n_star_draws",
    "n_star_fields",
    "measured_best_bootstrap",
    "forecast_scores",
    "outside_band",
    "decision_fields",
    "baseline_scores",
    "closure_scores",
    "failed_diagnostics",
]


def expected_speculative_runs(pairs) -> SpeculativeRuns:
    """The measured side of a closure from an acceptance table instead of speculative runs.

    For every pair whose draft is at its size's top budget (the largest ``d_draft`` of that size),
    one row at the best integer lookahead, with the tokens per FLOP under the SDSL cost that the
    pair's acceptance rate gives under i.i.d. acceptance [Leviathan et al. 2023, eq. 1]:
    ``T = (1 - alpha^(gamma+1)) / ((1 - alpha)(2 N gamma + 2 M))``. With exact rates (alpha =
    1 - E[TV] over held-out text, as the factorial ladder measures them) it is what speculative
    runs measure in expectation, without their sampling noise over prompts; it has no prompts,
    iterations or timing (NaN), so a closure on it has no bootstrap over prompts and no wall-clock
    column.
    """
    alpha = np.asarray(pairs.alpha, np.float64)
    n_draft, d_draft = np.asarray(pairs.n_draft, np.float64), np.asarray(pairs.d_draft, np.float64)
    top = {n: d_draft[n_draft == n].max() for n in np.unique(n_draft)}
    rows = [i for i in range(alpha.size) if d_draft[i] == top[n_draft[i]]]
    if not rows:
        raise ValueError("no acceptance pair to build the measured side from")
    pick = lambda column: np.asarray(column, np.float64)[rows]  # noqa: E731
    gamma = np.asarray(optimal_integer_lookahead(pick(alpha), pick(n_draft), pick(pairs.n_target)))
    tokens_per_flop = np.asarray(throughput(pick(alpha), gamma, pick(n_draft), pick(pairs.n_target)))
    nan = np.full(len(rows), np.nan)
    return SpeculativeRuns(
        target=tuple(pairs.target[i] for i in rows), draft=tuple(pairs.draft[i] for i in rows),
        n_target=pick(pairs.n_target), n_draft=pick(n_draft), d_target=pick(pairs.d_target), d_draft=pick(d_draft),
        gamma=gamma, prompts=nan, new_tokens=nan, iterations=nan, accepted=nan,
        alpha_mle=pick(alpha), accepted_over_drafted=nan, tau=nan, histogram=(None,) * len(rows), draft_calls=nan,
        target_calls=nan, tokens_per_flop_sdsl=tokens_per_flop,
        predicted_tokens_per_flop_sdsl=nan, target_alone_tokens_per_flop_sdsl=np.array(
            [1 / SDSL_FLOPS.verification(float(pairs.n_target[i]), 1) for i in rows]),
        tokens_per_flop_xla=nan, target_alone_tokens_per_flop_xla=nan, seconds_median=nan, seconds_iqr=nan,
        tokens_per_second=nan, target_alone_tokens_per_second=nan, wallclock_speedup=nan, repeats=nan,
        path=pairs.path, sha256=pairs.sha256)


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
    (:class:`sdsl_jax.predict.draws.CandidateLabels`): their runs and acceptance-model labels, None
    where the data do not hold them (a new model)."""
    from sdsl_jax import predict

    drafts_in, targets_in = (set(pairs.draft), set(pairs.target)) if pairs is not None else (set(), set())
    return predict.CandidateLabels(
        draft_runs=tuple(run_label_of(runs, float(a), float(b)) for a, b in zip(n, d)),
        target_run=run_label_of(runs, m, d_target),
        draft_models=tuple(dr if dr in drafts_in else None for dr in drafts),
        target_model=target if target in targets_in else None)


def close_loop(speculative: SpeculativeRuns, point, *, draws=None, scales=None,
               perplexities: dict[str, float] | None = None, seed: int = 0, runs=None, pairs=None) -> list[dict]:
    """One record per target: predicted vs measured best draft, N*, alpha and T*.

    ``point`` is a :class:`sdsl_jax.infer.results.PointFit`; ``draws`` the paired posterior draws
    ``(laws, planes)`` (:func:`sdsl_jax.predict.draws.paired_draws`). With ``perplexities`` (model name
    -> measured perplexity) also the acceptance-model-only prediction: T* from the acceptance model
    at the measured perplexities, bypassing L(N, D), which tells which link of the chain (loss law
    or acceptance) a miss comes from. With ``runs`` and ``pairs`` (the data of the fit, whose
    effects ``scales.known`` holds), each candidate and the target are predicted conditionally on
    their own runs and pairs where the data hold them.
    """
    from sdsl_jax import predict

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
        ranking = predict.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=m, d_target=d_prime, draws=draws,
                                       scales=scales, labels=labels, seed=seed)
        pred_idx = ranking.best
        best_measured = int(np.argmax(measured_t))
        timed = [i for i in rows if np.isfinite(spec.wallclock_speedup[i])]
        fastest = max(timed, key=lambda i: spec.wallclock_speedup[i]) if timed else None
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
            fastest_wallclock=None if fastest is None else spec.draft[fastest],
            fastest_wallclock_gamma=None if fastest is None else int(spec.gamma[fastest]),
            fastest_wallclock_speedup=None if fastest is None else float(spec.wallclock_speedup[fastest]),
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
            rec.update(decision_fields(ranking.decision, drafts, measured_t))
            rec.update(posterior_forecast(point, ranking, draws, scales, n=n, d=d, m=m, d_target=d_prime,
                                           d_ref=d_ref, rho=rho, n_star_recipe=float(along.n_star), seed=seed))
        # The law's curve at D_ref, reaching down past N* and its band for the figure.
        low = min([n.min() / 4] + [v / 2 for v in [rec["n_star"], *rec.get("n_star_band", [])[:1]] if np.isfinite(v)])
        grid = np.geomspace(low, m, 80)
        rec["curve_n"] = grid.tolist()
        rec["curve_tokens_per_flop"] = np.asarray(
            draft_throughput(grid, m, d_draft=d_ref, d_target=d_prime, loss=law, plane=plane)).tolist()
        out.append(rec)
    return out


def posterior_forecast(point, ranking, draws, scales, *, n, d, m: float, d_target: float, d_ref: float, rho: float,
                        n_star_recipe: float, seed: int) -> dict:
    """A target's forecast from the draws: P(best) (and without the residual terms), the T bands,
    and posterior-predictive N* bands at ``d_ref`` and along D = rho N, as in the fit CLI."""
    from sdsl_jax import predict

    rec = dict(p_best=ranking.p_best.tolist())
    if scales is not None:  # the same draws without the residuals: what the bands were before
        mean_only = predict.rank_drafts(point, n_drafts=n, d_drafts=d, m_target=m, d_target=d_target, draws=draws)
        rec["p_best_mean_only"] = mean_only.p_best.tolist()
    rec["predicted_tokens_per_flop_band"] = ranking.throughput_band.tolist()
    rec.update(n_star_fields(m, *n_star_draws(draws, scales, m=m, d_target=d_target, d_ref=d_ref, rho=rho,
                                              n_star_recipe=n_star_recipe, seed=seed)))
    return rec


def n_star_draws(draws, scales, *, m: float, d_target: float, d_ref: float, rho: float, n_star_recipe: float,
                 seed: int) -> tuple[tuple, tuple]:
    """One target's posterior-predictive (N*, gamma*, T*) draws, each of shape ``(draws, 1)``: at the
    draft budget ``d_ref``, and along D = rho N (a new draft's offset drawn at ``rho x n_star_recipe``
    tokens). ``draws`` as :func:`sdsl_jax.predict.paired_draws`; ``scales`` None: the mean curve."""
    from sdsl_jax import predict

    laws, planes = draws
    target = np.array([m])
    fixed_planes = planes if scales is None else predict.predictive_planes(
        planes, scales, d_draft=d_ref, d_target=d_target, seed=seed)
    at_ref = predict.solve_draws(target, laws, fixed_planes, d_draft=d_ref, d_target=d_target)
    recipe_planes = planes if scales is None else predict.predictive_planes(
        planes, scales, d_draft=float(rho * n_star_recipe) if np.isfinite(n_star_recipe) else d_ref,
        d_target=d_target, seed=seed)
    along = predict.solve_draws(target, laws, recipe_planes, recipe=TokensPerParameter(rho), d_target=d_target)
    return at_ref, along


def n_star_fields(m: float, at_ref: tuple, along: tuple) -> dict:
    """A target's record of N*: the 90% band and median at the reference budget with the share of draws
    that found no optimum, and along the recipe, from :func:`n_star_draws`' draws (or a mixture's)."""
    from sdsl_jax import predict

    quantiles = (0.05, 0.5, 0.95)
    bands = predict.summarize_draws(np.array([m]), *at_ref, quantiles=quantiles)
    recipe_bands = predict.summarize_draws(np.array([m]), *along, quantiles=quantiles)
    return dict(n_star_band=np.asarray(bands.n_star)[:, 0].tolist(),
                n_star_failed_fraction=float(np.asarray(bands.failed_fraction)[0]),
                n_star_recipe_band=np.asarray(recipe_bands.n_star)[:, 0].tolist())


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


LOG_SCORE_FLOOR = 1e-3
"""Probabilities below this count as it in a log score (a forecast from 1,000 draws cannot tell smaller
ones apart, and a baseline that puts nothing on the measured best would otherwise score minus infinity)."""


def baseline_scores(records: list[dict], key: str = "p_best", *, seed: int = 0, resamples: int = 2000) -> dict | None:
    """P(best) scored beside the forecasts a lab could make without a fit, target by target.

    The baselines (:func:`sdsl_jax.forecast.baseline_forecasts`: uniform, the smallest draft, the
    previous target's measured best, a fixed M/N ratio fitted on the earlier targets) see only what
    was measured before each target (records in order of target size). Every forecast gets the log
    score (probabilities floored at :data:`LOG_SCORE_FLOOR`), the Brier score and the regret of its
    most probable draft. The skill is the method's total log score minus the best baseline's, with a
    90% interval from resampling the targets; the same over the informative targets alone (at
    least two candidates within 10% of the best measured T: elsewhere there is little to forecast).
    """
    from sdsl_jax.forecast import baseline_forecasts

    if not records or any(key not in r for r in records):
        return None
    per_target, previous_best, earlier = [], None, []
    for r in sorted(records, key=lambda rec: rec["m_target"]):
        n, t = np.asarray(r["n_drafts"], np.float64), np.asarray(r["measured_tokens_per_flop"], np.float64)
        forecasts = {"method": np.asarray(r[key], np.float64), **{
            f.name: f.p_best for f in baseline_forecasts(n, r["m_target"], previous_best=previous_best,
                                                         earlier=earlier)}}
        best = int(np.nanargmax(t))
        hit = np.zeros(len(t))
        hit[best] = 1.0
        per_target.append(dict(
            target=r["target"], informative=int(np.sum(t >= 0.9 * t[best])) >= 2,
            log_score={k: float(np.log(max(p[best], LOG_SCORE_FLOOR))) for k, p in forecasts.items()},
            brier={k: float(np.sum((p - hit) ** 2)) for k, p in forecasts.items()},
            regret={k: float(1.0 - t[int(np.argmax(p))] / t[best]) for k, p in forecasts.items()}))
        previous_best = float(n[best])
        earlier.append((float(r["m_target"]), previous_best))
    names = list(per_target[0]["log_score"])
    rng = np.random.default_rng(seed)

    def totals(rows: list[dict]) -> dict | None:
        if not rows:
            return None
        log = {k: np.array([row["log_score"][k] for row in rows]) for k in names}
        best_baseline = max((k for k in names if k != "method"), key=lambda k: log[k].sum())
        diff = log["method"] - log[best_baseline]
        boot = diff[rng.integers(0, len(rows), (resamples, len(rows)))].sum(axis=1)
        return dict(targets=[row["target"] for row in rows],
                    forecasts={k: dict(log_score=float(log[k].sum()),
                                       brier=float(np.mean([row["brier"][k] for row in rows])),
                                       regret=float(np.mean([row["regret"][k] for row in rows]))) for k in names},
                    best_baseline=best_baseline, skill=float(diff.sum()),
                    skill_90=[float(q) for q in np.quantile(boot, [0.05, 0.95])])

    return dict(all=totals(per_target), informative=totals([row for row in per_target if row["informative"]]),
                floor=LOG_SCORE_FLOOR,
                meaning="log score (floored), Brier and regret of the method's P(best) and of each baseline; skill: "
                        "the method's log score minus the best baseline's, 90% interval over resampled targets")


def outside_band(value: float, band) -> bool:
    """Whether a finite point lies outside a finite ``[lo, median, hi]`` band (False without one)."""
    if band is None or not np.isfinite(value) or not np.all(np.isfinite([band[0], band[2]])):
        return False
    return not band[0] <= value <= band[2]


def decision_fields(decision, drafts: list[str], measured: np.ndarray, *, prefix: str = "") -> dict:
    """A record's fields for the Bayes decision (:func:`sdsl_jax.forecast.bayes_decision`: the candidate
    with the highest posterior-expected T): the draft, its P(best), its expected regret and its regret
    against the ``measured`` T; keys start with ``prefix``."""
    measured = np.asarray(measured, np.float64)
    return {f"{prefix}bayes_decision": drafts[decision.choice],
            f"{prefix}bayes_decision_p_best": float(decision.p_best[decision.choice]),
            f"{prefix}bayes_decision_expected_regret": decision.expected_regret,
            f"{prefix}bayes_decision_regret": float(1.0 - measured[decision.choice] / measured.max())}


def closure_scores(records) -> dict:
    """Every forecast the records hold, scored: in sample (predictive, and the mean curve only),
    prospective (each draft's size left out) and forward (each target fitted on what came before it;
    over the targets that have a forward fit), each with its baselines and decision regrets."""
    forward = [r for r in records if "forward_p_best" in r]
    scores = {k: forecast_scores(records, key) for k, key in (("predictive", "p_best"),
                                                               ("mean_only", "p_best_mean_only"),
                                                               ("prospective", "prospective_p_best"))}
    scores["forward"] = forecast_scores(forward, "forward_p_best")
    scores = {k: v for k, v in scores.items() if v is not None}
    if "forward" in scores:
        scores["forward"].update(
            baselines=baseline_scores(forward, "forward_p_best"),
            bayes_decision_regret=[r["forward_bayes_decision_regret"] for r in forward],
            regret=[r["forward_regret"] for r in forward], targets_scored=[r["target"] for r in forward],
            meaning="each target predicted by one fit of what came before it: the runs of it and of smaller "
                    "models, the pairs of smaller targets (the paper's plane where there were none)")
    if "mean_only" in scores:
        scores["mean_only"]["meaning"] = "the same draws without the residual terms (law mean and plane only)"
    for key, p_key in (("predictive", "p_best"), ("prospective", "prospective_p_best")):
        if key in scores:
            scores[key]["baselines"] = baseline_scores(records, p_key)
    for key, prefix in (("predictive", ""), ("prospective", "prospective_")):
        if key in scores and all(f"{prefix}bayes_decision_regret" in r for r in records):
            scores[key]["bayes_decision_regret"] = [r[f"{prefix}bayes_decision_regret"] for r in records]
    if "prospective" in scores:
        scores["prospective"]["regret"] = [r["prospective_regret"] for r in records]
        scores["prospective"]["meaning"] = ("each draft predicted by fits that left its own size out (loss law and "
                                            "acceptance)")
    return scores


def failed_diagnostics(in_sample: dict, refits: dict | None, stacking: dict | None,
                       forward: dict | None = None) -> list[str]:
    """One line per posterior (in-sample, a refit without a size, or a target's forward fit) whose
    checks failed: R-hat, bulk ESS, divergences, the share of draws at the maximum tree depth and
    the median leapfrog steps per draw, and the weight its form carries in that fit."""
    def weight_of(name, forms):
        if not forms:
            return ""
        w = sum(v for k, v in forms.items() if name in k.split(" + "))
        return f", weight {w:.2f}"

    out = []
    fits = [("all data", in_sample, None if stacking is None else stacking["forms"])]
    fits += [(f"without N = {size}", r.get("diagnostics", {}), r.get("forms")) for size, r in (refits or {}).items()]
    fits += [(f"forward fit for {target}", r.get("diagnostics", {}), r.get("forms"))
             for target, r in (forward or {}).items()]
    def steps(d):
        # Older records lack the step counts; a share at the cap is a failed check of its own.
        share, median = d.get("max_tree_depth_share"), d.get("median_steps")
        if share is None or median is None:
            return ""
        return f", {100 * share:.0f}% at the tree-depth cap, median {median:.0f} steps"

    for where, diagnostics, forms in fits:
        for name, d in diagnostics.items():
            if not d["ok"]:
                out.append(f"{where}: {name} (R-hat {d['max_rhat']:.3f}, ESS {d['min_ess_bulk']:.0f}, "
                           f"{d['num_divergences']} divergent{steps(d)}{weight_of(name, forms)})")
    return out
