"""Speculative-decoding runs, ``sdsl-speculative v1``: one (target, draft, gamma) run per row, cross-checked
against itself on loading.

Every column and its rule: ``docs/data.md``.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from sdsl_jax.data.tables import (
    AT_LEAST_ONE,
    AT_LEAST_ONE_FLOAT,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    DataError,
    column,
    read_table,
    select_rows,
    to_arrays,
)
from sdsl_jax.data.acceptance import ALPHA_AGREEMENT

__all__ = [
    "SPECULATIVE_SCHEMA",
    "SpeculativeRuns",
    "load_speculative",
]


SPECULATIVE_SCHEMA = (
    column("target", "str", True),
    column("draft", "str", True),
    column("n_target", "float", True, POSITIVE),
    column("n_draft", "float", True, POSITIVE),
    column("d_target", "float", True, POSITIVE),
    column("d_draft", "float", True, POSITIVE),
    column("gamma", "int", True, AT_LEAST_ONE),
    column("prompts", "int", False, AT_LEAST_ONE),
    column("new_tokens", "int", False, AT_LEAST_ONE),
    column("iterations", "int", True, AT_LEAST_ONE),
    column("accepted", "int", True, NON_NEGATIVE),
    column("alpha_mle", "float", True, UNIT),
    column("accepted_over_drafted", "float", False, UNIT),
    column("tau", "float", False, AT_LEAST_ONE_FLOAT),
    column("histogram", "str", False),
    column("draft_calls", "int", False, NON_NEGATIVE),
    column("target_calls", "int", False, NON_NEGATIVE),
    column("tokens_per_flop_sdsl", "float", True, POSITIVE),
    column("predicted_tokens_per_flop_sdsl", "float", False, POSITIVE),
    column("target_alone_tokens_per_flop_sdsl", "float", False, POSITIVE),
    column("tokens_per_flop_xla", "float", False, POSITIVE),
    column("target_alone_tokens_per_flop_xla", "float", False, POSITIVE),
    column("seconds_median", "float", False, NON_NEGATIVE),
    column("seconds_iqr", "float", False, NON_NEGATIVE),
    column("tokens_per_second", "float", False, POSITIVE),
    column("target_alone_tokens_per_second", "float", False, POSITIVE),
    column("wallclock_speedup", "float", False, POSITIVE),
    column("repeats", "int", False, AT_LEAST_ONE),
    column("iterations_per_prompt", "str", False),
    column("accepted_per_prompt", "str", False),
)


@dataclasses.dataclass(frozen=True)
class SpeculativeRuns:
    """Speculative-decoding runs (schema ``sdsl-speculative v1``); one field per column."""

    target: tuple[str, ...]
    draft: tuple[str, ...]
    n_target: np.ndarray
    n_draft: np.ndarray
    d_target: np.ndarray
    d_draft: np.ndarray
    gamma: np.ndarray
    prompts: np.ndarray
    new_tokens: np.ndarray
    iterations: np.ndarray
    accepted: np.ndarray
    alpha_mle: np.ndarray
    accepted_over_drafted: np.ndarray
    tau: np.ndarray
    histogram: tuple[str | None, ...]
    draft_calls: np.ndarray
    target_calls: np.ndarray
    tokens_per_flop_sdsl: np.ndarray
    predicted_tokens_per_flop_sdsl: np.ndarray
    target_alone_tokens_per_flop_sdsl: np.ndarray
    tokens_per_flop_xla: np.ndarray
    target_alone_tokens_per_flop_xla: np.ndarray
    seconds_median: np.ndarray
    seconds_iqr: np.ndarray
    tokens_per_second: np.ndarray
    target_alone_tokens_per_second: np.ndarray
    wallclock_speedup: np.ndarray
    repeats: np.ndarray
    path: str | None = None
    iterations_per_prompt: tuple[str | None, ...] = None
    accepted_per_prompt: tuple[str | None, ...] = None
    sha256: str | None = None

    def __post_init__(self):
        for name in ("iterations_per_prompt", "accepted_per_prompt"):
            if getattr(self, name) is None:  # files and callers from before these columns
                object.__setattr__(self, name, (None,) * len(self.gamma))

    def __len__(self) -> int:
        return len(self.gamma)

    def per_prompt(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(iterations, accepted)`` per prompt of ``row``, or None where the file does not record them."""
        its, acc = self.iterations_per_prompt[row], self.accepted_per_prompt[row]
        if its is None or acc is None:
            return None
        return (np.array([int(v) for v in its.split(";")], np.int64),
                np.array([int(v) for v in acc.split(";")], np.int64))

    def select(self, mask: np.ndarray) -> "SpeculativeRuns":
        return select_rows(self, mask)


