"""The wall-clock closure: a latency model ``t(N, k)`` fitted from per-call timings predicts each
measured speculative run's speedup at its measured alpha, with bands from alpha's and the latency
fit's uncertainty; per target, the predicted fastest (draft, gamma) against the measured one.
``python -m experiments.wallclock --help`` describes the study.
"""

from __future__ import annotations

import numpy as np

from sdsl_jax.data import DataError
from sdsl_jax.latency import held_out_tokens_for

__all__ = [
    "choose_form",
    "close_wallclock",
    "wallclock_markdown",
    "wallclock_figure",
]


def choose_form(latency, batch: int, form: str) -> tuple[str, dict, tuple[int, ...]]:
    """The form to use (``auto``: the best on held-out token counts), every form's errors, and the
    token counts held out (chosen from those timed)."""
    from sdsl_jax.latency import select_form

    calls = latency.of_kind("call")
    rows = calls.select(calls.batch == batch)
    held = held_out_tokens_for(rows.tokens)
    best, scores = select_form(rows.n_params, rows.tokens, rows.seconds_median, held_out_tokens=held)
    return (best if form == "auto" else form), scores, held


def _alpha_draws(spec, i: int, count: int, rng) -> np.ndarray:
    gamma = int(spec.gamma[i])
    histogram = spec.histogram[i]
    if histogram:
        full = int(histogram.split(";")[gamma])
        rejections = int(spec.iterations[i]) - full
    else:  # without the histogram: rejections implied by the MLE
        rejections = int(round(spec.accepted[i] * (1 - spec.alpha_mle[i]) / max(spec.alpha_mle[i], 1e-12)))
    return rng.beta(spec.accepted[i] + 1, rejections + 1, size=count)


def close_wallclock(spec, latency, *, batch: int = 1, form: str = "auto", draws: int = 2000, seed: int = 0) -> dict:
    """Predicted vs measured wall-clock speedups; returns the JSON-ready record."""
    from sdsl_jax.latency import cost_from_coef, fit_latency_table, fit_measured_latency, latency_cost_draws

    if not np.any(np.isfinite(spec.wallclock_speedup)):
        raise DataError(spec.path, None, "wallclock_speedup", "is empty in every row: nothing to close against")
    form, scores, held = choose_form(latency, batch, form)
    fit = fit_latency_table(latency, batch=batch, form=form)
    costs = dict(law=fit.cost, calls_only=cost_from_coef(fit.coef), draws=latency_cost_draws(fit, count=draws, seed=seed),
                 per_model=fit_measured_latency(latency, batch=batch))  # per_model: each timed model's own calls
    rng = np.random.default_rng(seed)
    runs = [_run_record(spec, i, costs, _alpha_draws(spec, i, draws, rng)) for i in range(len(spec))]
    targets = [_target_record(target, [r for r in runs if r["target"] == target], fit.cost)
               for target in sorted(set(spec.target), key=lambda t: spec.n_target[spec.target.index(t)])]
    for r in runs:
        del r["_draws"], r["_draws_per_model"]
    per_model = costs["per_model"]
    return dict(batch=batch, form=form, forms=scores, held_out_tokens=list(held),
                latency_coef=fit.coef, latency_relative_rmse=fit.relative_rmse, loop_overheads=fit.overheads,
                **_calls_only_errors(runs),
                per_model_latency=dict(n_params=np.exp(per_model.log_n).tolist(), fixed=np.asarray(per_model.fixed).tolist(),
                                       per_position=np.asarray(per_model.per_position).tolist(),
                                       iteration=float(per_model.iteration),
                                       draft_step=float(per_model.draft_step_overhead), alone=float(per_model.alone)),
                runs=runs, targets=targets, summary=_summary(runs, targets))


def _speedup(cost, alpha, gamma, n, m) -> np.ndarray:
    """Speculative decoding's speedup over the target alone under ``cost`` (in seconds)."""
    from sdsl_jax import target_alone_cost, throughput_under

    return np.asarray(throughput_under(cost, alpha, gamma, n, m) * target_alone_cost(cost, m))


