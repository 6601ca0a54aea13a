"""Pre-training loss laws ``L(N, D)``: families, their fitting coordinates and priors, and presets.

A *law* is a NamedTuple of coefficient arrays with a ``loss(n_params, n_tokens)`` method (nats
per token); being a pytree it can be differentiated, vmapped over posterior draws or passed to
the N* solver as it is. A *family* (:class:`LossLawFamily`) says how to fit and sample a law:

* ``theta_names``: the fitting coordinates ``theta`` (unconstrained where the optimiser needs it,
  e.g. log-coefficients), which are also sites of the prior's trace;
* ``from_theta`` / ``to_theta``: ``theta`` (leading batch axes allowed) <-> law;
* ``log_loss(theta, log_n, log_d)``: log L in fitting coordinates, written stably (the fitters'
  residuals are ``log_loss - log L_observed``);
* ``start_grid``: starts of the multi-start fit, an array of rows ``theta`` or a function of the
  data ``(log_n, log_d, log_loss) -> array`` (for a break that must lie inside the data);
* ``prior(centre)``: inside a NumPyro model, the priors, returning ``theta``; ``centre``
  (:class:`DataCentre`) is the data's mean log N and log D, where a family states the priors of
  its terms (``A / N_ref^alpha`` rather than ``A``, see :func:`_power_terms_prior`). Every name of
  ``theta_names`` is a site of the trace (sampled, or ``numpyro.deterministic`` when the family
  samples another coordinate);
* ``min_sizes`` / ``min_budgets``: distinct model sizes N and token budgets D the data need before
  the law's N and D terms are identified (a term with k coefficients in one variable needs k + 1
  distinct values of it); :func:`sdsl_jax.infer.point.check_loss_law_data` refuses less;
* ``target_accept``: NUTS's target acceptance for this family's posterior (0.9; the one-break law's
  0.99: its break is sharp, f about 0.2 in ln D on the ladder, and the curvature there made NUTS
  diverge at 0.9 in most refits, ``docs/benchmarks.md``).
* ``prior_revision``: raised whenever the family's prior or the coordinates NUTS samples it in
  change, so that stored posteriors and calibration units are keyed by the prior and
  coordinates they were sampled under (:func:`prior_key`);
* ``uses_exponent_prior``: whether the family's prior takes :data:`EXPONENT_PRIOR` (Kaplan's law
  has exponent priors of its own): only then does that prior enter its key.

Shipped families (``FAMILIES`` maps their names to them):

========================  ===========================================================================
``chinchilla``            ``E + A / N^alpha + B / D^beta`` [Hoffmann et al. 2022, Approach 3]; the paper's
``kaplan``                ``((N_c / N)^(alpha_N / alpha_D) + D_c / D)^alpha_D`` [Kaplan et al. 2020, eq. 1.5]
``broken``                ``E + A / N^alpha + B D^-beta (1 + (D / D_b)^(1/f))^(-c f)``: one smooth break in D
                          [Caballero et al. 2022, "Broken Neural Scaling Laws", eq. 1 with n = 1]
``data``                  ``E + B / D^beta``: data only (a model size that does not matter)
========================  ===========================================================================

Adding a family is one file: a NamedTuple with ``loss`` and a :class:`LossLawFamily` (see
README, "Extending"); nothing in the solver, fitters or samplers changes.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float

__all__ = [
    "LossLaw",
    "KaplanLaw",
    "BrokenPowerLaw",
    "DataLaw",
    "LossLawFamily",
    "DataCentre",
    "prior_key",
    "same_prior_key",
    "CHINCHILLA",
    "KAPLAN",
    "BROKEN_POWER_LAW",
    "DATA_ONLY",
    "FAMILIES",
    "family_of",
    "HOFFMANN2022",
    "BESIROGLU2024",
    "KAPLAN2020",
    "EPOCH_GRID",
    "pretraining_loss",
    "perplexity",
    "loss_law_log_prediction",
    "law_from_theta",
    "theta_from_law",
]


def _positive_inputs(n_params: ArrayLike, n_tokens: ArrayLike, law) -> tuple[jax.Array, jax.Array, jax.Array, list]:
    """(n, d, ok, fields) in one float dtype, with n and d replaced by 1 where not positive."""
    n, d, *fields = as_float(n_params, n_tokens, *law)
    ok = (n > 0) & (d > 0)
    return jnp.where(ok, n, 1.0), jnp.where(ok, d, 1.0), ok, fields


class DataCentre(NamedTuple):
    """Where a family's priors place its terms: the data's mean log N and mean log D, and the span
    of log D (``log_d_low``, ``log_d_high``: smallest and largest) for a feature that must lie
    inside the data, such as the one-break law's break.

    A power-law term ``A / N^alpha`` written at ``N = 1`` puts its coefficient decades away from
    the data, on a ridge with the exponent (``log A = log(A / N_ref^alpha) + alpha log N_ref``):
    when the data do not pin ``alpha`` down, ``log A`` drifts with it to absurd values, and NUTS
    needs long trajectories to follow the ridge. Written at the data's centre, the term's size is
    what the data measure and the exponent keeps its own prior where the data are silent.
    """

    log_n: ArrayLike
    log_d: ArrayLike
    log_d_low: ArrayLike = float("nan")
    log_d_high: ArrayLike = float("nan")

    @classmethod
    def of(cls, log_n: ArrayLike, log_d: ArrayLike) -> "DataCentre":
        log_d = jnp.asarray(log_d)
        return cls(jnp.mean(jnp.asarray(log_n)), jnp.mean(log_d), jnp.min(log_d), jnp.max(log_d))


# --------------------------------------------------------------------------------------------
# Chinchilla [Hoffmann et al. 2022, Approach 3]: the paper's law.


class LossLaw(NamedTuple):
    """Chinchilla form ``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token).

    References:
      Hoffmann et al. (2022), "Training Compute-Optimal Large Language Models", eq. 2.
    """

    E: ArrayLike
    A: ArrayLike
    B: ArrayLike
    alpha: ArrayLike
    beta: ArrayLike

    def loss(self, n_params: ArrayLike, n_tokens: ArrayLike) -> jax.Array:
        n, d, ok, (E, A, B, alpha, beta) = _positive_inputs(n_params, n_tokens, self)
        loss = E + A * jnp.exp(-alpha * jnp.log(n)) + B * jnp.exp(-beta * jnp.log(d))
        return jnp.where(ok, loss, jnp.nan)


HOFFMANN2022 = LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
"""Hoffmann et al. (2022), "Training Compute-Optimal Large Language Models", arXiv 2203.15556,
Approach 3 (eq. 10). The preset SDSL starts from."""

BESIROGLU2024 = LossLaw(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
"""Besiroglu, Erdil, Barnett & You (2024), "Chinchilla Scaling: A replication attempt",
arXiv 2404.10102: refit of Approach 3 on the data read off Hoffmann et al.'s Figure 4
(``fits/data`` ships it) by Huber loss on log L."""


def loss_law_log_prediction(theta: jax.Array, log_n: jax.Array, log_d: jax.Array) -> jax.Array:
    """``log L_hat = LSE(a - alpha log N, b - beta log D, e)``, ``theta = (a, b, e, alpha, beta)``.

    References:
      Besiroglu et al. (2024), section 3: the Epoch replication's parameterisation.
    """
    a, b, e, alpha, beta = theta
    t1, t2 = a - alpha * log_n, b - beta * log_d
    # Written out rather than jax.nn.logsumexp over a stack: no stacked copy of the terms (faster).
    top = jnp.maximum(jnp.maximum(t1, t2), e)
    return top + jnp.log(jnp.exp(t1 - top) + jnp.exp(t2 - top) + jnp.exp(e - top))


def law_from_theta(theta: ArrayLike) -> LossLaw:
    """``(a, b, e, alpha, beta)`` -> ``LossLaw(E=e^e, A=e^a, B=e^b, alpha, beta)``."""
    a, b, e, alpha, beta = jnp.moveaxis(jnp.asarray(theta), -1, 0)
    return LossLaw(E=jnp.exp(e), A=jnp.exp(a), B=jnp.exp(b), alpha=alpha, beta=beta)


def theta_from_law(law: LossLaw) -> jax.Array:
    """``LossLaw`` -> ``(a, b, e, alpha, beta)`` = ``(log A, log B, log E, alpha, beta)``."""
    return jnp.stack([jnp.log(law.A), jnp.log(law.B), jnp.log(law.E), jnp.asarray(law.alpha), jnp.asarray(law.beta)])


EPOCH_GRID = np.array(
    [
        (a, b, e, alpha, beta)
        for alpha, beta, e, a, b in itertools.product(
            [0.0, 0.5, 1.0, 1.5, 2.0], [0.0, 0.5, 1.0, 1.5, 2.0], [-1.0, -0.5, 0.0, 0.5, 1.0],
            [0.0, 5.0, 10.0, 15.0, 20.0, 25.0], [0.0, 5.0, 10.0, 15.0, 20.0, 25.0],
        )
    ]
)
"""The Epoch replication's 4,500 starts, rows ``(a, b, e, alpha, beta)``."""


