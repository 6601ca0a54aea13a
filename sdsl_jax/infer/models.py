"""The NumPyro models of the chain's fitted links, one ``numpyro.sample`` per random quantity.

* :func:`loss_law_model_for` ``(family)`` -- ``log L_i ~ StudentT(nu, log L_theta(N_i, D_i), sigma)``
  with the family's priors on theta (:mod:`sdsl_jax.loss_laws`); for the Chinchilla family
  (:data:`loss_law_model`) the likelihood behind Besiroglu et al.'s (2024) fit of Hoffmann et
  al.'s Approach 3. :func:`run_effects_model_for` adds a random intercept and slope in log D per
  training run.
* :func:`plane_model_for` ``(model)`` -- ``alpha_i ~ TruncatedNormal_[0,1](A u_i + B v_i + C, sigma / sqrt(w_i))``
  for an identity-linked acceptance model's features (u, v) (:data:`plane_model`: SDSL's plane,
  u, v = x, y), ``logit alpha_i ~ Normal(...)`` for a logit-linked one, with per-row weights
  (iterations measured). :func:`model_effects_plane_model_for` adds an effect per draft and per
  target model; :func:`projected_effects_plane_model_for` is the same model in coordinates where
  an effect cannot trade against a coefficient (:func:`effect_basis`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import numpyro.util
from jax.typing import ArrayLike

from sdsl_jax.acceptance import PLANE, AcceptanceModel
from sdsl_jax.loss_laws import CHINCHILLA, DataCentre, LossLawFamily
from sdsl_jax.normal import log_unit_interval_mass, truncated_normal_quantile


__all__ = [
    "LOSS_LAW_SITES",
    "PLANE_SITES",
    "loss_law_sites",
    "sample_degrees_of_freedom",
    "loss_law_model_for",
    "loss_law_model",
    "RUN_EFFECT_SITES",
    "run_effects_model_for",
    "new_run_effect",
    "new_run_offsets",
    "UnitTruncatedNormal",
    "acceptance_likelihood",
    "plane_model_for",
    "COEFFICIENT_COORDINATES",
    "CoefficientFrame",
    "coefficient_frame",
    "check_coefficient_coordinates",
    "dispersed_about_frame",
    "MODEL_EFFECT_SITES",
    "EFFECT_SIDES",
    "sampled_effect_sides",
    "effect_sides_of",
    "effect_scale_sites",
    "model_effects_plane_model_for",
    "effect_basis",
    "feature_scale",
    "projected_effects_plane_model_for",
    "plane_model",
    "widened_priors",
]


LOSS_LAW_SITES = ("a", "b", "e", "alpha", "beta", "sigma", "nu")  # the Chinchilla family's
PLANE_SITES = ("A", "B", "C", "sigma")


def sample_degrees_of_freedom() -> jax.Array:
    """``nu - 1 ~ Gamma(2, 0.1)``: the Student-t residual's degrees of freedom, the prior of Juarez &
    Steel (2010) shifted to ``nu > 1`` (site ``nu_excess``; ``nu`` recorded as deterministic). Mean
    21: heavy tails must be supported by the data. The shift keeps a residual with a mean; without
    it a chain can drift to ``nu`` near 0, where every row is an outlier and the law is free (a
    short chain from a dispersed start does)."""
    return numpyro.deterministic("nu", 1.0 + numpyro.sample("nu_excess", dist.Gamma(2.0, 0.1)))


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
    * ``nu - 1 ~ Gamma(2, 0.1)``: degrees of freedom (:func:`sample_degrees_of_freedom`), so heavy
      tails must be supported by the data.

    One model function per family (cached), so that compiled samplers are reused.
    """

    def model(log_n: jax.Array, log_d: jax.Array, log_loss: jax.Array | None = None) -> None:
        theta = family.prior(DataCentre.of(log_n, log_d))
        sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
        nu = sample_degrees_of_freedom()
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
        theta = family.prior(DataCentre.of(log_n, log_d))
        sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
        nu = sample_degrees_of_freedom()
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


def feature_scale(feature):
    """The mean and scale that standardise a feature over the pairs (NumPy or JAX arrays alike)."""
    return feature.mean(), feature.std() + 1e-12


