"""Fit the SDSL laws from data and predict the optimal draft size N* with uncertainty.

    python -m experiments.fit                      # point fits on the shipped data
    python -m experiments.fit --posterior          # + NUTS posteriors and bands on N* (make fit)
    python -m experiments.fit --pretraining runs.csv --acceptance pairs.csv --posterior --out out/
    python -m experiments.fit --dataset ladder --law broken --acceptance-model log-plane --recipe tokens-per-param=20

Pipeline (sdsl_jax.pipeline): (1) the loss law L(N, D) by the Epoch replication's multi-start
Huber fit (--law picks the form); (2) the acceptance model by weighted least squares when
acceptance data are given, otherwise the paper's plane SDSL2026 (and its influence on N* is shown
as implicit-derivative elasticities); (3) N*(M) for a grid of targets under the cost model (--cost)
and draft recipe (--recipe), and the linear law N* ~ mu M + M0; with --posterior, (4) NUTS
posteriors of the loss law (and the acceptance model), diagnostics, and bands on N*, M/N*, gamma*,
T* and (mu, M0).

Outputs in --out: summary.json, loss_law_posterior.nc (and plane_posterior.nc), and figures
loss_law_fit.png, n_star_bands.png, throughput_curves.png (acceptance_plane.png when fitted).
Exit status: 0 on success, 2 for unusable input (the message names file, line and column),
3 with --strict when the posterior diagnostics fail.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from experiments.datasets import DATASETS
from experiments.fit_inputs import Inputs, announce, assumptions_record, prepare
from experiments.fit_outputs import (data_record, latency_record, log_diagnostics, settings_record,
                                     write_figures_and_clean)
from experiments.runlog import (COMPILE_CACHE_ENV, Log, configure_jax, default_compile_cache, make_output_folder,
                               run_command, run_header, write_json)
from sdsl_jax import ACCEPTANCE_MODELS, COST_MODELS, FAMILIES, status_message
from sdsl_jax.compare import STACKING_DENSITIES
from sdsl_jax.loss_laws import prior_key
from sdsl_jax.recipes import RECIPES
from sdsl_jax.store import StageStore, content_digest


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.fit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="chinchilla",
                   help="shipped data and its analysis defaults: " + "; ".join(
                       f"'{d.name}': {d.description}" for d in DATASETS.values()) + ". Default: chinchilla")
    p.add_argument("--law", choices=sorted(FAMILIES), default="chinchilla",
                   help="loss-law form: " + "; ".join(f"'{f.name}': {f.description}" for f in FAMILIES.values())
                   + ". Default: chinchilla")
    p.add_argument("--acceptance-model", choices=sorted(ACCEPTANCE_MODELS), default="plane",
                   help="acceptance model fitted to --acceptance data: " + "; ".join(
                       f"'{m.name}': {m.description}" for m in ACCEPTANCE_MODELS.values()) + ". Default: plane")
    p.add_argument("--cost", choices=sorted(COST_MODELS) + ["latency"], default="flops",
                   help="cost of an iteration: 'flops': 2N gamma + 2M, one verification pass (the paper's); "
                        "'all-positions': 2N gamma + 2M (gamma + 1), the target charged per verified position "
                        "(Leviathan et al. Thm 3.11); 'latency': seconds on your hardware, t(N, 1) per draft step and "
                        "t(M, gamma + 1) per verification, t fitted from --latency (N* then maximises tokens per "
                        "second). Default: flops")
    p.add_argument("--latency", metavar="PATH", help="per-call latencies (schema sdsl-latency v1, made by "
                   "python -m experiments.latency, or your own timings of one forward call reading k tokens at three "
                   "or more k per model; the form of t(N, k) is chosen by its error on every second interior k, "
                   "fitted on the others) for --cost latency")
    p.add_argument("--latency-batch", type=int, default=1, help="batch size of the --latency rows to use (1)")
    p.add_argument("--recipe", default="fixed", metavar="SPEC",
                   help=f"how draft training tokens follow draft size: {RECIPES}. Default: fixed")
    p.add_argument("--pretraining", metavar="PATH", help="pre-training runs CSV (schema sdsl-pretraining v1); "
                   "overrides the dataset's")
    p.add_argument("--acceptance", metavar="PATH", help="acceptance CSV (schema sdsl-acceptance v1); fits the "
                   "plane instead of using SDSL2026")
    p.add_argument("--drop-highest-loss", type=int, metavar="K", help="drop the K highest-loss runs before "
                   "fitting (default: 5 for the shipped Chinchilla data, as the Epoch replication does; else 0)")
    p.add_argument("--posterior", action="store_true", help="also sample NUTS posteriors and report bands")
    p.add_argument("--stack", nargs="?", const="all", default=None, metavar="FORMS",
                   help="with --posterior: also fit the other loss-law forms (all that the data identify, or the "
                        "comma-separated FORMS), weight the forms by Bayesian stacking (compare.stack; --stack-by) and "
                        "report the bands of the stacked mixture (the point-fit columns stay those of --law)")
    p.add_argument("--stack-by", choices=STACKING_DENSITIES, default="sizes",
                   help="--stack's predictive densities: sizes (default), each model size left out in turn and each "
                        "form refitted without it (at most 10 folds of neighbouring sizes): how a form predicts a "
                        "size it has not seen, which N* asks of it; rows, PSIS-LOO over rows (az.loo), one "
                        "posterior per form but a score of sizes the fit has seen")
    p.add_argument("--mean-only", action="store_true",
                   help="bands of the law's mean curve only; default: posterior-predictive bands, which add the "
                        "residuals of a new draft series, a new target and a new pair (what a model you train will "
                        "show)")
    p.add_argument("--run-effects", choices=("auto", "on", "off"), default="auto",
                   help="grouped random effects in the posteriors: per run, an intercept and slope in log D in the "
                        "loss law ('auto': when some run, the 'run' column or else the model size, has rows at two or "
                        "more budgets D; off for the chinchilla dataset, whose rows are separate runs); per draft and "
                        "per target model in the acceptance model ('auto': when some model is in two or more pairs). "
                        "Default: auto"),
    p.add_argument("--m-min", type=float, help="smallest target size of the N*(M) grid (chinchilla: 1e10; "
                   "ladder: 5e4)")
    p.add_argument("--m-max", type=float, help="largest target size of the N*(M) grid (chinchilla: 1.1e11; "
                   "ladder: 2e6)")
    p.add_argument("--num-targets", type=int, default=41, help="target sizes in the grid, linearly spaced (41)")
    p.add_argument("--targets", type=float, nargs="+", metavar="M",
                   help="named targets for the table (chinchilla: 13e9 30e9 70e9 110e9; ladder: 1.2e5 2.6e5 "
                   "4.8e5 1.2e6)")
    p.add_argument("--d-draft", type=float, help="draft training tokens D with --recipe fixed (chinchilla: 1e12; "
                   "ladder: 5e6)")
    p.add_argument("--d-target", type=float, help="target training tokens D' (chinchilla: 1e12; ladder: 5e6)")
    p.add_argument("--chains", type=int, default=4, help="NUTS chains (4)")
    p.add_argument("--warmup", type=int, default=500, help="NUTS warm-up iterations per chain (500)")
    p.add_argument("--draws", type=int, default=500, help="NUTS draws per chain (500)")
    p.add_argument("--reruns", type=int, default=2, help="times a posterior that fails its checks is run again "
                   "from new prior starts, each time with twice the warm-up and draws of the last (2)")
    p.add_argument("--starts", type=int, metavar="K", help="use every K-th of the 4,500 Epoch starts "
                   "(default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (0)")
    p.add_argument("--out", default="out/fit", help="output folder (out/fit)")
    p.add_argument("--no-figures", action="store_true", help="skip the figures")
    p.add_argument("--strict", action="store_true", help="exit with status 3 when posterior diagnostics fail")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--compile-cache", metavar="DIR", default=default_compile_cache(),
                   help="JAX's persistent compilation cache: a second run loads compiled programs instead of "
                        f"compiling them (default: ${COMPILE_CACHE_ENV} if set, else ~/.cache/sdsl-jax/xla)")
    p.add_argument("--no-compile-cache", action="store_true", help="do not read or write the compilation cache")
    p.add_argument("--resume", action="store_true", help="reuse the stages (point fit, posteriors) that an "
                   "earlier, interrupted run finished in --out with the same data and settings")
    return p.parse_args(argv)


def run(args) -> int:
    """The command: prepare (read and check everything), fit and predict, write, print."""
    from sdsl_jax import report  # after configure_jax: the pipeline it reads is float64

    log = Log(args.quiet)
    inputs = prepare(args)
    make_output_folder(args.out)
    assumptions = assumptions_record(args, inputs.settings, runs=inputs.runs, acceptance=inputs.acceptance,
                                     pre_path=inputs.pre_path, acc_path=inputs.acc_path, family=inputs.family,
                                     acceptance_model=inputs.acceptance_model, dataset=inputs.dataset,
                                     user_data=inputs.user_data, drop=inputs.drop)
    announce(args, inputs, assumptions, log)
    result, stacking, starts = fit_and_predict(args, inputs, log)
    summary = report.summary_record(result, header=dict(run_header("experiments.fit", args.argv), seed=args.seed),
                                    data=data_record(inputs), assumptions=assumptions,
                                    settings=settings_record(args, inputs, len(starts)), cost=inputs.cost,
                                    latency=latency_record(args, inputs))
    strict_failure = False
    if result.posterior is not None:
        report.add_posterior_record(summary, result, cost=inputs.cost)
        strict_failure = not log_diagnostics(result.posterior, log)
    if stacking is not None:
        summary["stacking"] = stacking
    if result.sensitivity is not None:
        summary["plane_sensitivity"] = dict(
            meaning="elasticity d log N* / d log |theta| at the point fit, by implicit derivatives",
            m_target=np.asarray(result.prediction.targets).tolist(),
            **{k: v.tolist() for k, v in result.sensitivity.items()})
    for warning in report.add_data_checks(summary, result.point.law, runs=inputs.runs, acceptance=inputs.acceptance):
        log.warning(warning)
    write_json(os.path.join(args.out, "summary.json"), summary, strict=True)
    write_figures_and_clean(args, inputs, result, assumptions, log)
    print(report.format_table(summary))  # with --quiet too: it is the answer, not progress
    log(f"wrote {os.path.join(args.out, 'summary.json')}")
    return 3 if (args.strict and strict_failure) else 0


def fit_and_predict(args, inputs: Inputs, log):
    """The pipeline (point fits, posteriors, N*) and, with --stack, the other forms: ``(result, stacking, starts)``."""
    from sdsl_jax import pipeline  # after configure_jax: the pipeline's compiled code is float64
    from sdsl_jax.infer.models import effect_sides_of
    from sdsl_jax.infer.posterior import plane_target_accept

    runs, acceptance, family, acceptance_model = inputs.runs, inputs.acceptance, inputs.family, inputs.acceptance_model
    dataset, drop, cost, recipe = inputs.dataset, inputs.drop, inputs.cost, inputs.recipe
    last = [0.0]

    def progress(rnd, active, total):
        now = time.perf_counter()
        if now - last[0] > 2.0 or not active:  # a line every 2 s is enough to see it moving
            last[0] = now
            log(f"loss law: L-BFGS round {rnd}, {active}/{total} starts still running")

    log_d = (np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))
    all_starts = family.starts(*log_d)
    starts = all_starts[:: args.starts] if args.starts else all_starts
    # Keyed on the content parsed (labels and weights included), never on a path read again.
    fingerprint = dict(pretraining=content_digest(runs), acceptance=content_digest(acceptance) if acceptance else None,
                       drop=drop, starts=args.starts, chains=args.chains, warmup=args.warmup, draws=args.draws,
                       reruns=args.reruns,
                       seed=args.seed, acceptance_model=acceptance_model.name)

    def form_inputs(law):
        # Each law's stages are keyed by its own prior, never by the lead law's.
        return dict(fingerprint, law=law.name, target_accept=law.target_accept, **prior_key([law]))

    # One flag for both kinds of grouped effects; None: each where its data identify it.
    run_effects = model_effects = {"auto": None, "on": True, "off": False}[args.run_effects]
    if run_effects is None and dataset.one_run_per_row and not args.pretraining:
        run_effects = False  # the dataset's rows are separate runs (datasets.py)
    if args.posterior:
        uses_runs = pipeline.has_repeated_runs(runs) if run_effects is None else run_effects
        fingerprint.update(run_effects=uses_runs)
        log("posterior: " + ("per-run random effects in the loss law (rows of one run share an offset and a slope "
                             "in log D)" if uses_runs else "rows independent (no run with two budgets, or --run-effects "
                                                          "off)"))
        if acceptance is not None:
            why = "--run-effects " + args.run_effects
            if model_effects is None:
                model_effects, why = acceptance.model_effects_identified()
            sides = effect_sides_of(model_effects)
            fingerprint.update(model_effects=list(sides),
                               acceptance_target_accept=plane_target_accept(acceptance_model, effects=bool(sides)))
            log("posterior: " + (f"per-{' and per-'.join(sides)} model effects in the acceptance model (pairs sharing "
                                 "a model share its effect)" if sides else "acceptance pairs independent")
                + f" ({why})")
    stages = StageStore(args.out, resume=args.resume, inputs=form_inputs(family), log=log.warning)
    m_grid = np.linspace(args.m_min, args.m_max, args.num_targets)
    named = np.asarray(args.targets, np.float64)
    log(f"loss law: {family.name}, multi-start L-BFGS from {len(starts)} starts (compiling first)")
    # NumPyro's bars garble each other with parallel chains; the heartbeat speaks instead.
    with log.heartbeat(8.0):
        result = pipeline.run(
            runs, acceptance, m_grid=m_grid, targets=named, d_target=args.d_target, recipe=recipe, family=family,
            acceptance_model=acceptance_model, cost=cost, posterior=args.posterior, num_chains=args.chains,
            num_warmup=args.warmup, num_samples=args.draws, seed=args.seed, retries=args.reruns, starts=starts,
            stages=stages,
            predictive=not args.mean_only, run_effects=run_effects, model_effects=model_effects, progress_bar=False,
            fit_progress=progress,
            log=log)
    stacking = None
    if args.stack:
        from sdsl_jax import compare

        chosen = [FAMILIES[name] for name in (list(FAMILIES) if args.stack == "all" else args.stack.split(","))]
        with log.heartbeat(8.0):
            result, stacking = compare.stack_forms(
                result, runs, acceptance, families=chosen, m_grid=m_grid, targets=named, d_target=args.d_target,
                recipe=recipe, cost=cost, num_chains=args.chains, num_warmup=args.warmup, num_samples=args.draws,
                retries=args.reruns, seed=args.seed, predictive=not args.mean_only, run_effects=run_effects, model_effects=model_effects,
                weights_by=args.stack_by,
                stages_for=lambda name: StageStore(os.path.join(args.out, "forms", name), resume=args.resume,
                                                   inputs=form_inputs(FAMILIES[name]),
                                                   log=log.warning),
                log=log)
    grid_sol, named_sol, line = result.prediction.grid, result.prediction.named, result.prediction.linear_law
    failed = int(np.sum(np.asarray(grid_sol.status) != 0))
    log(f"N*: solved {len(m_grid) - failed}/{len(m_grid)} grid targets"
        + (f"; mu={float(line.mu):.4e} M0={float(line.m0):.4e}" if line else ""))
    statuses = np.concatenate([np.asarray(grid_sol.status).ravel(), np.asarray(named_sol.status).ravel()])
    for code in sorted(set(statuses.tolist()) - {0}):
        log(f"  {int(np.sum(statuses == code))} target(s) unsolved: {status_message(code)}")
    return result, stacking, starts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    configure_jax(compile_cache=None if args.no_compile_cache else args.compile_cache)

    return run_command(lambda: run(args), f"finished stages are kept in {os.path.join(args.out, 'stages')}; rerun "
                                          "the same command with --resume to continue")


if __name__ == "__main__":
    sys.exit(main())