EXPONENT_PRIOR = ("uniform", 0.0, 2.0)
"""The prior on the Chinchilla-form exponents ``alpha`` and ``beta`` (Chinchilla, one-break and
data-only laws): ``Uniform(0, 2)``, as ``(distribution, low, high)``.

Flat over every exponent a loss law of this form has been fitted with: 0.28-0.37 for large
models (Hoffmann et al. 2022; Besiroglu et al. 2024), 0.72 and 0.65 for the factorial ladder's
small ones (``fits/ladder/fit``). A ladder identifies the N exponent weakly (it trades with the
N term's size), and N* for a small target lies below the smallest draft, where the N term is
extrapolated with that exponent: there the prior's shape, not only its range, decides the band.
A prior that falls with alpha over this range, as ``LogNormal(log 0.35, 1)`` does (its mode is
0.13), pulls a weakly identified exponent down, and a flatter N term makes small drafts look
better: N* bands sit below the truth. The well-specified control of
``docs/results/misspecified.md`` measures both priors on the same synthetic ladders.
"""


def _exponent_prior():
    import numpyro.distributions as dist

    _, low, high = EXPONENT_PRIOR
    return dist.Uniform(low, high)


def _power_terms_prior(centre: DataCentre) -> tuple[jax.Array, ...]:
    """``(a, b, e, alpha, beta)`` of the Chinchilla terms, their priors stated at the data's centre.

    * ``alpha, beta ~ Uniform(0, 2)`` (:data:`EXPONENT_PRIOR`): positive exponents, no
      preference among them; published values for large models are 0.28-0.37, small ladders are
      steeper (see :data:`EXPONENT_PRIOR` for why the prior is flat).
    * ``a_ref, b_ref ~ Normal(-1, 2)``: the log (in nats) of the N term ``A / N_ref^alpha`` and
      of the D term ``B / D_ref^beta`` at the data's centre ``log N_ref, log D_ref``
      (:class:`DataCentre`): each term between 0.007 and 20 nats at 95%. (Chinchilla's N term is
      0.36 nats at its data's centre, the D term 0.24; a small model ladder's are 0.01 to 1.)
      ``a = a_ref + alpha log N_ref`` and ``b = b_ref + beta log D_ref`` are recorded as
      deterministic sites.
    * ``e ~ Normal(0.5, 1)``: log E, E in [0.2, 12] nats at 95%; text entropy is O(1) nat.

    NUTS samples ``(e, a_ref, b_ref)`` in other coordinates of the same prior, the site
    ``level_and_slopes`` (:func:`_level_and_slopes`): the log of the three terms' sum at the
    centre, and the log of each term's slope at the centre relative to E, ``log(alpha A_ref /
    E)`` and ``log(beta B_ref / E)``. What a ladder pins down is the loss at its centre and how
    fast it falls there; a weakly identified exponent then moves along a straight line in these
    coordinates, where in ``(e, a_ref, alpha)`` it bends (a small alpha makes the N term a
    constant that trades with E along ``e^e + e^a_ref = const``), and NUTS diverges at the bend
    (``docs/benchmarks.md``, NUTS geometry). The map has unit Jacobian given the exponents, so
    the prior density of ``(e, a_ref, b_ref)`` is the one stated above; they, ``a`` and ``b``
    are recorded as deterministic sites.
    """
    import numpyro

    alpha = numpyro.sample("alpha", _exponent_prior())
    beta = numpyro.sample("beta", _exponent_prior())
    return _power_terms_at_centre(centre, alpha, beta)