def _feature_scales(acceptance_model: AcceptanceModel, ppl_draft, ppl_target):
    """The acceptance model's features and the mean and scale that standardise each over the pairs."""
    u, v = acceptance_model.features(ppl_draft, ppl_target)
    return u, v, (*feature_scale(u), *feature_scale(v))


def _standardised_predictor(centre, slope_x, slope_y, u, v, scales) -> jax.Array:
    u_mean, u_std, v_mean, v_std = scales
    return centre + slope_x * (u - u_mean) / u_std + slope_y * (v - v_mean) / v_std


COEFFICIENT_COORDINATES = ("prior-scaled", "data-scaled")
"""The coordinates :func:`sdsl_jax.infer.posterior.sample_plane` can sample an acceptance model's
coefficients in (:func:`coefficient_frame`)."""


class CoefficientFrame(NamedTuple):
    """Where and at what scale an acceptance model's coefficients are sampled, each of
    ``(intercept at the mean features, standardised slope of u, standardised slope of v)``:
    ``coefficients = origin + unit * c`` with ``c`` the sampled site ``coefficients_c``."""

    origin: np.ndarray
    unit: np.ndarray


def _stated_coefficient_prior(acceptance_model: AcceptanceModel) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd of the coefficients' stated prior, in :class:`CoefficientFrame`'s order."""
    centre_mean, centre_sd = acceptance_model.centre_prior
    slope_sd = acceptance_model.slope_prior_sd
    return np.array([centre_mean, 0.0, 0.0]), np.array([centre_sd, slope_sd, slope_sd])


def coefficient_frame(acceptance_model: AcceptanceModel, ppl_draft: ArrayLike, ppl_target: ArrayLike,
                      alpha: ArrayLike, *, weights: ArrayLike | None = None,
                      pairs_per_model: float = 1.0) -> CoefficientFrame:
    """The data's scale of an acceptance model's coefficients: a weighted least-squares fit of the
    link of alpha on the standardised features (no effects) and its standard errors times
    ``sqrt(pairs_per_model)`` (pairs that share a model are not independent, so the posterior is
    about that much wider than the least-squares errors say).

    Sampling ``c`` with ``coefficients = origin + unit * c`` under the stated prior carried to ``c``
    (an affine map, so the posterior is the same) puts the coefficients' posterior at a scale of
    about one from NUTS's first iteration, where the stated prior's scale is tens to hundreds of
    times the posterior's: ``python -m experiments.bench --only warmup`` measures the warm-up this
    saves. Where the fit is not determined (three pairs or fewer, a constant feature, a perfect
    fit) a coefficient keeps its stated prior's mean and sd.
    """
    u, v = (np.asarray(f, np.float64) for f in acceptance_model.features(np.asarray(ppl_draft, np.float64),
                                                                          np.asarray(ppl_target, np.float64)))
    (u_mean, u_std), (v_mean, v_std) = feature_scale(u), feature_scale(v)
    x = np.stack([np.ones_like(u), (u - u_mean) / u_std, (v - v_mean) / v_std], axis=1)
    y = np.asarray(acceptance_model.to_link(np.clip(np.asarray(alpha, np.float64), 1e-6, 1 - 1e-6)))
    sw = np.sqrt(np.ones_like(u) if weights is None else np.asarray(weights, np.float64))
    stated_mean, stated_sd = _stated_coefficient_prior(acceptance_model)
    design = x * sw[:, None]
    if len(y) <= 3 or np.linalg.matrix_rank(design) < 3:
        return CoefficientFrame(stated_mean, stated_sd)
    coefficients, *_ = np.linalg.lstsq(design, y * sw, rcond=None)
    residual = (y - x @ coefficients) * sw
    variance = residual @ residual / (len(y) - 3) * np.diag(np.linalg.inv(design.T @ design))
    unit = np.sqrt(variance * pairs_per_model)
    usable = np.isfinite(coefficients) & np.isfinite(unit) & (unit > 1e-9 * stated_sd)
    return CoefficientFrame(np.where(usable, coefficients, stated_mean), np.where(usable, unit, stated_sd))


class _DispersedAboutFrame(numpyro.primitives.Messenger):
    def __init__(self, fn: Callable, spread: float):
        self.spread = spread
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] == "coefficients_c":
            msg["fn"] = dist.Normal(jnp.zeros(msg["fn"].event_shape), self.spread).to_event(1)


@functools.lru_cache(maxsize=None)
def dispersed_about_frame(model: Callable, spread: float = 3.0) -> Callable:
    """``model`` with its data-scaled coefficients (``coefficients_c``) drawn from ``Normal(0, spread)``
    and every other site from its prior: where chains start, not a prior. Overdispersed about the
    least-squares point by ``spread`` of its units (Gelman and Rubin 1992): a chain started from
    the stated prior in these coordinates begins tens to hundreds of units away, and NUTS's
    warm-up adapts its mass matrix to that journey rather than to the posterior (``python -m
    experiments.bench --only warmup``). The same callable for the same arguments, so the start's
    log density is compiled once."""
    starts = _DispersedAboutFrame(model, float(spread))
    starts.__name__ = starts.__qualname__ = f"{getattr(model, '__name__', 'model')}[starts about the frame]"
    return starts


def _plane_mean(acceptance_model: AcceptanceModel, ppl_draft: jax.Array, ppl_target: jax.Array,
                frame: CoefficientFrame | None = None) -> jax.Array:
    """Sample the acceptance model's coefficients (standardised features) and return its linear predictor.

    With a ``frame`` the coefficients are sampled as ``origin + unit * c`` (site ``coefficients_c``,
    its prior the stated one carried through that affine map) and recorded as deterministic sites
    of the names they are sampled under without it."""
    u, v, scales = _feature_scales(acceptance_model, ppl_draft, ppl_target)
    u_mean, u_std, v_mean, v_std = scales
    if frame is None:
        slope_sd, (centre_mean, centre_sd) = acceptance_model.slope_prior_sd, acceptance_model.centre_prior
        slope_x = numpyro.sample("slope_x", dist.Normal(0.0, slope_sd))
        slope_y = numpyro.sample("slope_y", dist.Normal(0.0, slope_sd))
        centre = numpyro.sample("centre", dist.Normal(centre_mean, centre_sd))
    else:
        origin, unit = frame
        stated_mean, stated_sd = (jnp.asarray(a) for a in _stated_coefficient_prior(acceptance_model))
        c = numpyro.sample("coefficients_c", dist.Normal((stated_mean - origin) / unit, stated_sd / unit).to_event(1))
        centre, slope_x, slope_y = origin + unit * c
        for site, value in (("slope_x", slope_x), ("slope_y", slope_y), ("centre", centre)):
            numpyro.deterministic(site, value)
    A = numpyro.deterministic("A", slope_x / u_std)
    B = numpyro.deterministic("B", slope_y / v_std)
    numpyro.deterministic("C", centre - A * u_mean - B * v_mean)
    return _standardised_predictor(centre, slope_x, slope_y, u, v, scales)


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


def check_coefficient_coordinates(coefficients: str) -> None:
    """Refuse a ``coefficients`` choice that is not one of :data:`COEFFICIENT_COORDINATES`."""
    if coefficients not in COEFFICIENT_COORDINATES:
        raise ValueError(f"coefficients must be one of {', '.join(COEFFICIENT_COORDINATES)}, got {coefficients!r}")


def _with_coefficient_frame(body: Callable, coefficients: str) -> Callable:
    """``body(*design, frame, alpha)`` as a NumPyro model: ``model(*design, alpha=None)`` for the
    prior-scaled coefficients, ``model(*design, origin, unit, alpha=None)`` for the data-scaled ones
    (the frame is data, not a constant of the compiled program)."""
    check_coefficient_coordinates(coefficients)
    design_count = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in inspect.signature(body).parameters.values())
    frame_count = 0 if coefficients == "prior-scaled" else 2

    def model(*args, alpha=None):
        if len(args) == design_count + frame_count + 1:  # alpha given positionally, as NUTS passes it
            *args, alpha = args
        design, frame = args[:design_count], args[design_count:]
        return body(*design, frame=CoefficientFrame(*frame) if frame_count else None, alpha=alpha)

    return model


@functools.lru_cache(maxsize=None)
def plane_model_for(acceptance_model: AcceptanceModel, coefficients: str = "prior-scaled") -> Callable:
    """The NumPyro model of an acceptance model ``eta = A u + B v + C`` with weighted noise.

    The features are standardised inside the model (NUTS mixes far better) and A, B, C are
    recorded as deterministic sites on the original scale. Priors (the family's, on the link's
    scale; for the identity-linked planes): the standardised coefficients ``Normal(0, 0.5)`` (a
    one-standard-deviation change of a feature moves alpha by less than 0.5 at 68%: alpha lives in
    (0, 1)); the intercept at the mean features ``Normal(0.5, 0.5)``; ``sigma ~ HalfNormal(0.2)``
    for a row of average weight. The likelihood is :func:`acceptance_likelihood`.

    ``coefficients="data-scaled"`` samples the same model with the coefficients in a
    :class:`CoefficientFrame` passed after the design (``model(ppl_draft, ppl_target, weights,
    origin, unit, alpha)``).
    """

    def body(ppl_draft: jax.Array, ppl_target: jax.Array, weights: jax.Array, *, frame, alpha) -> None:
        mean = _plane_mean(acceptance_model, ppl_draft, ppl_target, frame)
        sigma = numpyro.sample("sigma", dist.HalfNormal(acceptance_model.sigma_prior_sd))
        scale = sigma / jnp.sqrt(weights / weights.mean())
        with numpyro.plate("pairs", ppl_draft.shape[0]):
            numpyro.sample("alpha_obs", acceptance_likelihood(acceptance_model, mean, scale), obs=alpha)

    model = _with_coefficient_frame(body, coefficients)
    model.__name__ = model.__qualname__ = f"plane_model[{acceptance_model.name}, {coefficients}]"
    return model


MODEL_EFFECT_SITES = ("draft_sd", "target_sd")


EFFECT_SIDES = ("draft", "target")
"""The kinds of model an acceptance model can give a random effect each."""


def effect_sides_of(model_effects) -> tuple[str, ...]:
    """The kinds of model a ``model_effects`` choice names, in :data:`EFFECT_SIDES` order: True, both;
    False or None, none; else the kinds given (``("draft",)``)."""
    if model_effects is True:
        return EFFECT_SIDES
    return tuple(kind for kind in EFFECT_SIDES if kind in (model_effects or ()))


def effect_scale_sites(sides: tuple[str, ...]) -> tuple[str, ...]:
    """The sampled scale sites of the effects of ``sides`` (``("draft_sd",)`` for the drafts alone)."""
    return tuple(f"{kind}_sd" for kind in effect_sides_of(sides))


def sampled_effect_sides(samples: dict) -> tuple[str, ...]:
    """The kinds of model whose effects an acceptance posterior sampled (a kind left out by
    :func:`model_effects_plane_model_for` records a scale of zero)."""
    return tuple(kind for kind in EFFECT_SIDES
                 if f"{kind}_sd" in samples and np.any(np.asarray(samples[f"{kind}_sd"]) != 0))


@functools.lru_cache(maxsize=None)
def model_effects_plane_model_for(acceptance_model: AcceptanceModel, sides: tuple[str, ...] = EFFECT_SIDES,
                                  coefficients: str = "prior-scaled") -> Callable:
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

    ``sides`` names the kinds of model that get effects (``("draft",)`` where the targets are too few
    to estimate their scale, :meth:`sdsl_jax.data.AcceptanceMeasurements.model_effects_identified`);
    a kind left out records its scale and effects as zeros, so that predictions read them as for
    any other posterior.

    Arguments: ``ppl_draft, ppl_target, weights`` per pair, ``draft`` and ``target`` (integer model
    of each pair), ``draft_slots`` and ``target_slots`` (arrays whose lengths are the numbers of
    models: shapes must be static under ``jit``), ``alpha``; with ``coefficients="data-scaled"`` the
    :class:`CoefficientFrame`'s ``origin, unit`` after ``target_slots`` (as :func:`plane_model_for`).
    """
    unknown = set(sides) - set(EFFECT_SIDES)
    if unknown or not sides:
        raise ValueError(f"sides must name one or both of {EFFECT_SIDES}, got {sides!r}")

    def effects(kind: str, slots: jax.Array, index: jax.Array) -> jax.Array:
        if kind not in sides:
            numpyro.deterministic(f"{kind}_sd", jnp.zeros(()))
            numpyro.deterministic(f"{kind}_z", jnp.zeros(slots.shape[0]))
            return jnp.zeros(index.shape)
        sd = numpyro.sample(f"{kind}_sd", dist.HalfNormal(acceptance_model.effect_prior_sd))
        with numpyro.plate(f"{kind}_models", slots.shape[0]):
            z = numpyro.sample(f"{kind}_z", dist.Normal(0.0, 1.0))
        return sd * z[index]

    def body(ppl_draft, ppl_target, weights, draft, draft_slots, target, target_slots, *, frame, alpha) -> None:
        mean = _plane_mean(acceptance_model, ppl_draft, ppl_target, frame)
        sigma = numpyro.sample("sigma", dist.HalfNormal(acceptance_model.sigma_prior_sd))
        mean = mean + effects("draft", draft_slots, draft) + effects("target", target_slots, target)
        scale = sigma / jnp.sqrt(weights / weights.mean())
        with numpyro.plate("pairs", ppl_draft.shape[0]):
            numpyro.sample("alpha_obs", acceptance_likelihood(acceptance_model, mean, scale), obs=alpha)

    model = _with_coefficient_frame(body, coefficients)
    model.__name__ = model.__qualname__ = (f"model_effects_plane_model[{acceptance_model.name}, {'+'.join(sides)}, "
                                           f"{coefficients}]")
    return model


