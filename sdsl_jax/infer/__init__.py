"""Fitting the chain's links to data: point fits and Bayesian posteriors.

==========  ==========================================================================================
point       multi-start summed-Huber fits of loss laws, weighted least squares of acceptance models
models      the NumPyro models: loss-law families (rows i.i.d., or with per-run effects) and
            acceptance models (with or without per-model effects), with their priors
sampler     NUTS runs: compiled once per shape, progress, diagnostics (R-hat, ESS, divergences,
            tree depth), each chain started from its own prior draw
posterior   posteriors of the links (:func:`sample_loss_law`, :func:`sample_plane`), pointwise
            log-likelihoods, identification (prior-to-posterior contraction)
results     typed results: :class:`PointFit`, :class:`Posterior`, :class:`PosteriorChecks`
==========  ==========================================================================================

Every public name of the submodules is available here (``infer.sample_loss_law``). The point-fit
names come with the package; the NumPyro side is imported on first use, since NumPyro and ArviZ
take seconds to import and ``import sdsl_jax`` needs only the point fits.
"""

import importlib

from sdsl_jax.infer.point import *  # noqa: F401,F403
from sdsl_jax.infer.point import __all__ as _point_names

_ON_DEMAND = ("results", "models", "sampler", "posterior")


def __getattr__(name: str):
    if name in _ON_DEMAND:
        return importlib.import_module(f"{__name__}.{name}")
    for sub in _ON_DEMAND:
        module = importlib.import_module(f"{__name__}.{sub}")
        if name in module.__all__:
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    names = set(_point_names) | set(_ON_DEMAND) | {"point"}
    for sub in _ON_DEMAND:
        names |= set(importlib.import_module(f"{__name__}.{sub}").__all__)
    return sorted(names)
