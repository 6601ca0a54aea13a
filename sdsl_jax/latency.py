"""Per-call latency models fitted from measured calls: the SDSL law in seconds on your hardware.

A forward call of an N-parameter model reading k positions with a KV cache takes, by the form
``full`` (the default),

    t(N, k) = t0 + t1 k + c1 N + c2 N k

seconds: ``t0`` a call's fixed overhead, ``t1`` what each position costs whatever the size,
``c1 N`` the weight traffic of a memory-bound pass, ``c2 N k`` the arithmetic of each position.
A draft step is ``t(N, 1)`` and a verification of gamma drafts ``t(M, gamma + 1)``, so the
fitted model is a :class:`sdsl_jax.costs.LatencyCost` (affine in gamma: the Lambert-W closed
form applies) and every solver of the library works in tokens per second.

The coefficients are non-negative (times cannot fall with size or positions): the fit is
non-negative weighted least squares on relative residuals ``(t_hat - t) / t`` (small models'
microseconds count as much as large models' milliseconds), solved exactly by enumerating the
active sets of the (at most four) terms. ``FORMS`` lists the nested alternatives, and
:func:`held_out_error` scores a form on token counts it was not fitted to.
"""

from __future__ import annotations

import itertools
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from sdsl_jax.costs import LatencyCost

__all__ = ["fit_latency_file", "FORMS", "HELD_OUT_TOKENS", "held_out_tokens_for", "LatencyFit", "cost_from_coef", "fit_latency_cost", "held_out_error", "latency_cost_draws",
           "predict_seconds", "select_form", "fit_loop_overheads", "fit_latency_table", "MeasuredLatency",
           "fit_measured_latency"]

_TERMS = ("t0", "t1", "c1", "c2")
FORMS: dict[str, tuple[str, ...]] = {
    "full": ("t0", "t1", "c1", "c2"),  # t0 + t1 k + c1 N + c2 N k
    "size-tokens": ("t0", "c1", "c2"),  # t0 + c1 N + c2 N k
    "memory-bound": ("t0", "c1"),  # t0 + c1 N: positions are free
}
"""Latency forms by name: the terms of ``t0 + t1 k + c1 N + c2 N k`` each one keeps."""

HELD_OUT_TOKENS = (3, 5, 7)
"""Token counts held out to choose a form where the timings have them: the verifications of
gamma = 2, 4, 6 (:func:`held_out_tokens_for` chooses others from the timings given)."""


def held_out_tokens_for(tokens) -> tuple[int, ...]:
    """The token counts to hold out when choosing a form, from the counts that were timed.

    :data:`HELD_OUT_TOKENS` where all of them were timed with counts on either side; otherwise every
    second count strictly between the smallest and the largest timed one, so that both the fitted
    and the held-out counts span the range (timings at k = 1, 2, 4, 6, 8 hold out 2 and 6).

    Raises:
      ValueError: fewer than three distinct token counts (nothing to hold out with a fit on each side).
    """
    counts = sorted({int(k) for k in np.asarray(tokens, np.float64).ravel()})
    if len(counts) < 3:
        raise ValueError(f"choosing a latency form needs timings at three or more token counts per call (found k = "
                         f"{', '.join(map(str, counts))}); time more, or give the form")
    if set(HELD_OUT_TOKENS) <= set(counts[1:-1]):
        return HELD_OUT_TOKENS
    return tuple(counts[1:-1][::2])


class LatencyFit(NamedTuple):
    """A fitted latency model.

    Attributes:
      cost: the :class:`LatencyCost` at the fitted coefficients.
      coef: ``{t0, t1, c1, c2}`` (terms outside the form or at the bound are 0).
      covariance: covariance of the active coefficients (order ``active``), from the weighted
        residual scale.
      active: the terms the fit kept (non-zero).
      relative_rmse: root mean square of ``(t_hat - t) / t`` over the rows.
      form: the form's name.
    """

    cost: LatencyCost
    coef: dict
    covariance: np.ndarray
    active: tuple[str, ...]
    relative_rmse: float
    form: str
    overheads: dict = {}


