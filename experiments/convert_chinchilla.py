"""Convert Epoch's Chinchilla Figure 4 extraction into the ``sdsl-pretraining v1`` schema.

    python -m experiments.convert_chinchilla ../shared/data/chinchilla_fig4_epoch.csv fits/data/chinchilla_fig4.csv

Columns used: ``Model Size`` (N), ``Training FLOP`` (C), ``loss``; D = C / (6 N). Rows keep their
order; ``name`` is ``fig4-<row>`` (the row's index in the source file).
"""

from __future__ import annotations

import argparse
import csv
import sys

import numpy as np

from sdsl_jax.data import PretrainingRuns, save_pretraining

SOURCE = "Hoffmann et al. 2022 Fig. 4, extracted by Besiroglu et al. 2024 (epoch-research/analyzing-chinchilla)"


def convert(source_csv: str) -> PretrainingRuns:
    with open(source_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    n = np.array([float(r["Model Size"]) for r in rows])
    c = np.array([float(r["Training FLOP"]) for r in rows])
    loss = np.array([float(r["loss"]) for r in rows])
    return PretrainingRuns(
        n_params=n, n_tokens=c / (6.0 * n), loss=loss, name=tuple(f"fig4-{i}" for i in range(len(rows))),
        flops=c, source=(SOURCE,) * len(rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.convert_chinchilla", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="chinchilla_fig4_epoch.csv")
    parser.add_argument("output", help="where to write the sdsl-pretraining v1 CSV")
    args = parser.parse_args(argv)
    runs = convert(args.source)
    save_pretraining(runs, args.output)
    print(f"wrote {len(runs)} runs to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
