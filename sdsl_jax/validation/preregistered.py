"""A prediction registered before its models exist, and its score once they do.

:func:`forecast_target` makes one target's registered forecast (P(best), the Bayes decision, T and
alpha with 90% bands per candidate, N* with its band, the baselines' forecasts); :func:`score`
scores a registered prediction, as it stands, against measurements that include its held-back
models; :func:`prediction_markdown` and :func:`score_markdown` write them for reading.
``python -m experiments.preregister`` is the command.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "measured_throughput",
    "ForecastContext",
    "forecast_target",
    "score",
    "prediction_markdown",
    "score_markdown",
]


def _quantiles(x: np.ndarray) -> list[float]:
    with np.errstate(all="ignore"):
        return [float(v) for v in np.nanquantile(x, [0.05, 0.5, 0.95], axis=0)] if np.isfinite(x).any() else [None] * 3


def measured_throughput(pairs, top: dict[str, float]) -> dict[tuple[str, str], dict]:
    """T at the best integer lookahead from each pair's exact alpha, for pairs of top-budget models
    (``top``: each rung's top budget in tokens; models are named ``<rung>@<steps>``)."""
    from sdsl_jax import SDSL_FLOPS, best_lookahead

    out = {}
    for i in range(len(pairs.alpha)):
        draft, target = pairs.draft[i].split("@")[0], pairs.target[i].split("@")[0]
        if np.isclose(pairs.d_draft[i], top.get(draft, np.nan)) and np.isclose(pairs.d_target[i], top.get(target, np.nan)):
            best = best_lookahead(SDSL_FLOPS, float(pairs.alpha[i]), float(pairs.n_draft[i]), float(pairs.n_target[i]))
            out[draft, target] = dict(alpha=float(pairs.alpha[i]), throughput=float(best.throughput))
    return out


class ForecastContext(NamedTuple):
    """What every target's forecast shares: the rungs' sizes and top budgets, the held-back names, the
    fit and its predictive draws, the data (runs; measured T per (draft, target) pair) and the
    models' labels at the top budget."""

    sizes: dict
    top: dict
    held_back: set
    point: Any
    draws: tuple
    scales: Any
    runs: Any
    measured: dict
    top_drafts: dict
    top_targets: dict
    seed: int


def forecast_target(t_name: str, ctx: ForecastContext, *, previous_best: float | None, earlier: list) -> dict:
    """One target's registered forecast: per candidate P(best), expected and point T with 90% bands,
    alpha with its band; the Bayes decision; the point fit's pick; N* with its band on the target's
    budget; the baselines' forecasts; and the pairs already measured in the data."""
    from sdsl_jax.validation.closure import run_label_of
    from sdsl_jax import predict
    from sdsl_jax.forecast import baseline_forecasts, bayes_decision

    sizes, top = ctx.sizes, ctx.top
    m, d_top = sizes[t_name], top[t_name]
    cands = [c for c in sorted(sizes, key=sizes.get) if sizes[c] < m]
    n = np.array([sizes[c] for c in cands])
    d = np.array([top[c] for c in cands])
    labels = predict.CandidateLabels(
        draft_runs=tuple(run_label_of(ctx.runs, float(v), float(dv)) for v, dv in zip(n, d)),
        target_run=run_label_of(ctx.runs, m, d_top),
        draft_models=tuple(ctx.top_drafts.get(c) for c in cands), target_model=ctx.top_targets.get(t_name))
    kw = dict(n_drafts=n, d_drafts=d, m_target=m, d_target=d_top, scales=ctx.scales, labels=labels, seed=ctx.seed)
    t_draws = predict.throughput_draws(ctx.draws, **kw)
    alpha_draws = predict.acceptance_draws(ctx.draws, **kw)
    decision = bayes_decision(t_draws)
    ranking = predict.rank_drafts(ctx.point, draws=ctx.draws, **kw)
    laws, planes = ctx.draws
    n_star = predict.propagate_draft_size(
        np.array([m]), laws, predict.predictive_planes(planes, ctx.scales, d_draft=d_top, d_target=d_top,
                                                       seed=ctx.seed),
        d_draft=d_top, d_target=d_top, quantiles=(0.05, 0.5, 0.95))  # N* for drafts on the target's budget
    baselines = baseline_forecasts(n, m, previous_best=previous_best, earlier=earlier)
    t_measured = [ctx.measured.get((c, t_name), {}).get("throughput") for c in cands]
    return dict(
        target=t_name, m_target=m, d_target=d_top, held_back_target=t_name in ctx.held_back,
        candidates=[dict(name=c, n_params=sizes[c], d_tokens=top[c], held_back=c in ctx.held_back,
                         p_best=float(decision.p_best[j]), expected_tokens_per_flop=float(decision.expected_throughput[j]),
                         tokens_per_flop_point=float(ranking.throughput[j]),
                         tokens_per_flop_90=_quantiles(t_draws[:, j]), alpha_point=float(ranking.alpha[j]),
                         alpha_90=_quantiles(alpha_draws[:, j]),
                         inadmissible_share=float(np.mean(~np.isfinite(t_draws[:, j]))))
                    for j, c in enumerate(cands)],
        bayes_decision=dict(draft=cands[decision.choice], p_best=float(decision.p_best[decision.choice]),
                            expected_regret=decision.expected_regret),
        point_fit_best=cands[ranking.best] if ranking.best is not None else None,
        n_star_90=[float(v) for v in np.asarray(n_star.n_star)[:, 0]],
        n_star_failed_fraction=float(np.asarray(n_star.failed_fraction)[0]),
        baselines={f.name: dict(p_best=f.p_best.tolist(), rule=f.rule) for f in baselines},
        measured_in_data={c: v for c, v in zip(cands, t_measured) if v is not None})


def prediction_markdown(record: dict) -> str:
    """predictions.md: per target the Bayes decision, N* with its band, and per candidate P(best), T and
    alpha with their bands beside the baselines' P(best)."""
    lines = ["# Preregistered prediction: the factorial ladder's held-back models", "",
             f"Made by `{record['command']}` at commit `{record['commit']}` on {record['date']}, before any "
             "held-back model was trained. Held back: "
             + ", ".join(f"{h['name']} ({h['n_params']:,} parameters: {h['role']})" for h in record["held_back"]) + ".",
             "", "Posterior diagnostics: " + "; ".join(
                 f"{k} {'OK' if v['ok'] else 'FAILED (' + ', '.join(v['problems']) + ')'}"
                 for k, v in record["diagnostics"].items()), ""]
    for t in record["targets"]:
        lines += [f"## Target {t['target']} (M = {t['m_target']:,.0f}{', held back' if t['held_back_target'] else ''})",
                  "", f"Bayes decision: **{t['bayes_decision']['draft']}** (P(best) {t['bayes_decision']['p_best']:.2f}, "
                  f"expected regret {t['bayes_decision']['expected_regret']:.3f}); N* 90% "
                  f"[{t['n_star_90'][0]:,.0f}, {t['n_star_90'][2]:,.0f}] (median {t['n_star_90'][1]:,.0f}).", "",
                  "| candidate | N | P(best) | T per GFLOP, median [90%] | alpha, median [90%] | "
                  + " | ".join(t["baselines"]) + " |",
                  "|---|---|---|---|---|" + "---|" * len(t["baselines"])]
        for j, c in enumerate(t["candidates"]):
            tq, aq = c["tokens_per_flop_90"], c["alpha_90"]
            fmt_t = (f"{tq[1] * 1e9:.4g} [{tq[0] * 1e9:.4g}, {tq[2] * 1e9:.4g}]" if tq[1] is not None else "n/a")
            fmt_a = (f"{aq[1]:.3f} [{aq[0]:.3f}, {aq[2]:.3f}]" if aq[1] is not None else "n/a")
            lines.append(f"| {c['name']}{' (held back)' if c['held_back'] else ''} | {c['n_params']:,.0f} | "
                         f"{c['p_best']:.2f} | {fmt_t} | {fmt_a} | "
                         + " | ".join(f"{b['p_best'][j]:.2f}" for b in t["baselines"].values()) + " |")
        lines.append("")
    return "\n".join(lines)


def _inside(value: float, band) -> bool | None:
    if value is None or band is None or band[0] is None or band[2] is None:
        return None
    return bool(band[0] <= value <= band[2])


def score(predictions: dict, pairs) -> dict:
    """Score a registered prediction against acceptance measurements that include its held-back models.

    Args:
      predictions: the registered ``predictions.json``, as it stands.
      pairs: :class:`sdsl_jax.data.AcceptanceMeasurements` with models named ``<rung>@<steps>``.

    Returns:
      ``targets`` (one record per registered target), ``summary`` (totals over the targets that
      involve a held-back model and over the others) and ``unmeasured`` (registered pairs without a
      measurement, which are left out of the scores).
    """
    from sdsl_jax.forecast import forecast_scores

    measured = measured_throughput(pairs, predictions["data"]["top_budget_tokens"])
    held = {h["name"] for h in predictions["held_back"]}
    targets, unmeasured = [], []
    for t in predictions["targets"]:
        names = [c["name"] for c in t["candidates"]]
        new_target = t["target"] in held or any(c in held for c in names)
        pairs_scored = []
        for c in t["candidates"]:
            got = measured.get((c["name"], t["target"]))
            if got is None:
                unmeasured.append(f"{c['name']} -> {t['target']}")
                continue
            pairs_scored.append(dict(
                draft=c["name"], new=t["target"] in held or c["held_back"], alpha=got["alpha"],
                tokens_per_flop=got["throughput"], alpha_in_90=_inside(got["alpha"], c["alpha_90"]),
                tokens_per_flop_in_90=_inside(got["throughput"], c["tokens_per_flop_90"]),
                alpha_90=c["alpha_90"], tokens_per_flop_90=c["tokens_per_flop_90"]))
        record = dict(target=t["target"], m_target=t["m_target"], new=new_target, pairs=pairs_scored)
        if len(pairs_scored) == len(names):
            tm = np.array([p["tokens_per_flop"] for p in pairs_scored])
            best = int(np.argmax(tm))
            forecasts = {"method": [c["p_best"] for c in t["candidates"]],
                         **{k: v["p_best"] for k, v in t["baselines"].items()}}
            record.update(
                measured_best=names[best], measured_best_n=t["candidates"][best]["n_params"],
                bayes_decision=t["bayes_decision"]["draft"],
                bayes_decision_regret=float(1.0 - tm[names.index(t["bayes_decision"]["draft"])] / tm[best]),
                point_fit_best=t["point_fit_best"],
                point_fit_regret=(float(1.0 - tm[names.index(t["point_fit_best"])] / tm[best])
                                  if t["point_fit_best"] in names else None),
                n_star_90=t["n_star_90"],
                measured_best_vs_n_star=("inside" if _inside(t["candidates"][best]["n_params"], t["n_star_90"])
                                         else "below" if t["candidates"][best]["n_params"] < t["n_star_90"][0]
                                         else "above"),
                informative=len(names) > 1,
                scores={k: forecast_scores(p, tm)._asdict() for k, p in forecasts.items()})
        targets.append(record)

    def forecast_totals(subset):
        scored = [r for r in subset if "scores" in r]
        out = dict(targets=[r["target"] for r in scored])
        if scored:
            out["forecasts"] = {k: dict(log_score=float(sum(r["scores"][k]["log_score"] for r in scored)),
                                        brier=float(np.mean([r["scores"][k]["brier"] for r in scored])),
                                        regret=float(np.mean([r["scores"][k]["regret"] for r in scored])))
                                for k in scored[0]["scores"]}
            out["bayes_decision_regret"] = float(np.mean([r["bayes_decision_regret"] for r in scored]))
            out["measured_best_inside_n_star_90"] = int(sum(r["measured_best_vs_n_star"] == "inside" for r in scored))
        return out

    def coverage(new: bool):
        out = {}
        for kind in ("alpha", "tokens_per_flop"):
            hits = [p[f"{kind}_in_90"] for r in targets for p in r["pairs"]
                    if p["new"] == new and p[f"{kind}_in_90"] is not None]
            out[f"{kind}_coverage_90"] = dict(inside=int(sum(hits)), pairs=len(hits))
        return out

    summary = dict(held_back_forecasts=forecast_totals([r for r in targets if r["new"]]),
                   in_sample_forecasts=forecast_totals([r for r in targets if not r["new"]]),
                   held_back_pairs=coverage(True), in_sample_pairs=coverage(False))
    return dict(targets=targets, summary=summary, unmeasured=unmeasured)


def score_markdown(record: dict) -> str:
    """score.md: the scores of the method and the baselines over the held-back targets and the others,
    the coverage of the bands, and per target the measured best against the forecast."""

    def fmt_log(v):
        return "-inf" if v == -np.inf else f"{v:.3f}"

    s = record["summary"]
    lines = ["# The preregistered prediction, scored", "",
             f"Scored by `{record['command']}` at commit `{record['commit']}` on {record['date']}, against "
             f"`{record['data']['acceptance']}` (sha256 {record['data']['acceptance_sha256'][:12]}), which holds the "
             f"held-back models. The prediction: `{record['predictions']}` (sha256 {record['predictions_sha256'][:12]}), "
             f"registered at commit `{record['registered_commit']}`.", ""]
    for key, title in (("held_back_forecasts", "Targets that involve a held-back model (the test)"),
                       ("in_sample_forecasts", "The other targets (in-sample: their pairs were fitted)")):
        part = s[key]
        lines += [f"## {title}", "", f"Targets: {', '.join(part['targets']) or 'none'}.", ""]
        if "forecasts" in part:
            lines += ["| forecast | log score (sum) | Brier (mean) | regret of its most probable draft (mean) |",
                      "|---|---|---|---|"]
            lines += [f"| {k} | {fmt_log(v['log_score'])} | {v['brier']:.3f} | {100 * v['regret']:.1f}% |"
                      for k, v in part["forecasts"].items()]
            lines += ["", f"Bayes decision's regret (mean): {100 * part['bayes_decision_regret']:.1f}%. Measured best "
                      f"draft inside the 90% N* band: {part['measured_best_inside_n_star_90']} of "
                      f"{len(part['targets'])} targets.", ""]
    for key, title in (("held_back_pairs", "pairs with a held-back model"), ("in_sample_pairs", "in-sample pairs")):
        part = s[key]
        lines.append(f"Coverage of the 90% bands, {title}: alpha {part['alpha_coverage_90']['inside']}/"
                     f"{part['alpha_coverage_90']['pairs']}, T {part['tokens_per_flop_coverage_90']['inside']}/"
                     f"{part['tokens_per_flop_coverage_90']['pairs']}.")
    lines.append("")
    if record["unmeasured"]:
        lines += [f"Registered pairs without a measurement (left out): {', '.join(record['unmeasured'])}.", ""]
    lines += ["## Per target", ""]
    for t in record["targets"]:
        head = f"### {t['target']} (M = {t['m_target']:,.0f}{', involves a held-back model' if t['new'] else ''})"
        lines += [head, ""]
        if "scores" in t:
            lines += [f"Measured best: **{t['measured_best']}**; Bayes decision {t['bayes_decision']} (regret "
                      f"{100 * t['bayes_decision_regret']:.1f}%); point fit's pick {t['point_fit_best']}; measured best "
                      f"N = {t['measured_best_n']:,.0f} is {t['measured_best_vs_n_star']} the N* band "
                      f"[{t['n_star_90'][0]:,.0f}, {t['n_star_90'][2]:,.0f}]"
                      + ("" if t["informative"] else " (one candidate: nothing to forecast)") + ".", "",
                      "Log scores: " + ", ".join(f"{k} {fmt_log(v['log_score'])}" for k, v in t["scores"].items()) + ".",
                      ""]
        lines += ["| draft | alpha measured | alpha 90% band | T per GFLOP measured | T 90% band |", "|---|---|---|---|---|"]
        for p in t["pairs"]:
            a, tq = p["alpha_90"], p["tokens_per_flop_90"]
            lines.append(f"| {p['draft']}{' (new)' if p['new'] else ''} | {p['alpha']:.3f}"
                         f"{'' if p['alpha_in_90'] else ' (outside)'} | [{a[0]:.3f}, {a[2]:.3f}] | "
                         f"{p['tokens_per_flop'] * 1e9:.4g}{'' if p['tokens_per_flop_in_90'] else ' (outside)'} | "
                         f"[{tq[0] * 1e9:.4g}, {tq[2] * 1e9:.4g}] |")
        lines.append("")
    return "\n".join(lines)
