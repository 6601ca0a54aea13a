"""Posteriors of the chain's fitted links: NUTS on the models of :mod:`sdsl_jax.infer.models`.

:func:`sample_loss_law` and :func:`sample_plane` start every chain from its own prior draw and
return a checked :class:`~sdsl_jax.infer.sampler.PosteriorRun`; :func:`laws_from_posterior` and
:func:`planes_from_posterior` turn its draws into the chain's law and acceptance types (fields
of shape ``(draws,)``); the pointwise log-likelihoods feed model comparison
(:mod:`sdsl_jax.compare`); :func:`identification` says which parameters the data pin down.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.util
from jax.typing import ArrayLike

from sdsl_jax.acceptance import PLANE, AcceptanceModel
from sdsl_jax.infer.models import (EFFECT_SIDES, PLANE_SITES, CoefficientFrame, check_coefficient_coordinates,
                                   coefficient_frame, dispersed_about_frame, effect_basis, effect_scale_sites,
                                   effect_sides_of, feature_scale, loss_law_model_for, loss_law_sites,
                                   model_effects_plane_model_for, plane_model_for, projected_effects_plane_model_for,
                                   run_effects_model_for, widened_priors)
from sdsl_jax.infer.sampler import PosteriorRun, az, prior_starts, run_nuts
from sdsl_jax.loss_laws import CHINCHILLA, DataCentre, LossLawFamily



__all__ = [
    "sample_loss_law",
    "loss_law_numpyro_model",
    "rerun_until_checked",
    "DATA_CENTRE_KEYS",
    "pointwise_log_likelihood",
    "Identification",
    "identification",
    "sample_plane",
    "plane_target_accept",
    "acceptance_numpyro_model",
    "EFFECT_PARAMETRISATIONS",
    "acceptance_pointwise_log_likelihood",
    "laws_from_posterior",
    "planes_from_posterior",
    "save_inference_data",
]


def _group_index(index: ArrayLike, shape: tuple, message: str) -> np.ndarray:
    """A random effect's group of each row, checked: one non-negative integer per row (else ``message``)."""
    index = np.asarray(index)
    if index.shape != shape or not np.issubdtype(index.dtype, np.integer) or index.min(initial=0) < 0:
        raise ValueError(message)
    return index


DATA_CENTRE_KEYS = ("centre_log_n", "centre_log_d", "low_log_d", "high_log_d")
"""The entries of a loss-law posterior's samples that hold the data's centre (not sites)."""


def sample_loss_law(
    n_params: ArrayLike,
    n_tokens: ArrayLike,
    loss: ArrayLike,
    *,
    family: LossLawFamily = CHINCHILLA,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 500,
    seed: int = 0,
    run: ArrayLike | None = None,
    progress_bar: bool = True,
    target_accept: float | None = None,
    summarize: bool = True,
    progress: Callable[[str], None] | None = None,
    dense_mass: bool = True,
    retries: int = 0,
    prior_width: float = 1.0,
) -> PosteriorRun:
    """NUTS posterior of a loss-law ``family`` on runs (N, D, L), every chain started from the prior.

    No chain starts at a point fit: a point fit can sit at a degenerate optimum (a coefficient
    in the 1e200s whose term switches on for one size), and chains started together there agree
    by construction (:func:`~sdsl_jax.infer.sampler.prior_starts`).

    ``run`` (an integer per row, e.g. :meth:`sdsl_jax.data.PretrainingRuns.run_index`) selects
    the hierarchical model with per-run effects (:func:`run_effects_model_for`); None keeps rows
    independent. The samples also hold ``centre_log_n`` and ``centre_log_d``, the data's centre
    where the priors are stated (:class:`~sdsl_jax.loss_laws.DataCentre`; ``centre_log_d`` is
    also the run effects' centre, for :func:`new_run_offsets`).
    ``summarize=False`` skips the ArviZ conversion and diagnostics (``inference_data`` and
    ``diagnostics`` are then None): for loops over many small fits such as calibration.
    ``progress`` receives a line after the warm-up and after each fifth of the draws (draws done,
    time left); the draws are the same with or without it.

    ``target_accept`` None: the family's (:attr:`~sdsl_jax.loss_laws.LossLawFamily.target_accept`).
    ``dense_mass`` (default): NUTS adapts a full mass matrix. A law's coefficients stay
    correlated even at the data's centre (the irreducible loss with both terms), which a diagonal
    metric can only follow with long trajectories (:attr:`Diagnostics.median_steps`;
    ``docs/results/chinchilla_reference.md`` has the comparison).

    ``retries``: how many times a run that fails its checks is run again, longer
    (:func:`rerun_until_checked`); 0, one run whatever its checks say. ``prior_width``: every
    prior that many times as wide (:func:`~sdsl_jax.infer.models.widened_priors`), to see how much
    a result owes to the priors.
    """
    log_n, log_d, log_loss = (jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens, loss))
    model, args = loss_law_numpyro_model(family, n_params, n_tokens, run=run)
    args = (*args, log_loss)

    out = _sample_checked(model, args, var_names=loss_law_sites(family, run_effects=run is not None),
                          dense_mass=dense_mass, num_chains=num_chains,
                          target_accept=family.target_accept if target_accept is None else target_accept,
                          num_warmup=num_warmup, num_samples=num_samples, seed=seed, retries=retries,
                          progress_bar=progress_bar, summarize=summarize, progress=progress,
                          prior_width=prior_width)
    out.samples.update(zip(DATA_CENTRE_KEYS, (np.asarray(float(c)) for c in DataCentre.of(log_n, log_d))))
    return out


