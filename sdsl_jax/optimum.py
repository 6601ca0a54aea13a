"""The optimal draft size N*(M): gradient-based solve, implicit derivatives, the linear law.

Composite objective: ``T(N, M, D, D')`` of :mod:`sdsl_jax.objective`, composed from a loss law,
an acceptance model, a cost model and a draft recipe (any of each) [SDSL 2026, arXiv 2603.11053;
docs/theory.md, section 4]. ``N* = argmax_N T`` is solved in ``u = log N`` as the root of the stationarity condition
``g(u) = d log T / du = 0``:

1. a log-spaced grid over ``[n_min, M]`` (vectorised) locates the bracket of the maximum and
   detects the failure modes it can see (no admissible draft, acceptance reaching 1); where no
   grid point shows a speed-up, or the grid shows more than one maximum, shifted copies of the
   grid refine it up to eight-fold (a speed-up region can lie between grid points, a flat maximum
   where gamma* = 0 gives no direction, and a recipe tying D to N can give T two peaks). Whether
   drafting pays, and whether the maximum sits at the lower bound, are decided at the maximum
   found;
2. safeguarded Newton on ``g`` inside the bracket, from the vertex of the parabola through the
   grid maximum and its two neighbours (``g'`` by autodiff; a bisection step whenever the Newton
   step leaves the bracket or lands where the model is inadmissible), until the step is below
   ``tol`` in ``log N``;
3. derivatives of N* with respect to every float input (M, D, D', each field of the loss law and
   the plane) by the implicit function theorem (a ``jax.custom_jvp`` on the located root):
   ``du*/dtheta = -(dg/dtheta) / (dg/du)``. The iterations are never differentiated.

Everything is vectorised over broadcast shapes of ``m_target``, ``d_target`` and every field of the
law, the acceptance model, the cost and the recipe (so posterior draws can be passed directly).

Precision follows the inputs' dtype. N* is weakly identified (T is flat: T(N*/2)/T* ~ 0.98),
so float32 locates it only to about 1e-3 relative; enable x64 for 1e-6 and beyond.
"""

from __future__ import annotations

import enum
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float
from sdsl_jax.acceptance import SDSL2026
from sdsl_jax.costs import SDSL_FLOPS, best_lookahead, target_alone_cost
from sdsl_jax.loss_laws import HOFFMANN2022
from sdsl_jax.objective import draft_acceptance
from sdsl_jax.protocols import AcceptanceRateModel, DraftRecipe, IterationCostModel, LossLawModel
from sdsl_jax.recipes import FixedTokens, as_recipe

__all__ = [
    "SolveStatus",
    "status_message",
    "DraftSizeSolution",
    "DraftSizeGradient",
    "LinearLaw",
    "SDSL2026_LINEAR_LAW",
    "solve_draft_size",
    "draft_size_gradient",
    "optimal_draft_size",
    "fit_linear_law",
]


class SolveStatus(enum.IntEnum):
    """Why a draft-size solve ended (``DraftSizeSolution.status``)."""

    SUCCESS = 0
    NO_ADMISSIBLE_DRAFT = 1  # alpha outside (0, 1) for every N searched
    NO_SPEEDUP = 2  # no draft size gives more tokens per FLOP than the target alone
    AT_LOWER_BOUND = 3  # throughput still rises as N decreases to n_min
    NOT_CONVERGED = 4  # Newton/bisection did not reach tol within max_steps, or ended below a grid point
    ACCEPTANCE_SATURATES = 5  # alpha >= 1 somewhere in [n_min, M]: T has no maximum there
    INVALID_INPUT = 6  # a size, token count or coefficient outside the model (traced inputs only)

    @property
    def message(self) -> str:
        """What the status means, in words (as Optimistix's ``RESULTS`` carry theirs)."""
        return _STATUS_MESSAGES[self]


_STATUS_MESSAGES = {
    SolveStatus.SUCCESS: "solved: N* is a stationary maximum of T inside the search interval",
    SolveStatus.NO_ADMISSIBLE_DRAFT: "no admissible draft: the acceptance model gives alpha outside (0, 1) for "
                                     "every draft size searched",
    SolveStatus.NO_SPEEDUP: "no speed-up: no draft size beats the target decoding alone",
    SolveStatus.AT_LOWER_BOUND: "at the lower bound: throughput still rises as N falls to n_min (lower n_min, or "
                                "the law extrapolates below its data)",
    SolveStatus.NOT_CONVERGED: "not converged: Newton/bisection did not reach tol within max_steps, or ended "
                               "below a point of the grid (two maxima closer than its spacing)",
    SolveStatus.ACCEPTANCE_SATURATES: "acceptance saturates: the acceptance model gives alpha >= 1 inside the search "
                                      "interval, where T grows without bound; the model is extrapolated past its data",
    SolveStatus.INVALID_INPUT: "invalid input: a size or token count <= 0, or a non-finite input (reported as a "
                               "status under jit, where the check cannot raise)",
}


def status_message(code) -> str:
    """The message of a status code (an int, a :class:`SolveStatus` or a 0-d array)."""
    return SolveStatus(int(code)).message


