"""Benchmarks of the numerics: Lambert W against SciPy, N* against a loop of SciPy solves, both
against mpmath; and the timing helpers every section uses.
"""

from __future__ import annotations

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
from sdsl_jax import HOFFMANN2022, SDSL2026, lambertw, solve_draft_size


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
        for _ in range(3):  # the first calls after compiling run up to twice as long (allocation, threads)
            fn(zj).block_until_ready()
            scipy.special.lambertw(z, k)
        t_jax = median_time(lambda: fn(zj).block_until_ready(), repeats)
        t_scipy = median_time(lambda: scipy.special.lambertw(z, k), repeats)
        sub = np.concatenate([z[:: max(1, points // 2000)], near_branch_point_points(300)])
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
