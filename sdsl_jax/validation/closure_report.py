"""The closure's report: its markdown table and notes, and its figure (measured T against the law's
curve, per target).
"""

from __future__ import annotations

import numpy as np

from sdsl_jax.predict.ranking import NOT_PINNED_DOWN
from sdsl_jax.store import atomic_write
from sdsl_jax.validation.closure import forecast_scores, outside_band
from sdsl_jax.validation.closure_fits import InSampleFit

OUTSIDE_MARK = " (!)"

__all__ = [
    "markdown_table",
    "closure_markdown",
    "figure",
]


def _size(n: float) -> str:
    """The table's short size: 1.23M, 482k."""
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
        band = (f"[{_size(r['n_star_band'][0])}, {_size(r['n_star_band'][2])}]" if "n_star_band" in r else "")
        n_star = _size(r["n_star"]) if np.isfinite(r["n_star"]) else f"none (status {r['n_star_status']})"
        n_star += OUTSIDE_MARK if outside_band(r["n_star"], r.get("n_star_band")) else ""
        along = (_size(r["n_star_recipe"]) if np.isfinite(r["n_star_recipe"])
                 else f"none (status {r['n_star_recipe_status']})")
        along += (OUTSIDE_MARK if outside_band(r["n_star_recipe"], r.get("n_star_recipe_band")) else "") \
            + f" (rho {r['recipe_tokens_per_param']:.0f})"
        if "n_star_recipe_band" in r:
            along += f" [{_size(r['n_star_recipe_band'][0])}, {_size(r['n_star_recipe_band'][2])}]"
        base = r["target_alone_tokens_per_flop"]
        lines.append(
            f"| {r['target']} ({_size(r['m_target'])}, {r['d_target'] / r['m_target']:.0f}) | {r['predicted_best']}"
            + (f" ({r['plane_only_best']})" if "plane_only_best" in r else "") + " | "
            f"{p_best} | {n_star} {band} | {along} | {r['measured_best']} ({r['measured_best_gamma']}) | "
            f"{r['measured_fraction_of_best']:.3f} | "
            + ("not timed" if r["fastest_wallclock"] is None else
               f"{r['fastest_wallclock']} ({r['fastest_wallclock_gamma']}, x{r['fastest_wallclock_speedup']:.2f})")
            + " | "
            f"{r['predicted_alpha'][i]:.3f} / {r['measured_alpha_mle'][i]:.3f} | "
            f"x{r['predicted_tokens_per_flop'][i] / base:.2f} / x{r['measured_tokens_per_flop'][i] / base:.2f} |")
    outside = sum(outside_band(r["n_star"], r.get("n_star_band"))
                  + outside_band(r["n_star_recipe"], r.get("n_star_recipe_band")) for r in records)
    note = (f"\n{OUTSIDE_MARK.strip()} {outside} point N* outside its own 90% band: the point fit sits where the data do "
            "not pin the law down (a coefficient at a bound, or an N term the data do not identify: see the fit "
            "CLI's identification flags); the band, which averages over what the data allow, is the answer to "
            "read.\n") if outside else ""
    return "\n".join(lines) + "\n" + note