def _power_terms_at_centre(centre: DataCentre, alpha, beta, *, d_term_factor=0.0) -> tuple[jax.Array, ...]:
    """``(a, b, e, alpha, beta)`` given the exponents: ``(e, a_ref, b_ref)`` with the priors of
    :func:`_power_terms_prior`, sampled as the site ``level_and_slopes``.

    ``d_term_factor``: the log of a factor that multiplies the D term at the centre (a function of
    sites sampled before), so that ``level_and_slopes`` holds the log of the D term the data see
    there, ``b_ref + d_term_factor``, instead of ``b_ref``. For a given factor that is a shift of
    ``b_ref``'s coordinate, unit Jacobian: the prior density of ``b_ref`` stays ``Normal(-1, 2)``
    (stated as ``Normal(-1 + d_term_factor, 2)`` on the shifted value)."""
    import numpyro
    import numpyro.distributions as dist

    loc = jnp.stack(jnp.broadcast_arrays(0.5, -1.0, -1.0 + d_term_factor), axis=-1)
    stated = dist.Normal(loc, jnp.array([1.0, 2.0, 2.0])).to_event(1)  # e, a_ref, b_ref (+ factor)
    to_sampled = _level_and_slopes(alpha, beta)
    y = numpyro.sample("level_and_slopes", dist.TransformedDistribution(stated, to_sampled),
                       infer={"coordinates_of": ("a_ref", "b_ref", "e")})
    e, a_ref, b_seen = jnp.moveaxis(to_sampled.inv(y), -1, 0)
    e = numpyro.deterministic("e", e)
    a_ref = numpyro.deterministic("a_ref", a_ref)
    b_ref = numpyro.deterministic("b_ref", b_seen - d_term_factor)
    a = numpyro.deterministic("a", a_ref + alpha * centre.log_n)
    b = numpyro.deterministic("b", b_ref + beta * centre.log_d)
    return a, b, e, alpha, beta