def effect_basis(group: ArrayLike, feature: ArrayLike, num_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An orthonormal basis of per-group effects split along the group-level design ``[1, mean feature]``.

    ``G`` (``num_groups x 2``) holds a 1 and the mean of ``feature`` over each group's rows (0 for a
    group without rows). Returns ``(inside, rest, coefficients)``: ``[inside | rest]`` is an
    orthogonal ``num_groups x num_groups`` matrix whose first ``k = rank(G)`` columns span G's
    columns, and ``coefficients`` (``2 x k``) satisfies ``G @ coefficients = inside``, so an effect
    vector ``inside @ w`` equals an intercept ``(coefficients @ w)[0]`` plus a slope
    ``(coefficients @ w)[1]`` on the feature at the group level.
    """
    group, feature = np.asarray(group), np.asarray(feature, np.float64)
    counts = np.bincount(group, minlength=num_groups)
    sums = np.bincount(group, weights=feature, minlength=num_groups)
    design = np.column_stack([np.ones(num_groups), np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)])
    u, s, vt = np.linalg.svd(design, full_matrices=True)
    rank = int(np.sum(s > 1e-9 * s[0]))
    return u[:, :rank], u[:, rank:], vt[:rank].T / s[:rank]


@functools.lru_cache(maxsize=None)
def projected_effects_plane_model_for(acceptance_model: AcceptanceModel, coefficient_prior_width: float = 1.0) -> Callable:
    """The model of :func:`model_effects_plane_model_for`, reparametrised so that NUTS need not follow
    the ridge between a model's effect and the coefficient of its feature.

    Each draft model has one perplexity, so a draft effect ``a_i`` that grows with the draft's mean
    feature is indistinguishable from a change of its slope (and likewise targets, and every effect's
    mean with the intercept): the posterior lies on ridges whose width is set by ``draft_sd`` and
    ``target_sd``, a funnel. The same prior, written in other coordinates:

    * each effect vector is ``a = Q1 g + draft_sd Q2 r``, with ``[Q1 | Q2]`` orthogonal and ``Q1``
      spanning the group-level design ``[1, mean feature]`` (:func:`effect_basis`), ``g ~ Normal(0,
      draft_sd^2 I)``, ``r ~ Normal(0, I)``; ``Q1 g`` is an intercept and slope ``c = M g``;
    * ``beta' = beta + E g`` (``beta`` = intercept and the two standardised slopes, ``E`` adding each
      group's ``c`` to them) is Normal(m, S + E Gamma E^T), sampled from standard normals through
      its Cholesky factor; ``g`` given ``beta'`` is Gaussian with precision ``Gamma^-1 + E^T S^-1 E``
      and is sampled from standard normals too; ``beta = beta' - E g``.

    When the features are constant within each model, the likelihood depends on ``beta'`` and the
    orthogonal rests alone and ``g`` keeps its conditional prior. The sampled sites differ
    (``coefficients_z``, ``projected_z``, ``draft_rest_z``, ``target_rest_z``); ``slope_x``,
    ``slope_y``, ``centre``, A, B, C, ``draft_z`` and ``target_z`` are recorded as deterministic
    sites with the meaning they have in :func:`model_effects_plane_model_for`.

    ``coefficient_prior_width`` multiplies the prior sds of the intercept and slopes, which live in
    ``S`` rather than in a site's distribution (:func:`widened_priors` sets it).

    Arguments: ``ppl_draft, ppl_target, weights`` per pair; ``draft`` (integer model of each pair)
    with ``draft_inside, draft_rest, draft_coefficients`` from :func:`effect_basis` on the
    standardised first feature; ``target`` and its basis likewise on the second; ``alpha``.
    """

    def model(ppl_draft, ppl_target, weights, draft, draft_inside, draft_rest, draft_coefficients, target,
              target_inside, target_rest, target_coefficients, alpha=None) -> None:
        u, v, scales = _feature_scales(acceptance_model, ppl_draft, ppl_target)
        u_mean, u_std, v_mean, v_std = scales
        slope_sd = acceptance_model.slope_prior_sd * coefficient_prior_width
        centre_mean, centre_sd = acceptance_model.centre_prior
        centre_sd = centre_sd * coefficient_prior_width
        sigma = numpyro.sample("sigma", dist.HalfNormal(acceptance_model.sigma_prior_sd))
        draft_sd = numpyro.sample("draft_sd", dist.HalfNormal(acceptance_model.effect_prior_sd))
        target_sd = numpyro.sample("target_sd", dist.HalfNormal(acceptance_model.effect_prior_sd))

        k_draft, k_target = draft_coefficients.shape[1], target_coefficients.shape[1]
        zero = jnp.zeros(k_draft + k_target)
        # E: the intercept and slope each projected effect adds to (centre, slope_x, slope_y).
        e = jnp.stack([jnp.concatenate([draft_coefficients[0], target_coefficients[0]]),
                       jnp.concatenate([draft_coefficients[1], zero[k_draft:]]),
                       jnp.concatenate([zero[:k_draft], target_coefficients[1]])])
        gamma_var = jnp.concatenate([jnp.full(k_draft, draft_sd**2), jnp.full(k_target, target_sd**2)])
        prior_mean = jnp.array([centre_mean, 0.0, 0.0])
        prior_var = jnp.array([centre_sd**2, slope_sd**2, slope_sd**2])

        with numpyro.plate("coefficients", 3):
            z_beta = numpyro.sample("coefficients_z", dist.Normal(0.0, 1.0))
        shifted = prior_mean + jnp.linalg.cholesky(jnp.diag(prior_var) + (e * gamma_var) @ e.T) @ z_beta
        precision = jnp.diag(1.0 / gamma_var) + (e.T / prior_var) @ e
        chol_precision = jnp.linalg.cholesky(precision)
        with numpyro.plate("projected_effects", k_draft + k_target):
            z_gamma = numpyro.sample("projected_z", dist.Normal(0.0, 1.0))
        conditional_mean = jax.scipy.linalg.cho_solve((chol_precision, True), e.T @ ((shifted - prior_mean) / prior_var))
        gamma = conditional_mean + jax.scipy.linalg.solve_triangular(chol_precision.T, z_gamma, lower=False)
        centre, slope_x, slope_y = shifted - e @ gamma

        effects = []
        for name, inside, rest, sd, g in (("draft", draft_inside, draft_rest, draft_sd, gamma[:k_draft]),
                                          ("target", target_inside, target_rest, target_sd, gamma[k_draft:])):
            effect = inside @ g
            if rest.shape[1]:
                with numpyro.plate(f"{name}_rest", rest.shape[1]):
                    effect = effect + sd * rest @ numpyro.sample(f"{name}_rest_z", dist.Normal(0.0, 1.0))
            numpyro.deterministic(f"{name}_z", effect / sd)
            effects.append(effect)

        for site, value in (("slope_x", slope_x), ("slope_y", slope_y), ("centre", centre)):
            numpyro.deterministic(site, value)
        A = numpyro.deterministic("A", slope_x / u_std)
        B = numpyro.deterministic("B", slope_y / v_std)
        numpyro.deterministic("C", centre - A * u_mean - B * v_mean)
        mean = _standardised_predictor(centre, slope_x, slope_y, u, v, scales) + effects[0][draft] + effects[1][target]
        scale = sigma / jnp.sqrt(weights / weights.mean())
        with numpyro.plate("pairs", ppl_draft.shape[0]):
            numpyro.sample("alpha_obs", acceptance_likelihood(acceptance_model, mean, scale), obs=alpha)

    model.__name__ = model.__qualname__ = f"projected_effects_plane_model[{acceptance_model.name}]"
    model.with_coefficient_prior_width = functools.partial(projected_effects_plane_model_for, acceptance_model)
    return model


plane_model = plane_model_for(PLANE)
"""The paper's plane on raw perplexities; see :func:`plane_model_for`."""


