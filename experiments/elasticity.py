"""Does the draft's training budget move N*? The factorial ladder's answer, measured and predicted.

    python -m experiments.elasticity --data fits/ladder --out fits/ladder/elasticity

SDSL (2026, arXiv 2603.11053) holds that the training data of draft and target move N* only at
second order, while the target's size decides it. On the factorial ladder every size is trained on
the same five budgets, so both halves can be read off:

* measured: for each target (its top-budget model) and each shared draft budget D, the best draft
  among the smaller sizes trained on D (highest tokens per FLOP, from the pair's exact alpha at the
  best lookahead);
* predicted: the posterior-predictive N* (median, 90% band) at that D, and per posterior draw the
  elasticities of the mean curve's N*, ``d log N* / d log D`` (the draft's budget) and
  ``d log N* / d log M`` (the target's size), by central differences of +-5% in D and in M.

Writes ``elasticity.json`` and ``elasticity.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from experiments.runlog import Log, UsageError, check_arguments, run_command, run_header, sha256, write_json

__all__ = ["main", "measured_best_by_budget", "shared_budgets"]

STEP = 0.05  # the central difference in log D and log M


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.elasticity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with the factorial ladder's pretraining.csv and acceptance.csv")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def shared_budgets(n_tokens: np.ndarray, *, tolerance: float = 0.05) -> np.ndarray:
    """The shared budgets of a factorial ladder: token counts within ``tolerance`` (relative) of
    each other are one budget (rungs stepping 2,048 and 4,096 tokens end a step apart), each the
    median of its group."""
    d = np.sort(np.unique(np.asarray(n_tokens, np.float64)))
    groups = np.concatenate([[0], np.cumsum(d[1:] / d[:-1] > 1 + tolerance)])
    return np.array([np.median(d[groups == g]) for g in range(groups[-1] + 1)])


def _budget_index(d: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Which shared budget each token count is (budgets differ by a step's worth between rungs)."""
    return np.argmin(np.abs(np.log(np.asarray(d, np.float64))[:, None] - np.log(grid)[None, :]), axis=1)


def measured_best_by_budget(pairs, grid: np.ndarray) -> dict[tuple[str, int], dict]:
    """The best measured draft of each (target, shared draft budget): pairs whose target is a
    top-budget model (models named ``<rung>@<steps>``), T from exact alpha at the best lookahead."""
    from sdsl_jax import SDSL_FLOPS, best_lookahead

    k = _budget_index(pairs.d_draft, grid)
    top = len(grid) - 1
    on_top = _budget_index(pairs.d_target, grid) == top
    t = np.asarray(best_lookahead(SDSL_FLOPS, np.asarray(pairs.alpha), np.asarray(pairs.n_draft),
                                  np.asarray(pairs.n_target)).throughput)
    best: dict[tuple[str, int], dict] = {}
    for i in np.flatnonzero(on_top & np.isfinite(t)):
        key = (pairs.target[i].split("@")[0], int(k[i]))
        seen = best[key]["candidates"] if key in best else 0
        if key not in best or t[i] > best[key]["tokens_per_flop"]:
            best[key] = dict(draft=pairs.draft[i].split("@")[0], n_draft=float(pairs.n_draft[i]),
                             tokens_per_flop=float(t[i]))
        best[key]["candidates"] = seen + 1
    return best


def _quantiles(x) -> list[float]:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return [float(v) for v in np.quantile(x, [0.05, 0.5, 0.95])] if x.size else [float("nan")] * 3


