"""Train the model ladder: byte-level transformers of several sizes, each at several token budgets.

    python -m experiments.ladder --preset micro      # CI-sized, seconds
    python -m experiments.ladder --preset real       # the committed ladder
    python -m experiments.ladder --preset factorial  # every size at five shared budgets (held-back rungs
                                                     # only with --held-back PREDICTIONS)

Every rung (model size) is trained ONCE with a warmup-stable-decay schedule and yields one model
per token budget through decay branches [Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations"]: the plateau run (constant learning rate after the
warmup) is forked at ``(1 - decay_fraction) * S_k`` and the fork decays linearly to zero at step
``S_k``. Batches are a function of ``(seed, step)``, so branch ``k`` IS the WSD run of length
``S_k`` (same batches, same schedule), at the cost of its decay only: four budgets cost about
1.2x one run instead of 1.9x. Why WSD and not one cosine run per budget: the same loss law fits
(Hägele et al. find WSD branches match cosine runs of the same length) at half the compute.

Resumption: the plateau and each branch checkpoint with orbax every ``--checkpoint-every``
steps (the preset's own by default); a finished branch leaves ``params/`` and ``result.json``
(written last, atomically). A killed run restarted with the same command continues from the last
checkpoint of the unit in flight and skips finished branches. Outputs in ``--out`` (default ``out/ladder/<preset>``):

* ``<rung>/budget_<steps>/params``: the trained parameters of one (size, budget) model;
* ``<rung>/budget_<steps>/result.json``: N, D, held-out and HellaSwag loss, timings;
* ``ladder.json``: the registry ``experiments.measure`` reads (configs, paths, provenance).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys

import jax

from experiments.runlog import Log, UsageError, command_line, run_command, versions, write_json
from sdsl_jax.lm.corpus import BLOCK, HOLDOUT_EVERY, load_corpus
from sdsl_jax.lm.ladder import PRESETS, EvalText, plan_rung, rung_config, rung_n_params, train_rung


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.ladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="micro", help="ladder to train (micro)")
    p.add_argument("--out", default=None, help="output folder (out/ladder/<preset>)")
    p.add_argument("--rungs", default=None, help="comma-separated rung names to train (all that are not held back)")
    p.add_argument("--held-back", metavar="PREDICTIONS", default=None,
                   help="also train the held-back rungs; PREDICTIONS is the committed predictions file for them, "
                        "which must exist (a held-back model is trained only after its prediction is registered)")
    p.add_argument("--devices", type=int, default=None, metavar="K",
                   help="train data-parallel on the first K of JAX's devices (all of them)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="steps between checkpoints: what an interruption can lose (the preset's)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    preset = PRESETS[args.preset]
    out = args.out or os.path.join("out", "ladder", preset.name)
    return run_command(lambda: _train_ladder(args, argv, preset, out),
                             f"finished models and checkpoints are kept in {out}; rerun the same command to continue")


def _train_ladder(args, argv, preset, out) -> int:
    log = Log(args.quiet)
    names = [r.name for r in preset.rungs]
    held_back = {r.name for r in preset.rungs if r.held_back}
    chosen = [n for n in names if n not in held_back] if args.rungs is None else args.rungs.split(",")
    if args.held_back is not None:
        if not os.path.isfile(args.held_back):
            raise UsageError(f"--held-back {args.held_back}: no such predictions file; commit the predictions for "
                             "the held-back models before training them")
        chosen += [n for n in names if n in held_back and n not in chosen]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        print(f"error: --rungs: unknown rung(s) {unknown}; preset '{preset.name}' has {names}", file=sys.stderr)
        return 2
    if held_back & set(chosen) and args.held_back is None:
        raise UsageError(f"--rungs names held-back rung(s) {sorted(held_back & set(chosen))}: give --held-back "
                         "PREDICTIONS (their committed predictions) to train them")
    devices = _chosen_devices(args.devices, [r for r in preset.rungs if r.name in chosen])
    if args.checkpoint_every is not None:
        if args.checkpoint_every < 1:
            raise UsageError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
        preset = dataclasses.replace(preset, checkpoint_every=args.checkpoint_every)
    corpus = load_corpus()
    evaluation = EvalText(corpus.test, length=preset.seq_len, count=preset.eval_windows)
    log(f"corpus: {len(corpus.train):,} training bytes, {len(corpus.test):,} held out; "
        f"{len(devices)} device(s)")
    for rung in preset.rungs:
        if rung.name in chosen:
            train_rung(rung, preset, corpus.train, evaluation, out, log, devices=devices)
    models = []  # every finished (size, budget) in --out, trained by this call or an earlier one
    for rung in preset.rungs:
        for budget in plan_rung(rung, preset, rung_n_params(rung, preset)).budgets:
            path = os.path.join(out, rung.name, f"budget_{budget}", "result.json")
            if os.path.exists(path):
                with open(path) as f:
                    result = json.load(f)
                models.append(dict(result, config=dataclasses.asdict(rung_config(rung, preset.seq_len)),
                                   params_path=os.path.join(rung.name, f"budget_{budget}", "params"),
                                   peak_lr=rung.peak_lr, batch_size=rung.batch_size, note=rung.note))
    registry = dict(
        preset=dataclasses.asdict(preset), models=models, command=command_line("experiments.ladder", argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), versions=versions(),
        devices=[str(d) for d in devices],
        corpus=dict(sources=corpus.sources, train_bytes=len(corpus.train), test_bytes=len(corpus.test),
                    holdout=f"every {HOLDOUT_EVERY}th block of {BLOCK} bytes per source"))
    write_json(os.path.join(out, "ladder.json"), registry)
    log(f"wrote {os.path.join(out, 'ladder.json')} ({len(models)} models)")
    return 0


def _chosen_devices(count: int | None, rungs) -> list:
    """The first ``count`` devices (all by default); every rung's batch must split evenly over them."""
    available = jax.devices()
    if count is None:
        count = len(available)
    if not 1 <= count <= len(available):
        raise UsageError(f"--devices must be between 1 and {len(available)} (the devices JAX sees), got {count}")
    for rung in rungs:
        if rung.batch_size % count:
            raise UsageError(f"--devices {count}: rung {rung.name}'s batch of {rung.batch_size} sequences does not "
                             f"split evenly over {count} devices")
    return available[:count]


if __name__ == "__main__":
    sys.exit(main())
