"""Bayesian fits with NumPyro, diagnostics, and propagation of posteriors to bands on N*.

Models (one ``numpyro.sample`` per random quantity, named as in the papers):

* :func:`loss_law_model_for` ``(family)`` -- ``log L_i ~ StudentT(nu, log L_theta(N_i, D_i), sigma)``
  with the family's priors on theta (:mod:`sdsl_jax.loss_laws`); for the Chinchilla family
  (:data:`loss_law_model`) the likelihood behind Besiroglu et al.'s (2024) fit of Hoffmann et
  al.'s Approach 3.
* :func:`plane_model_for` ``(model)`` -- ``alpha_i ~ TruncatedNormal_[0,1](A u_i + B v_i + C, sigma / sqrt(w_i))``
  for an identity-linked acceptance model's features (u, v) (:data:`plane_model`: SDSL's plane,
  u, v = x, y), ``logit alpha_i ~ Normal(...)`` for a logit-linked one, with per-row weights
  (iterations measured).

Sampling: NUTS with several chains (vectorised on one device, one per device when there are
enough), started from the point fit with per-chain jitter so that R-hat can see disagreement.
Every run is checked (:func:`check_diagnostics`): split R-hat, bulk ESS and divergences.

Propagation: every posterior draw gives a loss law (and a plane); :func:`propagate_draft_size`
solves N*(M) for each with the vectorised, differentiable solver, in chunks of draws so memory
stays bounded, and summarises N*, M/N*, gamma*, T* and the linear law (mu, M0) by quantiles.
Where the plane has no data it stays at the paper's values and :func:`plane_sensitivity` reports
the implicit derivatives of N* with respect to A, B, C instead of inventing an uncertainty.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import numpyro.util
from jax.typing import ArrayLike
from numpyro.infer import MCMC, NUTS

from sdsl_jax.acceptance import PLANE, AcceptanceModel
from sdsl_jax.normal import log_unit_interval_mass, truncated_normal_quantile
from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.loss_laws import CHINCHILLA, LossLawFamily, family_of
from sdsl_jax.optimum import LinearLaw, fit_linear_law, solve_draft_size
from sdsl_jax.recipes import as_recipe

with warnings.catch_warnings():  # ArviZ announces its refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "loss_law_model",
    "loss_law_model_for",
    "plane_model",
    "plane_model_for",
    "model_effects_plane_model_for",
    "PosteriorRun",
    "Diagnostics",
    "sample_loss_law",
    "run_effects_model_for",
    "new_run_offsets",
    "new_run_effect",
    "pointwise_log_likelihood",
    "acceptance_pointwise_log_likelihood",
    "acceptance_likelihood",
    "UnitTruncatedNormal",
    "sample_plane",
    "check_diagnostics",
    "laws_from_posterior",
    "planes_from_posterior",
    "DraftSizeBands",
    "propagate_draft_size",
    "solve_draws",
    "summarize_draws",
    "plane_sensitivity",
    "interval_coverage",
]

LOSS_LAW_SITES = ("a", "b", "e", "alpha", "beta", "sigma", "nu")  # the Chinchilla family's
PLANE_SITES = ("A", "B", "C", "sigma")


def loss_law_sites(family: LossLawFamily, *, run_effects: bool = False) -> tuple[str, ...]:
    """The sites of :func:`loss_law_model_for` ``(family)`` (or of :func:`run_effects_model_for`)
    that diagnostics check."""
    return (*family.theta_names, "sigma", "nu", *(RUN_EFFECT_SITES if run_effects else ()))


@functools.lru_cache(maxsize=None)
def loss_law_model_for(family: LossLawFamily) -> Callable:
    """The NumPyro model of a loss-law family, with a robust (Student-t) likelihood on log loss.

    Student-t rather than Gaussian for the reason the Epoch replication uses a Huber loss: runs
    read off a figure include outliers, and a Gaussian lets a handful of them move E by 3% and B
    by a factor of two (checked on the shipped data).

    Priors: the family's on theta (its ``prior``, documented with the family), and

    * ``sigma ~ HalfNormal(0.1)``: residual scale of log loss; Chinchilla's residuals are ~0.02.
    * ``nu ~ Gamma(2, 0.1)``: degrees of freedom, the prior of Juarez & Steel (2010); mean 20,
      so heavy tails must be supported by the data.

    One model function per family (cached), so that compiled samplers are reused.
    """

    def model(log_n: jax.Array, log_d: jax.Array, log_loss: jax.Array | None = None) -> None:
        theta = family.prior()
        sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
        nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
        mean = family.log_prediction(theta, log_n, log_d)
        with numpyro.plate("runs", log_n.shape[0]):
            numpyro.sample("log_loss", dist.StudentT(nu, mean, sigma), obs=log_loss)

    model.__name__ = model.__qualname__ = f"loss_law_model[{family.name}]"
    return model


loss_law_model = loss_law_model_for(CHINCHILLA)
"""The Chinchilla family's model (the paper's law); see :func:`loss_law_model_for`."""

RUN_EFFECT_SITES = ("run_sd", "run_slope_sd")


@functools.lru_cache(maxsize=None)
def run_effects_model_for(family: LossLawFamily) -> Callable:
    """The loss law with a random intercept and slope in log D per training run (hierarchical).

    Rows of one run are not independent: the budgets of a size are branches of one schedule (or
    checkpoints of one run), so they share the run's offset from the law and its drift along D::

        log L_i = log L_theta(N_i, D_i) + u_r + v_r (log D_i - c) + e_i,        r = run of row i
        u_r ~ Normal(0, run_sd),  v_r ~ Normal(0, run_slope_sd),  e_i ~ StudentT(nu, 0, sigma)

    with ``c`` the mean log D of the data (so ``u_r`` is the run's offset at the data's centre).
    Non-centred (``u_r = run_sd z_r``): the funnel of a centred hierarchy stalls NUTS when a
    scale is near zero. Priors as :func:`loss_law_model_for`, and ``run_sd ~ HalfNormal(0.05)``,
    ``run_slope_sd ~ HalfNormal(0.05)`` (per unit of ln D): run-to-run scatter of a few percent
    of the loss, the size seen between seeds and schedules.

    A run with one row has its intercept confounded with its residual; the split between
    ``run_sd`` and ``sigma`` then comes from the runs with several rows, and predictions for a
    new run use their sum (:func:`new_run_offsets`), which the data do identify.

    Arguments: ``log_n, log_d`` per row, ``run`` (integer run of each row), ``run_slots`` (an array
    whose length is the number of runs: shapes must be static under ``jit``), ``log_loss``.
    """

    def model(log_n, log_d, run, run_slots, log_loss=None) -> None:
        theta = family.prior()
        sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
        nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
        run_sd = numpyro.sample("run_sd", dist.HalfNormal(0.05))
        run_slope_sd = numpyro.sample("run_slope_sd", dist.HalfNormal(0.05))
        with numpyro.plate("run_plate", run_slots.shape[0]):
            z = numpyro.sample("run_z", dist.Normal(0.0, 1.0))
            z_slope = numpyro.sample("run_slope_z", dist.Normal(0.0, 1.0))
        centred_log_d = log_d - jnp.mean(log_d)
        mean = (family.log_prediction(theta, log_n, log_d) + run_sd * z[run]
                + run_slope_sd * z_slope[run] * centred_log_d)
        with numpyro.plate("runs", log_n.shape[0]):
            numpyro.sample("log_loss", dist.StudentT(nu, mean, sigma), obs=log_loss)

    model.__name__ = model.__qualname__ = f"run_effects_model[{family.name}]"
    return model


def new_run_effect(samples: dict[str, np.ndarray], log_d: ArrayLike, *, centre_log_d: float = 0.0,
                   seed: int = 0) -> np.ndarray:
    """Draws of ONE new run's offset ``u + v (log D - c)`` at each ``log_d``, shape ``(draws, *shape(log_d))``.

    All the rows of the new run share its ``u`` and ``v`` (one pair per posterior draw); zeros
    for the model without run effects.
    """
    log_d = np.asarray(log_d, np.float64)
    count = np.size(np.asarray(samples["sigma"]))
    if "run_sd" not in samples:
        return np.zeros((count, *log_d.shape))
    rng = np.random.default_rng(seed)
    expand = (slice(None),) + (None,) * log_d.ndim
    run_sd, slope_sd = (np.asarray(samples[k], np.float64).reshape(-1)[expand] for k in RUN_EFFECT_SITES)
    u = run_sd * rng.standard_normal((count,) + (1,) * log_d.ndim)
    v = slope_sd * rng.standard_normal((count,) + (1,) * log_d.ndim)
    return u + v * (log_d[None] - centre_log_d)


def new_run_offsets(samples: dict[str, np.ndarray], log_d: ArrayLike, *, centre_log_d: float = 0.0,
                    size: tuple[int, ...] = (), seed: int = 0) -> np.ndarray:
    """Draws of a NEW model's log-loss offset from the law: the posterior-predictive residual.

    For the i.i.d. model (:func:`loss_law_model_for`) a Student-t residual ``sigma t_nu``; with run
    effects (:func:`run_effects_model_for`) also a new run's ``u + v (log D - c)``, every entry its
    own new run. One offset per posterior draw (leading axis) and per entry of ``size`` after it;
    ``log_d`` broadcasts against ``(draws, *size)``, ``centre_log_d`` is the data's mean log D (``c``).

    Returns:
      offsets of shape ``(draws, *size)``: add to ``log L_theta(N, D)``.
    """
    rng = np.random.default_rng(seed)
    sigma, nu = (np.asarray(samples[k], np.float64).reshape(-1) for k in ("sigma", "nu"))
    shape = (sigma.size, *size)
    expand = (slice(None),) + (None,) * len(size)
    offset = sigma[expand] * rng.standard_t(nu[expand], shape)
    if "run_sd" in samples:
        run_sd, slope_sd = (np.asarray(samples[k], np.float64).reshape(-1)[expand] for k in RUN_EFFECT_SITES)
        offset = (offset + run_sd * rng.standard_normal(shape)
                  + slope_sd * rng.standard_normal(shape) * (np.asarray(log_d) - centre_log_d))
    return offset


def _plane_mean(acceptance_model: AcceptanceModel, ppl_draft: jax.Array, ppl_target: jax.Array) -> jax.Array:
    """Sample the acceptance model's coefficients (standardised features) and return its linear predictor."""
    u, v = acceptance_model.features(ppl_draft, ppl_target)
    u_mean, u_std = u.mean(), u.std() + 1e-12
    v_mean, v_std = v.mean(), v.std() + 1e-12
    slope_sd, (centre_mean, centre_sd) = acceptance_model.slope_prior_sd, acceptance_model.centre_prior
    slope_x = numpyro.sample("slope_x", dist.Normal(0.0, slope_sd))
    slope_y = numpyro.sample("slope_y", dist.Normal(0.0, slope_sd))
    centre = numpyro.sample("centre", dist.Normal(centre_mean, centre_sd))
    A = numpyro.deterministic("A", slope_x / u_std)
    B = numpyro.deterministic("B", slope_y / v_std)
    numpyro.deterministic("C", centre - A * u_mean - B * v_mean)
    return centre + slope_x * (u - u_mean) / u_std + slope_y * (v - v_mean) / v_std


