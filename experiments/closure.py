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

Writes ``closure.json``, ``closure.md`` (the table) and ``closure.png`` to ``--out``
(``<data>/closure``).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # the Huber fit and N* need float64

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.runlog import Log, sha256, versions, write_json  # noqa: E402
from sdsl_jax import (AcceptancePlane, LossLaw, acceptance_rate, draft_acceptance, draft_throughput,  # noqa: E402
                      optimal_throughput, solve_draft_size)
from sdsl_jax import bayes  # noqa: E402
from sdsl_jax.data import DataError, load_acceptance, load_pretraining  # noqa: E402
from sdsl_jax.fitting import EPOCH_GRID, fit_acceptance_plane, fit_loss_law  # noqa: E402


def read_speculative(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    numeric = ("n_target", "n_draft", "d_target", "d_draft", "gamma", "alpha_mle", "tokens_per_flop_sdsl",
               "wallclock_speedup", "tokens_per_second", "target_alone_tokens_per_second", "tau")
    for row in rows:
        for key in numeric:
            row[key] = float(row[key])
    return rows


def _draws(samples: dict, names, count: int, seed: int) -> dict:
    total = len(next(iter(samples.values())))
    idx = np.random.default_rng(seed).choice(total, size=min(count, total), replace=False)
    return {k: np.asarray(samples[k])[idx] for k in names}


def measured_perplexities(pairs) -> dict[str, float]:
    """Each model's measured perplexity from an acceptance table (as draft or as target)."""
    out = dict(zip(pairs.draft, map(float, pairs.ppl_draft)))
    out.update(zip(pairs.target, map(float, pairs.ppl_target)))
    return out


def close_loop(speculative: list[dict], law: LossLaw, plane: AcceptancePlane, *, laws: LossLaw | None = None,
               planes: AcceptancePlane | None = None, perplexities: dict[str, float] | None = None) -> list[dict]:
    """One record per target: predicted vs measured best draft, N*, alpha and T*.

    With ``perplexities`` (model name -> measured perplexity) also the plane-only prediction: T*
    from the plane at the measured perplexities, bypassing L(N, D), which tells which link of the
    chain (loss law or plane) a miss comes from.
    """
    out = []
    targets = {r["target"]: r for r in speculative}  # any row of a target carries its M and D'
    for target in sorted(targets, key=lambda t: targets[t]["n_target"]):
        rows = [r for r in speculative if r["target"] == target]
        m, d_prime = targets[target]["n_target"], targets[target]["d_target"]
        by_draft = {}
        for r in rows:
            by_draft.setdefault(r["draft"], []).append(r)
        drafts = sorted(by_draft, key=lambda dr: by_draft[dr][0]["n_draft"])
        n = np.array([by_draft[dr][0]["n_draft"] for dr in drafts])
        d = np.array([by_draft[dr][0]["d_draft"] for dr in drafts])
        best_runs = [max(by_draft[dr], key=lambda r: r["tokens_per_flop_sdsl"]) for dr in drafts]  # best gamma
        measured_t = np.array([r["tokens_per_flop_sdsl"] for r in best_runs])
        measured_alpha = np.array([np.mean([r["alpha_mle"] for r in by_draft[dr]]) for dr in drafts])
        law_kw = dict(d_draft=d, d_target=d_prime, loss=law, plane=plane)
        a_pred = np.asarray(draft_acceptance(n, m, **law_kw))
        t_pred = np.asarray(draft_throughput(n, m, **law_kw))
        pred_idx = int(np.nanargmax(t_pred)) if np.isfinite(t_pred).any() else None
        best_measured = int(np.argmax(measured_t))
        fastest = max(rows, key=lambda r: r["wallclock_speedup"])
        d_ref = float(np.exp(np.mean(np.log(d))))
        sol = solve_draft_size(m, d_draft=d_ref, d_target=d_prime, loss=law, plane=plane)
        rec = dict(
            target=target, m_target=m, d_target=d_prime, drafts=drafts, n_drafts=n.tolist(),
            d_drafts=d.tolist(), d_reference=d_ref,
            measured_tokens_per_flop=measured_t.tolist(), measured_alpha_mle=measured_alpha.tolist(),
            predicted_tokens_per_flop=t_pred.tolist(), predicted_alpha=a_pred.tolist(),
            predicted_best=drafts[pred_idx] if pred_idx is not None else None,
            measured_best=drafts[best_measured], measured_best_gamma=int(best_runs[best_measured]["gamma"]),
            fastest_wallclock=fastest["draft"], fastest_wallclock_gamma=int(fastest["gamma"]),
            fastest_wallclock_speedup=fastest["wallclock_speedup"],
            n_star=float(sol.n_star), n_star_status=int(sol.status), t_star=float(sol.throughput),
            gamma_star=float(sol.gamma_star), target_alone_tokens_per_flop=1 / (2 * m),
            # What following the law costs: measured T of the predicted-best draft over the best measured T.
            measured_fraction_of_best=(float(measured_t[pred_idx] / measured_t.max()) if pred_idx is not None
                                       else float("nan")),
        )
        if perplexities is not None:
            alpha_plane = acceptance_rate(np.array([perplexities[dr] for dr in drafts]), perplexities[target], plane)
            t_plane = np.asarray(optimal_throughput(alpha_plane, n, m))
            rec["plane_only_tokens_per_flop"] = t_plane.tolist()
            rec["plane_only_best"] = drafts[int(np.nanargmax(t_plane))] if np.isfinite(t_plane).any() else None
        if laws is not None:
            t_draws = np.asarray(draft_throughput(n, m, d_draft=d, d_target=d_prime,
                                                  loss=jax.tree.map(lambda v: v[:, None], laws),
                                                  plane=jax.tree.map(lambda v: v[:, None], planes)))
            ok = np.isfinite(t_draws).all(axis=1)
            best = np.argmax(np.where(np.isfinite(t_draws), t_draws, -np.inf), axis=1)
            rec["p_best"] = [float(np.mean(best[ok] == i)) if ok.any() else float("nan") for i in range(len(drafts))]
            rec["predicted_tokens_per_flop_band"] = np.nanpercentile(t_draws, [5, 95], axis=0).T.tolist()
            bands = bayes.propagate_draft_size(np.array([m]), laws, planes, d_draft=d_ref, d_target=d_prime,
                                               quantiles=(0.05, 0.5, 0.95))
            rec["n_star_band"] = np.asarray(bands.n_star)[:, 0].tolist()
            rec["n_star_failed_fraction"] = float(np.asarray(bands.failed_fraction)[0])
        # The law's curve at D_ref, reaching down past N* and its band for the figure.
        low = min([n.min() / 4] + [v / 2 for v in [rec["n_star"], *rec.get("n_star_band", [])[:1]] if np.isfinite(v)])
        grid = np.geomspace(low, m, 80)
        rec["curve_n"] = grid.tolist()
        rec["curve_tokens_per_flop"] = np.asarray(
            draft_throughput(grid, m, d_draft=d_ref, d_target=d_prime, loss=law, plane=plane)).tolist()
        out.append(rec)
    return out


def _fmt(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n:.3g}"


def markdown_table(records: list[dict]) -> str:
    lines = ["| target (M, D'/M) | predicted best draft (plane only) | P(best): predicted / measured best | N* at D_ref [90%] | "
             "measured best (gamma) | measured T of predicted best / of measured best | "
             "fastest wall-clock (gamma, speedup) | alpha pred / MLE at measured best | T* pred / measured at "
             "measured best (x target alone) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        i = r["drafts"].index(r["measured_best"])
        p_best = "-"
        if "p_best" in r and r["predicted_best"] is not None:
            p_best = f"{r['p_best'][r['drafts'].index(r['predicted_best'])]:.2f} / {r['p_best'][i]:.2f}"
        band = (f"[{_fmt(r['n_star_band'][0])}, {_fmt(r['n_star_band'][2])}]" if "n_star_band" in r else "")
        n_star = _fmt(r["n_star"]) if np.isfinite(r["n_star"]) else f"none (status {r['n_star_status']})"
        base = r["target_alone_tokens_per_flop"]
        lines.append(
            f"| {r['target']} ({_fmt(r['m_target'])}, {r['d_target'] / r['m_target']:.0f}) | {r['predicted_best']}"
            + (f" ({r['plane_only_best']})" if "plane_only_best" in r else "") + " | "
            f"{p_best} | {n_star} {band} | {r['measured_best']} ({r['measured_best_gamma']}) | "
            f"{r['measured_fraction_of_best']:.3f} | "
            f"{r['fastest_wallclock']} ({r['fastest_wallclock_gamma']}, x{r['fastest_wallclock_speedup']:.2f}) | "
            f"{r['predicted_alpha'][i]:.3f} / {r['measured_alpha_mle'][i]:.3f} | "
            f"x{r['predicted_tokens_per_flop'][i] / base:.2f} / x{r['measured_tokens_per_flop'][i] / base:.2f} |")
    return "\n".join(lines) + "\n"


def figure(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(records))
    rows = -(-len(records) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
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
            ax.axvspan(r["n_star_band"][0], r["n_star_band"][2], color="C2", alpha=0.15, label="N* 90%")
        if np.isfinite(r["n_star"]):
            ax.axvline(r["n_star"], color="C2", lw=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(f"target {r['target']} (M = {_fmt(r['m_target'])})", fontsize=9)
        ax.set_xlabel("draft parameters N")
        ax.set_ylabel("tokens/FLOP vs target alone")
    for ax in list(axes.flat)[len(records):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.closure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder", help="folder with pretraining.csv, acceptance.csv and "
                   "speculative.csv (fits/ladder)")
    p.add_argument("--text", choices=("heldout", "hellaswag"), default="heldout",
                   help="which evaluation text's perplexities and alpha to fit (heldout)")
    p.add_argument("--posterior", action="store_true", help="NUTS posteriors: P(best draft) and bands")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--propagate", type=int, default=1000, help="posterior draws pushed through N* (1000)")
    p.add_argument("--starts", type=int, default=1, metavar="K", help="use every K-th Epoch start (1: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (<data>/closure)")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    log = Log(args.quiet)
    suffix = "" if args.text == "heldout" else "_hellaswag"
    paths = dict(pretraining=os.path.join(args.data, f"pretraining{suffix}.csv"),
                 acceptance=os.path.join(args.data, f"acceptance{suffix}.csv"),
                 speculative=os.path.join(args.data, "speculative.csv"))
    try:
        runs, pairs = load_pretraining(paths["pretraining"]), load_acceptance(paths["acceptance"])
        speculative = read_speculative(paths["speculative"])
    except (DataError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.data, "closure")
    os.makedirs(out, exist_ok=True)
    loss_fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, starts=EPOCH_GRID[:: args.starts])
    law = loss_fit.law
    plane_fit = fit_acceptance_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha, weights=pairs.regression_weights())
    plane = plane_fit.plane
    log(f"loss law: E {float(law.E):.3f} A {float(law.A):.4g} B {float(law.B):.4g} alpha {float(law.alpha):.3f} "
        f"beta {float(law.beta):.3f}; plane A {float(plane.A):.4f} B {float(plane.B):.4f} C {float(plane.C):.3f} "
        f"R^2 {float(plane_fit.r_squared):.3f} ({len(pairs)} pairs)")
    laws = planes = None
    diagnostics = {}
    if args.posterior:
        kw = dict(num_chains=args.chains, num_warmup=args.warmup, num_samples=args.draws, seed=args.seed,
                  progress_bar=False)
        law_run = bayes.sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, init=law, **kw)
        plane_run = bayes.sample_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha,
                                       weights=pairs.regression_weights(), **kw)
        diagnostics = dict(loss_law=law_run.diagnostics._asdict(), plane=plane_run.diagnostics._asdict())
        laws = bayes.laws_from_posterior(_draws(law_run.samples, ("a", "b", "e", "alpha", "beta"), args.propagate,
                                                args.seed))
        planes = bayes.planes_from_posterior(_draws(plane_run.samples, ("A", "B", "C"), args.propagate, args.seed + 1))
        log(f"posteriors: loss law R-hat {law_run.diagnostics.max_rhat:.3f}, plane R-hat "
            f"{plane_run.diagnostics.max_rhat:.3f}")
    records = close_loop(speculative, law, plane, laws=laws, planes=planes, perplexities=measured_perplexities(pairs))
    table = markdown_table(records)
    print(table)
    with open(os.path.join(out, "closure.md.tmp"), "w") as f:
        f.write(table)
    os.replace(os.path.join(out, "closure.md.tmp"), os.path.join(out, "closure.md"))
    write_json(os.path.join(out, "closure.json"), dict(
        command="python -m experiments.closure " + " ".join(argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), seed=args.seed,
        versions=versions(), data={k: dict(path=v, sha256=sha256(v)) for k, v in paths.items()},
        loss_law={k: float(v) for k, v in law._asdict().items()},
        plane={k: float(v) for k, v in plane._asdict().items()}, plane_r_squared=float(plane_fit.r_squared),
        diagnostics=diagnostics, targets=records))
    if not args.no_figure:
        figure(records, os.path.join(out, "closure.png"))
    log(f"wrote {out}/closure.json, closure.md" + ("" if args.no_figure else ", closure.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
