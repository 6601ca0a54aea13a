"""Wall-clock closure: does a latency model fitted from per-call timings pick the fastest (draft, gamma)?

    python -m experiments.wallclock --data fits/ladder       # fits/ladder/closure/wallclock.{json,md,png}

From ``latency.csv`` (``experiments.latency``: per-call seconds of every ladder model reading
k = 1 .. 12 positions) fit ``t(N, k)`` (``sdsl_jax.latency``; ``--form auto`` picks the form with
the smallest error on token counts held out of its fit), so that a draft step costs ``t(N, 1)``
and a verification ``t(M, gamma + 1)``. Then for every speculative run of ``speculative.csv``:

    predicted speedup = E[tokens](alpha, gamma) t(M, 1) / (gamma t(N, 1) + t(M, gamma + 1))

at the run's measured alpha (the MLE from its accepted counts), with a 90% band from the
sampling uncertainty of alpha (Beta posterior of its accepted / rejected counts) and of the
latency coefficients; against the measured wall-clock speedup (``wallclock_speedup``: tokens per
second over the target decoding alone). Per target: the predicted fastest (draft, gamma) among
the measured ones, the measured fastest, the regret (measured speedup of the predicted choice over
the best), the error on the best speedup, the probability under the bands that the measured
fastest is the fastest, and each draft's continuous gamma* (``best_lookahead``), flagged when it
lies outside the measured gamma grid.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import numpy as np

from experiments.runlog import (Log, UsageError, check_arguments, configure_jax, make_output_folder, run_command,
                               versions, write_json, write_text)
from sdsl_jax.data import DataError, load_latency, load_speculative
from sdsl_jax.latency import held_out_tokens_for



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
    from sdsl_jax import best_lookahead, expected_tokens, target_alone_cost
    from sdsl_jax.latency import cost_from_coef, fit_latency_table, fit_measured_latency, latency_cost_draws

    if not np.any(np.isfinite(spec.wallclock_speedup)):
        raise DataError(spec.path, None, "wallclock_speedup", "is empty in every row: nothing to close against")
    form, scores, held = choose_form(latency, batch, form)
    fit = fit_latency_table(latency, batch=batch, form=form)
    calls_only = fit._replace(cost=cost_from_coef(fit.coef), overheads={})
    rng = np.random.default_rng(seed)
    cost_draws = latency_cost_draws(fit, count=draws, seed=seed)
    per_model = fit_measured_latency(latency, batch=batch)  # each timed model's own calls, no law in N

    def speedup(cost, alpha, gamma, n, m):
        tokens = np.asarray(expected_tokens(alpha, gamma))
        return tokens * np.asarray(target_alone_cost(cost, m)) / (
            gamma * np.asarray(cost.draft_step(n)) + np.asarray(cost.verification(m, gamma + 1)))

    runs = []
    for i in range(len(spec)):
        gamma, n, m = float(spec.gamma[i]), float(spec.n_draft[i]), float(spec.n_target[i])
        alpha = float(spec.alpha_mle[i])
        alpha_draws = _alpha_draws(spec, i, draws, rng)
        band = speedup(cost_draws, alpha_draws, gamma, n, m)
        band_per_model = speedup(per_model, alpha_draws, gamma, n, m)  # alpha's uncertainty only
        # Where a miss comes from: the measured seconds of one loop iteration (tau / tokens per
        # second) and of one target-alone token, against the sums of the timed calls.
        iteration_measured = float(spec.tau[i] / spec.tokens_per_second[i])
        iteration_predicted = float(gamma * fit.cost.draft_step(n) + fit.cost.verification(m, gamma + 1))
        alone_measured = float(1.0 / spec.target_alone_tokens_per_second[i])
        runs.append(dict(iteration_seconds_measured=iteration_measured, iteration_seconds_predicted=iteration_predicted,
                         alone_seconds_measured=alone_measured,
                         alone_seconds_predicted=float(target_alone_cost(fit.cost, m)),
                         predicted_speedup_calls_only=float(speedup(calls_only.cost, alpha, gamma, n, m)),
                         target=spec.target[i], draft=spec.draft[i], n_target=m, n_draft=n, gamma=int(gamma),
                         alpha_mle=alpha, measured_speedup=float(spec.wallclock_speedup[i]),
                         measured_seconds_iqr_over_median=float(spec.seconds_iqr[i] / spec.seconds_median[i]),
                         predicted_speedup=float(speedup(fit.cost, alpha, gamma, n, m)),
                         predicted_band=[float(q) for q in np.quantile(band, [0.05, 0.95])], _draws=band,
                         predicted_speedup_per_model=float(speedup(per_model, alpha, gamma, n, m)),
                         predicted_band_per_model=[float(q) for q in np.quantile(band_per_model, [0.05, 0.95])],
                         _draws_per_model=band_per_model))
    targets = []
    for target in sorted(set(spec.target), key=lambda t: spec.n_target[spec.target.index(t)]):
        mine = [r for r in runs if r["target"] == target]
        measured = max(mine, key=lambda r: r["measured_speedup"])
        predicted = max(mine, key=lambda r: r["predicted_speedup"])
        winners = np.argmax(np.stack([r["_draws"] for r in mine]), axis=0)
        gammas = sorted({r["gamma"] for r in mine})
        drafts = []
        for draft in sorted({r["draft"] for r in mine}, key=lambda d: next(r["n_draft"] for r in mine if r["draft"] == d)):
            rows_d = [r for r in mine if r["draft"] == draft]
            alpha = float(np.average([r["alpha_mle"] for r in rows_d]))
            best = best_lookahead(fit.cost, alpha, rows_d[0]["n_draft"], rows_d[0]["n_target"])
            g = float(best.gamma)
            drafts.append(dict(draft=draft, n_draft=rows_d[0]["n_draft"], alpha_mle_mean=alpha, gamma_star=g,
                               speedup_at_gamma_star=float(best.throughput * target_alone_cost(
                                   fit.cost, rows_d[0]["n_target"])),
                               gamma_star_outside_grid=bool(g > max(gammas) or g < min(gammas))))
        chosen = max(mine, key=lambda r: r["predicted_speedup_per_model"])
        winners_per_model = np.argmax(np.stack([r["_draws_per_model"] for r in mine]), axis=0)
        targets.append(dict(
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
            measured_fastest=dict(draft=measured["draft"], gamma=measured["gamma"],
                                  speedup=measured["measured_speedup"]),
            predicted_fastest=dict(draft=predicted["draft"], gamma=predicted["gamma"],
                                   predicted_speedup=predicted["predicted_speedup"],
                                   band=predicted["predicted_band"], measured_speedup=predicted["measured_speedup"]),
            picked_measured_fastest=predicted is measured,
            regret=1.0 - predicted["measured_speedup"] / measured["measured_speedup"],
            best_speedup_relative_error=predicted["predicted_speedup"] / measured["measured_speedup"] - 1.0,
            p_measured_fastest=float(np.mean(winners == mine.index(measured))),
            measured_fastest_inside_band=bool(measured["predicted_band"][0] <= measured["measured_speedup"]
                                              <= measured["predicted_band"][1]),
            drafts=drafts))
    for r in runs:
        del r["_draws"], r["_draws_per_model"]
    rel_table = np.array([r["predicted_speedup_per_model"] / r["measured_speedup"] - 1 for r in runs])
    iteration_ratio = np.array([r["iteration_seconds_measured"] / r["iteration_seconds_predicted"] for r in runs])
    alone_ratio = np.array([r["alone_seconds_measured"] / r["alone_seconds_predicted"] for r in runs])
    inside = np.mean([r["predicted_band"][0] <= r["measured_speedup"] <= r["predicted_band"][1] for r in runs])
    rel = np.array([r["predicted_speedup"] / r["measured_speedup"] - 1 for r in runs])
    rel_calls = np.array([r["predicted_speedup_calls_only"] / r["measured_speedup"] - 1 for r in runs])
    return dict(batch=batch, form=form, forms=scores, held_out_tokens=list(held),
                latency_coef=fit.coef, latency_relative_rmse=fit.relative_rmse, loop_overheads=fit.overheads,
                calls_only_relative_error_median=float(np.median(rel_calls)),
                calls_only_relative_error_rms=float(np.sqrt(np.mean(rel_calls**2))),
                per_model_latency=dict(n_params=np.exp(per_model.log_n).tolist(), fixed=np.asarray(per_model.fixed).tolist(),
                                       per_position=np.asarray(per_model.per_position).tolist(),
                                       iteration=float(per_model.iteration),
                                       draft_step=float(per_model.draft_step_overhead), alone=float(per_model.alone)),
                runs=runs, targets=targets,
                summary=dict(picked_within_5_percent=int(sum(t["regret"] <= 0.05 for t in targets)),
                             picked_exactly=int(sum(t["picked_measured_fastest"] for t in targets)),
                             best_speedup_within_15_percent=int(sum(abs(t["best_speedup_relative_error"]) <= 0.15
                                                                    for t in targets)),
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
                                 run_relative_error_rms=float(np.sqrt(np.mean(rel_table**2))))))


def markdown(record: dict) -> str:
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


def figure(record: dict, path: str, caption: str) -> str:
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


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.wallclock", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder", help="folder with latency.csv and speculative.csv (fits/ladder)")
    p.add_argument("--out", help="output folder (DATA/closure)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the latency rows to fit (1: the runs' batch)")
    p.add_argument("--form", default="auto", help="latency form: auto (smallest held-out error) or a name of "
                   "sdsl_jax.latency.FORMS")
    p.add_argument("--draws", type=int, default=2000, help="draws for the bands (2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_jax()
    return run_command(lambda: _run(args, argv), "nothing was written (the files are written at the end); rerun the "
                                                 "same command")


def _run(args, argv) -> int:
    from sdsl_jax.latency import FORMS

    check_arguments(args, at_least_one=("draws", "batch"), out=args.out)
    if args.form != "auto" and args.form not in FORMS:
        raise UsageError(f"--form {args.form!r} is not auto or one of {sorted(FORMS)}")
    log = Log(args.quiet)
    paths = dict(latency=os.path.join(args.data, "latency.csv"), speculative=os.path.join(args.data, "speculative.csv"))
    latency, spec = load_latency(paths["latency"]), load_speculative(paths["speculative"])
    if not np.any(latency.batch == args.batch):
        raise DataError(paths["latency"], None, "batch", f"has no rows at --batch {args.batch}")
    try:
        record = close_wallclock(spec, latency, batch=args.batch, form=args.form, draws=args.draws, seed=args.seed)
    except ValueError as err:  # the latency model cannot be fitted from these timings
        raise DataError(paths["latency"], None, None, f"cannot close the loop on these timings: {err}") from None
    out = make_output_folder(args.out or os.path.join(args.data, "closure"))
    command = "python -m experiments.wallclock " + " ".join(argv)
    record.update(command=command, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  seed=args.seed, versions=versions(),
                  data={k: dict(path=paths[k], sha256=t.sha256) for k, t in (("latency", latency),
                                                                            ("speculative", spec))},
                  machines=sorted({m for m in latency.machine if m}))
    table = markdown(record)
    print(table)
    write_text(os.path.join(out, "wallclock.md"), table)
    write_json(os.path.join(out, "wallclock.json"), record, strict=True)
    if not args.no_figure:
        figure(record, os.path.join(out, "wallclock.png"), command)
    log(f"wrote {os.path.join(out, 'wallclock.json')}, wallclock.md" + ("" if args.no_figure else ", wallclock.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
