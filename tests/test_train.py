"""Training core: the WSD schedule, learning on real text, and identical steps on 1 and 4 devices."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from sdsl_jax.lm import corpus
from sdsl_jax.lm.train import (
    data_mesh,
    init_train_state,
    make_scheduled_train_step,
    make_train_step,
    sample_batch,
    scheduled_adamw,
    shard_batch,
    train,
    wsd,
    wsd_learning_rate,
    wsd_schedule,
)
from sdsl_jax.lm.model import Transformer, TransformerConfig

CONFIG = TransformerConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=2, d_ff=128, max_len=64)


def test_wsd_schedule_shape():
    lr = wsd_schedule(peak=1e-3, warmup_steps=10, total_steps=100, decay_fraction=0.2)
    assert float(lr(0)) == 0.0 and float(lr(10)) == pytest.approx(1e-3)
    assert float(lr(50)) == pytest.approx(1e-3) and float(lr(80)) == pytest.approx(1e-3)
    assert float(lr(90)) == pytest.approx(5e-4) and float(lr(100)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        wsd_schedule(peak=1e-3, warmup_steps=100, total_steps=100)


def test_wsd_as_data_is_optax_joined_linear_schedules():
    reference = optax.join_schedules([optax.linear_schedule(0.0, 1e-3, 10), optax.constant_schedule(1e-3),
                                      optax.linear_schedule(1e-3, 0.0, 30)], [10, 70])
    counts = np.arange(0, 120)
    got = np.asarray(wsd_learning_rate(counts, wsd(peak=1e-3, warmup_steps=10, total_steps=100, stable_end=70)))
    np.testing.assert_allclose(got, np.asarray(reference(counts)), rtol=1e-6, atol=1e-12)
    plateau = wsd(peak=1e-3, warmup_steps=10)  # warm-up, then the peak for good
    np.testing.assert_allclose(np.asarray(wsd_learning_rate(counts, plateau)), [min(c / 10, 1) * 1e-3 for c in counts],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="stable_end"):
        wsd(peak=1e-3, warmup_steps=10, total_steps=100, stable_end=120)


def test_one_compiled_step_serves_the_plateau_and_every_branch():
    mesh = data_mesh(jax.devices()[:1])
    plateau = wsd(peak=3e-3, warmup_steps=2)
    graphdef, state = init_train_state(Transformer(CONFIG, rngs=nnx.Rngs(0)), scheduled_adamw(plateau, weight_decay=0.1),
                                       mesh)
    step = make_scheduled_train_step(graphdef, weight_decay=0.1)
    batch = shard_batch(sample_batch(corpus.load_corpus().train[:100_000], np.random.default_rng(0), batch_size=4,
                                     seq_len=63), mesh)
    state, _ = step(state, batch, plateau)
    for end in (6, 9):
        branch, _ = step(state, batch, wsd(peak=3e-3, warmup_steps=2, total_steps=end, stable_end=4))
    assert step._cache_size() == 1
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(branch.params), jax.tree.leaves(state.params)))
    # The schedule passed is the one used, not one baked into the program: a schedule already at its
    # end (rate 0 at the state's step) leaves the parameters where they are.
    ended = wsd(peak=3e-3, warmup_steps=0, total_steps=1, stable_end=0)
    still, _ = step(state, batch, ended)
    assert step._cache_size() == 1
    for a, b in zip(jax.tree.leaves(still.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def run_steps(devices, steps, seed=0):
    mesh = data_mesh(devices)
    optimizer = optax.adamw(wsd_schedule(peak=3e-3, warmup_steps=min(5, steps - 1), total_steps=steps), weight_decay=0.01)
    graphdef, state = init_train_state(Transformer(CONFIG, rngs=nnx.Rngs(seed)), optimizer, mesh)
    step = make_train_step(graphdef, optimizer)
    tokens = corpus.load_corpus().train[:2_000_000]
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        state, loss = step(state, shard_batch(sample_batch(tokens, rng, batch_size=8, seq_len=63), mesh))
        losses.append(float(loss))
    return state, np.array(losses)


def test_learns_real_text():
    _, losses = run_steps(jax.devices()[:1], 60)
    assert losses[0] > 5.0  # about log(256) = 5.55 at initialisation
    assert losses[-10:].mean() < 3.5  # bytes of English are far from uniform: the model must find that


def test_one_and_four_devices_take_the_same_steps():
    if len(jax.devices()) < 4:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=4 (set in conftest)")
    one, l1 = run_steps(jax.devices()[:1], 5)
    four, l4 = run_steps(jax.devices()[:4], 5)
    np.testing.assert_allclose(l1, l4, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)


def test_batch_is_split_over_the_devices():
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    batch = shard_batch(np.zeros((8, 64), np.int32), data_mesh(jax.devices()[:4]))
    assert len(batch.sharding.device_set) == 4
    assert {s.data.shape for s in batch.addressable_shards} == {(2, 64)}


def test_batch_must_divide_over_devices():
    with pytest.raises(ValueError, match="not divisible"):
        shard_batch(np.zeros((6, 8), np.int32), data_mesh(jax.devices()[:4]))


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    tokens = corpus.load_corpus().train[:500_000]
    kw = dict(steps=12, batch_size=4, seq_len=32, peak_lr=3e-3, seed=5, checkpoint_every=4,
              devices=jax.devices()[:1])
    whole, whole_losses = train(CONFIG, tokens, checkpoint_dir=str(tmp_path / "a"), **kw)
    _, first = train(CONFIG, tokens, checkpoint_dir=str(tmp_path / "b"), stop_after=7, **kw)  # "killed" after 7
    messages = []
    resumed, rest = train(CONFIG, tokens, checkpoint_dir=str(tmp_path / "b"), progress=messages.append, **kw)
    assert messages[0] == "resumed from the checkpoint at step 7" and len(first) == 7 and len(rest) == 5
    np.testing.assert_allclose(first + rest, whole_losses, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(nnx.state(whole)), jax.tree.leaves(nnx.state(resumed))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
