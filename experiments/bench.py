"""Benchmarks: sdsl_jax against the obvious alternative, in the same run, with ratios.

    python -m experiments.bench                 # everything (what `make bench` runs)
    python -m experiments.bench --only lambertw --points 100000

Sections:
  lambertw    1e6 float64 points per branch, jitted and vmapped (XLA's defaults, and 512-bit vectors),
              against scipy.special.lambertw;
              both accuracies measured against mpmath (50 digits) on a subsample and near -1/e.
  draft_size  N* for 10,000 target sizes in one vectorised call against a Python loop of
              scipy.optimize.minimize_scalar solves of the NumPy version of the same objective
              (experiments/numpy_reference.py), same bracketing grid; max disagreement in N*.
  forms       N* against a brute-force grid of T for every loss-law family, acceptance model, draft
              recipe and cost (coefficients fitted to the shipped ladder, the one-break law's to the
              first, jittered per target): statuses, faults (a solve below the best T, a gain
              missed), time of both.
  draws       N* on the one-break law's posterior draws (first ladder) against a brute-force grid of T, for
              each acceptance model, drafts at 20 and 40 tokens per parameter and at a fixed compute, three
              targets: statuses and faults as in forms.
  fit         the loss-law fit from the Epoch replication's 4,500 starts (multi-start optax L-BFGS)
              against scipy.optimize.minimize (L-BFGS-B, analytic gradient) looped over a random
              subset of the same starts: time per start and both optima.
  calibration coverage of 90% posterior intervals over synthetic datasets (plane, loss law), and of
              90% N* bands on synthetic ladders with per-run effects (mean-curve and predictive).
  nuts        posteriors of same-shaped datasets one after the other (calibration, refits): NumPyro's
              own sampling loop, compiled again on every run, against the loop compiled once; same draws.
  geometry    NUTS on the Chinchilla reference and the model ladder (four seeds each) in three coordinates of
              the law: terms at N = D = 1, at the data's centre sampled as stated, and the same prior as the
              log loss and the terms' log slopes at the centre (shipped): steps per draw, checks passed;
              the data-only law on the ladder in its stated and shipped coordinates;
              and the ladder's acceptance pairs with per-model effects, non-centred (shipped) against
              projected coordinates.
  effects     the ladder's acceptance pairs with per-model effects on the drafts only (shipped: six
              targets are too few for a scale of their own) against effects on both kinds, non-centred
              and projected: how many of --effect-seeds NUTS runs pass their checks (all pairs, and a
              closure's refit without the smallest size).
  accept      each acceptance model with per-draft and per-target effects on the factorial ladder's
              pairs at target acceptance 0.9 and 0.99: checks passed, divergences, steps per draw,
              ESS and time (--effect-seeds runs each).
  warmup      where an acceptance posterior's leapfrog steps go (warm-up against draws) on the factorial
              ladder's pairs, its coefficients scaled to their prior (shipped, chains from the prior)
              against scaled to a least-squares fit (sample_plane(coefficients="data-scaled"), chains
              dispersed about it); --accept-models, --effect-seeds, --warmup-prior-starts.
  breaks      the one-break law's posterior on the ladder at target acceptance 0.9 and 0.95 against
              the family's 0.99: runs passing their checks, divergences, R-hat, ESS and steps per draw
              (--effect-seeds runs each, --reruns reruns of a failing run).
  reruns      a failing posterior run again with the target acceptance raised on every rerun (shipped)
              against raised only after divergent transitions: Kaplan's law on the first ladder's
              closure refits, runs passing and steps per draw (--effect-seeds runs each).
  break-prior the one-break law's posterior on the factorial ladder with its break inside the data's
              span of D (shipped) against a break anywhere: steps per draw, draws at the tree-depth
              cap, ESS, draws whose loss rises with D after the break (--effect-seeds seeds each).
  break-coordinates
              the one-break law's posterior on the first ladder in its shipped coordinates against those
              its prior is stated in, at target acceptance 0.95 and 0.99: runs passing on the first run
              and after --reruns reruns, steps per draw, ESS, seconds (--effect-seeds runs each).
  decoding    greedy decoding in one jitted loop (the engine's design) against a Python loop over
              a jitted one-token step, same tokens; a 1.2M- and a 25k-parameter model.
  scaling     N* for 1e2-1e6 targets against the SciPy loop's time per target; the point fit on 30 to
              30,000 synthetic runs against SciPy's L-BFGS-B per start, with the share of starts that
              reach the optimum; NUTS on 30 to 3,000 runs (--scaling-parts picks these tables).

Timings are medians over repeats after a warm-up (compilation is reported separately).
"""

from __future__ import annotations

import argparse
import datetime
import sys

import jax

from experiments.benchmarks.decoding_loop import bench_decoding
from experiments.benchmarks.inference import (bench_acceptance_warmup, bench_break_acceptance,
                                              bench_break_coordinates, bench_break_prior, bench_calibration,
                                              bench_effect_sides, bench_effects_target_accept, bench_loss_law_fit,
                                              bench_nuts_geometry, bench_nuts_reuse, bench_rerun_policy)
from experiments.benchmarks.numerics import (bench_draft_size, bench_draft_size_draws, bench_draft_size_forms,
                                             bench_lambertw, machine_description)
