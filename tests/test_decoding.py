"""The transformer's cached forward and the speculative-decoding engine.

Statistical tests use a p-value threshold of 1e-3: a correct engine fails each with probability
0.1% (they are seeded, so a given version of JAX gives the same verdict every run).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from sdsl_jax.lm.decoding import _speculative, autoregressive_generate, speculative_generate
from sdsl_jax.lm.model import Transformer, TransformerConfig, count_params, init_cache

V = 8


def models(max_len=64):
    target = Transformer(TransformerConfig(vocab_size=V, d_model=64, num_layers=2, num_heads=2, d_ff=128,
                                           max_len=max_len), rngs=nnx.Rngs(0))
    draft = Transformer(TransformerConfig(vocab_size=V, d_model=32, num_layers=1, num_heads=1, d_ff=64,
                                          max_len=max_len), rngs=nnx.Rngs(1))
    return draft, target


# The models' forward compiled, as decoding calls it (called eagerly, each of the model's operations
# would be compiled on its own at every shape); one wrapper, so its programs are shared by the tests.
forward = nnx.jit(lambda model, *args: model(*args))


def test_cached_forward_equals_full_forward():
    _, target = models()
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 20), 0, V)
    full, _ = forward(target, tokens)
    cache = init_cache(target.config)
    pieces = []
    for start, stop in [(0, 12), (12, 13), (13, 20)]:  # prefill, one decoding step, a verification block
        logits, cache = forward(target, tokens[:, start:stop], cache, start)
        pieces.append(logits)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=1e-5)
    assert count_params(target) > count_params(models()[0])


def test_tiny_heads_are_refused():
    with pytest.raises(ValueError, match="head size 16 < 32"):
        TransformerConfig(d_model=64, num_heads=4)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("prompt", [[1, 2], [5, 1, 7, 3, 0, 2]])
def test_greedy_speculative_equals_target_greedy(gamma, prompt):
    draft, target = models()
    prompt = jnp.asarray(prompt, jnp.int32)
    want = autoregressive_generate(target, prompt, jax.random.PRNGKey(0), num_new_tokens=25, temperature=0.0)
    got, stats = speculative_generate(draft, target, prompt, jax.random.PRNGKey(0), num_new_tokens=25, gamma=gamma,
                                      temperature=0.0)
    np.testing.assert_array_equal(got, want)
    accepted = np.asarray(stats.accepted)[: int(stats.num_iterations)]
    assert accepted.sum() + int(stats.num_iterations) >= 25  # each iteration yields accepted + 1 tokens
    assert int(stats.draft_calls) == gamma * int(stats.num_iterations)


def test_self_drafting_accepts_everything():
    _, target = models()
    _, stats = speculative_generate(target, target, jnp.array([1, 2, 3]), jax.random.PRNGKey(0), num_new_tokens=20,
                                    gamma=4, temperature=1.0)
    accepted = np.asarray(stats.accepted)[: int(stats.num_iterations)]
    assert np.all(accepted == 4)


def target_joint(target, prompt, temperature):
    """Exact p(y1, y2 | prompt) of the target, shape (V, V)."""
    logits, _ = forward(target, prompt[None])
    p1 = jax.nn.softmax(logits[0, -1] / temperature)
    seqs = jnp.concatenate([jnp.tile(prompt, (V, 1)), jnp.arange(V, dtype=jnp.int32)[:, None]], 1)
    logits2, _ = forward(target, seqs)
    p2 = jax.nn.softmax(logits2[:, -1] / temperature, axis=-1)
    return np.asarray(p1[:, None] * p2, np.float64)


def test_sampled_tokens_follow_the_target_distribution():
    draft, target = models()
    prompt = jnp.array([3, 1, 4], jnp.int32)
    temperature, gamma, n = 0.5, 3, 6000
    d_def, d_state = nnx.split(draft)
    t_def, t_state = nnx.split(target)
    run = jax.vmap(lambda k: _speculative(d_def, d_state, t_def, t_state, prompt, k, num_new_tokens=2, gamma=gamma,
                                          temperature=temperature))
    tokens, stats = run(jax.random.split(jax.random.PRNGKey(42), n))
    # The draft must disagree often, or the residual path goes untested.
    first = np.asarray(stats.accepted)[:, 0]
    assert 0.05 < np.mean(first == 0) < 0.95
    y = np.asarray(tokens)[:, 3:5]
    observed = np.zeros((V, V))
    np.add.at(observed, (y[:, 0], y[:, 1]), 1)
    expected = target_joint(target, prompt, temperature) * n
    keep = expected.ravel() >= 5  # chi-square needs expected counts >= 5: pool the rest
    obs = np.append(observed.ravel()[keep], observed.ravel()[~keep].sum())
    exp = np.append(expected.ravel()[keep], expected.ravel()[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    # Marginal of the first token alone as well.
    marginal = scipy.stats.chisquare(observed.sum(1), expected.sum(1) * n / expected.sum())
    assert marginal.pvalue > 1e-3


def test_bad_arguments():
    draft, target = models(max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        speculative_generate(draft, target, jnp.array([1, 2]), jax.random.PRNGKey(0), num_new_tokens=20, gamma=3)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        speculative_generate(draft, target, jnp.array([1]), jax.random.PRNGKey(0), num_new_tokens=2, gamma=3)


def test_run_summary_pools_runs_and_estimates_alpha_by_mle():
    from sdsl_jax import acceptance_from_counts
    from sdsl_jax.lm.decoding import summarize_runs

    draft, target = models()
    gamma = 4
    runs = [speculative_generate(draft, target, jnp.asarray([1, 2, 3], jnp.int32), jax.random.PRNGKey(i),
                                 num_new_tokens=30, gamma=gamma)[1] for i in range(3)]
    s = summarize_runs(runs, gamma=gamma, n_draft=10.0, m_target=100.0)
    counts = np.concatenate([np.asarray(r.accepted)[: int(r.num_iterations)] for r in runs])
    assert s.iterations == counts.size == s.target_calls and s.draft_calls == gamma * s.iterations
    assert s.histogram.tolist() == [int(np.sum(counts == k)) for k in range(gamma + 1)]
    assert s.new_tokens == counts.sum() + counts.size >= 3 * 30
    assert s.alpha_mle == pytest.approx(float(acceptance_from_counts(counts, gamma)))
    assert s.accepted_over_drafted <= s.alpha_mle  # the naive ratio underestimates alpha
    assert s.flops_sdsl == s.iterations * (2 * 10.0 * gamma + 2 * 100.0)
    with pytest.raises(ValueError, match="gamma=2"):
        summarize_runs(runs, gamma=2, n_draft=10.0, m_target=100.0)
