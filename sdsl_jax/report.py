"""What a fit reports: summary.json's record of a :class:`~sdsl_jax.pipeline.PipelineResult`, and the
table printed from it.

The record holds provenance (command, date, seed, versions, data digests), the settings and the
assumptions with their sources, the point fits, N* per named target and on the grid and, with a
posterior, its diagnostics, identification and bands; :func:`format_table` reads only the record,
so a summary.json written earlier prints the same table.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import NamedTuple

import numpy as np

from sdsl_jax.assumptions import extrapolation, format_assumptions, perplexity_scale
from sdsl_jax.costs import target_alone_cost
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns
from sdsl_jax.figures import format_size
from sdsl_jax.infer.models import sampled_effect_sides
from sdsl_jax.infer.sampler import Diagnostics
from sdsl_jax.optimum import SDSL2026_LINEAR_LAW
from sdsl_jax.pipeline import PipelineResult
from sdsl_jax.predict.ranking import NOT_PINNED_DOWN
from sdsl_jax.store import finite_or_none
from sdsl_jax.protocols import IterationCostModel, LossLawModel

__all__ = [
    "interval",
    "summary_record",
    "add_posterior_record",
    "add_data_checks",
    "diagnostics_advice",
    "format_table",
    "RecordedPosterior",
    "recorded_posteriors",
    "geometry_shortfalls",
]

PAPER_MU, PAPER_M0 = float(SDSL2026_LINEAR_LAW.mu), float(SDSL2026_LINEAR_LAW.m0)


def interval(draws, level=0.9):
    with warnings.catch_warnings():  # every draw failed (e.g. no speed-up): NaN, reported as null
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, med, hi = np.nanquantile(np.asarray(draws), [(1 - level) / 2, 0.5, (1 + level) / 2])
    return dict(median=float(med), lo90=float(lo), hi90=float(hi))


def summary_record(result: PipelineResult, *, header: dict, data: dict, assumptions: dict, settings: dict,
                   cost: IterationCostModel, latency: dict | None = None) -> dict:
    """summary.json without the posterior's part: provenance (``header``: command, date, seed, versions;
    ``data``: the files read), the settings, the point fits, N* per named target and on the grid.

    ``settings`` (the run's choices) gains the NUTS settings' ``run_effects`` and ``model_effects``
    (the kinds of model, draft and target, whose per-model effects the acceptance posterior
    sampled) from the posterior when there is one; ``latency`` (the latency model, when ``cost`` is one) makes
    T* tokens per second instead of tokens per FLOP.
    """
    point, post, pred = result.point, result.posterior, result.prediction
    grid_sol, named_sol, line = pred.grid, pred.named, pred.linear_law
    m_grid, named = np.asarray(pred.m_grid), np.asarray(pred.targets)
    throughput_key = "tokens_per_second" if latency is not None else "tokens_per_flop"
    plane = point.plane
    plane_info = (dict(source="fitted (weighted least squares)", model=point.acceptance_model.name,
                       r_squared=point.plane_r_squared) if point.plane_fitted
                  else dict(source="SDSL2026 (paper's values, fixed: no acceptance data)", model="plane"))
    if post is not None:
        settings = dict(settings, run_effects="run_sd" in post.law_run.samples,
                        model_effects=list(sampled_effect_sides(post.plane_run.samples))
                        if post.plane_run is not None else [])
    return dict(
        **header, data=data, assumptions=assumptions, settings=settings,
        loss_law=dict(**{k: float(v) for k, v in point.law._asdict().items()}, family=point.family.name,
                      objective=point.objective, converged=point.converged,
                      not_unique=list(point.not_unique), at_bound=list(result.point_at_bound),
                      source=("posterior median law (the point fit's " + ", ".join(result.point_at_bound)
                              + f" {NOT_PINNED_DOWN})") if result.point_at_bound and post is not None
                      else "point fit (multi-start Huber)"),
        plane=dict(**{k: float(v) for k, v in plane._asdict().items()}, **plane_info),
        linear_law=dict(mu=float(line.mu), m0=float(line.m0)) if line else None,
        paper=dict(mu=PAPER_MU, m0=PAPER_M0),
        latency=latency,
        targets=[dict(m_target=float(m), n_star=float(named_sol.n_star[i]), gamma_star=float(named_sol.gamma_star[i]),
                      alpha=float(named_sol.alpha[i]), m_over_n_star=float(m / named_sol.n_star[i]),
                      **{throughput_key: float(named_sol.throughput[i])},
                      speedup=float(named_sol.throughput[i] * target_alone_cost(cost, m)), status=int(named_sol.status[i]))
                 for i, m in enumerate(named)],
        grid=dict(m_target=m_grid.tolist(), n_star=np.asarray(grid_sol.n_star).tolist(),
                  gamma_star=np.asarray(grid_sol.gamma_star).tolist()),
    )


def add_posterior_record(summary: dict, result: PipelineResult, *, cost: IterationCostModel) -> None:
    """The posterior's part of summary.json: diagnostics, identification, intervals of every
    coefficient and residual scale, and the bands on N*, M/N*, gamma*, T* and the linear law."""
    point, post, pred = result.point, result.posterior, result.prediction
    m_grid, named = np.asarray(pred.m_grid), np.asarray(pred.targets)
    throughput_key = "tokens_per_second" if summary.get("latency") else "tokens_per_flop"
    diagnostics = {name: diag._asdict() for name, diag in post.diagnostics.items()}
    bands, nb = pred.bands, pred.target_bands
    laws, planes = result.draws
    q = list(bands.quantiles)
    i05, i50, i95 = q.index(0.05), q.index(0.5), q.index(0.95)
    for j, target in enumerate(summary["targets"]):
        target.update(n_star_median=float(nb.n_star[i50, j]), n_star_lo90=float(nb.n_star[i05, j]),
                      n_star_hi90=float(nb.n_star[i95, j]),
                      m_over_n_star_lo90=float(nb.m_over_n[i05, j]),
                      m_over_n_star_hi90=float(nb.m_over_n[i95, j]),
                      gamma_star_lo90=float(nb.gamma_star[i05, j]),
                      gamma_star_hi90=float(nb.gamma_star[i95, j]),
                      speedup_lo90=float(nb.throughput[i05, j] * target_alone_cost(cost, named[j])),
                      speedup_hi90=float(nb.throughput[i95, j] * target_alone_cost(cost, named[j])),
                      failed_fraction=float(nb.failed_fraction[j]))
    ident = post.identification
    summary["posterior"] = dict(
        diagnostics=diagnostics,
        identification=dict(
            meaning="contraction = 1 - posterior variance / prior variance, in the law's fitting coordinates; "
                    "flags: parameters the data do not identify",
            contraction=dict(zip(ident.names, map(float, ident.contraction))), flags=list(ident.flags)),
        loss_law={k: interval(v) for k, v in laws._asdict().items()},
        residuals=dict(
            meaning="scales of a new model's deviation from the law: sigma, nu (Student-t residual of log loss), "
                    "run_sd, run_slope_sd (a run's random intercept, and slope per unit ln D), alpha_sigma (the "
                    "acceptance model's residual per pair), alpha_draft_sd, alpha_target_sd (its per-model "
                    "effects, of the kinds of model in settings.model_effects); the bands include them unless "
                    "--mean-only",
            **{k: interval(np.asarray(post.law_run.samples[k]).reshape(-1))
               for k in ("sigma", "nu", "run_sd", "run_slope_sd") if k in post.law_run.samples},
            **({f"alpha_{k}" if k != "sigma" else "alpha_sigma": interval(
                np.asarray(post.plane_run.samples[k]).reshape(-1))
                for k in ("sigma", *(f"{kind}_sd" for kind in sampled_effect_sides(post.plane_run.samples)))}
               if post.plane_run is not None else {})),
        plane={k: interval(v) for k, v in planes._asdict().items()} if point.plane_fitted else "fixed",
        linear_law=dict(mu=interval(bands.linear_law.mu), m0=interval(bands.linear_law.m0)),
        bands=dict(quantiles=q, m_target=m_grid.tolist(), n_star=bands.n_star.tolist(),
                   m_over_n_star=bands.m_over_n.tolist(), gamma_star=bands.gamma_star.tolist(),
                   **{throughput_key: bands.throughput.tolist()}, failed_fraction=bands.failed_fraction.tolist()),
    )


def add_data_checks(summary: dict, law: LossLawModel, *, runs: PretrainingRuns,
                    acceptance: AcceptanceMeasurements | None) -> list[str]:
    """How far each answer reaches beyond the data, and whether the law and the acceptance data speak of
    the same perplexities: in ``summary``; returns one warning for each thing that is off."""
    warnings_ = []
    drafts = np.unique(acceptance.n_draft) if acceptance is not None else None
    measured = np.unique(acceptance.n_target) if acceptance is not None else None
    for t in summary["targets"]:
        n_star = t.get("n_star_median", t["n_star"])
        t["beyond_data"] = extrapolation(t["m_target"], n_star if n_star is not None else np.nan,
                                         run_sizes=runs.n_params, draft_sizes=drafts, target_sizes=measured).as_dict()
    at_bound = summary["loss_law"].get("at_bound")
    if at_bound and "posterior" not in summary:
        warnings_.append(f"the loss law's point fit has {', '.join(at_bound)} at a bound of the fit (a term the data do "
                         "not pin down): its N* (point) is an artefact of where the optimiser stopped; run with "
                         "--posterior, which reports the posterior median law's")
    flagged = [t for t in summary["targets"] if t["beyond_data"]["flags"]]
    if flagged:
        warnings_.append(f"{len(flagged)} of {len(summary['targets'])} targets lie beyond the data (column 'beyond data'): "
                    "their N* is an extrapolation of the law")
    if acceptance is not None:
        scale = perplexity_scale(law, acceptance)
        summary["perplexity_scale"] = scale.as_dict()
        if not scale.consistent:
            warnings_.append(scale.message)
    return warnings_


def diagnostics_advice(name: str, post) -> str:
    """What to do about a posterior that failed its checks: where the data leave parameters
    unidentified, longer chains only wander further along the ridge; name them and the data that
    would separate them."""
    flags = list(post.identification.flags) if name == "loss_law" else []
    if flags:
        return ("The data do not identify: " + "; ".join(flags) + ". Longer chains will not fix this: add runs at "
                "more model sizes and more budgets per size (the N and D terms need each to vary on its own), fix "
                "the parameter from elsewhere, or choose a form with fewer coefficients (--law).")
    checks = dict(post.diagnostics.items()) if getattr(post, "diagnostics", None) is not None else {}
    depth = checks[name].max_tree_depth_share if name in checks else float("nan")
    if depth > 0.01:
        return (f"{depth:.0%} of draws hit NUTS's maximum tree depth: the posterior is badly scaled or curved (a "
                "coefficient barely constrained, or two that trade off non-linearly). More draws will not help; a form "
                "with fewer coefficients (--law) or data that pin the weak one will.")
    if name == "plane":
        return ("Check that the pairs cover several draft and target perplexities (a plane needs both to vary), "
                "or turn the per-model effects off (--run-effects off) where few models repeat; then run longer "
                "(--warmup/--draws).")
    reruns = checks[name].attempts - 1 if name in checks else 0
    again = (f" (the sampler already ran it {reruns} more time{'s' if reruns > 1 else ''}, with up to "
             f"{2 ** reruns}x the draws)") if reruns else ""
    return f"Run longer (--warmup/--draws) or more chains{again}."


def format_table(summary: dict) -> str:
    """The answer as text: the assumptions, the laws with their intervals, N* per target with its band,
    the linear law, the stacked forms and every caveat the summary records."""
    lines = []
    print = lines.append  # noqa: A001 - the table is built line by line as it reads
    post = summary.get("posterior")
    print("\n" + "\n".join(format_assumptions(summary["assumptions"])))
    law = summary["loss_law"]
    first = "posterior median law" if law.get("at_bound") and post else "point fit"
    print(f"\nLoss law, {law['family']} ({first}" + (", posterior median [90% interval]" if post else "") + "):")
    for k in [k for k in law if k not in ("family", "objective", "converged", "not_unique", "at_bound", "source")]:
        extra = ""
        if post:
            i = post["loss_law"][k]
            extra = f"   {i['median']:.4g} [{i['lo90']:.4g}, {i['hi90']:.4g}]"
        print(f"  {k:>5} = {law[k]:<10.5g}{extra}")
    p = summary["plane"]
    print(f"Acceptance ({p['model']}): A={p['A']:.5g} B={p['B']:.5g} C={p['C']:.5g}  ({p['source']})")
    print("\n  target M |  N* median [90% band]          | N* (point) |  M/N* | gamma* | alpha  | speedup [90%]"
          "        | beyond data")
    for t in summary["targets"]:
        band = (f"{format_size(t['n_star_median']):>8} [{format_size(t['n_star_lo90'])}, {format_size(t['n_star_hi90'])}]"
                if "n_star_median" in t else "(run with --posterior)")
        failed = t.get("failed_fraction", 0.0) or 0.0
        if failed > 0.05:  # a band from under 95% of the draws: say so beside it
            band += f" *{failed:.0%} failed"
        speed = f"x{t['speedup']:.2f}" + (f" [{t['speedup_lo90']:.2f}, {t['speedup_hi90']:.2f}]"
                                          if "speedup_lo90" in t else "")
        flags = "; ".join(t["beyond_data"]["flags"]) if t.get("beyond_data") else ""
        print(f"  {format_size(t['m_target']):>8} | {band:<30} | {format_size(t['n_star']):>10} | {t['m_over_n_star']:5.0f} | "
              f"{t['gamma_star']:6.2f} | {t['alpha']:.4f} | {speed:<20} | {flags or '-'}")
    if any((t.get("failed_fraction", 0.0) or 0.0) > 0.05 for t in summary["targets"]):
        print("  (*: that share of the posterior draws had no solved N*; the band is of the rest)")
    unit = "tokens per second (--cost latency)" if summary.get("latency") else "tokens per FLOP"
    print(f"  (speedup: T* over the target decoding alone, in {unit})")
    ll = summary["linear_law"]
    if ll:
        txt = f"\nLinear law N* = mu M + M0: mu = {ll['mu']:.4g}, M0 = {ll['m0']:.4g}"
        if post:
            mu, m0 = post["linear_law"]["mu"], post["linear_law"]["m0"]
            txt += (f"   posterior mu {mu['median']:.4g} [{mu['lo90']:.4g}, {mu['hi90']:.4g}], "
                    f"M0 {m0['median']:.4g} [{m0['lo90']:.4g}, {m0['hi90']:.4g}]")
        print(txt + f"   (paper: mu = {PAPER_MU}, M0 = {PAPER_M0:.3g})")
    if summary.get("stacking"):
        st = summary["stacking"]
        print("\nForms stacked (" + st["method"] + "):")
        for i, name in enumerate(st["forms"]):
            held_out = "" if "held_out_log_density" not in st else (
                f"  held-out {st['held_out_log_density'][i]:8.1f} (se {st['held_out_se'][i]:.1f})"
                if finite_or_none(st["held_out_log_density"][i]) is not None else
                "  held-out not scored (its posterior failed its checks)")
            print(f"  {name:>10}: weight {st['weights'][i]:.3f}{held_out}  elpd_loo {st['elpd_loo'][i]:8.1f} (se "
                  f"{st['elpd_se'][i]:.1f})  N* point " + ", ".join(format_size(v) for v in st["n_star_point"][name]))
            for fold, problems in st.get("fold_problems", {}).get(name, {}).items():
                print(" " * 14 + f"without size(s) {fold}: its posterior failed ({'; '.join(problems)})")
            if name in st.get("identification", {}):
                print(" " * 14 + "posterior against prior (1 - variance ratio): " + ", ".join(
                    f"{k} {c:.2f}" for k, c in st["identification"][name].items()))
            if name in st.get("diagnostics", {}):
                d = st["diagnostics"][name]
                print(" " * 14 + f"posterior on all the data: max R-hat {d['max_rhat']:.3f}, min bulk ESS "
                      f"{d['min_ess_bulk']:.0f}, {d['num_divergences']} divergent, {d['median_steps']:.0f} leapfrog "
                      f"steps per draw (median), {d['max_tree_depth_share']:.0%} at the maximum tree depth, "
                      f"{d['attempts']} run(s)" + ("" if d["ok"] else "; failed: " + "; ".join(d["problems"])))
        for name, why in st["skipped"].items():
            print(f"  {name:>10}: not fitted ({why})")
        lead = law["family"]
        weight = dict(zip(st["forms"], st["weights"])).get(lead)
        print("  The bands above are the stacked mixture's; the point columns (N* (point), gamma*, alpha, the "
              f"speedup before its band) are the {lead} law's point fit (--law"
              + (f", stacking weight {weight:.3f}" if weight is not None else "")
              + ("; its posterior failed its checks" if lead in st.get("failed_checks", []) else "") + ").")
    if law.get("not_unique"):
        print("The point fit is not unique (rival optima within 1% of its objective differ in "
              + ", ".join(law["not_unique"]) + "): its digits need not reproduce on another machine; the bands do.")
    if law.get("at_bound"):
        print(f"The point fit's {', '.join(law['at_bound'])} "
              + (f"{NOT_PINNED_DOWN}: the N* (point) column is the posterior median law's." if post else
                 "sat at a bound of the fit (a term the data do not pin down): "
                 "its N* (point) is an artefact of where the optimiser stopped; run with --posterior."))
    if post and post["identification"]["flags"]:
        print("Not identified by these data (posterior against prior): " + "; ".join(post["identification"]["flags"]))
    if "plane_sensitivity" in summary:
        s = summary["plane_sensitivity"]
        print("Sensitivity of N* to the fixed plane (d log N* / d log |coef|): " + ", ".join(
            f"{k} {np.mean(s[k]):+.2f}" for k in ("A", "B", "C")))
    print("")
    return "\n".join(lines)


class RecordedPosterior(NamedTuple):
    """One posterior's checks as a result file records them.

    Attributes:
      places: every place in the record that holds this run's diagnostics, each the keys down to
        them joined by ``/`` (``prospective_fits/24832/diagnostics/broken``); a closure records its
        fit on all the data under its stacking, under its own diagnostics and, where a forward fit
        saw every run, under that fit too.
      diagnostics: the checks (:class:`~sdsl_jax.infer.Diagnostics`).
    """

    places: tuple[str, ...]
    diagnostics: Diagnostics


def recorded_posteriors(record) -> list[RecordedPosterior]:
    """Every posterior's diagnostics in a result record (``summary.json``, ``closure.json``, any JSON
    a command writes): each mapping that holds the checks of :class:`~sdsl_jax.infer.Diagnostics`,
    found at any depth, in the record's order. Records of one run met at several places (the same
    values) are one posterior. Raises ``ValueError`` naming the place of a record that has the
    checks but cannot be read as diagnostics."""
    checks = [f for f in Diagnostics._fields if f not in Diagnostics._field_defaults]
    found: dict[str, tuple[list[str], Diagnostics]] = {}

    def walk(node, keys):
        if isinstance(node, dict):
            if all(k in node for k in checks):
                place = "/".join(keys)
                try:
                    diagnostics = Diagnostics.from_record(node)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{place}: {err}") from None
                same = json.dumps(node, sort_keys=True)
                found.setdefault(same, ([], diagnostics))[0].append(place)
                return
            for key, value in node.items():
                walk(value, keys + [str(key)])
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, keys + [str(i)])

    walk(record, [])
    return [RecordedPosterior(tuple(places), diagnostics) for places, diagnostics in found.values()]


def geometry_shortfalls(diagnostics: Diagnostics, *, max_median_steps: float = 64,
                        max_tree_depth_share: float = 0.0, min_ess_bulk: float = 400.0) -> tuple[str, ...]:
    """How a posterior's run falls short of a well-conditioned sampler: more than ``max_median_steps``
    leapfrog steps per draw (median), more than ``max_tree_depth_share`` of its draws at NUTS's
    maximum tree depth, a bulk ESS below ``min_ess_bulk`` (the defaults: tens of steps per draw, none
    at the cap, 100 effective draws per chain of four). Empty when it meets all three; a step count
    not recorded is a shortfall of its own. They say what a run costs, not whether its draws can be
    trusted, which the checks a posterior must pass to be used say (:func:`sdsl_jax.infer.check_diagnostics`:
    R-hat, divergences, at most 1% of draws at the cap): a run can meet either and not the other."""
    d = diagnostics
    out = []
    if math.isnan(d.median_steps) or math.isnan(d.max_tree_depth_share):
        out.append("steps per draw not recorded")
    else:
        if d.median_steps > max_median_steps:
            out.append(f"{d.median_steps:.0f} leapfrog steps per draw (median) > {max_median_steps:g}")
        if d.max_tree_depth_share > max_tree_depth_share:
            out.append(f"{100 * d.max_tree_depth_share:.2g}% of draws at the maximum tree depth")
    if not d.min_ess_bulk >= min_ess_bulk:
        out.append(f"bulk ESS {d.min_ess_bulk:.4g} < {min_ess_bulk:g}")
    return tuple(out)