from experiments.benchmarks.scaling import SCALING_PARTS, bench_scaling
from experiments.runlog import command_line, run_command, write_json


SECTIONS = {"lambertw": bench_lambertw, "draft_size": bench_draft_size, "forms": bench_draft_size_forms,
            "draws": bench_draft_size_draws,
            "fit": bench_loss_law_fit,
            "calibration": bench_calibration, "nuts": bench_nuts_reuse, "geometry": bench_nuts_geometry,
            "effects": bench_effect_sides, "accept": bench_effects_target_accept, "warmup": bench_acceptance_warmup,
            "breaks": bench_break_acceptance, "reruns": bench_rerun_policy,
            "break-prior": bench_break_prior, "break-coordinates": bench_break_coordinates,
            "decoding": bench_decoding, "scaling": bench_scaling}


def main(argv: list[str] | None = None) -> int:
    jax.config.update("jax_enable_x64", True)  # set here, not at import: float64 for this run
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    parser.add_argument("--points", type=int, default=1_000_000, help="Lambert W points per branch (default 1e6)")
    parser.add_argument("--targets", type=int, default=10_000, help="target sizes for N* (default 10,000)")
    parser.add_argument("--form-targets", type=int, default=200,
                        help="targets per combination in the forms section (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    parser.add_argument("--scipy-starts", type=int, default=100,
                        help="Epoch starts the SciPy loop is timed on (all 4,500 take ~9 minutes; default 100)")
    parser.add_argument("--calibration-datasets", type=int, default=40,
                        help="synthetic datasets per model for the calibration check (default 40)")
    parser.add_argument("--nuts-datasets", type=int, default=10,
                        help="same-shaped datasets sampled one after the other in the NUTS section (default 10)")
    parser.add_argument("--effect-seeds", type=int, default=6,
                        help="NUTS runs per variant and data set in the effects, accept, breaks and reruns "
                             "sections (default 6)")
    parser.add_argument("--reruns", type=int, default=0,
                        help="reruns of a posterior that fails its checks in the breaks and "
                             "break-coordinates sections (default 0)")
    parser.add_argument("--accept-models", default="",
                        help="the accept section's acceptance models, comma-separated (default: all)")
    parser.add_argument("--scaling-parts", default=",".join(SCALING_PARTS),
                        help="the scaling section's tables, comma-separated (default: all of "
                             f"{','.join(SCALING_PARTS)})")
    parser.add_argument("--warmup-prior-starts", action="store_true",
                        help="the warmup section also starts the data-scaled coordinates' chains from the prior")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scaling_parts.split(",")) - set(SCALING_PARTS))
    if unknown:
        parser.error(f"--scaling-parts: unknown table(s) {unknown}; choose from {','.join(SCALING_PARTS)}")
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS

    unknown = [m for m in args.accept_models.split(",") if m and m not in ACCEPTANCE_MODELS]
    if unknown:
        parser.error(f"--accept-models: unknown model(s) {unknown}; choose from {','.join(ACCEPTANCE_MODELS)}")
    if args.reruns < 0:
        parser.error(f"--reruns must be at least 0, got {args.reruns}")
    for name in ("points", "targets", "form_targets", "repeats", "scipy_starts", "calibration_datasets", "nuts_datasets",
                 "effect_seeds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return run_command(lambda: run_benchmarks(args, argv), "nothing was written; rerun the command")


def run_benchmarks(args, argv) -> int:
    print(f"# {datetime.date.today()}  {machine_description()}", flush=True)
    results = []
    for name in args.only or list(SECTIONS):
        if name == "lambertw":
            results += bench_lambertw(args.points, args.repeats)
        elif name == "draft_size":
            results += bench_draft_size(args.targets, args.repeats)
        elif name == "forms":
            results += bench_draft_size_forms(args.form_targets, args.repeats)
        elif name == "draws":
            results += bench_draft_size_draws()
        elif name == "fit":
            results += bench_loss_law_fit(args.scipy_starts, args.repeats)
        elif name == "decoding":
            results += bench_decoding(args.repeats)
        elif name == "nuts":
            results += bench_nuts_reuse(args.nuts_datasets)
        elif name == "geometry":
            results += bench_nuts_geometry()
        elif name == "effects":
            results += bench_effect_sides(args.effect_seeds)
        elif name == "accept":
            results += bench_effects_target_accept(args.effect_seeds, [m for m in args.accept_models.split(",") if m])
        elif name == "warmup":
            results += bench_acceptance_warmup(args.effect_seeds, [m for m in args.accept_models.split(",") if m],
                                               prior_starts=args.warmup_prior_starts)
        elif name == "breaks":
            results += bench_break_acceptance(args.effect_seeds, args.reruns)
        elif name == "reruns":
            results += bench_rerun_policy(args.effect_seeds)
        elif name == "break-prior":
            results += bench_break_prior(args.effect_seeds)
        elif name == "break-coordinates":
            results += bench_break_coordinates(args.effect_seeds, args.reruns)
        elif name == "scaling":
            results += bench_scaling(args.repeats, args.scaling_parts.split(","))
        else:
            results += bench_calibration(args.calibration_datasets)
    if args.json:
        record = dict(date=str(datetime.date.today()), machine=machine_description(),
                      command=command_line("experiments.bench", argv),
                      results=results)
        write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
