"""Close the loop on the ladder: does the SDSL law, fitted on our models, pick the draft that measures best?

    python -m experiments.closure --data fits/ladder-v1 --posterior      # the committed table
    python -m experiments.closure --data out/ladder/micro/measure     # micro ladder (tests)

From ``pretraining.csv`` and ``acceptance.csv`` (``experiments.measure``): fit the loss law
L(N, D) (Epoch method) and the acceptance plane alpha = A x + B y + C (weighted least squares),
and with ``--posterior`` their NUTS posteriors. Then for every target of ``speculative.csv``:

* predicted: T*(N) = max_gamma T for each of the ladder's drafts, from its own (N, D) and the
  target's (M, D') through L and the plane [SDSL, eqs. for T and gamma*]; the predicted best draft,
  and with the posterior the probability that each draft is the best and the Bayes decision (the
  draft with the highest posterior-expected T, scored by its regret beside the point fit's pick,
  in sample and prospectively); the continuous N* (solved
  by Newton on the gradient, ``solve_draft_size``) with its 90% band, at a draft budget D equal
  to the geometric mean of the candidate drafts' budgets (the law's N* assumes one D for all N);
* measured: tokens per FLOP under the SDSL cost model (2N per draft token, 2M per verification)
  at each measured gamma; the best (draft, gamma); the fastest wall-clock (draft, gamma);
* predicted vs measured alpha (the plane's alpha against the MLE from the speculative runs) and
  T* at the measured-best draft.

With ``--measured acceptance`` (data without speculative runs, such as the factorial ladder's) the
measured side is the tokens per FLOP each pair's acceptance rate gives at its best integer lookahead
(:func:`sdsl_jax.validation.closure.expected_speculative_runs`).

With ``--stack`` every loss-law form and acceptance model is fitted and the forms are weighted
by Bayesian stacking (:func:`fit_forms`); P(best), the T bands and the predicted best are then the
stacked mixture's, and with ``--prospective`` each fit without a draft size chooses its forms and
weights again without it, so the forecast scored is the whole procedure's, form choice included.

With ``--forward`` each target is also predicted as a lab would have predicted it before pairing it:
from one fit of the pre-training runs of the target and of smaller models and of the acceptance
pairs whose target is smaller (the paper's plane where those pairs cannot identify the acceptance
model yet); its P(best), Bayes decision and regret are scored beside the baselines.

With ``--prior-sensitivity`` the in-sample fit is made again with every prior twice as wide
(:func:`sdsl_jax.infer.models.widened_priors`), and the report says how far P(best) and the Bayes
decision moved.

Every forecast (in sample, prospective, forward) is scored by log score, Brier and regret beside
forecasts made without a fit (uniform, the smallest draft, the previous target's best, a fixed M/N
ratio), with the skill over the best of them and its interval over resampled targets.

Writes ``closure.json``, ``closure.md`` (the table) and ``closure.png`` to ``--out``
(``<data>/closure``).
"""

from __future__ import annotations

import argparse
import os
import sys

from experiments.runlog import (Log, UsageError, check_arguments, configure_jax, make_output_folder, run_command,
                               run_header, write_json, write_text)
from sdsl_jax import ACCEPTANCE_MODELS, FAMILIES
from sdsl_jax.compare import STACKING_DENSITIES
from sdsl_jax.data import DataError, load_acceptance, load_pretraining, load_speculative
from sdsl_jax.predict.ranking import NOT_PINNED_DOWN
from sdsl_jax.validation.closure import (close_loop, closure_scores, expected_speculative_runs, failed_diagnostics,
                                          measured_perplexities)
from sdsl_jax.validation.closure_report import closure_markdown, figure
from sdsl_jax.validation.closure_fits import (ClosureSettings, add_forward, fit_in_sample, forward_fits,
                                              prior_sensitivity, prospective)
