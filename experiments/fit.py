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
import shutil
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from experiments.datasets import DATASETS
from experiments.runlog import (COMPILE_CACHE_ENV, Log, UsageError, check_arguments, configure_jax,
                               default_compile_cache, make_output_folder, run_command, run_header, write_json)
from sdsl_jax import ACCEPTANCE_MODELS, COST_MODELS, FAMILIES, check_acceptance_data, check_loss_law_data, status_message
from sdsl_jax.assumptions import (AnalysisSettings, Setting, SettingsError, format_assumptions, settings_from_data,
                                  unlabelled_repeats)
from sdsl_jax.data import DataError, load_acceptance, load_pretraining
from sdsl_jax.latency import fit_latency_file
from sdsl_jax.recipes import RECIPES, parse_recipe
from sdsl_jax.store import StageStore, content_digest


OUTPUTS = ("summary.json", "loss_law_posterior.nc", "plane_posterior.nc", "loss_law_fit.png", "n_star_bands.png",
           "throughput_curves.png", "acceptance_plane.png")
"""Every file a run can write in --out (besides stages/)."""


def _finite_positive(name: str, value: float) -> None:
    if not (np.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a positive finite number, got {value!r}")


def validate_args(args, drop: int) -> None:
    """Check every argument before any work or any file is made (UsageError names the argument)."""
    if args.num_targets < 2:
        raise UsageError(f"--num-targets must be at least 2 (the linear law needs two targets), got {args.num_targets}")
    for name in ("m_min", "m_max", "d_draft", "d_target"):
        if getattr(args, name) is not None:  # None: from the data (or the shipped dataset)
            _finite_positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.m_min is not None and args.m_max is not None and not args.m_min < args.m_max:
        raise UsageError(f"--m-min ({args.m_min:g}) must be below --m-max ({args.m_max:g})")
    for m in args.targets or ():
        _finite_positive("--targets", m)
    if args.starts is not None and args.starts < 1:
        raise UsageError(f"--starts K uses every K-th start: K must be at least 1, got {args.starts}")
    if drop < 0:
        raise UsageError(f"--drop-highest-loss must be >= 0, got {drop}")
    check_arguments(args, at_least_one=("chains", "warmup", "draws"), out=args.out)
    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise UsageError(f"--out {args.out} lies under {parent}, which is a file")


def analysis_settings(args, dataset, acceptance, acc_path, user_data):
    """D, D', the targets and the grid: from the flags, else the user's data, else the shipped dataset."""
    if user_data:
        try:
            return settings_from_data(acceptance, d_draft=args.d_draft, d_target=args.d_target, targets=args.targets,
                                      m_min=args.m_min, m_max=args.m_max, needs_d_draft=args.recipe == "fixed",
                                      source=acc_path or "the acceptance data")
        except SettingsError as err:
            raise UsageError(str(err)) from None

    def setting(flag, value, default):
        if value is not None:
            return Setting(value, flag)
        return Setting(default, f"the {dataset.name} dataset's analysis setting")

    return AnalysisSettings(
        setting("--d-draft", args.d_draft, dataset.d_draft), setting("--d-target", args.d_target, dataset.d_target),
        setting("--targets", tuple(args.targets) if args.targets else None, dataset.targets),
        setting("--m-min, --m-max", (args.m_min, args.m_max) if args.m_min is not None and args.m_max is not None
                else None, (args.m_min or dataset.m_min, args.m_max or dataset.m_max)))


def run_labels_checked(runs, path, args, dataset) -> None:
    """Two rows of one size and one budget without run labels are two runs; grouping them as one
    (the default when ``run`` is blank) would merge separate runs into one random effect."""
    if args.run_effects == "off" or (dataset.one_run_per_row and not args.pretraining):
        return
    pair = unlabelled_repeats(runs)
    if pair is not None:
        first, second = pair
        raise DataError(path, None, "run", f"the rows of N = {runs.n_params[first]:.6g}, D = {runs.n_tokens[first]:.6g} "
                        f"(rows {first + 1} and {second + 1} of the data) have no run label: two rows at one budget are "
                        "two runs; give each its own run label (or --run-effects off)")


def assumptions_record(args, settings, *, runs, acceptance, pre_path, acc_path, family, acceptance_model, dataset,
                       user_data, drop) -> dict:
    """What the prediction assumes, each with its source: summary.json's ``assumptions``."""
    blank_runs = all(r is None for r in runs.run) and len(set(runs.n_params)) < len(runs)
    return dict(
        data=dict(pretraining=dict(path=pre_path, sha256=runs.sha256, rows=len(runs), dropped_highest_loss=drop),
                  acceptance=dict(path=acc_path, sha256=acceptance.sha256, rows=len(acceptance))
                  if acceptance is not None else None),
        dataset="your data" if user_data else dataset.name,
        **settings.as_dict(),
        recipe=args.recipe, cost=args.cost, law=family.name,
        acceptance_model=(f"{acceptance_model.name}, fitted to {acc_path}" if acceptance is not None
                          else "the paper's plane SDSL2026, fixed (no acceptance data)"),
        runs=("rows independent (--run-effects off)" if args.run_effects == "off" else
              "rows of one size are one training run (the run column is blank)" if blank_runs and not
              (dataset.one_run_per_row and not args.pretraining) else "as labelled"))


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
                        "comma-separated FORMS), weight the forms by Bayesian stacking of their PSIS-LOO predictive "
                        "densities (az.loo, compare.stack) and report the bands of the stacked mixture (the point-fit columns "
                        "stay those of --law)")
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