class UnitTruncatedNormal(dist.Distribution):
    """``Normal(loc, scale)`` truncated to [0, 1], stable however far ``loc`` lies outside.

    ``log p(x) = log N(x; loc, scale) - log(Phi(b) - Phi(a))`` with the normaliser from
    :func:`sdsl_jax.normal.log_unit_interval_mass` (NumPyro's ``TruncatedNormal`` returns +inf
    once ``loc`` is a few dozen scales outside, where ``Phi(b) - Phi(a)`` underflows), and samples
    by :func:`sdsl_jax.normal.truncated_normal_quantile` of a standard normal (reparametrised).
    """

    arg_constraints = {"loc": dist.constraints.real, "scale": dist.constraints.positive}
    support = dist.constraints.unit_interval
    reparametrized_params = ["loc", "scale"]

    def __init__(self, loc, scale, *, validate_args=None):
        self.loc, self.scale = jnp.asarray(loc), jnp.asarray(scale)
        batch_shape = jax.lax.broadcast_shapes(jnp.shape(loc), jnp.shape(scale))
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        z = jax.random.normal(key, sample_shape + self.batch_shape)
        return truncated_normal_quantile(z, self.loc, self.scale)

    def log_prob(self, value):
        inside = (value >= 0) & (value <= 1)
        log_p = dist.Normal(self.loc, self.scale).log_prob(value) - log_unit_interval_mass(self.loc, self.scale)
        return jnp.where(inside, log_p, -jnp.inf)