def _run_record(spec, i: int, costs: dict, alpha_draws: np.ndarray) -> dict:
    """One (target, draft, gamma) run: measured speedup against the law's (with its band over the
    latency fit and alpha), the calls-only and the per-model predictions, and the seconds of one
    loop iteration and one target-alone token, measured and summed from the timed calls (where a
    miss comes from). ``_draws*`` are dropped before writing."""
    from sdsl_jax import target_alone_cost

    gamma, n, m = float(spec.gamma[i]), float(spec.n_draft[i]), float(spec.n_target[i])
    alpha = float(spec.alpha_mle[i])
    law, per_model = costs["law"], costs["per_model"]
    band = _speedup(costs["draws"], alpha_draws, gamma, n, m)
    band_per_model = _speedup(per_model, alpha_draws, gamma, n, m)  # alpha's uncertainty only
    return dict(iteration_seconds_measured=float(spec.tau[i] / spec.tokens_per_second[i]),
                iteration_seconds_predicted=float(gamma * law.draft_step(n) + law.verification(m, gamma + 1)),
                alone_seconds_measured=float(1.0 / spec.target_alone_tokens_per_second[i]),
                alone_seconds_predicted=float(target_alone_cost(law, m)),
                predicted_speedup_calls_only=float(_speedup(costs["calls_only"], alpha, gamma, n, m)),
                target=spec.target[i], draft=spec.draft[i], n_target=m, n_draft=n, gamma=int(gamma),
                alpha_mle=alpha, measured_speedup=float(spec.wallclock_speedup[i]),
                measured_seconds_iqr_over_median=float(spec.seconds_iqr[i] / spec.seconds_median[i]),
                predicted_speedup=float(_speedup(law, alpha, gamma, n, m)),
                predicted_band=[float(q) for q in np.quantile(band, [0.05, 0.95])], _draws=band,
                predicted_speedup_per_model=float(_speedup(per_model, alpha, gamma, n, m)),
                predicted_band_per_model=[float(q) for q in np.quantile(band_per_model, [0.05, 0.95])],
                _draws_per_model=band_per_model)


def _target_record(target: str, mine: list[dict], cost) -> dict:
    """One target: the law's pick against the measured fastest (and the per-model cost's pick),
    regret, P(measured fastest) over the draws, and gamma* per draft."""
    from sdsl_jax import best_lookahead, target_alone_cost

    measured = max(mine, key=lambda r: r["measured_speedup"])
    predicted = max(mine, key=lambda r: r["predicted_speedup"])
    winners = np.argmax(np.stack([r["_draws"] for r in mine]), axis=0)
    gammas = sorted({r["gamma"] for r in mine})
    drafts = []
    for draft in sorted({r["draft"] for r in mine}, key=lambda d: next(r["n_draft"] for r in mine if r["draft"] == d)):
        rows_d = [r for r in mine if r["draft"] == draft]
        alpha = float(np.average([r["alpha_mle"] for r in rows_d]))
        best = best_lookahead(cost, alpha, rows_d[0]["n_draft"], rows_d[0]["n_target"])
        g = float(best.gamma)
        drafts.append(dict(draft=draft, n_draft=rows_d[0]["n_draft"], alpha_mle_mean=alpha, gamma_star=g,
                           speedup_at_gamma_star=float(best.throughput * target_alone_cost(cost, rows_d[0]["n_target"])),
                           gamma_star_outside_grid=bool(g > max(gammas) or g < min(gammas))))
    chosen = max(mine, key=lambda r: r["predicted_speedup_per_model"])
    winners_per_model = np.argmax(np.stack([r["_draws_per_model"] for r in mine]), axis=0)
    return dict(
        target=target, n_target=mine[0]["n_target"],
        # The same choice from each timed model's own calls (MeasuredLatency) instead of the law t(N, k).
        per_model=dict(draft=chosen["draft"], gamma=chosen["gamma"],
                       predicted_speedup=chosen["predicted_speedup_per_model"],
                       band=chosen["predicted_band_per_model"], measured_speedup=chosen["measured_speedup"],
                       picked_measured_fastest=chosen is measured,
                       regret=1.0 - chosen["measured_speedup"] / measured["measured_speedup"],
                       best_speedup_relative_error=chosen["predicted_speedup_per_model"]
                       / measured["measured_speedup"] - 1.0,
                       p_measured_fastest=float(np.mean(winners_per_model == mine.index(measured)))),
        measured_fastest=dict(draft=measured["draft"], gamma=measured["gamma"], speedup=measured["measured_speedup"]),
        predicted_fastest=dict(draft=predicted["draft"], gamma=predicted["gamma"],
                               predicted_speedup=predicted["predicted_speedup"],
                               band=predicted["predicted_band"], measured_speedup=predicted["measured_speedup"]),
        picked_measured_fastest=predicted is measured,
        regret=1.0 - predicted["measured_speedup"] / measured["measured_speedup"],
        best_speedup_relative_error=predicted["predicted_speedup"] / measured["measured_speedup"] - 1.0,
        p_measured_fastest=float(np.mean(winners == mine.index(measured))),
        measured_fastest_inside_band=bool(measured["predicted_band"][0] <= measured["measured_speedup"]
                                          <= measured["predicted_band"][1]),
        drafts=drafts)