def study(args, log: Log) -> dict:
    from sdsl_jax import load_acceptance, load_pretraining, pipeline, predict

    runs = load_pretraining(os.path.join(args.data, "pretraining.csv"))
    pairs = load_acceptance(os.path.join(args.data, "acceptance.csv"))
    budgets = shared_budgets(runs.n_tokens)
    if budgets.size < 3:
        raise UsageError(f"--data {args.data}: {budgets.size} distinct training budget(s); the study needs a ladder "
                         "trained on at least three shared budgets")
    measured = measured_best_by_budget(pairs, budgets)
    m_of = {lab.split("@")[0]: float(n) for lab, n in zip(pairs.target, pairs.n_target)}
    d_top = {lab.split("@")[0]: float(d) for lab, d in zip(pairs.target, pairs.d_target)}
    targets = sorted({t for t, _ in measured}, key=m_of.get)
    log(f"data: {len(runs.loss)} runs on {budgets.size} budgets, {len(pairs.alpha)} pairs; targets {', '.join(targets)}")
    point = pipeline.fit_point(runs, pairs, log=log)
    posterior = pipeline.sample_posterior(runs, pairs, point, num_chains=args.chains, num_warmup=args.warmup,
                                          num_samples=args.draws, seed=args.seed, log=log)
    laws, planes = predict.paired_draws(posterior)
    scales = predict.predictive_scales(posterior)
    m = np.array([m_of[t] for t in targets])
    records = []
    for k, d in enumerate(budgets):
        # One solve per budget over every target (the targets' budgets differ by one step at most: their median).
        d_target = float(np.median([d_top[t] for t in targets]))
        bands = predict.propagate_draft_size(m, laws, predict.predictive_planes(planes, scales, d_draft=d,
                                                                               d_target=d_target, seed=args.seed),
                                           d_draft=float(d), d_target=d_target, quantiles=(0.05, 0.5, 0.95))
        n_lo, n_hi = (predict.solve_draws(m, laws, planes, d_draft=float(d * np.exp(s)), d_target=d_target)[0]
                      for s in (-STEP, STEP))
        m_lo, m_hi = (predict.solve_draws(m * np.exp(s), laws, planes, d_draft=float(d), d_target=d_target)[0]
                      for s in (-STEP, STEP))
        with np.errstate(all="ignore"):
            e_d = (np.log(n_hi) - np.log(n_lo)) / (2 * STEP)
            e_m = (np.log(m_hi) - np.log(m_lo)) / (2 * STEP)
        for j, t in enumerate(targets):
            got = measured.get((t, k))
            records.append(dict(
                target=t, m_target=m_of[t], budget=k, d_draft=float(d),
                measured_best=None if got is None else got["draft"],
                measured_best_n=None if got is None else got["n_draft"],
                candidates=0 if got is None else got["candidates"],
                n_star_90=[float(v) for v in bands.n_star[:, j]],
                n_star_failed_fraction=float(bands.failed_fraction[j]),
                elasticity_d_90=_quantiles(e_d[:, j]), elasticity_m_90=_quantiles(e_m[:, j])))
        log(f"D = {d:,.0f}: median elasticity d log N*/d log D "
            f"{np.nanmedian(e_d):+.3f}, d log N*/d log M {np.nanmedian(e_m):+.3f}")
    changes = {}
    for t in targets:
        best = [r["measured_best"] for r in records if r["target"] == t and r["measured_best"] is not None]
        changes[t] = dict(best_by_budget=best, distinct=len(set(best)))
    return dict(
        data=dict(pretraining=os.path.join(args.data, "pretraining.csv"),
                  pretraining_sha256=sha256(os.path.join(args.data, "pretraining.csv")),
                  acceptance=os.path.join(args.data, "acceptance.csv"),
                  acceptance_sha256=sha256(os.path.join(args.data, "acceptance.csv")),
                  budgets=[float(v) for v in budgets]),
        method=dict(law=point.family.name, acceptance_model=point.acceptance_model.name, chains=args.chains,
                    warmup=args.warmup, draws=args.draws, step=STEP),
        diagnostics={k: v._asdict() for k, v in posterior.diagnostics.items()},
        identification=_identification(posterior.identification),
        records=records, measured_best_changes=changes)


def _identification(ident) -> dict | None:
    """The loss law's parameters against their prior: posterior sd / prior sd (from the variance
    contraction), the flags the fit prints."""
    if ident is None:
        return None
    ratio = np.sqrt(np.clip(1.0 - np.asarray(ident.contraction, np.float64), 0.0, None))
    return dict(posterior_sd_over_prior_sd={n: float(r) for n, r in zip(ident.names, ratio)},
                flags=list(ident.flags))


def write_markdown(path: str, record: dict) -> None:
    from sdsl_jax.store import write_text

    budgets = record["data"]["budgets"]
    lines = ["# Does the draft's training budget move N*? (factorial ladder)", "",
             f"`{record['command']}`, {record['date']}. Law {record['method']['law']}, acceptance "
             f"{record['method']['acceptance_model']}; posterior diagnostics: " + "; ".join(
                 f"{k} {'OK' if v['ok'] else 'FAILED (' + ', '.join(v['problems']) + ')'}"
                 for k, v in record["diagnostics"].items()) + ".", "",
             "Loss-law parameters, posterior sd / prior sd (under 0.5: the data pin the parameter down): "
             + ", ".join(f"{k} {v:.2f}" for k, v in (record["identification"] or {}).get(
                 "posterior_sd_over_prior_sd", {}).items()) + ".", "",
             "Per target: the measured best draft at each shared draft budget D (the target at its top budget), "
             "and the predicted N* median [90%]. Elasticities are posterior medians [90%] of the mean curve's "
             "d log N* / d log D and d log N* / d log M.", "",
             "| target | " + " | ".join(f"D = {d / 1e6:.3g}M" for d in budgets)
             + " | d log N*/d log D (top D) | d log N*/d log M (top D) |",
             "|---|" + "---|" * (len(budgets) + 2)]
    targets = list(dict.fromkeys(r["target"] for r in record["records"]))
    for t in targets:
        rows = sorted((r for r in record["records"] if r["target"] == t), key=lambda r: r["budget"])
        cells = [f"{r['measured_best'] or 'n/a'} / {r['n_star_90'][1]:,.0f} [{r['n_star_90'][0]:,.0f}, "
                 f"{r['n_star_90'][2]:,.0f}]" for r in rows]
        ed, em = rows[-1]["elasticity_d_90"], rows[-1]["elasticity_m_90"]
        lines.append(f"| {t} ({rows[0]['m_target']:,.0f}) | " + " | ".join(cells)
                     + f" | {ed[1]:+.3f} [{ed[0]:+.3f}, {ed[2]:+.3f}] | {em[1]:+.3f} [{em[0]:+.3f}, {em[2]:+.3f}] |")
    lines += ["", "Cells: measured best draft / predicted N* median [90%]."]
    write_text(path, "\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_command(lambda: _elasticity(args, argv), kept="nothing is written until the end")


def _elasticity(args, argv) -> int:
    from experiments.runlog import configure_jax, make_output_folder

    check_arguments(args, at_least_one=("chains", "warmup", "draws"), out=args.out)
    configure_jax()
    log = Log(args.quiet)
    with log.heartbeat(8):
        result = study(args, log)
    record = dict(**run_header("experiments.elasticity", argv), seed=args.seed, **result)
    out = make_output_folder(args.out)
    write_json(os.path.join(out, "elasticity.json"), record)
    write_markdown(os.path.join(out, "elasticity.md"), record)
    log(f"wrote {out}/elasticity.json and elasticity.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
