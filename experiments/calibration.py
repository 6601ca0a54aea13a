"""Calibration of the posteriors: do 90% intervals cover the truth 90% of the time?

    python -m experiments.calibration --datasets 100          # the larger version (benchmarks)
    python -m experiments.calibration --datasets 100 --only n-star

N* with run effects (:func:`n_star_coverage`): synthetic ladders like ours (7 sizes, each trained
once and branched at 4 budgets, so the 4 rows of a size share a run offset and a slope in log D),
fitted with the hierarchical posterior. Two claims are checked: the mean-curve band (``--mean-only``
in the CLIs) covers the N* of the TRUE law, and the posterior-predictive band (the default) covers
the N* that a NEW draft series and a NEW target, drawn from the same process, actually have.

For each of ``datasets`` synthetic datasets drawn from the model's own likelihood at fixed true
parameters (Chinchilla-like for the loss law, SDSL2026 for the plane), sample the posterior with
NUTS and record whether each parameter's central 90% interval contains its true value. With a
correct model and sampler and weakly informative priors the coverage is close to 0.9; the binomial
standard error over k intervals is sqrt(0.09 / k).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

from sdsl_jax import SDSL2026, LossLaw
from sdsl_jax.infer import laws_from_posterior, sample_loss_law, sample_plane
from sdsl_jax.predict import interval_coverage
from sdsl_jax.infer.point import loss_law_log_prediction, theta_from_law
from sdsl_jax.store import atomic_write

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
        run = sample_loss_law(n, d, loss, num_chains=1, num_warmup=num_warmup,
                              num_samples=num_samples, seed=seed + i, progress_bar=False, summarize=False)
        draws = laws_from_posterior(run.samples)._asdict()
        for k in hits:
            hits[k].append(interval_coverage(draws[k], getattr(TRUE_LAW, k), level=level))
    return {k: float(np.mean(v)) for k, v in hits.items()}


TRUE_RUN_SD, TRUE_RUN_SLOPE_SD = 0.02, 0.03


def synthetic_ladder(rng: np.random.Generator, *, sizes=(2e7, 5e7, 1.2e8, 3e8, 7e8, 1.6e9, 4e9),
                     budgets_per_param=(5.0, 10.0, 20.0, 40.0), run_effects: bool = True):
    """One synthetic ladder: each size one run, branched at ``budgets_per_param`` tokens per parameter.

    Log losses are the true law's plus the run's intercept and slope in log D (when ``run_effects``)
    plus Student-t noise. Returns ``(n, d, loss, run_index, centre_log_d)``.
    """
    n = np.repeat(np.asarray(sizes, np.float64), len(budgets_per_param))
    d = n * np.tile(np.asarray(budgets_per_param, np.float64), len(sizes))
    run = np.repeat(np.arange(len(sizes)), len(budgets_per_param)).astype(np.int32)
    centre = float(np.mean(np.log(d)))
    mean = np.asarray(loss_law_log_prediction(theta_from_law(TRUE_LAW), np.log(n), np.log(d)))
    noise = TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU, n.size)
    if run_effects:
        u, v = rng.normal(0, TRUE_RUN_SD, len(sizes)), rng.normal(0, TRUE_RUN_SLOPE_SD, len(sizes))
        noise = noise + u[run] + v[run] * (np.log(d) - centre)
    return n, d, np.exp(mean + noise), run, centre


def _release_compiled_code() -> None:
    """Drop every compiled program so that its machine code is freed.

    Before ``sdsl_jax.infer`` reused NumPyro's compiled sampling loop across datasets, every run
    compiled it again (a few MB of machine code per dataset) and after ~90 datasets LLVM ran out
    of code memory ("Unable to allocate section memory"). The loop is now compiled once; the
    caches are still cleared every 20 datasets (one recompilation) so that a long study's memory
    stays bounded whatever else compiles per dataset (the N* solver's draws).
    """
    import gc

    from sdsl_jax import infer

    infer.clear_sampler_caches()
    gc.collect()


def n_star_coverage(num_datasets: int, *, m_target: float = 3e10, d_target: float = 6e11, d_draft: float = 2e10,
                    num_warmup: int = 300, num_samples: int = 300, seed: int = 0, level: float = 0.9,
                    log=None, return_intervals: bool = False):
    """Coverage of 90% N* bands on synthetic ladders with run effects (fixed, known plane).

    For each dataset: the hierarchical posterior of the law; the mean-curve band of N* (law
    draws only) against the true law's N*; the predictive band (:func:`sdsl_jax.predict.draws.predictive_planes`)
    against the N* of one new draft series and new target drawn from the true process (a new
    run's intercept and slope at their budgets, and the Student-t residual).

    Returns:
      ``{claim: coverage, claim: median log width}``; with ``return_intervals`` also
      ``{claim: [(lo, hi, truth) per dataset]}`` (:func:`coverage_figure`'s input).
    """
    from sdsl_jax import ResidualAcceptance, solve_draft_size
    from sdsl_jax.predict import solve_draws
    from sdsl_jax.predict import PredictiveScales, predictive_planes

    rng = np.random.default_rng(seed)
    truth_mean = float(solve_draft_size(m_target, d_draft=d_draft, d_target=d_target, loss=TRUE_LAW,
                                        plane=SDSL2026).n_star)
    hits = {"mean curve vs true law": [], "predictive vs new models": []}
    widths = {k: [] for k in hits}
    intervals = {k: [] for k in hits}  # (lo, hi, truth) per dataset, for the figure
    for i in range(num_datasets):
        if i and i % 20 == 0:
            _release_compiled_code()
        n, d, loss, run, centre = synthetic_ladder(rng)
        fit = sample_loss_law(n, d, loss, run=run, num_chains=1, num_warmup=num_warmup,
                              num_samples=num_samples, seed=seed + i, progress_bar=False, summarize=False)
        laws = laws_from_posterior(fit.samples)
        s = fit.samples
        scales = PredictiveScales(s["sigma"], s["nu"], np.zeros_like(s["sigma"]), s["run_sd"], s["run_slope_sd"],
                                  float(s["centre_log_d"]))
        planes = jax.tree.map(lambda v: np.full(np.size(laws[0]), v), SDSL2026)
        kw = dict(d_draft=d_draft, d_target=d_target)
        mean_draws = solve_draws(np.array([m_target]), laws, planes, **kw)[0][:, 0]
        pred_draws = solve_draws(np.array([m_target]), laws,
                                 predictive_planes(planes, scales, seed=seed + i, **kw), **kw)[0][:, 0]
        # One new draft series and one new target from the true process.
        new = [TRUE_LOSS_SIGMA * rng.standard_t(TRUE_NU) + rng.normal(0, TRUE_RUN_SD)
               + rng.normal(0, TRUE_RUN_SLOPE_SD) * (np.log(b) - centre) for b in (d_draft, d_target)]
        truth_new = float(solve_draft_size(m_target, loss=TRUE_LAW, plane=ResidualAcceptance(SDSL2026, *new, 0.0),
                                           **kw).n_star)
        for key, draws, truth in (("mean curve vs true law", mean_draws, truth_mean),
                                  ("predictive vs new models", pred_draws, truth_new)):
            draws = draws[np.isfinite(draws)]
            hits[key].append(interval_coverage(draws, truth, level=level))
            lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
            widths[key].append(np.log(hi / lo))
            intervals[key].append((float(lo), float(hi), truth))
        if log is not None:
            log(f"  dataset {i + 1}/{num_datasets}: " + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in hits.items()))
    out = {k: float(np.mean(v)) for k, v in hits.items()}
    out.update({f"{k}: median log width": float(np.median(v)) for k, v in widths.items()})
    return (out, intervals) if return_intervals else out


def coverage_figure(intervals: dict[str, list], path: str) -> None:
    """Each dataset's 90% band on N* against the truth it should cover, one panel per claim."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    for ax, (name, rows) in zip(fig.subplots(1, len(intervals), squeeze=False)[0], intervals.items()):
        rows = sorted(rows, key=lambda r: r[2] / np.sqrt(r[0] * r[1]))
        for i, (lo, hi, truth) in enumerate(rows):
            centre = np.sqrt(lo * hi)
            inside = lo <= truth <= hi
            ax.plot([i, i], [lo / centre, hi / centre], color="C0" if inside else "C3", lw=1.2)
            ax.plot(i, truth / centre, "k." if inside else "rx", ms=4)
        covered = np.mean([lo <= t <= hi for lo, hi, t in rows])
        ax.set_yscale("log")
        ax.set_title(f"{name}: {covered:.2f} of {len(rows)} covered", fontsize=9)
        ax.set_xlabel("synthetic ladder (sorted by truth within its band)")
        ax.set_ylabel("N* / band centre")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def main(argv: list[str] | None = None) -> int:
    jax.config.update("jax_enable_x64", True)  # set here, not at import: float64 for this run
    parser = argparse.ArgumentParser(prog="python -m experiments.calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100, help="synthetic datasets per model (100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("plane", "loss-law", "n-star"), help="one study only (default: all)")
    parser.add_argument("--out", metavar="DIR", help="also write calibration.json and (n-star) n_star_coverage.png")
    args = parser.parse_args(argv)
    from experiments.runlog import run_command

    return run_command(lambda: calibrate(args, argv), "nothing was written (the files are written at the end); "
                                                      "rerun the same command")


def calibrate(args, argv) -> int:
    from experiments.runlog import UsageError, make_output_folder, versions, write_json

    if args.datasets < 1:
        raise UsageError(f"--datasets must be at least 1, got {args.datasets}")
    if args.out:
        make_output_folder(args.out)
    record = dict(command="python -m experiments.calibration " + " ".join(sys.argv[1:] if argv is None else argv),
                  seed=args.seed, datasets=args.datasets, studies={})
    studies = (("plane", plane_coverage), ("loss-law", loss_law_coverage), ("n-star", n_star_coverage))
    for name, fn in [(n, f) for n, f in studies if args.only in (None, n)]:
        start = time.perf_counter()
        if name == "n-star":
            cov, intervals = fn(args.datasets, seed=args.seed, return_intervals=True,
                                log=lambda line: print(line, flush=True))
            if args.out:
                coverage_figure(intervals, os.path.join(args.out, "n_star_coverage.png"))
        else:
            cov = fn(args.datasets, seed=args.seed)
        record["studies"][name] = dict(coverage=cov, seconds=time.perf_counter() - start)
        if name == "n-star":
            print("n-star (run effects): 90% band coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
                  + f" over {args.datasets} datasets (binomial s.e. {np.sqrt(0.09 / args.datasets):.3f}) "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
            continue
        k = args.datasets * len(cov)
        print(f"{name}: 90% interval coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
              + f"; pooled {np.mean(list(cov.values())):.3f} over {k} intervals (binomial s.e. {np.sqrt(0.09 / k):.3f})"
              f" [{time.perf_counter() - start:.0f} s]", flush=True)
    if args.out:
        write_json(os.path.join(args.out, "calibration.json"), dict(record, versions=versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