def _calls_only_errors(runs: list[dict]) -> dict:
    rel_calls = np.array([r["predicted_speedup_calls_only"] / r["measured_speedup"] - 1 for r in runs])
    return dict(calls_only_relative_error_median=float(np.median(rel_calls)),
                calls_only_relative_error_rms=float(np.sqrt(np.mean(rel_calls**2))))


def _summary(runs: list[dict], targets: list[dict]) -> dict:
    rel_table = np.array([r["predicted_speedup_per_model"] / r["measured_speedup"] - 1 for r in runs])
    iteration_ratio = np.array([r["iteration_seconds_measured"] / r["iteration_seconds_predicted"] for r in runs])
    alone_ratio = np.array([r["alone_seconds_measured"] / r["alone_seconds_predicted"] for r in runs])
    inside = np.mean([r["predicted_band"][0] <= r["measured_speedup"] <= r["predicted_band"][1] for r in runs])
    rel = np.array([r["predicted_speedup"] / r["measured_speedup"] - 1 for r in runs])
    return dict(picked_within_5_percent=int(sum(t["regret"] <= 0.05 for t in targets)),
                picked_exactly=int(sum(t["picked_measured_fastest"] for t in targets)),
                best_speedup_within_15_percent=int(sum(abs(t["best_speedup_relative_error"]) <= 0.15 for t in targets)),
                targets=len(targets), run_band_coverage_90=float(inside),
                run_relative_error_median=float(np.median(rel)),
                run_relative_error_rms=float(np.sqrt(np.mean(rel**2))),
                iteration_over_calls=[float(q) for q in np.quantile(iteration_ratio, [0.0, 0.5, 1.0])],
                alone_over_call=[float(q) for q in np.quantile(alone_ratio, [0.0, 0.5, 1.0])],
                per_model=dict(
                    picked_exactly=int(sum(t["per_model"]["picked_measured_fastest"] for t in targets)),
                    picked_within_5_percent=int(sum(t["per_model"]["regret"] <= 0.05 for t in targets)),
                    best_speedup_within_15_percent=int(sum(
                        abs(t["per_model"]["best_speedup_relative_error"]) <= 0.15 for t in targets)),
                    run_relative_error_median=float(np.median(rel_table)),
                    run_relative_error_rms=float(np.sqrt(np.mean(rel_table**2)))))


def wallclock_markdown(record: dict) -> str:
    """wallclock.md: per target the measured and the predicted fastest (draft, gamma), regret, errors, gamma*."""
    from sdsl_jax.figures import format_size

    overheads = record["loop_overheads"]
    lines = [("Loop overheads fitted from timed decoding loops: " + ", ".join(
        f"{k} {v * 1e6:.0f} us" for k, v in overheads.items()) + ". " if overheads else
              "No loop timings in latency.csv: calls only. ") +
             f"Latency form: `{record['form']}` (batch {record['batch']}); held-out error on k = "
             + ", ".join(map(str, record["held_out_tokens"])) + ": " + ", ".join(
                 f"{name} {s['held_out']['relative_rmse']:.1%}" for name, s in record["forms"].items()) + ".",
             "",
             "| target (M) | measured fastest (gamma): speedup | predicted fastest (gamma): predicted [90%] / measured "
             "| regret | best speedup error | P(measured fastest) | gamma* per draft (outside grid: *) |",
             "|---|---|---|---|---|---|---|"]
    for t in record["targets"]:
        mf, pf = t["measured_fastest"], t["predicted_fastest"]
        gammas = ", ".join(f"{d['draft']} {d['gamma_star']:.1f}{'*' if d['gamma_star_outside_grid'] else ''}"
                           for d in t["drafts"])
        lines.append(f"| {t['target']} ({format_size(t['n_target'])}) | {mf['draft']} ({mf['gamma']}): "
                     f"x{mf['speedup']:.2f} | {pf['draft']} ({pf['gamma']}): x{pf['predicted_speedup']:.2f} "
                     f"[{pf['band'][0]:.2f}, {pf['band'][1]:.2f}] / x{pf['measured_speedup']:.2f} | "
                     f"{t['regret']:.1%} | {t['best_speedup_relative_error']:+.1%} | {t['p_measured_fastest']:.2f} | "
                     f"{gammas} |")
    lines += ["", "The same choice from each timed model's own calls (`MeasuredLatency`: a line in k per model, "
              "no law in N; band: alpha's uncertainty only):", "",
              "| target (M) | measured fastest (gamma): speedup | chosen (gamma): predicted [90%] / measured | regret | "
              "best speedup error | P(measured fastest) |", "|---|---|---|---|---|---|"]
    for t in record["targets"]:
        mf, pm = t["measured_fastest"], t["per_model"]
        lines.append(f"| {t['target']} ({format_size(t['n_target'])}) | {mf['draft']} ({mf['gamma']}): "
                     f"x{mf['speedup']:.2f} | {pm['draft']} ({pm['gamma']}): x{pm['predicted_speedup']:.2f} "
                     f"[{pm['band'][0]:.2f}, {pm['band'][1]:.2f}] / x{pm['measured_speedup']:.2f} | "
                     f"{pm['regret']:.1%} | {pm['best_speedup_relative_error']:+.1%} | {pm['p_measured_fastest']:.2f} |")
    s = record["summary"]
    sp = s["per_model"]
    lines += ["", f"Per-model timings: picked the measured fastest for {sp['picked_exactly']} of {s['targets']} targets, "
              f"within 5% of it for {sp['picked_within_5_percent']}; best speedup within 15% for "
              f"{sp['best_speedup_within_15_percent']}; over all runs median error {sp['run_relative_error_median']:+.1%}, "
              f"RMS {sp['run_relative_error_rms']:.1%}."]
    lines += ["", f"Law t(N, k): picked the measured fastest for {s['picked_exactly']} of {s['targets']} targets, within 5% of it "
              f"for {s['picked_within_5_percent']}; best speedup within 15% for "
              f"{s['best_speedup_within_15_percent']} of {s['targets']}. Over all {len(record['runs'])} runs: median "
              f"error {s['run_relative_error_median']:+.1%}, RMS {s['run_relative_error_rms']:.1%}, 90% bands cover "
              f"{s['run_band_coverage_90']:.0%} of the measured speedups.",
              f"The calls alone (without the loops' overheads) give median error "
              f"{record['calls_only_relative_error_median']:+.1%}, RMS {record['calls_only_relative_error_rms']:.1%}.",
              "",
              "Against the model used above, a measured speculative iteration takes {:.2f}x (min {:.2f}, max {:.2f}) "
              "its prediction, a target-alone token {:.2f}x (min {:.2f}, max {:.2f}).".format(s["iteration_over_calls"][1], s["iteration_over_calls"][0],
                                         s["iteration_over_calls"][2], s["alone_over_call"][1], s["alone_over_call"][0],
                                         s["alone_over_call"][2]), ""]
    return "\n".join(lines)