class Inputs(NamedTuple):
    """Everything a run reads and decides before it writes anything (``prepare``)."""

    dataset: Any
    user_data: bool
    pre_path: str
    acc_path: str | None
    drop: int
    runs: Any
    acceptance: Any
    family: Any
    acceptance_model: Any
    cost: Any
    latency_fit: Any
    latency_rows: Any
    settings: Any
    recipe: Any


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


def data_record(inputs: Inputs) -> dict:
    """The files read, with the digests of the bytes parsed."""
    runs, acceptance = inputs.runs, inputs.acceptance
    return dict(pretraining=dict(path=inputs.pre_path, sha256=runs.sha256, runs_used=len(runs),
                                 dropped_highest_loss=inputs.drop),
                acceptance=dict(path=inputs.acc_path, sha256=acceptance.sha256, pairs=len(acceptance))
                if acceptance else None)


def settings_record(args, inputs: Inputs, starts: int) -> dict:
    """The run's choices; the NUTS settings only for a run that sampled."""
    return dict(dataset="your data" if inputs.user_data else inputs.dataset.name, law=inputs.family.name,
                acceptance_model=inputs.acceptance_model.name, cost=args.cost, recipe=args.recipe,
                d_draft=args.d_draft, d_target=args.d_target,
                m_grid=[float(args.m_min), float(args.m_max), args.num_targets], starts=starts,
                **(dict(chains=args.chains, warmup=args.warmup, draws=args.draws,
                        bands="mean curve only" if args.mean_only else "posterior-predictive")
                   if args.posterior else {}))


def latency_record(args, inputs: Inputs) -> dict | None:
    """The latency model behind --cost latency (None for a FLOP cost)."""
    fit, rows = inputs.latency_fit, inputs.latency_rows
    if fit is None:
        return None
    return dict(path=args.latency, sha256=rows.sha256, batch=args.latency_batch, form=fit.form, coef=fit.coef,
                relative_rmse=fit.relative_rmse, loop_overheads=fit.overheads,
                meaning="t(N, k) = t0 + t1 k + c1 N + c2 N k seconds per call; T* in tokens per second")


def log_diagnostics(post, log) -> bool:
    """One line per posterior run: OK with its numbers, or a banner with what failed and what to do.
    Returns whether every run passed."""
    from sdsl_jax.report import diagnostics_advice

    ok = True
    for name, diag in post.diagnostics.items():
        geometry = (f"; {diag.median_steps:.0f} leapfrog steps per draw (median; mean {diag.mean_steps:.0f}), "
                    f"{diag.max_tree_depth_share:.0%} of draws "
                    "at the maximum tree depth" if np.isfinite(diag.mean_steps) else "")
        if diag.ok:
            log(f"diagnostics ({name}): OK (max R-hat {diag.max_rhat:.3f}, min bulk ESS "
                f"{diag.min_ess_bulk:.0f}, {diag.num_divergences} divergences{geometry})")
        else:
            ok = False
            banner = "!" * 78
            log(f"{banner}\nWARNING: {name} posterior failed its diagnostics: {'; '.join(diag.problems)}.\n"
                f"Do not trust its bands. {diagnostics_advice(name, post)}\n{banner}")
    return ok


