"""The model ladder: byte-level transformers of several sizes, each trained once with a
warmup-stable-decay schedule and forked into one model per token budget; the presets, the plan of
each rung, its training (resumable) and the registry the measurements read.
``python -m experiments.ladder --help`` describes the design.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import time

import jax
import numpy as np
from flax import nnx

from sdsl_jax.lm.checkpoint import checkpoint_manager, restore_latest
from sdsl_jax.lm.corpus import hellaswag_prompts
from sdsl_jax.lm.measure import text_nll, windows
from sdsl_jax.lm.model import Transformer, TransformerConfig, count_params
from sdsl_jax.lm.train import (WSD, data_mesh, init_train_state, make_scheduled_train_step, run_steps, scheduled_adamw,
                               wsd)
from sdsl_jax.store import write_json

__all__ = [
    "Rung",
    "Preset",
    "PRESETS",
    "rung_config",
    "Plan",
    "rung_seed",
    "rung_n_params",
    "plan_rung",
    "save_params",
    "load_model",
    "EvalText",
    "train_rung",
]


@dataclasses.dataclass(frozen=True)
class Rung:
    """One model size: its shape, final token budget (tokens per parameter) and optimisation."""

    name: str
    d_model: int
    num_layers: int
    num_heads: int
    tokens_per_param: float
    batch_size: int
    peak_lr: float
    note: str = ""
    held_back: bool = False  # trained only with --held-back, after the predictions for it are committed


@dataclasses.dataclass(frozen=True)
class Preset:
    """A ladder: its rungs, their budgets, and evaluation sizes.

    Budgets are fractions of each rung's final budget (``tokens_per_param`` N), or, with
    ``shared_budgets``, the same token counts for every rung (a factorial design: model size and
    training budget vary independently, so the law's N and D terms are separately identified).
    """

    name: str
    rungs: tuple[Rung, ...]
    budget_fractions: tuple[float, ...]
    seq_len: int = 128
    decay_fraction: float = 0.2
    max_warmup_steps: int = 100
    eval_windows: int = 256
    seed: int = 0
    checkpoint_every: int = 200
    shared_budgets: tuple[float, ...] = ()


PRESETS = {
    # Three tiny rungs and two budgets: exercises every code path in seconds (tests, CI).
    "micro": Preset(
        name="micro",
        rungs=(Rung("m1", 32, 1, 1, 4.0, 8, 3e-3), Rung("m2", 32, 2, 1, 4.0, 8, 3e-3),
               Rung("m3", 64, 1, 2, 2.0, 8, 3e-3)),
        budget_fractions=(0.5, 1.0), seq_len=64, eval_windows=16, checkpoint_every=20),
    # Seven sizes spanning 50x (25k to 1.2M parameters), budgets 1/8, 1/4, 1/2, 1 of the final.
    # Small rungs get 40 tokens per parameter (cheap) so their shortest branch still has ~60 steps;
    # the 1.2M rung is the wall-clock target, deliberately undertrained (4 tokens per parameter:
    # 20 would cost five times its training). Peak learning rates from short sweeps on this corpus (d_model 64,
    # 725 steps: 3e-3 -> 2.03, 1e-2 -> 1.89, 2e-2 -> 1.93 nats/byte held out; d_model 96, 300
    # steps: 2e-3 -> 2.36, 6e-3 -> 2.23), scaled about as 1/d_model above that.
    "real": Preset(
        name="real",
        rungs=(Rung("L1", 32, 1, 1, 40.0, 16, 1e-2), Rung("L2", 48, 1, 1, 40.0, 16, 1e-2),
               Rung("L3", 64, 1, 2, 40.0, 16, 1e-2), Rung("L4", 64, 2, 2, 20.0, 32, 1e-2),
               Rung("L5", 96, 2, 3, 20.0, 32, 6e-3), Rung("L6", 96, 4, 3, 20.0, 32, 6e-3),
               Rung("L7", 128, 6, 4, 4.0, 32, 4e-3, note="undertrained wall-clock target")),
        budget_fractions=(0.125, 0.25, 0.5, 1.0)),
    # The factorial ladder: the real ladder's seven shapes, every one trained on the same five budgets
    # (0.625M to 10M bytes, a factor of two apart), so that log N and log D are uncorrelated over the
    # rows; and two held-back models, a 2.5M-parameter target larger than any other and a draft
    # between L2 and L3, trained only after the predictions for them are committed
    # (fits/ladder/preregistered/predictions.json).
    "factorial": Preset(
        name="factorial",
        rungs=(Rung("L1", 32, 1, 1, 0.0, 16, 1e-2), Rung("L2", 48, 1, 1, 0.0, 16, 1e-2),
               Rung("L3", 64, 1, 2, 0.0, 16, 1e-2), Rung("L4", 64, 2, 2, 0.0, 32, 1e-2),
               Rung("L5", 96, 2, 3, 0.0, 32, 6e-3), Rung("L6", 96, 4, 3, 0.0, 32, 6e-3),
               Rung("L7", 128, 6, 4, 0.0, 32, 4e-3),
               Rung("H2", 56, 1, 1, 0.0, 16, 1e-2, note="held back: a draft between L2 and L3", held_back=True),
               Rung("H8", 160, 8, 5, 0.0, 32, 3e-3, note="held back: the target beyond the ladder", held_back=True)),
        budget_fractions=(), shared_budgets=(0.625e6, 1.25e6, 2.5e6, 5e6, 1e7)),
}


def rung_config(rung: Rung, seq_len: int) -> TransformerConfig:
    return TransformerConfig(d_model=rung.d_model, num_layers=rung.num_layers, num_heads=rung.num_heads,
                             d_ff=4 * rung.d_model, max_len=seq_len)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Steps of one rung: ``budgets[k]`` is ``S_k``; branch k forks the plateau at ``forks[k]``."""

    n_params: int
    tokens_per_step: int
    warmup: int
    budgets: tuple[int, ...]
    forks: tuple[int, ...]

    @property
    def total_steps(self) -> int:
        """Plateau steps plus every branch's decay: what training the rung costs."""
        return self.forks[-1] + sum(b - f for b, f in zip(self.budgets, self.forks))


def rung_seed(rung: Rung, preset: Preset) -> int:
    """Seed of a rung's initialisation and batch stream: the same as ``sdsl_jax.lm.train.train(seed=...)``,
    so a budget's model can be checked against a standalone WSD run of that length."""
    return preset.seed * 1000 + preset.rungs.index(rung)


def rung_n_params(rung: Rung, preset: Preset) -> int:
    abstract = nnx.eval_shape(lambda: Transformer(rung_config(rung, preset.seq_len), rngs=nnx.Rngs(0)))
    return count_params(abstract)


def plan_rung(rung: Rung, preset: Preset, n_params: int) -> Plan:
    tokens_per_step = rung.batch_size * preset.seq_len
    if preset.shared_budgets:
        budgets = tuple(sorted({max(2, round(b / tokens_per_step)) for b in preset.shared_budgets}))
    else:
        final = max(1, math.ceil(rung.tokens_per_param * n_params / tokens_per_step))
        budgets = tuple(sorted({max(2, round(f * final)) for f in preset.budget_fractions}))
    forks = tuple(b - max(1, round(preset.decay_fraction * b)) for b in budgets)
    warmup = max(1, min(preset.max_warmup_steps, forks[0] // 2))
    return Plan(n_params, tokens_per_step, warmup, budgets, forks)


def _schedule(rung: Rung, plan: Plan, budget: int | None) -> WSD:
    """The plateau's schedule (``budget=None``: warm-up, then the peak) or branch ``budget``'s WSD.

    The two agree up to the fork, and AdamW's state does not depend on the schedule, so a plateau
    state continues under a branch's schedule unchanged.
    """
    if budget is None:
        return wsd(peak=rung.peak_lr, warmup_steps=plan.warmup)
    return wsd(peak=rung.peak_lr, warmup_steps=plan.warmup, total_steps=budget,
               stable_end=plan.forks[plan.budgets.index(budget)])


def save_params(model: nnx.Module, path: str) -> None:
    import orbax.checkpoint as ocp

    path = os.path.abspath(path)
    if os.path.exists(path):
        shutil.rmtree(path)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, nnx.state(model, nnx.Param))


def load_model(config: TransformerConfig, path: str, *, seed: int = 0, device=None) -> Transformer:
    """A :class:`Transformer` with the parameters saved at ``path`` by :func:`save_params`, on ``device``.

    The parameters are placed on one device (``device``, default the first of ``jax.devices()``),
    whatever devices trained them: a ladder trained data-parallel on several devices loads on a
    machine with fewer (restored onto the topology that saved it, it would not).
    """
    import orbax.checkpoint as ocp

    device = jax.devices()[0] if device is None else device
    placement = jax.sharding.SingleDeviceSharding(device)
    # The parameters' shapes only (nnx.eval_shape): initialising them for real would compute and
    # compile every initializer just to overwrite its result.
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(seed)))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement),
                            nnx.state(model, nnx.Param))
    with ocp.StandardCheckpointer() as ckpt:
        nnx.update(model, ckpt.restore(os.path.abspath(path), abstract))
    return model


