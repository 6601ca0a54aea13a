"""Calibration of the posteriors: do their intervals cover the truth as often as they claim?

    python -m experiments.calibration --datasets 100                       # coverage at fixed truths
    python -m experiments.calibration --datasets 200 --only n-star         # N* bands with run effects
    python -m experiments.calibration --only sbc --datasets 100 --out fits/calibration   # SBC per family
    python -m experiments.calibration --only misspecified --datasets 200 --out fits/calibration/misspecified
    python -m experiments.calibration --only misspecified --datasets 200 --shard 1/2 --out fits/calibration/misspecified

``plane``, ``loss-law``: coverage of each parameter's 90% interval over synthetic datasets at fixed
true parameters. ``n-star``: coverage of the 90% N* bands on synthetic ladders with run effects
(the mean-curve band against the true law's N*, the predictive band against new models').
``sbc``: simulation-based calibration of every loss-law family's hierarchical posterior on the
ladder's design (``--design``), and of the acceptance models named by ``--acceptance-models`` on its
pairs (``--acceptance-design``): parameters from the prior, data from the model, the rank of each
true value among 99 thinned posterior draws, and a chi-square test of their uniformity; rank
histograms in ``sbc.png``. Its posteriors are sampled as ``experiments.fit`` samples them (4 chains
x (500 + 500), a failing one run again up to twice, longer): the ranks check the procedure shipped.
``misspecified``: ``--datasets`` synthetic ladders on the real ladder's design (``--design``,
``--acceptance-design``, ``--speculative-design``), drawn in turn from true processes outside the
lead form (a one-break law, Kaplan's law, a saturating acceptance curve;
coefficients fitted to the real ladder), each closed by the whole procedure (the ``--stack`` forms
fitted and stacked, P(best), N* bands, the Bayes decision) and scored against its truth: coverage of
the 90% N* bands, the reliability and expected calibration error of P(best), the decision's regret
(:mod:`sdsl_jax.validation.misspecified`). SBC and misspecified are resumable: finished datasets are
kept in ``<out>/stages/`` and a rerun of the same command fits only the others. ``--shard I/K`` splits
either study's datasets over K processes (one per core), each with its own stage file. The other studies
are in :mod:`sdsl_jax.validation.calibration`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

from sdsl_jax.compare import STACKING_DENSITIES
from sdsl_jax.infer.models import COEFFICIENT_COORDINATES
from sdsl_jax.runtime import configure_jax

STUDIES = ("plane", "loss-law", "n-star", "sbc", "misspecified")
SBC_CHECKS = ("R-hat", "bulk ESS", "divergent", "maximum tree depth")
"""The posterior checks counted apart in sbc.json (their wording in ``sdsl_jax.infer.check_diagnostics``)."""


def main(argv: list[str] | None = None) -> int:
    # Float64 and JAX's compilation cache (a study compiles the same programs in every process and,
    # after the in-memory caches are dropped, again), made here, not at import. One CPU device: the
    # chains run vectorised, as the committed stage lines were sampled.
    configure_jax(devices=1)
    from sdsl_jax.loss_laws import FAMILIES

    parser = argparse.ArgumentParser(prog="python -m experiments.calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100, help="synthetic datasets per model (100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=STUDIES, help="one study only (default: all but sbc and misspecified)")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help="sbc: the loss-law families, comma-separated (default: all: " + ",".join(FAMILIES) + ")")
    parser.add_argument("--design", default="fits/ladder-v1/pretraining.csv",
                        help="sbc, misspecified: the runs whose (N, D) and training runs the data are simulated at "
                             "(default fits/ladder-v1/pretraining.csv)")
    parser.add_argument("--acceptance-models", default="",
                        help="sbc: also these acceptance models, comma-separated (plane, log-plane, logit-plane; "
                             "default none), on the pairs of --acceptance-design")
    parser.add_argument("--acceptance-coefficients", choices=COEFFICIENT_COORDINATES,
                        default=COEFFICIENT_COORDINATES[0],
                        help="sbc: the coordinates NUTS samples the acceptance models' coefficients in "
                             "(sample_plane(coefficients=...); default prior-scaled, what the fits sample)")
    parser.add_argument("--acceptance-design", default="fits/ladder-v1/acceptance.csv",
                        help="sbc, misspecified: the pairs whose perplexities, weights and models the alphas are "
                             "simulated at, with per-model effects where the pairs identify them "
                             "(default fits/ladder-v1/acceptance.csv)")
    parser.add_argument("--speculative-design", default="fits/ladder-v1/speculative.csv",
                        help="misspecified: the speculative runs whose targets, candidate drafts and lookaheads "
                             "the closures score (default fits/ladder-v1/speculative.csv)")
    parser.add_argument("--measured", choices=("speculative", "acceptance"), default="speculative",
                        help="misspecified: the measured side each synthetic closure is scored on: the speculative "
                             "runs of --speculative-design (speculative), or for a design without them each "
                             "top-budget draft's pair at its best integer lookahead (acceptance)")
    parser.add_argument("--stack", default="chinchilla,kaplan,broken,plane,log-plane",
                        help="misspecified: the forms each synthetic closure fits and stacks (loss-law families and "
                             "acceptance models, comma-separated; default chinchilla,kaplan,broken,plane,log-plane)")
    parser.add_argument("--stack-by", choices=STACKING_DENSITIES, default="rows",
                        help="misspecified: the densities the forms are weighted by in each closure's fit: rows "
                             "(PSIS-LOO over rows and pairs, the default) or sizes (each model size left out in "
                             "turn, as `closure --stack-by sizes`; a posterior per size and form where a kind has "
                             "more than one form)")
    parser.add_argument("--reruns", type=int, default=None,
                        help="misspecified: times a failing posterior of a form that would carry weight is run again, "
                             "each time with twice the warm-up and draws (0; the shipped closure's --reruns is 2); "
                             "sbc: times a failing posterior is run again (2, as experiments.fit runs it)")
    parser.add_argument("--rerun-weight", type=float, default=0.01,
                        help="misspecified, with --reruns: run a failing form again only if it would carry at least "
                             "this stacking weight were every posterior to pass (0.01)")
    parser.add_argument("--processes", default="broken:plane,kaplan:plane,chinchilla:logit-plane",
                        help="misspecified: the true processes, law:acceptance-model pairs, comma-separated, taken "
                             "in turn (default broken:plane,kaplan:plane,chinchilla:logit-plane)")
    parser.add_argument("--chains", type=int, default=None, help="misspecified: NUTS chains per posterior (2); sbc: "
                                                                   "(4, as experiments.fit)")
    parser.add_argument("--warmup", type=int, default=None, help="misspecified: NUTS warm-up iterations (300); sbc: "
                                                                   "(500, as experiments.fit)")
    parser.add_argument("--draws", type=int, default=None, help="misspecified: NUTS draws per chain (300); sbc: "
                                                                  "(500, as experiments.fit)")
    parser.add_argument("--shard", metavar="I/K", help="misspecified, sbc: fit only the datasets whose index is I "
                                                        "modulo K (K processes, one per core, share the study; each "
                                                        "keeps its own stage file and the last to finish, or a rerun "
                                                        "without --shard, writes the summary)")
    parser.add_argument("--out", metavar="DIR", help="also write calibration.json and the figures "
                                                     "(n_star_coverage.png, sbc.png); sbc keeps its finished "
                                                     "datasets in DIR/stages/")
    args = parser.parse_args(argv)
    from experiments.runlog import run_command

    return run_command(lambda: calibrate(args, argv), "rerun the same command: sbc fits only the datasets not yet "
                                                      "finished; the other studies start again")


# The NUTS settings when not given: SBC checks the posteriors experiments.fit ships; the misspecified
# study's closures run many forms each, shorter.
SAMPLER_DEFAULTS = dict(sbc=dict(chains=4, warmup=500, draws=500, reruns=2),
                        misspecified=dict(chains=2, warmup=300, draws=300, reruns=0))


def _sampler_settings(args) -> None:
    """Fill the NUTS settings not given with the study's defaults, and check them."""
    from experiments.runlog import UsageError

    for name, default in SAMPLER_DEFAULTS.get(args.only, SAMPLER_DEFAULTS["misspecified"]).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("chains", "warmup", "draws"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.reruns < 0:
        raise UsageError(f"--reruns must be >= 0, got {args.reruns}")


def _resident_memory_gb() -> float:
    """This process's resident memory in GB (Linux's /proc; the peak from getrusage elsewhere): a
    study of hours shows whether its memory stays bounded."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**30 if sys.platform == "darwin" else 2**20)


def _shard(args) -> tuple[int, int]:
    """``--shard I/K`` as ``(I, K)``; ``(0, 1)`` without it."""
    from experiments.runlog import UsageError

    if not args.shard:
        return 0, 1
    try:
        shard, shards = (int(v) for v in args.shard.split("/"))
        if not 0 <= shard < shards:
            raise ValueError
    except ValueError:
        raise UsageError(f"--shard: {args.shard!r} is not I/K with 0 <= I < K") from None
    return shard, shards


def calibrate(args, argv) -> int:
    from experiments.runlog import UsageError, command_line, make_output_folder, versions, write_json
    from sdsl_jax.loss_laws import FAMILIES
    from sdsl_jax.validation import calibration

    if args.datasets < 1:
        raise UsageError(f"--datasets must be at least 1, got {args.datasets}")
    _sampler_settings(args)
    _shard(args)
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS

    families = [f for f in args.families.split(",") if f and f != "none"]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise UsageError(f"--families: unknown {unknown}; choose from {sorted(FAMILIES)} or none")
    acceptance = [m for m in args.acceptance_models.split(",") if m]
    unknown = [m for m in acceptance if m not in ACCEPTANCE_MODELS]
    if unknown:
        raise UsageError(f"--acceptance-models: unknown {unknown}; choose from {sorted(ACCEPTANCE_MODELS)}")
    if args.only in ("sbc", "misspecified") and not args.out:
        raise UsageError(f"--only {args.only} needs --out DIR (its finished datasets are kept there, so that it can "
                         "resume)")
    if args.out:
        make_output_folder(args.out)
    command = command_line("experiments.calibration", argv)
    record = dict(command=command, seed=args.seed, datasets=args.datasets, studies={})
    for name in [n for n in STUDIES if args.only == n or (args.only is None and n not in ("sbc", "misspecified"))]:
        start = time.perf_counter()
        if name == "sbc":
            record["studies"]["sbc"] = _sbc(args, families, acceptance, command)
            if record["studies"]["sbc"] is None:
                return 0
            continue
        if name == "misspecified":
            record["studies"]["misspecified"] = _misspecified(args, command)
            if record["studies"]["misspecified"] is None:
                return 0
            continue
        if name == "n-star":
            cov, intervals = calibration.n_star_coverage(args.datasets, seed=args.seed, return_intervals=True,
                                                         log=lambda line: print(line, flush=True))
            if args.out:
                from sdsl_jax.figures import n_star_coverage_figure

                n_star_coverage_figure(intervals, os.path.join(args.out, "n_star_coverage.png"), caption=command)
            print("n-star (run effects): 90% band coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
                  + f" over {args.datasets} datasets (binomial s.e. {np.sqrt(0.09 / args.datasets):.3f}) "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
        else:
            cov = {"plane": calibration.plane_coverage, "loss-law": calibration.loss_law_coverage}[name](
                args.datasets, seed=args.seed)
            k = args.datasets * len(cov)
            print(f"{name}: 90% interval coverage " + ", ".join(f"{p} {c:.2f}" for p, c in cov.items())
                  + f"; pooled {np.mean(list(cov.values())):.3f} over {k} intervals (binomial s.e. "
                  f"{np.sqrt(0.09 / k):.3f}) [{time.perf_counter() - start:.0f} s]", flush=True)
        record["studies"][name] = dict(coverage=cov, seconds=time.perf_counter() - start)
    if args.out:
        write_json(os.path.join(args.out, {"sbc": _sbc_name(families, acceptance) + ".json",
                                           "misspecified": "misspecified.json"}.get(args.only, "calibration.json")),
                   dict(record, versions=versions()))
    return 0


def _sbc_name(families: list[str], acceptance: list[str]) -> str:
    """The SBC summary's file name (without extension): ``sbc`` for every loss-law family; a run of
    some of them names what it holds (``sbc-data-acceptance-plane``), so that it never replaces the
    whole study's summary with a part of it."""
    from sdsl_jax.loss_laws import FAMILIES

    if sorted(families) == sorted(FAMILIES):
        return "sbc"
    return "-".join(["sbc", *families, *(f"acceptance-{m}" for m in acceptance)])


def _sbc(args, families: list[str], acceptance: list[str], command: str) -> dict | None:
    """SBC of each family and acceptance model on its design; the per-site tests as a record, the rank
    histograms as a figure. None when this run is one shard of several and another shard's datasets
    are unfinished (this shard still fits its share of every study)."""
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.data import load_acceptance, load_pretraining
    from sdsl_jax.figures import rank_histogram_figure
    from sdsl_jax.infer.posterior import plane_target_accept
    from sdsl_jax.loss_laws import FAMILIES
    from sdsl_jax.validation.calibration import acceptance_sbc, loss_law_sbc

    os.makedirs(os.path.join(args.out, "stages"), exist_ok=True)
    results, record = {}, dict(design=args.design, families={})
    studies = []
    if families:
        runs = load_pretraining(args.design)
        run, _ = runs.run_index()

        def law_study(name, **kw):
            return loss_law_sbc(FAMILIES[name], runs.n_params, runs.n_tokens, run=run, **kw)

        studies += [(name, "families", f"{len(runs.n_params)} runs of {args.design}", law_study,
                     FAMILIES[name].target_accept) for name in families]
    if acceptance:
        pairs = load_acceptance(args.acceptance_design)
        effects, why = pairs.model_effects_identified()
        groups = {}
        if effects:
            draft, _, target, _ = pairs.model_index()
            groups = dict(draft=draft, target=target, effect_sides=effects)
        record.update(acceptance_design=args.acceptance_design, acceptance_models={}, model_effects=list(effects),
                      acceptance_coefficients=args.acceptance_coefficients)

        def acceptance_study(name, **kw):
            return acceptance_sbc(ACCEPTANCE_MODELS[name], pairs.ppl_draft, pairs.ppl_target,
                                  weights=pairs.regression_weights(), coefficients=args.acceptance_coefficients,
                                  **groups, **kw)

        design = (f"{len(pairs.alpha)} pairs of {args.acceptance_design} (per-model effects "
                  f"{'on' if effects else 'off'}: {why})")
        studies += [(name, "acceptance_models", design, acceptance_study,
                     plane_target_accept(ACCEPTANCE_MODELS[name], effects=bool(effects))) for name in acceptance]
    shard = _shard(args)
    sampler = dict(num_chains=args.chains, num_warmup=args.warmup, num_samples=args.draws, retries=args.reruns)
    record["sampler"] = dict(chains=args.chains, warmup=args.warmup, draws=args.draws, reruns=args.reruns)
    unfinished = []
    for name, kind, design, run_study, target_accept in studies:
        start = time.perf_counter()
        print(f"sbc: {name}, {args.datasets} datasets on {design}; NUTS {args.chains} chains x ({args.warmup} + "
              f"{args.draws}) at target acceptance {target_accept}, {args.reruns} rerun(s) of a failing posterior"
              + (f"; shard {shard[0]}/{shard[1]}" if shard[1] > 1 else ""), flush=True)
        stage = f"sbc-{name}.jsonl" if kind == "families" else f"sbc-acceptance-{name}.jsonl"
        study = run_study(name, datasets=args.datasets, seed=args.seed, **sampler, shard=shard,
                          stage_path=os.path.join(args.out, "stages", stage), log=lambda line: print(line, flush=True))
        if study is None:
            unfinished.append(name)
            continue
        results[name] = study
        failed = sum(1 for p in study.failed_checks if p)
        record[kind][name] = dict(
            sites=list(study.sites), num_draws=study.num_draws, min_p_value=study.min_p_value(),
            tests={t.site: dict(p_value=t.p_value, chi_square=t.chi_square, counts=t.counts.tolist())
                   for t in study.tests},
            datasets_failing_checks=failed, failing_by_check={
                check: sum(1 for problems in study.failed_checks if any(check in p for p in problems))
                for check in SBC_CHECKS},
            ranks=study.ranks.tolist(), target_accept=target_accept, seconds=time.perf_counter() - start)
        print(f"sbc: {name}: chi-square p per parameter " + ", ".join(f"{t.site} {t.p_value:.3f}" for t in study.tests)
              + f"; {failed} of {args.datasets} posteriors failed a check", flush=True)
    if unfinished:
        print(f"shard {shard[0]}/{shard[1]} finished; {', '.join(unfinished)} still have datasets with the other "
              "shards: the last shard to finish (or a rerun without --shard) writes the summary", flush=True)
        return None
    rank_histogram_figure(os.path.join(args.out, _sbc_name(families, acceptance) + ".png"), results, caption=command)
    return record


_PROCESSES_FILE = "processes.json"


def _true_processes(args, runs, pairs, process_forms, command: str) -> list:
    """The study's true processes: read from ``<out>/processes.json`` where an earlier run (or
    shard) of the same design, processes and seed wrote them, else fitted to the real ladder
    (:func:`sdsl_jax.validation.misspecified.ladder_processes`) and written there, so that every
    closure of a study, on any machine, is drawn from the same processes."""
    from experiments.runlog import UsageError, run_header
    from sdsl_jax.store import write_json
    from sdsl_jax.validation.misspecified import ladder_processes, process_from_record, process_record

    path = os.path.join(args.out, _PROCESSES_FILE)
    fitted_for = dict(design=[args.design, args.acceptance_design], processes=args.processes, seed=args.seed)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
            stored_for = stored["fitted_for"]
            processes = [process_from_record(r) for r in stored["true_processes"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path} is not a record of true processes ({err}): remove it to fit them "
                             "again") from None
        if stored_for != fitted_for:
            raise UsageError(f"{path} holds the true processes fitted for {stored_for}, not {fitted_for}: "
                             "use another --out, or remove it to fit the processes again")
        print(f"true processes read from {path} (fitted {stored.get('date', 'at an unknown date')}):", flush=True)
        for p in processes:
            print(f"  {p.name}: law {p.law}, acceptance {p.plane}", flush=True)
        return processes
    processes = ladder_processes(runs, pairs, processes=process_forms, seed=args.seed,
                                 log=lambda line: print(line, flush=True))
    write_json(path, dict(run_header("python -m experiments.calibration", None), command=command, fitted_for=fitted_for,
                          true_processes=[process_record(p) for p in processes]))
    print(f"true processes written to {path}: every later run of this study draws from them", flush=True)
    return processes


def stack_target_accept(families: list[str], models: list[str], *, model_effects) -> dict[str, float]:
    """NUTS's target acceptance for each form of a stack as its closures fit it: each family's own,
    and each acceptance model's with per-model effects where ``model_effects`` names any kind of
    model, 0.9 without (:func:`sdsl_jax.infer.posterior.plane_target_accept`)."""
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.infer.posterior import plane_target_accept
    from sdsl_jax.loss_laws import FAMILIES

    effects = bool(model_effects)
    return {**{name: FAMILIES[name].target_accept for name in families},
            **{name: plane_target_accept(ACCEPTANCE_MODELS[name], effects=effects) for name in models}}


def _misspecified(args, command: str) -> dict | None:
    """Synthetic closures from processes outside the lead form, scored against their truth; resumable.

    None when this run is one shard of several and the others have not finished theirs."""
    from experiments.runlog import UsageError
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.data import load_acceptance, load_pretraining, load_speculative
    from sdsl_jax.figures import n_star_band_figure, reliability_figure
    from sdsl_jax.loss_laws import FAMILIES, prior_key, same_prior_key
    from sdsl_jax.store import append_stage_line, read_stage_lines, shard_stage_path, stage_files
    from sdsl_jax.validation.closure_fits import ClosureSettings
    from sdsl_jax.validation.misspecified import (drawn_from, mean_curve_truth, process_record, summarize_closures,
                                                  synthetic_closure)

    names = [f for f in args.stack.split(",") if f]
    unknown = [f for f in names if f not in FAMILIES and f not in ACCEPTANCE_MODELS]
    if unknown:
        raise UsageError(f"--stack: unknown form(s) {unknown}; choose from "
                         f"{sorted(FAMILIES) + sorted(ACCEPTANCE_MODELS)}")
    stack = ([f for f in names if f in FAMILIES], [m for m in names if m in ACCEPTANCE_MODELS])
    if not stack[0] or not stack[1]:
        raise UsageError("--stack needs at least one loss-law family and one acceptance model")
    try:
        process_forms = [tuple(item.split(":")) for item in args.processes.split(",") if item]
        if not process_forms or any(len(f) != 2 or f[0] not in FAMILIES or f[1] not in ACCEPTANCE_MODELS
                                    for f in process_forms):
            raise ValueError
    except ValueError:
        raise UsageError(f"--processes: {args.processes!r} is not a list of law:acceptance-model pairs (laws "
                         f"{sorted(FAMILIES)}, acceptance models {sorted(ACCEPTANCE_MODELS)})") from None
    for flag in ("chains", "warmup", "draws"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if not 0 <= args.rerun_weight <= 1:
        raise UsageError(f"--rerun-weight must be in [0, 1], got {args.rerun_weight}")
    shard, shards = _shard(args)
    runs, pairs = load_pretraining(args.design), load_acceptance(args.acceptance_design)
    speculative = load_speculative(args.speculative_design) if args.measured == "speculative" else None
    processes = _true_processes(args, runs, pairs, process_forms, command)
    truths = [mean_curve_truth(p, runs, pairs, speculative) for p in processes]
    settings = ClosureSettings(chains=args.chains, warmup=args.warmup, draws=args.draws,
                               propagate=args.chains * args.draws, reruns=args.reruns,
                               rerun_weight=args.rerun_weight if args.reruns else None, stack_by=args.stack_by)
    # The fitting choices the code makes from the design (which kinds of model get acceptance effects,
    # each form's target acceptance), the exponents' prior and where the forecast comes from (the
    # stacked mixture) belong to the study too: a closure fitted under other choices is another
    # study's, never resumed into this one. Weights by rows, the first studies' choice, are named
    # by the key's lacking stack_by, so that their closures still resume.
    model_effects = list(pairs.model_effects_identified()[0])
    study = dict(forecast="stacked mixture", seed=args.seed, datasets=args.datasets, processes=args.processes,
                 stack=names, chains=args.chains,
                 warmup=args.warmup, draws=args.draws, design=[args.design, args.acceptance_design,
                         args.speculative_design if speculative is not None else "acceptance"],
                 model_effects=model_effects,
                 target_accept=stack_target_accept(*stack, model_effects=model_effects),
                 **prior_key(FAMILIES[name] for name in stack[0]),
                 **(dict(reruns=args.reruns, rerun_weight=args.rerun_weight) if args.reruns else {}),
                 **(dict(stack_by=args.stack_by) if args.stack_by != "rows" else {}))
    stages = os.path.join(args.out, "stages")
    os.makedirs(stages, exist_ok=True)
    study_path = os.path.join(stages, "misspecified.jsonl")
    stage_path = study_path if shards == 1 else shard_stage_path(study_path, shard, shards)

    def finished(report: bool = False) -> dict:
        ours = [unit for path in stage_files(study_path) for unit in read_stage_lines(path, warn=print)
                if same_prior_key(unit.get("study"), study)]
        # A closure drawn from another fit of its process (another machine's posterior median) scored
        # its bands against another truth: kept in the files, not counted.
        kept = {unit["index"]: unit["closure"] for unit in ours
                if drawn_from(unit["closure"], truths[unit["index"] % len(processes)])}
        others = sorted({unit["index"] for unit in ours} - set(kept))
        if report and others:
            print(f"{len(others)} closure(s) of this study were drawn from another fit of their true process "
                  f"(their targets' mean-curve N* differ from {_PROCESSES_FILE}'s): fitted again "
                  f"({', '.join(str(i + 1) for i in others[:10])}{', ...' if len(others) > 10 else ''})", flush=True)
        return kept

    done, failed = finished(report=True), []
    for i in range(args.datasets):
        if i in done or i % shards != shard:
            continue
        start = time.perf_counter()
        process = processes[i % len(processes)]
        try:
            done[i] = synthetic_closure(process, runs, pairs, speculative, settings, stack=stack,
                                        seed=args.seed + i, log=lambda line: None)
        except Exception:  # one failed closure must not end a study of hours: it is left for a rerun
            failed.append(i)
            print(f"  closure {i + 1}/{args.datasets} ({process.name}) failed; left for a rerun of the same "
                  f"command:\n{traceback.format_exc()}", flush=True)
            continue
        append_stage_line(stage_path, dict(study=study, index=i, closure=done[i]))
        print(f"  closure {i + 1}/{args.datasets} ({process.name}) [{time.perf_counter() - start:.0f} s, "
              f"{_resident_memory_gb():.1f} GB resident]", flush=True)
    done = finished()
    missing = [i for i in range(args.datasets) if i not in done]
    if failed:
        print(f"{len(failed)} closure(s) of this run failed ({', '.join(str(i + 1) for i in failed)}): rerun the same "
              "command to fit them again", flush=True)
    if missing:
        print(f"shard {shard}/{shards} finished; {len(missing)} of {args.datasets} closures are still with the other "
              "shards: the last shard to finish (or a rerun without --shard) writes the summary", flush=True)
        return None
    closures = [done[i] for i in range(args.datasets)]
    summary = summarize_closures(closures)
    overall = summary["overall"]
    ece = overall["p_best_expected_calibration_error"]  # None where no target has two candidates
    print(f"misspecified: {args.datasets} closures, N* 90% band coverage {overall['n_star_coverage']:.2f} "
          f"(binomial s.e. {np.sqrt(0.09 / max(overall['targets'], 1)):.3f} over {overall['targets']} targets), "
          f"P(best) expected calibration error {'n/a' if ece is None else f'{ece:.3f}'} over "
          f"{overall['p_best_forecasts']} forecasts; in {summary['closures_where_every_form_failed_its_checks']} "
          "closures every form failed its posterior checks and all were stacked", flush=True)
    groups = [(f"closures where {g}", v) for g, v in summary["by_checks"].items()]
    groups += [(f"closures with the {g} of the weight", v) for g, v in summary["by_true_family_weight"].items()]
    groups += [(f"process {g}", v) for g, v in summary["by_process"].items()]
    groups += [(f"process {g}", v) for g, v in summary["by_process_and_lead_law"].items()]
    groups += [(f"process {g}", v) for g, v in summary["by_failed_laws"].items()]
    for group, scores in groups:
        if scores["targets"]:
            ece = scores["p_best_expected_calibration_error"]
            bias, width = scores["n_star_median_log_ratio"], scores["n_star_median_log_width"]
            print(f"  {group}: N* coverage {scores['n_star_coverage']:.2f} over {scores['targets']} targets"
                  + ("" if bias is None else f" (median log(band median / truth) {bias:+.2f}, log width {width:.2f})")
                  + f", P(best) ECE {'n/a' if ece is None else f'{ece:.3f}'}", flush=True)
    reliability_figure(os.path.join(args.out, "misspecified_reliability.png"), summary, caption=command)
    n_star_band_figure(os.path.join(args.out, "misspecified_n_star_bands.png"), closures, caption=command)
    return dict(study, processes=[process_record(p) for p in processes], summary=summary, closures=closures)


if __name__ == "__main__":
    sys.exit(main())
