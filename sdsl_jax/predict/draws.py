"""Posterior and posterior-predictive draws: the one place a new model's scatter is drawn.

:func:`paired_draws` pairs loss-law draws with acceptance draws one to one;
:func:`predictive_scales` collects, per draw, the residual scales of new runs and models and
the posterior effects of those in the data (:class:`KnownEffects`); :func:`predictive_planes`
turns them into acceptance draws that carry a new draft's, target's and pair's residuals.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from sdsl_jax.acceptance import ResidualAcceptance
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.infer.models import MODEL_EFFECT_SITES, RUN_EFFECT_SITES, new_run_offsets
from sdsl_jax.infer.results import Posterior

__all__ = [
    "PredictiveScales",
    "CandidateLabels",
    "KnownEffects",
    "predictive_scales",
    "predictive_planes",
    "paired_draws",
    "model_effect_draws",
]


class PredictiveScales(NamedTuple):
    """Residual scales per posterior draw, aligned with :func:`paired_draws`.

    Attributes:
      loss_sigma, loss_nu: scale and degrees of freedom of the loss law's Student-t residual on
        log loss (a new model's log loss scatters around the law's curve by this much).
      alpha_sigma: the acceptance model's residual standard deviation (a row of average weight, on
        its link's scale); zeros when the plane is fixed (no acceptance data, no residual known).
      run_sd, run_slope_sd: a new training run's random intercept and slope in log D (None
        for the model without run effects); ``centre_log_d``: the data's mean log D.
      alpha_draft_sd, alpha_target_sd: the acceptance model's per-draft and per-target model
        effects (None for the model without them): a new model's shift of alpha in every pair.
      known: the posterior effects of the runs and models in the data (:class:`KnownEffects`;
        None: every model is treated as new), for candidates that are in the data.
    """

    loss_sigma: np.ndarray
    loss_nu: np.ndarray
    alpha_sigma: np.ndarray
    run_sd: np.ndarray | None = None
    run_slope_sd: np.ndarray | None = None
    centre_log_d: float = 0.0
    alpha_draft_sd: np.ndarray | None = None
    alpha_target_sd: np.ndarray | None = None
    known: "KnownEffects | None" = None

    def log_loss_offsets(self, log_d: Any, *, size: tuple[int, ...] = (), seed: int = 0,
                         runs: tuple[str | None, ...] | None = None) -> np.ndarray:
        """Draws of a model's log-loss offset from the law, shape ``(draws, *size)``.

        A new model's (:func:`sdsl_jax.infer.models.new_run_offsets`); with ``runs`` (one run label per
        entry of ``size``, flattened) an entry whose run is in the data (``known``) keeps its
        run's posterior intercept and slope and draws only its own Student-t residual.
        """
        samples = dict(sigma=self.loss_sigma, nu=self.loss_nu)
        if self.run_sd is not None:
            samples.update(run_sd=self.run_sd, run_slope_sd=self.run_slope_sd)
        offsets = new_run_offsets(samples, log_d, centre_log_d=self.centre_log_d, size=size, seed=seed)
        known = self.known
        if runs is None or known is None or known.run_intercept is None:
            return offsets
        flat = offsets.reshape(offsets.shape[0], -1)
        log_d = np.broadcast_to(np.asarray(log_d, np.float64), offsets.shape).reshape(flat.shape)
        residual = new_run_offsets(dict(sigma=self.loss_sigma, nu=self.loss_nu), 0.0,
                                         size=(flat.shape[1],), seed=seed + 7919)
        for j, label in enumerate(runs):
            r = known.run_labels.index(label) if label in known.run_labels else None
            if r is not None:
                flat[:, j] = (residual[:, j] + known.run_intercept[:, r]
                              + known.run_slope[:, r] * (log_d[:, j] - self.centre_log_d))
        return flat.reshape(offsets.shape)

    def residual_sigma(self) -> np.ndarray | None:
        """``alpha_sigma``, or None where no draw has a residual (a fixed plane): predictive acceptance
        then skips the truncated quantile, which is costly to compile into the N* solver."""
        return self.alpha_sigma if np.any(np.asarray(self.alpha_sigma) > 0) else None

    def alpha_residuals(self, rng: np.random.Generator, candidates: int, *,
                        drafts: tuple[str | None, ...] | None = None,
                        target: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draws of alpha's deviations for ``candidates`` drafts paired with ONE target: ``(shift, z)``,
        each ``(draws, candidates)``, on the acceptance model's link scale.

        ``shift``: each draft's model effect plus the target's, shared by all the candidates of a
        draw (zero without model effects); a draft (labels ``drafts``) or the ``target`` that is in
        the data (``known``) keeps its posterior effect, others are new. ``z``: each pair's own
        residual as a standard normal, of scale ``alpha_sigma``
        (:func:`sdsl_jax.acceptance.predictive_acceptance` turns both into a probability).
        """
        count = self.alpha_sigma.shape[0]
        z = rng.standard_normal((count, candidates))
        if self.alpha_draft_sd is None:
            return np.zeros_like(z), z
        known = self.known if self.known is not None else KnownEffects()
        draft = model_effect_draws(self.alpha_draft_sd, known.draft_effect, known.draft_labels,
                                   tuple(drafts) if drafts else (None,) * candidates, rng)
        target_effect = model_effect_draws(self.alpha_target_sd, known.target_effect, known.target_labels, (target,),
                                           rng)
        return draft + target_effect, z