def acceptance_likelihood(acceptance_model: AcceptanceModel, eta: jax.Array, scale: jax.Array) -> dist.Distribution:
    """The distribution of a pair's measured alpha given the linear predictor ``eta`` and residual ``scale``.

    Identity link: ``Normal(eta, scale)`` truncated to [0, 1] (the plane's residual cannot carry alpha
    out of the probabilities; far from the bounds it is the Normal to rounding). Logit link:
    ``logit alpha ~ Normal(eta, scale)``, a density on alpha (Jacobian included) so that forms of
    either link are compared on one scale. Both match
    :func:`sdsl_jax.acceptance.predictive_acceptance`'s draws.
    """
    if acceptance_model.link == "logit":
        return dist.TransformedDistribution(dist.Normal(eta, scale), dist.transforms.SigmoidTransform())
    return UnitTruncatedNormal(eta, scale)


@functools.lru_cache(maxsize=None)
def plane_model_for(acceptance_model: AcceptanceModel) -> Callable:
    """The NumPyro model of an acceptance model ``eta = A u + B v + C`` with weighted noise.

    The features are standardised inside the model (NUTS mixes far better) and A, B, C are
    recorded as deterministic sites on the original scale. Priors (the family's, on the link's
    scale; for the identity-linked planes): the standardised coefficients ``Normal(0, 0.5)`` (a
    one-standard-deviation change of a feature moves alpha by less than 0.5 at 68%: alpha lives in
    (0, 1)); the intercept at the mean features ``Normal(0.5, 0.5)``; ``sigma ~ HalfNormal(0.2)``
    for a row of average weight. The likelihood is :func:`acceptance_likelihood`.
    """

    def model(ppl_draft: jax.Array, ppl_target: jax.Array, weights: jax.Array, alpha: jax.Array | None = None) -> None:
        mean = _plane_mean(acceptance_model, ppl_draft, ppl_target)
        sigma = numpyro.sample("sigma", dist.HalfNormal(acceptance_model.sigma_prior_sd))
        scale = sigma / jnp.sqrt(weights / weights.mean())
        with numpyro.plate("pairs", ppl_draft.shape[0]):
            numpyro.sample("alpha_obs", acceptance_likelihood(acceptance_model, mean, scale), obs=alpha)

    model.__name__ = model.__qualname__ = f"plane_model[{acceptance_model.name}]"
    return model


MODEL_EFFECT_SITES = ("draft_sd", "target_sd")


@functools.lru_cache(maxsize=None)
def model_effects_plane_model_for(acceptance_model: AcceptanceModel) -> Callable:
    """The acceptance model with a random effect per draft model and per target model (crossed).

    Pairs that share a model are not independent: a draft that agrees with its targets more than
    its perplexity says does so with every target, and likewise for a target::

        eta_ij = A u_ij + B v_ij + C + a_i + b_j,      i = draft model, j = target model
        a_i ~ Normal(0, draft_sd),  b_j ~ Normal(0, target_sd),  alpha_ij ~ likelihood(eta_ij, sigma / sqrt(w_ij))

    Non-centred (``a_i = draft_sd z_i``). Priors as :func:`plane_model_for`, and
    ``draft_sd, target_sd ~ HalfNormal(0.1)`` for the identity link (model-to-model scatter of
    alpha of a few hundredths, the size of the plane's residuals on real pairs; the family's
    ``effect_prior_sd`` on its link's scale). A new pair of new models
    scatters around the plane by ``draft_sd``, ``target_sd`` and ``sigma`` together
    (:class:`sdsl_jax.pipeline.PredictiveScales`); a pair of known models by its models' effects
    and ``sigma`` alone.

    Arguments: ``ppl_draft, ppl_target, weights`` per pair, ``draft`` and ``target`` (integer model
    of each pair), ``draft_slots`` and ``target_slots`` (arrays whose lengths are the numbers of
    models: shapes must be static under ``jit``), ``alpha``.
    """

    def model(ppl_draft, ppl_target, weights, draft, draft_slots, target, target_slots, alpha=None) -> None:
        mean = _plane_mean(acceptance_model, ppl_draft, ppl_target)
        sigma = numpyro.sample("sigma", dist.HalfNormal(acceptance_model.sigma_prior_sd))
        draft_sd = numpyro.sample("draft_sd", dist.HalfNormal(acceptance_model.effect_prior_sd))
        target_sd = numpyro.sample("target_sd", dist.HalfNormal(acceptance_model.effect_prior_sd))
        with numpyro.plate("draft_models", draft_slots.shape[0]):
            z_draft = numpyro.sample("draft_z", dist.Normal(0.0, 1.0))
        with numpyro.plate("target_models", target_slots.shape[0]):
            z_target = numpyro.sample("target_z", dist.Normal(0.0, 1.0))
        mean = mean + draft_sd * z_draft[draft] + target_sd * z_target[target]
        scale = sigma / jnp.sqrt(weights / weights.mean())
        with numpyro.plate("pairs", ppl_draft.shape[0]):
            numpyro.sample("alpha_obs", acceptance_likelihood(acceptance_model, mean, scale), obs=alpha)

    model.__name__ = model.__qualname__ = f"model_effects_plane_model[{acceptance_model.name}]"
    return model


plane_model = plane_model_for(PLANE)
"""The paper's plane on raw perplexities; see :func:`plane_model_for`."""


class Diagnostics(NamedTuple):
    """Convergence checks of a posterior run; ``ok`` is False when any check fails.

    ``mean_steps`` (leapfrog steps per draw) and ``max_tree_depth_share`` (the share of draws whose
    trajectory reached NUTS's maximum tree depth) describe the sampler's geometry: hundreds of steps
    per draw, or many draws at the cap, mean a badly scaled posterior that costs time; more than 1%
    at the cap fails the checks. NaN where not recorded.
    """

    max_rhat: float
    min_ess_bulk: float
    num_divergences: int
    ok: bool
    problems: tuple[str, ...]
    mean_steps: float = float("nan")
    max_tree_depth_share: float = float("nan")


class PosteriorRun(NamedTuple):
    """A finished NUTS run: draws per site (chains flattened), ArviZ data, diagnostics."""

    samples: dict[str, np.ndarray]
    inference_data: az.InferenceData | None
    diagnostics: Diagnostics | None


