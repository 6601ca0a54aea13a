"""Figures of `python -m experiments.fit` (each caption names the command that makes it)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sdsl_jax import (  # noqa: E402
    SDSL2026_LINEAR_LAW,
    acceptance_rate,
    draft_throughput,
    pretraining_loss,
    solve_draft_size,
)

PAPER_MU, PAPER_M0 = float(SDSL2026_LINEAR_LAW.mu), float(SDSL2026_LINEAR_LAW.m0)
CAPTION = "python -m experiments.fit --posterior"


def _save(fig, out: str, name: str) -> str:
    path = os.path.join(out, name)
    fig.text(0.99, 0.005, f"made by: {CAPTION}", ha="right", va="bottom", fontsize=6, color="0.4")
    fig.savefig(path + ".tmp.png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    os.replace(path + ".tmp.png", path)
    return path


def loss_law_figure(out, runs, law) -> str:
    fig, (ax, res) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw=dict(wspace=0.35))
    log_d = np.log10(runs.n_tokens)
    sc = ax.scatter(runs.n_params, runs.loss, c=log_d, s=12, cmap="viridis", label="runs")
    for q in np.quantile(runs.n_tokens, [0.1, 0.5, 0.9]):
        n = np.geomspace(runs.n_params.min() / 1.5, runs.n_params.max() * 1.5, 200)
        ax.plot(n, pretraining_loss(n, q, law), color=plt.cm.viridis((np.log10(q) - log_d.min()) / np.ptp(log_d)),
                lw=1.5)
    ax.set(xscale="log", xlabel="parameters N", ylabel="final loss (nats/token)",
           title=f"L(N, D) = {float(law.E):.3f} + {float(law.A):.1f}/N^{float(law.alpha):.3f}"
                 f" + {float(law.B):.0f}/D^{float(law.beta):.3f}")
    fig.colorbar(sc, ax=ax, label="log10 D (training tokens)")
    ax.text(0.98, 0.97, "lines: the law at the 10/50/90%\nquantiles of D", transform=ax.transAxes, ha="right",
            va="top", fontsize=8)
    residual = np.log(runs.loss) - np.log(np.asarray(pretraining_loss(runs.n_params, runs.n_tokens, law)))
    res.scatter(runs.n_params, residual, s=10, c=log_d, cmap="viridis")
    res.axhline(0, color="k", lw=0.8)
    res.set(xscale="log", xlabel="parameters N", ylabel="log L - log L_hat", title="residuals")
    return _save(fig, out, "loss_law_fit.png")


def n_star_figure(out, grid, bands, line) -> str:
    m, n_star = grid
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if bands is not None:
        q = list(bands.quantiles)
        ax.fill_between(m, bands.n_star[q.index(0.05)], bands.n_star[q.index(0.95)], alpha=0.2, color="C0",
                        label="posterior 90% band")
        ax.fill_between(m, bands.n_star[q.index(0.25)], bands.n_star[q.index(0.75)], alpha=0.35, color="C0",
                        label="50% band")
        ax.plot(m, bands.n_star[q.index(0.5)], color="C0", lw=1, ls=":", label="posterior median")
    ax.plot(m, n_star, color="C0", lw=2, label="N* at the point fit")
    if line is not None:
        ax.plot(m, float(line.mu) * m + float(line.m0), color="C2", lw=1,
                label=f"fitted line: mu={float(line.mu):.3g}, M0={float(line.m0):.3g}")
    ax.plot(m, PAPER_MU * m + PAPER_M0, "k--", lw=1, label="SDSL paper: 2.71e-3 M + 8.71e7")
    ax.set(xlabel="target size M (parameters)", ylabel="optimal draft size N*", title="N*(M)")
    ax.legend(fontsize=8)
    return _save(fig, out, "n_star_bands.png")


def throughput_figure(out, law, plane, d_draft, d_target, targets=(13e9, 30e9, 70e9, 110e9)) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    sol = solve_draft_size(np.asarray(targets), d_draft=d_draft, d_target=d_target, loss=law, plane=plane)
    ratio = np.geomspace(1 / 16, 8, 300)
    for i, m in enumerate(targets):
        n_star = float(sol.n_star[i])
        if not np.isfinite(n_star):
            continue
        t = draft_throughput(ratio * n_star, m, d_draft=d_draft, d_target=d_target, loss=law, plane=plane)
        ax.plot(ratio, np.asarray(t) / float(sol.throughput[i]), label=f"M = {m / 1e9:.0f}B, N* = {n_star / 1e6:.0f}M")
    ax.axvline(0.5, color="0.6", lw=0.8, ls=":")
    ax.axvline(2.0, color="0.6", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="N / N*", ylabel="T(N) / T(N*)  (tokens per FLOP)", ylim=(0.6, 1.01),
           title="The optimum is flat: halving or doubling N costs a few %")
    ax.legend(fontsize=8)
    return _save(fig, out, "throughput_curves.png")


def plane_figure(out, acceptance, plane) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    pred = np.asarray(acceptance_rate(acceptance.ppl_draft, acceptance.ppl_target, plane))
    sc = ax.scatter(pred, acceptance.alpha, c=np.log10(acceptance.n_target), s=18, cmap="plasma")
    lo, hi = min(pred.min(), acceptance.alpha.min()), max(pred.max(), acceptance.alpha.max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    fig.colorbar(sc, ax=ax, label="log10 target parameters")
    ax.set(xlabel=f"plane: {float(plane.A):.4f} x + {float(plane.B):.4f} y + {float(plane.C):.3f}",
           ylabel="measured alpha", title="Acceptance plane")
    return _save(fig, out, "acceptance_plane.png")


def make_all(out, *, runs, law, plane, acceptance, grid, bands, line, d_draft, d_target) -> list[str]:
    made = [loss_law_figure(out, runs, law), n_star_figure(out, grid, bands, line),
            throughput_figure(out, law, plane, d_draft, d_target)]
    if acceptance is not None:
        made.append(plane_figure(out, acceptance, plane))
    return made