def _sample_checked(model: Callable, args: tuple, *, var_names, dense_mass: bool, target_accept: float,
                    num_chains: int, num_warmup: int, num_samples: int, seed: int, retries: int,
                    progress_bar: bool, summarize: bool, progress, prior_width: float = 1.0,
                    starts: Callable[[Callable], Callable] | None = None) -> PosteriorRun:
    """NUTS on ``model(*args)`` from prior starts (or from ``starts(model)``'s draws), rerun while its
    checks fail (:func:`rerun_until_checked`)."""
    model = widened_priors(model, prior_width)
    start_model = model if starts is None else starts(model)

    def attempt(warmup, draws, accept, attempt_seed):
        return run_nuts(model, args, init_params=prior_starts(start_model, args, num_chains, attempt_seed),
                        var_names=var_names, num_chains=num_chains, num_warmup=warmup, num_samples=draws,
                        seed=attempt_seed, progress_bar=progress_bar, target_accept=accept, summarize=summarize,
                        dense_mass=dense_mass, progress=progress)

    return rerun_until_checked(attempt, num_warmup=num_warmup, num_samples=num_samples, target_accept=target_accept,
                               seed=seed, retries=retries, progress=progress)


def rerun_until_checked(attempt: Callable[[int, int, float, int], PosteriorRun], *, num_warmup: int,
                        num_samples: int, target_accept: float, seed: int, retries: int,
                        progress: Callable[[str], None] | None = None) -> PosteriorRun:
    """``attempt(warmup, draws, target_accept, seed)``, run again while its checks fail, at most
    ``retries`` more times, each time from new prior starts with twice the warm-up and the draws
    (too few effective draws is the commonest failure) and a higher target acceptance (smaller
    steps, fewer divergences). The last run is returned: its diagnostics say whether it passed,
    and a form whose posterior still fails gets no weight in stacking (:mod:`sdsl_jax.compare`).
    """
    out = attempt(num_warmup, num_samples, target_accept, seed)
    for k in range(1, retries + 1):
        if out.diagnostics is None or out.diagnostics.ok:
            break
        warmup_k, samples_k, accept_k, seed_k = rerun_settings(k, num_warmup=num_warmup, num_samples=num_samples,
                                                               target_accept=target_accept, seed=seed)
        if progress is not None:
            progress(f"failed its checks ({'; '.join(out.diagnostics.problems)}): run again from new starts, "
                     f"{warmup_k} warm-up + {samples_k} draws per chain, target acceptance {accept_k:.3f}")
        out = attempt(warmup_k, samples_k, accept_k, seed_k)
        out = out._replace(diagnostics=out.diagnostics._replace(attempts=k + 1))
    return out