def prepare(args) -> Inputs:
    """Every argument and input checked and loaded, the settings resolved; nothing written yet."""
    dataset = DATASETS[args.dataset]
    user_data = bool(args.pretraining or args.acceptance)  # then no shipped dataset's settings apply
    pre_path = args.pretraining or dataset.pretraining
    acc_path = args.acceptance or (dataset.acceptance if not args.pretraining else None)
    drop = args.drop_highest_loss if args.drop_highest_loss is not None else (
        dataset.drop_highest_loss if not args.pretraining else 0)
    validate_args(args, drop)
    if args.latency_batch < 1:
        raise UsageError(f"--latency-batch must be at least 1, got {args.latency_batch}")
    if args.stack and not args.posterior:
        raise UsageError("--stack weights the forms' posteriors: add --posterior")
    if args.stack and args.stack != "all":
        unknown = [f for f in args.stack.split(",") if f not in FAMILIES]
        if unknown:
            raise UsageError(f"--stack {args.stack}: unknown form(s) {', '.join(unknown)} (choose from "
                             f"{', '.join(FAMILIES)})")
    try:
        parse_recipe(args.recipe, 1.0)  # the spec's syntax, before any work; the budget comes later
    except ValueError as err:
        raise UsageError(str(err)) from None
    family, acceptance_model = FAMILIES[args.law], ACCEPTANCE_MODELS[args.acceptance_model]
    latency_fit = latency_rows = None
    if (args.cost == "latency") != (args.latency is not None):
        raise UsageError("--cost latency and --latency PATH go together (the latency model is fitted from PATH)")
    if args.cost == "latency":
        latency_fit, latency_rows = fit_latency_file(args.latency, args.latency_batch)
        cost = latency_fit.cost
    else:
        cost = COST_MODELS[args.cost]

    # Every input is read and checked before anything is created in --out.
    runs = load_pretraining(pre_path)
    if drop:
        if drop >= len(runs) - 5:
            raise UsageError(f"--drop-highest-loss {drop} leaves fewer than 6 of the {len(runs)} runs")
        runs = runs.select(np.sort(np.argsort(runs.loss, kind="stable")[:-drop]))
    acceptance = load_acceptance(acc_path) if acc_path else None
    check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=family,
                        source=pre_path + (f" (after --drop-highest-loss {drop})" if drop else ""))
    if acceptance is not None:
        check_acceptance_data(acceptance.ppl_draft, acceptance.ppl_target, acceptance.alpha, model=acceptance_model,
                              source=acc_path)
    settings = analysis_settings(args, dataset, acceptance, acc_path, user_data)
    args.d_draft, args.d_target = settings.d_draft.value, settings.d_target.value
    args.targets, (args.m_min, args.m_max) = list(settings.targets.value), settings.m_range.value
    if not args.m_min < args.m_max:
        raise UsageError(f"--m-min ({args.m_min:g}) must be below --m-max ({args.m_max:g})")
    recipe = parse_recipe(args.recipe, args.d_draft)
    run_labels_checked(runs, pre_path, args, dataset)
    return Inputs(dataset, user_data, pre_path, acc_path, drop, runs, acceptance, family, acceptance_model, cost,
                  latency_fit, latency_rows, settings, recipe)


def announce(args, inputs: Inputs, assumptions: dict, log) -> None:
    """The assumptions, the latency model and the data, before the long work starts."""
    latency_fit, latency_rows, runs, acceptance = inputs.latency_fit, inputs.latency_rows, inputs.runs, inputs.acceptance
    for line in format_assumptions(assumptions):
        log(line)
    if latency_fit is not None:
        c = latency_fit.coef
        log(f"latency: t(N, k) = {c['t0']:.3g} + {c['t1']:.3g} k + {c['c1']:.3g} N + {c['c2']:.3g} N k seconds "
            f"(form {latency_fit.form}, relative RMSE {latency_fit.relative_rmse:.1%}, {len(latency_rows)} calls at batch "
            f"{args.latency_batch}, N {latency_rows.n_params.min():.3g}-{latency_rows.n_params.max():.3g})"
            + ("; loop overheads " + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in latency_fit.overheads.items())
               if latency_fit.overheads else ""))
        beyond = max(args.m_max, max(args.targets)) / latency_rows.n_params.max()
        if beyond > 1.5:
            log(f"WARNING: the targets reach {beyond:.3g}x the largest timed model: the latency model is extrapolated")
    log(f"data: {len(runs)} pre-training runs from {inputs.pre_path}"
        + (f" ({inputs.drop} highest-loss dropped)" if inputs.drop else "")
        + (f"; {len(acceptance)} acceptance pairs from {inputs.acc_path}" if acceptance else
           "; no acceptance data: plane fixed at SDSL2026"))