class DraftSizeSolution(NamedTuple):
    """Result of :func:`solve_draft_size`; every field has the broadcast shape of the inputs.

    Attributes:
      n_star: optimal draft size N* (NaN unless ``status == SUCCESS``).
      gamma_star: optimal continuous lookahead at N*.
      alpha: acceptance at N*.
      throughput: tokens per FLOP at N* (T*).
      status: :class:`SolveStatus` codes (int32).
      num_steps: Newton/bisection steps taken.
    """

    n_star: jax.Array
    gamma_star: jax.Array
    alpha: jax.Array
    throughput: jax.Array
    status: jax.Array
    num_steps: jax.Array


class LinearLaw(NamedTuple):
    """``N* ~ mu M + m0`` (SDSL's summary of N*(M))."""

    mu: jax.Array
    m0: jax.Array


SDSL2026_LINEAR_LAW = LinearLaw(mu=2.71e-3, m0=8.71e7)
"""SDSL (2026), arXiv 2603.11053: N* ~ mu M + m0 for targets of about 13B-110B (95% CIs
mu 2.67-2.75e-3, m0 8.50-8.93e7)."""


class _Problem(NamedTuple):
    m: jax.Array
    d_target: jax.Array
    loss: LossLawModel
    plane: AcceptanceRateModel
    cost: IterationCostModel
    recipe: DraftRecipe


class _AtDraftSize(NamedTuple):
    """The model at one draft size: acceptance, optimal lookahead and throughput."""

    alpha: jax.Array
    gamma: jax.Array
    throughput: jax.Array


def _at_draft_size(u: jax.Array, p: _Problem) -> _AtDraftSize:
    n = jnp.exp(u)
    alpha = draft_acceptance(n, p.m, d_target=p.d_target, recipe=p.recipe, loss=p.loss, plane=p.plane)
    best = best_lookahead(p.cost, alpha, n, p.m)
    return _AtDraftSize(alpha, best.gamma, best.throughput)


def _log_throughput_and_model(u: jax.Array, p: _Problem) -> tuple[jax.Array, _AtDraftSize]:
    # One evaluation of the model gives log T and the rest of it: the solver's program is compiled
    # once per model, and every copy of the chain (its Lambert W included) it holds costs compile time.
    at = _at_draft_size(u, p)
    return jnp.log(at.throughput), at


def _log_throughput(u: jax.Array, p: _Problem) -> jax.Array:
    return _log_throughput_and_model(u, p)[0]


def _van_der_corput(r: int) -> float:
    """The r-th term of the base-2 van der Corput sequence (0, 1/2, 1/4, 3/4, 1/8, ...)."""
    fraction, scale = 0.0, 0.5
    while r:
        fraction, r, scale = fraction + scale * (r & 1), r >> 1, scale / 2
    return fraction


