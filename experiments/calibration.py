"""Calibration of the posteriors: do 90% intervals cover the truth 90% of the time?

    python -m experiments.calibration --datasets 100          # the larger version (benchmarks)

For each of ``datasets`` synthetic datasets drawn from the model's own likelihood at fixed true
parameters (Chinchilla-like for the loss law, SDSL2026 for the plane), sample the posterior with
NUTS and record whether each parameter's central 90% interval contains its true value. With a
correct model and sampler and weakly informative priors the coverage is close to 0.9; the binomial
standard error over k intervals is sqrt(0.09 / k).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from sdsl_jax import SDSL2026, LossLaw
from sdsl_jax.bayes import interval_coverage, laws_from_posterior, sample_loss_law, sample_plane
from sdsl_jax.fitting import loss_law_log_prediction, theta_from_law

TRUE_LAW = LossLaw(E=1.82, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
TRUE_LOSS_SIGMA, TRUE_NU = 0.02, 8.0
TRUE_PLANE_SIGMA = 0.03


def plane_coverage(num_datasets: int, *, num_points: int = 40, num_warmup: int = 300, num_samples: int = 300,
                   seed: int = 0, level: float = 0.9) -> dict[str, float]:
    """Coverage of the plane's A, B, C over synthetic datasets (x ~ U(5, 60), y ~ U(3, 20))."""
    rng = np.random.default_rng(seed)
    hits = {k: [] for k in ("A", "B", "C")}
    for i in range(num_datasets):
        x, y = rng.uniform(5, 60, num_points), rng.uniform(3, 20, num_points)
        w = rng.uniform(50, 500, num_points)
        alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, TRUE_PLANE_SIGMA, num_points) / np.sqrt(
            w / w.mean())
        run = sample_plane(x, y, alpha, weights=w, num_chains=1, num_warmup=num_warmup, num_samples=num_samples,
                           seed=seed + i, progress_bar=False, summarize=False)
        for k in hits:
            hits[k].append(interval_coverage(run.samples[k], getattr(SDSL2026, k), level=level))
    return {k: float(np.mean(v)) for k, v in hits.items()}


def loss_law_coverage(num_datasets: int, *, num_runs: int = 60, num_warmup: int = 300, num_samples: int = 300,
                      seed: int = 0, level: float = 0.9) -> dict[str, float]:
    """Coverage of E, A, B, alpha, beta over synthetic Chinchilla-like runs (Student-t noise)."""
    rng = np.random.default_rng(seed)
    theta = theta_from_law(TRUE_LAW)
    hits = {k: [] for k in LossLaw._fields}
    for i in range(num_datasets):
        n = 10 ** rng.uniform(7.5, 10.5, num_runs)
        d = 10 ** rng.uniform(9, 12, num_runs)
        mean = np.asarray(loss_law_log_prediction(theta, np.log(n), np.log(d)))
        loss = np.exp(mean + TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU, num_runs))
        run = sample_loss_law(n, d, loss, init=TRUE_LAW, num_chains=1, num_warmup=num_warmup,
                              num_samples=num_samples, seed=seed + i, progress_bar=False, summarize=False)
        draws = laws_from_posterior(run.samples)._asdict()
        for k in hits:
            hits[k].append(interval_coverage(draws[k], getattr(TRUE_LAW, k), level=level))
    return {k: float(np.mean(v)) for k, v in hits.items()}


def main(argv: list[str] | None = None) -> int:
    jax.config.update("jax_enable_x64", True)  # set here, not at import: float64 for this run
    parser = argparse.ArgumentParser(prog="python -m experiments.calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100, help="synthetic datasets per model (100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, fn in (("plane", plane_coverage), ("loss law", loss_law_coverage)):
        start = time.perf_counter()
        cov = fn(args.datasets, seed=args.seed)
        k = args.datasets * len(cov)
        print(f"{name}: 90% interval coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
              + f"; pooled {np.mean(list(cov.values())):.3f} over {k} intervals (binomial s.e. {np.sqrt(0.09 / k):.3f})"
              f" [{time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