def rerun_settings(k: int, *, num_warmup: int, num_samples: int, target_accept: float,
                   seed: int) -> tuple[int, int, float, int]:
    """The ``k``-th rerun's warm-up, draws, target acceptance and seed (:func:`rerun_until_checked`):
    2^k times the warm-up and draws, the distance of the target acceptance from 1 halved k times,
    new starts from ``seed + 1000 k``."""
    return num_warmup * 2 ** k, num_samples * 2 ** k, 1.0 - (1.0 - target_accept) / 2 ** k, seed + 1000 * k


def loss_law_numpyro_model(family: LossLawFamily, n_params: ArrayLike, n_tokens: ArrayLike, *,
                           run: ArrayLike | None = None) -> tuple[Callable, tuple]:
    """The NumPyro model :func:`sample_loss_law` samples for runs (N, D), and its arguments before the
    observed ``log_loss``: the design, for prior-predictive simulation (calibration) and likelihoods."""
    log_n, log_d = (jnp.log(jnp.asarray(v, jnp.float64)) for v in (n_params, n_tokens))
    if run is None:
        return loss_law_model_for(family), (log_n, log_d)
    run = _group_index(run, np.shape(log_n), "run must hold one non-negative integer per row "
                                             "(PretrainingRuns.run_index())")
    return run_effects_model_for(family), (log_n, log_d, jnp.asarray(run), jnp.zeros(int(run.max(initial=-1)) + 1))


def pointwise_log_likelihood(samples: dict[str, np.ndarray], family: LossLawFamily, n_params: ArrayLike,
                             n_tokens: ArrayLike, loss: ArrayLike, *, run: ArrayLike | None = None) -> np.ndarray:
    """log p(log L_i | draw) for every posterior draw and row, shape ``(draws, rows)``.

    The model is the one :func:`sample_loss_law` sampled (with per-run effects when ``run`` is
    given, each row then conditioned on its run's own effects). Input of PSIS-LOO and stacking.
    """
    model, args = loss_law_numpyro_model(family, n_params, n_tokens, run=run)
    log_loss = jnp.log(jnp.asarray(loss, jnp.float64))
    sites = {k: jnp.asarray(v).reshape(-1, *np.shape(v)[1:]) for k, v in samples.items()
             if k not in DATA_CENTRE_KEYS}
    with jax.numpy_dtype_promotion("standard"):
        ll = numpyro.infer.log_likelihood(model, sites, *args, log_loss=log_loss)["log_loss"]
    return np.asarray(ll)


class Identification(NamedTuple):
    """How much the data identify each parameter of a posterior.

    Attributes:
      names: the parameters (the sampled sites of the family's prior).
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
    than 10% of its prior variance. Both are computed in the coordinates where the family
    states its prior (its sampled sites: a term's size at the data's centre, ``a_ref``, rather
    than its coefficient at ``N = 1``), at the centre the posterior was sampled at
    (``samples["centre_log_n"]``, ``samples["centre_log_d"]``).
    """
    centre = DataCentre(*(float(np.asarray(samples.get(k, np.nan))) for k in DATA_CENTRE_KEYS))
    draws = numpyro.infer.Predictive(family.prior, num_samples=num_prior, parallel=True)(jax.random.PRNGKey(seed),
                                                                                        centre)
    names = _prior_sites(family, centre)
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