# Grid shifts: the grid and 7 refinements (a grid 8 times finer), run only where the grid shows no
# speed-up or more than one maximum.
_SHIFTS = tuple(_van_der_corput(r) for r in range(8))
# After s sets (s >= 1), the points include a whole grid 2^floor(log2 s) times finer.
_FINER = (1,) + tuple(2 ** (s.bit_length() - 1) for s in range(1, len(_SHIFTS) + 1))
_FLAT = 1e-12  # changes in log T below this between grid points are rounding, not a rise or a fall
_TAYLOR_CHANGE = 1e-6  # relative change of an output up to which the model at N* comes from its Taylor series
# (its error, of the order of the change squared, is then below 1e-12 of the output where the model is
# smooth at that scale; with acceptance within 1e-8 of 1, rounding alone moves gamma* and T more
# between neighbouring draft sizes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5))
def _located_optimum(p: _Problem, log_n_min: jax.Array, log_n_max: jax.Array, num_grid: int, max_steps: int,
                     tol: float):
    """Scalar solve on ``[log_n_min, log_n_max]``; returns (u*, status, steps, the model at u*), u*
    differentiable by the implicit function theorem."""
    spacing = (log_n_max - log_n_min) / (num_grid - 1)
    leaves = jax.tree.leaves(p)
    invalid = ~(jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
                & (p.m > 0) & (p.d_target > 0)
                & jnp.all(jnp.stack([jnp.all(x > 0) for x in jax.tree.leaves(p.recipe)] or [jnp.asarray(True)])))
    log_target_cost = jnp.log(target_alone_cost(p.cost, p.m))
    index = jnp.arange(num_grid, dtype=spacing.dtype)
    offsets = jnp.asarray(_SHIFTS, spacing.dtype)

    def refining(state):
        sets, _, best_gain, _, _, saturates, any_admissible, several_maxima = state
        # Refine only where the grid shows no speed-up (a speed-up region narrower than the
        # spacing can lie between the points) or more than one maximum (a draft recipe that ties
        # D to N can make the loss, and so T, rise again in N: the grid's best point may sit on
        # the lower peak). A vmapped loop runs while any lane refines, so a batch in which every
        # lane shows one maximum with a gain evaluates the grid once.
        undecided = ~(invalid | saturates | ~any_admissible)
        return (sets == 0) | ((sets < len(_SHIFTS)) & undecided & ((best_gain <= 0) | several_maxima))

    def grid_set(state):
        # Set 0 is the grid; set r >= 1 is it shifted by the r-th van der Corput fraction of the
        # spacing (1/2, 1/4, 3/4, 1/8, ...), so every 2^k sets form a grid 2^k times finer. One
        # loop body: the model (its Lambert W included) is compiled once for all sets.
        sets, best_u, best_gain, first_k, neighbours, saturates, any_admissible, several_maxima = state
        points = jnp.minimum(log_n_min + (index + offsets[sets]) * spacing, log_n_max)
        points = jnp.where((sets == 0) & (index == num_grid - 1.0), log_n_max, points)
        f, at = jax.vmap(_log_throughput_and_model, (0, None))(points, p)
        alpha = at.alpha
        admissible = jnp.isfinite(f)
        gain = jnp.where(admissible, f + log_target_cost, -jnp.inf)  # log(T / T_target)
        k = jnp.argmax(gain).astype(jnp.int32)
        # Falls then rises again (an inadmissible gap counts as a fall): more than one maximum.
        # The margin keeps rounding on a flat stretch (gamma* = 0, T the target's alone) out.
        step = jnp.diff(gain)
        fell = jnp.cumsum(step < -_FLAT) > 0
        rises_again = jnp.any((step[1:] > _FLAT) & fell[:-1])
        better = gain[k] > best_gain
        first = sets == 0
        neighbours = jnp.where(first, jnp.stack([gain[jnp.maximum(k - 1, 0)], gain[jnp.minimum(k + 1, num_grid - 1)]]),
                               neighbours)
        # T -> infinity as alpha -> 1, so a model reaching alpha >= 1 anywhere on [n_min, M] has
        # no maximum there. At a fixed D every shipped law and acceptance model is monotone in N,
        # so the grid (which includes both ends) sees it; a recipe tying D to N can break that,
        # and N* itself is checked again by _final_status.
        return (sets + 1, jnp.where(better | first, points[k], best_u), jnp.maximum(gain[k], best_gain),
                jnp.where(first, k, first_k), neighbours, saturates | jnp.any(alpha >= 1),
                any_admissible | jnp.any(admissible), several_maxima | rises_again)

    state = (jnp.asarray(0, jnp.int32), log_n_min, jnp.asarray(-jnp.inf, spacing.dtype), jnp.asarray(0, jnp.int32),
             jnp.full(2, -jnp.inf, spacing.dtype), jnp.asarray(False), jnp.asarray(False), jnp.asarray(False))
    sets, u0, best_gain, k, (f_lo, f_hi), saturates, any_admissible, _ = jax.lax.while_loop(refining, grid_set, state)
    no_admissible = ~any_admissible
    # Whether drafting pays is decided at the maximum found, not on the grid: where the speed-up
    # region is narrower than the grid's spacing, every grid point can lie outside it.
    decided = invalid | saturates | no_admissible

    def value_and_stationarity(u):
        # Forward mode for the scalar u: no transposed (reverse) program to compile. The model's
        # outputs ride along (their tangents are never used, so they are never computed).
        (log_t, at), (gu, _) = jax.jvp(lambda v: _log_throughput_and_model(v, p), (u,), (jnp.ones_like(u),))
        return (log_t, gu), at

    def cond(state):
        return ~state[-1]

    def body(state):
        u, lo, hi, done, step, _, _ = state
        # log T, g = d log T / du and g' in one pass, the model at u and its derivative in u.
        ((log_t, gu), at), ((_, dgu), at_slope) = jax.jvp(value_and_stationarity, (u,), (jnp.ones_like(u),))
        # Lanes decided before the loop return u and the model there; so do lanes out of steps,
        # unless this step converges.
        out_of_steps = step >= max_steps
        # At inadmissible points T is NaN but g is 0 (the NaN sits behind a where): test T.
        # Such a point lies on the far side of the admissible region from the grid maximum. So
        # does a flat point (gamma* = 0, T the target's alone, g = g' = 0) where the grid showed
        # a gain; where it showed none, a flat point is the answer: drafting does not pay.
        finite = jnp.isfinite(log_t) & jnp.isfinite(gu)
        flat = finite & (gu == 0) & (dgu == 0)
        # Where the start (the vertex of the grid's parabola) is lower than the grid maximum, the
        # grid maximum's side of it holds a maximum at least as high, whether T has one maximum or
        # two within the grid's spacing (a sharp break in the loss law), where the slope at the
        # vertex points to the lower one: the bracket ends at the vertex, whatever its slope.
        below_start = (step == 0) & ~done & interior & ~(log_t + log_target_cost >= best_gain - _FLAT)
        go_right = jnp.where(finite & ~flat & ~below_start, gu > 0, u < u0)
        lo, hi = jnp.where(go_right, u, lo), jnp.where(go_right, hi, u)
        newton = u - gu / dgu
        # Inclusive bounds: at convergence u is itself a bracket end and the step rounds to 0.
        use_newton = finite & (dgu < 0) & (newton >= lo) & (newton <= hi)
        stop_flat = flat & (best_gain <= 0) & ~below_start
        u_next = jnp.where(stop_flat, u, jnp.where(use_newton, newton, 0.5 * (lo + hi)))
        scale = 1.0 + jnp.abs(u)
        newton_converged = use_newton & (jnp.abs(u_next - u) <= tol * scale)
        converged = ~done & (newton_converged | (hi - lo <= tol * scale) | stop_flat)
        # A lane whose Newton step converged returns u_next, within tol of u, with the model there
        # from its Taylor series at u where that moves each output by at most _TAYLOR_CHANGE of
        # itself: evaluating the model at u_next would cost every lane one more pass of this body,
        # a vmapped loop running as many passes as its slowest lane. Acceptance and gamma* to first
        # order (the error is of the order of the change squared); T to second order in log T,
        # whose first-order term vanishes at the maximum and whose curvature g' is at hand. A flat
        # stop returns u itself. Any other converged lane (a larger change, a derivative that is
        # not finite, a bracket closed by bisection next to an inadmissible region) is done and
        # evaluates u_next on the next pass.
        step_size = u_next - u
        log_change = step_size * (gu + 0.5 * dgu * step_size)
        at_next = _AtDraftSize(at.alpha + step_size * at_slope.alpha, at.gamma + step_size * at_slope.gamma,
                               at.throughput * jnp.exp(log_change))
        small = ((jnp.abs(step_size * at_slope.alpha) <= _TAYLOR_CHANGE * jnp.abs(at.alpha))
                 & (jnp.abs(step_size * at_slope.gamma) <= _TAYLOR_CHANGE * jnp.abs(at.gamma))
                 & (jnp.abs(log_change) <= _TAYLOR_CHANGE))
        extrapolates = ~done & newton_converged & finite & small
        at = jax.tree.map(lambda x, y: jnp.where(extrapolates, y, x), at, at_next)
        stays = done | (out_of_steps & ~converged)
        return (jnp.where(stays, u, u_next), lo, hi, done | converged, jnp.where(done | out_of_steps, step, step + 1),
                at, stays | extrapolates | (~done & stop_flat))

    # The sets evaluated so far include a whole grid of spacing h: the maximum lies within h of
    # the best point. Newton starts at the vertex of the parabola through the grid maximum and its
    # neighbours (where no refinement ran and all three are admissible): on a coarse grid that saves
    # a step for the slowest lanes, and a vmapped loop runs as many steps as its slowest lane.
    h = spacing / jnp.asarray(_FINER, spacing.dtype)[sets]
    lo, hi = jnp.maximum(u0 - h, log_n_min), jnp.minimum(u0 + h, log_n_max)
    f_k = best_gain
    curvature = f_lo - 2.0 * f_k + f_hi
    interior = ((sets == 1) & (k > 0) & (k < num_grid - 1) & jnp.isfinite(f_lo) & jnp.isfinite(f_hi)
                & (curvature < 0))
    vertex = u0 + 0.5 * spacing * (f_lo - f_hi) / jnp.where(interior, curvature, -1.0)
    start = jnp.where(interior, jnp.clip(vertex, lo, hi), u0)
    nan = jnp.full_like(start, jnp.nan)
    # Lanes already decided do not step: a vmapped loop runs as many steps as its slowest lane.
    u, _, _, done, steps, at, _ = jax.lax.while_loop(
        cond, body, (start, lo, hi, decided, jnp.asarray(0, jnp.int32), _AtDraftSize(nan, nan, nan), jnp.asarray(False)))
    at_lower = (u0 == log_n_min) & (u - log_n_min <= 1e-3 * h)
    # An answer below a point the grid evaluated is not the maximum, whatever the loop converged to.
    below_grid = jnp.log(at.throughput) + log_target_cost < best_gain - _FLAT
    # The checks at u itself (alpha < 1 there, T finite there, a speed-up there) are made by
    # _solve_flat (_final_status), on the model at u that the loop's last iteration gave.
    status = jnp.select(
        [invalid, saturates, no_admissible, at_lower, ~done | below_grid],
        [SolveStatus.INVALID_INPUT, SolveStatus.ACCEPTANCE_SATURATES, SolveStatus.NO_ADMISSIBLE_DRAFT,
         SolveStatus.AT_LOWER_BOUND, SolveStatus.NOT_CONVERGED],
        SolveStatus.SUCCESS,
    ).astype(jnp.int32)
    return u, status, steps, at


