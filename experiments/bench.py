"""Benchmarks: sdsl_jax against the obvious alternative, in the same run, with ratios.

    python -m experiments.bench                 # everything (what `make bench` runs)
    python -m experiments.bench --only lambertw --points 100000

Sections:
  lambertw    1e6 float64 points per branch, jitted and vmapped, against scipy.special.lambertw;
              both accuracies measured against mpmath (50 digits) on a subsample.
  draft_size  N* for 10,000 target sizes in one vectorised call against a Python loop of
              scipy.optimize.minimize_scalar solves of the NumPy version of the same objective
              (experiments/numpy_reference.py), same bracketing grid; max disagreement in N*.
  fit         the loss-law fit from the Epoch replication's 4,500 starts (vectorised optax L-BFGS)
              against scipy.optimize.minimize (L-BFGS-B, analytic gradient) looped over a random
              subset of the same starts: time per start and both optima.
  calibration coverage of 90% posterior intervals over synthetic datasets (plane, loss law), and of
              90% N* bands on synthetic ladders with per-run effects (mean-curve and predictive).
  nuts        posteriors of same-shaped datasets one after the other (calibration, refits): NumPyro's
              own sampling loop, compiled again on every run, against the loop compiled once; same draws.
  decoding    greedy decoding in one jitted loop (the engine's design) against a Python loop over
              a jitted one-token step, same tokens; a 1.2M- and a 25k-parameter model.

Timings are medians over repeats after a warm-up (compilation is reported separately).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import scipy
import scipy.special

from experiments import numpy_reference
from sdsl_jax import HOFFMANN2022, SDSL2026, lambertw, solve_draft_size
from experiments.runlog import run_command, write_json


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {jax.devices()[0].platform} backend; "
        f"python {platform.python_version()}, jax {jax.__version__}, numpy {np.__version__}, scipy {scipy.__version__}"
    )


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def lambertw_points(k: int, n: int) -> np.ndarray:
    """Log-spaced points across the branch's domain (half negative, half positive on W_0)."""
    negative = -np.geomspace(1e-300, 1 / np.e, n if k == -1 else n // 2)
    if k == -1:
        return negative
    return np.concatenate([negative, np.geomspace(1e-300, 1e300, n - n // 2)])


def bench_lambertw(points: int, repeats: int) -> list[dict]:
    mpmath.mp.dps = 50
    rows = []
    for k in (0, -1):
        z = lambertw_points(k, points)
        zj = jnp.asarray(z)
        fn = jax.jit(jax.vmap(lambda x: lambertw(x, k)))
        start = time.perf_counter()
        fn(zj).block_until_ready()
        compile_s = time.perf_counter() - start
        t_jax = median_time(lambda: fn(zj).block_until_ready(), repeats)
        t_scipy = median_time(lambda: scipy.special.lambertw(z, k), repeats)
        sub = z[:: max(1, points // 2000)]
        want = np.array([float(mpmath.lambertw(mpmath.mpf(float(x)), k).real) for x in sub])
        err_jax = np.max(np.abs(np.asarray(fn(jnp.asarray(sub))) - want) / np.abs(want))
        err_scipy = np.max(np.abs(scipy.special.lambertw(sub, k).real - want) / np.abs(want))
        rows.append(
            dict(
                name=f"lambertw k={k}", n=points, jax_s=t_jax, baseline_s=t_scipy, speedup=t_scipy / t_jax,
                compile_s=compile_s, jax_max_rel_err=float(err_jax), baseline_max_rel_err=float(err_scipy),
            )
        )
        print(
            f"lambertw k={k:>2}: {points:.0e} points  jax {t_jax * 1e3:8.1f} ms  scipy {t_scipy * 1e3:8.1f} ms  "
            f"ratio {t_scipy / t_jax:6.1f}x   max rel err vs mpmath: jax {err_jax:.1e}, scipy {err_scipy:.1e}",
            flush=True,
        )
    return rows


def mpmath_draft_size(m: float, d: float, *, dps: int = 40) -> float:
    """N* to ``dps`` digits: the root in u = ln N of d ln T*(e^u) / du, with Hoffmann's law, the paper's
    plane and T* in closed form, ``T* = ln(alpha) / (2 N (1 - alpha) W_{-1}(-alpha^(r-1) / e))``
    (docs/theory.md), every step in mpmath: the accuracy oracle of the N* benchmark."""
    with mpmath.workdps(dps):
        law, plane = HOFFMANN2022, SDSL2026
        E, A, B, a, b = (mpmath.mpf(float(v)) for v in (law.E, law.A, law.B, law.alpha, law.beta))
        m, d = mpmath.mpf(m), mpmath.mpf(d)
        y = mpmath.exp(E + A / m**a + B / d**b)

        def log_t(u):
            n = mpmath.exp(u)
            alpha = float(plane.A) * mpmath.exp(E + A / n**a + B / d**b) + float(plane.B) * y + float(plane.C)
            w = mpmath.lambertw(-alpha ** (m / n - 1) / mpmath.e, -1)
            return mpmath.log(mpmath.log(alpha) / (2 * n * (1 - alpha) * w))

        u0 = mpmath.log(2.71e-3 * m + 8.71e7)  # the paper's line as the starting point
        return float(mpmath.exp(mpmath.findroot(lambda u: mpmath.diff(log_t, u), u0, tol=mpmath.mpf(10) ** (-dps + 8))))


def bench_draft_size(targets: int, repeats: int) -> list[dict]:
    """One vectorised solve against a SciPy loop on the same work (every target, medians of ``repeats``
    for both), and each side's accuracy against a 40-digit mpmath root, not against the other side."""
    m = np.geomspace(1e9, 2e11, targets)
    kw = dict(d_draft=1e12, d_target=1e12, loss=HOFFMANN2022, plane=SDSL2026, n_min=1e3)
    start = time.perf_counter()
    sol = solve_draft_size(m, **kw)
    sol.n_star.block_until_ready()
    compile_s = time.perf_counter() - start
    t_jax = median_time(lambda: solve_draft_size(m, **kw).n_star.block_until_ready(), repeats)

    def scipy_loop():
        return np.array([numpy_reference.optimal_draft_size_scalar(mm, 1e12, 1e12, HOFFMANN2022, SDSL2026, n_min=1e3)
                         for mm in m])

    ref = scipy_loop()
    t_scipy = median_time(scipy_loop, max(1, min(repeats, 3)))  # seconds a loop: three are enough for a median
    sample = np.unique(np.linspace(0, targets - 1, min(targets, 12)).astype(int))
    exact = np.array([mpmath_draft_size(float(m[i]), 1e12) for i in sample])
    err_jax = float(np.max(np.abs(np.asarray(sol.n_star)[sample] / exact - 1)))
    err_scipy = float(np.max(np.abs(ref[sample] / exact - 1)))
    print(
        f"N* for {targets} targets: jax {t_jax * 1e3:8.1f} ms (one call)  scipy loop {t_scipy:7.2f} s  "
        f"ratio {t_scipy / t_jax:7.1f}x   max rel err vs mpmath ({len(sample)} targets): jax {err_jax:.1e}, "
        f"scipy {err_scipy:.1e}  (compile {compile_s:.1f} s)",
        flush=True,
    )
    return [
        dict(
            name="optimal_draft_size", n=targets, jax_s=t_jax, baseline_s=t_scipy, speedup=t_scipy / t_jax,
            compile_s=compile_s, max_rel_err_jax=err_jax, max_rel_err_scipy=err_scipy,
        )
    ]


def bench_loss_law_fit(scipy_starts: int, repeats: int) -> list[dict]:
    from sdsl_jax.data import load_pretraining
    from sdsl_jax.fitting import EPOCH_GRID, fit_loss_law

    runs = load_pretraining("fits/data/chinchilla_fig4.csv")
    runs = runs.select(np.sort(np.argsort(runs.loss)[:-5]))
    start = time.perf_counter()
    fit = fit_loss_law(runs.n_params, runs.n_tokens, runs.loss)
    first_s = time.perf_counter() - start
    t_jax = median_time(lambda: jax.block_until_ready(fit_loss_law(runs.n_params, runs.n_tokens, runs.loss)),
                        max(1, repeats // 2))
    subset = np.random.default_rng(0).choice(len(EPOCH_GRID), scipy_starts, replace=False)
    logs = [np.log(v) for v in (runs.n_params, runs.n_tokens, runs.loss)]
    per_jax = t_jax / len(EPOCH_GRID)
    jax_subset_best = float(np.min(np.asarray(fit.result.all_values)[subset]))
    law = [float(v) for v in fit.law]
    print(f"loss-law fit: jax {len(EPOCH_GRID)} starts in {t_jax:.1f} s ({per_jax * 1e3:.2f} ms/start; first call "
          f"{first_s:.1f} s with compilation), objective {float(fit.result.value):.10g}\n"
          f"  jax optimum: E={law[0]:.5f} A={law[1]:.2f} B={law[2]:.2f} alpha={law[3]:.5f} beta={law[4]:.5f}; "
          f"best over the SciPy subset of starts {jax_subset_best:.10g}", flush=True)
    rows = []
    for label, analytic in (("finite-difference gradient (SciPy default)", False), ("analytic NumPy gradient", True)):
        start = time.perf_counter()
        params, values = numpy_reference.fit_loss_law_scipy(EPOCH_GRID[subset], *logs, analytic_gradient=analytic)
        t_scipy = time.perf_counter() - start
        per_scipy = t_scipy / scipy_starts
        best = params[np.argmin(values)]
        print(f"  scipy L-BFGS-B, {label}: {scipy_starts} starts in {t_scipy:.1f} s ({per_scipy * 1e3:.1f} ms/start)"
              f"  ratio per start {per_scipy / per_jax:.1f}x; optimum E={np.exp(best[2]):.5f} A={np.exp(best[0]):.2f} "
              f"B={np.exp(best[1]):.2f} alpha={best[3]:.5f} beta={best[4]:.5f} objective {values.min():.10g}",
              flush=True)
        rows.append(dict(name=f"loss_law_fit vs scipy ({label})", n=len(EPOCH_GRID), jax_s=t_jax,
                         jax_first_call_s=first_s, baseline_s=t_scipy, baseline_starts=scipy_starts,
                         speedup_per_start=per_scipy / per_jax, jax_objective=float(fit.result.value),
                         scipy_subset_objective=float(values.min()), jax_subset_objective=jax_subset_best))
    return rows


def bench_calibration(datasets: int) -> list[dict]:
    from experiments.calibration import loss_law_coverage, n_star_coverage, plane_coverage

    rows = []
    for name, fn in (("plane", plane_coverage), ("loss law", loss_law_coverage)):
        start = time.perf_counter()
        cov = fn(datasets)
        k = datasets * len(cov)
        pooled = float(np.mean(list(cov.values())))
        print(f"calibration {name}: 90% coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
              + f"; pooled {pooled:.3f} over {k} intervals (s.e. {np.sqrt(0.09 / k):.3f}) "
              f"[{time.perf_counter() - start:.0f} s]", flush=True)
        rows.append(dict(name=f"calibration {name}", datasets=datasets, coverage=cov, pooled=pooled))
    start = time.perf_counter()
    cov = n_star_coverage(datasets)
    print("calibration N* with run effects: 90% band coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
          + f" over {datasets} datasets (s.e. {np.sqrt(0.09 / datasets):.3f}) [{time.perf_counter() - start:.0f} s]",
          flush=True)
    rows.append(dict(name="calibration n_star run effects", datasets=datasets, coverage=cov))
    return rows


def bench_nuts_reuse(datasets: int) -> list[dict]:
    """Posteriors of many same-shaped datasets (what calibration and refits do): NumPyro's own
    sampling loop, compiled again on every run, against ``sdsl_jax.bayes`` reusing it; same draws.

    One chain, 150 warm-up + 250 draws, on 40-pair plane datasets and on the synthetic ladders
    with per-run effects; the first run of each side (compilation) is reported separately.
    """
    from experiments.calibration import TRUE_LAW, synthetic_ladder
    from sdsl_jax import SDSL2026, bayes

    rng = np.random.default_rng(0)
    x, y = rng.uniform(5, 60, (datasets, 40)), rng.uniform(3, 20, (datasets, 40))
    alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.03, x.shape)
    ladders = [synthetic_ladder(rng) for _ in range(datasets)]
    kw = dict(num_chains=1, num_warmup=150, num_samples=250, progress_bar=False, summarize=False)
    cases = (("plane, 40 pairs", lambda i: bayes.sample_plane(x[i], y[i], alpha[i], seed=i, **kw)),
             ("loss law with run effects, 28 runs", lambda i: bayes.sample_loss_law(
                 *ladders[i][:3], init=TRUE_LAW, run=ladders[i][3], seed=i, **kw)))
    rows = []
    for name, sample in cases:
        times, draws = {}, {}
        for side in ("numpyro", "sdsl_jax"):
            bayes.clear_sampler_caches()
            with bayes.compiled_loop_reuse(side == "sdsl_jax"):
                start = time.perf_counter()
                first = sample(0)
                first_s = time.perf_counter() - start
                start = time.perf_counter()
                runs = [sample(i) for i in range(1, datasets)]
                times[side] = (first_s, (time.perf_counter() - start) / (datasets - 1))
                draws[side] = [first, *runs]
        same = all(np.array_equal(a.samples[k], b.samples[k]) for a, b in zip(draws["numpyro"], draws["sdsl_jax"])
                   for k in a.samples)
        print(f"nuts {name}: per dataset after the first, NumPyro's loop {times['numpyro'][1]:.2f} s, reused "
              f"{times['sdsl_jax'][1]:.2f} s, ratio {times['numpyro'][1] / times['sdsl_jax'][1]:.1f}x "
              f"(first run {times['numpyro'][0]:.1f} / {times['sdsl_jax'][0]:.1f} s); identical draws: {same}",
              flush=True)
        rows.append(dict(name=f"nuts reuse {name}", datasets=datasets, numpyro_s=times["numpyro"][1],
                         jax_s=times["sdsl_jax"][1], speedup=times["numpyro"][1] / times["sdsl_jax"][1],
                         first_run_s=[times["numpyro"][0], times["sdsl_jax"][0]], identical=same))
    return rows


def bench_decoding(repeats: int) -> list[dict]:
    """Decoding in one jitted loop against a Python loop over a jitted one-token step (same tokens).

    The engine's design choice: at ~0.3 ms of dispatch per call here, a Python-driven loop pays
    more in dispatch than a small model's step costs. Target-sized model (1.2M parameters, the
    ladder's L7 shape, random weights), greedy, 64 new tokens after a 48-token prompt.
    """
    from flax import nnx

    from sdsl_jax.decoding import autoregressive_generate
    from sdsl_jax.model import Transformer, TransformerConfig, init_cache

    rows = []
    for name, config in (("1.2M params", TransformerConfig(d_model=128, num_layers=6, num_heads=4, d_ff=512,
                                                           max_len=128)),
                         ("25k params", TransformerConfig(d_model=32, num_layers=1, num_heads=1, d_ff=128,
                                                          max_len=128))):
        model = Transformer(config, rngs=nnx.Rngs(0))
        prompt = jnp.asarray(np.random.default_rng(0).integers(0, 256, 48), jnp.int32)
        new = 64
        key = jax.random.key(0)

        def one_loop():
            return autoregressive_generate(model, prompt, key, num_new_tokens=new, temperature=0.0)

        graphdef, state = nnx.split(model)

        @jax.jit
        def prefill(state, prompt):
            logits, cache = nnx.merge(graphdef, state)(prompt[None], init_cache(config), 0)
            return jnp.argmax(logits[0, -1]).astype(jnp.int32), cache

        @jax.jit
        def step(state, token, cache, position):
            logits, cache = nnx.merge(graphdef, state)(token[None, None], cache, position)
            return jnp.argmax(logits[0, -1]).astype(jnp.int32), cache

        def python_loop():
            token, cache = prefill(state, prompt)
            out = [token]
            for i in range(new - 1):
                token, cache = step(state, token, cache, jnp.int32(prompt.shape[0] + i))
                out.append(token)
            return jnp.concatenate([prompt, jnp.stack(out)])

        same = bool(np.array_equal(np.asarray(one_loop()), np.asarray(python_loop())))  # also compiles both
        t_loop = median_time(lambda: jax.block_until_ready(one_loop()), repeats)
        t_python = median_time(lambda: jax.block_until_ready(python_loop()), repeats)
        print(f"decoding {name}, {new} tokens: one jitted loop {t_loop * 1e3:7.1f} ms  Python loop of jitted steps "
              f"{t_python * 1e3:7.1f} ms  ratio {t_python / t_loop:5.1f}x  identical tokens: {same}", flush=True)
        rows.append(dict(name=f"decoding {name}", new_tokens=new, jax_s=t_loop, baseline_s=t_python,
                         speedup=t_python / t_loop, identical=same))
    return rows


SECTIONS = {"lambertw": bench_lambertw, "draft_size": bench_draft_size, "fit": bench_loss_law_fit,
            "calibration": bench_calibration, "nuts": bench_nuts_reuse, "decoding": bench_decoding}


def main(argv: list[str] | None = None) -> int:
    jax.config.update("jax_enable_x64", True)  # set here, not at import: float64 for this run
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    parser.add_argument("--points", type=int, default=1_000_000, help="Lambert W points per branch (default 1e6)")
    parser.add_argument("--targets", type=int, default=10_000, help="target sizes for N* (default 10,000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    parser.add_argument("--scipy-starts", type=int, default=100,
                        help="Epoch starts the SciPy loop is timed on (all 4,500 take ~9 minutes; default 100)")
    parser.add_argument("--calibration-datasets", type=int, default=40,
                        help="synthetic datasets per model for the calibration check (default 40)")
    parser.add_argument("--nuts-datasets", type=int, default=10,
                        help="same-shaped datasets sampled one after the other in the NUTS section (default 10)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("points", "targets", "repeats", "scipy_starts", "calibration_datasets", "nuts_datasets"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return run_command(lambda: run_benchmarks(args, argv), "nothing was written; rerun the command")


def run_benchmarks(args, argv) -> int:
    print(f"# {datetime.date.today()}  {machine_description()}", flush=True)
    results = []
    for name in args.only or list(SECTIONS):
        if name == "lambertw":
            results += bench_lambertw(args.points, args.repeats)
        elif name == "draft_size":
            results += bench_draft_size(args.targets, args.repeats)
        elif name == "fit":
            results += bench_loss_law_fit(args.scipy_starts, args.repeats)
        elif name == "decoding":
            results += bench_decoding(args.repeats)
        elif name == "nuts":
            results += bench_nuts_reuse(args.nuts_datasets)
        else:
            results += bench_calibration(args.calibration_datasets)
    if args.json:
        record = dict(date=str(datetime.date.today()), machine=machine_description(),
                      command="python -m experiments.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
                      results=results)
        write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
