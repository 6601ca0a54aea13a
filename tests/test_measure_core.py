"""Perplexity and exact acceptance along text, against explicit computations and speculative runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdsl_jax.lm.measure import exact_acceptance, text_nll, windows
from sdsl_jax import acceptance_from_counts
from sdsl_jax.lm.decoding import speculative_generate
from sdsl_jax.lm.model import Transformer, TransformerConfig

V = 8


def pair():
    cfg = dict(vocab_size=V, max_len=128)
    return (Transformer(TransformerConfig(d_model=32, num_layers=1, num_heads=1, d_ff=64, **cfg), rngs=nnx.Rngs(1)),
            Transformer(TransformerConfig(d_model=64, num_layers=2, num_heads=2, d_ff=128, **cfg), rngs=nnx.Rngs(0)))


def test_windows_and_nll():
    tokens = np.arange(1000) % V
    w = windows(tokens, length=15, count=10)
    assert w.shape == (10, 16) and w[1, 0] == tokens[100]
    with pytest.raises(ValueError, match="too short"):
        windows(tokens, length=200, count=10)
    _, target = pair()
    # Compiled: called eagerly, each of the model's operations would compile on its own.
    logits, _ = nnx.jit(lambda model, x: model(x))(target, jnp.asarray(w)[:, :-1])
    logp = jax.nn.log_softmax(logits, -1)
    want = -float(np.mean(np.take_along_axis(np.asarray(logp), w[:, 1:, None], -1)))
    assert text_nll(target, w) == pytest.approx(want, rel=1e-5)


def test_exact_acceptance_bounds_and_identity():
    draft, target = pair()
    w = windows(np.random.default_rng(0).integers(0, V, 4000), length=31, count=16)
    assert exact_acceptance(target, target, w) == pytest.approx(1.0, abs=1e-6)
    alpha = exact_acceptance(draft, target, w, temperature=0.5)
    assert 0.0 < alpha < 1.0


def test_exact_acceptance_predicts_speculative_runs():
    """Along the target's own samples, the count MLE of speculative sampling estimates 1 - E[TV]."""
    draft, target = pair()
    temperature, gamma = 0.5, 3
    keys = jax.random.split(jax.random.PRNGKey(7), 24)
    accepted, texts = [], []
    for key in keys:
        tokens, stats = speculative_generate(draft, target, jnp.array([1, 2, 3]), key, num_new_tokens=100,
                                             gamma=gamma, temperature=temperature)
        n = int(stats.num_iterations)
        accepted.append(np.asarray(stats.accepted)[:n])
        texts.append(np.asarray(tokens))
    mle = float(acceptance_from_counts(np.concatenate(accepted), gamma))
    exact = exact_acceptance(draft, target, np.stack(texts), temperature=temperature)
    # ~2,400 draft tokens: the MLE's standard error is about 0.01 here.
    assert mle == pytest.approx(exact, abs=0.04)
    # ... whereas accepted / drafted is not alpha (docs/theory.md): here it reads about half of it.
    assert np.concatenate(accepted).mean() / gamma < exact - 0.1


def test_xla_flops_follow_the_architecture_not_the_model_object():
    from sdsl_jax.lm import timing

    draft, target = pair()
    before = len(timing._FLOPS_CACHE)
    small, large = timing.xla_flops(draft, 1), timing.xla_flops(target, 1)
    assert 0 < small < large
    assert large == timing._xla_flops(target, 1)
    # Another object of the draft's architecture (other weights) has the draft's count: one entry
    # per architecture, where an entry per object id could hand a freed model's count to a new one.
    other = Transformer(draft.config, rngs=nnx.Rngs(7))
    assert timing.xla_flops(other, 1) == small
    assert len(timing._FLOPS_CACHE) == before + 2