def _split_at_break(p: _Problem, log_n_min: jax.Array, log_n_max: jax.Array) -> jax.Array:
    """``log N`` of the draft the recipe trains on the law's break in D (``log_tokens_at_break``),
    NaN where the law has none or the recipe's D never reaches it inside the interval (a fixed D).

    Between the interval's ends ``log D`` is interpolated linearly in ``log N``: exact for D fixed,
    D = rho N and D = C / (6 N); for another recipe a point near the break, which serves as well.
    """
    log_d_break = p.loss.log_tokens_at_break()
    log_d_lo, log_d_hi = (jnp.log(p.recipe.draft_tokens(jnp.exp(u))) for u in (log_n_min, log_n_max))
    fraction = (log_d_break - log_d_lo) / (log_d_hi - log_d_lo)
    # Not within a thousandth of the interval of an end: a sliver has nothing to search.
    inside = jnp.isfinite(fraction) & (fraction > 1e-3) & (fraction < 1.0 - 1e-3)
    return jnp.where(inside, log_n_min + fraction * (log_n_max - log_n_min), jnp.nan)


def _searched_optimum(p: _Problem, log_n_min: jax.Array, num_grid: int, max_steps: int, tol: float):
    """:func:`_located_optimum` on ``[n_min, M]``; for a law with a break in D under a recipe that
    ties D to N, also on each side of the draft size trained on the break, keeping the highest T.

    The break can put a valley in T with a peak on each side (a steeper data term after the break
    under tokens per parameter), and the higher peak can lie between two points of the grid, which
    then shows one maximum, on the lower peak (measured on the one-break law's posterior draws:
    ``docs/benchmarks.md``, ``bench --only draws``). An answer of a side within ``1e-6`` of the split
    is that side's end, not a maximum.
    """
    log_m = jnp.log(p.m)
    if not hasattr(p.loss, "log_tokens_at_break") or isinstance(p.recipe, FixedTokens):
        return _located_optimum(p, log_n_min, log_m, num_grid, max_steps, tol)
    split = _split_at_break(p, log_n_min, log_m)
    has_split = jnp.isfinite(split)
    mid = jnp.where(has_split, split, log_m)
    lows = jnp.stack([log_n_min, log_n_min, jnp.where(has_split, split, log_n_min)])
    highs = jnp.stack([log_m, mid, log_m])
    u, status, steps, at = jax.vmap(_located_optimum, (None, 0, 0, None, None, None))(
        p, lows, highs, num_grid, max_steps, tol)
    edge = 1e-6 * (1.0 + jnp.abs(mid))
    inside_side = jnp.stack([jnp.asarray(True), u[1] < mid - edge, u[2] > mid + edge])
    # The whole interval's answer stands where T still rises towards n_min, as where it is a maximum.
    ended = (status == SolveStatus.SUCCESS) | ((status == SolveStatus.AT_LOWER_BOUND) & (jnp.arange(3) == 0))
    ok = ended & inside_side & jnp.isfinite(at.throughput) & (at.alpha < 1)
    # Invalid input and acceptance reaching 1 are the whole interval's to say.
    whole_failed = (status[0] == SolveStatus.INVALID_INPUT) | (status[0] == SolveStatus.ACCEPTANCE_SATURATES)
    best = jnp.argmax(jnp.where(ok, jnp.log(at.throughput), -jnp.inf))
    pick = jnp.where(whole_failed | ~jnp.any(ok) | ~has_split, 0, best)
    return jax.tree.map(lambda x: x[pick], (u, status, steps, at))


