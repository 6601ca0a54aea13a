"""Timing the models: per-call latency of a forward call with a KV cache, the decoding loops, XLA's FLOP
count of a call, and interleaved wall-clock comparisons of decoding methods.

A timed repeat of a call runs many chained calls in ONE compiled loop, each fed the previous call's
sample (a data dependency, as in decoding), so Python dispatch is not counted, as it is not inside
:func:`~sdsl_jax.lm.decoding.speculative_generate`'s compiled loop.
"""

from __future__ import annotations

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sdsl_jax.lm.model import Transformer, count_params, init_cache

__all__ = [
    "machine",
    "timed_calls",
    "time_calls",
    "median_seconds",
    "loop_drafts",
    "time_loops",
    "xla_flops",
    "timed",
    "interleaved_times",
]


def machine() -> str:
    """CPU model (or accelerator), core count and JAX backend, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    device = jax.devices()[0]
    return f"{cpu}, {os.cpu_count()} cores, jax {jax.__version__} {device.platform} ({device.device_kind})"


def timed_calls(model: Transformer, *, batch: int, tokens: int, cache_length: int):
    """A function ``run(calls) -> seconds`` timing ``calls`` chained forward calls in one compiled loop."""
    graphdef, state = nnx.split(model)
    cache = init_cache(model.config, batch)
    start = jnp.zeros((batch, tokens), jnp.int32)

    @jax.jit
    def loop(state, cache, start, calls):
        net = nnx.merge(graphdef, state)

        def body(i, carry):
            x, cache = carry
            logits, cache = net(x, cache, cache_length)
            # What the decoding loop does with a call's logits (temperature 1): the next-token
            # distribution at every position (a verification compares all of them) and one
            # sample (the draft's proposal, or the bonus / residual token).
            probs = jax.nn.softmax(logits, axis=-1)
            key = jax.random.fold_in(jax.random.key(0), i)
            sample = jax.random.categorical(key, jnp.log(probs[:, -1])).astype(jnp.int32)
            return jnp.concatenate([x[:, 1:], sample[:, None]], axis=1), cache

        return jax.lax.fori_loop(0, calls, body, (start, cache))

    def run(calls: int) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(loop(state, cache, start, jnp.asarray(calls, jnp.int32)))
        return time.perf_counter() - t0

    return run


def time_calls(name: str, model: Transformer, *, batches, max_tokens: int, cache_length: int, repeats: int,
               repeat_seconds: float, machine: str, log=print) -> list[dict]:
    """``sdsl-latency v1`` rows of kind ``call``: the median and IQR seconds of one forward call of ``model``
    reading k = 1 .. ``max_tokens`` positions at each batch size, configurations interleaved in a
    rotating order over ``repeats`` rounds, each repeat about ``repeat_seconds`` long."""
    n = count_params(model)
    configs = [(b, k) for b in batches for k in range(1, max_tokens + 1)]
    runners, calls = {}, {}
    for b, k in configs:
        run = timed_calls(model, batch=b, tokens=k, cache_length=cache_length)
        run(1)  # compile
        probe = run(8) / 8  # calls per repeat so that one repeat takes about --repeat-seconds
        calls[b, k] = int(np.clip(round(repeat_seconds / max(probe, 1e-7)), 8, 4096))
        runners[b, k] = run
    times = {c: [] for c in configs}
    for r in range(repeats):
        for i in np.roll(np.arange(len(configs)), r):  # interleaved, rotating order
            b, k = configs[i]
            times[b, k].append(runners[b, k](calls[b, k]) / calls[b, k])
    rows = []
    for b, k in configs:
        q25, med, q75 = np.percentile(times[b, k], [25, 50, 75])
        rows.append(dict(model=name, n_params=n, batch=b, tokens=k, seconds_median=float(med),
                         seconds_iqr=float(q75 - q25), repeats=repeats, calls=calls[b, k],
                         cache_length=cache_length, machine=machine, kind="call"))
    one = {r["tokens"]: r["seconds_median"] for r in rows if r["batch"] == min(batches)}
    log(f"  {name} (N = {n:,}): batch {min(batches)}, a draft step {one[1] * 1e6:.0f} us, a verification of "
        f"{max_tokens} tokens {one[max_tokens] * 1e6:.0f} us")
    return rows


def median_seconds(fn, repeats: int) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after one call that compiles it."""
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def loop_drafts(names: list[str], target_index: int) -> list[str]:
    """The drafts timed against a target: the smallest, the middle of the smaller ones, the next smaller."""
    smaller = names[:target_index]
    return sorted({smaller[0], smaller[len(smaller) // 2], smaller[-1]}, key=names.index)


def time_loops(name: str, models: dict, names: list[str], *, prompt_len: int, loop_tokens: int, loop_gammas,
               repeats: int, machine: str, log=print) -> list[dict]:
    """The decoding loops themselves (rows of kind ``alone`` and ``iteration``): seconds per token of the
    target ``name`` alone, and per speculative iteration with each of :func:`loop_drafts` at each gamma."""
    from sdsl_jax.lm.corpus import prompts_for
    from sdsl_jax.lm.decoding import autoregressive_generate, speculative_generate

    prompt = prompts_for(1, prompt_len)[0]
    key = jax.random.key(0)
    target = models[name]
    m = count_params(target)
    common = dict(model=name, n_params=m, batch=1, repeats=repeats, calls=1, cache_length=prompt_len,
                  machine=machine)
    alone = median_seconds(lambda: autoregressive_generate(target, prompt, key, num_new_tokens=loop_tokens),
                            repeats) / loop_tokens
    rows = [dict(common, tokens=1, seconds_median=alone, kind="alone")]
    index = names.index(name)
    for draft_name in (loop_drafts(names, index) if index else []):
        draft = models[draft_name]
        for gamma in loop_gammas:
            def run(draft=draft, gamma=gamma):
                return speculative_generate(draft, target, prompt, key, num_new_tokens=loop_tokens, gamma=gamma)

            iterations = int(run()[1].num_iterations)  # the same key every time: the same iterations
            seconds = median_seconds(run, repeats) / iterations
            rows.append(dict(common, tokens=gamma + 1, seconds_median=seconds, kind="iteration",
                             n_draft=count_params(draft), gamma=gamma))
    log(f"  {name}: target alone {alone * 1e6:.0f} us per token" + "".join(
        f"; {r['gamma']} drafts of {r['n_draft']:,}: {r['seconds_median'] * 1e6:.0f} us per iteration"
        for r in rows[1:2]))
    return rows


_FLOPS_CACHE: dict = {}


def xla_flops(model, num_tokens: int) -> float:
    """FLOPs XLA's cost analysis assigns one cached forward call on ``num_tokens`` tokens."""
    # Keyed by the architecture, which sets the count: an object's id is reused once it is freed.
    key = (model.config, num_tokens)
    if key not in _FLOPS_CACHE:
        _FLOPS_CACHE[key] = _xla_flops(model, num_tokens)
    return _FLOPS_CACHE[key]


def _xla_flops(model, num_tokens: int) -> float:
    cache = init_cache(model.config)
    tokens = jnp.zeros((1, num_tokens), jnp.int32)
    compiled = jax.jit(lambda t, c: model(t, c, 0)).lower(tokens, cache).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0]
    return float(analysis["flops"])


def timed(fn) -> float:
    """Wall-clock seconds of one call of ``fn`` (its result ready)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def interleaved_times(methods: list, prompts: list, key, repeats: int) -> dict[int, list[float]]:
    """Seconds of each method over ``prompts`` per repeat, the methods' order rotated in every repeat
    so that drift of the machine spreads over all of them; same prompts and keys for every method."""
    times = {i: [] for i in range(len(methods))}
    for r in range(repeats):
        for i in np.roll(np.arange(len(methods)), r):
            fn = methods[i]
            times[i].append(sum(timed(lambda p=p, j=j: fn(p, jax.random.fold_in(key, 10_000 + j)))
                                for j, p in enumerate(prompts)))
    return times
