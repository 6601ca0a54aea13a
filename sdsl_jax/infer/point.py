"""Point fits with optax: a multi-start L-BFGS fitter, the loss law and the plane.

Generic fitter. :func:`fit_multistart` runs optax's L-BFGS from many starts (one after another on a
CPU, vmapped in rounds on an accelerator with small data), with SciPy L-BFGS-B's stopping rules, and
keeps the best finite optimum, reporting convergence for every start.

Loss law [Besiroglu et al. 2024, the Epoch replication of Hoffmann et al. 2022 Approach 3]::

    log L_hat(N, D) = LSE(a - alpha log N, b - beta log D, e)       (E = e^e, A = e^a, B = e^b)
    objective = sum_i Huber_delta(log L_hat(N_i, D_i) - log L_i),   delta = 1e-3

SUMMED, not averaged (a mean shrinks the gradient below L-BFGS's tolerances and stops it early),
from the replication's grid of 4,500 starts (:data:`EPOCH_GRID`).

Acceptance plane [SDSL]: ``alpha = A x + B y + C`` by weighted least squares (closed form).

These fits need float64 (the Huber threshold is 1e-3 on log losses); the functions check that
x64 is enabled and say so otherwise.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from sdsl_jax.acceptance import PLANE, AcceptanceModel
from sdsl_jax.data import DataError
from sdsl_jax.loss_laws import (CHINCHILLA, EPOCH_GRID, LossLaw, LossLawFamily, law_from_theta,  # noqa: F401
                                loss_law_log_prediction, theta_from_law)

__all__ = [
    "FitResult",
    "LossLawFit",
    "PlaneFit",
    "EPOCH_GRID",
    "fit_multistart",
    "loss_law_log_prediction",
    "loss_law_objective",
    "law_from_theta",
    "theta_from_law",
    "fit_loss_law",
    "fit_acceptance_plane",
    "IdentifiabilityError",
    "check_loss_law_data",
    "check_acceptance_data",
    "NEAR_OPTIMUM",
    "rival_optima",
    "DEGENERATE_MAGNITUDE",
    "degenerate_coefficients",
    "coordinates_beyond_posterior",
]


class FitResult(NamedTuple):
    """Outcome of :func:`fit_multistart`.

    Attributes:
      params: parameters of the best start (lowest finite objective).
      value: objective at ``params``.
      converged: whether the best start converged (see ``all_converged``).
      best_index: index of the best start.
      all_params: final parameters of every start (leading axis = start).
      all_values: final objective of every start (inf where not finite).
      all_converged: for every start, whether it stopped before ``max_steps`` at a stationary
        point by the tolerances: its gradient norm at most ``gtol``, or the decrease left along its
        gradient at most ``ftol`` of the objective (a start whose line search stalled far from a
        stationary point did not converge; see ``_converged``).
      all_num_steps: L-BFGS steps taken by every start.
    """

    params: jax.Array
    value: jax.Array
    converged: jax.Array
    best_index: jax.Array
    all_params: jax.Array
    all_values: jax.Array
    all_converged: jax.Array
    all_num_steps: jax.Array


def _require_x64(what: str) -> None:
    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            f"{what} needs float64: call jax.config.update('jax_enable_x64', True) first "
            "(the Huber threshold of 1e-3 on log losses is below float32's useful resolution)"
        )


def _stop_without_descent(lbfgs: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optax.scale_by_lbfgs`` whose direction is zeroed where it is not a descent direction.

    Armijo backtracking does not enforce the curvature condition, so a pair with ``y . s <= 0``
    can enter the memory: the preconditioned gradient ``P g`` is then not a descent direction
    (``g . P g <= 0``) and no step size decreases the objective. The search would try all its
    step sizes and move the start along an ascent direction; under ``vmap`` every start of the
    batch waits for those trials. A zero direction is accepted at the first trial, the objective
    does not decrease, and the start stops by the decrease rule (as it did after the full search).
    """

    def update_fn(updates, state, params=None):
        direction, new_state = lbfgs.update(updates, state, params)
        slope = optax.tree.real(optax.tree.vdot(updates, direction))
        descent = jnp.isfinite(slope) & (slope > 0)
        return jax.tree.map(lambda d: jnp.where(descent, d, jnp.zeros_like(d)), direction), new_state

    return optax.GradientTransformation(lbfgs.init, update_fn)


# L-BFGS with a backtracking (Armijo) line search: the unit step is accepted almost always, so
# an iteration costs about one objective evaluation; optax's default zoom search cost ~2.5x more
# time here for the same optimum.
_BACKTRACKING = optax.chain(
    _stop_without_descent(optax.scale_by_lbfgs()), optax.scale(-1.0),
    optax.scale_by_backtracking_linesearch(max_backtracking_steps=20, store_grad=True))
# Strong-Wolfe (zoom) line search: every accepted step satisfies the curvature condition, so the
# L-BFGS memory stays positive definite. Armijo backtracking alone can store a pair with
# y.s <= 0 on a badly conditioned, piecewise-quadratic (Huber) objective; the next direction is
# then not a descent direction and the fit stalls far from the optimum (seen with the Kaplan,
# broken and data-only families, whose coefficient and exponent are strongly correlated).
_ZOOM = optax.lbfgs()
_SOLVERS = {"backtracking": _BACKTRACKING, "zoom": _ZOOM}