def _final_status(status: jax.Array, alpha: jax.Array, gamma: jax.Array, throughput: jax.Array,
                  target_throughput: jax.Array) -> jax.Array:
    """The search's status completed by the checks at the point found, in the same precedence.

    Alpha >= 1 there means saturation (second only to invalid input); a stationary point must
    have a finite T, anything else did not converge; where the maximum found (or the lower bound,
    where T still rises towards it) drafting does not pay (gamma* = 0, exact) or is no faster than
    the target alone, no draft size pays.
    """
    early = (status == SolveStatus.INVALID_INPUT) | (status == SolveStatus.ACCEPTANCE_SATURATES)
    status = jnp.where(~early & (alpha >= 1), SolveStatus.ACCEPTANCE_SATURATES, status)
    found = status == SolveStatus.SUCCESS
    status = jnp.where(found & ~jnp.isfinite(throughput), SolveStatus.NOT_CONVERGED, status)
    at_maximum = (status == SolveStatus.SUCCESS) | (status == SolveStatus.AT_LOWER_BOUND)
    no_gain = (gamma <= 0) | (throughput <= target_throughput)
    return jnp.where(at_maximum & no_gain, SolveStatus.NO_SPEEDUP, status).astype(jnp.int32)


@_located_optimum.defjvp
def _located_optimum_jvp(num_grid, max_steps, tol, primals, tangents):
    """Implicit function theorem at the root of ``g(u, p) = d log T / du``:
    ``du* = -(dg/dp . dp) / (dg/du)``. The iterations are never differentiated, and this rule is
    traced only when N* is differentiated (``jax.lax.custom_root`` traces its derivative on every
    call, differentiated or not)."""
    p, log_n_min, log_n_max = primals
    dp, _, _ = tangents  # N* does not move with the interval's ends where it is an interior maximum
    u, status, steps, at = _located_optimum(p, log_n_min, log_n_max, num_grid, max_steps, tol)
    g_p_dp = jax.jvp(lambda q: _stationarity(u, q), (p,), (dp,))[1]
    du = -g_p_dp / _stationarity_slope(u, p)
    # The model at u* moves with p directly and through u*.
    d_at = jax.jvp(_at_draft_size, (u, p), (du, dp))[1]
    zeros = [np.zeros(np.shape(x), jax.dtypes.float0) for x in (status, steps)]
    return (u, status, steps, at), (du, *zeros, d_at)