def model_effect_draws(sd: np.ndarray, known_effects: np.ndarray | None, known_labels: Sequence[str],
                       labels: Sequence[str | None], rng: np.random.Generator) -> np.ndarray:
    """Each entry's model effect per draw, shape ``(draws, entries)``: a model in ``known_labels`` keeps
    its posterior effect (that column of ``known_effects``, ``(draws, models)``); a new model draws
    one, ``sd x N(0, 1)``, shared by all its entries; an entry labelled None is a new model of its own.

    One standard normal is drawn per entry (the first entry of a new model gives its draw), so the
    stream of ``rng`` does not depend on which models are known.
    """
    sd = np.asarray(sd, np.float64)
    fresh = sd[:, None] * rng.standard_normal((sd.shape[0], len(labels)))
    out, first = fresh.copy(), {}
    for j, label in enumerate(labels):
        if label is None:
            continue
        if known_effects is not None and label in known_labels:
            out[:, j] = known_effects[:, list(known_labels).index(label)]
        else:
            out[:, j] = fresh[:, first.setdefault(label, j)]
    return out


class CandidateLabels(NamedTuple):
    """Who the candidates and the target are in the data, so that :class:`KnownEffects` apply.

    Attributes:
      draft_runs: each candidate's loss-law run (:meth:`PretrainingRuns.run_labels`), or None.
      target_run: the target's run, or None.
      draft_models: each candidate's label as a draft in the acceptance data, or None.
      target_model: the target's label as a target in the acceptance data, or None.
    """

    draft_runs: tuple[str | None, ...] | None = None
    target_run: str | None = None
    draft_models: tuple[str | None, ...] | None = None
    target_model: str | None = None


class KnownEffects(NamedTuple):
    """Posterior effects of the runs and models in the data, per draw (aligned with
    :class:`PredictiveScales`): a candidate that is one of them is predicted conditionally on
    its own data instead of as a new model.

    Attributes:
      run_labels: the loss-law runs (:meth:`PretrainingRuns.run_labels` order of first appearance).
      run_intercept, run_slope: ``(draws, runs)``: each run's ``u_r`` and ``v_r`` (None without run effects).
      draft_labels, target_labels: the acceptance data's draft and target models.
      draft_effect, target_effect: ``(draws, models)``: each model's effect on alpha (None without
        model effects).
    """

    run_labels: tuple[str, ...] = ()
    run_intercept: np.ndarray | None = None
    run_slope: np.ndarray | None = None
    draft_labels: tuple[str, ...] = ()
    draft_effect: np.ndarray | None = None
    target_labels: tuple[str, ...] = ()
    target_effect: np.ndarray | None = None


def _draw_indices(total: int, count: int | None, rng_seed: int, size: int) -> np.ndarray:
    if count is None or count >= total:
        return np.arange(size)
    return np.random.default_rng(rng_seed).choice(total, size=count, replace=False)


