"""Calibration under misspecification: synthetic closures from processes the lead form does not contain.

The other calibration studies (:mod:`sdsl_jax.validation.calibration`) simulate from the model they
fit, so they check the computation, not the method. Here the data come from a *true process*: a
loss law of another family (one-break, Kaplan), or an acceptance curve that saturates (a logit
link), with run effects, per-model acceptance effects and residuals at the real ladder's scale, on
the real ladder's design (its runs, sizes and budgets, its acceptance pairs, its candidate drafts per
target). Each synthetic ladder is then closed by the whole procedure the committed closures use
(:func:`sdsl_jax.validation.closure_fits.fit_in_sample` with the stacked forms, and
:func:`sdsl_jax.validation.closure.close_loop`), and its forecasts are scored against the truth:

* P(best) over each target's candidates against the candidate that truly has the highest tokens per
  FLOP (every candidate's forecast probability with whether it was best: reliability diagram and
  expected calibration error, :func:`sdsl_jax.forecast.reliability`);
* the 90% posterior-predictive N* band against the N* that a new draft series and a new target,
  drawn from the true process, have (the claim the band makes), and the mean-curve N* of the true
  process beside it;
* the Bayes decision's regret under the true T.

* :class:`TrueProcess` -- a generating process: law family and coefficients, acceptance model and
  coefficients, noise scales.
* :func:`ladder_processes` -- the default processes, their coefficients fitted to the real ladder.
* :func:`process_record`, :func:`process_from_record` -- a process as JSON and back, so that a study
  fits its processes once and every later run and shard draws from the same ones.
* :func:`mean_curve_truth`, :func:`drawn_from` -- each target's mean-curve N* under a process, and
  whether a scored closure was drawn from that process.
* :func:`synthetic_closure_data` -- one synthetic ladder on the design, with its truth.
* :func:`synthetic_closure` -- one synthetic ladder closed by the procedure and scored.
* :func:`summarize_closures` -- coverage, reliability and regret over many closures.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import numpy as np

from sdsl_jax.acceptance import ACCEPTANCE_MODELS, ResidualAcceptance, predictive_acceptance
from sdsl_jax.costs import SDSL_FLOPS, throughput_under
from sdsl_jax.loss_laws import FAMILIES

__all__ = ["TrueProcess", "SyntheticLadder", "ladder_processes", "process_record", "process_from_record",
           "mean_curve_truth", "drawn_from", "synthetic_closure_data", "synthetic_closure", "summarize_closures"]


class TrueProcess(NamedTuple):
    """A process that generates a synthetic ladder.

    Attributes:
      name: a label for reports.
      family: the loss-law family (a key of :data:`sdsl_jax.loss_laws.FAMILIES`) and ``law`` its
        coefficients (the family's law type).
      acceptance_model: the acceptance model (a key of :data:`sdsl_jax.acceptance.ACCEPTANCE_MODELS`)
        and ``plane`` its coefficients.
      loss_sigma, loss_nu: the Student-t residual of a row's log loss.
      run_sd, run_slope_sd: a training run's offset of log loss, and its slope per unit ln D
        (about the design's mean ln D), shared by the rows of the run.
      draft_sd, target_sd, pair_sigma: per draft model and per target model effects, and a pair's
        own residual, on the acceptance model's link scale.
    """

    name: str
    family: str
    law: Any
    acceptance_model: str
    plane: Any
    loss_sigma: float
    loss_nu: float
    run_sd: float
    run_slope_sd: float
    draft_sd: float
    target_sd: float
    pair_sigma: float


class SyntheticLadder(NamedTuple):
    """One synthetic ladder: the three tables a closure reads, and the truth per target.

    ``truth`` maps each target's name to ``drafts`` (its candidates, ordered by size as
    :func:`sdsl_jax.validation.closure.close_loop` orders them), ``tokens_per_flop`` (each
    candidate's true T at its best measured lookahead), ``best`` (the index of the highest),
    ``n_star_mean`` (N* of the true law and acceptance curve, no effects) and ``n_star_new`` (N* of
    a new draft series and a new target drawn from the process), both at the candidates' reference
    budget ``d_reference``.
    """

    runs: Any
    pairs: Any
    speculative: Any
    truth: dict


# Noise at the real ladder's scale: posterior medians of its hierarchical fit (fits/ladder-v1/fit/summary.json,
# rounded). Acceptance effects on the logit scale are those on alpha over alpha (1 - alpha) at alpha ~ 0.6.
_LOSS_NOISE = dict(loss_sigma=0.05, loss_nu=20.0, run_sd=0.017, run_slope_sd=0.047)
_IDENTITY_EFFECTS = dict(draft_sd=0.033, target_sd=0.005, pair_sigma=0.008)
_LOGIT_EFFECTS = {k: v / 0.24 for k, v in _IDENTITY_EFFECTS.items()}

DEFAULT_PROCESSES = (("broken", "plane"), ("kaplan", "plane"), ("chinchilla", "logit-plane"))
"""(loss-law family, acceptance model) of :func:`ladder_processes`: a law with a break, a law
without an irreducible loss, and an acceptance curve that saturates."""


def ladder_processes(runs, pairs, *, processes=DEFAULT_PROCESSES, starts_every: int = 1, chains: int = 2,
                     warmup: int = 300, draws: int = 300, seed: int = 0,
                     log: Callable[[str], None] = lambda line: None) -> list[TrueProcess]:
    """The true processes fitted to the real ladder (``runs``, ``pairs``), with its residual scales as their noise.

    Each form's coefficients are those the closures decide with
    (:func:`sdsl_jax.predict.point_for_decisions`): the point fit, or where one of its law's
    coefficients sits at a bound of the fit (the real ladder does not identify the N term of every
    family) the posterior's median law (``chains`` x (``warmup`` + ``draws``) of NUTS), so that no
    synthetic ladder is drawn from a degenerate law. A true process need not be identified by the
    ladder (the one-break law has more D coefficients than the factorial ladder has budgets): it
    is fitted all the same, and is then one of the laws that fit the ladder equally well.
    """
    from sdsl_jax import pipeline, predict
    from sdsl_jax.infer.point import degenerate_coefficients

    out = []
    for family_name, model_name in processes:
        family, model = FAMILIES[family_name], ACCEPTANCE_MODELS[model_name]
        starts = family.starts(np.log(runs.n_params), np.log(runs.n_tokens), np.log(runs.loss))[::starts_every]
        point = pipeline.fit_point(runs, pairs, family=family, acceptance_model=model, starts=starts,
                                   require_identified=False)
        if degenerate_coefficients(point.law):
            post = pipeline.sample_posterior(runs, None, point, num_chains=chains, num_warmup=warmup,
                                             num_samples=draws, seed=seed)
            point, at_bound = predict.point_for_decisions(point, post.laws)
            log(f"true process {family_name}: the point fit's {', '.join(at_bound)} at a bound; the posterior "
                "median law instead")
        effects = _LOGIT_EFFECTS if model.link == "logit" else _IDENTITY_EFFECTS
        out.append(TrueProcess(f"{family_name} + {model_name}", family_name, point.law, model_name, point.plane,
                               **_LOSS_NOISE, **effects))
        log(f"true process {out[-1].name}: law {point.law}, acceptance {point.plane}")
    return out


def process_record(process: TrueProcess) -> dict:
    """``process`` as a JSON-ready record (:func:`process_from_record` reads it back).

    A process whose law is a posterior median (:func:`ladder_processes`) is not reproducible from
    the ladder alone: NUTS's draws differ between machines, and so does a weakly identified
    posterior's median (on the factorial ladder the one-break law's, by enough to move the smallest
    target's mean-curve N* by 10%). A study records its processes once and draws every closure
    from the record."""
    return dict(name=process.name, family=process.family,
                law={k: float(v) for k, v in process.law._asdict().items()},
                acceptance_model=process.acceptance_model,
                plane={k: float(v) for k, v in process.plane._asdict().items()},
                noise={k: float(getattr(process, k)) for k in TrueProcess._fields[5:]})


def process_from_record(record: dict) -> TrueProcess:
    """The :class:`TrueProcess` of a :func:`process_record`; a clear error for an unknown family or
    acceptance model, or coefficients that are not the family's."""
    family, model = FAMILIES.get(record.get("family")), ACCEPTANCE_MODELS.get(record.get("acceptance_model"))
    if family is None or model is None:
        raise ValueError(f"true process {record.get('name')!r}: unknown family {record.get('family')!r} or "
                         f"acceptance model {record.get('acceptance_model')!r} (families {sorted(FAMILIES)}, "
                         f"models {sorted(ACCEPTANCE_MODELS)})")
    try:
        law, plane = family.law_type(**record["law"]), model.params_type(**record["plane"])
        noise = {k: float(record["noise"][k]) for k in TrueProcess._fields[5:]}
    except (KeyError, TypeError) as err:
        raise ValueError(f"true process {record.get('name')!r}: its law, plane or noise lacks or adds a field "
                         f"({err})") from None
    return TrueProcess(record["name"], record["family"], law, record["acceptance_model"], plane, **noise)


def mean_curve_truth(process: TrueProcess, runs, pairs, speculative) -> dict[str, float]:
    """Each target's mean-curve N* under ``process`` on the design (``n_star_mean`` of
    :func:`synthetic_closure_data`, which no seed or noise enters): the fingerprint of the process
    a closure was drawn from."""
    data = synthetic_closure_data(process, runs, pairs, speculative, seed=0)
    return {name: t["n_star_mean"] for name, t in data.truth.items()}


def drawn_from(closure: dict, truth: dict[str, float], *, rtol: float = 1e-6) -> bool:
    """Whether a scored closure (:func:`synthetic_closure`) was drawn from the process whose
    :func:`mean_curve_truth` is ``truth``: the same targets, each with the same mean-curve N*."""
    targets = {t["target"]: t["n_star_mean"] for t in closure["targets"]}
    return targets.keys() == truth.keys() and all(
        np.isclose(targets[name], value, rtol=rtol, atol=0.0, equal_nan=True) for name, value in truth.items())


def synthetic_closure_data(process: TrueProcess, runs, pairs, speculative, *, seed: int) -> SyntheticLadder:
    """A synthetic ladder on the design of ``runs``, ``pairs`` and ``speculative``, drawn from ``process``.

    Every row keeps its size, budget, run and name; its loss is drawn from the process. Each
    model's perplexity is ``exp(loss)`` of its row; each pair's alpha is the acceptance curve at
    the two perplexities, shifted by the draft's and the target's effects, with the pair's residual
    (:func:`sdsl_jax.acceptance.predictive_acceptance`); the speculative runs' T is that alpha's
    tokens per FLOP at the run's lookahead, and their per-prompt counts are dropped (the truth has no
    prompts to resample). With ``speculative=None`` (a design without speculative runs, such as the
    factorial ladder's) the measured side is the synthetic pairs' own
    (:func:`sdsl_jax.validation.closure.expected_speculative_runs`): each top-budget draft's pair at
    its best integer lookahead.
    """
    from sdsl_jax import solve_draft_size
    from sdsl_jax.validation.closure import expected_speculative_runs

    rng = np.random.default_rng(seed)
    family, plane = FAMILIES[process.family], process.plane
    log_n, log_d = np.log(runs.n_params), np.log(runs.n_tokens)
    run, num_runs = runs.run_index()
    centre = float(np.mean(log_d))
    offset, slope = rng.normal(0, process.run_sd, num_runs), rng.normal(0, process.run_slope_sd, num_runs)
    mean = np.asarray(family.log_prediction(family.to_theta(process.law), log_n, log_d))
    log_loss = (mean + offset[run] + slope[run] * (log_d - centre)
                + process.loss_sigma * rng.standard_t(process.loss_nu, len(log_n)))
    loss = np.exp(log_loss)
    ppl = dict(zip(runs.name, np.exp(loss)))
    scored = speculative if speculative is not None else pairs
    missing = sorted({*pairs.draft, *pairs.target, *scored.draft, *scored.target} - set(ppl))
    if missing:
        raise ValueError(f"models without a pre-training row (their perplexity is drawn from it): {missing[:5]}")

    effects: dict[tuple[str, str], float] = {}

    def effect(kind: str, name: str) -> float:
        if (kind, name) not in effects:
            effects[kind, name] = rng.normal(0, process.draft_sd if kind == "draft" else process.target_sd)
        return effects[kind, name]

    # Every pair the tables hold, in order of first appearance: its effects and residual, then all
    # alphas in one vectorised call.
    keys = list(dict.fromkeys([*zip(pairs.draft, pairs.target), *zip(scored.draft, scored.target)]))
    shift = np.array([effect("draft", a) + effect("target", b) for a, b in keys])
    z = rng.standard_normal(len(keys))
    values = np.asarray(predictive_acceptance(plane, np.array([ppl[a] for a, _ in keys]),
                                              np.array([ppl[b] for _, b in keys]), shift=shift, z=z,
                                              sigma=np.full(len(keys), process.pair_sigma)))
    alphas = dict(zip(keys, values.tolist()))
    pair_alphas = np.array([alphas[key] for key in zip(pairs.draft, pairs.target)])
    new_pairs = dataclasses.replace(
        pairs, ppl_draft=np.array([ppl[a] for a in pairs.draft]), ppl_target=np.array([ppl[b] for b in pairs.target]),
        alpha=pair_alphas, path=None)
    if speculative is None:
        speculative = new_speculative = expected_speculative_runs(new_pairs)
        spec_t = speculative.tokens_per_flop_sdsl
    else:
        spec_alpha = np.array([alphas[key] for key in zip(speculative.draft, speculative.target)])
        spec_t = np.asarray(throughput_under(SDSL_FLOPS, spec_alpha, speculative.gamma.astype(np.float64),
                                             speculative.n_draft.astype(np.float64),
                                             speculative.n_target.astype(np.float64)))
        new_speculative = dataclasses.replace(
            speculative, alpha_mle=spec_alpha, accepted_over_drafted=spec_alpha, tokens_per_flop_sdsl=spec_t,
            iterations_per_prompt=None, accepted_per_prompt=None, path=None, sha256=None)
    new_runs = dataclasses.replace(runs, loss=loss, path=None, sha256=None)

    truth, new_effects = {}, []
    for target in dict.fromkeys(speculative.target):
        rows = [i for i, t in enumerate(speculative.target) if t == target]
        by_draft: dict[str, list[int]] = {}
        for i in rows:
            by_draft.setdefault(speculative.draft[i], []).append(i)
        drafts = sorted(by_draft, key=lambda dr: speculative.n_draft[by_draft[dr][0]])
        t_best = np.array([max(spec_t[i] for i in by_draft[dr]) for dr in drafts])
        d_drafts = np.array([speculative.d_draft[by_draft[dr][0]] for dr in drafts], np.float64)
        d_ref, d_target = float(np.exp(np.mean(np.log(d_drafts)))), float(speculative.d_target[rows[0]])
        truth[target] = dict(drafts=drafts, tokens_per_flop=t_best.tolist(), best=int(np.argmax(t_best)),
                             m_target=float(speculative.n_target[rows[0]]), d_reference=d_ref, d_target=d_target)
        # A new draft series (one run, at d_ref) and a new target (one run, at d_target), and their pair.
        losses = [process.loss_sigma * rng.standard_t(process.loss_nu) + rng.normal(0, process.run_sd)
                  + rng.normal(0, process.run_slope_sd) * (np.log(b) - centre) for b in (d_ref, d_target)]
        shift = rng.normal(0, process.draft_sd) + rng.normal(0, process.target_sd)
        new_effects.append([*losses, shift, rng.standard_normal()])
    # Every target in one solve (one compiled program), the mean curve and the new models.
    m, d_ref, d_target = (np.array([t[k] for t in truth.values()]) for k in ("m_target", "d_reference", "d_target"))
    mean_n = np.asarray(solve_draft_size(m, d_draft=d_ref, d_target=d_target, loss=process.law, plane=plane).n_star)
    dx, dy, shift, z = np.array(new_effects).T
    new_plane = ResidualAcceptance(plane, dx, dy, shift, z, np.full_like(z, process.pair_sigma))
    new_n = np.asarray(solve_draft_size(m, d_draft=d_ref, d_target=d_target, loss=process.law, plane=new_plane).n_star)
    for t, a, b in zip(truth.values(), mean_n, new_n):
        t.update(n_star_mean=float(a), n_star_new=float(b))
    return SyntheticLadder(new_runs, new_pairs, new_speculative, truth)


def synthetic_closure(process: TrueProcess, runs, pairs, speculative, settings, *, stack, seed: int,
                      log: Callable[[str], None] = lambda line: None) -> dict:
    """One synthetic ladder drawn from ``process``, closed by the procedure, and scored per target.

    ``settings`` is a :class:`sdsl_jax.validation.closure_fits.ClosureSettings` (its seed is
    replaced by ``seed``); ``stack`` the names of the (loss-law families, acceptance models) fitted
    and stacked, as ``--stack`` names them; P(best), the Bayes decision and the N* band are the stacked
    mixture's, as in the shipped closure (:func:`sdsl_jax.validation.forms.stack_records`). Returns a
    JSON-ready record: per target the forecast P(best), the true best, the 90% N* band with both
    truths, the Bayes decision and its true regret; and the posteriors' failed checks, each with
    what failed.
    """
    from sdsl_jax.validation.closure import close_loop
    from sdsl_jax.validation.closure_fits import fit_in_sample
    from sdsl_jax.validation.forms import stack_records

    data = synthetic_closure_data(process, runs, pairs, speculative, seed=seed)
    forms = ([FAMILIES[name] for name in stack[0]], [ACCEPTANCE_MODELS[name] for name in stack[1]])
    fit = fit_in_sample(data.runs, data.pairs, settings._replace(seed=seed), stack=forms, log=log)
    records = close_loop(data.speculative, fit.point, draws=fit.draws, scales=fit.scales, seed=seed,
                         runs=data.runs, pairs=data.pairs)
    if fit.forms is not None:  # the shipped closure's forecast: the stacked mixture's, not the lead form's
        stack_records(records, fit.forms, seed=seed)
    targets = []
    for rec in records:
        truth = data.truth[rec["target"]]
        if rec["drafts"] != truth["drafts"]:
            raise AssertionError(f"candidates of {rec['target']} differ: {rec['drafts']} vs {truth['drafts']}")
        t = np.array(truth["tokens_per_flop"])
        choice = rec["drafts"].index(rec["bayes_decision"]) if rec.get("bayes_decision") in rec["drafts"] else None
        targets.append(dict(
            target=rec["target"], m_target=truth["m_target"], drafts=truth["drafts"], p_best=rec.get("p_best"),
            true_best=truth["best"], true_tokens_per_flop=truth["tokens_per_flop"],
            n_star_band=rec.get("n_star_band"), n_star_new=truth["n_star_new"], n_star_mean=truth["n_star_mean"],
            bayes_decision=choice,
            bayes_regret=None if choice is None else float(1 - t[choice] / t.max())))
    failed = {name: d for name, d in (fit.diagnostics or {}).items() if isinstance(d, dict) and not d.get("ok", True)}
    forms = None if fit.stacking is None else fit.stacking.get("forms")
    return dict(process=process.name, seed=seed, targets=targets, forms=forms, failed_checks=sorted(failed),
                check_problems={name: list(d.get("problems", ())) for name, d in sorted(failed.items())})


def summarize_closures(closures: list[dict], *, level: float = 0.9, bins: int = 10) -> dict:
    """Coverage of the N* bands, reliability of P(best) and the Bayes decision's regret over closures.

    Targets with a single candidate carry no forecast and are left out of the reliability. Per
    process and over all; with the count of closures whose every form had a posterior that failed
    its checks (the stacking then weighs them all), and the same scores over those closures and over
    the others apart (``by_checks``). An N* band or truth that is not finite counts as a miss of the band
    (reported apart as ``n_star_undefined``). Coverage alone does not say why a band misses, so each
    summary also has the median of ``log(band median / truth)`` (a bias; 0 for a band centred on
    the truth) and the median ``log(upper / lower)`` (the band's width); and the scores are split by
    whether the stacking gave the true process's loss-law family more than half the weight
    (``by_true_family_weight``), and by process and the loss-law family of the highest-weight form,
    whose posterior the N* band is drawn from (``by_process_and_lead_law``), and by which loss laws'
    posteriors failed their checks (``by_failed_laws``): a law whose posterior fails gets no weight
    while another passes, so a sampler's failure can decide which law's extrapolation the band is.
    """
    from sdsl_jax.forecast import reliability

    def summary(items: list[dict]) -> dict:
        p, hit, covered, covered_mean, undefined, regret, log_ratio, log_width = [], [], [], [], 0, [], [], []
        for t in items:
            if t["p_best"] is not None and len(t["drafts"]) > 1:
                p.extend(t["p_best"])
                hit.extend(int(k == t["true_best"]) for k in range(len(t["drafts"])))
            band = t["n_star_band"]
            if band is None or not all(np.isfinite(band)) or not np.isfinite(t["n_star_new"]):
                undefined += 1
                covered.append(False)
            else:
                covered.append(band[0] <= t["n_star_new"] <= band[-1])
                log_ratio.append(float(np.log(band[len(band) // 2] / t["n_star_new"])))
                log_width.append(float(np.log(band[-1] / band[0])))
            if band is not None and all(np.isfinite(band)) and np.isfinite(t["n_star_mean"]):
                covered_mean.append(band[0] <= t["n_star_mean"] <= band[-1])
            if t["bayes_regret"] is not None:
                regret.append(t["bayes_regret"])
        rel = reliability(np.array(p), np.array(hit), bins=bins) if p else None
        return dict(targets=len(items), n_star_coverage=float(np.mean(covered)) if covered else None,
                    n_star_coverage_of_mean_curve=float(np.mean(covered_mean)) if covered_mean else None,
                    n_star_undefined=undefined, nominal=level,
                    n_star_median_log_ratio=float(np.median(log_ratio)) if log_ratio else None,
                    n_star_median_log_width=float(np.median(log_width)) if log_width else None,
                    p_best_expected_calibration_error=None if rel is None else rel.expected_calibration_error,
                    p_best_reliability=None if rel is None else rel._asdict(),
                    p_best_forecasts=len(p), bayes_regret_mean=float(np.mean(regret)) if regret else None)

    # Where every fitted posterior failed its checks, the stacking weighted all forms (the fallback), not only
    # the passing ones: how often that decided the forecasts is part of the result.
    def every_form_failed(c: dict) -> bool:
        return bool(c.get("failed_checks")) and c.get("forms") is not None and all(
            any(part in c["failed_checks"] for part in form.split(" + ")) for form in c["forms"])

    def true_family_leads(c: dict) -> bool:
        family = c["process"].split(" + ")[0]
        return sum(w for form, w in (c.get("forms") or {}).items() if form.split(" + ")[0] == family) > 0.5

    def lead_law(c: dict) -> str:
        forms = c.get("forms") or {}
        return max(forms, key=forms.get).split(" + ")[0] if forms else "no form"

    def failed_laws(c: dict) -> str:
        failed = [name for name in c.get("failed_checks", ()) if name in FAMILIES]
        return ", ".join(failed) if failed else "none"

    fallback = [every_form_failed(c) for c in closures]
    leads = [true_family_leads(c) for c in closures]
    out = dict(closures=len(closures), closures_where_every_form_failed_its_checks=sum(fallback),
               overall=summary([t for c in closures for t in c["targets"]]), by_process={},
               by_checks={"every form failed (all stacked)": summary(
                              [t for c, f in zip(closures, fallback) if f for t in c["targets"]]),
                          "some form passed": summary(
                              [t for c, f in zip(closures, fallback) if not f for t in c["targets"]])},
               by_true_family_weight={"true family over half": summary(
                                          [t for c, k in zip(closures, leads) if k for t in c["targets"]]),
                                      "true family at most half": summary(
                                          [t for c, k in zip(closures, leads) if not k for t in c["targets"]])})
    for name in dict.fromkeys(c["process"] for c in closures):
        out["by_process"][name] = summary([t for c in closures if c["process"] == name for t in c["targets"]])
    out["by_process_and_lead_law"] = {
        f"{process}, {law} leads": summary([t for c in closures if (c["process"], lead_law(c)) == (process, law)
                                            for t in c["targets"]])
        for process, law in sorted({(c["process"], lead_law(c)) for c in closures})}
    out["by_failed_laws"] = {
        f"{process}, laws failing: {failed}": summary([t for c in closures
                                                       if (c["process"], failed_laws(c)) == (process, failed)
                                                       for t in c["targets"]])
        for process, failed in sorted({(c["process"], failed_laws(c)) for c in closures})}
    return out