def _stationarity(u: jax.Array, p: _Problem) -> jax.Array:
    """``g(u, p) = d log T / du``, zero at N* = exp(u)."""
    return jax.grad(_log_throughput)(u, p)


def _stationarity_slope(u: jax.Array, p: _Problem) -> jax.Array:
    """``dg/du``, negative at a maximum."""
    return jax.jvp(lambda v: _stationarity(v, p), (u,), (jnp.ones_like(u),))[1]


def _implicit_gradient(u: jax.Array, p: _Problem) -> _Problem:
    """``du*/dp = -(dg/dp) / (dg/du)`` at a root u* of g, one scalar problem."""
    g_p = jax.grad(_stationarity, argnums=1)(u, p)
    slope = _stationarity_slope(u, p)
    return jax.tree.map(lambda x: -x / slope, g_p)


def solve_draft_size(
    m_target: ArrayLike,
    *,
    d_target: ArrayLike,
    d_draft: ArrayLike | None = None,
    recipe: DraftRecipe | None = None,
    loss: LossLawModel = HOFFMANN2022,
    plane: AcceptanceRateModel = SDSL2026,
    cost: IterationCostModel = SDSL_FLOPS,
    n_min: float = 1.0,
    num_grid: int = 12,
    max_steps: int = 60,
    tol: float | None = None,
) -> DraftSizeSolution:
    """Solve ``N* = argmax_N T(N, M, D, D')`` and report how each solve ended.

    Args:
      m_target: target size(s) M, any shape.
      d_target: target training tokens D'.
      d_draft: draft training tokens D, one budget for every N (the paper's setting); or give
        ``recipe`` instead.
      recipe: how D follows N (:mod:`sdsl_jax.recipes`: ``TokensPerParameter(20.0)``,
        ``FixedCompute(1e18)``, ...).
      loss: loss-law coefficients, any family (fields may be arrays, e.g. posterior draws).
      plane: acceptance-model coefficients (``AcceptancePlane``, ``LogPerplexityPlane``, ...).
      cost: cost model of an iteration (:mod:`sdsl_jax.costs`; default SDSL FLOPs).
      n_min: smallest draft size searched; the largest is M.
      num_grid: points of the log-spaced bracketing grid (refined up to eight-fold where it shows
        no speed-up or more than one maximum). The region where drafting pays, if any, must
        contain a point of the refined grid, and where T has several maxima the highest is found
        only if the refined grid ranks them right (a peak narrower than its spacing can be missed).
        A law with a break in D (``log_tokens_at_break``) under a recipe that ties D to N is also
        searched on each side of the draft trained on the break, at three to four times the cost.
      max_steps: cap on Newton/bisection steps.
      tol: stop when a Newton step in ``log N`` is below ``tol * (1 + |log N|)``; the error
        after that step is of order its square (default: the square root of the dtype's eps).

    Returns:
      A :class:`DraftSizeSolution`. ``n_star`` is NaN wherever ``status != SUCCESS``
      (``status_message(code)`` says why). ``n_star`` is differentiable (forward and reverse
      mode) with respect to every float input by the implicit function theorem.

    Raises:
      ValueError: naming the argument, for concrete inputs outside the model (non-positive or
        non-finite sizes and token counts, non-finite coefficients, a bad ``n_min``/``num_grid``).
    """
    problem = _checked_problem(m_target, d_target, d_draft, recipe, loss, plane, cost)
    n_min = _python_scalar("n_min", n_min, float)
    if not (n_min > 0 and math.isfinite(n_min)):
        raise ValueError(f"n_min must be a positive finite number, got {n_min!r}")
    num_grid = _python_scalar("num_grid", num_grid, int)
    if num_grid < 3:
        raise ValueError(f"num_grid must be at least 3, got {num_grid!r}")
    max_steps = _python_scalar("max_steps", max_steps, int)
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps!r}")
    if tol is not None:
        tol = _python_scalar("tol", tol, float)
        if not (0 < tol < 1):
            raise ValueError(f"tol must be in (0, 1) (a relative step in log N), got {tol!r}")

    leaves, treedef = jax.tree.flatten(problem)
    leaves = as_float(*leaves, host=True)
    dtype = leaves[0].dtype
    if tol is None:
        tol = float(np.finfo(dtype).eps) ** 0.5
    return _solve_broadcast(jax.tree.unflatten(treedef, leaves), np.asarray(n_min, dtype), num_grid=num_grid,
                            max_steps=max_steps, tol=tol)


# Compiled once per shapes, options and model types: tracing and compiling the vmapped while_loop
# costs more than solving thousands of targets. Broadcasting and flattening happen inside, so a
# first call compiles one program, not one per eager reshape.
@functools.partial(jax.jit, static_argnames=("num_grid", "max_steps", "tol"))
def _solve_broadcast(problem: _Problem, n_min, *, num_grid: int, max_steps: int, tol: float) -> DraftSizeSolution:
    return _over_broadcast_leaves(
        lambda problems: _solve_flat(problems, jnp.log(n_min), num_grid=num_grid, max_steps=max_steps, tol=tol),
        problem)


