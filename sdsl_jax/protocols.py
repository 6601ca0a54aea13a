"""What each link of the chain must provide: the protocols a new law, acceptance model, cost or recipe meets.

The chain ``N -> L(N, D) -> perplexity -> alpha -> T`` takes its links as values (NamedTuples of
coefficients with a method), so a new form is one class anywhere, even in a notebook
(``tests/test_extending.py`` plugs a law, a cost and an acceptance model in from the test file). These
protocols state the method each link needs; they are ``runtime_checkable``, so
``isinstance(x, LossLawModel)`` checks that a value has it (not its signature or its maths).

* :class:`LossLawModel` -- ``loss(n_params, n_tokens)``: pre-training loss in nats
  (:mod:`sdsl_jax.loss_laws`); ``log_tokens_at_break()``, when present, gives ln D where the data
  term bends sharply, and the N* solve also searches each side of the draft trained on it.
* :class:`AcceptanceRateModel` -- ``rate(ppl_draft, ppl_target)``: acceptance alpha
  (:mod:`sdsl_jax.acceptance`).
* :class:`IterationCostModel` -- ``draft_step(n)`` and ``verification(m, k)``: the cost of one
  draft step and of verifying k tokens; ``affine(n, m)``, when present, gives the closed-form
  lookahead (:mod:`sdsl_jax.costs`).
* :class:`DraftRecipe` -- ``draft_tokens(n_params)``: the tokens D a draft of N parameters is trained
  on (:mod:`sdsl_jax.recipes`).

Every method takes and returns arrays and is traced by JAX (jit, vmap, grad): pure functions of the
coefficients, which may themselves be arrays (posterior draws broadcast).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
from jax.typing import ArrayLike

__all__ = ["LossLawModel", "AcceptanceRateModel", "IterationCostModel", "DraftRecipe"]


@runtime_checkable
class LossLawModel(Protocol):
    def loss(self, n_params: ArrayLike, n_tokens: ArrayLike) -> jax.Array:
        """Pre-training loss L(N, D) in nats per token."""
        ...


@runtime_checkable
class AcceptanceRateModel(Protocol):
    def rate(self, ppl_draft: ArrayLike, ppl_target: ArrayLike) -> jax.Array:
        """Acceptance alpha of a draft/target pair from their perplexities x, y."""
        ...


@runtime_checkable
class IterationCostModel(Protocol):
    def draft_step(self, n: ArrayLike) -> jax.Array:
        """Cost of one draft forward pass of a model of ``n`` parameters."""
        ...

    def verification(self, m: ArrayLike, k: ArrayLike) -> jax.Array:
        """Cost of one target pass of a model of ``m`` parameters verifying ``k`` tokens."""
        ...


@runtime_checkable
class DraftRecipe(Protocol):
    def draft_tokens(self, n_params: ArrayLike) -> jax.Array:
        """Training tokens D of a draft of ``n_params`` parameters."""
        ...