def predictive_scales(posterior: Posterior, *, count: int | None = None, seed: int = 0,
                      runs: PretrainingRuns | None = None,
                      acceptance: AcceptanceMeasurements | None = None) -> PredictiveScales:
    """The residual scales of the draws :func:`paired_draws` returns for the same ``count`` and ``seed``.

    With ``runs`` and ``acceptance`` (the data the posterior was fitted to), also the posterior
    effects of their runs and models (:class:`KnownEffects`), so that candidates in the data
    are predicted conditionally on them (``rank_drafts(draft_runs=..., draft_models=...)``).
    """
    law_samples = posterior.law_run.samples
    n_laws = np.size(posterior.laws[0])
    n_planes = np.size(posterior.planes[0]) if posterior.plane_run is not None else None
    size = n_laws if n_planes is None else min(n_laws, n_planes)
    idx = _draw_indices(n_laws, count, seed, size)
    sigma, nu = (np.asarray(law_samples[k]).reshape(-1)[idx] for k in ("sigma", "nu"))
    run_sd = run_slope_sd = None
    if "run_sd" in law_samples:
        run_sd, run_slope_sd = (np.asarray(law_samples[k]).reshape(-1)[idx] for k in RUN_EFFECT_SITES)
    draft_sd = target_sd = None
    if n_planes is None:
        alpha_sigma = np.zeros_like(sigma)
    else:
        plane_samples = posterior.plane_run.samples
        plane_idx = _draw_indices(n_planes, count, seed + 1, size)
        alpha_sigma = np.asarray(plane_samples["sigma"]).reshape(-1)[plane_idx]
        if "draft_sd" in plane_samples:
            draft_sd, target_sd = (np.asarray(plane_samples[k]).reshape(-1)[plane_idx]
                                   for k in MODEL_EFFECT_SITES)
    known = None
    if runs is not None or acceptance is not None:
        kw = {}
        if runs is not None and run_sd is not None:
            flat = lambda k: np.asarray(law_samples[k]).reshape(n_laws, -1)[idx]  # noqa: E731
            kw.update(run_labels=tuple(dict.fromkeys(runs.run_labels())),
                      run_intercept=run_sd[:, None] * flat("run_z"), run_slope=run_slope_sd[:, None] * flat("run_slope_z"))
        if acceptance is not None and draft_sd is not None:
            flat = lambda k: np.asarray(plane_samples[k]).reshape(n_planes, -1)[plane_idx]  # noqa: E731
            kw.update(draft_labels=tuple(dict.fromkeys(acceptance.draft)), draft_effect=draft_sd[:, None] * flat("draft_z"),
                      target_labels=tuple(dict.fromkeys(acceptance.target)),
                      target_effect=target_sd[:, None] * flat("target_z"))
        known = KnownEffects(**kw)
    return PredictiveScales(sigma, nu, alpha_sigma, run_sd, run_slope_sd,
                            float(law_samples.get("centre_log_d", 0.0)), draft_sd, target_sd, known)


def predictive_planes(planes: Any, scales: PredictiveScales, *, d_draft: float, d_target: float,
                      seed: int = 0) -> ResidualAcceptance:
    """Acceptance draws that carry a new draft's, a new target's and a new pair's residuals.

    One offset of the draft's log loss per draw, shared by every draft size N of that draw (the
    draft series is trained by one recipe on one corpus, so its deviation from the law moves
    the whole curve T(N), which is what moves N*); one for the target; one on alpha (with
    per-model effects: the pair's residual plus a new draft's and a new target's effect). The draft's
    offset is drawn at the training budget ``d_draft`` (with a recipe: the budget near N*),
    since a run's slope effect grows with the distance of log D from the data's centre.
    """
    count = scales.loss_sigma.shape[0]
    dx = scales.log_loss_offsets(np.log(d_draft), seed=seed)
    dy = scales.log_loss_offsets(np.log(d_target), seed=seed + 1)
    shift, z = (v[:, 0] for v in scales.alpha_residuals(np.random.default_rng(seed + 2), 1))
    planes = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v, np.float64), (count,)), planes)
    sigma = scales.residual_sigma()
    return ResidualAcceptance(planes, dx, dy, shift, None if sigma is None else z, sigma)


def paired_draws(posterior: Posterior, *, count: int | None = None, seed: int = 0) -> tuple[Any, Any]:
    """Loss-law and acceptance draws paired one to one (the two posteriors are independent).

    ``count=None`` (or at least the number of draws) keeps every draw, paired in order and
    truncated to the shorter posterior; a smaller ``count`` takes a random subset of each
    posterior without replacement (``seed`` for the law's, ``seed + 1`` for the plane's).
    """
    laws, planes = posterior.laws, posterior.planes
    n_laws = np.size(laws[0])
    n_planes = np.size(planes[0]) if posterior.plane_run is not None else None

    def take(draws, total, rng_seed):
        idx = _draw_indices(total, count, rng_seed, total if n_planes is None else min(n_laws, n_planes))
        return type(draws)(*(np.asarray(v)[idx] for v in draws))

    laws = take(laws, n_laws, seed)
    if n_planes is not None:
        planes = take(planes, n_planes, seed + 1)
    return laws, planes