def fit_and_predict(args, inputs: Inputs, log):
    """The pipeline (point fits, posteriors, N*) and, with --stack, the other forms: ``(result, stacking, starts)``."""
    from sdsl_jax import pipeline  # after configure_jax: the pipeline's compiled code is float64

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
                       seed=args.seed, law=family.name, acceptance_model=acceptance_model.name)
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
            fingerprint.update(model_effects=bool(model_effects))
            log("posterior: " + ("per-draft and per-target model effects in the acceptance model (pairs sharing a "
                                 "model share its effect)" if model_effects else "acceptance pairs independent")
                + f" ({why})")
    stages = StageStore(args.out, resume=args.resume, inputs=fingerprint, log=log.warning)
    m_grid = np.linspace(args.m_min, args.m_max, args.num_targets)
    named = np.asarray(args.targets, np.float64)
    log(f"loss law: {family.name}, multi-start L-BFGS from {len(starts)} starts (compiling first)")
    # NumPyro's bars garble each other with parallel chains; the heartbeat speaks instead.
    with log.heartbeat(8.0):
        result = pipeline.run(
            runs, acceptance, m_grid=m_grid, targets=named, d_target=args.d_target, recipe=recipe, family=family,
            acceptance_model=acceptance_model, cost=cost, posterior=args.posterior, num_chains=args.chains,
            num_warmup=args.warmup, num_samples=args.draws, seed=args.seed, starts=starts, stages=stages,
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
                seed=args.seed, predictive=not args.mean_only, run_effects=run_effects, model_effects=model_effects,
                stages_for=lambda name: StageStore(os.path.join(args.out, "forms", name), resume=args.resume,
                                                   inputs=dict(fingerprint, law=name), log=log.warning),
                log=log)
    grid_sol, named_sol, line = result.prediction.grid, result.prediction.named, result.prediction.linear_law
    failed = int(np.sum(np.asarray(grid_sol.status) != 0))
    log(f"N*: solved {len(m_grid) - failed}/{len(m_grid)} grid targets"
        + (f"; mu={float(line.mu):.4e} M0={float(line.m0):.4e}" if line else ""))
    statuses = np.concatenate([np.asarray(grid_sol.status).ravel(), np.asarray(named_sol.status).ravel()])
    for code in sorted(set(statuses.tolist()) - {0}):
        log(f"  {int(np.sum(statuses == code))} target(s) unsolved: {status_message(code)}")
    return result, stacking, starts


def write_figures_and_clean(args, inputs: Inputs, result, assumptions: dict, log) -> None:
    """The figures, then the folder cleared of what an earlier run with other options left."""
    post = result.posterior
    if not args.no_figures:
        from sdsl_jax import figures

        log("figures: drawing")
        with log.heartbeat(8.0):
            made = figures.fit_figures(args.out, result, runs=inputs.runs, acceptance=inputs.acceptance, d_target=args.d_target,
                                       recipe=inputs.recipe, cost=inputs.cost, compare_to_paper=inputs.dataset.compare_to_paper,
                                       predictive=not args.mean_only,
                                       caption="\n".join(["python -m experiments.fit " + " ".join(args.argv)]
                                                         + format_assumptions(assumptions)[2:]))
        log("figures: " + ", ".join(made))
    else:
        made = []
    # The folder holds this run's files only: drop what an earlier run with other options left.
    written = {os.path.abspath(p) for p in made} | {os.path.abspath(os.path.join(args.out, "summary.json"))}
    if post is not None:
        written |= {os.path.abspath(os.path.join(args.out, n + ".nc")) for n in ("loss_law_posterior", "plane_posterior")
                    if n == "loss_law_posterior" or post.plane_run is not None}
    if not args.stack and os.path.isdir(os.path.join(args.out, "forms")):
        shutil.rmtree(os.path.join(args.out, "forms"))  # an earlier --stack run's forms
    for name in OUTPUTS:
        path = os.path.abspath(os.path.join(args.out, name))
        if path not in written and os.path.isfile(path):
            os.remove(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    configure_jax(compile_cache=None if args.no_compile_cache else args.compile_cache)

    return run_command(lambda: run(args), f"finished stages are kept in {os.path.join(args.out, 'stages')}; rerun "
                                          "the same command with --resume to continue")


if __name__ == "__main__":
    sys.exit(main())
