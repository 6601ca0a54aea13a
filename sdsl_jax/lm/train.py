"""Training core for the model ladder: AdamW with a warmup-stable-decay schedule, data parallel.

Pure functional steps over ``(params, opt_state)`` so the same code runs on one device or many:
the batch is sharded along a ``data`` mesh axis spanning all devices, parameters and optimizer
state are replicated, and XLA inserts the gradient all-reduce. ``XLA_FLAGS=
--xla_force_host_platform_device_count=4`` exercises the multi-device path on a CPU.

Schedule: warmup-stable-decay (WSD; Hu et al. 2024, "MiniCPM"; Hägele et al. 2024, "Scaling Laws
and Compute-Optimal Training Beyond Fixed Training Durations"): linear warmup, a constant plateau,
then a linear decay to zero over the last ``decay_fraction`` of the run. A decay branch taken from
the plateau at step s gives a model trained on s tokens-budget at the cost of the short decay
only, which is how one run yields several token budgets D for the loss law L(N, D). The schedule
is data (:class:`WSD`), an argument of the compiled step rather than a constant in it, so that a
rung's plateau and all its decay branches share one compiled program.

:func:`run_steps` adds orbax checkpoints and exact resumption (batches are a function of the seed
and the step); :func:`train` is one WSD run built on it, ``experiments.ladder`` the plateau and
decay branches.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from sdsl_jax.lm.checkpoint import checkpoint_manager, restore_latest
from sdsl_jax.lm.model import Transformer


class WSD(NamedTuple):
    """A warmup-stable-decay schedule as data: the learning rate rises linearly from 0 to ``peak``
    over ``warmup_steps``, stays there until ``stable_end``, and falls linearly to 0 at
    ``total_steps``. Its fields are arrays (float32 peak, int32 steps), traced by the compiled
    step (:func:`make_scheduled_train_step`)."""

    peak: jax.Array
    warmup_steps: jax.Array
    stable_end: jax.Array
    total_steps: jax.Array


NO_DECAY = 2**31 - 1
"""``stable_end`` and ``total_steps`` of a schedule that never decays (a plateau run)."""


def wsd(*, peak: float, warmup_steps: int, total_steps: int = NO_DECAY, stable_end: int | None = None,
        decay_fraction: float = 0.2) -> WSD:
    """A :class:`WSD`: the decay over the last ``decay_fraction`` of ``total_steps`` (rounded to whole
    steps), or from ``stable_end`` when given. Without ``total_steps``, a plateau that never decays."""
    if total_steps != NO_DECAY and stable_end is None:
        if not 0 <= warmup_steps < total_steps or not 0 < decay_fraction < 1:
            raise ValueError(f"need 0 <= warmup_steps < total_steps and 0 < decay_fraction < 1, got "
                             f"{warmup_steps}, {total_steps}, {decay_fraction}")
        stable_end = max(warmup_steps, total_steps - max(1, int(round(decay_fraction * total_steps))))
    stable_end = total_steps if stable_end is None else stable_end
    if not 0 <= warmup_steps <= stable_end <= total_steps:
        raise ValueError(f"need 0 <= warmup_steps <= stable_end <= total_steps, got {warmup_steps}, {stable_end}, "
                         f"{total_steps}")
    return WSD(jnp.asarray(peak, jnp.float32), *(jnp.asarray(v, jnp.int32)
                                                 for v in (warmup_steps, stable_end, total_steps)))


def wsd_learning_rate(count: jax.Array, schedule: WSD) -> jax.Array:
    """The learning rate of ``schedule`` at step ``count`` (float32)."""
    peak, warmup, stable_end, total = schedule
    count = jnp.asarray(count, jnp.int32)
    c = count.astype(jnp.float32)
    rise = jnp.maximum(warmup, 1).astype(jnp.float32)
    fall = jnp.maximum(total - stable_end, 1).astype(jnp.float32)
    warm = peak * (jnp.clip(c, 0.0, rise) / rise)
    decay = peak * (1.0 - jnp.clip((count - stable_end).astype(jnp.float32), 0.0, fall) / fall)
    return jnp.where(count < warmup, warm, jnp.where(count < stable_end, peak, decay))


def wsd_schedule(*, peak: float, warmup_steps: int, total_steps: int, decay_fraction: float = 0.2) -> optax.Schedule:
    """Warmup-stable-decay learning rate: 0 -> peak (linear), peak, then linear to 0 at ``total_steps``
    (:func:`wsd` as an optax schedule)."""
    schedule = wsd(peak=peak, warmup_steps=warmup_steps, total_steps=total_steps, decay_fraction=decay_fraction)
    return functools.partial(wsd_learning_rate, schedule=schedule)


def scheduled_adamw(schedule: WSD, *, weight_decay: float) -> optax.GradientTransformation:
    """AdamW under ``schedule``; its state has the same structure for every schedule."""
    return optax.adamw(functools.partial(wsd_learning_rate, schedule=schedule), weight_decay=weight_decay)


class TrainState(NamedTuple):
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array


def next_token_loss(graphdef, params, batch: jax.Array) -> jax.Array:
    """Mean cross-entropy (nats per token) of predicting ``batch[:, 1:]`` from ``batch[:, :-1]``."""
    model = nnx.merge(graphdef, params)
    logits, _ = model(batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def data_mesh(devices=None) -> jax.sharding.Mesh:
    devices = np.asarray(jax.devices() if devices is None else devices)
    return jax.sharding.Mesh(devices, ("data",))


def init_train_state(model: Transformer, optimizer: optax.GradientTransformation, mesh) -> tuple:
    graphdef, params = nnx.split(model)
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.device_put(params, replicated)
    # Every leaf committed to the replicated sharding, as the step's outputs are: an uncommitted
    # leaf here made the second call compile the step again.
    state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
    return graphdef, jax.device_put(state, replicated)


def make_train_step(graphdef, optimizer: optax.GradientTransformation):
    """A jitted ``step(state, batch) -> (state, loss)``; shard ``batch`` with :func:`shard_batch`."""

    return jax.jit(lambda state, batch: _step(graphdef, optimizer, state, batch))


def _step(graphdef, optimizer: optax.GradientTransformation, state: TrainState, batch: jax.Array):
    loss, grads = jax.value_and_grad(lambda p: next_token_loss(graphdef, p, batch))(state.params)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32/int64 counters internally
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1), loss


@functools.lru_cache(maxsize=8)
def make_scheduled_train_step(graphdef, *, weight_decay: float):
    """A jitted ``step(state, batch, schedule) -> (state, loss)`` of :func:`scheduled_adamw`.

    The schedule is an argument: one compiled program serves a rung's plateau and every decay
    branch (and every :func:`train` of one model shape in a process).
    """

    @jax.jit
    def step(state: TrainState, batch: jax.Array, schedule: WSD):
        return _step(graphdef, scheduled_adamw(schedule, weight_decay=weight_decay), state, batch)

    return step


def shard_batch(batch: np.ndarray, mesh) -> jax.Array:
    """Place a ``(batch, seq)`` token array with its leading axis split over the mesh's devices."""
    if batch.shape[0] % mesh.devices.size:
        raise ValueError(f"batch size {batch.shape[0]} is not divisible by {mesh.devices.size} devices")
    return jax.device_put(jnp.asarray(batch, jnp.int32), NamedSharding(mesh, PartitionSpec("data")))


