"""Register the factorial ladder's prediction for its held-back models before they exist; score it once they do.

    python -m experiments.measure --preset factorial --exact-only --out out/ladder/factorial/measure
    python -m experiments.preregister --data out/ladder/factorial/measure --out fits/ladder/preregistered
    # ... commit predictions.json, then train and measure the held-back models:
    python -m experiments.ladder --preset factorial --held-back fits/ladder/preregistered/predictions.json
    python -m experiments.measure --preset factorial --exact-only --out out/ladder/factorial/measure
    python -m experiments.preregister --score --data out/ladder/factorial/measure --out fits/ladder/preregistered

Fits the loss law (run effects) and the acceptance plane (per-model effects) to the factorial
ladder's pre-training runs and exact acceptance pairs, then, for every target of the ladder and
the held-back target, ranks every smaller model at the top shared budget as a candidate draft
(the held-back draft included): P(best), the Bayes decision (highest posterior-expected T), T and
alpha per candidate with 90% predictive bands, N* with its band, and the forecasts of the simple
baselines (:mod:`sdsl_jax.forecast`). Writes ``predictions.json`` and ``predictions.md``; the file is
committed before any held-back model is trained, and never edited afterwards.

``--score`` reads that file as it stands and the measurements that now include the held-back
models, and writes ``score.json`` and ``score.md``: for every target, the log score, Brier score
and regret of the method's P(best) and of each baseline, the regret of the Bayes decision and of
the point fit's pick, whether each measured T and alpha lies in its 90% band, and where the
measured best draft lies against the N* band. Targets and pairs that involve a held-back model are
the test (their measurements did not exist when the prediction was made); the others are scored
too, as in-sample checks, and reported apart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np

from experiments.runlog import Log, UsageError, check_arguments, run_command, run_header, sha256, write_json

__all__ = ["main"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.preregister", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="folder with pretraining.csv and acceptance.csv (experiments.measure)")
    p.add_argument("--preset", default="factorial", help="the ladder preset whose held-back rungs are predicted")
    p.add_argument("--out", default="fits/ladder/preregistered", help="output folder")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--score", action="store_true",
                   help="score <out>/predictions.json against --data, which now holds the held-back models")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return out + ("+modified" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _quantiles(x: np.ndarray) -> list[float]:
    with np.errstate(all="ignore"):
        return [float(v) for v in np.nanquantile(x, [0.05, 0.5, 0.95], axis=0)] if np.isfinite(x).any() else [None] * 3


def measured_throughput(pairs, top: dict[str, float]) -> dict[tuple[str, str], dict]:
    """T at the best integer lookahead from each pair's exact alpha, for pairs of top-budget models
    (``top``: each rung's top budget in tokens; models are named ``<rung>@<steps>``)."""
    from sdsl_jax import SDSL_FLOPS, best_lookahead

    out = {}
    for i in range(len(pairs.alpha)):
        draft, target = pairs.draft[i].split("@")[0], pairs.target[i].split("@")[0]
        if np.isclose(pairs.d_draft[i], top.get(draft, np.nan)) and np.isclose(pairs.d_target[i], top.get(target, np.nan)):
            best = best_lookahead(SDSL_FLOPS, float(pairs.alpha[i]), float(pairs.n_draft[i]), float(pairs.n_target[i]))
            out[draft, target] = dict(alpha=float(pairs.alpha[i]), throughput=float(best.throughput))
    return out


def predict(args, log: Log) -> dict:
    from experiments import ladder
    from experiments.closure import run_label_of
    from sdsl_jax import bayes, load_acceptance, load_pretraining, pipeline
    from sdsl_jax.forecast import baseline_forecasts, bayes_decision

    preset = ladder.PRESETS[args.preset]
    runs = load_pretraining(os.path.join(args.data, "pretraining.csv"))
    pairs = load_acceptance(os.path.join(args.data, "acceptance.csv"))
    sizes = {r.name: float(ladder.rung_n_params(r, preset)) for r in preset.rungs}
    # Each rung's top shared budget in tokens (whole steps: 10,000,384 at 2,048 tokens per step, 9,998,336 at
    # 4,096): candidates and targets are the models trained on it.
    top = {r.name: float(max(plan.budgets) * plan.tokens_per_step)
           for r in preset.rungs for plan in [ladder.plan_rung(r, preset, int(sizes[r.name]))]}
    held_back = [r for r in preset.rungs if r.held_back]
    present = [r.name for r in held_back if np.any(np.isclose(runs.n_params, sizes[r.name]))]
    if present:
        raise UsageError(f"--data holds rows of held-back model(s) {present}: a prediction is registered before "
                         "their data exist")
    missing = [r.name for r in preset.rungs if not r.held_back
               and not np.any(np.isclose(runs.n_params, sizes[r.name]) & np.isclose(runs.n_tokens, top[r.name]))]
    if missing:
        raise UsageError(f"--data lacks the top-budget run of rung(s) {missing} of the '{preset.name}' preset")
    log(f"data: {len(runs.loss)} pre-training runs, {len(pairs.alpha)} acceptance pairs; top shared budget "
        f"{min(top.values()):.6g}-{max(top.values()):.6g} tokens")
    point = pipeline.fit_point(runs, pairs, log=log)
    posterior = pipeline.sample_posterior(runs, pairs, point, num_chains=args.chains, num_warmup=args.warmup,
                                          num_samples=args.draws, seed=args.seed, log=log)
    draws = pipeline.paired_draws(posterior)
    scales = pipeline.predictive_scales(posterior, runs=runs, acceptance=pairs)
    laws, planes = draws
    measured = measured_throughput(pairs, top)
    # The data name models "<rung>@<steps>": each rung's top-budget model as a draft and as a target.
    top_drafts = {lab.split("@")[0]: lab for lab, dd in zip(pairs.draft, pairs.d_draft)
                  if np.isclose(dd, top[lab.split("@")[0]])}
    top_targets = {lab.split("@")[0]: lab for lab, dt in zip(pairs.target, pairs.d_target)
                   if np.isclose(dt, top[lab.split("@")[0]])}
    order = sorted(sizes, key=sizes.get)
    targets, earlier, previous_best = [], [], None
    for t_name in order[1:]:
        m = sizes[t_name]
        cands = [c for c in order if sizes[c] < m]
        n = np.array([sizes[c] for c in cands])
        d = np.array([top[c] for c in cands])
        d_top = top[t_name]
        labels = pipeline.CandidateLabels(
            draft_runs=tuple(run_label_of(runs, float(v), float(dv)) for v, dv in zip(n, d)), target_run=run_label_of(runs, m, d_top),
            draft_models=tuple(top_drafts.get(c) for c in cands), target_model=top_targets.get(t_name))
        kw = dict(n_drafts=n, d_drafts=d, m_target=m, d_target=d_top, scales=scales, labels=labels, seed=args.seed)
        t_draws = pipeline.throughput_draws(draws, **kw)
        alpha_draws = pipeline.acceptance_draws(draws, **kw)
        decision = bayes_decision(t_draws)
        ranking = pipeline.rank_drafts(point, draws=draws, **kw)
        n_star = bayes.propagate_draft_size(
            np.array([m]), laws, pipeline.predictive_planes(planes, scales, d_draft=d_top, d_target=d_top,
                                                            seed=args.seed),
            d_draft=d_top, d_target=d_top, quantiles=(0.05, 0.5, 0.95))  # N* for drafts on the target's budget
        baselines = baseline_forecasts(n, m, previous_best=previous_best, earlier=earlier)
        t_measured = [measured.get((c, t_name), {}).get("throughput") for c in cands]
        record = dict(
            target=t_name, m_target=m, d_target=d_top, held_back_target=t_name in {r.name for r in held_back},
            candidates=[dict(name=c, n_params=sizes[c], d_tokens=top[c], held_back=c in {r.name for r in held_back},
                             p_best=float(decision.p_best[j]), expected_tokens_per_flop=float(decision.expected_throughput[j]),
                             tokens_per_flop_point=float(ranking.throughput[j]),
                             tokens_per_flop_90=_quantiles(t_draws[:, j]), alpha_point=float(ranking.alpha[j]),
                             alpha_90=_quantiles(alpha_draws[:, j]),
                             inadmissible_share=float(np.mean(~np.isfinite(t_draws[:, j]))))
                        for j, c in enumerate(cands)],
            bayes_decision=dict(draft=cands[decision.choice], p_best=float(decision.p_best[decision.choice]),
                                expected_regret=decision.expected_regret),
            point_fit_best=cands[ranking.best] if ranking.best is not None else None,
            n_star_90=[float(v) for v in np.asarray(n_star.n_star)[:, 0]],
            n_star_failed_fraction=float(np.asarray(n_star.failed_fraction)[0]),
            baselines={f.name: dict(p_best=f.p_best.tolist(), rule=f.rule) for f in baselines},
            measured_in_data={c: v for c, v in zip(cands, t_measured) if v is not None})
        targets.append(record)
        log(f"{t_name} (M = {m:,.0f}): Bayes decision {record['bayes_decision']['draft']} "
            f"(P(best) {record['bayes_decision']['p_best']:.2f}); N* 90% [{record['n_star_90'][0]:,.0f}, "
            f"{record['n_star_90'][2]:,.0f}]")
        # The baselines of the next target see only what is measured: this target's best among measured drafts.
        known = {c: v for c, v in zip(cands, t_measured) if v is not None}
        if known:
            best = max(known, key=known.get)
            previous_best = sizes[best]
            earlier.append((m, sizes[best]))
    diagnostics = {k: v._asdict() for k, v in posterior.diagnostics.items()}
    return dict(
        held_back=[dict(name=r.name, n_params=int(sizes[r.name]), role=r.note) for r in held_back],
        data=dict(pretraining=os.path.join(args.data, "pretraining.csv"),
                  pretraining_sha256=sha256(os.path.join(args.data, "pretraining.csv")),
                  acceptance=os.path.join(args.data, "acceptance.csv"),
                  acceptance_sha256=sha256(os.path.join(args.data, "acceptance.csv")),
                  runs=int(len(runs.loss)), pairs=int(len(pairs.alpha)), top_budget_tokens=top),
        method=dict(law=point.family.name, acceptance_model=point.acceptance_model.name,
                    run_effects=bool(pipeline.has_repeated_runs(runs)), chains=args.chains, warmup=args.warmup,
                    draws=args.draws, decision="the candidate with the highest posterior-expected T",
                    bands="posterior-predictive, 5%/50%/95%"),
        diagnostics=diagnostics, targets=targets)


def write_markdown(path: str, record: dict) -> None:
    from sdsl_jax.store import write_text

    lines = ["# Preregistered prediction: the factorial ladder's held-back models", "",
             f"Made by `{record['command']}` at commit `{record['commit']}` on {record['date']}, before any "
             "held-back model was trained. Held back: "
             + ", ".join(f"{h['name']} ({h['n_params']:,} parameters: {h['role']})" for h in record["held_back"]) + ".",
             "", "Posterior diagnostics: " + "; ".join(
                 f"{k} {'OK' if v['ok'] else 'FAILED (' + ', '.join(v['problems']) + ')'}"
                 for k, v in record["diagnostics"].items()), ""]
    for t in record["targets"]:
        lines += [f"## Target {t['target']} (M = {t['m_target']:,.0f}{', held back' if t['held_back_target'] else ''})",
                  "", f"Bayes decision: **{t['bayes_decision']['draft']}** (P(best) {t['bayes_decision']['p_best']:.2f}, "
                  f"expected regret {t['bayes_decision']['expected_regret']:.3f}); N* 90% "
                  f"[{t['n_star_90'][0]:,.0f}, {t['n_star_90'][2]:,.0f}] (median {t['n_star_90'][1]:,.0f}).", "",
                  "| candidate | N | P(best) | T per GFLOP, median [90%] | alpha, median [90%] | "
                  + " | ".join(t["baselines"]) + " |",
                  "|---|---|---|---|---|" + "---|" * len(t["baselines"])]
        for j, c in enumerate(t["candidates"]):
            tq, aq = c["tokens_per_flop_90"], c["alpha_90"]
            fmt_t = (f"{tq[1] * 1e9:.4g} [{tq[0] * 1e9:.4g}, {tq[2] * 1e9:.4g}]" if tq[1] is not None else "n/a")
            fmt_a = (f"{aq[1]:.3f} [{aq[0]:.3f}, {aq[2]:.3f}]" if aq[1] is not None else "n/a")
            lines.append(f"| {c['name']}{' (held back)' if c['held_back'] else ''} | {c['n_params']:,.0f} | "
                         f"{c['p_best']:.2f} | {fmt_t} | {fmt_a} | "
                         + " | ".join(f"{b['p_best'][j]:.2f}" for b in t["baselines"].values()) + " |")
        lines.append("")
    write_text(path, "\n".join(lines))


def _inside(value: float, band) -> bool | None:
    if value is None or band is None or band[0] is None or band[2] is None:
        return None
    return bool(band[0] <= value <= band[2])


def score(predictions: dict, pairs) -> dict:
    """Score a registered prediction against acceptance measurements that include its held-back models.

    Args:
      predictions: the registered ``predictions.json``, as it stands.
      pairs: :class:`sdsl_jax.data.AcceptanceMeasurements` with models named ``<rung>@<steps>``.

    Returns:
      ``targets`` (one record per registered target), ``summary`` (totals over the targets that
      involve a held-back model and over the others) and ``unmeasured`` (registered pairs without a
      measurement, which are left out of the scores).
    """
    from sdsl_jax.forecast import forecast_scores

    measured = measured_throughput(pairs, predictions["data"]["top_budget_tokens"])
    held = {h["name"] for h in predictions["held_back"]}
    targets, unmeasured = [], []
    for t in predictions["targets"]:
        names = [c["name"] for c in t["candidates"]]
        new_target = t["target"] in held or any(c in held for c in names)
        pairs_scored = []
        for c in t["candidates"]:
            got = measured.get((c["name"], t["target"]))
            if got is None:
                unmeasured.append(f"{c['name']} -> {t['target']}")
                continue
            pairs_scored.append(dict(
                draft=c["name"], new=t["target"] in held or c["held_back"], alpha=got["alpha"],
                tokens_per_flop=got["throughput"], alpha_in_90=_inside(got["alpha"], c["alpha_90"]),
                tokens_per_flop_in_90=_inside(got["throughput"], c["tokens_per_flop_90"]),
                alpha_90=c["alpha_90"], tokens_per_flop_90=c["tokens_per_flop_90"]))
        record = dict(target=t["target"], m_target=t["m_target"], new=new_target, pairs=pairs_scored)
        if len(pairs_scored) == len(names):
            tm = np.array([p["tokens_per_flop"] for p in pairs_scored])
            best = int(np.argmax(tm))
            forecasts = {"method": [c["p_best"] for c in t["candidates"]],
                         **{k: v["p_best"] for k, v in t["baselines"].items()}}
            record.update(
                measured_best=names[best], measured_best_n=t["candidates"][best]["n_params"],
                bayes_decision=t["bayes_decision"]["draft"],
                bayes_decision_regret=float(1.0 - tm[names.index(t["bayes_decision"]["draft"])] / tm[best]),
                point_fit_best=t["point_fit_best"],
                point_fit_regret=(float(1.0 - tm[names.index(t["point_fit_best"])] / tm[best])
                                  if t["point_fit_best"] in names else None),
                n_star_90=t["n_star_90"],
                measured_best_vs_n_star=("inside" if _inside(t["candidates"][best]["n_params"], t["n_star_90"])
                                         else "below" if t["candidates"][best]["n_params"] < t["n_star_90"][0]
                                         else "above"),
                informative=len(names) > 1,
                scores={k: forecast_scores(p, tm)._asdict() for k, p in forecasts.items()})
        targets.append(record)

    def forecast_totals(subset):
        scored = [r for r in subset if "scores" in r]
        out = dict(targets=[r["target"] for r in scored])
        if scored:
            out["forecasts"] = {k: dict(log_score=float(sum(r["scores"][k]["log_score"] for r in scored)),
                                        brier=float(np.mean([r["scores"][k]["brier"] for r in scored])),
                                        regret=float(np.mean([r["scores"][k]["regret"] for r in scored])))
                                for k in scored[0]["scores"]}
            out["bayes_decision_regret"] = float(np.mean([r["bayes_decision_regret"] for r in scored]))
            out["measured_best_inside_n_star_90"] = int(sum(r["measured_best_vs_n_star"] == "inside" for r in scored))
        return out

    def coverage(new: bool):
        out = {}
        for kind in ("alpha", "tokens_per_flop"):
            hits = [p[f"{kind}_in_90"] for r in targets for p in r["pairs"]
                    if p["new"] == new and p[f"{kind}_in_90"] is not None]
            out[f"{kind}_coverage_90"] = dict(inside=int(sum(hits)), pairs=len(hits))
        return out

    summary = dict(held_back_forecasts=forecast_totals([r for r in targets if r["new"]]),
                   in_sample_forecasts=forecast_totals([r for r in targets if not r["new"]]),
                   held_back_pairs=coverage(True), in_sample_pairs=coverage(False))
    return dict(targets=targets, summary=summary, unmeasured=unmeasured)


def write_score_markdown(path: str, record: dict) -> None:
    from sdsl_jax.store import write_text

    def fmt_log(v):
        return "-inf" if v == -np.inf else f"{v:.3f}"

    s = record["summary"]
    lines = ["# The preregistered prediction, scored", "",
             f"Scored by `{record['command']}` at commit `{record['commit']}` on {record['date']}, against "
             f"`{record['data']['acceptance']}` (sha256 {record['data']['acceptance_sha256'][:12]}), which holds the "
             f"held-back models. The prediction: `{record['predictions']}` (sha256 {record['predictions_sha256'][:12]}), "
             f"registered at commit `{record['registered_commit']}`.", ""]
    for key, title in (("held_back_forecasts", "Targets that involve a held-back model (the test)"),
                       ("in_sample_forecasts", "The other targets (in-sample: their pairs were fitted)")):
        part = s[key]
        lines += [f"## {title}", "", f"Targets: {', '.join(part['targets']) or 'none'}.", ""]
        if "forecasts" in part:
            lines += ["| forecast | log score (sum) | Brier (mean) | regret of its most probable draft (mean) |",
                      "|---|---|---|---|"]
            lines += [f"| {k} | {fmt_log(v['log_score'])} | {v['brier']:.3f} | {100 * v['regret']:.1f}% |"
                      for k, v in part["forecasts"].items()]
            lines += ["", f"Bayes decision's regret (mean): {100 * part['bayes_decision_regret']:.1f}%. Measured best "
                      f"draft inside the 90% N* band: {part['measured_best_inside_n_star_90']} of "
                      f"{len(part['targets'])} targets.", ""]
    for key, title in (("held_back_pairs", "pairs with a held-back model"), ("in_sample_pairs", "in-sample pairs")):
        part = s[key]
        lines.append(f"Coverage of the 90% bands, {title}: alpha {part['alpha_coverage_90']['inside']}/"
                     f"{part['alpha_coverage_90']['pairs']}, T {part['tokens_per_flop_coverage_90']['inside']}/"
                     f"{part['tokens_per_flop_coverage_90']['pairs']}.")
    lines.append("")
    if record["unmeasured"]:
        lines += [f"Registered pairs without a measurement (left out): {', '.join(record['unmeasured'])}.", ""]
    lines += ["## Per target", ""]
    for t in record["targets"]:
        head = f"### {t['target']} (M = {t['m_target']:,.0f}{', involves a held-back model' if t['new'] else ''})"
        lines += [head, ""]
        if "scores" in t:
            lines += [f"Measured best: **{t['measured_best']}**; Bayes decision {t['bayes_decision']} (regret "
                      f"{100 * t['bayes_decision_regret']:.1f}%); point fit's pick {t['point_fit_best']}; measured best "
                      f"N = {t['measured_best_n']:,.0f} is {t['measured_best_vs_n_star']} the N* band "
                      f"[{t['n_star_90'][0]:,.0f}, {t['n_star_90'][2]:,.0f}]"
                      + ("" if t["informative"] else " (one candidate: nothing to forecast)") + ".", "",
                      "Log scores: " + ", ".join(f"{k} {fmt_log(v['log_score'])}" for k, v in t["scores"].items()) + ".",
                      ""]
        lines += ["| draft | alpha measured | alpha 90% band | T per GFLOP measured | T 90% band |", "|---|---|---|---|---|"]
        for p in t["pairs"]:
            a, tq = p["alpha_90"], p["tokens_per_flop_90"]
            lines.append(f"| {p['draft']}{' (new)' if p['new'] else ''} | {p['alpha']:.3f}"
                         f"{'' if p['alpha_in_90'] else ' (outside)'} | [{a[0]:.3f}, {a[2]:.3f}] | "
                         f"{p['tokens_per_flop'] * 1e9:.4g}{'' if p['tokens_per_flop_in_90'] else ' (outside)'} | "
                         f"[{tq[0] * 1e9:.4g}, {tq[2] * 1e9:.4g}] |")
        lines.append("")
    write_text(path, "\n".join(lines))


def _score(args, argv, log: Log) -> int:
    import json

    from sdsl_jax import load_acceptance

    path = os.path.join(args.out, "predictions.json")
    if not os.path.isfile(path):
        raise UsageError(f"--score reads {path}, which does not exist: register the prediction first")
    with open(path) as f:
        predictions = json.load(f)
    pairs = load_acceptance(os.path.join(args.data, "acceptance.csv"))
    rungs = {lab.split("@")[0] for lab in list(pairs.draft) + list(pairs.target)}
    missing = [h["name"] for h in predictions["held_back"] if h["name"] not in rungs]
    if missing:
        raise UsageError(f"--data {args.data} has no acceptance pairs of held-back model(s) {missing}: train them "
                         "(experiments.ladder --held-back) and measure them first")
    result = score(predictions, pairs)
    record = dict(**run_header("experiments.preregister", argv), commit=_commit(), predictions=path, predictions_sha256=sha256(path),
                  registered_commit=predictions["commit"],
                  data=dict(acceptance=os.path.join(args.data, "acceptance.csv"),
                            acceptance_sha256=sha256(os.path.join(args.data, "acceptance.csv"))), **result)
    write_json(os.path.join(args.out, "score.json"), record)
    write_score_markdown(os.path.join(args.out, "score.md"), record)
    part = result["summary"]["held_back_forecasts"]
    if "forecasts" in part:
        log("held-back targets " + ", ".join(part["targets"]) + ": log score "
            + ", ".join(f"{k} {v['log_score']:.3f}" for k, v in part["forecasts"].items()))
    log(f"wrote {args.out}/score.json and score.md")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.score:
        return run_command(lambda: _score(args, argv, Log(args.quiet)), kept="nothing is written until the end")
    return run_command(lambda: _preregister(args, argv), kept="nothing is written until the end")


def _preregister(args, argv) -> int:
    from experiments.runlog import configure_jax, make_output_folder

    check_arguments(args, at_least_one=("chains", "warmup", "draws"), out=args.out)
    configure_jax()
    log = Log(args.quiet)
    with log.heartbeat(8):
        record = predict(args, log)
    record = dict(**run_header("experiments.preregister", argv), commit=_commit(), seed=args.seed, **record)
    out = make_output_folder(args.out)
    write_json(os.path.join(out, "predictions.json"), record)
    write_markdown(os.path.join(out, "predictions.md"), record)
    log(f"wrote {out}/predictions.json and predictions.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