from sdsl_jax.validation.forms import Stages, stack_records


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.closure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder-v1", help="folder with pretraining.csv, acceptance.csv and "
                   "speculative.csv (fits/ladder-v1)")
    p.add_argument("--text", choices=("heldout", "hellaswag"), default="heldout",
                   help="which evaluation text's perplexities and alpha to fit (heldout)")
    p.add_argument("--law", choices=sorted(FAMILIES), default="chinchilla",
                   help="loss-law form: " + ", ".join(FAMILIES) + " (chinchilla)")
    p.add_argument("--acceptance-model", choices=sorted(ACCEPTANCE_MODELS), default="plane",
                   help="acceptance model: " + ", ".join(ACCEPTANCE_MODELS) + " (plane)")
    p.add_argument("--measured", choices=("speculative", "acceptance"), default="speculative",
                   help="the measured side: speculative.csv's runs (speculative), or for data without them the "
                        "tokens per FLOP each pair's acceptance rate gives at its best integer lookahead, drafts at "
                        "their size's top budget (acceptance; exact rates, as the factorial ladder's, make it what "
                        "speculative runs measure in expectation)")
    p.add_argument("--posterior", action="store_true", help="NUTS posteriors: P(best draft) and bands")
    p.add_argument("--stack", nargs="?", const="all", default=None, metavar="FORMS",
                   help="with --posterior: fit every loss-law form and acceptance model (or the comma-separated FORMS, "
                        "names of either kind; a kind not named keeps --law / --acceptance-model), weight them by "
                        "Bayesian stacking (PSIS-LOO) and score the stacked mixture; with --prospective the forms "
                        "and weights are chosen again without each left-out size")
    p.add_argument("--stack-by", choices=STACKING_DENSITIES, default="rows",
                   help="how --stack weighs the loss laws: rows (default), PSIS-LOO over the pre-training rows; "
                        "sizes, each model size of the fit's data left out in turn and every law refitted without "
                        "it, and each draft size of its pairs for the acceptance models, inside every prospective "
                        "and forward refit too (nested; many posteriors per refit)")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--reruns", type=int, default=2, help="times a posterior that fails its checks is run again from "
                   "new prior starts, each time with twice the warm-up and draws of the last (2)")
    p.add_argument("--propagate", type=int, default=1000, help="posterior draws pushed through N* (1000)")
    p.add_argument("--starts", type=int, default=1, metavar="K", help="use every K-th start of the law's grid (1: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (<data>/closure)")
    p.add_argument("--mean-only", action="store_true", help="P(best) and the T bands from the law's mean and the "
                   "plane's coefficients only, without the residual scatter of new models")
    p.add_argument("--forward", action="store_true",
                   help="with --posterior: also predict each target from one fit of what came before it (the runs "
                        "of it and of smaller models, the pairs of smaller targets): the forward-chaining score; with "
                        "--stack every form is fitted and weighted again from those data alone")
    p.add_argument("--prospective", action="store_true",
                   help="with --posterior: also predict each draft with its own size left out of both fits (one "
                        "refit per draft size), scored like the in-sample P(best)")
    p.add_argument("--prior-sensitivity", nargs="?", type=float, const=2.0, default=None, metavar="WIDTH",
                   help="with --posterior: fit in sample again with every prior WIDTH (2) times as wide and report how "
                        "P(best) and the Bayes decision move")
    p.add_argument("--resume", action="store_true",
                   help="with --posterior: reuse the point fits and posteriors an interrupted run with the same data "
                        "and settings kept in <out>/stages/ (every finished fit is kept there)")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def stacked_forms(args) -> tuple[list, list] | None:
    """``--stack``'s (loss-law families, acceptance models); None without it."""
    if args.stack is None:
        return None
    if not args.posterior:
        raise ValueError("--stack weights the forms' posteriors: add --posterior")
    names = list(FAMILIES) + list(ACCEPTANCE_MODELS) if args.stack == "all" else args.stack.split(",")
    unknown = [n for n in names if n not in FAMILIES and n not in ACCEPTANCE_MODELS]
    if unknown:
        raise ValueError(f"--stack {args.stack}: unknown form(s) {', '.join(unknown)} (loss laws: "
                         f"{', '.join(FAMILIES)}; acceptance models: {', '.join(ACCEPTANCE_MODELS)})")
    families = [FAMILIES[n] for n in names if n in FAMILIES] or [FAMILIES[args.law]]
    models = [ACCEPTANCE_MODELS[n] for n in names if n in ACCEPTANCE_MODELS] or [ACCEPTANCE_MODELS[args.acceptance_model]]
    return families, models


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_jax()
    return run_command(lambda: _close(args, argv), "the closure writes its tables only when it ends; its finished "
                                                   "fits are kept in <out>/stages/: rerun the same command with "
                                                   "--resume to reuse them")