def _over_broadcast_leaves(solve_flat, tree):
    """``solve_flat`` on every leaf of ``tree`` broadcast together and flattened to one axis; its
    outputs reshaped back to the broadcast shape."""
    leaves, treedef = jax.tree.flatten(tree)
    leaves = jnp.broadcast_arrays(*leaves)
    shape = leaves[0].shape
    out = solve_flat(jax.tree.unflatten(treedef, [x.reshape(-1) for x in leaves]))
    return jax.tree.map(lambda x: x.reshape(shape), out)


def _solve_flat(problems: _Problem, log_n_min, *, num_grid: int, max_steps: int, tol: float) -> DraftSizeSolution:
    # The search returns the model at the point found, for the last checks and for the outputs.
    u, status, steps, found = jax.vmap(_searched_optimum, (0, None, None, None, None))(
        problems, log_n_min, num_grid, max_steps, tol
    )
    n_found = jnp.exp(u)
    status = _final_status(status, found.alpha, found.gamma, found.throughput,
                           1.0 / target_alone_cost(problems.cost, problems.m))
    ok = status == SolveStatus.SUCCESS
    # NaN value AND NaN derivatives where the solve failed: a zero gradient would read as "optimal".
    # Both where() and the NaN behind the model's own admissibility test drop cotangents, so the
    # failed branch is tied to every input directly: `poison` is 0 with derivative 1 in each.
    poison = sum(x - jax.lax.stop_gradient(x) for x in jax.tree.leaves(problems)) + u - jax.lax.stop_gradient(u)
    failed = jnp.nan * (1.0 + jnp.where(ok, 0.0, poison))

    def where_solved(x):
        return jnp.where(ok, x, failed)

    return DraftSizeSolution(
        n_star=where_solved(n_found),
        gamma_star=where_solved(found.gamma),
        alpha=where_solved(found.alpha),
        throughput=where_solved(found.throughput),
        status=status,
        num_steps=steps,
    )


class DraftSizeGradient(NamedTuple):
    """``d log N* / d theta`` for every float input theta, each with the broadcast shape of the inputs.

    Attributes:
      m_target, d_target: with respect to M and D'.
      loss, plane, cost, recipe: pytrees of the same types as the inputs, holding the derivative
        with respect to each field (``plane.A`` is ``d log N* / dA``).
    """

    m_target: jax.Array
    d_target: jax.Array
    loss: LossLawModel
    plane: AcceptanceRateModel
    cost: IterationCostModel
    recipe: DraftRecipe


def draft_size_gradient(
    n_star: ArrayLike,
    m_target: ArrayLike,
    *,
    d_target: ArrayLike,
    d_draft: ArrayLike | None = None,
    recipe: DraftRecipe | None = None,
    loss: LossLawModel = HOFFMANN2022,
    plane: AcceptanceRateModel = SDSL2026,
    cost: IterationCostModel = SDSL_FLOPS,
) -> DraftSizeGradient:
    """Gradient of ``log N*`` with respect to every input at a solved ``N*``, without solving again.

    At N* the stationarity condition ``g(u, theta) = d log T / du = 0`` holds (``u = log N*``), so by
    the implicit function theorem ``du*/dtheta = -(dg/dtheta) / (dg/du)`` [docs/theory.md, section 4].
    This is the derivative ``jax.grad`` through :func:`solve_draft_size` gives, from the model's
    second derivatives at N* alone: a far smaller program to trace and compile than the solver's.

    Args:
      n_star: N* from :func:`solve_draft_size` with the same other arguments (NaN entries give NaN).
      m_target, d_target, d_draft, recipe, loss, plane, cost: as in :func:`solve_draft_size`.

    Returns:
      A :class:`DraftSizeGradient`; multiply by theta for the elasticity ``d log N* / d log theta``.
    """
    n_star = _as_leaf(n_star)
    concrete = _concrete(n_star)
    if concrete is not None:
        bad = ~(np.isnan(concrete) | ((concrete > 0) & np.isfinite(concrete)))
        if bad.any():
            raise ValueError(f"n_star must be > 0 (or NaN where the solve failed); got {concrete[bad].ravel()[0]!r} "
                             f"at index {tuple(int(i) for i in np.argwhere(bad)[0])}")
    problem = _checked_problem(m_target, d_target, d_draft, recipe, loss, plane, cost)
    leaves, treedef = jax.tree.flatten(problem)
    leaves = as_float(n_star, *leaves, host=True)
    return _gradient_broadcast(leaves[0], jax.tree.unflatten(treedef, leaves[1:]))


@jax.jit
def _gradient_broadcast(n_star: jax.Array, problem: _Problem) -> DraftSizeGradient:
    gradient = _over_broadcast_leaves(lambda flat: jax.vmap(_implicit_gradient)(jnp.log(flat[0]), flat[1]),
                                      (n_star, problem))
    return DraftSizeGradient(*gradient)


