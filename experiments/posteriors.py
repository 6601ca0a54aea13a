"""Every posterior a result records, and how well NUTS sampled it.

    python -m experiments.posteriors                      # every JSON result under fits/
    python -m experiments.posteriors out/mine fits/ladder --max-median-steps 64 --min-ess 400

Reads each JSON file given, or found under each folder given, and lists the posteriors whose
diagnostics it records (``summary.json`` of a fit, ``closure.json`` of a closure with its refits,
``elasticity.json``, predictions): per file, how many passed the checks a posterior must pass to be
used (R-hat, bulk ESS, divergences, at most 1% of draws at NUTS's maximum tree depth), and how many
were sampled by a well-conditioned NUTS: at most ``--max-median-steps`` leapfrog steps per draw
(median), no draw at the maximum tree depth, bulk ESS at least ``--min-ess``
(:func:`sdsl_jax.report.geometry_shortfalls`). Each posterior that falls short is listed with where
the file records it, its shortfalls, its checks and how many runs it took. A run recorded at several
places of one file (a closure's fit on all the data, under its stacking and its last forward fit)
counts once. ``--out FILE`` writes the listing as JSON. Files that record no posterior are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from experiments.runlog import UsageError, run_command, run_header, write_json
from sdsl_jax.data import DataError
from sdsl_jax.report import geometry_shortfalls, recorded_posteriors


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.posteriors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", default=["fits"], help="JSON result files or folders to search (fits)")
    p.add_argument("--max-median-steps", type=float, default=64.0,
                   help="leapfrog steps per draw (median) of a well-conditioned run (64)")
    p.add_argument("--min-ess", type=float, default=400.0, help="bulk ESS of a well-conditioned run (400)")
    p.add_argument("--out", help="write the listing to this JSON file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return run_command(lambda: _run(args, argv), "nothing was written; rerun the same command")


def result_files(paths) -> list[str]:
    """The JSON files named, and those under the folders named (sorted); UsageError for a path that
    does not exist."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += [os.path.join(d, f) for d, _, names in os.walk(path)
                      for f in names if f.endswith(".json")]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    return sorted(dict.fromkeys(files))


def audit(files, *, max_median_steps: float, min_ess: float) -> list[dict]:
    """Per file that records posteriors: each one's places, diagnostics and geometry shortfalls."""
    out = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except json.JSONDecodeError as err:
            raise DataError(path, err.lineno, None, f"is not JSON: {err.msg} (column {err.colno})") from None
        except UnicodeDecodeError as err:
            raise DataError(path, None, None, f"is not JSON: not UTF-8 text (byte {err.start})") from None
        try:
            posteriors = recorded_posteriors(record)
        except ValueError as err:
            raise DataError(path, None, None, str(err)) from None
        if posteriors:
            out.append(dict(path=path, posteriors=[
                dict(places=list(p.places), diagnostics=p.diagnostics._asdict(),
                     shortfalls=list(geometry_shortfalls(p.diagnostics, max_median_steps=max_median_steps,
                                                         min_ess_bulk=min_ess)))
                for p in posteriors]))
    return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _run(args, argv) -> int:
    if args.max_median_steps < 1 or args.min_ess < 0:
        raise UsageError("--max-median-steps must be at least 1 and --min-ess at least 0")
    if args.out and os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} is a folder; name a JSON file")
    files = audit(result_files(args.paths), max_median_steps=args.max_median_steps, min_ess=args.min_ess)
    total = passed = conditioned = 0
    for entry in files:
        posteriors = entry["posteriors"]
        n_passed = sum(p["diagnostics"]["ok"] for p in posteriors)
        n_conditioned = sum(not p["shortfalls"] for p in posteriors)
        print(f"{entry['path']}: {_count(len(posteriors), 'posterior')}, {n_passed} passed the checks, "
              f"{n_conditioned} sampled within the goal")
        for p in posteriors:
            if p["shortfalls"]:
                d = p["diagnostics"]
                checks = "passed its checks" if d["ok"] else "failed its checks: " + "; ".join(d["problems"])
                runs = f", {d['attempts']} runs" if d["attempts"] > 1 else ""
                also = f" (and {len(p['places']) - 1} more)" if len(p["places"]) > 1 else ""
                print(f"  {p['places'][0]}{also}: {'; '.join(p['shortfalls'])} ({checks}{runs})")
        total, passed, conditioned = total + len(posteriors), passed + n_passed, conditioned + n_conditioned
    print(f"{_count(total, 'posterior')} in {_count(len(files), 'file')}: {passed} passed the checks, "
          f"{conditioned} sampled within {args.max_median_steps:g} leapfrog steps per draw (median), none at "
          f"the maximum tree depth and bulk ESS >= {args.min_ess:g}")
    if args.out:
        write_json(args.out, dict(**run_header("experiments.posteriors", argv), files=files,
                                  goal=dict(max_median_steps=args.max_median_steps, max_tree_depth_share=0.0,
                                            min_ess_bulk=args.min_ess),
                                  total=total, passed=passed, within_goal=conditioned), strict=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
