"""Published measurements as a check: Leviathan, Kalman & Matias (2023), Table 4 against the model.

    python -m experiments.leviathan          # prints the table of docs/results/published.md

For each row of ``fits/data/external/leviathan2023_table4_speedup.csv`` (T5-XXL 11B target on a
TPU-v4, batch 1): the expected walltime improvement recomputed from the printed (alpha, gamma, c)
with ``sdsl_jax.speedup`` (Leviathan's Thm 3.8), the same through the library's latency cost model
(a target step takes 1, a draft step c), the lookahead that cost model would choose (continuous
gamma* by ``best_lookahead`` and the best integer) with its expected improvement, and the paper's
measured improvement.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

from experiments.runlog import UsageError, configure_jax, run_command

TABLE_4 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fits", "data", "external",
                       "leviathan2023_table4_speedup.csv")


def compare(path: str = TABLE_4) -> list[dict]:
    from sdsl_jax import LatencyCost, best_lookahead, speedup

    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"--table {path} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    out = []
    for line, r in enumerate(rows, start=2):
        try:
            alpha, gamma, c = float(r["alpha"]), float(r["gamma"]), float(r["c_cost_ratio"])
            int(r["temperature"]), float(r["expected_improvement"]), float(r["empirical_improvement"])
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path}:{line}: not a row of Leviathan et al.'s Table 4 ({type(err).__name__}: {err})") \
                from None
        cost = LatencyCost(draft_fixed=c, draft_per_param=0.0, verify_fixed=1.0, verify_per_param=0.0)
        best = best_lookahead(cost, alpha, 1.0, 1.0)
        integers = np.arange(1, 31)
        by_integer = np.asarray(speedup(alpha, integers, c))
        out.append(dict(task=r["task"], draft=r["draft"], temperature=int(r["temperature"]), alpha=alpha,
                        gamma=int(gamma), c=c, printed_expected=float(r["expected_improvement"]),
                        expected=float(speedup(alpha, gamma, c)), measured=float(r["empirical_improvement"]),
                        gamma_star=float(best.gamma), best_integer_gamma=int(integers[np.argmax(by_integer)]),
                        expected_at_best_integer=float(by_integer.max())))
    return out


def markdown(records: list[dict]) -> str:
    lines = ["| task, draft, T | alpha | gamma | c | expected (paper / ours) | measured | measured / ours | "
             "gamma* (best integer): expected |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['task']}, {r['draft']}, {r['temperature']} | {r['alpha']:.2f} | {r['gamma']} | {r['c']:.2f} "
                     f"| {r['printed_expected']:.1f} / {r['expected']:.2f} | {r['measured']:.1f} | "
                     f"{r['measured'] / r['expected']:.2f} | {r['gamma_star']:.1f} ({r['best_integer_gamma']}): "
                     f"{r['expected_at_best_integer']:.2f} |")
    ratio = np.array([r["measured"] / r["expected"] for r in records])
    lines += ["", f"Measured over expected: median {np.median(ratio):.2f}, range {ratio.min():.2f}-{ratio.max():.2f} "
              f"over {len(records)} rows."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.leviathan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=TABLE_4, metavar="PATH",
                        help="Table 4 as CSV (task, draft, temperature, alpha, gamma, c_cost_ratio, "
                             "expected_improvement, empirical_improvement); default: the shipped copy")
    args = parser.parse_args(argv)
    configure_jax()
    return run_command(lambda: print(markdown(compare(args.table))) or 0, "nothing is written; rerun the command")


if __name__ == "__main__":
    sys.exit(main())