def optimal_draft_size(
    m_target: ArrayLike,
    *,
    d_target: ArrayLike,
    d_draft: ArrayLike | None = None,
    recipe: DraftRecipe | None = None,
    loss: LossLawModel = HOFFMANN2022,
    plane: AcceptanceRateModel = SDSL2026,
    cost: IterationCostModel = SDSL_FLOPS,
    **solver_options,
) -> jax.Array:
    """N*: the draft size maximising throughput for each target size M.

    ``N*(M) = argmax_N T(N, M, D, D')`` with ``T`` from :func:`sdsl_jax.draft_throughput`; see
    :func:`solve_draft_size` for the arguments, the method and the reasons behind a NaN.

    Returns:
      N* with the broadcast shape of the inputs; NaN where no admissible optimum exists.
    """
    return solve_draft_size(
        m_target, d_draft=d_draft, d_target=d_target, recipe=recipe, loss=loss, plane=plane, cost=cost,
        **solver_options,
    ).n_star


def fit_linear_law(m_target: ArrayLike, n_star: ArrayLike) -> LinearLaw:
    """Least-squares fit of ``N* = mu M + m0`` over the finite pairs.

    Args:
      m_target: target sizes M, 1-D.
      n_star: optimal draft sizes N*, same shape; NaN entries are ignored.

    Returns:
      :class:`LinearLaw` with ``mu`` (slope) and ``m0`` (intercept, parameters).

    Raises:
      ValueError: shapes differ, or fewer than two distinct finite pairs remain.

    References:
      SDSL (2026), arXiv 2603.11053: mu = 2.71e-3, m0 = 8.71e7 for M of about 13B-110B.
    """
    m, n = as_float(m_target, n_star)
    if m.ndim != 1 or m.shape != n.shape:
        raise ValueError(f"m_target and n_star must be 1-D of equal length, got shapes {m.shape} and {n.shape}")
    dtype = m.dtype
    w = (jnp.isfinite(m) & jnp.isfinite(n)).astype(dtype)
    if not isinstance(w, jax.core.Tracer):
        if int(np.unique(np.asarray(m)[np.asarray(w) > 0]).size) < 2:
            raise ValueError("fit_linear_law needs at least two distinct target sizes with a finite n_star")
    m, n = jnp.where(w > 0, m, 0.0), jnp.where(w > 0, n, 0.0)
    # Centre (and scale) before solving: M ~ 1e11 and N* ~ 1e8 would square to 1e22.
    m_mean = (w * m).sum() / w.sum()
    n_mean = (w * n).sum() / w.sum()
    dm, dn = w * (m - m_mean), w * (n - n_mean)
    mu = (dm * dn).sum() / (dm * dm).sum()
    return LinearLaw(mu=mu, m0=n_mean - mu * m_mean)


def _checked_problem(m_target, d_target, d_draft, recipe, loss, plane, cost) -> _Problem:
    """The solver's inputs as one pytree; ValueError naming the field for concrete values outside the model."""
    # Lists and tuples are arrays here, not pytrees of separate targets.
    m_target, d_target = _as_leaf(m_target), _as_leaf(d_target)
    d_draft = None if d_draft is None else _as_leaf(d_draft)
    _check_positive("m_target", m_target)
    _check_positive("d_target", d_target)
    if d_draft is not None:
        _check_positive("d_draft", d_draft)
    recipe = as_recipe(d_draft, recipe)
    if d_draft is None:
        _check_tree(recipe, "recipe", _check_positive)
    for name, params in (("loss", loss), ("plane", plane), ("cost", cost)):
        _check_tree(params, name, _check_finite)
    return _Problem(m_target, d_target, loss, plane, cost, recipe)


def _python_scalar(name: str, value, kind: type):
    """A Python int/float from a Python or NumPy scalar (or a 0-d array); ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, jax.core.Tracer) or np.ndim(value) != 0:
        raise ValueError(f"{name} must be a {kind.__name__} scalar, got {value!r}")
    try:
        number = float(np.asarray(value))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a {kind.__name__} scalar, got {value!r}") from None
    if kind is int:
        if not (math.isfinite(number) and number == int(number)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return int(number)
    return number


def _as_leaf(x):
    """One array leaf: JAX arrays and tracers as given, sequences through NumPy."""
    return x if isinstance(x, (jax.Array, jax.core.Tracer)) else np.asarray(x)


def _concrete(x):
    return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def _check_finite(name: str, value) -> None:
    x = _concrete(value)
    if x is None:
        return
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got {value!r}")
    bad = ~np.isfinite(x)
    if bad.any():
        raise ValueError(f"{name} must be finite; got {x[bad].ravel()[0]!r} at index {tuple(int(i) for i in np.argwhere(bad)[0])}")


def _check_tree(tree, name: str, check) -> None:
    """Apply ``check(path_name, leaf)`` to every leaf, named like ``loss.alpha``."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        check(name + "".join(f".{getattr(k, 'name', getattr(k, 'key', getattr(k, 'idx', k)))}" for k in path), leaf)


def _check_positive(name: str, value) -> None:
    _check_finite(name, value)
    x = _concrete(value)
    if x is None:
        return
    bad = ~(x > 0)
    if bad.any():
        raise ValueError(
            f"{name} must be > 0; got {x[bad].ravel()[0]!r} at index {tuple(int(i) for i in np.argwhere(bad)[0])}"
        )