def _prior_sites(family: LossLawFamily, centre: DataCentre) -> tuple[str, ...]:
    """The parameters a family's prior states, in the order it samples them: its sampled sites, each
    sampled in other coordinates replaced by the deterministic sites it stands for (its
    ``infer={"coordinates_of": names}``)."""
    with numpyro.handlers.trace() as trace, numpyro.handlers.seed(rng_seed=0):
        family.prior(centre)
    names = []
    for k, site in trace.items():
        if site["type"] == "sample":
            names.extend((site.get("infer") or {}).get("coordinates_of", (k,)))
    return tuple(names)


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
    retries: int = 0,
    prior_width: float = 1.0,
    effects: str = "non-centred",
    effect_sides: tuple[str, ...] = EFFECT_SIDES,
    coefficients: str = "prior-scaled",
) -> PosteriorRun:
    """NUTS posterior of an acceptance model (see :func:`plane_model_for`), every chain started
    from the prior; ``summarize``, ``progress``, ``retries`` and ``prior_width`` as in
    :func:`sample_loss_law`.

    ``draft`` and ``target`` (an integer model per pair, e.g.
    :meth:`sdsl_jax.data.AcceptanceMeasurements.model_index`) select the model with a random
    effect per draft and per target model (:func:`model_effects_plane_model_for`); None keeps
    pairs independent. That model runs NUTS with a dense mass matrix and ``target_accept``
    ``model.effects_target_accept`` by default (0.9 otherwise): a draft's effect and the
    coefficient of its perplexity are correlated (each draft model has one perplexity), which a
    diagonal metric mixes slowly; the logit-plane's effects need smaller steps than the planes'
    to avoid divergences (:class:`~sdsl_jax.acceptance.AcceptanceModel`).

    ``effects`` chooses the coordinates of that model: ``"non-centred"`` (one standard normal per
    model, :func:`model_effects_plane_model_for`) or ``"projected"``, the same prior with each
    model's effect split into the part a coefficient can absorb and the rest
    (:func:`projected_effects_plane_model_for`), which spares NUTS the ridge between them
    (``python -m experiments.bench --only geometry``). ``effect_sides``: the kinds of model that get
    effects (``("draft",)`` where the targets are too few,
    :meth:`sdsl_jax.data.AcceptanceMeasurements.model_effects_identified`); non-centred only.

    ``coefficients`` chooses the coordinates of the intercept and the two slopes: ``"prior-scaled"``
    (standardised features, each coefficient a site with its stated prior) or ``"data-scaled"``, the
    same prior and posterior with the coefficients sampled about their least-squares fit in units
    of its standard errors (:func:`~sdsl_jax.infer.models.coefficient_frame`; not with projected
    effects), each chain started with its coefficients from ``Normal(0, 3)`` in those units and its
    other sites from their priors (:func:`~sdsl_jax.infer.models.dispersed_about_frame`).
    """
    check_coefficient_coordinates(coefficients)
    frame = None
    if coefficients == "data-scaled":
        if effects != "non-centred" and draft is not None:
            raise ValueError("coefficients='data-scaled' samples non-centred effects; use effects='non-centred'")
        drafts = 1 if draft is None else len(np.unique(np.asarray(draft)))
        frame = coefficient_frame(model, ppl_draft, ppl_target, alpha, weights=weights,
                                  pairs_per_model=np.size(alpha) / drafts)
    numpyro_model, args = acceptance_numpyro_model(model, ppl_draft, ppl_target, weights=weights, draft=draft,
                                                   target=target, effects=effects, effect_sides=effect_sides,
                                                   frame=frame)
    a = jnp.asarray(alpha, jnp.float64)
    var_names, dense = (PLANE_SITES, False) if draft is None else (
        PLANE_SITES + effect_scale_sites(effect_sides), True)
    return _sample_checked(numpyro_model, (*args, a), var_names=var_names, dense_mass=dense,
                           target_accept=(target_accept if target_accept is not None
                                          else plane_target_accept(model, effects=dense)),
                           num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, seed=seed,
                           retries=retries, progress_bar=progress_bar, summarize=summarize, progress=progress,
                           prior_width=prior_width, starts=None if frame is None else dispersed_about_frame)


def plane_target_accept(model: AcceptanceModel, *, effects: bool) -> float:
    """NUTS's target acceptance in :func:`sample_plane` by default: ``model.effects_target_accept``
    with per-model effects (a dense mass matrix over the effects and their scales), 0.9 without."""
    return model.effects_target_accept if effects else 0.9


