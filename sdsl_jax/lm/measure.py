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
from flax import nnx

from sdsl_jax.acceptance import acceptance_from_distributions
from sdsl_jax.data import AcceptanceMeasurements, PretrainingRuns


def windows(tokens: np.ndarray, *, length: int, count: int) -> np.ndarray:
    """``count`` evenly spaced, non-overlapping windows of ``length + 1`` tokens (inputs + targets)."""
    if len(tokens) < (length + 1) * count:
        raise ValueError(f"text of {len(tokens)} tokens is too short for {count} windows of {length + 1}")
    stride = len(tokens) // count
    return np.stack([tokens[i * stride : i * stride + length + 1] for i in range(count)]).astype(np.int32)


# The model is an argument of the compiled functions, not a constant of a fresh closure: models of
# one shape (a rung's budgets) share one program, and parameters are not compiled into it.
@nnx.jit
def _window_nll(model, batch: jax.Array) -> jax.Array:
    logits, _ = model(batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


@nnx.jit
def _probabilities(model, inputs: jax.Array) -> jax.Array:
    return jax.nn.softmax(model(inputs)[0], axis=-1)


def text_nll(model, batch: np.ndarray) -> float:
    """Mean next-token NLL (nats per token) of ``model`` on ``batch`` of windows."""
    return float(_window_nll(model, jnp.asarray(batch)))


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


TEXTS = ("heldout", "hellaswag")
"""The evaluation texts of the ladder (:class:`sdsl_jax.lm.ladder.EvalText` has a batch of each)."""


def longest_budgets(records: list[dict]) -> list[dict]:
    """One record per rung: its longest-budget model, ordered by size."""
    best = {}
    for r in records:
        if r["rung"] not in best or r["n_tokens"] > best[r["rung"]]["n_tokens"]:
            best[r["rung"]] = r
    return sorted(best.values(), key=lambda r: r["n_params"])


def _next_token_probs(model, batch: np.ndarray, chunk: int = 32) -> np.ndarray:
    """Softmax of the model's next-token logits at every position, float32 ``(windows, T, vocab)``."""
    return np.concatenate([np.asarray(_probabilities(model, jnp.asarray(batch[i:i + chunk, :-1])))
                           for i in range(0, len(batch), chunk)])


def exact_pairs(models: dict, evaluation, log=print) -> list[dict]:
    """alpha = 1 - E[TV] (temperature 1) and greedy agreement for every pair with a smaller draft."""
    records = [rec for rec, _ in models.values()]
    targets = longest_budgets(records)
    probs = {}
    for text in TEXTS:
        batch = getattr(evaluation, text)
        for name, (_, model) in models.items():
            probs[text, name] = _next_token_probs(model, batch)
    tv = jax.jit(lambda p, q: acceptance_from_distributions(p, q).mean())
    rows = []
    for target in targets:
        for draft in sorted(records, key=lambda r: (r["n_params"], r["n_tokens"])):
            if draft["n_params"] >= target["n_params"]:
                continue
            row = dict(draft=draft["name"], target=target["name"], n_draft=draft["n_params"],
                       n_target=target["n_params"], d_draft=draft["n_tokens"], d_target=target["n_tokens"])
            for text in TEXTS:
                p, q = probs[text, target["name"]], probs[text, draft["name"]]
                row[f"ppl_draft_{text}"] = float(np.exp(draft[f"loss_{text}"]))
                row[f"ppl_target_{text}"] = float(np.exp(target[f"loss_{text}"]))
                row[f"alpha_{text}"] = float(tv(jnp.asarray(p), jnp.asarray(q)))
                row[f"alpha_greedy_{text}"] = float(np.mean(p.argmax(-1) == q.argmax(-1)))
            rows.append(row)
        count = sum(r["target"] == target["name"] for r in rows)
        if count:
            log(f"exact alpha for target {target['name']}: {count} drafts")
    return rows


def ladder_datasets(registry: dict, pairs: list[dict], text: str,
                    source: str) -> tuple[PretrainingRuns, AcceptanceMeasurements]:
    """The fitters' tables for one evaluation text: every ladder model's loss as a pre-training run, every
    exact pair (:func:`exact_pairs`) as an acceptance measurement."""
    models = registry["models"]
    runs = PretrainingRuns(
        n_params=np.array([m["n_params"] for m in models], float), n_tokens=np.array([m["n_tokens"] for m in models], float),
        loss=np.array([m[f"loss_{text}"] for m in models]), name=tuple(m["name"] for m in models),
        flops=np.array([6.0 * m["n_params"] * m["n_tokens"] for m in models]), source=(source,) * len(models))
    col = lambda key: np.array([p[key] for p in pairs], float)  # noqa: E731
    nan = np.full(len(pairs), np.nan)
    acceptance = AcceptanceMeasurements(
        draft=tuple(p["draft"] for p in pairs), target=tuple(p["target"] for p in pairs),
        n_draft=col("n_draft"), n_target=col("n_target"), d_draft=col("d_draft"), d_target=col("d_target"),
        ppl_draft=col(f"ppl_draft_{text}"), ppl_target=col(f"ppl_target_{text}"), alpha=col(f"alpha_{text}"),
        gamma=nan, n_iterations=nan, accepted=nan, weight=nan, temperature=np.ones(len(pairs)),
        source=(f"{source}: exact 1 - E[TV], {text}",) * len(pairs))
    return runs, acceptance