def _level_and_slopes(*exponents):
    """The NumPyro transform ``(e, t_1, ..., t_k) -> (LSE(e, t_1, ..., t_k), t_1 - e + log x_1, ...,
    t_k - e + log x_k)`` at given exponents ``x_i`` (arrays of the batch's shape): the log of the
    irreducible loss and of k power terms at the data's centre, to the log of their sum and the
    log of each term's slope relative to E. A bijection of R^(k+1) with unit Jacobian (the first row,
    the softmax weights, sums to 1 against the k differences), so a density in ``(e, t_1, ...,
    t_k)`` is the same number in the new coordinates."""
    return _level_and_slopes_type()(jnp.stack([jnp.log(x) for x in exponents], axis=-1))


@functools.cache
def _level_and_slopes_type():
    # Built on first use: the module imports NumPyro only where a prior is sampled.
    from numpyro.distributions import constraints
    from numpyro.distributions.transforms import Transform

    class LevelAndSlopes(Transform):
        domain = constraints.real_vector
        codomain = constraints.real_vector

        def __init__(self, log_exponents):
            self.log_exponents = log_exponents

        def __call__(self, x):
            level = jax.nn.logsumexp(x, axis=-1, keepdims=True)
            return jnp.concatenate([level, x[..., 1:] - x[..., :1] + self.log_exponents], axis=-1)

        def _inverse(self, y):
            u = y[..., 1:] - self.log_exponents
            e = y[..., :1] - jax.nn.logsumexp(jnp.concatenate([jnp.zeros_like(y[..., :1]), u], axis=-1), axis=-1,
                                              keepdims=True)
            return jnp.concatenate([e, e + u], axis=-1)

        def log_abs_det_jacobian(self, x, y, intermediates=None):
            return jnp.zeros(jnp.shape(x)[:-1])

    return LevelAndSlopes


def _chinchilla_prior(centre: DataCentre) -> jax.Array:
    """Priors of the Chinchilla law, weakly informative and stated where the data are
    (:func:`_power_terms_prior`); they contain every published fit by a wide margin."""
    return jnp.stack(_power_terms_prior(centre))


# --------------------------------------------------------------------------------------------
# Kaplan et al. (2020), eq. 1.5.


class KaplanLaw(NamedTuple):
    """``L(N, D) = ((N_c / N)^(alpha_N / alpha_D) + D_c / D)^alpha_D`` (no irreducible term).

    References:
      Kaplan et al. (2020), "Scaling Laws for Neural Language Models", arXiv 2001.08361, eq. 1.5.
    """

    N_c: ArrayLike
    D_c: ArrayLike
    alpha_N: ArrayLike
    alpha_D: ArrayLike

    def loss(self, n_params: ArrayLike, n_tokens: ArrayLike) -> jax.Array:
        n, d, ok, (n_c, d_c, alpha_n, alpha_d) = _positive_inputs(n_params, n_tokens, self)
        theta = jnp.stack(jnp.broadcast_arrays(jnp.log(n_c), jnp.log(d_c), alpha_n, alpha_d))
        return jnp.where(ok, jnp.exp(_kaplan_log_loss(theta, jnp.log(n), jnp.log(d))), jnp.nan)


KAPLAN2020 = KaplanLaw(N_c=8.8e13, D_c=5.4e13, alpha_N=0.076, alpha_D=0.095)
"""Kaplan et al. (2020), arXiv 2001.08361, eq. 1.5 and Table 2 (non-embedding parameters, WebText2
tokens, loss in nats)."""


def _kaplan_log_loss(theta, log_n, log_d):
    # log L = alpha_D * LSE((alpha_N / alpha_D)(log N_c - log N), log D_c - log D)
    log_nc, log_dc, alpha_n, alpha_d = theta
    return alpha_d * jnp.logaddexp(alpha_n / alpha_d * (log_nc - log_n), log_dc - log_d)