def wallclock_figure(record: dict, path: str, caption: str) -> str:
    """Predicted against measured speedup of every run, and the best (draft, gamma) per target."""
    from matplotlib.figure import Figure

    from sdsl_jax.figures import save_figure

    fig = Figure(figsize=(11, 4.4))
    ax, bx = fig.subplots(1, 2, gridspec_kw=dict(wspace=0.3))
    names = [t["target"] for t in record["targets"]]
    for j, name in enumerate(names):
        rows = [r for r in record["runs"] if r["target"] == name]
        x = np.array([r["measured_speedup"] for r in rows])
        y = np.array([r["predicted_speedup"] for r in rows])
        band = np.array([r["predicted_band"] for r in rows])
        ax.errorbar(x, y, yerr=[y - band[:, 0], band[:, 1] - y], fmt="o", ms=3, lw=0.6, color=f"C{j}",
                    label=name.split("@")[0])
    lim = [0.3, max(2.0, max(r["measured_speedup"] for r in record["runs"]) * 1.1)]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.axhline(1, color="0.6", lw=0.6, ls=":")
    ax.axvline(1, color="0.6", lw=0.6, ls=":")
    ax.set(xlabel="measured wall-clock speedup", ylabel="predicted (latency model at measured alpha)",
           title="Every (target, draft, gamma) run", xlim=lim, ylim=lim)
    ax.legend(fontsize=7, title="target", title_fontsize=7)
    i = np.arange(len(names))
    bx.bar(i - 0.2, [t["measured_fastest"]["speedup"] for t in record["targets"]], 0.4, label="measured fastest")
    pf = [t["predicted_fastest"] for t in record["targets"]]
    bx.bar(i + 0.2, [p["predicted_speedup"] for p in pf], 0.4, label="predicted fastest (prediction)",
           yerr=[[p["predicted_speedup"] - p["band"][0] for p in pf], [p["band"][1] - p["predicted_speedup"] for p in pf]])
    bx.plot(i + 0.2, [p["measured_speedup"] for p in pf], "kx", label="predicted fastest, measured")
    bx.axhline(1, color="0.6", lw=0.8, ls=":")
    bx.set_xticks(i, [n.split("@")[0] for n in names])
    bx.set(ylabel="speedup over the target alone", title="Best (draft, gamma) per target")
    bx.legend(fontsize=7)
    return save_figure(fig, path, caption)
