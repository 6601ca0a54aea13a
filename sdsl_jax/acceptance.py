"""Acceptance: models of alpha from the two perplexities, and estimators of alpha from runs.

An *acceptance model* is a NamedTuple of coefficients with a ``rate(ppl_draft, ppl_target)``
method; its :class:`AcceptanceModel` family says how to fit and sample it. Shipped models are
linear in their coefficients over two features of the perplexities, ``alpha = A f(x) + B f(y) + C``,
so the point fit is weighted least squares in closed form and the priors are stated once, on
standardised features:

* ``plane`` (default, :data:`SDSL2026`): the paper's plane on raw perplexities [SDSL 2026,
  arXiv 2603.11053], ``alpha = A x + B y + C`` (x, y: draft and target perplexity on HellaSwag).
* ``log-plane``: the plane on losses, ``alpha = A ln x + B ln y + C``.
* ``logit-plane``: the plane on losses through a logit link, ``logit alpha = A ln x + B ln y + C``:
  alpha saturates towards 1 as the draft nears the target (no plane can), and is a probability
  for every pair.

Each model has a *link*: its linear predictor ``eta = A u + B v + C`` (:meth:`predictor`) is alpha
itself (``identity``) or ``logit alpha`` (``logit``). A pair's residual lives where alpha can go:
Normal on the logit scale for the logit link, Normal truncated to [0, 1] for the identity link, so
the likelihood and every predictive draw (:func:`predictive_acceptance`) are probabilities. The
identity-link models' mean can still leave (0, 1) for pairs far from the data: only pairs with
``0 < alpha < 1`` are admissible, and the throughput model turns other values into NaN.

Estimators. ``accepted / drafted`` is NOT alpha (with alpha = 0.7, gamma = 5 it reads about 0.39).
With i.i.d. acceptance, the accepted count K of an iteration is a geometric variable truncated at
gamma; its maximum-likelihood estimate is ``sum K / (sum K + #iterations that hit a rejection)``.
The exact per-token rate along a text is ``1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))]``
[Leviathan et al. 2023, Cor. 3.6].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from sdsl_jax._arrays import as_float
from sdsl_jax.normal import truncated_normal_quantile

__all__ = [
    "AcceptancePlane",
    "LogPerplexityPlane",
    "LogitPlane",
    "AcceptanceModel",
    "PLANE",
    "LOG_PLANE",
    "LOGIT_PLANE",
    "ACCEPTANCE_MODELS",
    "SDSL2026",
    "ResidualAcceptance",
    "acceptance_rate",
    "predictive_acceptance",
    "acceptance_from_counts",
    "acceptance_from_distributions",
]


class AcceptancePlane(NamedTuple):
    """Coefficients of ``alpha = A x + B y + C`` (x, y: draft and target perplexity)."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike
    link = "identity"

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        return acceptance_rate(ppl_draft, ppl_target, self)

    predictor = rate


