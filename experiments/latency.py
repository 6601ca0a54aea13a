"""Measure per-call latency of every ladder model: one draft step and one verification of k tokens.

    python -m experiments.latency --preset real --out fits/ladder-v1     # fits/ladder-v1/latency.csv (+ .json)

For each model of the preset (the shapes of ``experiments.ladder``), each batch size (``--batches``,
default 1 and 8) and each k = 1 .. ``--max-tokens`` (12): the seconds of one forward call reading
k positions with a KV cache of ``--cache-length`` positions, the call the speculative loop makes
(k = 1 is a draft step, k = gamma + 1 a verification), with what the decoding loop does with its
logits (softmax at every position, one sample, temperature 1). A timed repeat runs ``calls``
such calls in ONE compiled loop, each fed the previous call's sample (a data dependency, as in
decoding), so Python dispatch is not counted, as it is not inside ``speculative_generate``'s
compiled loop.
After a warm-up, the configurations of a model are timed in rotating order (``--repeats``
interleaved rounds) and the median and IQR per call are written.

Timing depends on shapes only, not on weight values, so the models are initialised with their
rung's seed instead of loaded: no checkpoint is needed and the file can be made on any machine
(the machine is recorded). Each finished model is kept in ``OUT/stages/latency.jsonl``; a rerun
resumes. Schema: ``sdsl-latency v1`` (``docs/data.md``).

The decoding loops do more than their calls (sampling, accept/reject, buffer updates), so unless
``--no-loops`` the loops themselves are timed too (rows of kind ``alone`` and ``iteration``): the
target decoding alone, seconds per token, and speculative decoding (``--loop-gammas``) of each
target with three smaller drafts, seconds per iteration. Timing a loop does not depend on what
is accepted: an iteration does the same work whatever the draft gets right.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import jax
import numpy as np
from flax import nnx

from sdsl_jax.lm.ladder import PRESETS, rung_config, rung_seed
from experiments.runlog import (Log, append_stage_line, command_line, configure_jax, run_command, read_stage_lines, versions,
                               write_json)
from sdsl_jax.data import LATENCY_SCHEMA, LatencyMeasurements, load_latency, save_latency
from sdsl_jax.lm.model import Transformer
from sdsl_jax.lm.timing import machine, time_calls, time_loops


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m experiments.latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="real", help="ladder whose shapes are timed (real)")
    p.add_argument("--out", default="fits/ladder-v1", help="folder of latency.csv and latency.json (fits/ladder-v1)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes (1 8)")
    p.add_argument("--max-tokens", type=int, default=12, help="largest k timed (12)")
    p.add_argument("--cache-length", type=int, default=80, help="positions already in the KV cache (80: the middle "
                   "of the measured decoding, 48-byte prompts and 64 new bytes)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved timed rounds (7)")
    p.add_argument("--repeat-seconds", type=float, default=0.02, help="target length of one timed repeat (0.02)")
    p.add_argument("--no-loops", action="store_true", help="skip the decoding-loop timings (target alone, speculative "
                   "iterations)")
    p.add_argument("--loop-gammas", type=int, nargs="+", default=[1, 4], help="lookaheads of the timed speculative "
                   "loops (1 4)")
    p.add_argument("--loop-tokens", type=int, default=64, help="tokens each timed loop generates (64)")
    p.add_argument("--loop-prompt-len", type=int, default=48, help="prompt bytes of the timed loops (48)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if min(args.loop_gammas) < 1 or args.loop_tokens < 1 or args.loop_prompt_len < 2:
        p.error("--loop-gammas and --loop-tokens must be >= 1, --loop-prompt-len >= 2")
    if min(args.batches) < 1 or args.max_tokens < 1 or args.repeats < 1 or args.cache_length < 0 \
            or not args.repeat_seconds > 0:
        p.error("--batches, --max-tokens and --repeats must be >= 1, --cache-length >= 0, --repeat-seconds > 0")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    preset = PRESETS[args.preset]
    if not args.no_loops and args.loop_prompt_len + args.loop_tokens + max(args.loop_gammas) + 1 > preset.seq_len:
        print(f"error: --loop-prompt-len + --loop-tokens + max --loop-gammas + 1 exceeds the models' context "
              f"{preset.seq_len}", file=sys.stderr)
        return 2
    if args.cache_length + args.max_tokens > preset.seq_len:
        print(f"error: --cache-length + --max-tokens = {args.cache_length + args.max_tokens} exceeds the models' "
              f"context {preset.seq_len}", file=sys.stderr)
        return 2
    configure_jax(devices=1)
    return run_command(lambda: _measure(args, argv, preset),
                             f"finished models are kept in {os.path.join(args.out, 'stages')}; rerun the same command "
                             "to continue")


def _measure(args, argv, preset) -> int:
    log = Log(args.quiet)
    args.machine = machine()
    stages = os.path.join(args.out, "stages", "latency.jsonl")
    os.makedirs(os.path.dirname(stages), exist_ok=True)
    settings = dict(batches=args.batches, max_tokens=args.max_tokens, cache_length=args.cache_length,
                    repeats=args.repeats, machine=args.machine,
                    loops=None if args.no_loops else dict(gammas=args.loop_gammas, tokens=args.loop_tokens,
                                                          prompt_len=args.loop_prompt_len))
    done = {entry["model"]: entry["rows"] for entry in read_stage_lines(stages, log.warning)
            if entry.get("settings") == settings}
    log(f"latency on {args.machine}: {len(preset.rungs)} models x batches {args.batches} x k = 1..{args.max_tokens}"
        + (f" ({len(done)} models done earlier)" if done else ""))
    rows = []
    names = [r.name for r in preset.rungs]
    models = {r.name: Transformer(rung_config(r, preset.seq_len), rngs=nnx.Rngs(rung_seed(r, preset)))
              for r in preset.rungs}
    with log.heartbeat(8.0):
        for rung in preset.rungs:
            if rung.name not in done:
                log(f"{rung.name}: compiling and timing")
                done[rung.name] = time_calls(rung.name, models[rung.name], batches=args.batches,
                                             max_tokens=args.max_tokens, cache_length=args.cache_length,
                                             repeats=args.repeats, repeat_seconds=args.repeat_seconds,
                                             machine=args.machine, log=log)
                if not args.no_loops:
                    done[rung.name] += time_loops(rung.name, models, names, prompt_len=args.loop_prompt_len,
                                                  loop_tokens=args.loop_tokens, loop_gammas=args.loop_gammas,
                                                  repeats=args.repeats, machine=args.machine, log=log)
                append_stage_line(stages, dict(model=rung.name, settings=settings, rows=done[rung.name]))
            rows.extend(done[rung.name])
    columns = {c.name: [r.get(c.name) for r in rows] for c in LATENCY_SCHEMA}
    table = LatencyMeasurements(**{c.name: tuple(columns[c.name]) if c.kind == "str" else
                                   np.asarray(columns[c.name], np.float64) for c in LATENCY_SCHEMA})
    path = os.path.join(args.out, "latency.csv")
    save_latency(table, path)
    load_latency(path)  # what we wrote follows sdsl-latency v1
    write_json(os.path.join(args.out, "latency.json"), dict(
        command=command_line("experiments.latency", argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), settings=settings,
        preset=preset.name, versions=versions(), devices=[str(d) for d in jax.devices()],
        note="models initialised with their rung's seed: timing depends on shapes, not on weight values"))
    log(f"wrote {path} ({len(rows)} rows) and latency.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