def _kaplan_from_theta(theta):
    log_nc, log_dc, alpha_n, alpha_d = jnp.moveaxis(jnp.asarray(theta), -1, 0)
    return KaplanLaw(N_c=jnp.exp(log_nc), D_c=jnp.exp(log_dc), alpha_N=alpha_n, alpha_D=alpha_d)


def _kaplan_to_theta(law):
    return jnp.stack([jnp.log(law.N_c), jnp.log(law.D_c), jnp.asarray(law.alpha_N), jnp.asarray(law.alpha_D)])


def _kaplan_prior(centre: DataCentre):
    """Kaplan's terms stated at the data's centre ``log N_ref, log D_ref`` (:class:`DataCentre`).

    * ``alpha_N, alpha_D ~ LogNormal(log 0.1, 1)`` (Kaplan: 0.076, 0.095).
    * ``l_N, l_D ~ Normal(1, 1)``: the log of the loss each term alone gives at the centre,
      ``l_N = log (N_c / N_ref)^alpha_N`` (the loss of a model of the data's typical size with
      unlimited data) and ``l_D = log (D_c / D_ref)^alpha_D``: between 0.4 and 20 nats at 95%.
      (Kaplan's law at a Chinchilla-sized centre gives 0.87 and 0.67.)
      ``log N_c = log N_ref + l_N / alpha_N`` and ``log D_c = log D_ref + l_D / alpha_D`` are
      recorded as deterministic sites: a scale far beyond the data trades off with its exponent
      along a ridge, the loss at the centre does not.
    """
    import numpyro
    import numpyro.distributions as dist

    alpha_n = numpyro.sample("alpha_N", dist.LogNormal(jnp.log(0.1), 1.0))
    alpha_d = numpyro.sample("alpha_D", dist.LogNormal(jnp.log(0.1), 1.0))
    l_n = numpyro.sample("l_N", dist.Normal(1.0, 1.0))
    l_d = numpyro.sample("l_D", dist.Normal(1.0, 1.0))
    log_nc = numpyro.deterministic("log_N_c", centre.log_n + l_n / alpha_n)
    log_dc = numpyro.deterministic("log_D_c", centre.log_d + l_d / alpha_d)
    return jnp.stack([log_nc, log_dc, alpha_n, alpha_d])


_KAPLAN_GRID = np.array(list(itertools.product(
    [10.0, 20.0, 30.0, 40.0], [10.0, 20.0, 30.0, 40.0], [0.05, 0.1, 0.3, 0.6], [0.05, 0.1, 0.3, 0.6])))


# --------------------------------------------------------------------------------------------
# A smoothly broken power law in D [Caballero et al. 2022] with Chinchilla's N term.


class BrokenPowerLaw(NamedTuple):
    """``L = E + A / N^alpha + B D^-beta (1 + (D / D_break)^(1/f))^(-c f)``.

    The data term bends smoothly at ``D_break`` from slope ``-beta`` to ``-(beta + c)`` in log-log,
    over a width set by ``f`` (smaller is sharper).

    References:
      Caballero, Gupta, Rish & Krueger (2022), "Broken Neural Scaling Laws", arXiv 2210.14891,
      eq. 1 with one break (n = 1), plus the N term of Hoffmann et al. (2022).
    """

    E: ArrayLike
    A: ArrayLike
    alpha: ArrayLike
    B: ArrayLike
    beta: ArrayLike
    D_break: ArrayLike
    c: ArrayLike
    f: ArrayLike

    def loss(self, n_params: ArrayLike, n_tokens: ArrayLike) -> jax.Array:
        n, d, ok, fields = _positive_inputs(n_params, n_tokens, self)
        theta = jnp.stack(jnp.broadcast_arrays(*_broken_theta_fields(BrokenPowerLaw(*fields))))
        return jnp.where(ok, jnp.exp(_broken_log_loss(theta, jnp.log(n), jnp.log(d))), jnp.nan)

    def log_tokens_at_break(self) -> jax.Array:
        """``ln D_break``. :func:`~sdsl_jax.optimum.solve_draft_size` also searches each side of the
        draft size a recipe trains on it: T can peak on both sides of a break."""
        return jnp.log(jnp.asarray(self.D_break))


_BROKEN_NAMES = ("a", "b", "e", "alpha", "beta", "log_d_break", "c", "log_f")


def _broken_log_loss(theta, log_n, log_d):
    a, b, e, alpha, beta, log_db, c, log_f = theta
    f = jnp.exp(log_f)
    # log of B D^-beta (1 + (D/D_b)^(1/f))^(-c f) = b - beta log D - c f softplus((log D - log D_b) / f)
    t2 = b - beta * log_d - c * f * jax.nn.softplus((log_d - log_db) / f)
    t1 = a - alpha * log_n
    top = jnp.maximum(jnp.maximum(t1, t2), e)
    return top + jnp.log(jnp.exp(t1 - top) + jnp.exp(t2 - top) + jnp.exp(e - top))


