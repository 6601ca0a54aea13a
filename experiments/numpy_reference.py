"""Independent NumPy/SciPy version of the SDSL objective: the oracle for tests and benchmarks.

Written straight from docs/theory.md's formulas with ``scipy.special.lambertw`` and
``scipy.optimize``, sharing no code with ``sdsl_jax``: the library is checked against it, and
the benchmarks time it as "the obvious alternative". Valid where ``alpha^(r-1)`` does not
underflow in float64 (r up to a few thousand at typical alpha), which covers the paper's range.
"""

from __future__ import annotations

import inspect

import numpy as np
import scipy.optimize
import scipy.special


def optimal_lookahead(alpha, r):
    """gamma* = (1 + W_{-1}(-alpha^(r-1)/e)) / ln(alpha) - r  (docs/theory.md)."""
    alpha, r = np.asarray(alpha, float), np.asarray(r, float)
    w = scipy.special.lambertw(-(alpha ** (r - 1.0)) / np.e, -1).real
    return (1.0 + w) / np.log(alpha) - r


def throughput(alpha, gamma, n, m):
    """Tokens per FLOP, (1 - alpha^(gamma+1)) / ((1 - alpha)(2 N gamma + 2 M))."""
    return (1.0 - alpha ** (gamma + 1.0)) / ((1.0 - alpha) * (2.0 * n * gamma + 2.0 * m))


def composite_throughput(n, m, d_draft, d_target, loss, plane):
    """T(N, M, D, D') at the optimal continuous lookahead; NaN where inadmissible or no gain."""
    E, A, B, a, b = (float(v) for v in loss)
    pa, pb, pc = (float(v) for v in plane)
    x = np.exp(E + A / np.power(n, a) + B / np.power(d_draft, b))
    y = np.exp(E + A / np.power(m, a) + B / np.power(d_target, b))
    alpha = pa * x + pb * y + pc
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = scipy.special.lambertw(-(alpha ** (m / n - 1.0)) / np.e, -1).real
        t = np.log(alpha) / (2.0 * n * (1.0 - alpha) * w)
    return np.where((alpha > 0) & (alpha < 1), t, np.nan)


def argmax_on_log_grid(f, n_min, n_max, *, points=4001, levels=4):
    """The maximiser of ``f(n)`` over [n_min, n_max] by dense grid search in log n, zoomed ``levels``
    times around the best point; ``f`` maps an array of n to values (NaN where undefined)."""
    lo, hi = np.log(n_min), np.log(n_max)
    for _ in range(levels):
        u = np.linspace(lo, hi, points)
        t = np.asarray(f(np.exp(u)), float)
        k = int(np.nanargmax(t))
        lo, hi = u[max(k - 2, 0)], u[min(k + 2, points - 1)]
    return float(np.exp(u[k]))


def optimal_draft_size_grid(m, d_draft, d_target, loss, plane, *, n_min=1e3, points=4001, levels=4):
    """N* by dense grid search in log N, zoomed ``levels`` times around the best point."""
    return argmax_on_log_grid(lambda n: composite_throughput(n, m, d_draft, d_target, loss, plane), n_min, m,
                              points=points, levels=levels)


def optimal_draft_size_scalar(m, d_draft, d_target, loss, plane, *, n_min=1e3, grid=None, xatol=1e-10):
    """N* by ``scipy.optimize.minimize_scalar`` (bounded Brent) on -log T over log N.

    The bracket comes from a ``grid``-point log grid (default: the JAX solver's default ``num_grid``),
    as the JAX solver's does, so both solve the same problem from the same information.
    """
    if grid is None:
        from sdsl_jax import solve_draft_size

        grid = inspect.signature(solve_draft_size).parameters["num_grid"].default
    u = np.linspace(np.log(n_min), np.log(m), grid)
    t = composite_throughput(np.exp(u), m, d_draft, d_target, loss, plane)
    k = int(np.nanargmax(t))
    bounds = (u[max(k - 1, 0)], u[min(k + 1, grid - 1)])

    def objective(v):
        val = composite_throughput(np.exp(v), m, d_draft, d_target, loss, plane)
        return -np.log(val) if np.isfinite(val) and val > 0 else np.inf

    res = scipy.optimize.minimize_scalar(objective, bounds=bounds, method="bounded", options={"xatol": xatol})
    return float(np.exp(res.x))


def loss_law_objective_and_grad(theta, log_n, log_d, log_loss, delta=1e-3):
    """Summed Huber loss of LSE(a - alpha log N, b - beta log D, e) - log L, and its gradient.

    NumPy with the analytic gradient, as the Epoch replication's SciPy fit would use it.
    """
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(0)
    weights = np.exp(terms - top)
    total = weights.sum(0)
    pred = top + np.log(total)
    weights /= total
    r = pred - log_loss
    value = np.where(np.abs(r) <= delta, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta)).sum()
    dr = np.clip(r, -delta, delta)
    grad = np.array([
        (dr * weights[0]).sum(), (dr * weights[1]).sum(), (dr * weights[2]).sum(),
        -(dr * weights[0] * log_n).sum(), -(dr * weights[1] * log_d).sum(),
    ])
    return value, grad


def fit_loss_law_scipy(starts, log_n, log_d, log_loss, delta=1e-3, *, analytic_gradient=True):
    """SciPy L-BFGS-B from each start (default tolerances); returns (params, values).

    ``analytic_gradient=False`` lets SciPy difference the objective itself (its default when no
    ``jac`` is given), as a fit that hands SciPy only the loss does.
    """
    params, values = [], []
    value_only = lambda th, *a: loss_law_objective_and_grad(th, *a)[0]  # noqa: E731
    for x0 in starts:
        fun, jac = (loss_law_objective_and_grad, True) if analytic_gradient else (value_only, None)
        res = scipy.optimize.minimize(fun, x0, args=(log_n, log_d, log_loss, delta), jac=jac, method="L-BFGS-B")
        params.append(res.x)
        values.append(res.fun)
    return np.array(params), np.array(values)
