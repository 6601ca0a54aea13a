"""Reproduce SDSL's headline result: N* ~ mu M + M0 with the paper's acceptance plane.

    python -m experiments.reproduce_paper            # markdown tables, as in docs/results/paper_reproduction.md

SDSL (arXiv 2603.11053) reports mu = 2.71e-3 (95% CI 2.67-2.75e-3) and M0 = 8.71e7
(8.50-8.93e7) for targets of about 13B-110B. We solve N*(M) with the plane SDSL2026, each loss
preset and D = D' = 1e12, fit the line over M in [1e10, 1.1e11], and print the table
(M, N*, gamma*, alpha at N*, M/N*) for named targets.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from experiments.runlog import UsageError, configure_jax, run_command
from sdsl_jax import (
    BESIROGLU2024,
    HOFFMANN2022,
    SDSL2026,
    SDSL2026_LINEAR_LAW,
    SDSL_FLOPS,
    fit_linear_law,
    solve_draft_size,
    status_message,
)

PAPER_MU, PAPER_M0 = float(SDSL2026_LINEAR_LAW.mu), float(SDSL2026_LINEAR_LAW.m0)
NAMED_TARGETS = [13e9, 30e9, 70e9, 110e9]
PRESETS = {"HOFFMANN2022": HOFFMANN2022, "BESIROGLU2024": BESIROGLU2024}


def main(argv: list[str] | None = None) -> int:
    configure_jax()  # here, not at import: float64 and the compilation cache for this run
    parser = argparse.ArgumentParser(prog="python -m experiments.reproduce_paper", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=1e12, help="D = D' (default 1e12)")
    parser.add_argument("--points", type=int, default=101, help="target sizes in [1e10, 1.1e11] for the line")
    args = parser.parse_args(argv)
    if not (np.isfinite(args.tokens) and args.tokens > 0):
        parser.error(f"--tokens must be a positive finite number, got {args.tokens!r}")
    if args.points < 2:
        parser.error(f"--points must be at least 2 (the linear law needs two targets), got {args.points}")

    return run_command(lambda: reproduce(args), "nothing is written; rerun the command")


def reproduce(args) -> int:
    m_line = np.linspace(1e10, 1.1e11, args.points)
    print(f"D = D' = {args.tokens:.0e}, plane SDSL2026 (A={SDSL2026.A}, B={SDSL2026.B}, C={SDSL2026.C}).\n")
    print("| loss preset | mu | vs paper | M0 | vs paper |")
    print("|---|---|---|---|---|")
    for name, law in PRESETS.items():
        sol = solve_draft_size(m_line, d_draft=args.tokens, d_target=args.tokens, loss=law, plane=SDSL2026)
        solved = np.asarray(sol.status) == 0
        if solved.sum() < 2:
            reasons = sorted({status_message(int(c)) for c in np.asarray(sol.status)[~solved]})
            raise UsageError(f"with D = D' = {args.tokens:g} and {name}, N* is solved for {int(solved.sum())} of "
                             f"{len(m_line)} targets: no line to fit ({'; '.join(reasons)})")
        fit = fit_linear_law(m_line, sol.n_star)
        mu, m0 = float(fit.mu), float(fit.m0)
        print(f"| {name} | {mu:.3e} | {mu / PAPER_MU - 1:+.1%} | {m0:.3e} | {m0 / PAPER_M0 - 1:+.1%} |")
    print(f"| SDSL paper | {PAPER_MU:.3e} | | {PAPER_M0:.3e} | |\n")

    print("| loss preset | M | N* | gamma* | alpha at N* | M/N* | T* / T(target alone) |")
    print("|---|---|---|---|---|---|---|")
    m = np.array(NAMED_TARGETS)
    for name, law in PRESETS.items():
        sol = solve_draft_size(m, d_draft=args.tokens, d_target=args.tokens, loss=law, plane=SDSL2026)
        for i, mm in enumerate(m):
            gain = float(sol.throughput[i]) * SDSL_FLOPS.verification(mm, 1)  # T* / T(target alone)
            print(f"| {name} | {mm / 1e9:.0f}B | {float(sol.n_star[i]) / 1e6:.1f}M | {float(sol.gamma_star[i]):.2f} | "
                  f"{float(sol.alpha[i]):.4f} | {mm / float(sol.n_star[i]):.0f} | {gain:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
