"""Register the factorial ladder's prediction for its held-back models before they exist; score it once they do.

    python -m experiments.measure --preset factorial --exact-only --out out/ladder/factorial/measure
    python -m experiments.preregister --data out/ladder/factorial/measure --out fits/ladder/preregistered
    # ... commit predictions.json, then train and measure the held-back models:
    python -m experiments.ladder --preset factorial --held-back fits/ladder/preregistered/predictions.json
    python -m experiments.measure --preset factorial --exact-only --out out/ladder/factorial/measure
    python -m experiments.preregister --score --data out/ladder/factorial/measure --out fits/ladder/preregistered

Fits the loss law (run effects) and the acceptance plane (per-model effects) to the factorial
ladder's pre-training runs and exact acceptance pairs, then, for every target of the ladder and
the held-back target, ranks every smaller model at the top shared budget as a candidate draft
(the held-back draft included): P(best), the Bayes decision (highest posterior-expected T), T and
alpha per candidate with 90% predictive bands, N* with its band, and the forecasts of the simple
baselines (:mod:`sdsl_jax.forecast`). Writes ``predictions.json`` and ``predictions.md``; the file is
committed before any held-back model is trained, and never edited afterwards.

``--score`` reads that file as it stands and the measurements that now include the held-back
models, and writes ``score.json`` and ``score.md``: for every target, the log score, Brier score
and regret of the method's P(best) and of each baseline, the regret of the Bayes decision and of
the point fit's pick, whether each measured T and alpha lies in its 90% band, and where the
measured best draft lies against the N* band. Targets and pairs that involve a held-back model are
the test (their measurements did not exist when the prediction was made); the others are scored
too, as in-sample checks, and reported apart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np

from experiments.runlog import Log, UsageError, check_arguments, run_command, run_header, sha256, write_json, write_text
from sdsl_jax.validation.preregistered import (ForecastContext, forecast_target, measured_throughput, prediction_markdown,
                                               score, score_markdown)

__all__ = ["main"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.preregister", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with pretraining.csv and acceptance.csv (experiments.measure)")
    p.add_argument("--preset", default="factorial", help="the ladder preset whose held-back rungs are predicted")
    p.add_argument("--out", default="fits/ladder/preregistered", help="output folder")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--score", action="store_true",
                   help="score <out>/predictions.json against --data, which now holds the held-back models")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return out + ("+modified" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def predict(args, log: Log) -> dict:
    from sdsl_jax.lm import ladder as rungs
    from sdsl_jax import load_acceptance, load_pretraining, pipeline, predict

    preset = rungs.PRESETS[args.preset]
    runs = load_pretraining(os.path.join(args.data, "pretraining.csv"))
    pairs = load_acceptance(os.path.join(args.data, "acceptance.csv"))
    sizes = {r.name: float(rungs.rung_n_params(r, preset)) for r in preset.rungs}
    # Each rung's top shared budget in tokens (whole steps: 10,000,384 at 2,048 tokens per step, 9,998,336 at
    # 4,096): candidates and targets are the models trained on it.
    top = {r.name: float(max(plan.budgets) * plan.tokens_per_step)
           for r in preset.rungs for plan in [rungs.plan_rung(r, preset, int(sizes[r.name]))]}
    held_back = [r for r in preset.rungs if r.held_back]
    present = [r.name for r in held_back if np.any(np.isclose(runs.n_params, sizes[r.name]))]
    if present:
        raise UsageError(f"--data holds rows of held-back model(s) {present}: a prediction is registered before "
                         "their data exist")
    missing = [r.name for r in preset.rungs if not r.held_back
               and not np.any(np.isclose(runs.n_params, sizes[r.name]) & np.isclose(runs.n_tokens, top[r.name]))]
    if missing:
        raise UsageError(f"--data lacks the top-budget run of rung(s) {missing} of the '{preset.name}' preset")
    log(f"data: {len(runs.loss)} pre-training runs, {len(pairs.alpha)} acceptance pairs; top shared budget "
        f"{min(top.values()):.6g}-{max(top.values()):.6g} tokens")
    point = pipeline.fit_point(runs, pairs, log=log)
    posterior = pipeline.sample_posterior(runs, pairs, point, num_chains=args.chains, num_warmup=args.warmup,
                                          num_samples=args.draws, seed=args.seed, log=log)
    draws = predict.paired_draws(posterior)
    scales = predict.predictive_scales(posterior, runs=runs, acceptance=pairs)
    measured = measured_throughput(pairs, top)
    # The data name models "<rung>@<steps>": each rung's top-budget model as a draft and as a target.
    top_drafts = {lab.split("@")[0]: lab for lab, dd in zip(pairs.draft, pairs.d_draft)
                  if np.isclose(dd, top[lab.split("@")[0]])}
    top_targets = {lab.split("@")[0]: lab for lab, dt in zip(pairs.target, pairs.d_target)
                   if np.isclose(dt, top[lab.split("@")[0]])}
    order = sorted(sizes, key=sizes.get)
    context = ForecastContext(sizes, top, {r.name for r in held_back}, point, draws, scales, runs, measured,
                              top_drafts, top_targets, args.seed)
    targets, earlier, previous_best = [], [], None
    for t_name in order[1:]:
        record = forecast_target(t_name, context, previous_best=previous_best, earlier=earlier)
        targets.append(record)
        log(f"{t_name} (M = {record['m_target']:,.0f}): Bayes decision {record['bayes_decision']['draft']} "
            f"(P(best) {record['bayes_decision']['p_best']:.2f}); N* 90% [{record['n_star_90'][0]:,.0f}, "
            f"{record['n_star_90'][2]:,.0f}]")
        # The baselines of the next target see only what is measured: this target's best among measured drafts.
        known = record["measured_in_data"]
        if known:
            best = max(known, key=known.get)
            previous_best = sizes[best]
            earlier.append((record["m_target"], sizes[best]))
    diagnostics = {k: v._asdict() for k, v in posterior.diagnostics.items()}
    return dict(
        held_back=[dict(name=r.name, n_params=int(sizes[r.name]), role=r.note) for r in held_back],
        data=dict(pretraining=os.path.join(args.data, "pretraining.csv"),
                  pretraining_sha256=sha256(os.path.join(args.data, "pretraining.csv")),
                  acceptance=os.path.join(args.data, "acceptance.csv"),
                  acceptance_sha256=sha256(os.path.join(args.data, "acceptance.csv")),
                  runs=int(len(runs.loss)), pairs=int(len(pairs.alpha)), top_budget_tokens=top),
        method=dict(law=point.family.name, acceptance_model=point.acceptance_model.name,
                    run_effects=bool(pipeline.has_repeated_runs(runs)), chains=args.chains, warmup=args.warmup,
                    draws=args.draws, decision="the candidate with the highest posterior-expected T",
                    bands="posterior-predictive, 5%/50%/95%"),
        diagnostics=diagnostics, targets=targets)


def _score(args, argv, log: Log) -> int:
    import json

    from experiments.runlog import configure_jax
    from sdsl_jax import load_acceptance

    configure_jax()  # float64: the measured T and the regrets are computed here

    path = os.path.join(args.out, "predictions.json")
    if not os.path.isfile(path):
        raise UsageError(f"--score reads {path}, which does not exist: register the prediction first")
    with open(path) as f:
        predictions = json.load(f)
    pairs = load_acceptance(os.path.join(args.data, "acceptance.csv"))
    rungs = {lab.split("@")[0] for lab in list(pairs.draft) + list(pairs.target)}
    missing = [h["name"] for h in predictions["held_back"] if h["name"] not in rungs]
    if missing:
        raise UsageError(f"--data {args.data} has no acceptance pairs of held-back model(s) {missing}: train them "
                         "(experiments.ladder --held-back) and measure them first")
    result = score(predictions, pairs)
    record = dict(**run_header("experiments.preregister", argv), commit=_commit(), predictions=path, predictions_sha256=sha256(path),
                  registered_commit=predictions["commit"],
                  data=dict(acceptance=os.path.join(args.data, "acceptance.csv"),
                            acceptance_sha256=sha256(os.path.join(args.data, "acceptance.csv"))), **result)
    write_json(os.path.join(args.out, "score.json"), record)
    write_text(os.path.join(args.out, "score.md"), score_markdown(record))
    part = result["summary"]["held_back_forecasts"]
    if "forecasts" in part:
        log("held-back targets " + ", ".join(part["targets"]) + ": log score "
            + ", ".join(f"{k} {v['log_score']:.3f}" for k, v in part["forecasts"].items()))
    log(f"wrote {args.out}/score.json and score.md")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.score:
        return run_command(lambda: _score(args, argv, Log(args.quiet)), kept="nothing is written until the end")
    return run_command(lambda: _preregister(args, argv), kept="nothing is written until the end")


def _preregister(args, argv) -> int:
    from experiments.runlog import configure_jax, make_output_folder

    check_arguments(args, at_least_one=("chains", "warmup", "draws"), out=args.out)
    configure_jax()
    log = Log(args.quiet)
    with log.heartbeat(8):
        record = predict(args, log)
    record = dict(**run_header("experiments.preregister", argv), commit=_commit(), seed=args.seed, **record)
    out = make_output_folder(args.out)
    write_json(os.path.join(out, "predictions.json"), record)
    write_text(os.path.join(out, "predictions.md"), prediction_markdown(record))
    log(f"wrote {out}/predictions.json and predictions.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
