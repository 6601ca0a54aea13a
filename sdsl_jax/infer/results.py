"""Typed results of the fits: the point fit and the posterior of the chain's links."""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from sdsl_jax.acceptance import AcceptanceModel
from sdsl_jax.infer.posterior import Identification
from sdsl_jax.infer.sampler import Diagnostics, PosteriorRun
from sdsl_jax.loss_laws import LossLawFamily
from sdsl_jax.protocols import AcceptanceRateModel, LossLawModel

__all__ = [
    "PointFit",
    "Posterior",
    "PosteriorChecks",
]


class PointFit(NamedTuple):
    """Point estimates of the chain's fitted links.

    Attributes:
      law: the loss law (the family's law type).
      theta: the law in fitting coordinates (``family.theta_names``).
      objective: the summed Huber loss at ``theta``.
      converged: whether the best start stopped by a tolerance.
      family: the loss-law family.
      plane: the acceptance model's coefficients (fitted, or the paper's plane held fixed).
      acceptance_model: the acceptance model.
      plane_fitted: False when ``plane`` is the fixed preset (no acceptance data).
      plane_r_squared: weighted R^2 of the fitted acceptance model (NaN when fixed).
      not_unique: the law's fitting coordinates that differ between starts ending within
        ``NEAR_OPTIMUM`` of the best objective (by more than 0.05): the point fit is one of several
        near-equivalent optima there, which a machine's rounding can swap (trust the posterior).
    """

    law: LossLawModel
    theta: np.ndarray
    objective: float
    converged: bool
    family: LossLawFamily
    plane: AcceptanceRateModel
    acceptance_model: AcceptanceModel
    plane_fitted: bool
    plane_r_squared: float
    not_unique: tuple[str, ...] = ()


class PosteriorChecks(NamedTuple):
    """The diagnostics of a posterior's runs: the loss law's, and the acceptance model's where one
    was sampled (None when the plane is held fixed). :meth:`items` gives the runs made, by name."""

    loss_law: Diagnostics
    plane: Diagnostics | None = None

    def items(self) -> Iterator[tuple[str, Diagnostics]]:
        """``(name, diagnostics)`` of each run made, the loss law first."""
        return ((name, d) for name, d in zip(self._fields, self) if d is not None)

    @property
    def ok(self) -> bool:
        """Whether every run made passed its checks."""
        return all(d.ok for _, d in self.items())


class Posterior(NamedTuple):
    """Posterior draws of the chain's fitted links.

    Attributes:
      laws: loss-law draws (fields of shape ``(draws,)``).
      planes: acceptance-model draws, or the fixed plane when there are no acceptance data.
      law_run, plane_run: the NUTS runs (:class:`sdsl_jax.infer.sampler.PosteriorRun`; ``plane_run`` None
        when the plane is fixed).
      diagnostics: the checks of each run made (:class:`PosteriorChecks`).
      identification: :class:`sdsl_jax.infer.posterior.Identification` of the loss law's parameters
        (which ones the data do not pin down).
    """

    laws: LossLawModel
    planes: AcceptanceRateModel
    law_run: PosteriorRun
    plane_run: PosteriorRun | None
    diagnostics: PosteriorChecks
    identification: Identification | None = None