def check_diagnostics(
    idata: az.InferenceData, divergences: int, *, var_names, max_rhat: float = 1.01, min_ess: float = 400.0,
    num_steps=None, max_tree_depth: int = 10, max_tree_depth_share: float = 0.01,
) -> Diagnostics:
    """Split R-hat (rank-normalised), bulk ESS, divergences and NUTS's tree depth against the usual thresholds.

    Thresholds follow Vehtari et al. (2021), "Rank-normalization, folding, and localization":
    R-hat < 1.01 and bulk ESS > 400 over all chains; any divergence is reported. More than
    ``max_tree_depth_share`` of the draws at the maximum tree depth fails too: trajectories cut
    short explore slowly, and cost the most time a draw can.
    """
    rhat = az.rhat(idata, var_names=list(var_names))
    ess = az.ess(idata, var_names=list(var_names), method="bulk")
    worst_rhat = max(float(np.max(rhat[v].values)) for v in var_names)
    worst_ess = min(float(np.min(ess[v].values)) for v in var_names)
    problems = []
    if not worst_rhat < max_rhat:
        problems.append(f"R-hat {worst_rhat:.3f} >= {max_rhat} (chains disagree)")
    if not worst_ess > min_ess:
        problems.append(f"bulk ESS {worst_ess:.0f} <= {min_ess:.0f} (too few effective draws)")
    if divergences:
        problems.append(f"{divergences} divergent transitions")
    steps = np.asarray(num_steps if num_steps is not None else np.nan, np.float64).ravel()
    at_cap = float(np.mean(steps >= 2**max_tree_depth - 1)) if num_steps is not None else float("nan")
    if at_cap > max_tree_depth_share:
        problems.append(f"{at_cap:.0%} of draws at the maximum tree depth (a badly scaled posterior: "
                        "reparametrise, or a dense mass matrix)")
    return Diagnostics(worst_rhat, worst_ess, int(divergences), not problems, tuple(problems),
                       float(np.mean(steps)), at_cap)


def _chain_method(num_chains: int) -> str:
    return "parallel" if jax.local_device_count() >= num_chains > 1 else "vectorized"


MAX_TREE_DEPTH = 10
"""NUTS's maximum tree depth (NumPyro's default): at most 2^10 - 1 leapfrog steps per draw."""


@functools.lru_cache(maxsize=16)
def _mcmc(model, num_chains, num_warmup, num_samples, progress_bar, target_accept, dense_mass=False,
          shapes=()) -> MCMC:
    # Reused across calls with data of the same shapes (jit_model_args): repeated fits, such as
    # calibration over many synthetic datasets, compile once. ``shapes`` (of the data and the
    # starting points) is only part of the key: an MCMC object holds state traced for one set of
    # shapes (its vectorised chains fail on another), so other shapes get their own.
    return MCMC(
        NUTS(model, target_accept_prob=target_accept, dense_mass=dense_mass, max_tree_depth=MAX_TREE_DEPTH),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains, chain_method=_chain_method(num_chains), progress_bar=progress_bar,
        jit_model_args=True,
    )


@functools.lru_cache(maxsize=32)
def _jitted_once(fn, args, kwargs):
    return _NUMPYRO_MAYBE_JIT(fn, *args, **dict(kwargs))


def _memoised_maybe_jit(fn, *args, **kwargs):
    try:
        return _jitted_once(fn, args, tuple(sorted(kwargs.items())))
    except TypeError:  # unhashable options: as NumPyro does
        return _NUMPYRO_MAYBE_JIT(fn, *args, **kwargs)


_NUMPYRO_MAYBE_JIT = getattr(numpyro.util, "maybe_jit", None)


@contextlib.contextmanager
def _sampling_loop_compiled_once():
    """Let a cached MCMC reuse its compiled sampling loop for new data of the same shapes.

    NumPyro's ``fori_collect`` caches its loop body but wraps it in a NEW ``jax.jit`` object on
    every run, and passes that object as a static argument of the jitted loop: the loop is
    compiled again on every run (1.5 s of the 1.7 s a 40-point plane takes on this machine, in
    numpyro 0.19-0.22). Returning the same jit wrapper for the same function and options makes
    the second run of one model on same-shaped data compile nothing; the computation, and so
    every draw, is unchanged. Single-chain and sequential runs profit (calibration over many
    synthetic datasets, repeated fits); runs vectorised or mapped over chains are traced anew
    by NumPyro anyway. Without ``numpyro.util.maybe_jit`` (another NumPyro) this does nothing.
    """
    if _NUMPYRO_MAYBE_JIT is None:
        yield
        return
    numpyro.util.maybe_jit = _memoised_maybe_jit
    try:
        yield
    finally:
        numpyro.util.maybe_jit = _NUMPYRO_MAYBE_JIT


_reuse_loops = True


@contextlib.contextmanager
def compiled_loop_reuse(enabled: bool):
    """Within the block, reuse NumPyro's compiled sampling loop across same-shaped runs (the
    default) or not (NumPyro's own behaviour, which compiles the loop again on every run): the
    benchmark of the reuse compares both. The draws are the same either way."""
    global _reuse_loops
    previous, _reuse_loops = _reuse_loops, enabled
    try:
        yield
    finally:
        _reuse_loops = previous


def clear_sampler_caches() -> None:
    """Forget every compiled sampler (ours, NumPyro's loop cache and JAX's), e.g. between studies
    that would otherwise keep many programs alive."""
    _mcmc.cache_clear()
    _jitted_once.cache_clear()
    getattr(numpyro.util.fori_collect, "_cache", {}).clear()
    jax.clear_caches()