class _Carry(NamedTuple):
    params: jax.Array
    state: Any
    previous_value: jax.Array


def _keep_going(carry: _Carry, max_steps, ftol, gtol) -> jax.Array:
    """Stop when the relative decrease is <= ftol or the gradient norm is <= gtol.

    SciPy L-BFGS-B measures the decrease against ``max(|f|, 1)``; an objective far below 1 (a
    summed Huber loss of good fits is ~1e-3) then stops at a decrease of ~1e-6 of itself, early
    enough that two machines' rounding ends in different places (the ladder's mu moved by 30%).
    Here the decrease is measured against ``|f|`` itself (the tiny floor only guards f = 0).
    """
    count = optax.tree.get(carry.state, "count")
    value = optax.tree.get(carry.state, "value")
    grad_norm = optax.tree.norm(optax.tree.get(carry.state, "grad"))
    scale = jnp.maximum(jnp.maximum(jnp.abs(value), jnp.abs(carry.previous_value)), jnp.finfo(value.dtype).tiny)
    decreasing = (carry.previous_value - value) > ftol * scale
    return (count < 2) | ((count < max_steps) & decreasing & (grad_norm > gtol) & jnp.isfinite(value))


_keep_going_all = jax.jit(jax.vmap(_keep_going, (0, None, None, None)))
""":func:`_keep_going` for every start of a carry (one program per number of starts, shared by every fit)."""


def _init(params: jax.Array, solver) -> _Carry:
    return _Carry(params, solver.init(params), jnp.asarray(jnp.inf, params.dtype))


@functools.partial(jax.jit, static_argnames=("linesearch",))
def _fresh_starts(params: jax.Array, *, linesearch: str) -> _Carry:
    """A carry for every row of ``params``, with empty L-BFGS memory."""
    return jax.vmap(lambda p: _init(p, _SOLVERS[linesearch]))(params)


@functools.partial(jax.jit, static_argnames=("linesearch",))
def _restarted(carry: _Carry, indices, *, linesearch: str) -> _Carry:
    """The starts ``indices`` of ``carry`` given empty L-BFGS memory where they are (a repeated index
    is set twice to the same fresh state)."""
    fresh = _fresh_starts(carry.params[indices], linesearch=linesearch)
    return jax.tree.map(lambda x, y: x.at[indices].set(y), carry, fresh)


def _iterate(objective, c: _Carry, args, max_steps, ftol, gtol, steps, linesearch: str, run=True) -> _Carry:
    """Up to ``steps`` L-BFGS iterations of one start, fewer where its stopping rule ends it (none
    where ``run`` is false)."""
    fun = lambda p: objective(p, *args)  # noqa: E731
    value_and_grad = optax.value_and_grad_from_state(fun)

    def step(inner):
        c, k = inner
        value, grad = value_and_grad(c.params, state=c.state)
        updates, state = _SOLVERS[linesearch].update(grad, c.state, c.params, value=value, grad=grad,
                                                     value_fn=fun)
        return _Carry(optax.apply_updates(c.params, updates), state, value), k + 1

    def cond(inner):
        c, k = inner
        return run & (k < steps) & _keep_going(c, max_steps, ftol, gtol)

    return jax.lax.while_loop(cond, step, (c, 0))[0]


@functools.partial(jax.jit, static_argnames=("objective", "steps", "linesearch"))
def _advance_chunk(objective, carry: _Carry, indices, args, max_steps, ftol, gtol, *, steps: int,
                   linesearch: str) -> _Carry:
    """Up to ``steps`` L-BFGS iterations for the starts ``indices`` of ``carry`` (vmapped).

    ``indices`` may repeat a start (padding to a fixed chunk size): a repeated start computes
    the same result, so scattering it twice is harmless.
    """
    one = lambda c: _iterate(objective, c, args, max_steps, ftol, gtol, steps, linesearch)  # noqa: E731
    advanced = jax.vmap(one)(jax.tree.map(lambda x: x[indices], carry))
    return jax.tree.map(lambda x, y: x.at[indices].set(y), carry, advanced)


@functools.partial(jax.jit, static_argnames=("objective", "linesearch"))
def _run_one_by_one(objective, carry: _Carry, indices, args, max_steps, ftol, gtol, *, linesearch: str) -> _Carry:
    """Every start of ``indices`` run to its stopping rule, one start after another (``lax.map``).

    Under ``vmap`` a lane runs every line-search trial and every step that any lane of its batch
    needs; on large data that lockstep, not the arithmetic, sets the cost. Run alone, a start pays
    for its own trials and steps only. Indices past the last start are padding: skipped, not written.
    """
    num_starts = carry.params.shape[0]

    def one(index):
        c = jax.tree.map(lambda x: x[jnp.minimum(index, num_starts - 1)], carry)
        return _iterate(objective, c, args, max_steps, ftol, gtol, max_steps, linesearch, run=index < num_starts)

    advanced = jax.lax.map(one, indices)
    return jax.tree.map(lambda x, y: x.at[indices].set(y, mode="drop"), carry, advanced)