def sample_batch(tokens: np.ndarray, rng: np.random.Generator, *, batch_size: int, seq_len: int) -> np.ndarray:
    """Random windows of ``seq_len + 1`` tokens (inputs and shifted targets)."""
    starts = rng.integers(0, len(tokens) - seq_len - 1, batch_size)
    return np.stack([tokens[s : s + seq_len + 1] for s in starts])


def run_steps(step_fn, state: TrainState, tokens: np.ndarray, *, end: int, seed: int, batch_size: int, seq_len: int,
              mesh, manager, checkpoint_every: int, progress=None, label: str = ""):
    """Advance ``state`` to step ``end``, saving into ``manager`` every ``checkpoint_every`` steps and at ``end``.

    The batch of step ``s`` is drawn from ``np.random.default_rng([seed, s])``, so a run resumed
    from a checkpoint sees exactly the batches an uninterrupted one would.

    Returns:
      ``(state, losses)``: the new state and the loss of every step run here.
    """
    import orbax.checkpoint as ocp

    start, t0 = int(state.step), time.perf_counter()
    losses = []  # device scalars, read once at the end: no host sync on every step
    for s in range(start, end):
        batch = sample_batch(tokens, np.random.default_rng([seed, s]), batch_size=batch_size, seq_len=seq_len)
        state, loss = step_fn(state, shard_batch(batch, mesh))
        losses.append(loss)
        done = s + 1
        if done % checkpoint_every == 0 or done == end:
            manager.save(done, args=ocp.args.StandardSave(state), force=True)
            if progress:
                rate = (done - start) / (time.perf_counter() - t0)
                progress(f"{label}step {done}/{end} loss {float(loss):.4f} ({rate:.1f} steps/s, "
                         f"{(end - done) / rate:.0f} s left)")
    return state, [float(v) for v in losses]


def train(
    config,
    tokens: np.ndarray,
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    peak_lr: float,
    seed: int,
    checkpoint_dir: str,
    checkpoint_every: int = 100,
    warmup_steps: int | None = None,
    decay_fraction: float = 0.2,
    stop_after: int | None = None,
    progress=None,
    devices=None,
):
    """Train a :class:`Transformer` with AdamW + WSD, checkpointing with orbax and resuming.

    The batch of step ``s`` is drawn from ``np.random.default_rng([seed, s])``, so a resumed run
    sees exactly the batches an uninterrupted one would: a killed run loses at most the steps
    since its last checkpoint. ``stop_after`` ends early (for tests and time-boxed runs) after
    saving a checkpoint.

    Returns:
      ``(model, losses)``: the trained model and the losses of the steps run in this call.
    """
    mesh = data_mesh(devices)
    warmup = warmup_steps if warmup_steps is not None else max(1, steps // 20)
    schedule = wsd(peak=peak_lr, warmup_steps=warmup, total_steps=steps, decay_fraction=decay_fraction)
    graphdef, state = init_train_state(Transformer(config, rngs=nnx.Rngs(seed)),
                                       scheduled_adamw(schedule, weight_decay=0.1), mesh)
    manager = checkpoint_manager(checkpoint_dir, keep=2)
    restored = restore_latest(manager, state)
    if restored is not None:
        state = restored
        if progress:
            progress(f"resumed from the checkpoint at step {int(state.step)}")
    end = steps if stop_after is None else min(steps, stop_after)
    step = functools.partial(make_scheduled_train_step(graphdef, weight_decay=0.1), schedule=schedule)
    state, losses = run_steps(step, state, tokens, end=end, seed=seed,
                              batch_size=batch_size, seq_len=seq_len, mesh=mesh, manager=manager,
                              checkpoint_every=checkpoint_every, progress=progress)
    manager.wait_until_finished()
    manager.close()
    return nnx.merge(graphdef, state.params), losses
