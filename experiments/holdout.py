"""Held-out checks of the bands: leave one model size out, predict it, score and compare forms.

    python -m experiments.holdout --data fits/ladder-v1        # fits/ladder-v1/holdout/holdout.{json,md}

For every loss-law family (``--laws``) and every model size s of ``pretraining.csv``: fit the law
(point fit, then NUTS) on the runs of the OTHER sizes and predict the held-out size's runs from the
posterior predictive (law draws plus each draw's Student-t residual). Reported per family:

* coverage of the 90% predictive bands on the held-out losses (nominal 0.90), and of bands that
  carry the law's mean only (the residual left out), as before the predictive propagation;
* grouped leave-one-size-out log predictive density (sum over held-out runs; the groups are the
  sizes, because the runs of one size share one training run, so row-wise LOO would leak);
* forward extrapolation: the fold that holds out the largest size (fit on the smaller ones);
* stacking weights over the families (:func:`sdsl_jax.compare.grouped_stacking_weights`: the
  weights of the mixture of the families' held-out predictive densities that maximise the log
  score). PSIS-LOO takes pointwise densities from one fit; grouped CV needs one fit per fold,
  hence this loop.

The same for the acceptance models (``--acceptance-models``) on ``acceptance.csv``: each size's
pairs (as draft or as target) held out, the model fitted (NUTS) on the rest, its predictive bands
(coefficient draws plus the residual) scored on the held-out alpha.
"""

from __future__ import annotations

import argparse
import os
import sys

from experiments.runlog import (Log, UsageError, check_arguments, configure_jax, make_output_folder, run_command,
                               run_header, write_json, write_text)
from sdsl_jax.data import load_acceptance, load_pretraining
from sdsl_jax.validation.holdout import holdout_markdown, run_holdout


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.holdout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder-v1", help="folder with pretraining.csv and acceptance.csv")
    p.add_argument("--out", help="output folder (DATA/holdout)")
    p.add_argument("--laws", default="chinchilla,kaplan,broken,data", help="comma-separated law families")
    p.add_argument("--acceptance-models", default="plane,log-plane", help="comma-separated acceptance models")
    # The sampler's defaults everywhere: four chains, and 500 draws each to reach the checks' 100 ESS per chain.
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--starts", type=int, default=1, metavar="K", help="every K-th start of each family's grid (1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-effects", choices=("auto", "on", "off"), default="auto",
                   help="per-run random effects in the loss law (auto: when a run has rows at two budgets)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_jax()
    return run_command(lambda: _run(args, argv), "nothing was written (the files are written at the end); rerun the "
                                                 "same command")


def _run(args, argv) -> int:
    from sdsl_jax import ACCEPTANCE_MODELS, FAMILIES

    check_arguments(args, at_least_one=("chains", "warmup", "draws", "starts"), out=args.out)
    log = Log(args.quiet)
    laws, models = [x for x in args.laws.split(",") if x], [m for m in args.acceptance_models.split(",") if m]
    unknown = [x for x in laws if x not in FAMILIES] + [m for m in models if m not in ACCEPTANCE_MODELS]
    if unknown or not laws:
        raise UsageError(f"unknown law or acceptance model: {', '.join(unknown)}" if unknown else
                         "--laws names no loss-law form")
    paths = dict(pretraining=os.path.join(args.data, "pretraining.csv"),
                 acceptance=os.path.join(args.data, "acceptance.csv"))
    runs = load_pretraining(paths["pretraining"])
    pairs, skipped = None, {}
    if models and os.path.exists(paths["acceptance"]):
        pairs = load_acceptance(paths["acceptance"])
    elif models:
        skipped["acceptance_models"] = f"{paths['acceptance']} does not exist: the acceptance models were not studied"
        log.warning(skipped["acceptance_models"])
    from sdsl_jax.pipeline import has_repeated_runs

    choice = {"auto": None, "on": True, "off": False}[args.run_effects]
    run_effects = has_repeated_runs(runs) if choice is None else choice
    model_effects = (pairs is not None and pairs.model_effects_identified()[0]) if choice is None else choice
    with log.heartbeat(8.0):
        log(f"holdout: {len(set(runs.n_params))} sizes x laws {laws}, run effects {'on' if run_effects else 'off'}"
            + (f", acceptance {models}, model effects {'on' if model_effects else 'off'}" if pairs else ""))
        record = run_holdout(runs, pairs, laws=laws, acceptance_models=models if pairs else [], chains=args.chains,
                             warmup=args.warmup, draws=args.draws, seed=args.seed, starts_every=args.starts,
                             run_effects=run_effects, model_effects=model_effects, log=log)
    out = make_output_folder(args.out or os.path.join(args.data, "holdout"))
    record.update(**run_header("experiments.holdout", argv), seed=args.seed, skipped=skipped,
                  data={k: dict(path=paths[k], sha256=t.sha256) for k, t in (("pretraining", runs),
                                                                             ("acceptance", pairs)) if t is not None},
                  settings=dict(chains=args.chains, warmup=args.warmup, draws=args.draws, starts_every=args.starts,
                                run_effects=run_effects, model_effects=model_effects))
    table = holdout_markdown(record) + "".join(f"\nSkipped: {why}.\n" for why in skipped.values())
    print(table)
    write_text(os.path.join(out, "holdout.md"), table)
    write_json(os.path.join(out, "holdout.json"), record, strict=True)
    log(f"wrote {os.path.join(out, 'holdout.json')}, holdout.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