class EvalText:
    """The fixed evaluation windows: held-out split of the corpus and HellaSwag contexts."""

    def __init__(self, test_tokens: np.ndarray, *, length: int, count: int):
        hellaswag = np.frombuffer("\n".join(hellaswag_prompts()).encode("utf-8"), np.uint8)
        self.heldout = windows(test_tokens, length=length, count=count)
        self.hellaswag = windows(hellaswag, length=length, count=count)

    def losses(self, model) -> dict[str, float]:
        return dict(loss_heldout=text_nll(model, self.heldout), loss_hellaswag=text_nll(model, self.hellaswag))


def train_rung(rung: Rung, preset: Preset, tokens: np.ndarray, evaluation: EvalText, out: str, log=print, *,
               devices=None) -> list[dict]:
    """Train one rung (plateau + decay branches), resuming from whatever ``out`` holds; data-parallel
    over ``devices`` (all of ``jax.devices()`` by default)."""
    config = rung_config(rung, preset.seq_len)
    seed = rung_seed(rung, preset)
    model = Transformer(config, rngs=nnx.Rngs(seed))
    plan = plan_rung(rung, preset, count_params(model))
    rung_dir = os.path.join(out, rung.name)
    results = []
    pending = [b for b in plan.budgets if not os.path.exists(os.path.join(rung_dir, f"budget_{b}", "result.json"))]
    log(f"{rung.name}: N = {plan.n_params:,} parameters, budgets {list(plan.budgets)} steps of "
        f"{plan.tokens_per_step} tokens, {plan.total_steps} steps in all; {len(pending)} to train")
    mesh = data_mesh(devices)
    if pending:
        graphdef, state = init_train_state(model, scheduled_adamw(_schedule(rung, plan, None), weight_decay=0.1),
                                           mesh)
        plateau = checkpoint_manager(os.path.join(rung_dir, "plateau"), keep=1)
        state = restore_latest(plateau, state) or state
        step = make_scheduled_train_step(graphdef, weight_decay=0.1)
    for budget, fork in zip(plan.budgets, plan.forks):
        budget_dir = os.path.join(rung_dir, f"budget_{budget}")
        result_path = os.path.join(budget_dir, "result.json")
        if os.path.exists(result_path):
            with open(result_path) as f:
                results.append(json.load(f))
            continue
        if int(state.step) > fork:
            raise RuntimeError(f"{rung_dir}/plateau is past step {fork} but budget {budget} is unfinished; "
                               f"delete {rung_dir} to retrain this rung")
        t0 = time.perf_counter()
        steps = dict(tokens=tokens, seed=seed, batch_size=rung.batch_size, seq_len=preset.seq_len, mesh=mesh,
                     checkpoint_every=preset.checkpoint_every, progress=log)
        state, _ = run_steps(functools.partial(step, schedule=_schedule(rung, plan, None)), state, end=fork,
                             manager=plateau, label=f"{rung.name} plateau ", **steps)
        branch = checkpoint_manager(os.path.join(budget_dir, "train"), keep=1)
        branch_state = restore_latest(branch, state) or state
        branch_state, _ = run_steps(functools.partial(step, schedule=_schedule(rung, plan, budget)), branch_state,
                                    end=budget, manager=branch, label=f"{rung.name} decay to {budget}: ", **steps)
        trained = nnx.merge(graphdef, branch_state.params)
        save_params(trained, os.path.join(budget_dir, "params"))
        result = dict(rung=rung.name, name=f"{rung.name}@{budget}", budget_steps=budget, fork_step=fork,
                      n_params=plan.n_params, n_tokens=budget * plan.tokens_per_step,
                      tokens_per_param=budget * plan.tokens_per_step / plan.n_params,
                      train_seconds_since_resume=round(time.perf_counter() - t0, 2), **evaluation.losses(trained))
        write_json(result_path, result)
        branch.close()
        shutil.rmtree(os.path.join(budget_dir, "train"))  # optimizer state no longer needed
        log(f"{result['name']}: D = {result['n_tokens']:,} tokens ({result['tokens_per_param']:.1f}/param), "
            f"held-out loss {result['loss_heldout']:.4f}, HellaSwag {result['loss_hellaswag']:.4f} nats/byte")
        results.append(result)
    if pending:
        plateau.close()
        shutil.rmtree(os.path.join(rung_dir, "plateau"))
    return results


def load_ladder(directory: str) -> tuple[dict, dict]:
    """The ladder registry and its models ``{name: (record, Transformer)}``."""
    path = os.path.join(directory, "ladder.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: train the ladder first (python -m experiments.ladder)")
    with open(path) as f:
        registry = json.load(f)
    models = {}
    for record in registry["models"]:
        config = TransformerConfig(**record["config"])
        models[record["name"]] = (record, load_model(config, os.path.join(directory, record["params_path"])))
    return registry, models