def _design(n: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    return {"t0": np.ones_like(n), "t1": k, "c1": n, "c2": n * k}


def _relative_nnls(columns: dict[str, np.ndarray], terms: tuple[str, ...], t: np.ndarray):
    """Non-negative least squares of ``sum_a coef_a columns[a] ~ t`` on relative residuals, exact:
    the optimum is the unconstrained fit on its active set, so every set is tried.
    Returns ``(sse, active terms, their coefficients, the relative design)``."""
    best = None
    for size in range(len(terms), 0, -1):
        for active in itertools.combinations(terms, size):
            x = np.stack([columns[a] for a in active], axis=1) / t[:, None]
            coef, *_ = np.linalg.lstsq(x, np.ones_like(t), rcond=None)
            if np.any(coef < 0):
                continue
            sse = float(np.sum((x @ coef - 1.0) ** 2))
            if best is None or sse < best[0] - 1e-15:
                best = (sse, active, coef, x)
    return best


def cost_from_coef(coef: dict, overheads: dict | None = None) -> LatencyCost:
    """The :class:`LatencyCost` of ``t(N, k) = t0 + t1 k + c1 N + c2 N k`` (a draft step is k = 1),
    plus the decoding loops' own overheads (:func:`fit_loop_overheads`): ``iteration`` seconds per
    speculative iteration, ``draft_step`` per draft step, ``alone`` per target-alone token."""
    t0, t1, c1, c2 = (np.asarray(coef.get(t, 0.0), np.float64) for t in _TERMS)
    o = overheads or {}
    iteration, step, alone = (np.asarray(o.get(k, 0.0), np.float64) for k in ("iteration", "draft_step", "alone"))
    return LatencyCost(draft_fixed=t0 + t1 + step, draft_per_param=c1 + c2, verify_fixed=t0 + iteration,
                       verify_per_param=c1, verify_per_token=c2, verify_per_position=t1,
                       alone_offset=alone - iteration)


def fit_latency_cost(n_params, tokens, seconds, *, form: str = "full") -> LatencyFit:
    """Fit ``t(N, k)`` (the terms of ``form``) to measured per-call seconds.

    Args:
      n_params: model size N per row.
      tokens: positions read per call, k >= 1.
      seconds: measured seconds per call (medians), > 0.
      form: a name of :data:`FORMS`.

    Raises:
      ValueError: an unknown form, bad values, or too few distinct sizes / token counts for the
        form's terms.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {sorted(FORMS)}, got {form!r}")
    n, k, t = (np.asarray(v, np.float64).ravel() for v in (n_params, tokens, seconds))
    if not (n.shape == k.shape == t.shape) or n.size == 0:
        raise ValueError(f"n_params, tokens and seconds must have one equal length, got {n.size}, {k.size}, {t.size}")
    for name, v, low in (("n_params", n, 0), ("tokens", k, 1), ("seconds", t, 0)):
        if not np.all(np.isfinite(v)) or np.any(v < low) or (low == 0 and np.any(v == 0)):
            raise ValueError(f"{name} must be finite and {'>= 1' if low else '> 0'}")
    terms = FORMS[form]
    if len(np.unique(n)) < 2 and ("c1" in terms or "c2" in terms):
        raise ValueError(f"the {form} form needs at least 2 distinct model sizes, got {len(np.unique(n))}")
    if len(np.unique(k)) < 2 and ("t1" in terms or "c2" in terms):
        raise ValueError(f"the {form} form needs at least 2 distinct token counts, got {len(np.unique(k))}")
    if t.size <= len(terms):
        raise ValueError(f"{t.size} rows cannot fit the {form} form's {len(terms)} coefficients")
    sse, active, coef, x = _relative_nnls(_design(n, k), terms, t)
    dof = max(t.size - len(active), 1)
    covariance = (sse / dof) * np.linalg.pinv(x.T @ x)
    values = {a: 0.0 for a in _TERMS}
    values.update({a: float(c) for a, c in zip(active, coef)})
    return LatencyFit(cost_from_coef(values), values, covariance, tuple(active), float(np.sqrt(sse / t.size)), form)


def predict_seconds(fit: LatencyFit, n_params, tokens) -> np.ndarray:
    """``t(N, k)`` at the fitted coefficients."""
    n, k = np.asarray(n_params, np.float64), np.asarray(tokens, np.float64)
    return sum(fit.coef[a] * _design(n, k)[a] for a in _TERMS)


def held_out_error(n_params, tokens, seconds, *, held_out_tokens, form: str = "full") -> dict:
    """Fit on the rows whose token count is NOT in ``held_out_tokens``; score the others.

    Returns ``{"relative_rmse", "max_abs_relative_error", "fitted_rows", "held_out_rows"}``: the
    error of predicting verification latencies at lookaheads the fit never saw.
    """
    n, k, t = (np.asarray(v, np.float64).ravel() for v in (n_params, tokens, seconds))
    held = np.isin(k, np.asarray(held_out_tokens, np.float64))
    if held.all() or not held.any():
        raise ValueError("held_out_tokens must leave some rows on each side")
    fit = fit_latency_cost(n[~held], k[~held], t[~held], form=form)
    rel = predict_seconds(fit, n[held], k[held]) / t[held] - 1.0
    return dict(relative_rmse=float(np.sqrt(np.mean(rel**2))), max_abs_relative_error=float(np.max(np.abs(rel))),
                fitted_rows=int((~held).sum()), held_out_rows=int(held.sum()))


def latency_cost_draws(fit: LatencyFit, *, count: int, seed: int) -> LatencyCost:
    """``count`` draws of the cost from the fit's sampling distribution (Gaussian on the active
    coefficients, truncated at 0): a :class:`LatencyCost` with arrays of shape ``(count,)``."""
    rng = np.random.default_rng(seed)
    mean = np.array([fit.coef[a] for a in fit.active])
    draws = np.maximum(rng.multivariate_normal(mean, fit.covariance, size=count, method="svd"), 0.0)
    values = {a: np.zeros(count) for a in _TERMS}
    values.update({a: draws[:, i] for i, a in enumerate(fit.active)})
    return cost_from_coef(values, fit.overheads)  # the loop overheads at their fitted values


def select_form(n_params, tokens, seconds, *, held_out_tokens) -> tuple[str, dict]:
    """The form of :data:`FORMS` that best predicts token counts left out of its fit.

    Returns ``(name, scores)``, ``scores[form]`` holding its in-sample ``relative_rmse``, its
    ``held_out`` error (:func:`held_out_error`) and its coefficients.
    """
    scores = {}
    for name in FORMS:
        fit = fit_latency_cost(n_params, tokens, seconds, form=name)
        held = held_out_error(n_params, tokens, seconds, held_out_tokens=held_out_tokens, form=name)
        scores[name] = dict(relative_rmse=fit.relative_rmse, held_out=held, coef=fit.coef)
    return min(scores, key=lambda f: scores[f]["held_out"]["relative_rmse"]), scores


def fit_loop_overheads(fit: LatencyFit, *, alone_m, alone_seconds, iteration_n, iteration_m, iteration_gamma,
                       iteration_seconds) -> LatencyFit:
    """Add what the decoding loops cost beyond their timed calls.

    A speculative iteration is measured at ``gamma t(N, 1) + t(M, gamma + 1) + o_iteration +
    o_step gamma`` seconds and a target-alone token at ``t(M, 1) + o_alone`` (sampling,
    accept/reject and buffer updates are not in a call). The overheads are fitted to timed loops
    (non-negative least squares on relative residuals for the iteration terms, the median
    residual for the alone term) and folded into the returned fit's cost.
    """
    overheads = _loop_overheads(lambda n, k: predict_seconds(fit, n, k), alone_m=alone_m, alone_seconds=alone_seconds,
                                iteration_n=iteration_n, iteration_m=iteration_m, iteration_gamma=iteration_gamma,
                                iteration_seconds=iteration_seconds)
    return fit._replace(cost=cost_from_coef(fit.coef, overheads), overheads=overheads)


def _loop_overheads(predict: Callable, *, alone_m, alone_seconds, iteration_n, iteration_m, iteration_gamma,
                    iteration_seconds) -> dict:
    """``{iteration, draft_step, alone}`` seconds beyond the calls ``predict(n, k)`` says (see
    :func:`fit_loop_overheads`)."""
    m_a, s_a = (np.asarray(v, np.float64).ravel() for v in (alone_m, alone_seconds))
    n_i, m_i, g_i, s_i = (np.asarray(v, np.float64).ravel() for v in (iteration_n, iteration_m, iteration_gamma,
                                                                      iteration_seconds))
    if m_a.size < 1 or n_i.size < 3 or len(np.unique(g_i)) < 2:
        raise ValueError("loop overheads need target-alone timings and iteration timings at two or more lookaheads")
    calls = g_i * predict(n_i, 1.0) + predict(m_i, g_i + 1.0)
    x = np.stack([np.ones_like(g_i), g_i], axis=1) / s_i[:, None]
    y = 1.0 - calls / s_i
    best = None
    for active in ((0, 1), (0,), (1,), ()):
        coef = np.zeros(2)
        if active:
            sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
            if np.any(sol < 0):
                continue
            coef[list(active)] = sol
        sse = float(np.sum((x @ coef - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, coef)
    alone = float(max(np.median(s_a - predict(m_a, 1.0)), 0.0))
    return dict(iteration=float(best[1][0]), draft_step=float(best[1][1]), alone=alone)


def fit_latency_table(table, *, batch: int = 1, form: str = "auto", held_out_tokens=None) -> LatencyFit:
    """The latency model of a ``sdsl-latency v1`` table: ``t(N, k)`` from its calls at ``batch``
    (``form="auto"``: :func:`select_form` on ``held_out_tokens``, by default
    :func:`held_out_tokens_for` the token counts timed), plus the loop overheads when the table has
    loop rows (:func:`fit_loop_overheads`).

    Raises:
      ValueError: no call rows at ``batch``, or data the fits refuse.
    """
    calls = table.of_kind("call")
    calls = calls.select(calls.batch == batch)
    if len(calls) == 0:
        raise ValueError(f"no call rows at batch {batch} (batches: {sorted({int(b) for b in table.batch})})")
    if form == "auto":
        held_out_tokens = held_out_tokens_for(calls.tokens) if held_out_tokens is None else held_out_tokens
        form, _ = select_form(calls.n_params, calls.tokens, calls.seconds_median, held_out_tokens=held_out_tokens)
    fit = fit_latency_cost(calls.n_params, calls.tokens, calls.seconds_median, form=form)
    alone, iteration = table.of_kind("alone"), table.of_kind("iteration")
    if len(alone) and len(iteration):
        fit = fit_loop_overheads(fit, alone_m=alone.n_params, alone_seconds=alone.seconds_median,
                                 iteration_n=iteration.n_draft, iteration_m=iteration.n_params,
                                 iteration_gamma=iteration.gamma, iteration_seconds=iteration.seconds_median)
    return fit


class MeasuredLatency(NamedTuple):
    """Seconds from each timed model's OWN calls, not from a law in N: a cost model.

    Model j's calls give a line ``t_j(k) = fixed_j + per_position_j k`` (non-negative least
    squares on relative residuals over its timed k); between timed sizes both coefficients are
    interpolated linearly in log N (held flat beyond the smallest and the largest). A draft step
    is ``t(N, 1)`` plus ``draft_step_overhead``, a verification ``t(M, k)`` plus ``iteration``,
    a target-alone token ``t(M, 1)`` plus ``alone`` (the decoding loops' own overheads,
    :func:`fit_loop_overheads`). Affine in gamma, so the Lambert-W closed form applies.

    Where a call's time follows the model's shape more than its size (layers, width: what a
    CPU's per-layer dispatch does), the law ``t(N, k)`` of :func:`fit_latency_cost` cannot follow
    it and this table can: use it to choose among drafts that were timed, the law to reach sizes
    that were not.
    """

    log_n: ArrayLike
    fixed: ArrayLike
    per_position: ArrayLike
    iteration: ArrayLike = 0.0
    draft_step_overhead: ArrayLike = 0.0
    alone: ArrayLike = 0.0

    def _line(self, n):
        log_n = jnp.log(jnp.asarray(n, jnp.float64))
        return (jnp.interp(log_n, jnp.asarray(self.log_n), jnp.asarray(self.fixed)),
                jnp.interp(log_n, jnp.asarray(self.log_n), jnp.asarray(self.per_position)))

    def calls(self, n, k):
        """Seconds of one call of the N-parameter model reading k positions (no loop overhead)."""
        a, b = self._line(n)
        return a + b * k

    def draft_step(self, n):
        return self.calls(n, 1.0) + self.draft_step_overhead

    def verification(self, m, k):
        return self.calls(m, k) + self.iteration

    def target_alone(self, m):
        return self.calls(m, 1.0) + self.alone

    def affine(self, n, m):
        a_n, b_n = self._line(n)
        a_m, b_m = self._line(m)
        return a_n + b_n + self.draft_step_overhead + b_m, a_m + b_m + self.iteration


def fit_measured_latency(table, *, batch: int = 1) -> MeasuredLatency:
    """The per-model latency table of a ``sdsl-latency v1`` table's calls at ``batch``
    (:class:`MeasuredLatency`), with the loop overheads when the table has loop rows.

    Raises:
      ValueError: no call rows at ``batch``, a model timed at fewer than two token counts, or
        two timed models of the same size.
    """
    calls = table.of_kind("call")
    calls = calls.select(calls.batch == batch)
    if len(calls) == 0:
        raise ValueError(f"no call rows at batch {batch} (batches: {sorted({int(b) for b in table.batch})})")
    sizes, fixed, per_position = [], [], []
    for name in dict.fromkeys(calls.model):
        rows = np.flatnonzero(np.asarray(calls.model) == name)
        n = np.unique(calls.n_params[rows])
        k, t = calls.tokens[rows], calls.seconds_median[rows]
        if len(np.unique(k)) < 2:
            raise ValueError(f"model {name!r}: timed at {len(np.unique(k))} token count(s); a line needs 2")
        if len(n) != 1:
            raise ValueError(f"model {name!r}: rows of {len(n)} different sizes")
        _, active, coef, _ = _relative_nnls({"fixed": np.ones_like(k), "per_position": k}, ("fixed", "per_position"), t)
        line = dict(zip(active, coef))
        sizes.append(float(n[0]))
        fixed.append(float(line.get("fixed", 0.0)))
        per_position.append(float(line.get("per_position", 0.0)))
    order = np.argsort(sizes)
    log_n = np.log(np.asarray(sizes))[order]
    if np.any(np.diff(log_n) == 0):
        raise ValueError("two timed models have the same size: the table cannot tell them apart by N")
    cost = MeasuredLatency(log_n, np.asarray(fixed)[order], np.asarray(per_position)[order])
    alone, iteration = table.of_kind("alone"), table.of_kind("iteration")
    if len(alone) and len(iteration):
        o = _loop_overheads(lambda n, k: np.asarray(cost.calls(n, k)), alone_m=alone.n_params,
                            alone_seconds=alone.seconds_median, iteration_n=iteration.n_draft,
                            iteration_m=iteration.n_params, iteration_gamma=iteration.gamma,
                            iteration_seconds=iteration.seconds_median)
        cost = cost._replace(iteration=o["iteration"], draft_step_overhead=o["draft_step"], alone=o["alone"])
    return cost


def fit_latency_file(path: str, batch: int):
    """The latency model of the ``sdsl-latency v1`` file ``path`` at ``batch`` (its form chosen by held-out
    error) and the call rows it was fitted to; a :class:`~sdsl_jax.data.DataError` names a bad file."""
    from sdsl_jax.data import DataError, load_latency

    table = load_latency(path)
    try:
        fit = fit_latency_table(table, batch=batch)
    except ValueError as err:
        raise DataError(path, None, None, f"cannot fit a latency model: {err}") from None
    calls = table.of_kind("call")
    return fit, calls.select(calls.batch == batch)