def closure_markdown(records, scores: dict, fit: InSampleFit, failed: list[str], *, propagate: int,
                     sensitivity: dict | None = None, measured: str | None = None) -> str:
    """closure.md: what the measured side is (``measured``, a sentence), the table, the forecast scores,
    the failed checks, the stacked forms (``propagate``: the draws each form's share was taken from)
    and how P(best) moves with wider priors (``sensitivity``,
    :func:`sdsl_jax.validation.closure_fits.prior_sensitivity`)."""
    table = ("" if measured is None else f"Measured side: {measured}\n\n") + markdown_table(records)
    if fit.draws is not None:
        s = scores.get("predictive" if fit.scales is not None else "mean_only") or forecast_scores(records)
        table += (f"\nP(best) scored as a forecast of the measured best over {len(records)} targets: log score "
                  f"{s['log_score']:.2f} (uniform {s['uniform_log_score']:.2f}), Brier {s['brier']:.3f} (uniform "
                  f"{s['uniform_brier']:.3f}), measured best inside the 90% credible set of drafts for "
                  f"{s['measured_best_in_90_credible_set']} of {s['targets']}" + ("" if fit.scales is None else
                                                  f"; without the residual terms: log score "
                                                  f"{scores['mean_only']['log_score']:.2f}, Brier "
                                                  f"{scores['mean_only']['brier']:.3f}") + ".\n")
    table += _baseline_line(scores.get("predictive", scores.get("mean_only", {})).get("baselines"), "In sample")
    table += _baseline_line(scores.get("prospective", {}).get("baselines"), "Prospective")
    if "forward" in scores:
        s, forward = scores["forward"], [r for r in records if "forward_p_best" in r]
        table += ("\nForward chaining (each target fitted on the runs up to its size and the pairs of smaller "
                  "targets): " + "; ".join(
                      f"{r['target']}: Bayes decision {r['forward_bayes_decision']} (regret "
                      f"{100 * r['forward_bayes_decision_regret']:.1f}%), P(measured best {r['measured_best']}) "
                      f"{r['forward_p_best'][r['drafts'].index(r['measured_best'])]:.2f}" for r in forward)
                  + f". Log score {s['log_score']:.2f} (uniform {s['uniform_log_score']:.2f}), Brier {s['brier']:.3f}."
                  + "".join(f" {r['target']}: no forward forecast ({r['forward_skipped']})."
                            for r in records if "forward_skipped" in r) + "\n")
        table += _baseline_line(s.get("baselines"), "Forward")
    table += _decision_line(records, "", "In sample")
    table += _decision_line(records, "prospective_", "Prospective")
    if "prospective" in scores:
        s = scores["prospective"]
        table += ("\nProspective (each draft's own size left out of both fits): " + "; ".join(
            f"{r['target']}: best {r['prospective_best']}, P(measured best {r['measured_best']}) "
            f"{r['prospective_p_best'][r['drafts'].index(r['measured_best'])]:.2f}, regret "
            f"{100 * r['prospective_regret']:.1f}%" for r in records)
            + f". Log score {s['log_score']:.2f} (uniform {s['uniform_log_score']:.2f}), Brier {s['brier']:.3f} "
              f"(uniform {s['uniform_brier']:.3f}), measured best in the 90% credible set for "
              f"{s['measured_best_in_90_credible_set']} of {s['targets']}.\n")
    if fit.point_fit_at_bound:
        table += (f"\nThe point fit's {', '.join(fit.point_fit_at_bound)} {NOT_PINNED_DOWN}: the point-fit "
                  "columns (predicted best, N*, the curve) use the posterior's median law instead.\n")
    if sensitivity is not None:
        per_target = sensitivity["max_abs_change_p_best_per_target"]
        changed = sensitivity["bayes_decisions_changed"]
        table += (f"\nPriors {sensitivity['width']:g} times as wide (the in-sample fit again, every prior's spread "
                  f"multiplied): P(best) of a candidate moves by at most {sensitivity['max_abs_change_p_best']:.3f} ("
                  + ", ".join(f"{t} {v:.3f}" for t, v in per_target.items()) + "); the Bayes decision changes for "
                  + (", ".join(changed) if changed else "no target")
                  + (f" (wide-prior posteriors that failed their checks: {', '.join(sensitivity['failed_checks'])})"
                     if sensitivity["failed_checks"] else "") + ".\n")
    if failed:
        table += ("\nPosteriors that failed their checks (R-hat < 1.01, bulk ESS above 100 per chain, no divergences, under 1% of draws at the maximum tree depth), with the "
                  "weight their form carries in that fit: " + "; ".join(failed) + ". "
                  + ("Stacking gives a form that still fails after its reruns no weight, unless every form of "
                     "that fit failed (then all are stacked): a weight above 0 here says its draws were used.\n"
                     if fit.stacking is not None else
                     "Their draws are used as sampled; read the scores that depend on them with that in mind.\n"))
    stacking = fit.stacking
    if stacking is not None:
        table += ("\nStacked forms (" + stacking["method"] + "; loss laws on the pre-training rows, acceptance models "
                  "on the pairs): " + ", ".join(f"{name} {w:.3f}" for name, w in stacking["forms"].items())
                  + (" (the rest below one draw in " + str(propagate) + ")" if len(stacking["forms"]) <
                     len(stacking["laws"]) * len(stacking["acceptance_models"]) else "")
                  + ". P(best), the T bands, the predicted best, the Bayes decision and the N* bands are the "
                  f"mixture's; the point N*, alpha and the curve are the highest-weight form's ({fit.forms[0].name})."
                  + (" Prospective: forms and weights chosen again by each fit without a size." if "prospective"
                     in scores else "") + "\n")
    return table


def _baseline_line(baselines: dict | None, title: str) -> str:
    """The forecast's log score beside the baselines', and its skill over the best of them."""
    if not baselines or not baselines.get("all"):
        return ""
    parts = []
    for subset, name in (("all", "all targets"), ("informative", "informative targets")):
        s = baselines.get(subset)
        if not s:
            continue
        scores = ", ".join(f"{k} {v['log_score']:.2f}" for k, v in s["forecasts"].items())
        parts.append(f"{name} ({len(s['targets'])}): log score {scores}; skill over the best baseline "
                     f"({s['best_baseline']}) {s['skill']:+.2f} nats, 90% [{s['skill_90'][0]:+.2f}, "
                     f"{s['skill_90'][1]:+.2f}] over resampled targets")
    return f"\n{title}, against forecasts made without a fit (log scores floored at {baselines['floor']:g}): " \
        + "; ".join(parts) + ".\n"


def _decision_line(records, prefix: str, title: str) -> str:
    """The Bayes decision per target and its regret against the measured best, beside the point fit's
    pick (``prefix``: "" in sample, "prospective_" for the fits that left the draft's size out)."""
    key = f"{prefix}bayes_decision"
    if not records or not all(key in r for r in records):
        return ""
    point_key = "prospective_regret" if prefix else "measured_fraction_of_best"
    point = [r[point_key] if prefix else 1.0 - r[point_key] for r in records]
    bayes = [r[f"{key}_regret"] for r in records]
    return (f"\n{title}, the Bayes decision (the draft with the highest posterior-expected T): " + "; ".join(
        f"{r['target']}: {r[key]} (P(best) {r[key + '_p_best']:.2f}, regret {100 * r[key + '_regret']:.1f}%)"
        for r in records) + f". Mean regret {100 * np.mean(bayes):.1f}%; the point fit's pick "
        f"{100 * np.nanmean(point):.1f}%.\n")


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
        ax.set_title(f"target {r['target']} (M = {_size(r['m_target'])})", fontsize=11)
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