def _widened(fn: dist.Distribution, factor: float, site: str) -> dist.Distribution:
    """``fn`` with its spread multiplied by ``factor`` and its location kept."""
    if isinstance(fn, dist.ExpandedDistribution):
        return _widened(fn.base_dist, factor, site).expand(fn.batch_shape)
    if isinstance(fn, dist.Independent):
        return _widened(fn.base_dist, factor, site).to_event(fn.reinterpreted_batch_ndims)
    if isinstance(fn, (dist.Normal, dist.LogNormal)):  # LogNormal: twice as wide in log space
        return type(fn)(fn.loc, factor * fn.scale)
    if isinstance(fn, dist.HalfNormal):
        return dist.HalfNormal(factor * fn.scale)
    if isinstance(fn, dist.Gamma):  # mean c / r kept, sd sqrt(c) / r times factor
        return dist.Gamma(fn.concentration / factor**2, fn.rate / factor**2)
    if isinstance(fn, dist.Uniform):  # its lower end kept (a bound of the quantity: 0 for an exponent)
        return dist.Uniform(fn.low, fn.low + factor * (fn.high - fn.low))
    # A prior stated in other coordinates than sampled (after LogNormal, itself a transformed distribution).
    if isinstance(fn, dist.TransformedDistribution):
        return dist.TransformedDistribution(_widened(fn.base_dist, factor, site), fn.transforms)
    raise ValueError(f"prior of site {site!r}: cannot widen a {type(fn).__name__} (Normal, LogNormal, "
                     "HalfNormal, Gamma and Uniform priors can be)")


