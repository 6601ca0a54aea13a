"""Regenerate the committed results from their recorded commands and compare them with what is committed.

    python -m experiments.regenerate                 # the quick ones
    python -m experiments.regenerate --all           # every committed result (long: NUTS in every fold)
    python -m experiments.regenerate --only wallclock,score

Every committed result file records the command that made it (``command`` in its JSON). This reruns
that command with ``--out`` in a temporary folder (without ``--resume``, so nothing committed is
reused), then compares every number of the new JSON with the committed one (dates, versions, paths,
commits and run times aside) and prints, per result, the largest relative difference and whether it
is within ``--rtol``. Exit status 0 when every result compared reproduces, 1 when one does not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Committed(NamedTuple):
    """A committed result: its JSON, whether it is quick to remake, and the files the command reads
    from its own output folder (a score reads the registered prediction there)."""

    name: str
    path: str
    quick: bool
    reads_from_out: tuple[str, ...] = ()


COMMITTED = (
    Committed("wallclock", "fits/ladder-v1/closure/wallclock.json", True),
    Committed("score", "fits/ladder/preregistered/score.json", True, ("predictions.json",)),
    Committed("reference", "fits/reference/summary.json", True),
    Committed("ladder_fit", "fits/ladder/fit/summary.json", False),
    Committed("ladder_holdout", "fits/ladder/holdout/holdout.json", False),
    Committed("ladder_closure_stacked", "fits/ladder/closure_stacked/closure.json", False),
    Committed("elasticity", "fits/ladder/elasticity/elasticity.json", False),
    Committed("v1_fit", "fits/ladder-v1/fit/summary.json", False),
    Committed("v1_closure", "fits/ladder-v1/closure/closure.json", False),
    Committed("v1_closure_broken", "fits/ladder-v1/closure_broken/closure.json", False),
    Committed("v1_closure_stacked", "fits/ladder-v1/closure_stacked/closure.json", False),
    Committed("v1_closure_forward", "fits/ladder-v1/closure_forward/closure.json", False),
    Committed("v1_holdout", "fits/ladder-v1/holdout/holdout.json", False),
    Committed("sbc", "fits/calibration/sbc.json", False),
)

IGNORED = frozenset({"date", "versions", "command", "commit", "registered_commit", "machine", "machines", "path",
                     "predictions", "out", "seconds"})
"""Fields that name when, where, how long or with what a result was made, not what it says."""


def rerun_command(recorded: str, out: str) -> list[str]:
    """The recorded command with its output in ``out``: ``--out`` replaced (or added), ``--resume`` and
    ``--quiet`` dropped (then ``--quiet`` added back: progress is not compared)."""
    words = shlex.split(recorded)
    if words[:2] != ["python", "-m"]:
        raise ValueError(f"not a recorded command: {recorded!r}")
    args, skip = [], False
    for word in words[3:]:
        if skip:
            skip = False
        elif word == "--out":
            skip = True
        elif word not in ("--resume", "--quiet"):
            args.append(word)
    return [sys.executable, "-m", words[2], *args, "--out", out, "--quiet"]


def differences(committed, remade, path: str = "") -> tuple[float, list[str]]:
    """The largest relative difference between two JSON documents' numbers, and every structural or
    textual difference (missing keys, other lengths, other strings), ignoring :data:`IGNORED` fields."""
    if isinstance(committed, dict) and isinstance(remade, dict):
        worst, notes = 0.0, []
        for key in sorted(set(committed) | set(remade)):
            if key in IGNORED:
                continue
            if key not in committed or key not in remade:
                notes.append(f"{path}/{key}: only in the {'committed' if key in committed else 'remade'} file")
                continue
            w, n = differences(committed[key], remade[key], f"{path}/{key}")
            worst, notes = max(worst, w), notes + n
        return worst, notes
    if isinstance(committed, list) and isinstance(remade, list):
        if len(committed) != len(remade):
            return math.inf, [f"{path}: {len(committed)} entries committed, {len(remade)} remade"]
        worst, notes = 0.0, []
        for i, (a, b) in enumerate(zip(committed, remade)):
            w, n = differences(a, b, f"{path}[{i}]")
            worst, notes = max(worst, w), notes + n
        return worst, notes
    numbers = (int, float)
    if isinstance(committed, numbers) and isinstance(remade, numbers) and not isinstance(committed, bool):
        if committed == remade or (math.isnan(committed) and math.isnan(remade)):
            return 0.0, []
        scale = max(abs(committed), abs(remade))
        return (abs(committed - remade) / scale if scale else math.inf), []
    return (0.0, []) if committed == remade else (math.inf, [f"{path}: {committed!r} committed, {remade!r} remade"])


def regenerate(entry: Committed, folder: str, rtol: float) -> dict:
    """Rerun one committed result's command into ``folder`` and compare."""
    with open(os.path.join(REPO, entry.path)) as f:
        committed = json.load(f)
    out = os.path.join(folder, entry.name)
    os.makedirs(out, exist_ok=True)
    for name in entry.reads_from_out:
        shutil.copy(os.path.join(REPO, os.path.dirname(entry.path), name), out)
    command = rerun_command(committed["command"], out)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return dict(name=entry.name, ok=False, seconds=seconds,
                    problem=f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(out, os.path.basename(entry.path))) as f:
        remade = json.load(f)
    worst, notes = differences(committed, remade)
    return dict(name=entry.name, ok=worst <= rtol and not notes, seconds=seconds, max_relative_difference=worst,
                notes=notes[:5])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.regenerate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="also the long ones (every closure, the held-out study)")
    parser.add_argument("--only", help="comma-separated names: " + ", ".join(e.name for e in COMMITTED))
    parser.add_argument("--rtol", type=float, default=1e-6, help="largest relative difference that reproduces (1e-6)")
    args = parser.parse_args(argv)
    names = {e.name for e in COMMITTED}
    chosen = [e for e in COMMITTED if (e.name in args.only.split(",") if args.only else args.all or e.quick)]
    unknown = sorted(set(args.only.split(",")) - names) if args.only else []
    if unknown:
        parser.error(f"--only: unknown result(s) {unknown}; choose from {sorted(names)}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sdsl-regenerate-") as folder:
        for entry in chosen:
            result = regenerate(entry, folder, args.rtol)
            failed += not result["ok"]
            detail = (result.get("problem") or f"largest relative difference {result['max_relative_difference']:.1e}"
                      + "".join(f"; {n}" for n in result["notes"]))
            print(f"{entry.path:<52} {'reproduces' if result['ok'] else 'DIFFERS':<11} {result['seconds']:6.0f} s  "
                  f"{detail}", flush=True)
    skipped = [e.path for e in COMMITTED if e not in chosen]
    if skipped:
        print(f"not rerun (--all reruns them): {', '.join(skipped)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
