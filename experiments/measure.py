"""Measure speculative decoding between the ladder's models; write the datasets the fitters read.

    python -m experiments.measure --preset micro                 # after `experiments.ladder --preset micro`
    python -m experiments.measure --preset real --out fits/ladder-v1  # the committed measurements

For every (draft, target) pair with the draft smaller (targets: each rung's longest budget; drafts:
every budget of every smaller rung):

* alpha exactly, 1 - E[TV(p, q)] at temperature 1 along held-out corpus text and along HellaSwag
  contexts [Leviathan et al. 2023, Cor. 3.6], and the greedy agreement rate;
* perplexities of both models on both texts (from the ladder's evaluation, same windows).

For every pair of longest-budget models, speculative sampling (temperature 1) at each ``--gammas``
on ``--prompts`` HellaSwag prompts (the last ``--prompt-len`` bytes of each context,
``--new-tokens`` generated): accepted counts per iteration, their histogram, the alpha MLE
``sum K / (sum K + #rejections)`` (docs/theory.md), mean accepted length tau, calls; tokens per FLOP
achieved under the SDSL cost model (2N per draft token, 2M per verification pass) and under XLA's
own cost analysis of the compiled calls; and wall-clock tokens per second against the target
alone: medians over ``--repeats`` repeats, methods interleaved in a rotating order within each
repeat (timings vary from run to run).

Writes in ``--out``: ``pretraining.csv`` / ``acceptance.csv`` (schemas ``sdsl-pretraining v1`` /
``sdsl-acceptance v1``, held-out text: the models' own distribution, as the paper's targets'
pre-training data is theirs), ``pretraining_hellaswag.csv`` / ``acceptance_hellaswag.csv`` (the
same on HellaSwag, the paper's measurement text, out of distribution for models trained on
Shakespeare and the King James Bible), ``pairs.csv`` (every exact measurement), ``speculative.csv``
(every speculative run and timing) and ``measure.json`` (settings, seeds, versions, command).
Resumable: finished speculative configurations are kept in ``<out>/stages/speculative.jsonl`` and
skipped when the command is run again.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import sys

import jax
import numpy as np

from sdsl_jax.lm.corpus import load_corpus, prompts_for
from sdsl_jax.lm.ladder import PRESETS, EvalText, load_ladder
from sdsl_jax.lm.measure import exact_pairs, ladder_datasets, longest_budgets
from experiments.runlog import (Log, append_stage_line, command_line, run_command, read_stage_lines, sha256, versions,
                               write_json)
from sdsl_jax import SDSL_FLOPS, throughput
from sdsl_jax.data import load_speculative, save_acceptance, save_pretraining
from sdsl_jax.lm.decoding import autoregressive_generate, speculative_generate, summarize_runs
from sdsl_jax.lm.timing import interleaved_times, xla_flops
from sdsl_jax.store import atomic_write

# Per preset: what fits its models' context (prompt + new tokens + gamma + 1 <= seq_len) and its time.
SPECULATIVE_DEFAULTS = {
    # gamma up to 10: the law's gamma* for the largest target's drafts is 5.5-6, the top of the grid
    # the committed fits/ladder-v1/speculative.csv was measured on (1, 2, 4, 6).
    "real": dict(gammas="1,2,4,6,8,10", prompts=32, prompt_len=48, new_tokens=64, timing_prompts=4, repeats=7),
    "micro": dict(gammas="2", prompts=4, prompt_len=16, new_tokens=24, timing_prompts=2, repeats=3),
}
SPECULATIVE_DEFAULTS["factorial"] = SPECULATIVE_DEFAULTS["real"]  # the same shapes, every one at five budgets


def speculative_runs(models: dict, args, log: Log, stages_path: str) -> list[dict]:
    """Speculative sampling statistics, FLOPs and interleaved wall-clock for longest-budget pairs."""
    done = {(row["target"], row["draft"], row["gamma"]): row for row in read_stage_lines(stages_path, log.warning)}
    rung_models = longest_budgets([rec for rec, _ in models.values()])
    prompts = prompts_for(args.prompts, args.prompt_len)
    timing_prompts = prompts[: args.timing_prompts]
    key = jax.random.key(args.seed)
    rows = []
    for t_index, target_rec in enumerate(rung_models[1:], start=1):
        target = models[target_rec["name"]][1]
        m = target_rec["n_params"]
        flops_t1 = xla_flops(target, 1)
        configs = []
        for draft_rec in rung_models[:t_index]:
            for gamma in args.gammas:
                configs.append((draft_rec, gamma))
        todo = [(d, g) for d, g in configs if (target_rec["name"], d["name"], g) not in done]
        if not todo:
            rows.extend(done[target_rec["name"], d["name"], g] for d, g in configs)
            continue
        log(f"target {target_rec['name']} (M = {m:,}): {len(todo)} speculative configurations")

        def run_target(p, k):
            return autoregressive_generate(target, p, k, num_new_tokens=args.new_tokens, temperature=1.0)

        run_target(timing_prompts[0], key)  # compile
        new_rows, runners = [], []
        for draft_rec, gamma in todo:
            draft = models[draft_rec["name"]][1]
            n = draft_rec["n_params"]

            def run(p, k, draft=draft, gamma=gamma):
                return speculative_generate(draft, target, p, k, num_new_tokens=args.new_tokens, gamma=gamma,
                                            temperature=1.0)

            runs = [run(p, jax.random.fold_in(key, i))[1] for i, p in enumerate(prompts)]
            summary = summarize_runs(runs, gamma=gamma, n_draft=n, m_target=m)
            iterations, tokens, alpha_mle = summary.iterations, summary.new_tokens, summary.alpha_mle
            flops_spec_xla = iterations * (xla_flops(draft, 2) + (gamma - 1) * xla_flops(draft, 1)
                                           + xla_flops(target, gamma + 1))
            flops_spec_sdsl = summary.flops_sdsl
            new_rows.append(dict(
                target=target_rec["name"], draft=draft_rec["name"], n_target=m, n_draft=n,
                d_target=target_rec["n_tokens"], d_draft=draft_rec["n_tokens"], gamma=gamma,
                prompts=len(prompts), new_tokens=tokens, iterations=iterations, accepted=summary.accepted,
                alpha_mle=alpha_mle, accepted_over_drafted=summary.accepted_over_drafted, tau=summary.tau,
                histogram=";".join(str(int(c)) for c in summary.histogram),
                draft_calls=summary.draft_calls, target_calls=summary.target_calls,
                # Per prompt (same prompts, same order, for every row): a paired bootstrap over prompts.
                iterations_per_prompt=";".join(str(int(r.num_iterations)) for r in runs),
                accepted_per_prompt=";".join(str(int(np.asarray(r.accepted)[: int(r.num_iterations)].sum()))
                                             for r in runs),
                tokens_per_flop_sdsl=tokens / flops_spec_sdsl,
                predicted_tokens_per_flop_sdsl=float(throughput(alpha_mle, gamma, n, m)),
                target_alone_tokens_per_flop_sdsl=1 / SDSL_FLOPS.verification(m, 1),
                tokens_per_flop_xla=tokens / flops_spec_xla, target_alone_tokens_per_flop_xla=1 / flops_t1))
            runners.append(run)
            log(f"  {draft_rec['name']} -> {target_rec['name']} gamma {gamma}: alpha MLE {alpha_mle:.3f}, "
                f"tau {tokens / iterations:.2f}, tokens/FLOP x{SDSL_FLOPS.verification(m, 1) * tokens / flops_spec_sdsl:.2f} of the "
                f"target alone (SDSL cost), x{flops_t1 * tokens / flops_spec_xla:.2f} (XLA FLOPs)")
        # Wall-clock: every method on the same prompts and keys; rotating order inside each repeat.
        times = interleaved_times([run_target] + runners, timing_prompts, key, args.repeats)
        tokens_timed = len(timing_prompts) * args.new_tokens
        base = float(np.median(times[0]))  # index 0: the target alone
        for i, row in enumerate(new_rows, start=1):
            med = float(np.median(times[i]))
            row.update(seconds_median=med, seconds_iqr=float(np.subtract(*np.percentile(times[i], [75, 25]))),
                       tokens_per_second=tokens_timed / med, target_alone_tokens_per_second=tokens_timed / base,
                       wallclock_speedup=base / med, repeats=args.repeats)
            append_stage_line(stages_path, row)
            done[target_rec["name"], row["draft"], row["gamma"]] = row
        best = max(new_rows, key=lambda r: r["wallclock_speedup"])
        log(f"  wall-clock: target alone {tokens_timed / base:.0f} tokens/s; best {best['draft']} gamma "
            f"{best['gamma']}: x{best['wallclock_speedup']:.2f}")
        rows.extend(done[target_rec["name"], d["name"], g] for d, g in configs)
    return rows


def _write_csv(path: str, rows: list[dict]) -> None:
    def write(tmp):
        with open(tmp, "w", newline="") as f:
            # Every key of every row: a resumed stage written before a column existed lacks it (left blank).
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.measure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="micro", help="ladder preset (micro)")
    p.add_argument("--ladder", default=None, help="the ladder's folder (out/ladder/<preset>)")
    p.add_argument("--out", default=None, help="output folder (out/ladder/<preset>/measure)")
    p.add_argument("--gammas", default=None, help="lookaheads for speculative runs (real: 1,2,4,6,8,10; micro: 2)")
    p.add_argument("--prompts", type=int, default=None, help="HellaSwag prompts per speculative configuration "
                   "(real: 32; micro: 4)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt length in bytes (real: 48; micro: 16)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt (real: 64; micro: 24)")
    p.add_argument("--timing-prompts", type=int, default=None, help="prompts per wall-clock repeat (real: 4; micro: 2)")
    p.add_argument("--repeats", type=int, default=None, help="wall-clock repeats (real: 7; micro: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling keys (0)")
    p.add_argument("--exact-only", action="store_true",
                   help="write the exact acceptance of every pair and the pre-training runs, skip the speculative "
                        "runs and their timing (a later run without it adds them)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for name, value in SPECULATIVE_DEFAULTS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.gammas = tuple(int(g) for g in args.gammas.split(","))
    except ValueError:
        p.error(f"--gammas: expected comma-separated integers, got '{args.gammas}'")
    if min(args.gammas) < 1:
        p.error("--gammas: every lookahead must be >= 1")
    for name in ("prompts", "prompt_len", "new_tokens", "timing_prompts", "repeats"):
        if getattr(args, name) < 1 or (name == "prompt_len" and args.prompt_len < 2):
            p.error(f"--{name.replace('_', '-')}: must be a positive integer (prompt-len >= 2)")
    if args.timing_prompts > args.prompts:
        p.error("--timing-prompts cannot exceed --prompts")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    preset = PRESETS[args.preset]
    ladder_dir = args.ladder or os.path.join("out", "ladder", preset.name)
    out = args.out or os.path.join(ladder_dir, "measure")
    return run_command(lambda: _measure(args, argv, preset, ladder_dir, out),
                             f"finished stages are kept in {os.path.join(out, 'stages')}; rerun the same command to "
                             "continue")


def _measure(args, argv, preset, ladder_dir, out) -> int:
    log = Log(args.quiet)
    need = args.prompt_len + args.new_tokens + max(args.gammas) + 1
    if need > preset.seq_len:
        print(f"error: prompt-len + new-tokens + max gamma + 1 = {need} exceeds the models' context "
              f"{preset.seq_len}", file=sys.stderr)
        return 2
    try:
        registry, models = load_ladder(ladder_dir)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(os.path.join(out, "stages"), exist_ok=True)
    log(f"{len(models)} models from {ladder_dir}")
    corpus = load_corpus()
    evaluation = EvalText(corpus.test, length=preset.seq_len, count=preset.eval_windows)
    pairs = exact_pairs(models, evaluation, log)
    if not pairs:
        print("error: the ladder has no pair with a smaller draft", file=sys.stderr)
        return 2
    _write_csv(os.path.join(out, "pairs.csv"), pairs)
    source = f"sdsl-jax ladder '{preset.name}'"
    for text, suffix in (("heldout", ""), ("hellaswag", "_hellaswag")):
        runs, acceptance = ladder_datasets(registry, pairs, text, source)
        save_pretraining(runs, os.path.join(out, f"pretraining{suffix}.csv"))
        save_acceptance(acceptance, os.path.join(out, f"acceptance{suffix}.csv"))
    log(f"wrote pretraining / acceptance CSVs ({len(registry['models'])} runs, {len(pairs)} pairs) to {out}")
    if args.exact_only:
        return 0
    spec = speculative_runs(models, args, log, os.path.join(out, "stages", "speculative.jsonl"))
    _write_csv(os.path.join(out, "speculative.csv"), spec)
    load_speculative(os.path.join(out, "speculative.csv"))  # what we wrote follows sdsl-speculative v1
    write_json(os.path.join(out, "measure.json"), dict(
        command=command_line("experiments.measure", argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        settings={k: v for k, v in vars(args).items()}, ladder=dict(
            folder=ladder_dir, registry_sha256=sha256(os.path.join(ladder_dir, "ladder.json")),
            command=registry["command"], preset=registry["preset"], corpus=registry["corpus"],
            models=[{k: v for k, v in m.items() if k != "params_path"} for m in registry["models"]]),
        versions=versions(), devices=[str(d) for d in jax.devices()],
        speculative_runs=len(spec), pairs=len(pairs)))
    log(f"wrote {out}/speculative.csv ({len(spec)} runs) and measure.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