def fit_multistart(
    objective: Callable[..., jax.Array],
    starts: ArrayLike,
    *,
    args: tuple = (),
    max_steps: int = 1000,
    ftol: float = 2.2e-9,
    gtol: float = 1e-10,
    chunk_size: int = 512,
    steps_per_round: int = 2,
    polish_steps: int = 50,
    progress: Callable[[int, int, int], None] | None = None,
    linesearch: str = "zoom",
    one_by_one: bool | None = None,
) -> FitResult:
    """Minimise ``objective(theta, *args)`` from every row of ``starts``; keep the best optimum.

    L-BFGS (optax, backtracking line search). On a CPU, and on an accelerator with large data, each
    start runs to its stopping rule on its own, the starts one after another inside compiled calls
    of 64 (so a start pays only for its own line-search trials and steps). On an accelerator with
    small data the starts are vectorised with ``jax.vmap`` over chunks of ``chunk_size``, in rounds
    of ``steps_per_round`` iterations; after each round the starts that stopped are retired and the
    rest repacked, so the cost follows the total number of iterations rather than (number of
    starts) x (slowest start). Stopping rules
    are SciPy L-BFGS-B's, except that the decrease is relative to the objective itself (not to
    ``max(|f|, 1)``: a summed loss of 1e-3 would stop at a decrease of 1e-6 of itself): relative
    decrease <= ``ftol`` or gradient norm <= ``gtol``; ``max_steps`` caps a start (and then it is
    reported as not converged). A start that stalled short of a stationary point (see
    ``FitResult.all_converged``) is restarted once from fresh L-BFGS memory.

    Args:
      objective: scalar function ``objective(theta, *args)``; a module-level function (not a
        fresh lambda) so that compiled code is reused across calls.
      starts: initial parameter vectors, shape ``(num_starts, num_params)``.
      args: data passed to the objective (arrays).
      max_steps, ftol, gtol: stopping rules (see above).
      chunk_size: starts per vectorised batch (when vectorised).
      steps_per_round: iterations between retirements (when vectorised).
      polish_steps: extra iterations, from fresh memory and by the gradient rule alone, for every
        start within :data:`NEAR_OPTIMUM` of the best (:func:`_polish_near_best`).
      progress: called as ``progress(round, active_starts, total_starts)`` after each round (each
        compiled call when the starts run one by one; active counts the starts not yet run).
      linesearch: ``"zoom"`` (strong Wolfe, the default: every accepted step satisfies the
        curvature condition, so L-BFGS's memory stays positive definite and a start runs to a
        stationary point) or ``"backtracking"`` (Armijo; about one objective evaluation per
        iteration, but a step with ``y . s <= 0`` enters the memory, the next direction can fail to
        descend and the start stalls far more often: docs/benchmarks.md, "Scaling").
      one_by_one: run the starts one by one (True) or vectorised (False); None chooses as above.

    Returns:
      :class:`FitResult`.
    """
    if linesearch not in _SOLVERS:
        raise ValueError(f"linesearch must be one of {sorted(_SOLVERS)}, got {linesearch!r}")
    # optax's L-BFGS mixes int32 and int64 internally, which strict promotion (our tests' mode)
    # rejects; the promotions involved are harmless.
    with jax.numpy_dtype_promotion("standard"):
        return _fit_multistart(objective, jnp.asarray(starts), args, max_steps, ftol, gtol, chunk_size,
                               steps_per_round, polish_steps, progress, linesearch, one_by_one)


_ONE_BY_ONE_FROM = 2**20
"""On an accelerator, data elements in one batched evaluation (elements per start x ``chunk_size``
lanes) from which starts run one after another instead of vmapped (:func:`_run_one_by_one`). A
vmapped batch runs at the pace of its slowest line search and start; on a CPU that lockstep costs
more than the batch saves at every size measured (30 to 30,000 rows: ``python -m experiments.bench
--only scaling``), so there starts always run one by one. The results are the same either way up to
rounding, since starts do not interact."""

_STARTS_PER_CALL = 64
"""Starts per compiled call when they run one by one: progress is reported between calls."""


