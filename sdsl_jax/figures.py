"""Figures of a pipeline result (each caption names the command that made it).

Matplotlib's object-oriented API only (no pyplot, no global backend switch), so importing this
module changes no global state. Scales and targets come from the result being drawn, never from
the paper: the paper's line N* = mu M + M0 is drawn only when asked (``compare_to_paper``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.loss_laws import pretraining_loss
from sdsl_jax.objective import draft_throughput
from sdsl_jax.optimum import SDSL2026_LINEAR_LAW
from sdsl_jax.store import atomic_write

__all__ = ["format_size", "loss_law_figure", "n_star_figure", "throughput_figure", "acceptance_figure",
           "fit_figures", "reliability_figure", "n_star_band_figure"]


def format_size(n: float) -> str:
    """A parameter count with a readable unit: 293.6M, 70B, 35.3k (``nan`` for a missing one: NaN,
    or None, as a summary read back from JSON holds it)."""
    if n is None or not np.isfinite(n):
        return "nan"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}" if unit != "M" or abs(n) < 1e8 else f"{n / scale:.1f}{unit}"
    return f"{n:.3g}"


def save_figure(fig: Figure, path: str, caption: str) -> str:
    """Write ``fig`` to ``path`` (PNG) atomically, with the command that made it as a caption.

    A caption of several lines gives the command first, then what the figure assumes (budgets,
    cost, acceptance model).
    """
    command, *rest = caption.split("\n")
    text = "\n".join([f"made by: {command}", *rest])
    # Below the axes' labels, at the left (offset text such as "1e6" sits at the right); bbox_inches="tight" keeps it.
    fig.text(0.01, -0.03, text, ha="left", va="top", fontsize=6, color="0.4")
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=130, bbox_inches="tight", format="png"))


def _law_title(law, family_name: str) -> str:
    return f"{family_name}: " + ", ".join(f"{k}={float(v):.4g}" for k, v in law._asdict().items())


def loss_law_figure(path: str, runs, law, *, family_name: str, caption: str) -> str:
    """Runs and the fitted law at three budgets (left), residuals in log loss (right)."""
    fig = Figure(figsize=(12, 4.2))
    ax, res = fig.subplots(1, 2, gridspec_kw=dict(wspace=0.35))
    log_d = np.log10(runs.n_tokens)
    cmap = "viridis"
    sc = ax.scatter(runs.n_params, runs.loss, c=log_d, s=12, cmap=cmap, label="runs")
    span = max(np.ptp(log_d), 1e-12)
    n = np.geomspace(runs.n_params.min() / 1.5, runs.n_params.max() * 1.5, 200)
    for q in np.quantile(runs.n_tokens, [0.1, 0.5, 0.9]):
        ax.plot(n, pretraining_loss(n, q, law), color=sc.cmap((np.log10(q) - log_d.min()) / span), lw=1.5)
    ax.set(xscale="log", xlabel="parameters N", ylabel="final loss (nats/token)")
    ax.set_title(_law_title(law, family_name), fontsize=8)
    fig.colorbar(sc, ax=ax, label="log10 D (training tokens)")
    ax.text(0.98, 0.97, "lines: the law at the 10/50/90%\nquantiles of D", transform=ax.transAxes, ha="right",
            va="top", fontsize=8)
    residual = np.log(runs.loss) - np.log(np.asarray(pretraining_loss(runs.n_params, runs.n_tokens, law)))
    res.scatter(runs.n_params, residual, s=10, c=log_d, cmap=cmap)
    res.axhline(0, color="k", lw=0.8)
    res.set(xscale="log", xlabel="parameters N", ylabel="log L - log L_hat", title="residuals")
    _size_axis(res.xaxis)
    res.xaxis.set_major_locator(LogLocator(numticks=6))  # unit labels such as "250M" collide when dense
    res.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    return save_figure(fig, path, caption)


def _size_axis(axis) -> None:
    # Tick labels with units (20B, 300M) instead of a shared "1e11" offset that collides with text.
    axis.set_major_formatter(FuncFormatter(lambda v, _: format_size(v) if v else "0"))


def n_star_figure(path: str, prediction, *, compare_to_paper: bool, caption: str, largest_run: float | None = None,
                  predictive: bool = True, plane_fixed: bool = False) -> str:
    """N*(M) at the point fit, the posterior bands, the fitted line (and the paper's, when asked).

    With bands, a second panel shows them relative to the posterior median: on the absolute scale
    a band of a few percent is thinner than the line drawing it. Targets beyond ``largest_run``
    (the largest pre-training run) are shaded: there the law is extrapolated; the named targets are
    marked. ``predictive`` says whether the bands include a new model's residuals; with the
    acceptance model fixed (``plane_fixed``) its uncertainty is not in the bands, and the legend
    says so.
    """
    m, n_star, bands, line = prediction.m_grid, np.asarray(prediction.grid.n_star), prediction.bands, \
        prediction.linear_law
    fig = Figure(figsize=(12 if bands is not None else 6.5, 4.5))
    axes = fig.subplots(1, 2 if bands is not None else 1, gridspec_kw=dict(wspace=0.3) if bands is not None else None)
    ax = axes[0] if bands is not None else axes
    kind = "posterior-predictive" if predictive else "posterior (law's mean)"
    if bands is not None:
        q = list(bands.quantiles)
        ax.fill_between(m, bands.n_star[q.index(0.05)], bands.n_star[q.index(0.95)], alpha=0.3, color="C0",
                        label=f"{kind} 90% band" + (" (acceptance fixed: not in the band)" if plane_fixed else ""))
        ax.fill_between(m, bands.n_star[q.index(0.25)], bands.n_star[q.index(0.75)], alpha=0.5, color="C0",
                        label="50% band")
        ax.plot(m, bands.n_star[q.index(0.5)], color="C0", lw=1, ls=":", label="posterior median")
    ax.plot(m, n_star, color="C3" if bands is not None else "C0", lw=1.2, label="N* at the point fit")
    if line is not None:
        ax.plot(m, float(line.mu) * m + float(line.m0), color="C2", lw=1,
                label=f"fitted line: mu={float(line.mu):.3g}, M0={float(line.m0):.3g}")
    if compare_to_paper:
        mu, m0 = float(SDSL2026_LINEAR_LAW.mu), float(SDSL2026_LINEAR_LAW.m0)
        ax.plot(m, mu * m + m0, "k--", lw=1, label=f"SDSL paper: {mu:.3g} M + {m0:.3g}")
    ax.set(xlabel="target size M (parameters)", ylabel="optimal draft size N*", title="N*(M)")
    _size_axis(ax.xaxis)
    _size_axis(ax.yaxis)
    for a in axes if bands is not None else [ax]:
        if largest_run is not None and m.max() > largest_run:
            a.axvspan(max(largest_run, m.min()), m.max(), color="0.85", zorder=0,
                      label="beyond the largest pre-training run" if a is ax else None)
        for target in np.asarray(prediction.targets).ravel():
            a.axvline(target, color="0.5", lw=0.6, ls=":")
    ax.legend(fontsize=7)
    if bands is not None:
        rel = axes[1]
        median = bands.n_star[q.index(0.5)]
        rel.fill_between(m, bands.n_star[q.index(0.05)] / median, bands.n_star[q.index(0.95)] / median, alpha=0.3,
                         color="C0", label="90% band")
        rel.fill_between(m, bands.n_star[q.index(0.25)] / median, bands.n_star[q.index(0.75)] / median, alpha=0.5,
                         color="C0", label="50% band")
        rel.plot(m, n_star / median, color="C3", lw=1.2, label="point fit")
        rel.axhline(1.0, color="k", lw=0.6)
        rel.set(xlabel="target size M (parameters)", ylabel="N* / posterior median",
                title="The bands relative to the posterior median")
        _size_axis(rel.xaxis)
        rel.legend(fontsize=8)
    return save_figure(fig, path, caption)


def throughput_figure(path: str, point, targets, named, *, d_target: float, recipe: Any, cost: Any = SDSL_FLOPS,
                      caption: str) -> str:
    """T(N) / T(N*) around each named target's N*: how flat the optimum is."""
    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    ratio = np.geomspace(1 / 16, 8, 300)
    for i, m in enumerate(np.asarray(targets)):
        n_star = float(named.n_star[i])
        if not np.isfinite(n_star):
            continue
        t = draft_throughput(ratio * n_star, m, d_target=d_target, recipe=recipe, loss=point.law, plane=point.plane,
                             cost=cost)
        ax.plot(ratio, np.asarray(t) / float(named.throughput[i]),
                label=f"M = {format_size(m)}, N* = {format_size(n_star)}")
    ax.axvline(0.5, color="0.6", lw=0.8, ls=":")
    ax.axvline(2.0, color="0.6", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="N / N*", ylabel="T(N) / T(N*)", ylim=(0.6, 1.01),
           title="How flat the optimum is: T around N* for each target")
    ax.legend(fontsize=8)
    return save_figure(fig, path, caption)


def acceptance_figure(path: str, acceptance, plane, *, model_name: str, caption: str) -> str:
    """Measured alpha against the fitted acceptance model."""
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    pred = np.asarray(plane.rate(acceptance.ppl_draft, acceptance.ppl_target))
    sc = ax.scatter(pred, acceptance.alpha, c=np.log10(acceptance.n_target), s=18, cmap="plasma")
    lo, hi = min(pred.min(), acceptance.alpha.min()), max(pred.max(), acceptance.alpha.max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
    fig.colorbar(sc, ax=ax, label="log10 target parameters")
    ax.set(xlabel="predicted alpha", ylabel="measured alpha")
    ax.set_title(f"{model_name}: A={float(plane.A):.4g}, B={float(plane.B):.4g}, C={float(plane.C):.4g}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path, caption)


def fit_figures(out: str, result, *, runs, acceptance, d_target: float, recipe: Any, cost: Any = SDSL_FLOPS,
                compare_to_paper: bool, caption: str, predictive: bool = True) -> list[str]:
    """Every figure of a :class:`sdsl_jax.pipeline.PipelineResult` into ``out``; returns the paths.

    ``caption``: the command, then (further lines) what the figures assume.
    """
    point, pred = result.point, result.prediction
    made = [
        loss_law_figure(os.path.join(out, "loss_law_fit.png"), runs, point.law, family_name=point.family.name,
                        caption=caption),
        n_star_figure(os.path.join(out, "n_star_bands.png"), pred, compare_to_paper=compare_to_paper, caption=caption,
                      largest_run=float(np.max(runs.n_params)), predictive=predictive,
                      plane_fixed=not point.plane_fitted),
        throughput_figure(os.path.join(out, "throughput_curves.png"), point, pred.targets, pred.named,
                          d_target=d_target, recipe=recipe, cost=cost, caption=caption),
    ]
    if acceptance is not None and point.plane_fitted:
        made.append(acceptance_figure(os.path.join(out, "acceptance_plane.png"), acceptance, point.plane,
                                      model_name=point.acceptance_model.name, caption=caption))
    return made


def rank_histogram_figure(path: str, studies: dict[str, Any], *, caption: str) -> str:
    """SBC rank histograms: one row per study (:class:`sdsl_jax.validation.calibration.SBCResult`),
    one panel per parameter, with the band a uniform histogram stays in 99% of the time per bin."""
    from scipy import stats

    width = max(len(s.sites) for s in studies.values())
    fig = Figure(figsize=(1.6 * width, 1.5 * len(studies)))
    axes = fig.subplots(len(studies), width, squeeze=False)
    for row, (name, study) in zip(axes, studies.items()):
        for ax in row[len(study.sites):]:
            ax.set_axis_off()
        for ax, test in zip(row, study.tests):
            total, bins = int(test.counts.sum()), len(test.counts)
            lo, hi = stats.binom.ppf([0.005, 0.995], total, 1 / bins)
            ax.axhspan(lo, hi, color="0.88")
            ax.bar(np.arange(bins), test.counts, width=1.0, color="C3" if test.p_value < 0.01 else "C0")
            ax.set_title(f"{name}: {test.site}\np = {test.p_value:.2g}", fontsize=7)
            ax.set_xticks([])
            ax.tick_params(labelsize=6)
    fig.tight_layout()
    return save_figure(fig, path, caption)


def n_star_coverage_figure(intervals: dict[str, list], path: str, *, caption: str) -> str:
    """Each dataset's 90% band on N* against the truth it should cover, one panel per claim."""
    fig = Figure(figsize=(10, 3.6))
    for ax, (name, rows) in zip(fig.subplots(1, len(intervals), squeeze=False)[0], intervals.items()):
        rows = sorted(rows, key=lambda r: r[2] / np.sqrt(r[0] * r[1]))
        for i, (lo, hi, truth) in enumerate(rows):
            centre = np.sqrt(lo * hi)
            inside = lo <= truth <= hi
            ax.plot([i, i], [lo / centre, hi / centre], color="C0" if inside else "C3", lw=1.2)
            ax.plot(i, truth / centre, "k." if inside else "rx", ms=4)
        covered = np.mean([lo <= t <= hi for lo, hi, t in rows])
        ax.set_yscale("log")
        ax.set_title(f"{name}: {covered:.2f} of {len(rows)} covered", fontsize=9)
        ax.set_xlabel("synthetic ladder (sorted by truth within its band)")
        ax.set_ylabel("N* / band centre")
    fig.tight_layout()
    return save_figure(fig, path, caption)


def reliability_figure(path: str, summary: dict, *, caption: str) -> str:
    """The reliability diagram of P(best) per true process and over all
    (:func:`sdsl_jax.validation.misspecified.summarize_closures`): each bin's forecast against how
    often it came true, the diagonal a calibrated forecaster's, the bins' counts beside the points."""
    panels = {"all processes": summary["overall"], **summary["by_process"]}
    fig = Figure(figsize=(3.2 * len(panels), 3.4))
    for ax, (name, s) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels.items()):
        ax.plot([0, 1], [0, 1], color="0.7", lw=1)
        rel = s["p_best_reliability"]
        if rel is not None:
            points = [(m, f, c) for m, f, c in zip(rel["mean_forecast"], rel["frequency"], rel["count"]) if c]
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color="C0", ms=4)
            for m, f, c in points:
                ax.annotate(str(c), (m, f), textcoords="offset points", xytext=(4, -8), fontsize=6, color="0.4")
            ax.set_title(f"{name}\nECE {rel['expected_calibration_error']:.3f}; N* band coverage "
                         f"{s['n_star_coverage']:.2f}", fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("forecast P(best)")
        ax.set_ylabel("share that was the true best")
    fig.tight_layout()
    return save_figure(fig, path, caption)


def n_star_band_figure(path: str, closures: list[dict], *, caption: str) -> str:
    """Each synthetic target's 90% N* band against the N* it should cover, one panel per true process
    (closures of :func:`sdsl_jax.validation.misspecified.synthetic_closure`): the band's median as a
    point and its ends as a line, on log axes; a band that misses is drawn in red. The diagonal is
    a band centred on the truth; coverage says how often a band crosses it, the picture also says
    by how much and to which side the others miss."""
    by_process: dict[str, list[dict]] = {}
    for closure in closures:
        by_process.setdefault(closure["process"], []).extend(closure["targets"])
    fig = Figure(figsize=(3.4 * max(len(by_process), 1), 3.6))
    for ax, (name, targets) in zip(fig.subplots(1, max(len(by_process), 1), squeeze=False)[0], by_process.items()):
        rows = np.array([[t["n_star_new"], *t["n_star_band"]] for t in targets
                         if t["n_star_band"] is not None and np.all(np.isfinite([t["n_star_new"], *t["n_star_band"]]))])
        if rows.size:
            # Columns: the truth, then the band's quantiles (lower, median, upper).
            truth, low, mid, high = rows[:, 0], rows[:, 1], rows[:, 1 + (rows.shape[1] - 1) // 2], rows[:, -1]
            hit = (low <= truth) & (truth <= high)
            for mask, colour in ((hit, "C0"), (~hit, "C3")):
                ax.vlines(truth[mask], low[mask], high[mask], color=colour, lw=0.5, alpha=0.25)
                ax.plot(truth[mask], mid[mask], ".", color=colour, ms=2.5, alpha=0.6)
            span = [min(truth.min(), low.min()), max(truth.max(), high.max())]
            ax.plot(span, span, color="0.5", lw=1)
            ax.set_title(f"truth: {name}\n{int(hit.sum())} of {len(hit)} bands cover", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("true N* (new draft series and target)")
        ax.set_ylabel("90% band and median")
    fig.tight_layout()
    return save_figure(fig, path, caption)
