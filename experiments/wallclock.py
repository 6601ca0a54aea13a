"""Wall-clock closure: does a latency model fitted from per-call timings pick the fastest (draft, gamma)?

    python -m experiments.wallclock --data fits/ladder-v1       # fits/ladder-v1/closure/wallclock.{json,md,png}

From ``latency.csv`` (``experiments.latency``: per-call seconds of every ladder model reading
k = 1 .. 12 positions) fit ``t(N, k)`` (``sdsl_jax.latency``; ``--form auto`` picks the form with
the smallest error on token counts held out of its fit), so that a draft step costs ``t(N, 1)``
and a verification ``t(M, gamma + 1)``. Then for every speculative run of ``speculative.csv``:

    predicted speedup = E[tokens](alpha, gamma) t(M, 1) / (gamma t(N, 1) + t(M, gamma + 1))

at the run's measured alpha (the MLE from its accepted counts), with a 90% band from the
sampling uncertainty of alpha (Beta posterior of its accepted / rejected counts) and of the
latency coefficients; against the measured wall-clock speedup (``wallclock_speedup``: tokens per
second over the target decoding alone). Per target: the predicted fastest (draft, gamma) among
the measured ones, the measured fastest, the regret (measured speedup of the predicted choice over
the best), the error on the best speedup, the probability under the bands that the measured
fastest is the fastest, and each draft's continuous gamma* (``best_lookahead``), flagged when it
lies outside the measured gamma grid.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from experiments.runlog import (Log, UsageError, check_arguments, configure_jax, make_output_folder, run_command,
                               run_header, write_json, write_text)
from sdsl_jax.data import DataError, load_latency, load_speculative
from sdsl_jax.validation.wallclock import close_wallclock, wallclock_figure, wallclock_markdown


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.wallclock", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fits/ladder-v1", help="folder with latency.csv and speculative.csv (fits/ladder-v1)")
    p.add_argument("--out", help="output folder (DATA/closure)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the latency rows to fit (1: the runs' batch)")
    p.add_argument("--form", default="auto", help="latency form: auto (smallest held-out error) or a name of "
                   "sdsl_jax.latency.FORMS")
    p.add_argument("--draws", type=int, default=2000, help="draws for the bands (2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    configure_jax()
    return run_command(lambda: _run(args, argv), "nothing was written (the files are written at the end); rerun the "
                                                 "same command")


def _run(args, argv) -> int:
    from sdsl_jax.latency import FORMS

    check_arguments(args, at_least_one=("draws", "batch"), out=args.out)
    if args.form != "auto" and args.form not in FORMS:
        raise UsageError(f"--form {args.form!r} is not auto or one of {sorted(FORMS)}")
    log = Log(args.quiet)
    paths = dict(latency=os.path.join(args.data, "latency.csv"), speculative=os.path.join(args.data, "speculative.csv"))
    latency, spec = load_latency(paths["latency"]), load_speculative(paths["speculative"])
    if not np.any(latency.batch == args.batch):
        raise DataError(paths["latency"], None, "batch", f"has no rows at --batch {args.batch}")
    try:
        record = close_wallclock(spec, latency, batch=args.batch, form=args.form, draws=args.draws, seed=args.seed)
    except ValueError as err:  # the latency model cannot be fitted from these timings
        raise DataError(paths["latency"], None, None, f"cannot close the loop on these timings: {err}") from None
    out = make_output_folder(args.out or os.path.join(args.data, "closure"))
    record.update(**run_header("experiments.wallclock", argv), seed=args.seed,
                  data={k: dict(path=paths[k], sha256=t.sha256) for k, t in (("latency", latency),
                                                                            ("speculative", spec))},
                  machines=sorted({m for m in latency.machine if m}))
    table = wallclock_markdown(record)
    print(table)
    write_text(os.path.join(out, "wallclock.md"), table)
    write_json(os.path.join(out, "wallclock.json"), record, strict=True)
    if not args.no_figure:
        wallclock_figure(record, os.path.join(out, "wallclock.png"), record["command"])
    log(f"wrote {os.path.join(out, 'wallclock.json')}, wallclock.md" + ("" if args.no_figure else ", wallclock.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