def acceptance_numpyro_model(model: AcceptanceModel, ppl_draft: ArrayLike, ppl_target: ArrayLike, *,
                             weights: ArrayLike | None = None, draft: ArrayLike | None = None,
                             target: ArrayLike | None = None, effects: str = "non-centred",
                             effect_sides: tuple[str, ...] = EFFECT_SIDES,
                             frame: CoefficientFrame | None = None) -> tuple[Callable, tuple]:
    """The NumPyro model :func:`sample_plane` samples for these pairs, and its arguments before the
    observed ``alpha``: the design, for prior-predictive simulation (calibration) and likelihoods.
    A ``frame`` (:func:`~sdsl_jax.infer.models.coefficient_frame`) samples the coefficients scaled to
    it, its origin and unit the last two arguments."""
    if effects not in EFFECT_PARAMETRISATIONS:
        raise ValueError(f"effects must be one of {', '.join(EFFECT_PARAMETRISATIONS)}, got {effects!r}")
    x, y = (jnp.asarray(v, jnp.float64) for v in (ppl_draft, ppl_target))
    w = jnp.ones_like(x) if weights is None else jnp.asarray(weights, jnp.float64)
    if (draft is None) != (target is None):
        raise ValueError("give both draft and target (one integer model per pair), or neither")
    coefficients, scaled = ("prior-scaled", ()) if frame is None else (
        "data-scaled", tuple(jnp.asarray(a, jnp.float64) for a in frame))
    if draft is None:
        return plane_model_for(model, coefficients), (x, y, w, *scaled)
    indices = [_group_index(index, np.shape(ppl_draft), f"{name} must hold one non-negative integer per pair "
                                                        "(AcceptanceMeasurements.model_index())")
               for name, index in (("draft", draft), ("target", target))]
    effect_sides = effect_sides_of(effect_sides)
    if effects == "non-centred":
        groups = [(jnp.asarray(index), jnp.zeros(int(index.max(initial=-1)) + 1)) for index in indices]
        return model_effects_plane_model_for(model, effect_sides, coefficients), (x, y, w, *groups[0], *groups[1],
                                                                                  *scaled)
    if frame is not None:
        raise ValueError("a coefficient frame samples non-centred effects; use effects='non-centred'")
    if effect_sides != EFFECT_SIDES:
        raise ValueError(f"projected effects need both kinds of model, got effect_sides={effect_sides!r}; "
                         "use effects='non-centred'")
    groups = []
    for index, feature in zip(indices, (np.asarray(f, np.float64) for f in model.features(x, y))):
        mean, scale = feature_scale(feature)
        basis = effect_basis(index, (feature - mean) / scale, int(index.max(initial=-1)) + 1)
        groups += [jnp.asarray(index), *(jnp.asarray(b) for b in basis)]
    return projected_effects_plane_model_for(model), (x, y, w, *groups)


EFFECT_PARAMETRISATIONS = ("non-centred", "projected")
"""The coordinates :func:`sample_plane` can sample per-model effects in."""


def acceptance_pointwise_log_likelihood(samples: dict[str, np.ndarray], model: AcceptanceModel, ppl_draft: ArrayLike,
                                        ppl_target: ArrayLike, alpha: ArrayLike, *, weights: ArrayLike | None = None,
                                        draft: ArrayLike | None = None,
                                        target: ArrayLike | None = None) -> np.ndarray:
    """log p(alpha_i | draw) for every posterior draw and pair, shape ``(draws, pairs)``.

    The model is the one :func:`sample_plane` sampled (with per-model effects when ``draft`` and
    ``target`` are given, each pair then conditioned on its models' effects). Input of PSIS-LOO
    and stacking over acceptance models, as :func:`pointwise_log_likelihood` is for loss laws.
    """
    numpyro_model, args = acceptance_numpyro_model(model, ppl_draft, ppl_target, weights=weights, draft=draft,
                                                   target=target)
    a = jnp.asarray(alpha, jnp.float64)
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



def save_inference_data(idata: az.InferenceData, path: str | os.PathLike) -> None:
    """Write the posterior as netCDF, atomically."""
    from sdsl_jax.store import atomic_write

    atomic_write(path, idata.to_netcdf)
