"""Acceptance: models of alpha from the two perplexities, and estimators of alpha from runs.

An *acceptance model* is a NamedTuple of coefficients with a ``rate(ppl_draft, ppl_target)``
method; its :class:`AcceptanceModel` family says how to fit and sample it. Shipped models are
linear in their coefficients over two features of the perplexities, ``alpha = A f(x) + B f(y) + C``,
so the point fit is weighted least squares in closed form and the priors are stated once, on
standardised features:

* ``plane`` (default, :data:`SDSL2026`): the paper's plane on raw perplexities [SDSL 2026,
  arXiv 2603.11053], ``alpha = A x + B y + C`` (x, y: draft and target perplexity on HellaSwag).
* ``log-plane``: the plane on losses, ``alpha = A ln x + B ln y + C``.

Only pairs with ``0 < alpha < 1`` are admissible; the models return whatever value they give,
the throughput model turns inadmissible values into NaN.

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

__all__ = [
    "AcceptancePlane",
    "LogPerplexityPlane",
    "AcceptanceModel",
    "PLANE",
    "LOG_PLANE",
    "ACCEPTANCE_MODELS",
    "SDSL2026",
    "ResidualAcceptance",
    "acceptance_rate",
    "acceptance_from_counts",
    "acceptance_from_distributions",
]


class AcceptancePlane(NamedTuple):
    """Coefficients of ``alpha = A x + B y + C`` (x, y: draft and target perplexity)."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        return acceptance_rate(ppl_draft, ppl_target, self)


class LogPerplexityPlane(NamedTuple):
    """Coefficients of ``alpha = A ln x + B ln y + C``: the plane on losses (nats per token)."""

    A: ArrayLike
    B: ArrayLike
    C: ArrayLike

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        x, y, *coef = as_float(ppl_draft, ppl_target, *self)
        ok = (x >= 1) & (y >= 1)
        lx, ly = jnp.log(jnp.where(ok, x, 1.0)), jnp.log(jnp.where(ok, y, 1.0))
        return jnp.where(ok, coef[0] * lx + coef[1] * ly + coef[2], jnp.nan)


class ResidualAcceptance(NamedTuple):
    """An acceptance model evaluated for models that deviate from the loss law: one predictive draw.

    A real draft and target do not sit on the law's curve: their log losses scatter around it
    (the loss law's residual, and a run's own offset), and a pair's acceptance scatters around the
    acceptance model. One posterior-predictive draw fixes those deviations::

        rate(x, y) = model.rate(x^exp(draft_log_loss), y^exp(target_log_loss)) + alpha

    (a perplexity ``exp L`` whose log loss moves by ``delta`` becomes ``exp(L e^delta) = x^(e^delta)``).
    Being a pytree of arrays it goes through the N* solver and ``vmap`` like any acceptance model;
    with all offsets zero it is ``model``.

    Attributes:
      model: the acceptance model's coefficients (any model with ``rate``).
      draft_log_loss, target_log_loss: offsets of the draft's and the target's log loss.
      alpha: offset of the acceptance (the acceptance model's residual).
    """

    model: Any
    draft_log_loss: ArrayLike = 0.0
    target_log_loss: ArrayLike = 0.0
    alpha: ArrayLike = 0.0

    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        x, y, dx, dy, da = as_float(ppl_draft, ppl_target, self.draft_log_loss, self.target_log_loss, self.alpha)
        return self.model.rate(x ** jnp.exp(dx), y ** jnp.exp(dy)) + da


@dataclasses.dataclass(frozen=True, eq=False)
class AcceptanceModel:
    """A family of acceptance models linear in their coefficients, ``alpha = A u + B v + C``.

    Attributes:
      name: the CLI name.
      params_type: NamedTuple ``(A, B, C)`` with a ``rate(ppl_draft, ppl_target)`` method.
      features: ``(ppl_draft, ppl_target) -> (u, v)``, the regressors.
      description: one line for ``--help`` and summaries.
    """

    name: str
    params_type: type
    features: Callable[[Any, Any], tuple[Any, Any]]
    description: str = ""

    def __repr__(self) -> str:
        return f"AcceptanceModel({self.name!r})"


PLANE = AcceptanceModel("plane", AcceptancePlane, lambda x, y: (x, y),
                        "alpha = A x + B y + C on raw perplexities (SDSL 2026; the paper's)")
LOG_PLANE = AcceptanceModel("log-plane", LogPerplexityPlane, lambda x, y: (jnp.log(x), jnp.log(y)),
                            "alpha = A ln x + B ln y + C (the plane on losses)")
ACCEPTANCE_MODELS: dict[str, AcceptanceModel] = {m.name: m for m in (PLANE, LOG_PLANE)}
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