def load_speculative(path: str | os.PathLike) -> SpeculativeRuns:
    """Load and validate speculative-decoding runs; raises :class:`DataError`.

    Per-prompt counts, where given, must be given together, one integer per prompt, and add up to
    the row's ``iterations`` and ``accepted``.
    """
    path = os.fspath(path)
    runs = SpeculativeRuns(**to_arrays(read_table(path, SPECULATIVE_SCHEMA), SPECULATIVE_SCHEMA), path=path)
    for i in range(len(runs)):
        line = i + 2
        _check_speculative_counts(path, line, runs, i)
        given = [runs.iterations_per_prompt[i] is not None, runs.accepted_per_prompt[i] is not None]
        if given[0] != given[1]:
            missing = "accepted_per_prompt" if given[0] else "iterations_per_prompt"
            raise DataError(path, line, missing, "is empty while the other per-prompt column is given")
        if not given[0]:
            continue
        counts = {}
        for name in ("iterations_per_prompt", "accepted_per_prompt"):
            try:
                counts[name] = [int(v) for v in getattr(runs, name)[i].split(";")]
            except ValueError:
                raise DataError(path, line, name, f"{getattr(runs, name)[i]!r} is not ';'-separated integers") from None
            if min(counts[name]) < 0:
                raise DataError(path, line, name, "has a negative count")
        its, acc = counts["iterations_per_prompt"], counts["accepted_per_prompt"]
        if len(its) != len(acc):
            raise DataError(path, line, "accepted_per_prompt", f"has {len(acc)} prompts, iterations_per_prompt {len(its)}")
        if np.isfinite(runs.prompts[i]) and len(its) != runs.prompts[i]:
            raise DataError(path, line, "iterations_per_prompt", f"has {len(its)} prompts, the row says {runs.prompts[i]:g}")
        for name, values, total in (("iterations_per_prompt", its, runs.iterations[i]),
                                    ("accepted_per_prompt", acc, runs.accepted[i])):
            if sum(values) != total:
                column = name.replace("_per_prompt", "")
                raise DataError(path, line, name, f"adds up to {sum(values)}, not to {column} = {total:g}")
    return runs


def _check_speculative_counts(path: str, line: int, runs: SpeculativeRuns, i: int) -> None:
    """Cross-check one row's counts: histogram against gamma, iterations and accepted; alpha_mle,
    tau and accepted_over_drafted against the counts they summarise."""
    gamma, iterations, accepted = int(runs.gamma[i]), runs.iterations[i], runs.accepted[i]
    if accepted > gamma * iterations:
        raise DataError(path, line, "accepted", f"{accepted:g} exceeds gamma x iterations = {gamma * iterations:g}: "
                                                "an iteration accepts at most gamma drafted tokens")
    text = runs.histogram[i]
    if text is not None:
        try:
            hist = np.array([int(v) for v in text.split(";")], np.int64)
        except ValueError:
            raise DataError(path, line, "histogram", f"{text!r} is not ';'-separated integers") from None
        if len(hist) != gamma + 1:
            raise DataError(path, line, "histogram", f"has {len(hist)} counts; gamma = {gamma} needs gamma + 1 = "
                                                     f"{gamma + 1} (iterations accepting 0 .. gamma tokens)")
        if hist.min() < 0:
            raise DataError(path, line, "histogram", "has a negative count")
        if hist.sum() != iterations:
            raise DataError(path, line, "histogram", f"adds up to {hist.sum()} iterations, the row says iterations = "
                                                     f"{iterations:g}")
        if int(np.arange(gamma + 1) @ hist) != accepted:
            raise DataError(path, line, "histogram", f"accepts {int(np.arange(gamma + 1) @ hist)} tokens in all, the "
                                                     f"row says accepted = {accepted:g}")
        rejections = int(hist[:gamma].sum())  # iterations that ended on a rejected draft
        low = high = accepted / (accepted + rejections) if accepted + rejections else 0.0
        what = f"the histogram's MLE {low:.4f}"
    else:  # without the histogram the rejections lie between the iterations less the full ones and all
        full_max = accepted // gamma if gamma else 0
        low = accepted / (accepted + iterations) if accepted + iterations else 0.0
        rest = accepted + iterations - full_max
        high = accepted / rest if rest > 0 else 1.0
        what = f"the MLE's range [{low:.4f}, {high:.4f}] from accepted and iterations"
    if not (low - ALPHA_AGREEMENT <= runs.alpha_mle[i] <= high + ALPHA_AGREEMENT):
        raise DataError(path, line, "alpha_mle", f"{runs.alpha_mle[i]:.6g} contradicts {what} (tolerance "
                                                 f"{ALPHA_AGREEMENT})")
    tau = runs.tau[i]
    if np.isfinite(tau):
        if not 1 <= tau <= gamma + 1:
            raise DataError(path, line, "tau", f"{tau:g} is outside [1, gamma + 1] = [1, {gamma + 1}]: an iteration "
                                               "yields between 1 and gamma + 1 tokens")
        expected = 1 + accepted / iterations
        if abs(tau - expected) > ALPHA_AGREEMENT * (gamma + 1):
            raise DataError(path, line, "tau", f"{tau:g} contradicts 1 + accepted / iterations = {expected:.4f}")
    ratio = runs.accepted_over_drafted[i]
    if np.isfinite(ratio) and abs(ratio - accepted / (gamma * iterations)) > ALPHA_AGREEMENT:
        raise DataError(path, line, "accepted_over_drafted", f"{ratio:g} contradicts accepted / (gamma x iterations) "
                                                             f"= {accepted / (gamma * iterations):.4f}")
