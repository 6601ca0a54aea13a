"""Speculative decoding in one jitted loop: draft proposes, target verifies, all decided on device.

One iteration at current length ``L`` (tokens ``t[0..L-1]``):

1. the draft re-reads ``t[L-2], t[L-1]`` at offset ``L-2`` (two tokens, so the position of a
   token that was accepted but never fed to the draft is filled too) and proposes ``x_1``, then
   feeds its own proposals one at a time for ``x_2 .. x_gamma``: ``gamma`` draft calls;
2. the target reads ``t[L-1], x_1 .. x_gamma`` at offset ``L-1`` in ONE call: the next-token
   distributions ``p_1 .. p_{gamma+1}``;
3. exact speculative sampling [Leviathan et al. 2023, Alg. 1; Chen et al. 2023]: accept ``x_i``
   with probability ``min(1, p_i(x_i) / q_i(x_i))`` until the first rejection; at a rejection
   resample from ``norm(max(p_i - q_i, 0))``, otherwise draw the bonus token from ``p_{gamma+1}``.
   With ``temperature = 0`` both models decode greedily and a proposal is accepted iff it is the
   target's argmax, so the output equals the target's own greedy decoding.

The output is distributed exactly as sampling from the target alone; ``tests/test_decoding.py``
checks it with chi-square tests over many keys.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sdsl_jax.costs import SDSL_FLOPS
from sdsl_jax.lm.model import Transformer, init_cache

__all__ = ["SpeculativeStats", "RunSummary", "summarize_runs", "speculative_generate", "autoregressive_generate"]


class SpeculativeStats(NamedTuple):
    """Per-run statistics of :func:`speculative_generate`.

    Attributes:
      accepted: accepted draft tokens per iteration, shape ``(max_iterations,)``; -1 past the end.
      num_iterations: iterations run (= target calls after the prefill).
      draft_calls: draft forward calls after the prefill (``gamma`` per iteration).
      target_calls: target forward calls after the prefill (one per iteration).
    """

    accepted: jax.Array
    num_iterations: jax.Array
    draft_calls: jax.Array
    target_calls: jax.Array


class RunSummary(NamedTuple):
    """What serving users ask of speculative runs (vLLM / SGLang report the same quantities).

    Attributes:
      iterations: draft-then-verify iterations (= target calls after the prefill).
      histogram: ``histogram[k]`` iterations accepted exactly k draft tokens, ``k = 0 .. gamma``.
      accepted: accepted draft tokens in total.
      new_tokens: tokens produced (accepted + one bonus/residual token per iteration).
      tau: mean tokens per iteration, ``new_tokens / iterations``.
      alpha_mle: ``accepted / (accepted + iterations with a rejection)`` (docs/theory.md); NOT
        ``accepted / drafted``, which underestimates alpha.
      accepted_over_drafted: ``accepted / (gamma * iterations)``, for comparison with other tools.
      draft_calls, target_calls: forward calls after the prefill.
      flops_sdsl: ``iterations * (2 N gamma + 2 M)``, the SDSL cost model's FLOPs.
    """

    iterations: int
    histogram: np.ndarray
    accepted: int
    new_tokens: int
    tau: float
    alpha_mle: float
    accepted_over_drafted: float
    draft_calls: int
    target_calls: int
    flops_sdsl: float


def summarize_runs(stats: SpeculativeStats | list[SpeculativeStats], *, gamma: int, n_draft: float,
                   m_target: float) -> RunSummary:
    """Pool the :class:`SpeculativeStats` of one or more runs at lookahead ``gamma`` into a :class:`RunSummary`."""
    stats = [stats] if isinstance(stats, SpeculativeStats) else list(stats)
    counts = np.concatenate([np.asarray(s.accepted)[: int(s.num_iterations)] for s in stats])
    if counts.size and (counts.min() < 0 or counts.max() > gamma):
        raise ValueError(f"accepted counts outside 0..{gamma}: were these runs made with gamma={gamma}?")
    iterations = int(counts.size)
    histogram = np.bincount(counts, minlength=gamma + 1)
    accepted = int(counts.sum())
    rejections = int(histogram[:gamma].sum())
    return RunSummary(
        iterations=iterations, histogram=histogram, accepted=accepted, new_tokens=accepted + iterations,
        tau=(accepted + iterations) / iterations if iterations else float("nan"),
        alpha_mle=accepted / (accepted + rejections) if accepted + rejections else float("nan"),
        accepted_over_drafted=accepted / (gamma * iterations) if iterations else float("nan"),
        draft_calls=int(sum(int(s.draft_calls) for s in stats)),
        target_calls=int(sum(int(s.target_calls) for s in stats)),
        # The SDSL cost in plain Python floats: exact, whatever JAX's default precision.
        flops_sdsl=float(iterations * (SDSL_FLOPS.draft_step(n_draft) * gamma
                                       + SDSL_FLOPS.verification(m_target, gamma + 1))))


def _probs(logits: jax.Array, temperature: float) -> jax.Array:
    if temperature == 0.0:
        return jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=logits.dtype)
    return jax.nn.softmax(logits / temperature, axis=-1)


def _sample(key, probs: jax.Array) -> jax.Array:
    return jax.random.categorical(key, jnp.log(probs), axis=-1)


@functools.partial(jax.jit, static_argnames=("draft_def", "target_def", "num_new_tokens", "gamma", "temperature"))
def _speculative(draft_def, draft_state, target_def, target_state, prompt, key, *, num_new_tokens, gamma,
                 temperature):
    draft, target = nnx.merge(draft_def, draft_state), nnx.merge(target_def, target_state)
    p_len = prompt.shape[0]
    total = p_len + num_new_tokens
    buffer = jnp.zeros(total + gamma + 1, jnp.int32).at[:p_len].set(prompt)
    _, draft_cache = draft(prompt[None], init_cache(draft.config), 0)
    _, target_cache = target(prompt[None], init_cache(target.config), 0)
    max_iterations = num_new_tokens

    def body(state):
        tokens, length, d_cache, t_cache, key, accepted, it = state
        key, k_draft, k_accept, k_next = jax.random.split(key, 4)
        # 1. draft proposals.
        first = jax.lax.dynamic_slice(tokens, (length - 2,), (2,))
        logits, d_cache = draft(first[None], d_cache, length - 2)
        q1 = _probs(logits[0, -1], temperature)
        x1 = _sample(jax.random.fold_in(k_draft, 0), q1) if temperature else jnp.argmax(q1)

        def propose(carry, i):
            d_cache, x = carry
            logits, d_cache = draft(x[None, None], d_cache, length + i - 1)
            q = _probs(logits[0, -1], temperature)
            x_next = _sample(jax.random.fold_in(k_draft, i), q) if temperature else jnp.argmax(q)
            return (d_cache, x_next.astype(jnp.int32)), (q, x_next.astype(jnp.int32))

        (d_cache, _), (q_rest, x_rest) = jax.lax.scan(propose, (d_cache, x1.astype(jnp.int32)),
                                                      jnp.arange(1, gamma, dtype=jnp.int32))
        q = jnp.concatenate([q1[None], q_rest])
        x = jnp.concatenate([x1[None].astype(jnp.int32), x_rest])
        # 2. one verification pass.
        verify = jnp.concatenate([jax.lax.dynamic_slice(tokens, (length - 1,), (1,)), x])
        logits, t_cache = target(verify[None], t_cache, length - 1)
        p = _probs(logits[0], temperature)  # (gamma + 1, vocab)
        # 3. accept / reject.
        p_x = jnp.take_along_axis(p[:gamma], x[:, None], 1)[:, 0]
        q_x = jnp.take_along_axis(q, x[:, None], 1)[:, 0]
        if temperature:
            u = jax.random.uniform(k_accept, (gamma,), q_x.dtype)
            ok = u * q_x < p_x  # u < p/q without dividing by a zero q
        else:
            ok = p_x > 0.5  # one-hot: proposal is the target's argmax
        k = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
        residual = jnp.maximum(p[k] - jnp.where(k < gamma, q[jnp.minimum(k, gamma - 1)], 0.0), 0.0)
        residual = residual / jnp.sum(residual)
        bonus = _sample(k_next, residual) if temperature else jnp.argmax(residual)
        new = jnp.where(jnp.arange(gamma + 1, dtype=jnp.int32) < k, jnp.concatenate([x, x[:1]]), bonus.astype(jnp.int32))
        tokens = jax.lax.dynamic_update_slice(tokens, new, (length,))
        return tokens, length + k + 1, d_cache, t_cache, key, accepted.at[it].set(k), it + 1

    def cond(state):
        return state[1] < total

    init = (buffer, jnp.asarray(p_len, jnp.int32), draft_cache, target_cache, key,
            jnp.full(max_iterations, -1, jnp.int32), jnp.asarray(0, jnp.int32))
    tokens, _, _, _, _, accepted, it = jax.lax.while_loop(cond, body, init)
    return tokens[:total], SpeculativeStats(accepted, it, it * gamma, it)


def speculative_generate(draft: Transformer, target: Transformer, prompt: jax.Array, key: jax.Array, *,
                         num_new_tokens: int, gamma: int, temperature: float = 1.0):
    """Generate ``num_new_tokens`` after ``prompt`` by speculative decoding.

    Args:
      draft, target: models sharing a vocabulary; both need ``max_len >= len(prompt) +
        num_new_tokens + gamma + 1``.
      prompt: 1-D int32 tokens, length >= 2.
      key: PRNG key (ignored when greedy).
      num_new_tokens: tokens to produce.
      gamma: draft tokens proposed per iteration (>= 1).
      temperature: sampling temperature; 0 decodes greedily.

    Returns:
      ``(tokens, stats)``: the prompt followed by the new tokens, and :class:`SpeculativeStats`.
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 1 or prompt.shape[0] < 2:
        raise ValueError(f"prompt must be 1-D with at least 2 tokens, got shape {prompt.shape}")
    if gamma < 1 or num_new_tokens < 1:
        raise ValueError(f"need gamma >= 1 and num_new_tokens >= 1, got gamma={gamma}, num_new_tokens={num_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    need = prompt.shape[0] + num_new_tokens + gamma + 1
    for name, model in (("draft", draft), ("target", target)):
        if model.config.max_len < need:
            raise ValueError(f"{name}.config.max_len={model.config.max_len} < {need} positions needed")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError("draft and target must share a vocabulary")
    draft_def, draft_state = nnx.split(draft)
    target_def, target_state = nnx.split(target)
    return _speculative(draft_def, draft_state, target_def, target_state, prompt, key,
                        num_new_tokens=num_new_tokens, gamma=gamma, temperature=float(temperature))


@functools.partial(jax.jit, static_argnames=("model_def", "num_new_tokens", "temperature"))
def _autoregressive(model_def, state, prompt, key, *, num_new_tokens, temperature):
    model = nnx.merge(model_def, state)
    p_len = prompt.shape[0]
    tokens = jnp.zeros(p_len + num_new_tokens, jnp.int32).at[:p_len].set(prompt)
    logits, cache = model(prompt[None], init_cache(model.config), 0)

    def step(carry, i):
        tokens, cache, logits, key = carry
        key, sub = jax.random.split(key)
        probs = _probs(logits, temperature)
        nxt = (_sample(sub, probs) if temperature else jnp.argmax(probs)).astype(jnp.int32)
        tokens = tokens.at[p_len + i].set(nxt)
        logits, cache = model(nxt[None, None], cache, p_len + i)
        return (tokens, cache, logits[0, -1], key), None

    (tokens, _, _, _), _ = jax.lax.scan(step, (tokens, cache, logits[0, -1], key),
                                        jnp.arange(num_new_tokens, dtype=jnp.int32))
    return tokens


def autoregressive_generate(model: Transformer, prompt: jax.Array, key: jax.Array, *, num_new_tokens: int,
                            temperature: float = 1.0) -> jax.Array:
    """Plain decoding with the KV cache, one jitted scan: the baseline speculative decoding must match."""
    model_def, state = nnx.split(model)
    return _autoregressive(model_def, state, jnp.asarray(prompt, jnp.int32), key, num_new_tokens=num_new_tokens,
                           temperature=float(temperature))
