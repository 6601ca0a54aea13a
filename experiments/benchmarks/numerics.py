"""Benchmarks of the numerics: Lambert W against SciPy, N* against a loop of SciPy solves, both
against mpmath; and the timing helpers every section uses.
"""

from __future__ import annotations

import itertools
import os
import platform
import time

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import scipy
import scipy.special

from experiments import numpy_reference
from sdsl_jax import (HOFFMANN2022, SDSL2026, SDSL_FLOPS, SolveStatus, draft_acceptance, draft_throughput,
                      lambertw, solve_draft_size, target_alone_throughput)
from sdsl_jax.runtime import WIDE_CPU_VECTORS


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
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` (:func:`interleaved_medians` with one side)."""
    return interleaved_medians([fn], repeats)[0][0]


def lambertw_points(k: int, n: int) -> np.ndarray:
    """Log-spaced points across the branch's domain (half negative, half positive on W_0).

    The negative points end at the float just inside -1/e: the float nearest -1/e lies below it,
    outside the real domain, where SciPy returns NaN and mpmath a complex value.
    """
    edge = np.nextafter(1 / np.e, 0.0)
    negative = -np.geomspace(1e-300, edge, n if k == -1 else n // 2)
    if k == -1:
        return negative
    return np.concatenate([negative, np.geomspace(1e-300, 1e300, n - n // 2)])


def near_branch_point_points(n: int) -> np.ndarray:
    """Points ``z = (p^2 / 2 - 1) / e`` for ``p = sqrt(2 (e z + 1))`` log-spaced over [1e-4, 1.4], inside
    the domain: the region where the series, the switch to an iteration and the iteration's loss of
    accuracy (its rounding divided by ``1 + w ~ p``) lie, which log-spaced points in z barely visit."""
    with mpmath.workdps(50):
        z = np.array([float((mpmath.mpf(p) ** 2 / 2 - 1) / mpmath.e) for p in np.geomspace(1e-4, 1.4, n)])
    return z[z >= np.nextafter(-1 / np.e, 0.0)]


def interleaved_medians(fns, repeats: int) -> tuple[list[float], list[float]]:
    """Median wall-clock and CPU seconds (this process's, every thread's) of each of ``fns``, called in
    turn ``repeats`` times: each side meets the same machine state (the allocator's, other load) as the
    others, where timing one side's repeats and then the other's would let a passing state favour one."""
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    return [float(np.median(t)) for t in wall], [float(np.median(t)) for t in cpu]


def bench_lambertw(points: int, repeats: int) -> list[dict]:
    """Both branches against SciPy on the same points: wall-clock and CPU time (JAX's program runs on
    every core, SciPy's loop on one, so the CPU-time ratio is the one per core), medians of three times
    ``repeats`` calls of each side in turn; each side's accuracy against mpmath. JAX twice: compiled
    with XLA's defaults and with 512-bit vectors (:data:`sdsl_jax.runtime.WIDE_CPU_VECTORS`, the same
    results where the CPU has them)."""
    mpmath.mp.dps = 50
    rows = []
    for k in (0, -1):
        z = lambertw_points(k, points)
        zj = jnp.asarray(z)
        fn = jax.jit(jax.vmap(lambda x: lambertw(x, k)))
        wide = jax.jit(jax.vmap(lambda x: lambertw(x, k)), compiler_options=WIDE_CPU_VECTORS)
        start = time.perf_counter()
        fn(zj).block_until_ready()
        compile_s = time.perf_counter() - start
        wide(zj).block_until_ready()
        (t_jax, t_wide, t_scipy), (cpu_jax, cpu_wide, cpu_scipy) = interleaved_medians(
            [lambda: fn(zj).block_until_ready(), lambda: wide(zj).block_until_ready(),
             lambda: scipy.special.lambertw(z, k)], 3 * repeats)
        sub = np.concatenate([z[:: max(1, points // 2000)], near_branch_point_points(300)])
        want = np.array([float(mpmath.lambertw(mpmath.mpf(float(x)), k).real) for x in sub])
        got, got_wide = (np.asarray(f(jnp.asarray(sub))) for f in (fn, wide))
        err_jax = np.max(np.abs(got - want) / np.abs(want))
        err_wide = np.max(np.abs(got_wide - want) / np.abs(want))
        err_scipy = np.max(np.abs(scipy.special.lambertw(sub, k).real - want) / np.abs(want))
        rows.append(
            dict(
                name=f"lambertw k={k}", n=points, jax_s=t_jax, baseline_s=t_scipy, speedup=t_scipy / t_jax,
                jax_cpu_s=cpu_jax, baseline_cpu_s=cpu_scipy, cpu_speedup=cpu_scipy / cpu_jax,
                compile_s=compile_s, jax_max_rel_err=float(err_jax), baseline_max_rel_err=float(err_scipy),
                wide_vectors_s=t_wide, wide_vectors_cpu_s=cpu_wide, wide_vectors_speedup=t_scipy / t_wide,
                wide_vectors_cpu_speedup=cpu_scipy / cpu_wide, wide_vectors_max_rel_err=float(err_wide),
            )
        )
        print(
            f"lambertw k={k:>2}: {points:.0e} points  jax {t_jax * 1e3:7.1f} ms (CPU {cpu_jax * 1e3:6.1f})  "
            f"scipy {t_scipy * 1e3:7.1f} ms (CPU {cpu_scipy * 1e3:6.1f})  ratio {t_scipy / t_jax:5.1f}x "
            f"(CPU time {cpu_scipy / cpu_jax:4.1f}x)   max rel err vs mpmath: jax {err_jax:.1e}, scipy {err_scipy:.1e}\n"
            f"{'':19}512-bit vectors: jax {t_wide * 1e3:7.1f} ms (CPU {cpu_wide * 1e3:6.1f})  ratio "
            f"{t_scipy / t_wide:5.1f}x (CPU time {cpu_scipy / cpu_wide:4.1f}x)   max rel err vs mpmath {err_wide:.1e}",
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
    """One vectorised solve against a SciPy loop on the same work (every target; medians of ``5 *
    repeats`` calls and of ``min(repeats, 3)`` loops), wall-clock and CPU time (JAX's program may run
    on every core, SciPy's loop runs on one, so the CPU-time ratio is the one per core), and each
    side's accuracy against a 40-digit mpmath root, not against the other side."""
    m = np.geomspace(1e9, 2e11, targets)
    kw = dict(d_draft=1e12, d_target=1e12, loss=HOFFMANN2022, plane=SDSL2026, n_min=1e3)

    def solve(targets):
        return jax.block_until_ready(solve_draft_size(targets, **kw))

    start = time.perf_counter()
    sol = solve(m)
    compile_s = time.perf_counter() - start
    # A call takes milliseconds and its times on a shared machine scatter: five times the
    # calls of the SciPy side's seconds-long loops, whose median is steady in three.
    (t_jax,), (cpu_jax,) = interleaved_medians([lambda: solve(m)], 5 * repeats)
    # The first call of a process also starts JAX's runtime; a new shape afterwards is the compilation.
    start = time.perf_counter()
    solve(np.append(m, m[-1]))
    recompile_s = time.perf_counter() - start

    def scipy_loop():
        return np.array([numpy_reference.optimal_draft_size_scalar(mm, 1e12, 1e12, HOFFMANN2022, SDSL2026, n_min=1e3)
                         for mm in m])

    ref = scipy_loop()
    (t_scipy,), (cpu_scipy,) = interleaved_medians([scipy_loop], max(1, min(repeats, 3)))
    sample = np.unique(np.linspace(0, targets - 1, min(targets, 12)).astype(int))
    exact = np.array([mpmath_draft_size(float(m[i]), 1e12) for i in sample])
    err_jax = float(np.max(np.abs(np.asarray(sol.n_star)[sample] / exact - 1)))
    err_scipy = float(np.max(np.abs(ref[sample] / exact - 1)))
    print(
        f"N* for {targets} targets: jax {t_jax * 1e3:8.1f} ms (one call; CPU {cpu_jax * 1e3:.1f})  scipy loop "
        f"{t_scipy:7.2f} s (CPU {cpu_scipy:.2f})  ratio {t_scipy / t_jax:7.1f}x (CPU time {cpu_scipy / cpu_jax:.0f}x)   "
        f"max rel err vs mpmath ({len(sample)} targets): jax {err_jax:.1e}, scipy {err_scipy:.1e}  "
        f"(first call {compile_s:.1f} s, a new shape {recompile_s:.1f} s)",
        flush=True,
    )
    return [
        dict(
            name="optimal_draft_size", n=targets, jax_s=t_jax, baseline_s=t_scipy, speedup=t_scipy / t_jax,
            jax_cpu_s=cpu_jax, baseline_cpu_s=cpu_scipy, cpu_speedup=cpu_scipy / cpu_jax,
            compile_s=compile_s, recompile_s=recompile_s, max_rel_err_jax=err_jax, max_rel_err_scipy=err_scipy,
        )
    ]


def forms_pretraining(family: str) -> str:
    """The pre-training runs :func:`bench_draft_size_forms` fits ``family`` to: the shipped ladder, or
    the first ladder for the one-break law (the shipped ladder's nine token counts are five budgets,
    one fewer than its D term needs)."""
    return "fits/ladder-v1/pretraining.csv" if family == "broken" else "fits/ladder/pretraining.csv"


def solve_faults(status, found, best, alone, saturates):
    """Which solves are wrong against brute force: a SUCCESS more than 1e-9 below the best T
    (``below``), a failure status where the brute force finds a gain with acceptance below 1
    (``missed``)."""
    below = (status == SolveStatus.SUCCESS) & (found < best * (1 - 1e-9))
    gave_up = [SolveStatus.NO_ADMISSIBLE_DRAFT, SolveStatus.NO_SPEEDUP, SolveStatus.NOT_CONVERGED]
    missed = np.isin(status, gave_up) & (best > alone * (1 + 1e-9)) & ~saturates
    return below, missed


class FaultTally:
    """Statuses and faults of N* solves against T on a brute-force grid, batch by batch."""

    def __init__(self):
        self.statuses, self.faults, self.worst, self.rows = np.zeros(len(SolveStatus), int), 0, 0.0, []

    def add(self, label: str, sol, m, grid, kw: dict) -> None:
        """One batch: ``sol`` solved at targets ``m`` with ``kw``, ``grid`` its draft sizes (rows)."""
        t = np.asarray(draft_throughput(grid, m, **kw))
        best = np.max(np.where(np.isfinite(t), t, -np.inf), axis=0)
        alone = np.asarray(target_alone_throughput(kw.get("cost", SDSL_FLOPS), m))
        alpha = draft_acceptance(grid, m, d_target=kw["d_target"], recipe=kw["recipe"], loss=kw["loss"],
                                 plane=kw["plane"])
        saturates = np.any(np.asarray(alpha) >= 1, axis=0)
        status, found = np.asarray(sol.status), np.asarray(sol.throughput)
        below, missed = solve_faults(status, found, best, alone, saturates)
        self.statuses += np.bincount(status.reshape(-1), minlength=len(SolveStatus))
        self.faults += int(below.sum() + missed.sum())
        if below.any():
            self.worst = max(self.worst, float(np.max(1 - found[below] / best[below])))
        if below.any() or missed.any():
            self.rows.append(f"{label}: {int(below.sum())} below the best, {int(missed.sum())} gains missed")

    def summary(self) -> str:
        total = int(self.statuses.sum())
        named = ", ".join(f"{SolveStatus(k).name} {n}" for k, n in enumerate(self.statuses) if n)
        return (f"{total}: statuses {named}; faults {self.faults} ({self.faults / total:.2%}), "
                f"largest shortfall in T {self.worst:.1%}")

    def record(self) -> dict:
        return dict(n=int(self.statuses.sum()), statuses={SolveStatus(k).name: int(n)
                                                          for k, n in enumerate(self.statuses)},
                    faults=self.faults, largest_shortfall=self.worst, fault_rows=self.rows)


def bench_draft_size_forms(targets: int, repeats: int, *, seed: int = 0, brute_points: int = 4001) -> list[dict]:
    """N* against brute force for every (loss-law family, acceptance model, draft recipe, cost).

    Each family and acceptance model is fitted to the shipped ladder (``fits/ladder``; point fits from
    every 20th start), the one-break law to the first ladder (``fits/ladder-v1``: ``fits/ladder``'s
    five token budgets cannot identify its D term), its coefficients jittered per target (laws: log-normal, sd 0.2; acceptance:
    relative sd 0.05), targets log-uniform in [3e4, 1e8]. The alternative: T on ``brute_points``
    log-spaced draft sizes per target in one vectorised call. A fault is a SUCCESS whose T is more than
    1e-9 below the brute-force best, or a failure status (no admissible draft, no speed-up, not
    converged) where the brute force finds a gain and acceptance stays below 1. Times: medians of
    ``repeats`` warm calls per combination, summed.
    """
    from sdsl_jax import (ACCEPTANCE_MODELS, FAMILIES, AllPositionsFlops, FixedCompute, FixedTokens,
                          LatencyCost, TokensPerParameter, fit_acceptance_plane, fit_loss_law, load_acceptance,
                          load_pretraining)

    pairs = load_acceptance("fits/ladder/acceptance.csv")

    def point_fit(family):
        runs = load_pretraining(forms_pretraining(family.name))
        logs = (np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))
        return fit_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=family, starts=family.starts(*logs)[::20]).law

    laws = {f.name: point_fit(f) for f in FAMILIES.values() if f.name != "data"}  # the data-only law has no N*
    planes = {m.name: fit_acceptance_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha,
                                           weights=pairs.regression_weights(), model=m).plane
              for m in ACCEPTANCE_MODELS.values()}
    recipes = {"fixed D": FixedTokens(1e7), "20 tokens/param": TokensPerParameter(20.0),
               "fixed compute": FixedCompute(1e13)}
    costs = {"SDSL FLOPs": SDSL_FLOPS, "all positions": AllPositionsFlops(),
             "latency": LatencyCost(draft_fixed=1e-4, draft_per_param=2e-10, verify_fixed=2e-4, verify_per_param=2e-10,
                                    verify_per_token=3e-12)}
    rng = np.random.default_rng(seed)
    tally, t_solve, t_brute = FaultTally(), 0.0, 0.0
    for (law_name, law), (plane_name, plane), (recipe_name, recipe), (cost_name, cost) in itertools.product(
            laws.items(), planes.items(), recipes.items(), costs.items()):
        loss = law._replace(**{f: np.asarray(v) * np.exp(rng.normal(0.0, 0.2, targets)) for f, v in law._asdict().items()})
        acc = plane._replace(**{f: np.asarray(v) * (1 + rng.normal(0.0, 0.05, targets)) for f, v in plane._asdict().items()})
        m = np.exp(rng.uniform(np.log(3e4), np.log(1e8), targets))
        kw = dict(d_target=1e7, recipe=recipe, loss=loss, plane=acc, cost=cost)
        grid = np.exp(np.linspace(0.0, 1.0, brute_points)[:, None] * np.log(m)[None, :])
        sol = solve_draft_size(m, n_min=1.0, **kw)
        t_solve += median_time(lambda: solve_draft_size(m, n_min=1.0, **kw).n_star.block_until_ready(), repeats)
        t_brute += median_time(lambda: draft_throughput(grid, m, **kw).block_until_ready(), repeats)
        tally.add(f"{law_name}, {plane_name}, {recipe_name}, {cost_name}", sol, m, grid, kw)
    print(f"N* against brute force ({brute_points} points per target), {len(laws)} laws x {len(planes)} acceptance models"
          f" x {len(recipes)} recipes x {len(costs)} costs x {targets} targets = {tally.summary()}; "
          f"time: solver {t_solve:.2f} s, brute force {t_brute:.2f} s ({t_brute / t_solve:.1f}x)", flush=True)
    for row in tally.rows:
        print("  " + row, flush=True)
    return [dict(name="draft_size_forms", jax_s=t_solve, baseline_s=t_brute, speedup=t_brute / t_solve,
                 **tally.record(), seed=seed)]


def bench_draft_size_draws(*, seed: int = 0, brute_points: int = 4001) -> list[dict]:
    """N* on a posterior's draws against brute force: the one-break law on the first ladder
    (``fits/ladder-v1``, NUTS 4 x 500 draws from ``seed``), each acceptance model fitted to that
    ladder's pairs, drafts at 20 and 40 tokens per parameter and at a fixed compute (1e13 FLOPs),
    targets of 4.6e4, 2.6e5 and 1.2e6 parameters trained on 20 tokens per parameter, SDSL FLOPs.
    A draw's break in D sits among the ladder's drafts, where :func:`bench_draft_size_forms`'s
    jittered point fit (a break 0.001 wide) says little about the breaks N* meets in a closure.
    Faults as there (:func:`solve_faults`); times: one warm call per combination, summed.
    """
    from sdsl_jax import (ACCEPTANCE_MODELS, BROKEN_POWER_LAW, FixedCompute, TokensPerParameter,
                          fit_acceptance_plane, load_acceptance, load_pretraining)
    from sdsl_jax.infer import sample_loss_law

    runs = load_pretraining(forms_pretraining("broken"))
    posterior = sample_loss_law(runs.n_params, runs.n_tokens, runs.loss, family=BROKEN_POWER_LAW, seed=seed,
                                progress_bar=False)
    law = BROKEN_POWER_LAW.from_theta(np.stack([np.asarray(posterior.samples[k]).reshape(-1)
                                                for k in BROKEN_POWER_LAW.theta_names], axis=-1))
    pairs = load_acceptance("fits/ladder-v1/acceptance.csv")
    planes = {m.name: fit_acceptance_plane(pairs.ppl_draft, pairs.ppl_target, pairs.alpha,
                                           weights=pairs.regression_weights(), model=m).plane
              for m in ACCEPTANCE_MODELS.values()}
    recipes = {"20 tokens/param": TokensPerParameter(20.0), "40 tokens/param": TokensPerParameter(40.0),
               "fixed compute": FixedCompute(1e13)}
    tally, t_solve = FaultTally(), 0.0
    for (plane_name, plane), (recipe_name, recipe), m in itertools.product(
            planes.items(), recipes.items(), (4.6e4, 2.6e5, 1.2e6)):
        kw = dict(d_target=20.0 * m, recipe=recipe, loss=law, plane=plane, cost=SDSL_FLOPS)
        sol = solve_draft_size(m, n_min=1.0, **kw)  # compiles
        t_solve += median_time(lambda: solve_draft_size(m, n_min=1.0, **kw).n_star.block_until_ready(), 1)
        grid = np.exp(np.linspace(0.0, 1.0, brute_points) * np.log(m))[:, None]
        tally.add(f"{plane_name}, {recipe_name}, M {m:.2g}", sol, m, grid, kw)
    print(f"N* on {law.c.size} posterior draws of the one-break law (first ladder) against brute force "
          f"({brute_points} points), {len(planes)} acceptance models x {len(recipes)} recipes x 3 targets = "
          f"{tally.summary()}; solver {t_solve:.2f} s", flush=True)
    for row in tally.rows:
        print("  " + row, flush=True)
    return [dict(name="draft_size_draws", jax_s=t_solve, **tally.record(), seed=seed)]