def _broken_theta_fields(law):
    return (jnp.log(law.A), jnp.log(law.B), jnp.log(law.E), jnp.asarray(law.alpha), jnp.asarray(law.beta),
            jnp.log(law.D_break), jnp.asarray(law.c), jnp.log(law.f))


def _broken_from_theta(theta):
    a, b, e, alpha, beta, log_db, c, log_f = jnp.moveaxis(jnp.asarray(theta), -1, 0)
    return BrokenPowerLaw(E=jnp.exp(e), A=jnp.exp(a), alpha=alpha, B=jnp.exp(b), beta=beta, D_break=jnp.exp(log_db),
                          c=c, f=jnp.exp(log_f))


def _broken_to_theta(law):
    return jnp.stack(_broken_theta_fields(law))


def _broken_grid(log_n, log_d, log_loss):
    """Chinchilla-like starts, with the break at the quartiles of the data's log D."""
    breaks = np.quantile(np.asarray(log_d), [0.25, 0.5, 0.75])
    return np.array([
        (a, b, e, alpha, beta, db, c, 0.0)
        for a, b, e, alpha, beta, db, c in itertools.product(
            [0.0, 5.0, 10.0, 15.0], [0.0, 5.0, 10.0, 15.0], [-1.0, 0.0, 0.5], [0.3, 1.0], [0.3, 1.0], breaks,
            [-0.5, 0.5])
    ])


def _broken_prior(centre: DataCentre):
    """Chinchilla's priors for (a, b, e, alpha, beta) (:func:`_power_terms_prior`, the D term's
    size stated before its break), and the break inside the data's span of D:

    * ``break_logit ~ Normal(0, 1.5)``: where the break lies between the smallest and largest
      log D of the data (``log_d_low``, ``log_d_high`` of :class:`DataCentre`), on the logit scale:
      ``log D_break = log_d_low + (log_d_high - log_d_low) sigmoid(break_logit)`` (recorded as the
      deterministic site ``log_d_break``), 95% between 5% and 95% of the span.
    * ``c ~ Normal(0, 1)``: the change of slope at the break (the slope after it is ``beta + c``).
    * ``log f ~ Normal(0, 1)``: the break's width in ln D (smaller is sharper).

    Why inside: the data say nothing about a break beyond them. Beyond their largest D the law
    is Chinchilla's wherever there are data, and ``c`` and ``f`` are the prior's alone, yet they
    set every extrapolation in D; below their smallest D, ``B``, ``c``, ``f`` and ``D_break``
    trade off along a ridge. On the factorial ladder a break anywhere (``log D_break ~
    Normal(18, 6)``) put 83-98% of the posterior's draws at NUTS's maximum tree depth, 13-19% of
    them with a data term that rises with D after the break; inside the span, half the steps per
    draw, 7-33% at the cap and 1-3% rising (``docs/benchmarks.md``). A law whose break lies beyond
    the data is Chinchilla's there, and Chinchilla's law is stacked beside this one.

    NUTS samples these priors in other coordinates, each a shift given the sites sampled before it
    (unit Jacobian, the same prior density): ``c`` as the site ``slope_after_break = beta + c ~
    Normal(beta, 1)``, the slope the data see after the break, and the D term in
    ``level_and_slopes`` as its size at the data's centre with the break's factor there,
    ``b_ref - c f softplus((log D_ref - log D_break) / f)`` (:func:`_power_terms_at_centre`). The
    data measure the slopes on either side of the break and the loss at their centre; in ``(c,
    b_ref)`` a move of the break or of its sharpness must be matched by both, along a curve
    (``docs/benchmarks.md``, the one-break law's coordinates).
    """
    import numpyro
    import numpyro.distributions as dist

    alpha = numpyro.sample("alpha", _exponent_prior())
    beta = numpyro.sample("beta", _exponent_prior())
    position = numpyro.sample("break_logit", dist.Normal(0.0, 1.5))
    log_db = numpyro.deterministic(
        "log_d_break", centre.log_d_low + (centre.log_d_high - centre.log_d_low) * jax.nn.sigmoid(position))
    slope_after = numpyro.sample("slope_after_break", dist.Normal(beta, 1.0),
                                 infer={"coordinates_of": ("c",)})
    c = numpyro.deterministic("c", slope_after - beta)
    log_f = numpyro.sample("log_f", dist.Normal(0.0, 1.0))
    f = jnp.exp(log_f)
    # log (1 + (D_ref / D_break)^(1/f))^(-c f), the break's factor on the D term at the centre
    break_factor = -c * f * jax.nn.softplus((centre.log_d - log_db) / f)
    a, b, e, alpha, beta = _power_terms_at_centre(centre, alpha, beta, d_term_factor=break_factor)
    return jnp.stack([a, b, e, alpha, beta, log_db, c, log_f])


