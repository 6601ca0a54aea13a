"""A decoder-only transformer (Flax nnx) whose one forward serves training, decoding and verification.

``model(tokens, cache=None, offset=0)``:

* ``cache=None``: causal self-attention over the given ``T`` tokens (training, scoring text);
* with a :class:`KVCache`: the keys and values of the ``T`` tokens are written at positions
  ``offset .. offset + T - 1`` and each token attends to every cached position up to its own.
  ``T = 1`` is one decoding step; ``T = gamma + 1`` at the current length is speculative
  verification. Entries beyond the current position are masked, so stale entries left by
  rejected draft tokens are harmless and simply overwritten later.

The cache is a NamedTuple of arrays passed in and returned (no hidden state), so decoding loops
can run inside ``jax.lax.while_loop``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["TransformerConfig", "KVCache", "Transformer", "init_cache", "count_params"]


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes of a :class:`Transformer`; ``head_dim = d_model // num_heads`` must be >= 32."""

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    d_ff: int = 256
    max_len: int = 512

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if self.d_model // self.num_heads < 32:
            raise ValueError(f"head size {self.d_model // self.num_heads} < 32: tiny heads are slow on CPU; "
                             "use fewer heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class KVCache(NamedTuple):
    """Keys and values per layer, shape ``(layers, batch, max_len, heads, head_dim)``."""

    keys: jax.Array
    values: jax.Array


def init_cache(config: TransformerConfig, batch: int = 1, dtype=jnp.float32) -> KVCache:
    shape = (config.num_layers, batch, config.max_len, config.num_heads, config.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class _Block(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d = config.d_model
        self.config = config
        self.attn_norm = nnx.RMSNorm(d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, config.d_ff, rngs=rngs)
        self.down = nnx.Linear(config.d_ff, d, rngs=rngs)

    def __call__(self, x, keys, values, query_pos, key_pos):
        b, t, _ = x.shape
        c = self.config
        q, k, v = jnp.split(self.qkv(self.attn_norm(x)).reshape(b, t, 3 * c.num_heads, c.head_dim), 3, axis=2)
        if keys is None:  # no cache: attend within the given tokens
            keys, values = k, v
        else:
            keys, values = keys(k), values(v)  # write into the cache, read it back whole
        scores = jnp.einsum("bthd,bshd->bhts", q, keys) / jnp.sqrt(c.head_dim).astype(x.dtype)
        mask = key_pos[None, :] <= query_pos[:, None]
        scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
        attended = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), values).reshape(b, t, -1)
        x = x + self.out(attended)
        x = x + self.down(jax.nn.gelu(self.up(self.mlp_norm(x))))
        return x, keys, values


class Transformer(nnx.Module):
    """Pre-norm GPT-style decoder: learned positions, RMSNorm, GELU MLP, tied embeddings."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.d_model, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (config.max_len, config.d_model), jnp.float32))
        self.blocks = nnx.List([_Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = nnx.RMSNorm(config.d_model, rngs=rngs)

    def __call__(self, tokens: jax.Array, cache: KVCache | None = None, offset=0):
        """Logits ``(batch, T, vocab)`` for ``tokens`` ``(batch, T)`` at ``offset``; and the new cache."""
        _, t = tokens.shape
        query_pos = jnp.asarray(offset, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
        x = self.embed(tokens) + jnp.take(self.positions[...], query_pos, axis=0)[None]
        new_keys, new_values = [], []
        for i, block in enumerate(self.blocks):
            if cache is None:
                x, _, _ = block(x, None, None, query_pos, query_pos)
                continue
            write = lambda layer_cache, new: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                layer_cache, new.astype(layer_cache.dtype), jnp.asarray(offset, jnp.int32), axis=1)
            x, k, v = block(x, lambda k, i=i: write(cache.keys[i], k), lambda v, i=i: write(cache.values[i], v),
                            query_pos, jnp.arange(self.config.max_len, dtype=jnp.int32))
            new_keys.append(k)
            new_values.append(v)
        logits = self.embed.attend(self.final_norm(x))
        return logits, (None if cache is None else KVCache(jnp.stack(new_keys), jnp.stack(new_values)))


def count_params(model: nnx.Module) -> int:
    """Number of parameters (embeddings included)."""
    return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