def validate_args(args) -> None:
    """Every argument checked before any work or file (UsageError names the argument)."""
    check_arguments(args, at_least_one=("chains", "warmup", "draws", "propagate", "starts"), out=args.out)
    if args.reruns < 0:
        raise UsageError(f"--reruns must be >= 0, got {args.reruns}")
    try:
        stacked_forms(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    for flag, given in (("--forward", args.forward), ("--prior-sensitivity", args.prior_sensitivity is not None)):
        if given and not args.posterior:
            raise UsageError(f"{flag} compares posterior forecasts: add --posterior")
    if args.prior_sensitivity is not None and not args.prior_sensitivity > 0:
        raise UsageError(f"--prior-sensitivity WIDTH must be a positive number, got {args.prior_sensitivity}")


def check_named_models(speculative, pairs) -> None:
    """Every draft and target of the speculative runs must have a measured perplexity in the pairs."""
    known = set(pairs.draft) | set(pairs.target)
    for i, (target, draft) in enumerate(zip(speculative.target, speculative.draft)):
        for column, name in (("target", target), ("draft", draft)):
            if name not in known:
                raise DataError(speculative.path, i + 2, column, f"{name!r} is in no row of {pairs.path} (its "
                                "perplexity is needed): the two files must name the same models")


def _close(args, argv) -> int:
    validate_args(args)
    log = Log(args.quiet)
    suffix = "" if args.text == "heldout" else "_hellaswag"
    paths = dict(pretraining=os.path.join(args.data, f"pretraining{suffix}.csv"),
                 acceptance=os.path.join(args.data, f"acceptance{suffix}.csv"))
    runs, pairs = load_pretraining(paths["pretraining"]), load_acceptance(paths["acceptance"])
    tables = [runs, pairs]
    if args.measured == "speculative":
        paths["speculative"] = os.path.join(args.data, "speculative.csv")
        speculative = load_speculative(paths["speculative"])
        check_named_models(speculative, pairs)
        tables.append(speculative)
        measured = None
    else:
        speculative = expected_speculative_runs(pairs)
        measured = (f"no speculative runs: each pair's tokens per FLOP from its acceptance rate in {paths['acceptance']} "
                    "at its best integer lookahead (SDSL cost, i.i.d. acceptance), drafts at their size's top budget; "
                    "no bootstrap over prompts, no wall-clock.")
    stack = stacked_forms(args)
    out = make_output_folder(args.out or os.path.join(args.data, "closure"))
    stages = Stages(os.path.join(out, "stages"), resume=args.resume, log=log.warning, settings=dict(
        seed=args.seed, chains=args.chains, warmup=args.warmup, draws=args.draws, starts=args.starts,
        reruns=args.reruns))
    settings = ClosureSettings(law=args.law, acceptance_model=args.acceptance_model, starts_every=args.starts,
                               chains=args.chains, warmup=args.warmup, draws=args.draws, propagate=args.propagate,
                               seed=args.seed, mean_only=args.mean_only, posterior=args.posterior,
                               reruns=args.reruns, stack_by=args.stack_by)
    fit = fit_in_sample(runs, pairs, settings, stack=stack, stages=stages, log=log)
    records = close_loop(speculative, fit.point, draws=fit.draws, scales=fit.scales,
                         perplexities=measured_perplexities(pairs), seed=args.seed, runs=runs, pairs=pairs)
    if fit.forms is not None:
        stack_records(records, fit.forms, seed=args.seed)
    sensitivity = None
    if args.prior_sensitivity is not None:
        sensitivity = prior_sensitivity(records, speculative, runs, pairs, settings, width=args.prior_sensitivity,
                                        stack=stack, stages=stages, log=log)
    prospective_skipped = prospective_weights = None
    if args.prospective:
        prospective_skipped, prospective_weights = prospective(records, speculative, runs, pairs, fit, settings,
                                                               stack=stack, stages=stages, log=log)
    forward_fits_record = None
    if args.forward:
        forward_fits_record = {}
        targets = {r["target"]: r["m_target"] for r in records}
        fits = forward_fits(runs, pairs, targets, family=fit.point.family, model=fit.point.acceptance_model,
                            starts_every=args.starts, chains=args.chains, warmup=args.warmup, draws=args.draws,
                            propagate=args.propagate, seed=args.seed, stack=stack, reruns=args.reruns,
                            stack_by=args.stack_by, stages=stages, summaries=forward_fits_record, log=log)
        add_forward(records, fits, seed=args.seed)
    scores = closure_scores(records)
    failed = failed_diagnostics(fit.diagnostics, prospective_weights, fit.stacking, forward_fits_record)
    if failed:
        log(f"diagnostics: {len(failed)} posterior(s) failed their checks (listed in closure.md)")
    table = closure_markdown(records, scores, fit, failed, propagate=args.propagate, sensitivity=sensitivity,
                             measured=measured)
    print(table)
    write_text(os.path.join(out, "closure.md"), table)
    point = fit.point
    write_json(os.path.join(out, "closure.json"), dict(
        **run_header("experiments.closure", argv), seed=args.seed,
        data={k: dict(path=v, sha256=t.sha256) for (k, v), t in zip(paths.items(), tables)},
        measured=measured or "speculative runs (speculative.csv)",
        law_family=point.family.name, acceptance_model=point.acceptance_model.name, stacking=fit.stacking,
        prospective_fits=prospective_weights, forward_fits=forward_fits_record, failed_diagnostics=failed,
        prior_sensitivity=sensitivity,
        loss_law={k: float(v) for k, v in point.law._asdict().items()},
        loss_law_source=("point fit" if not fit.point_fit_at_bound else "posterior median law (the point fit's "
                         + ", ".join(fit.point_fit_at_bound) + f" {NOT_PINNED_DOWN})"),
        plane={k: float(v) for k, v in point.plane._asdict().items()}, plane_r_squared=point.plane_r_squared,
        diagnostics=fit.diagnostics, forecast_scores=scores if fit.draws is not None else None,
        prospective_skipped=prospective_skipped,
        bands="posterior-predictive (residuals of log loss and alpha drawn per candidate)"
        if fit.draws is not None and fit.scales is not None
        else ("law mean and plane only" if fit.draws is not None else None),
        targets=records))
    if not args.no_figure:
        figure(records, os.path.join(out, "closure.png"))
    log(f"wrote {out}/closure.json, closure.md" + ("" if args.no_figure else ", closure.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