class LogPerplexityPlane(NamedTuple):
    """Coefficients of ``alpha = A ln x + B ln y + C``: the plane on losses (nats per token)."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike
    link = "identity"

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        return _loss_plane(self, ppl_draft, ppl_target)

    predictor = rate


class LogitPlane(NamedTuple):
    """Coefficients of ``logit alpha = A ln x + B ln y + C``: the plane on losses through a logit link."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike
    link = "logit"

    def predictor(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        """The linear predictor ``logit alpha``."""
        return _loss_plane(self, ppl_draft, ppl_target)

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        return jax.nn.sigmoid(self.predictor(ppl_draft, ppl_target))


def _loss_plane(coefficients, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
    """``A ln x + B ln y + C`` (NaN for a perplexity below 1)."""
    x, y, *coef = as_float(ppl_draft, ppl_target, *coefficients)
    ok = (x >= 1) & (y >= 1)
    lx, ly = jnp.log(jnp.where(ok, x, 1.0)), jnp.log(jnp.where(ok, y, 1.0))
    return jnp.where(ok, coef[0] * lx + coef[1] * ly + coef[2], jnp.nan)


def predictive_acceptance(model: Any, ppl_draft: ArrayLike, ppl_target: ArrayLike, *, shift: ArrayLike = 0.0,
                          z: ArrayLike | None = None, sigma: ArrayLike | None = None) -> jax.Array:
    """One predictive draw of a pair's alpha: the model's linear predictor, shifted, plus a residual.

    ``eta = model.predictor(x, y) + shift`` (``shift``: the draft's and target's model effects, on
    the link's scale); with a residual of scale ``sigma`` at the standard normal ``z``:

    * logit link: ``alpha = sigmoid(eta + sigma z)``;
    * identity link: the ``Normal(eta, sigma)`` draw truncated to [0, 1] at ``z``
      (:func:`sdsl_jax.normal.truncated_normal_quantile`; ``eta + sigma z`` far from the bounds).

    With ``sigma = 0`` it is the model's rate at ``eta`` (which, for the identity link, may leave
    (0, 1)); ``sigma=None`` (no residual) is the same without the truncated quantile in the program.
    A model without ``predictor``/``link`` (a user's) is taken as identity-linked on its ``rate``.
    """
    link = getattr(model, "link", "identity")
    if link not in ("identity", "logit"):
        raise ValueError(f"unknown acceptance link {link!r}: use 'identity' or 'logit'")
    predictor = getattr(model, "predictor", model.rate)
    eta, shift = as_float(predictor(ppl_draft, ppl_target), shift)
    eta = eta + shift
    if sigma is None:
        return jax.nn.sigmoid(eta) if link == "logit" else eta
    z, sigma = as_float(0.0 if z is None else z, sigma)
    if link == "logit":
        return jax.nn.sigmoid(eta + sigma * z)
    positive = sigma > 0
    bounded = truncated_normal_quantile(z, eta, jnp.where(positive, sigma, 1.0))
    return jnp.where(positive, bounded, eta)


class ResidualAcceptance(NamedTuple):
    """An acceptance model evaluated for models that deviate from the loss law: one predictive draw.

    A real draft and target do not sit on the law's curve: their log losses scatter around it
    (the loss law's residual, and a run's own offset), and a pair's acceptance scatters around the
    acceptance model. One posterior-predictive draw fixes those deviations::

        rate(x, y) = model.rate(x^exp(draft_log_loss), y^exp(target_log_loss)) + alpha

    (a perplexity ``exp L`` whose log loss moves by ``delta`` becomes ``exp(L e^delta) = x^(e^delta)``;
    the plus stands for :func:`predictive_acceptance`, which keeps the draw in [0, 1]).
    Being a pytree of arrays it goes through the N* solver and ``vmap`` like any acceptance model;
    with all offsets zero it is ``model``.

    Attributes:
      model: the acceptance model's coefficients (any model with ``rate``).
      draft_log_loss, target_log_loss: offsets of the draft's and the target's log loss.
      alpha: shift of the linear predictor (the draft's and target's model effects).
      alpha_z, alpha_sigma: the pair's residual, a standard normal draw and its scale
        (:func:`predictive_acceptance`: the draw stays in [0, 1]); None: no residual.
    """

    model: Any
    draft_log_loss: ArrayLike = 0.0
    target_log_loss: ArrayLike = 0.0
    alpha: ArrayLike = 0.0
    alpha_z: ArrayLike | None = None
    alpha_sigma: ArrayLike | None = None

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        x, y, dx, dy = as_float(ppl_draft, ppl_target, self.draft_log_loss, self.target_log_loss)
        return predictive_acceptance(self.model, x ** jnp.exp(dx), y ** jnp.exp(dy), shift=self.alpha,
                                     z=self.alpha_z, sigma=self.alpha_sigma)


@dataclasses.dataclass(frozen=True, eq=False)
class AcceptanceModel:
    """A family of acceptance models linear in their coefficients, ``alpha = A u + B v + C``.

    Attributes:
      name: the CLI name.
      params_type: NamedTuple ``(A, B, C)`` with a ``rate(ppl_draft, ppl_target)`` method.
      features: ``(ppl_draft, ppl_target) -> (u, v)``, the regressors.
      description: one line for ``--help`` and summaries.
      link: ``"identity"`` (the predictor is alpha; residual truncated to [0, 1]) or ``"logit"``.
      centre_prior: mean and sd of the predictor at the data's mean features (the link's scale).
      slope_prior_sd: sd of the change of the predictor per standard deviation of a feature.
      sigma_prior_sd, effect_prior_sd: half-normal scales of the residual and of the per-model
        effects, on the link's scale.
      effects_target_accept: NUTS's target acceptance for the model with per-model effects
        (:func:`sdsl_jax.infer.posterior.sample_plane`; without effects 0.9). The planes on raw
        perplexities and on losses sample their effects at 0.9 with no divergent transition on
        the factorial ladder's 180 pairs (35 drafts, 8 targets) in about 63 leapfrog steps per
        draw, half of what 0.99 takes; the logit-plane's effects diverge there at 0.9, and it keeps
        0.99 (``python -m experiments.bench --only accept``, ``docs/benchmarks.md``).
    """

    name: str
    params_type: type
    features: Callable[[Any, Any], tuple[Any, Any]]
    description: str = ""
    link: str = "identity"
    centre_prior: tuple[float, float] = (0.5, 0.5)
    slope_prior_sd: float = 0.5
    sigma_prior_sd: float = 0.2
    effect_prior_sd: float = 0.1
    effects_target_accept: float = 0.9

    def to_link(self, alpha: ArrayLike) -> jax.Array:
        """alpha on the predictor's scale (``logit alpha`` for the logit link)."""
        (a,) = as_float(alpha)
        return jnp.log(a) - jnp.log1p(-a) if self.link == "logit" else a

    def __repr__(self) -> str:
        return f"AcceptanceModel({self.name!r})"


PLANE = AcceptanceModel("plane", AcceptancePlane, lambda x, y: (x, y),
                        "alpha = A x + B y + C on raw perplexities (SDSL 2026; the paper's)")
LOG_PLANE = AcceptanceModel("log-plane", LogPerplexityPlane, lambda x, y: (jnp.log(x), jnp.log(y)),
                            "alpha = A ln x + B ln y + C (the plane on losses)")
# On the logit scale, alpha in [0.2, 0.9] spans 3.6; a residual of 0.03 at alpha = 0.7 is 0.14.
LOGIT_PLANE = AcceptanceModel("logit-plane", LogitPlane, lambda x, y: (jnp.log(x), jnp.log(y)),
                              "logit alpha = A ln x + B ln y + C (saturates towards 1, always a probability)",
                              link="logit", centre_prior=(0.5, 1.5), slope_prior_sd=2.0, sigma_prior_sd=1.0,
                              effect_prior_sd=0.5, effects_target_accept=0.99)
ACCEPTANCE_MODELS: dict[str, AcceptanceModel] = {m.name: m for m in (PLANE, LOG_PLANE, LOGIT_PLANE)}
"""The shipped acceptance models by name (the CLIs' ``--acceptance-model`` choices)."""


SDSL2026 = AcceptancePlane(A=-0.0067, B=0.01297, C=0.642)
"""SDSL (2026), arXiv 2603.11053: plane fitted on HellaSwag perplexities, R^2 = 0.602."""


def acceptance_rate(ppl_draft: ArrayLike, ppl_target: ArrayLike, plane: AcceptancePlane = SDSL2026) -> jax.Array:
    """Acceptance predicted by the plane, ``A x + B y + C``.

    Args:
      ppl_draft: draft perplexity x (>= 1).
      ppl_target: target perplexity y (>= 1).
      plane: coefficients (fields may be arrays that broadcast).

    Returns:
      The plane's value (not clipped to (0, 1)); NaN for a perplexity below 1.
    """
    x, y, *_ = as_float(ppl_draft, ppl_target, *plane)
    return jnp.where((x >= 1) & (y >= 1), plane.A * x + plane.B * y + plane.C, jnp.nan)


def acceptance_from_counts(accepted: ArrayLike, gamma: ArrayLike) -> jax.Array:
    """Maximum-likelihood alpha from accepted counts per iteration.

    An iteration drafting ``gamma`` tokens accepts ``K`` of them; ``K < gamma`` means it hit a
    rejection. Under i.i.d. acceptance the likelihood is ``alpha^sum(K) (1 - alpha)^R`` with R the
    number of iterations that hit a rejection, so ``alpha_hat = sum K / (sum K + R)``.

    Args:
      accepted: accepted draft tokens per iteration, shape ``(..., iterations)``.
      gamma: lookahead of each iteration (broadcast against ``accepted``).

    Returns:
      alpha_hat over the last axis (NaN when there is no data: no accepted token and no rejection).
    """
    k, gamma = as_float(accepted, gamma)
    rejected = (k < gamma).astype(k.dtype)
    total, r = k.sum(-1), rejected.sum(-1)
    return jnp.where(total + r > 0, total / jnp.where(total + r > 0, total + r, 1.0), jnp.nan)


def acceptance_from_distributions(p_target: ArrayLike, q_draft: ArrayLike) -> jax.Array:
    """Exact acceptance ``1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))]`` over positions.

    Args:
      p_target: target next-token probabilities, shape ``(..., positions, vocab)``.
      q_draft: draft next-token probabilities, same shape.

    Returns:
      The mean over positions of ``sum_x min(p, q)``, shape ``(...)``.

    References:
      Leviathan et al. (2023), Corollary 3.6.
    """
    return jnp.minimum(jnp.asarray(p_target), jnp.asarray(q_draft)).sum(-1).mean(-1)
