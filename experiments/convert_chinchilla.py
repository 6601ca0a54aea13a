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

from experiments.runlog import UsageError, run_command
from sdsl_jax.data import PretrainingRuns, save_pretraining

SOURCE = "Hoffmann et al. 2022 Fig. 4, extracted by Besiroglu et al. 2024 (epoch-research/analyzing-chinchilla)"


def convert(source_csv: str) -> PretrainingRuns:
    try:
        with open(source_csv, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{source_csv} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    try:
        n = np.array([float(r["Model Size"]) for r in rows])
        c = np.array([float(r["Training FLOP"]) for r in rows])
        loss = np.array([float(r["loss"]) for r in rows])
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{source_csv} is not Epoch's Figure 4 table (columns Model Size, Training FLOP, loss): "
                         f"{type(err).__name__}: {err}") from None
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

    def body() -> int:
        runs = convert(args.source)
        save_pretraining(runs, args.output)
        print(f"wrote {len(runs)} runs to {args.output}")
        return 0

    return run_command(body, "nothing was written; rerun the command")


if __name__ == "__main__":
    sys.exit(main())