# --------------------------------------------------------------------------------------------
# Data only.


class DataLaw(NamedTuple):
    """``L(N, D) = E + B / D^beta``: the loss depends on the training tokens only."""

    E: ArrayLike
    B: ArrayLike
    beta: ArrayLike

    def loss(self, n_params: ArrayLike, n_tokens: ArrayLike) -> jax.Array:
        n, d, ok, (E, B, beta) = _positive_inputs(n_params, n_tokens, self)
        return jnp.where(ok, E + B * jnp.exp(-beta * jnp.log(d)) + 0.0 * n, jnp.nan)


def _data_log_loss(theta, log_n, log_d):
    b, e, beta = theta
    return jnp.logaddexp(b - beta * log_d, e) + 0.0 * log_n


def _data_from_theta(theta):
    b, e, beta = jnp.moveaxis(jnp.asarray(theta), -1, 0)
    return DataLaw(E=jnp.exp(e), B=jnp.exp(b), beta=beta)


def _data_to_theta(law):
    return jnp.stack([jnp.log(law.B), jnp.log(law.E), jnp.asarray(law.beta)])


def _data_prior(centre: DataCentre):
    """Chinchilla's priors for b (stated at the data's centre, as ``b_ref``), e and beta
    (:func:`_power_terms_prior`), sampled as Chinchilla's are: ``(e, b_ref)`` as the site
    ``level_and_slopes``, the log loss at the centre and the log of the D term's slope there
    relative to E (:func:`_level_and_slopes`, unit Jacobian: the same prior)."""
    import numpyro
    import numpyro.distributions as dist

    beta = numpyro.sample("beta", _exponent_prior())
    stated = dist.Normal(jnp.array([0.5, -1.0]), jnp.array([1.0, 2.0])).to_event(1)  # e, b_ref
    to_sampled = _level_and_slopes(beta)
    y = numpyro.sample("level_and_slopes", dist.TransformedDistribution(stated, to_sampled),
                       infer={"coordinates_of": ("b_ref", "e")})
    e, b_ref = jnp.moveaxis(to_sampled.inv(y), -1, 0)
    e = numpyro.deterministic("e", e)
    b_ref = numpyro.deterministic("b_ref", b_ref)
    b = numpyro.deterministic("b", b_ref + beta * centre.log_d)
    return jnp.stack([b, e, beta])


_DATA_GRID = np.array(list(itertools.product(
    [0.0, 5.0, 10.0, 15.0, 20.0, 25.0], [-1.0, -0.5, 0.0, 0.5, 1.0], [0.0, 0.5, 1.0, 1.5, 2.0])))


# --------------------------------------------------------------------------------------------
# The protocol.


@dataclasses.dataclass(frozen=True, eq=False)
class LossLawFamily:
    """How a loss-law form is fitted and sampled (see the module docstring for each field).

    Families compare by identity, so they can key compilation caches.
    """

    name: str
    law_type: type
    theta_names: tuple[str, ...]
    from_theta: Callable[[ArrayLike], Any]
    to_theta: Callable[[Any], jax.Array]
    start_grid: np.ndarray | Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    prior: Callable[[DataCentre], jax.Array]
    log_loss: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None
    description: str = ""
    min_sizes: int = 0
    min_budgets: int = 0
    target_accept: float = 0.9
    prior_revision: int = 0
    uses_exponent_prior: bool = True

    def log_prediction(self, theta: jax.Array, log_n: jax.Array, log_d: jax.Array) -> jax.Array:
        """log L at ``theta``: the family's stable form, else ``log(law.loss(N, D))``."""
        if self.log_loss is not None:
            return self.log_loss(theta, log_n, log_d)
        return jnp.log(self.from_theta(theta).loss(jnp.exp(log_n), jnp.exp(log_d)))

    def starts(self, log_n, log_d, log_loss) -> np.ndarray:
        """The multi-start grid for these data (rows ``theta``)."""
        grid = self.start_grid(log_n, log_d, log_loss) if callable(self.start_grid) else self.start_grid
        return np.asarray(grid, np.float64)

    @property
    def num_params(self) -> int:
        return len(self.theta_names)

    def __repr__(self) -> str:
        return f"LossLawFamily({self.name!r})"


