"""Benchmark of the decoding engine: greedy decoding in one jitted loop against a Python loop over a
jitted one-token step.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.numerics import median_time


def bench_decoding(repeats: int) -> list[dict]:
    """Decoding in one jitted loop against a Python loop over a jitted one-token step (same tokens).

    The engine's design choice: a Python-driven loop pays a dispatch per call, more than a small
    model's step costs. Target-sized model (1.2M parameters, the
    ladder's L7 shape, random weights), greedy, 64 new tokens after a 48-token prompt.
    """
    from flax import nnx

    from sdsl_jax.lm.decoding import autoregressive_generate
    from sdsl_jax.lm.model import Transformer, TransformerConfig, init_cache

    rows = []
    for name, config in (("1.2M params", TransformerConfig(d_model=128, num_layers=6, num_heads=4, d_ff=512,
                                                           max_len=128)),
                         ("25k params", TransformerConfig(d_model=32, num_layers=1, num_heads=1, d_ff=128,
                                                          max_len=128))):
        model = Transformer(config, rngs=nnx.Rngs(0))
        prompt = jnp.asarray(np.random.default_rng(0).integers(0, 256, 48), jnp.int32)
        new = 64
        key = jax.random.key(0)

        def one_loop():
            return autoregressive_generate(model, prompt, key, num_new_tokens=new, temperature=0.0)

        graphdef, state = nnx.split(model)

        @jax.jit
        def prefill(state, prompt):
            logits, cache = nnx.merge(graphdef, state)(prompt[None], init_cache(config), 0)
            return jnp.argmax(logits[0, -1]).astype(jnp.int32), cache

        @jax.jit
        def step(state, token, cache, position):
            logits, cache = nnx.merge(graphdef, state)(token[None, None], cache, position)
            return jnp.argmax(logits[0, -1]).astype(jnp.int32), cache

        def python_loop():
            token, cache = prefill(state, prompt)
            out = [token]
            for i in range(new - 1):
                token, cache = step(state, token, cache, jnp.int32(prompt.shape[0] + i))
                out.append(token)
            return jnp.concatenate([prompt, jnp.stack(out)])

        same = bool(np.array_equal(np.asarray(one_loop()), np.asarray(python_loop())))  # also compiles both
        t_loop = median_time(lambda: jax.block_until_ready(one_loop()), repeats)
        t_python = median_time(lambda: jax.block_until_ready(python_loop()), repeats)
        print(f"decoding {name}, {new} tokens: one jitted loop {t_loop * 1e3:7.1f} ms  Python loop of jitted steps "
              f"{t_python * 1e3:7.1f} ms  ratio {t_python / t_loop:5.1f}x  identical tokens: {same}", flush=True)
        rows.append(dict(name=f"decoding {name}", new_tokens=new, jax_s=t_loop, baseline_s=t_python,
                         speedup=t_python / t_loop, identical=same))
    return rows