def _fit_multistart(objective, starts, args, max_steps, ftol, gtol, chunk_size, steps_per_round, polish_steps,
                    progress, linesearch, one_by_one):
    num_starts = starts.shape[0]
    carry = _fresh_starts(starts, linesearch=linesearch)
    small_chunk = max(1, chunk_size // 16)
    if one_by_one is None:
        one_by_one = (jax.default_backend() == "cpu"
                      or sum(int(np.size(a)) for a in jax.tree.leaves(args)) * chunk_size >= _ONE_BY_ONE_FROM)
    limits = (jnp.asarray(max_steps, jnp.int32), jnp.asarray(ftol, starts.dtype), jnp.asarray(gtol, starts.dtype))
    if one_by_one:
        calls = -(-num_starts // _STARTS_PER_CALL)
        for call in range(calls):
            indices = np.arange(call * _STARTS_PER_CALL, (call + 1) * _STARTS_PER_CALL)  # the last call padded
            carry = _run_one_by_one(objective, carry, indices, tuple(args), *limits, linesearch=linesearch)
            if progress is not None:
                # JAX returns before the call has run: without waiting, the report would count starts
                # dispatched, not run (and say "0 left" seconds before they are).
                jax.block_until_ready(carry)
                progress(call + 1, max(0, num_starts - (call + 1) * _STARTS_PER_CALL), num_starts)
    active = np.zeros(num_starts, bool) if one_by_one else np.asarray(_keep_going_all(carry, *limits))
    rounds = 0
    while active.any():  # vectorised rounds (each start run one by one already ended by its rule)
        indices = np.flatnonzero(active)
        for first in range(0, indices.size, chunk_size):
            live = indices[first : first + chunk_size]
            padded = np.resize(live, small_chunk if live.size <= small_chunk else chunk_size)  # repeats real starts
            carry = _advance_chunk(objective, carry, padded, tuple(args), *limits, steps=steps_per_round,
                                   linesearch=linesearch)
        active = np.asarray(_keep_going_all(carry, *limits))
        rounds += 1
        if progress is not None:
            progress(rounds, int(active.sum()), num_starts)

    # A start that stalled short of a stationary point (a line search that found no lower point)
    # is restarted once from fresh L-BFGS memory, as SciPy's L-BFGS-B does after a failed search.
    # The bookkeeping below is NumPy, and what must be JAX is compiled whole (_converged,
    # _restarted): dispatched one by one, each JAX operation compiles again for every new number of
    # starts, and that differs from fit to fit.
    values = np.asarray(optax.tree.get(carry.state, "value"))
    steps = np.array(optax.tree.get(carry.state, "count"))
    stopped = (steps < max_steps) & np.isfinite(values)
    at_stationary = np.array(_converged(objective, carry, tuple(args), ftol, gtol))
    stalled = np.flatnonzero(stopped & ~at_stationary)
    carry, steps, restarted_steps = _continue_afresh(objective, carry, steps, stalled, tuple(args), max_steps, ftol,
                                                     gtol, linesearch)
    stopped[stalled] = restarted_steps < max_steps
    polished = np.zeros(0, int)
    if polish_steps:
        carry, steps, polished = _polish_near_best(objective, carry, steps, stopped, tuple(args), polish_steps, gtol,
                                                   linesearch)
    values = np.asarray(optax.tree.get(carry.state, "value"))
    moved = np.union1d(stalled, polished)  # only these starts' state changed since the check above
    if moved.size:
        at_stationary[moved] = np.asarray(
            _converged(objective, carry, tuple(args), ftol, gtol, indices=_padded(moved)))[: moved.size]
    converged = stopped & at_stationary
    values = np.where(np.isfinite(values), values, np.inf)
    best = int(np.argmin(values))
    params = np.asarray(carry.params)
    return FitResult(jnp.asarray(params[best]), jnp.asarray(values[best]), jnp.asarray(converged[best]), best,
                     carry.params, jnp.asarray(values), jnp.asarray(converged), jnp.asarray(steps))


_ROUNDING_FLOOR = 1e3
"""The decrease left that counts as none, in ulps of the objective: below it rounding, not the
objective, decides whether a step lowers it (:func:`_converged`)."""


@functools.partial(jax.jit, static_argnames=("objective",))
def _converged(objective, carry: _Carry, args, ftol, gtol, indices=None) -> jax.Array:
    """Starts (those of ``indices``, or all) at a stationary point by the fit's tolerances: the
    gradient norm at most ``gtol``, or the decrease left along the gradient at most ``ftol`` of the
    objective (or its rounding floor).

    A start stops when a step lowers the objective by at most ``ftol`` of it, which is the end of
    the descent only where the step was not cut short: a line search on the edge of a kink (the
    Huber loss's), or an L-BFGS memory holding a pair with ``y . s <= 0`` (whose direction does
    not descend), stops it with a tiny or no decrease far from a stationary point, and that start
    did not converge. The quadratic model along the gradient measures what is left: the best step
    along ``-g`` lowers the objective by ``(g . g)^2 / (2 g . H g)`` (``H g`` by one
    Hessian-vector product per start); a curvature ``g . H g <= 0`` is not a minimum.
    """
    if indices is not None:
        carry = jax.tree.map(lambda x: x[indices], carry)
    values = optax.tree.get(carry.state, "value")
    grads = optax.tree.get(carry.state, "grad")
    grad_norm = jax.vmap(optax.tree.norm)(grads)
    curvature = _gradient_curvature(objective, carry.params, grads, tuple(args))
    decrease_left = grad_norm**4 / (2.0 * jnp.where(curvature > 0, curvature, 1.0))
    tolerance = jnp.maximum(ftol, _ROUNDING_FLOOR * jnp.finfo(values.dtype).eps) * jnp.abs(values)
    return jnp.isfinite(values) & ((grad_norm <= gtol) | ((curvature > 0) & (decrease_left <= tolerance)))


@functools.partial(jax.jit, static_argnames=("objective",))
def _gradient_curvature(objective, params, grads, args) -> jax.Array:
    """``g . H g`` at every start (a Hessian-vector product each), :data:`_STARTS_PER_CALL` starts
    vectorised at a time: all 4,500 at once would hold 4,500 copies of the data's intermediates."""

    def one(start):
        p, g = start
        gradient = lambda q: jax.grad(objective)(q, *args)  # noqa: E731
        return jnp.vdot(g, jax.jvp(gradient, (p,), (g,))[1])

    return jax.lax.map(one, (params, grads), batch_size=_STARTS_PER_CALL)


def _polish_near_best(objective, carry: _Carry, steps, stopped, args, polish_steps: int, gtol, linesearch: str):
    """Every start that stopped before ``max_steps`` (``stopped``) within :data:`NEAR_OPTIMUM` of
    the best but not already within 1e-9 of it, and the best start, continued from fresh L-BFGS
    memory by the gradient rule alone (``ftol = 0``), at most ``polish_steps`` more steps each.

    SciPy's decrease rule can stop a start while a few more steps still pay (at ~1e-10 of the
    objective), and a start whose direction stopped descending (a bad curvature pair in its memory)
    stops where it is. Continued afresh, a near-best start either reaches the best optimum or ends at
    another stationary point, so the near-best starts that still disagree (:func:`rival_optima`) are
    rival optima, not starts stopped on the way. There are a few of them: one by one, they cost
    next to nothing.
    """
    values = np.asarray(optax.tree.get(carry.state, "value"))
    values = np.where(np.isfinite(values), values, np.inf)
    best = np.min(values)
    # Starts already at the best objective (to 1e-9) have nothing to gain, except the best one itself.
    near = np.flatnonzero(stopped & (values <= best + NEAR_OPTIMUM * np.abs(best))
                          & ((values > best + 1e-9 * np.abs(best)) | (np.arange(values.size) == np.argmin(values))))
    carry, steps, _ = _continue_afresh(objective, carry, steps, near, args, polish_steps, 0.0, gtol, linesearch)
    return carry, steps, near


def _continue_afresh(objective, carry: _Carry, steps, indices: np.ndarray, args, max_steps: int, ftol, gtol,
                     linesearch: str):
    """The starts ``indices`` continued from fresh L-BFGS memory, one by one, to their stopping rule
    (at most ``max_steps`` more steps each): the carry, the total steps, and the new run's steps."""
    if indices.size == 0:
        return carry, steps, np.zeros(0, np.int32)
    carry = _restarted(carry, _padded(indices), linesearch=linesearch)
    dtype = carry.params.dtype
    limits = (jnp.asarray(max_steps, jnp.int32), jnp.asarray(ftol, dtype), jnp.asarray(gtol, dtype))
    num_starts = carry.params.shape[0]
    for first in range(0, indices.size, _STARTS_PER_CALL):
        call = np.full(_STARTS_PER_CALL, num_starts)  # padding past the last start is skipped
        chunk = indices[first : first + _STARTS_PER_CALL]
        call[: chunk.size] = chunk
        carry = _run_one_by_one(objective, carry, call, args, *limits, linesearch=linesearch)
    new_steps = np.asarray(optax.tree.get(carry.state, "count"))[indices]
    total = np.array(steps)
    total[indices] += new_steps
    return carry, total, new_steps


def _padded(indices: np.ndarray) -> np.ndarray:
    """``indices`` repeated up to the next power of two: the arrays gathered with them then take one
    of a few sizes, and their operations compile once for each, not once per number of starts."""
    return np.resize(indices, 1 << int(indices.size - 1).bit_length())


def loss_law_objective(theta, log_n, log_d, log_loss, delta=1e-3) -> jax.Array:
    """Summed Huber loss of log-loss residuals, Chinchilla family [Besiroglu et al. 2024]."""
    residuals = loss_law_log_prediction(theta, log_n, log_d) - log_loss
    return optax.losses.huber_loss(residuals, delta=delta).sum()


@functools.lru_cache(maxsize=None)
def huber_objective(family: LossLawFamily) -> Callable[..., jax.Array]:
    """The summed-Huber objective ``objective(theta, log_n, log_d, log_loss, delta)`` of a family.

    One function per family (cached), so that :func:`fit_multistart` compiles it once.
    """
    if family is CHINCHILLA:
        return loss_law_objective

    def objective(theta, log_n, log_d, log_loss, delta=1e-3):
        residuals = family.log_prediction(theta, log_n, log_d) - log_loss
        return optax.losses.huber_loss(residuals, delta=delta).sum()

    return objective


class LossLawFit(NamedTuple):
    """A fitted loss law and the multi-start record behind it."""

    law: Any  # the family's law type (LossLaw for Chinchilla)
    theta: jax.Array  # fitting coordinates, family.theta_names
    result: FitResult
    family: LossLawFamily = CHINCHILLA


class IdentifiabilityError(DataError):
    """Data that cannot identify a model's coefficients; names the file (if any) and the column."""

    def __init__(self, column: str | None, problem: str, *, source: str | None = None):
        super().__init__(source or "data", None, column, problem)


def _distinct(values: np.ndarray) -> np.ndarray:
    # Values equal to 12 significant digits are one value (a CSV round trip must not split them).
    return np.unique(np.round(np.log(values) if np.all(values > 0) else values, 12))


DISTINCT_SCALE_GAP = 0.01
"""Two model sizes or token budgets count as distinct values of a law's variable only when their
logs differ by more than this (1%). A term's coefficients are identified by how the loss bends
between values of its variable; runs at budgets 0.3% apart (a ladder whose token counts are
rounded to whole batches) measure one point of that curve twice. Counted as two, they would let
the one-break law (6 budgets needed) be fitted to the factorial ladder's 5 budgets, where its
posterior is a ridge along which NUTS runs to its maximum tree depth."""


def _distinct_scales(values: np.ndarray) -> int:
    """How many distinct values positive ``values`` take, values within :data:`DISTINCT_SCALE_GAP`
    in log of their neighbour counted as one (a chain of close values is one value); exact
    distinct values where some are not positive."""
    if not np.all(values > 0):
        return len(_distinct(values))
    logs = np.unique(np.log(values))
    return 1 + int(np.sum(np.diff(logs) > DISTINCT_SCALE_GAP))


def check_loss_law_data(n_params: ArrayLike, n_tokens: ArrayLike, loss: ArrayLike, *,
                        family: LossLawFamily = CHINCHILLA, source: str | None = None) -> None:
    """Refuse data that cannot identify ``family``'s coefficients, before any fitting.

    Rules: more runs than coefficients (so a residual scale exists), at least
    ``family.min_sizes`` distinct N and ``family.min_budgets`` distinct D (a term with k
    coefficients in one variable needs k + 1 distinct values; values within 1% of each other
    count as one, :data:`DISTINCT_SCALE_GAP`), and a loss that varies.

    Raises:
      IdentifiabilityError: naming the column and the reason (and ``source``, a file, if given).
    """
    columns = {"n_params": np.asarray(n_params, np.float64).ravel(), "n_tokens": np.asarray(n_tokens, np.float64).ravel(),
               "loss": np.asarray(loss, np.float64).ravel()}
    rows = len(columns["loss"])
    if rows < family.num_params + 1:
        raise IdentifiabilityError(None, f"{rows} run(s) cannot identify the {family.name} law's {family.num_params} "
                                         f"coefficients ({', '.join(family.theta_names)}): at least "
                                         f"{family.num_params + 1} are needed", source=source)
    needs = (("n_params", family.min_sizes, "model sizes N", "N term"),
             ("n_tokens", family.min_budgets, "token budgets D", "D term"))
    for column, minimum, what, term in needs:
        exact = len(_distinct(columns[column]))
        count = _distinct_scales(columns[column])
        if count < minimum:
            close = f" ({exact} before merging values within 1% of each other)" if exact > count else ""
            raise IdentifiabilityError(column, f"has {count} distinct value(s){close} in {rows} rows; the "
                                               f"{family.name} law's {term} needs at least {minimum} distinct {what}",
                                       source=source)
    if len(_distinct(columns["loss"])) < 2:
        raise IdentifiabilityError("loss", f"takes one value ({columns['loss'][0]:g}) in all {rows} rows: nothing "
                                           "to fit", source=source)


def fit_loss_law(
    n_params: ArrayLike,
    n_tokens: ArrayLike,
    loss: ArrayLike,
    *,
    family: LossLawFamily = CHINCHILLA,
    delta: float = 1e-3,
    starts: ArrayLike | None = None,
    max_steps: int = 1000,
    ftol: float = 2.2e-9,
    gtol: float = 1e-10,
    progress: Callable[[int, int, int], None] | None = None,
    linesearch: str = "zoom",
    require_identified: bool = True,
) -> LossLawFit:
    """Fit ``L(N, D) = E + A/N^alpha + B/D^beta`` by the Epoch replication's method.

    Args:
      n_params, n_tokens, loss: the runs (1-D, positive).
      delta: Huber threshold on log-loss residuals.
      family: the law's form (:mod:`sdsl_jax.loss_laws`; default Chinchilla, the paper's).
      starts: rows of the family's theta; default its grid (Chinchilla: :data:`EPOCH_GRID`,
        the Epoch replication's 4,500 starts).
      max_steps, ftol, gtol: L-BFGS stopping rules per start (SciPy's default values; ``ftol``
        is relative to the objective itself, see :func:`fit_multistart`).
      progress: callback ``(round, active_starts, total_starts)``, see :func:`fit_multistart`.
      linesearch: L-BFGS line search (:func:`fit_multistart`); default ``"zoom"`` for every
        family: with each start run on its own, strong-Wolfe steps cost no other start anything,
        and they carry a start to its optimum where Armijo backtracking stalls it (on 3,000 and
        30,000 synthetic rows as many of the same starts reach the best objective as with SciPy's
        L-BFGS-B, against a half and a tenth with backtracking; ``python -m experiments.bench
        --only scaling``).
      require_identified: refuse data that cannot identify the family
        (:func:`check_loss_law_data`, the default). False fits them anyway, for a law that only
        has to reproduce the data, not be the one they imply: the true process of a synthetic
        study (:func:`sdsl_jax.validation.misspecified.ladder_processes`). Where the data do not
        identify the family, the result is one of many laws that fit them equally well.

    Returns:
      :class:`LossLawFit` (``law`` is the point estimate, of the family's law type).

    References:
      Besiroglu, Erdil, Barnett & You (2024), arXiv 2404.10102, section 3 and appendix.
    """
    _require_x64("fit_loss_law")
    if require_identified and not any(isinstance(v, jax.core.Tracer) for v in (n_params, n_tokens, loss)):
        check_loss_law_data(n_params, n_tokens, loss, family=family)
    data = tuple(jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens, loss))
    starts = jnp.asarray(family.starts(*data) if starts is None else starts, jnp.float64)
    if starts.ndim != 2 or starts.shape[1] != family.num_params:
        raise ValueError(f"starts must have shape (num_starts, {family.num_params}) for the {family.name} family "
                         f"({', '.join(family.theta_names)}), got {starts.shape}")
    result = fit_multistart(
        huber_objective(family), starts, args=(*data, jnp.asarray(delta, jnp.float64)), max_steps=max_steps,
        ftol=ftol, gtol=gtol, progress=progress,
        linesearch=linesearch,
    )
    return LossLawFit(family.from_theta(result.params), result.params, result, family)


class PlaneFit(NamedTuple):
    """Weighted least-squares acceptance model."""

    plane: Any  # the model's params_type (AcceptancePlane for the paper's plane)
    r_squared: jax.Array
    residual_std: jax.Array  # weighted RMS residual of alpha


def check_acceptance_data(ppl_draft: ArrayLike, ppl_target: ArrayLike, alpha: ArrayLike, *,
                          model: AcceptanceModel = PLANE, source: str | None = None) -> None:
    """Refuse acceptance data that cannot identify ``model``'s A, B and C, before fitting.

    Rules: at least 4 rows (3 coefficients and a residual); each regressor (draft and target
    perplexity, through ``model.features``) takes at least two values; the two are not collinear
    (then A and B cannot be told apart).

    Raises:
      IdentifiabilityError: naming the column and the reason.
    """
    x, y, a = (np.asarray(v, np.float64).ravel() for v in (ppl_draft, ppl_target, alpha))
    if len(a) < 4:
        raise IdentifiabilityError(None, f"{len(a)} acceptance row(s) cannot identify the {model.name} model's 3 "
                                         "coefficients (A, B, C): at least 4 are needed", source=source)
    u, v = (np.asarray(f, np.float64) for f in model.features(x, y))
    for column, raw, feature, coef in (("ppl_draft", x, u, "A"), ("ppl_target", y, v, "B")):
        if len(_distinct(raw)) < 2:
            raise IdentifiabilityError(column, f"takes one value ({raw[0]:g}) in all {len(a)} rows: its coefficient "
                                               f"{coef} cannot be identified", source=source)
    cu, cv = u - u.mean(), v - v.mean()
    correlation = float(cu @ cv / np.sqrt((cu @ cu) * (cv @ cv)))
    if abs(correlation) > 1 - 1e-9:
        raise IdentifiabilityError("ppl_target", f"is collinear with ppl_draft in the {model.name} model's features "
                                                 f"(correlation {correlation:+.10f}): A and B cannot be told apart",
                                   source=source)


def fit_acceptance_plane(
    ppl_draft: ArrayLike, ppl_target: ArrayLike, alpha: ArrayLike, *, weights: ArrayLike | None = None,
    model: AcceptanceModel = PLANE,
) -> PlaneFit:
    """Fit ``alpha = A x + B y + C`` (or the model's features and link) by weighted least squares.

    For a logit-linked model the least squares are on ``logit alpha`` (the measured alpha lie in
    (0, 1)); R^2 and the residual are reported on alpha for every model, so that they compare.

    Args:
      ppl_draft: draft perplexities x.
      ppl_target: target perplexities y.
      alpha: measured acceptance rates.
      weights: per-row weights (e.g. iterations measured); default equal.
      model: the acceptance model (default the paper's plane; ``LOG_PLANE`` fits on losses).

    Returns:
      :class:`PlaneFit` with the plane, weighted R^2 and weighted RMS residual.

    References:
      SDSL (2026), arXiv 2603.11053 (paper fit: A = -0.0067, B = 0.01297, C = 0.642, R^2 = 0.602).
    """
    if not any(isinstance(v, jax.core.Tracer) for v in (ppl_draft, ppl_target, alpha)):
        check_acceptance_data(ppl_draft, ppl_target, alpha, model=model)
    x, y, a = (jnp.asarray(v, jnp.result_type(float)) for v in (ppl_draft, ppl_target, alpha))
    w = jnp.ones_like(a) if weights is None else jnp.asarray(weights, a.dtype)
    sw = jnp.sqrt(w / w.sum())
    u, v = model.features(x, y)
    design = jnp.stack([u, v, jnp.ones_like(u)], axis=1)
    coef, *_ = jnp.linalg.lstsq(design * sw[:, None], model.to_link(a) * sw)
    plane = model.params_type(*coef)
    residual = a - (design @ coef if model.link == "identity" else plane.rate(x, y))
    mean = (w * a).sum() / w.sum()
    r2 = 1.0 - (w * residual**2).sum() / (w * (a - mean) ** 2).sum()
    return PlaneFit(plane, r2, jnp.sqrt((w * residual**2).sum() / w.sum()))


NEAR_OPTIMUM = 1e-2
"""Relative distance to the best objective within which another start's optimum counts as a rival."""


def rival_optima(all_theta: np.ndarray, all_values: np.ndarray, names: tuple[str, ...], *,
                 converged: np.ndarray | None = None, near: float = NEAR_OPTIMUM,
                 spread: float = 0.05) -> tuple[str, ...]:
    """Coordinates that differ by more than ``spread`` among the starts within ``near`` of the best.

    A multi-start fit (:func:`fit_multistart`'s ``all_params``, ``all_values``) whose near-best starts
    disagree is one of several near-equal optima: a machine's rounding can pick another. With
    ``converged`` (``all_converged``) only starts that ended at a stationary point count: one that
    stopped on the way is not an optimum.
    """
    values = np.asarray(all_values, np.float64)
    ok = np.isfinite(values) & (True if converged is None else np.asarray(converged, bool))
    if not ok.any():
        return ()
    best = values[ok].min()
    close = ok & (values <= best + near * abs(best))
    theta = np.asarray(all_theta, np.float64)[close]
    # A log-coefficient at -700 or -inf is "negligible" either way: compare within [-50, 50].
    theta = np.clip(np.nan_to_num(theta, nan=0.0, posinf=50.0, neginf=-50.0), -50.0, 50.0)
    return tuple(n for n, lo, hi in zip(names, theta.min(0), theta.max(0)) if hi - lo > spread)


DEGENERATE_MAGNITUDE = 1e30
"""A coefficient beyond this magnitude (or below its inverse) has run to a bound of the fit."""


def degenerate_coefficients(law: Any) -> tuple[str, ...]:
    """The fields of a fitted ``law`` that sit at a bound of the fit: not finite, zero, or of a
    magnitude above :data:`DEGENERATE_MAGNITUDE` or below its inverse.

    A multi-start fit in log coordinates reaches such values when the data do not pin a term down:
    an irreducible loss driven to 0 (``e = log E -> -inf``), or a term whose coefficient and
    exponent run off together until it switches on for a single model size.
    The law still fits the rows, but its curve between and beyond them is an artefact of where
    the optimiser stopped; decisions are then taken from the posterior
    (:func:`sdsl_jax.predict.point_for_decisions`).
    """
    out = []
    for name, value in law._asdict().items():
        v = np.abs(np.asarray(value, np.float64))
        if not (np.all(np.isfinite(v)) and np.all(v > 0) and np.all(v < DEGENERATE_MAGNITUDE)
                and np.all(v > 1 / DEGENERATE_MAGNITUDE)):
            out.append(name)
    return tuple(out)


def coordinates_beyond_posterior(family: LossLawFamily, theta: ArrayLike, laws: Any, *,
                                 mass: float = 0.99) -> tuple[str, ...]:
    """The fitting coordinates (``family.theta_names``) in which a point fit ``theta`` lies outside
    the posterior's central ``mass`` interval of the draws ``laws`` by more than that interval's width.

    The point fit minimises the robust objective alone; the posterior adds the priors (and run
    effects). Where the data pin a coordinate down the two agree to within the posterior's spread.
    Where they do not, the multi-start fit runs along the unidentified direction and stops at an
    artefact of the optimiser without reaching a bound of :func:`degenerate_coefficients`: an N term
    whose coefficient and exponent grow together until it switches on for one model size (``A`` in
    the 1e18s with ``alpha`` 4.5, a break of width ``f`` 1e-10), or ``E`` at 1e-15 (``e`` 35 prior
    standard deviations from its prior's centre). The prior closes that direction, so the posterior
    lies far from the point, and decisions are taken from the posterior
    (:func:`sdsl_jax.predict.point_for_decisions`). A margin of one interval width keeps a point that
    differs from the posterior only by the two objectives' different weighting of the rows.
    """
    theta = np.asarray(theta, np.float64)
    draws = np.asarray(family.to_theta(laws), np.float64).reshape(theta.shape[0], -1)
    tail = (1.0 - mass) / 2.0
    lo, hi = np.nanquantile(draws, [tail, 1.0 - tail], axis=1)
    width = hi - lo
    beyond = ~np.isfinite(theta) | (theta < lo - width) | (theta > hi + width)
    return tuple(name for name, off in zip(family.theta_names, beyond) if off)
