"""How the user-facing computations scale: N* with the number of targets, the multi-start point fit
and the NUTS posterior with the number of pre-training rows, each beside its alternative in the
same run (``python -m experiments.bench --only scaling``)."""

from __future__ import annotations

import time

import jax
import numpy as np

from experiments import numpy_reference
from experiments.benchmarks.inference import reached_share
from experiments.benchmarks.numerics import median_time

TARGET_COUNTS = (100, 1_000, 10_000, 100_000, 1_000_000)
ROW_COUNTS = (30, 300, 3_000, 30_000)
NUTS_ROW_COUNTS = (30, 300, 3_000)
SCIPY_TARGETS = 1_000  # targets the SciPy loop is timed on; its time per target is the baseline
SCIPY_FIT_STARTS = 45  # Epoch starts SciPy's L-BFGS-B is timed on at every row count


def synthetic_runs(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` pre-training runs (N, D, L) from Hoffmann et al.'s law with 2% log-normal scatter, N and D
    log-uniform over the Chinchilla data's range (7e7-1.6e10 parameters, 5e9-5e11 tokens)."""
    from sdsl_jax import HOFFMANN2022, pretraining_loss

    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(7e7), np.log(1.6e10), rows))
    d = np.exp(rng.uniform(np.log(5e9), np.log(5e11), rows))
    return n, d, np.asarray(pretraining_loss(n, d, HOFFMANN2022)) * np.exp(0.02 * rng.standard_normal(rows))


SCALING_PARTS = ("n_star", "fit", "nuts")


def bench_scaling(repeats: int, parts=SCALING_PARTS) -> list[dict]:
    """The scaling tables named in ``parts`` (any of :data:`SCALING_PARTS`), in that order."""
    run = {"n_star": lambda: _scaling_n_star(repeats), "fit": _scaling_point_fit, "nuts": _scaling_nuts}
    return [row for part in SCALING_PARTS if part in parts for row in run[part]()]


def _scaling_n_star(repeats: int) -> list[dict]:
    """One vectorised N* solve per count of targets (first call with compilation, then the median of
    ``repeats``, one repeat above 1e5 targets) against a SciPy loop's time per target on 1,000 targets."""
    from sdsl_jax import HOFFMANN2022, SDSL2026, solve_draft_size

    kw = dict(d_draft=1e12, d_target=1e12, loss=HOFFMANN2022, plane=SDSL2026, n_min=1e3)
    sample = np.geomspace(1e9, 2e11, SCIPY_TARGETS)
    scipy_s = median_time(lambda: [numpy_reference.optimal_draft_size_scalar(m, 1e12, 1e12, HOFFMANN2022, SDSL2026,
                                                                            n_min=1e3) for m in sample], 3)
    per_scipy = scipy_s / SCIPY_TARGETS
    rows = []
    for count in TARGET_COUNTS:
        m = np.geomspace(1e9, 2e11, count)
        start = time.perf_counter()
        solve_draft_size(m, **kw).n_star.block_until_ready()
        first_s = time.perf_counter() - start
        t = median_time(lambda: solve_draft_size(m, **kw).n_star.block_until_ready(), repeats if count <= 100_000 else 1)
        print(f"scaling N*: {count:>9,} targets  jax {t * 1e3:9.1f} ms ({t / count * 1e6:7.2f} us/target; first call "
              f"{first_s:5.1f} s)  scipy {per_scipy * 1e6:7.0f} us/target  ratio {per_scipy * count / t:7.1f}x", flush=True)
        rows.append(dict(name="scaling n_star", targets=count, jax_s=t, jax_first_call_s=first_s,
                         scipy_per_target_s=per_scipy, speedup=per_scipy * count / t))
    return rows


def _scaling_point_fit() -> list[dict]:
    """The multi-start loss-law fit on synthetic runs (the second of two calls: the first compiles): every
    Epoch start up to 300 rows, every tenth at 3,000 and every hundredth at 30,000, against SciPy's
    L-BFGS-B with the analytic gradient on the first 45 of the same starts; time per start and the
    share of starts that reach the best objective either side found."""
    from sdsl_jax.infer.point import EPOCH_GRID, fit_loss_law

    rows = []
    for count in ROW_COUNTS:
        n, d, loss = synthetic_runs(count)
        stride = 1 if count <= 300 else (10 if count <= 3_000 else 100)
        starts = EPOCH_GRID[::stride]
        times = []
        for _ in range(2):  # the first call compiles; the second is the work SciPy's loop does
            start = time.perf_counter()
            fit = fit_loss_law(n, d, loss, starts=starts)
            jax.block_until_ready(fit.result.all_values)
            times.append(time.perf_counter() - start)
        first_s, t_jax = times
        start = time.perf_counter()
        params, values = numpy_reference.fit_loss_law_scipy(starts[:SCIPY_FIT_STARTS], *(np.log(v) for v in (n, d, loss)))
        t_scipy = time.perf_counter() - start
        all_values = np.asarray(fit.result.all_values)
        best = min(float(all_values.min()), float(values.min()))
        per_jax, per_scipy = t_jax / len(starts), t_scipy / SCIPY_FIT_STARTS
        share_jax, share_scipy = reached_share(all_values, best), reached_share(values, best)
        # Equal work: the same starts on both sides.
        share_jax_same = reached_share(all_values[:SCIPY_FIT_STARTS], best)
        print(f"scaling point fit: {count:>6,} rows  jax {len(starts):,} starts in {t_jax:6.1f} s "
              f"({per_jax * 1e3:8.2f} ms/start; first call {first_s:5.1f} s)  scipy {SCIPY_FIT_STARTS} starts in {t_scipy:6.1f} s "
              f"({per_scipy * 1e3:8.2f} ms/start)  ratio per start {per_scipy / per_jax:5.2f}x; reach the best "
              f"objective: jax {share_jax:.2%} of all its starts, {share_jax_same:.2%} of SciPy's {SCIPY_FIT_STARTS}; "
              f"scipy {share_scipy:.2%}", flush=True)
        rows.append(dict(name="scaling point fit", rows=count, jax_starts=len(starts), jax_s=t_jax, jax_first_call_s=first_s,
                         scipy_starts=SCIPY_FIT_STARTS, scipy_s=t_scipy, speedup_per_start=per_scipy / per_jax,
                         jax_reached_share=share_jax, jax_reached_share_same_starts=share_jax_same,
                         scipy_reached_share=share_scipy, best_objective=best))
    return rows


def _scaling_nuts() -> list[dict]:
    """The loss law's posterior on synthetic runs (2 chains x (300 + 300), dense mass matrix, chains from
    prior draws, no reruns; the second of two runs, so compilation is excluded): time, leapfrog steps
    per draw and effective draws per second."""
    from sdsl_jax import infer

    rows = []
    for count in NUTS_ROW_COUNTS:
        n, d, loss = synthetic_runs(count)
        kw = dict(num_chains=2, num_warmup=300, num_samples=300, progress_bar=False, retries=0)
        infer.sample_loss_law(n, d, loss, **kw)
        start = time.perf_counter()
        out = infer.sample_loss_law(n, d, loss, seed=1, **kw)
        seconds, diag = time.perf_counter() - start, out.diagnostics
        print(f"scaling NUTS: {count:>5,} rows  {seconds:6.1f} s  median {diag.median_steps:.0f} steps per draw, "
              f"{diag.max_tree_depth_share:.0%} at the cap, min bulk ESS {diag.min_ess_bulk:.0f} "
              f"({diag.min_ess_bulk / seconds:.1f} per second), {diag.num_divergences} divergent", flush=True)
        rows.append(dict(name="scaling nuts", rows=count, seconds=seconds, median_steps=diag.median_steps,
                         at_cap=diag.max_tree_depth_share, min_ess=diag.min_ess_bulk,
                         ess_per_s=diag.min_ess_bulk / seconds, divergences=diag.num_divergences))
    return rows
