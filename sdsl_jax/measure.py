"""Measurements on trained models: perplexity and the exact acceptance rate along text.

* :func:`text_nll`: mean next-token negative log-likelihood (nats per byte) over windows of a
  text; perplexity is its exp.
* :func:`exact_acceptance`: alpha = 1 - E[TV(p, q)] = E[sum_x min(p(x), q(x))] with p the
  target's and q the draft's next-token distributions at temperature T, averaged over every
  position of the windows [Leviathan et al. 2023, Cor. 3.6]. This is the per-token acceptance
  speculative sampling has along that text, with no sampling noise.

Used by ``experiments.measure`` and ``experiments.ladder``. Windows are scored in one jitted batch
each; positions are all predicted tokens of each window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sdsl_jax.acceptance import acceptance_from_distributions


def windows(tokens: np.ndarray, *, length: int, count: int) -> np.ndarray:
    """``count`` evenly spaced, non-overlapping windows of ``length + 1`` tokens (inputs + targets)."""
    if len(tokens) < (length + 1) * count:
        raise ValueError(f"text of {len(tokens)} tokens is too short for {count} windows of {length + 1}")
    stride = len(tokens) // count
    return np.stack([tokens[i * stride : i * stride + length + 1] for i in range(count)]).astype(np.int32)


def text_nll(model, batch: np.ndarray) -> float:
    """Mean next-token NLL (nats per token) of ``model`` on ``batch`` of windows."""
    logits, _ = jax.jit(lambda b: model(b[:, :-1]))(jnp.asarray(batch))
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(batch)[:, 1:]).mean())


def exact_acceptance(draft, target, batch: np.ndarray, *, temperature: float = 1.0) -> float:
    """``1 - E[TV(p, q)]`` over all positions of ``batch``; greedy (T = 0) compares argmaxes."""
    inputs = jnp.asarray(batch)[:, :-1]
    p_logits, _ = target(inputs)
    q_logits, _ = draft(inputs)
    if temperature == 0:
        return float(jnp.mean(jnp.argmax(p_logits, -1) == jnp.argmax(q_logits, -1)))
    p = jax.nn.softmax(p_logits / temperature, -1)
    q = jax.nn.softmax(q_logits / temperature, -1)
    return float(acceptance_from_distributions(p.reshape(-1, 1, p.shape[-1]), q.reshape(-1, 1, q.shape[-1])).mean())