CHINCHILLA = LossLawFamily(
    name="chinchilla", law_type=LossLaw, theta_names=("a", "b", "e", "alpha", "beta"), from_theta=law_from_theta,
    to_theta=theta_from_law, start_grid=EPOCH_GRID, prior=_chinchilla_prior, log_loss=loss_law_log_prediction,
    description="E + A/N^alpha + B/D^beta (Hoffmann et al. 2022; the paper's law)", min_sizes=3, min_budgets=3,
    prior_revision=1)
KAPLAN = LossLawFamily(
    name="kaplan", law_type=KaplanLaw, theta_names=("log_N_c", "log_D_c", "alpha_N", "alpha_D"),
    from_theta=_kaplan_from_theta, to_theta=_kaplan_to_theta, start_grid=_KAPLAN_GRID, prior=_kaplan_prior,
    log_loss=_kaplan_log_loss, description="((N_c/N)^(alpha_N/alpha_D) + D_c/D)^alpha_D (Kaplan et al. 2020)",
    min_sizes=3, min_budgets=3, uses_exponent_prior=False)
BROKEN_POWER_LAW = LossLawFamily(
    name="broken", law_type=BrokenPowerLaw, theta_names=_BROKEN_NAMES, from_theta=_broken_from_theta,
    to_theta=_broken_to_theta, start_grid=_broken_grid, prior=_broken_prior, log_loss=_broken_log_loss,
    description="E + A/N^alpha + B D^-beta (1 + (D/D_b)^(1/f))^(-c f) (one break in D, Caballero et al. 2022)",
    min_sizes=3, min_budgets=6, target_accept=0.99, prior_revision=3)
DATA_ONLY = LossLawFamily(
    name="data", law_type=DataLaw, theta_names=("b", "e", "beta"), from_theta=_data_from_theta,
    to_theta=_data_to_theta, start_grid=_DATA_GRID, prior=_data_prior, log_loss=_data_log_loss,
    description="E + B/D^beta (no model-size term)", min_budgets=3, prior_revision=1)

FAMILIES: dict[str, LossLawFamily] = {f.name: f for f in (CHINCHILLA, KAPLAN, BROKEN_POWER_LAW, DATA_ONLY)}
"""The shipped loss-law families by name (the CLIs' ``--law`` choices)."""


def prior_key(families) -> dict:
    """The priors of ``families`` as a part of a stored result's key (JSON-ready): the exponents'
    prior (:data:`EXPONENT_PRIOR`) where some family uses it, and each family's ``prior_revision``
    where it has one, so a posterior, closure or calibration unit sampled under other priors is
    never reused as this one's. Revision 0 (a family's original prior) adds nothing; the key of
    families that use neither (Kaplan's law; none, for an acceptance model alone) is empty."""
    families = list(families)
    revisions = {f.name: f.prior_revision for f in families if f.prior_revision}
    exponents = any(f.uses_exponent_prior for f in families)
    return dict(**(dict(exponent_prior=list(EXPONENT_PRIOR)) if exponents else {}),
                **(dict(prior_revisions=revisions) if revisions else {}))


def same_prior_key(stored: dict, current: dict) -> bool:
    """Whether a stored key (a dict holding :func:`prior_key`'s fields among others) is ``current``.

    Keys written before :func:`prior_key` left out the exponents' prior for families that do not
    use it name that prior all the same; where ``current`` has none, a stored one is ignored: it
    never entered the posterior."""
    if isinstance(stored, dict) and isinstance(current, dict) and "exponent_prior" not in current:
        stored = {k: v for k, v in stored.items() if k != "exponent_prior"}
    return stored == current


def family_of(law) -> LossLawFamily:
    """The shipped family whose law type ``law`` is; a clear error for any other type."""
    for family in FAMILIES.values():
        if isinstance(law, family.law_type):
            return family
    raise TypeError(f"{type(law).__name__} is not the law of a shipped family; pass its LossLawFamily explicitly")


def pretraining_loss(n_params: ArrayLike, n_tokens: ArrayLike, law: Any = HOFFMANN2022) -> jax.Array:
    """Final pre-training loss ``L(N, D)`` in nats per token, for any law (``law.loss(N, D)``).

    Args:
      n_params: model size N (parameters), > 0.
      n_tokens: training tokens D, > 0.
      law: the coefficients (a law NamedTuple; fields may be arrays that broadcast).

    Returns:
      The loss, broadcast over the inputs; NaN for non-positive N or D.

    References:
      Hoffmann et al. (2022), eq. 2 and Approach 3 (the default law's form).
    """
    return law.loss(n_params, n_tokens)


def perplexity(n_params: ArrayLike, n_tokens: ArrayLike, law: Any = HOFFMANN2022) -> jax.Array:
    """Perplexity ``exp(L(N, D))`` predicted by the loss law."""
    return jnp.exp(pretraining_loss(n_params, n_tokens, law))