class _WidenPriors(numpyro.primitives.Messenger):
    def __init__(self, fn: Callable, factor: float):
        self.factor = factor
        super().__init__(fn)

    def process_message(self, msg):
        # Sites inside a plate are per-group effects in standard units (their scale is a prior, widened).
        if msg["type"] == "sample" and not msg["is_observed"] and not msg["cond_indep_stack"]:
            msg["fn"] = _widened(msg["fn"], self.factor, msg["name"])


@functools.lru_cache(maxsize=None)
def widened_priors(model: Callable, factor: float) -> Callable:
    """``model`` with every prior ``factor`` times as wide: the sensitivity of a decision to the priors.

    Every latent site outside a plate (the form's coefficients, the residual and effect scales, the
    Student-t's degrees of freedom) keeps its location and has its spread multiplied by
    ``factor``: a Normal's or HalfNormal's scale, a LogNormal's log-scale sd, a Gamma's sd (its
    mean kept), a Uniform's width (its lower end kept: the exponents' ``Uniform(0, 2)`` becomes
    ``Uniform(0, 4)``); a site sampled in other coordinates than its prior is stated in (a transformed
    distribution) has the stated prior widened. Per-group effects inside a plate are in standard
    units and stay as they are. The same callable is returned for the same ``(model, factor)``, so
    its sampler is compiled once.
    """
    if not factor > 0:
        raise ValueError(f"prior width factor must be positive, got {factor}")
    if factor == 1:
        return model
    if hasattr(model, "with_coefficient_prior_width"):  # priors held in a transform, not in sites
        model = model.with_coefficient_prior_width(float(factor))
    widened = _WidenPriors(model, float(factor))
    name = getattr(model, "__name__", "model")
    widened.__name__ = widened.__qualname__ = f"{name}[priors x{factor:g}]"
    return widened