def _draw_chunk(num_samples: int, pieces: int = 5) -> int:
    """The draws per chain of each progress report: a divisor of ``num_samples`` near a fifth of it,
    so that every piece runs one compiled loop (``num_samples`` itself when none fits)."""
    target = max(1, num_samples // pieces)
    sizes = [k for k in range(max(1, target // 2), num_samples // 2 + 1) if num_samples % k == 0]
    return min(sizes, key=lambda k: (abs(k - target), k)) if sizes else num_samples


def _run_nuts(model, model_args, *, init_params, var_names, num_chains, num_warmup, num_samples, seed,
              progress_bar, target_accept, summarize, dense_mass=False,
              progress: Callable[[str], None] | None = None) -> PosteriorRun:
    """NUTS in one compiled run, or with ``progress``: warm-up, then the draws in about five pieces,
    each reported with the draws done and the time left. Continuing from the last state draws
    exactly what one run draws (same keys, same adapted step size and mass matrix)."""
    shapes = tuple((np.shape(leaf), str(getattr(leaf, "dtype", type(leaf).__name__)))
                   for leaf in jax.tree.leaves((model_args, init_params)))
    chunk = _draw_chunk(num_samples) if progress is not None else num_samples
    mcmc = _mcmc(model, num_chains, num_warmup, chunk, progress_bar, target_accept, dense_mass, shapes)
    extra_fields = ("diverging", "num_steps")
    # numpyro's own x64 and dtype handling sit under "standard" promotion.
    reuse = _sampling_loop_compiled_once() if _reuse_loops else contextlib.nullcontext()
    with jax.numpy_dtype_promotion("standard"), reuse:
        if progress is None:
            mcmc.run(jax.random.PRNGKey(seed), *model_args, init_params=init_params, extra_fields=extra_fields)
            pieces = [(mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True))]
        else:
            pieces = _run_in_pieces(mcmc, model_args, init_params, seed, num_chains, num_warmup, num_samples,
                                    extra_fields, progress)
    grouped = {k: np.concatenate([np.asarray(p[0][k]) for p in pieces], axis=1) for k in pieces[0][0]}
    extra = {k: np.concatenate([np.asarray(p[1][k]) for p in pieces], axis=1) for k in extra_fields}
    samples = {k: v.reshape(-1, *v.shape[2:]) for k, v in grouped.items()}
    if not summarize:
        return PosteriorRun(samples, None, None)
    divergences = int(np.sum(extra["diverging"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.from_dict(posterior=grouped, sample_stats={"diverging": extra["diverging"],
                                                              "n_steps": extra["num_steps"]})
    return PosteriorRun(samples, idata, check_diagnostics(idata, divergences, var_names=var_names,
                                                          num_steps=extra["num_steps"],
                                                          max_tree_depth=MAX_TREE_DEPTH))


def _run_in_pieces(mcmc, model_args, init_params, seed, num_chains, num_warmup, num_samples, extra_fields,
                   progress) -> list:
    chunk = mcmc.num_samples
    progress(f"warm-up: {num_chains} chains x {num_warmup} iterations")
    start = time.perf_counter()
    try:
        mcmc.warmup(jax.random.PRNGKey(seed), *model_args, init_params=init_params)
        progress(f"warm-up done in {time.perf_counter() - start:.0f} s; draws 0/{num_samples} per chain")
        start, pieces = time.perf_counter(), []
        for done in range(chunk, num_samples + 1, chunk):
            mcmc.run(mcmc.post_warmup_state.rng_key, *model_args, extra_fields=extra_fields)
            pieces.append((mcmc.get_samples(group_by_chain=True), mcmc.get_extra_fields(group_by_chain=True)))
            mcmc.post_warmup_state = mcmc.last_state
            now = time.perf_counter()
            if done == chunk:  # the first piece also compiles the sampling loop: time the others
                start, left = now, None
            else:
                left = (now - start) / (done - chunk) * (num_samples - done)
            progress(f"draws {done}/{num_samples} per chain"
                     + (f", about {left:.0f} s left" if left is not None and done < num_samples else ""))
    finally:
        mcmc.post_warmup_state = None  # the cached sampler starts the next call from its own warm-up
    return pieces


def _jittered(centre: dict[str, float], num_chains: int, seed: int, scale: float) -> dict[str, jax.Array]:
    """Per-chain starting points in unconstrained space, spread around ``centre``."""
    key = jax.random.PRNGKey(seed + 7919)
    out = {}
    for i, (name, value) in enumerate(centre.items()):
        value = jnp.asarray(value, jnp.float64)  # a scalar, or one value per run
        noise = scale * jax.random.normal(jax.random.fold_in(key, i), (num_chains, *value.shape))
        out[name] = value + noise if num_chains > 1 else value + noise[0]
    return out


def _unconstrained_centre(prior: Callable, values: dict[str, float]) -> dict[str, float]:
    """Each prior site's value mapped to NumPyro's unconstrained space (log for positive sites).

    A point fit can end on the boundary of a site's support (an exponent at 0, a coefficient
    underflowing); such a value is moved just inside, so that the chains start finite. A point
    fit can also send a log-coefficient to minus infinity (the ladder's irreducible loss E
    underflows to 0 at the optimum); a real site is therefore started within 5 prior standard
    deviations of its prior mean, where the prior's gradient does not overflow the first step.
    """
    with numpyro.handlers.trace() as trace, numpyro.handlers.seed(rng_seed=0):
        prior()
    out = {}
    for name, value in values.items():
        fn = trace[name]["fn"]
        support = fn.support
        if support is dist.constraints.real:
            value = float(np.nan_to_num(float(value), nan=0.0))
            try:
                mean, sd = float(fn.mean), float(np.sqrt(fn.variance))
            except (NotImplementedError, TypeError):
                mean, sd = 0.0, np.inf
            out[name] = float(np.clip(value, mean - 5 * sd, mean + 5 * sd)) if np.isfinite(sd) else value
        elif support is dist.constraints.positive:
            out[name] = float(np.log(max(float(value), 1e-8)))
        else:
            out[name] = float(np.clip(np.nan_to_num(float(dist.biject_to(support).inv(jnp.asarray(value)))), -30, 30))
    return out


def _group_index(index: ArrayLike, shape: tuple, message: str) -> np.ndarray:
    """A random effect's group of each row, checked: one non-negative integer per row (else ``message``)."""
    index = np.asarray(index)
    if index.shape != shape or not np.issubdtype(index.dtype, np.integer) or index.min(initial=0) < 0:
        raise ValueError(message)
    return index


def sample_loss_law(
    n_params: ArrayLike,
    n_tokens: ArrayLike,
    loss: ArrayLike,
    *,
    init,
    family: LossLawFamily | None = None,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    run: ArrayLike | None = None,
    progress_bar: bool = True,
    target_accept: float = 0.9,
    summarize: bool = True,
    progress: Callable[[str], None] | None = None,
    dense_mass: bool = True,
) -> PosteriorRun:
    """NUTS posterior of a loss law on runs (N, D, L), started around the point fit ``init``.

    ``family`` defaults to the shipped family of ``init``'s type. ``run`` (an integer per row,
    e.g. :meth:`sdsl_jax.data.PretrainingRuns.run_index`) selects the hierarchical model with
    per-run effects (:func:`run_effects_model_for`); None keeps rows independent. The samples
    then also hold ``centre_log_d`` (the data's mean log D, for :func:`new_run_offsets`).
    ``summarize=False`` skips the ArviZ conversion and diagnostics (``inference_data`` and
    ``diagnostics`` are then None): for loops over many small fits such as calibration.
    ``progress`` receives a line after the warm-up and after each fifth of the draws (draws done,
    time left); the draws are the same with or without it.

    ``dense_mass`` (default): NUTS adapts a full mass matrix. A law's coefficients are strongly
    correlated (a scale with its exponent, the irreducible loss with both), which a diagonal
    metric can only follow with long trajectories, many at the maximum tree depth
    (:attr:`Diagnostics.max_tree_depth_share`; ``docs/results/chinchilla_reference.md`` has the comparison).
    """
    family = family_of(init) if family is None else family
    log_n, log_d, log_loss = (jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens, loss))
    theta = np.asarray(family.to_theta(init), np.float64)
    residual = np.asarray(log_loss) - np.asarray(family.log_prediction(jnp.asarray(theta), log_n, log_d))
    centre = _unconstrained_centre(family.prior, dict(zip(family.theta_names, theta)))
    scale = max(np.median(np.abs(residual)) * 1.4826, 1e-4)
    centre.update(sigma=float(np.log(scale)), nu=float(np.log(5.0)))
    if run is not None:
        run = _group_index(run, np.shape(loss), "run must hold one non-negative integer per row "
                                                "(PretrainingRuns.run_index())")
    model, args = _loss_law_model(family, log_n, log_d, run)
    args = (*args, log_loss)
    if run is not None:
        count = int(run.max(initial=-1)) + 1
        centre.update(sigma=float(np.log(scale / np.sqrt(2))), run_sd=float(np.log(scale / np.sqrt(2))),
                      run_slope_sd=float(np.log(0.01)))
        # The per-run z start at zero (NumPyro's uniform init would scatter them over [-2, 2]).
        centre.update(run_z=np.zeros(count), run_slope_z=np.zeros(count))
    out = _run_nuts(model, args,
                     init_params=_jittered(centre, num_chains, seed, 0.02),
                     var_names=loss_law_sites(family, run_effects=run is not None),
                     num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, seed=seed,
                     progress_bar=progress_bar, target_accept=target_accept, summarize=summarize,
                     progress=progress, dense_mass=dense_mass)
    if run is not None:
        out.samples["centre_log_d"] = np.asarray(float(jnp.mean(log_d)))
    return out


def _loss_law_model(family: LossLawFamily, log_n, log_d, run) -> tuple[Callable, tuple]:
    """The loss law's NumPyro model and its arguments before ``log_loss``: i.i.d. rows, or per-run effects."""
    if run is None:
        return loss_law_model_for(family), (log_n, log_d)
    run = np.asarray(run)
    return run_effects_model_for(family), (log_n, log_d, jnp.asarray(run), jnp.zeros(int(run.max(initial=-1)) + 1))


def pointwise_log_likelihood(samples: dict[str, np.ndarray], family: LossLawFamily, n_params: ArrayLike,
                             n_tokens: ArrayLike, loss: ArrayLike, *, run: ArrayLike | None = None) -> np.ndarray:
    """log p(log L_i | draw) for every posterior draw and row, shape ``(draws, rows)``.

    The model is the one :func:`sample_loss_law` sampled (with per-run effects when ``run`` is
    given, each row then conditioned on its run's own effects). Input of PSIS-LOO and stacking.
    """
    log_n, log_d, log_loss = (jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens, loss))
    model, args = _loss_law_model(family, log_n, log_d, run)
    sites = {k: jnp.asarray(v).reshape(-1, *np.shape(v)[1:]) for k, v in samples.items() if k != "centre_log_d"}
    with jax.numpy_dtype_promotion("standard"):
        ll = numpyro.infer.log_likelihood(model, sites, *args, log_loss=log_loss)["log_loss"]
    return np.asarray(ll)


class Identification(NamedTuple):
    """How much the data identify each parameter of a posterior.

    Attributes:
      names: the parameters (the family's fitting coordinates theta).
      contraction: ``1 - var_posterior / var_prior`` per parameter: near 1 the data pin it down,
        near 0 (or below) the posterior is the prior.
      correlation: posterior correlation matrix of the parameters.
      flags: one sentence per problem (empty when every parameter is identified).
    """

    names: tuple[str, ...]
    contraction: np.ndarray
    correlation: np.ndarray
    flags: tuple[str, ...]


def identification(samples: dict[str, np.ndarray], family: LossLawFamily, *, num_prior: int = 4000, seed: int = 0,
                   min_contraction: float = 0.5, max_correlation: float = 0.95) -> Identification:
    """Flag loss-law parameters the data do not identify, from the posterior against the prior.

    A parameter whose posterior keeps more than half its prior variance (contraction below
    ``min_contraction``) is "weakly identified"; a pair with posterior ``|correlation|`` above
    ``max_correlation`` is identified only in combination when one of the two also keeps more
    than 10% of its prior variance. (A coefficient and its exponent, log A and alpha, trade off
    around the data's centre: on Chinchilla they correlate at 0.999 while each keeps under 1% of
    its prior variance and every prediction is pinned down, which is no identification problem.)
    Both are computed in the family's fitting coordinates (log coefficients), where the prior
    is stated.
    """
    names = tuple(family.theta_names)
    draws = numpyro.infer.Predictive(family.prior, num_samples=num_prior)(jax.random.PRNGKey(seed))
    prior = np.stack([np.asarray(draws[n]).reshape(-1) for n in names], axis=1)
    post = np.stack([np.asarray(samples[n]).reshape(-1) for n in names], axis=1)
    contraction = 1.0 - post.var(0) / prior.var(0)
    correlation = np.corrcoef(post, rowvar=False)
    flags = [f"{n}: weakly identified (the posterior keeps {1 - c:.0%} of the prior's variance)"
             for n, c in zip(names, contraction) if c < min_contraction]
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if abs(correlation[i, j]) > max_correlation and min(contraction[i], contraction[j]) < 0.9:
                flags.append(f"{names[i]} and {names[j]}: identified only together (posterior correlation "
                             f"{correlation[i, j]:+.3f})")
    return Identification(names, contraction, correlation, tuple(flags))


def sample_plane(
    ppl_draft: ArrayLike,
    ppl_target: ArrayLike,
    alpha: ArrayLike,
    *,
    weights: ArrayLike | None = None,
    model: AcceptanceModel = PLANE,
    draft: ArrayLike | None = None,
    target: ArrayLike | None = None,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    progress_bar: bool = True,
    target_accept: float | None = None,
    summarize: bool = True,
    progress: Callable[[str], None] | None = None,
) -> PosteriorRun:
    """NUTS posterior of an acceptance model (see :func:`plane_model_for`); ``summarize`` and
    ``progress`` as in :func:`sample_loss_law`.

    ``draft`` and ``target`` (an integer model per pair, e.g.
    :meth:`sdsl_jax.data.AcceptanceMeasurements.model_index`) select the model with a random
    effect per draft and per target model (:func:`model_effects_plane_model_for`); None keeps
    pairs independent. That model runs NUTS with a dense mass matrix and ``target_accept``
    0.99 by default (0.9 otherwise): a draft's effect and the coefficient of its perplexity are
    correlated (each draft model has one perplexity), which a diagonal metric mixes slowly, and
    with few targets their effects' scale sits near zero, where only small steps avoid
    divergences (on the ladder's 84 pairs, 2,000 draws: 0-6 divergent transitions at 0.98 over
    four seeds, 0-1 at 0.99).
    """
    x, y, a = (jnp.asarray(v, jnp.float64) for v in (ppl_draft, ppl_target, alpha))
    w = jnp.ones_like(a) if weights is None else jnp.asarray(weights, jnp.float64)
    # Start at the weighted least-squares fit on the link's scale (standardised coordinates), sigma at its residual.
    u, v = (np.asarray(f) for f in model.features(x, y))
    us, vs = (u - np.mean(u)) / (np.std(u) + 1e-12), (v - np.mean(v)) / (np.std(v) + 1e-12)
    design = np.stack([us, vs, np.ones_like(us)], 1) * np.sqrt(np.asarray(w))[:, None]
    eta = np.asarray(model.to_link(a))
    coef, *_ = np.linalg.lstsq(design, eta * np.sqrt(np.asarray(w)), rcond=None)
    resid = eta - np.stack([us, vs, np.ones_like(us)], 1) @ coef
    sigma0 = np.sqrt(np.sum(np.asarray(w) * resid**2) / np.sum(np.asarray(w)))
    centre = dict(slope_x=float(coef[0]), slope_y=float(coef[1]), centre=float(coef[2]),
                  sigma=float(np.log(max(sigma0, 1e-4))))
    numpyro_model, args = _plane_model(model, x, y, w, draft, target, np.shape(alpha))
    var_names, dense = PLANE_SITES, False
    if draft is not None:
        var_names, dense = PLANE_SITES + MODEL_EFFECT_SITES, True
        # The residual variance split evenly between pairs, drafts and targets; the z start at zero.
        third = float(np.log(max(sigma0, 1e-4) / np.sqrt(3)))
        centre.update(sigma=third, draft_sd=third, target_sd=third,
                      draft_z=np.zeros(args[4].shape[0]), target_z=np.zeros(args[6].shape[0]))
    return _run_nuts(numpyro_model, (*args, a), init_params=_jittered(centre, num_chains, seed, 0.05),
                     var_names=var_names, num_chains=num_chains, num_warmup=num_warmup,
                     num_samples=num_samples, seed=seed, progress_bar=progress_bar,
                     target_accept=target_accept if target_accept is not None else (0.99 if dense else 0.9),
                     summarize=summarize, dense_mass=dense, progress=progress)


def _plane_model(model: AcceptanceModel, x, y, w, draft, target, shape) -> tuple[Callable, tuple]:
    """The acceptance model's NumPyro model and its arguments before ``alpha``: independent pairs,
    or per-draft and per-target model effects."""
    if (draft is None) != (target is None):
        raise ValueError("give both draft and target (one integer model per pair), or neither")
    if draft is None:
        return plane_model_for(model), (x, y, w)
    groups = []
    for name, index in (("draft", draft), ("target", target)):
        index = _group_index(index, shape, f"{name} must hold one non-negative integer per pair "
                                           "(AcceptanceMeasurements.model_index())")
        groups.append((jnp.asarray(index), jnp.zeros(int(index.max(initial=-1)) + 1)))
    return model_effects_plane_model_for(model), (x, y, w, groups[0][0], groups[0][1], groups[1][0], groups[1][1])


def acceptance_pointwise_log_likelihood(samples: dict[str, np.ndarray], model: AcceptanceModel, ppl_draft: ArrayLike,
                                        ppl_target: ArrayLike, alpha: ArrayLike, *, weights: ArrayLike | None = None,
                                        draft: ArrayLike | None = None,
                                        target: ArrayLike | None = None) -> np.ndarray:
    """log p(alpha_i | draw) for every posterior draw and pair, shape ``(draws, pairs)``.

    The model is the one :func:`sample_plane` sampled (with per-model effects when ``draft`` and
    ``target`` are given, each pair then conditioned on its models' effects). Input of PSIS-LOO
    and stacking over acceptance models, as :func:`pointwise_log_likelihood` is for loss laws.
    """
    x, y, a = (jnp.asarray(v, jnp.float64) for v in (ppl_draft, ppl_target, alpha))
    w = jnp.ones_like(a) if weights is None else jnp.asarray(weights, jnp.float64)
    numpyro_model, args = _plane_model(model, x, y, w, draft, target, np.shape(alpha))
    sites = {k: jnp.asarray(v) for k, v in samples.items() if k not in ("A", "B", "C")}
    with jax.numpy_dtype_promotion("standard"):
        ll = numpyro.infer.log_likelihood(numpyro_model, sites, *args, alpha=a)["alpha_obs"]
    return np.asarray(ll)


def laws_from_posterior(samples: dict[str, np.ndarray], family: LossLawFamily = CHINCHILLA):
    """Posterior draws of the family's theta as its law, with fields of shape ``(draws,)``."""
    theta = np.stack([samples[k] for k in family.theta_names], axis=-1)
    law = family.from_theta(theta)
    return type(law)(*(np.asarray(v) for v in law))


def planes_from_posterior(samples: dict[str, np.ndarray], model: AcceptanceModel = PLANE):
    """Posterior draws of (A, B, C) as the acceptance model's coefficients."""
    return model.params_type(A=samples["A"], B=samples["B"], C=samples["C"])


class DraftSizeBands(NamedTuple):
    """Posterior summaries over target sizes; quantile arrays have shape (len(quantiles), len(m)).

    Attributes:
      m_target: target sizes M.
      quantiles: the probability levels of the rows below.
      n_star, m_over_n, gamma_star, throughput: quantiles over draws (failed solves excluded).
      failed_fraction: share of draws whose solve did not succeed, per M.
      linear_law: (mu, M0) per draw (NaN where a draw had too few successful solves).
      n_star_draws: N* per draw and M, shape (draws, len(m)).
    """

    m_target: np.ndarray
    quantiles: np.ndarray
    n_star: np.ndarray
    m_over_n: np.ndarray
    gamma_star: np.ndarray
    throughput: np.ndarray
    failed_fraction: np.ndarray
    linear_law: LinearLaw
    n_star_draws: np.ndarray


def propagate_draft_size(
    m_target: ArrayLike,
    laws,
    planes,
    *,
    d_target: float,
    d_draft: float | None = None,
    recipe=None,
    cost=SDSL_FLOPS,
    quantiles=(0.05, 0.25, 0.5, 0.75, 0.95),
    chunk_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    **solver_options,
) -> DraftSizeBands:
    """Push posterior draws through N*(M): bands on N*, M/N*, gamma*, T*, and (mu, M0) draws.

    Args:
      m_target: target sizes (1-D).
      laws: loss-law draws (any family; fields of shape ``(draws,)``) or a single law.
      planes: acceptance-model draws (fields ``(draws,)``) or a single model (e.g. ``SDSL2026``).
      d_target: training tokens of the target.
      d_draft, recipe: the draft's training budget, as in :func:`sdsl_jax.solve_draft_size`.
      cost: cost model (its fields may also be draws).
      quantiles: probability levels to report.
      chunk_size: draws solved per vectorised call (memory is ``chunk_size x len(m)`` solves).
      progress: called as ``progress(done_draws, total_draws)``.
    """
    m = np.asarray(m_target, np.float64)
    solved = solve_draws(m, laws, planes, d_target=d_target, d_draft=d_draft, recipe=recipe, cost=cost,
                         chunk_size=chunk_size, progress=progress, **solver_options)
    return summarize_draws(m, *solved, quantiles=quantiles)


def solve_draws(
    m_target: ArrayLike,
    laws,
    planes,
    *,
    d_target: float,
    d_draft: float | None = None,
    recipe=None,
    cost=SDSL_FLOPS,
    chunk_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
    **solver_options,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N*, gamma* and T* for every draw and target, each of shape ``(draws, len(m_target))``.

    Arguments as in :func:`propagate_draft_size`. Solving every target of a run in one call
    compiles the solver once (compilation, not solving, dominates at a few hundred draws).
    """
    m = np.asarray(m_target, np.float64)
    recipe = as_recipe(d_draft, recipe)
    draws = (laws, planes, cost, recipe)
    num_draws = max(np.size(v) for v in jax.tree.leaves(draws))
    draws = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v, np.float64), (num_draws,)), draws)
    outputs = {k: [] for k in ("n_star", "gamma_star", "throughput")}
    for start in range(0, num_draws, chunk_size):
        stop = min(start + chunk_size, num_draws)
        idx = np.resize(np.arange(start, stop), chunk_size)  # fixed shape: one compilation
        law, plane, cost_i, recipe_i = jax.tree.map(lambda v: v[idx][:, None], draws)
        sol = solve_draft_size(m[None, :], d_target=d_target, recipe=recipe_i, loss=law, plane=plane, cost=cost_i,
                               **solver_options)
        for k in outputs:
            outputs[k].append(np.asarray(getattr(sol, k))[: stop - start])
        if progress is not None:
            progress(stop, num_draws)
    return tuple(np.concatenate(outputs[k]) for k in ("n_star", "gamma_star", "throughput"))


def summarize_draws(m_target: ArrayLike, n_star: np.ndarray, gamma_star: np.ndarray, throughput: np.ndarray, *,
                    quantiles=(0.05, 0.25, 0.5, 0.75, 0.95)) -> DraftSizeBands:
    """Quantile bands over draws (failed solves excluded) and the linear law per draw."""
    m = np.asarray(m_target, np.float64)
    q = np.asarray(quantiles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN quantiles
        bands = [np.nanquantile(x, q, axis=0) for x in (n_star, m / n_star, gamma_star, throughput)]
        law = jax.vmap(fit_linear_law, (None, 0))(jnp.asarray(m), jnp.asarray(n_star))
    enough = np.isfinite(n_star).sum(1) >= 2
    law = LinearLaw(np.where(enough, law.mu, np.nan), np.where(enough, law.m0, np.nan))
    return DraftSizeBands(m, q, *bands, np.mean(~np.isfinite(n_star), axis=0), law, n_star)


def plane_sensitivity(
    m_target: ArrayLike, *, law, plane, d_target: float, d_draft: float | None = None, recipe=None,
    cost=SDSL_FLOPS,
) -> dict[str, np.ndarray]:
    """Elasticities ``d log N* / d log |theta|`` for theta = A, B, C, by implicit derivatives.

    An elasticity of -7 means a 1% larger |A| gives a 7% different N* (here: smaller).
    """
    m = jnp.asarray(m_target, jnp.float64)

    def log_n_star(p):
        return jnp.log(solve_draft_size(m, d_draft=d_draft, d_target=d_target, recipe=recipe, loss=law,
                                        plane=type(plane)(*p), cost=cost).n_star)

    p = jnp.asarray([plane.A, plane.B, plane.C], jnp.float64)
    jac = jax.jacfwd(log_n_star)(p)  # (len(m), 3)
    return {name: np.asarray(jac[:, i] * p[i]) for i, name in enumerate(("A", "B", "C"))}


def interval_coverage(draws: np.ndarray, truth: float, *, level: float = 0.9) -> bool:
    """Whether ``truth`` lies in the central ``level`` interval of ``draws``."""
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return bool(lo <= truth <= hi)


def save_inference_data(idata: az.InferenceData, path: str | os.PathLike) -> None:
    """Write the posterior as netCDF, atomically."""
    from sdsl_jax.store import atomic_write

    atomic_write(path, idata.to_netcdf)
