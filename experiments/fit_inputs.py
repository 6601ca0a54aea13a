"""What ``python -m experiments.fit`` reads and decides before any work: every argument and input checked,
the analysis settings resolved with their sources, the assumptions recorded and announced."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from experiments.datasets import DATASETS
from experiments.runlog import UsageError, check_arguments
from sdsl_jax import ACCEPTANCE_MODELS, COST_MODELS, FAMILIES, check_acceptance_data, check_loss_law_data
from sdsl_jax.assumptions import (AnalysisSettings, Setting, SettingsError, format_assumptions, settings_from_data,
                                  unlabelled_repeats)
from sdsl_jax.data import DataError, load_acceptance, load_pretraining
from sdsl_jax.latency import fit_latency_file
from sdsl_jax.recipes import parse_recipe


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
    if args.reruns < 0:
        raise UsageError(f"--reruns must be >= 0, got {args.reruns}")
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


def _shown(path: str) -> str:
    """``path`` relative to the working folder when it lies inside it: a result's text names no machine's folders."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


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
        acceptance_model=(f"{acceptance_model.name}, fitted to {_shown(acc_path)}" if acceptance is not None
                          else "the paper's plane SDSL2026, fixed (no acceptance data)"),
        runs=("rows independent (--run-effects off)" if args.run_effects == "off" else
              "rows of one size are one training run (the run column is blank)" if blank_runs and not
              (dataset.one_run_per_row and not args.pretraining) else "as labelled"))


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
