"""Acceptance measurements, ``sdsl-acceptance v1``: one draft/target pair per row, alpha measured or derived
from what serving engines report (mean acceptance length, per-position counts).

Every column and its rule: ``docs/data.md``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from sdsl_jax.data.tables import (
    AT_LEAST_ONE,
    AT_LEAST_ONE_FLOAT,
    NON_NEGATIVE,
    PERPLEXITY,
    POSITIVE,
    PROBABILITY,
    DataError,
    column,
    read_table,
    select_rows,
    to_arrays,
    write_table,
)

__all__ = [
    "ACCEPTANCE_SCHEMA",
    "ALPHA_AGREEMENT",
    "AcceptanceMeasurements",
    "load_acceptance",
    "save_acceptance",
]


ACCEPTANCE_SCHEMA = (
    column("draft", "str", True),
    column("target", "str", True),
    column("n_draft", "float", True, POSITIVE),
    column("n_target", "float", True, POSITIVE),
    column("d_draft", "float", True, POSITIVE),
    column("d_target", "float", True, POSITIVE),
    column("ppl_draft", "float", True, PERPLEXITY),
    column("ppl_target", "float", True, PERPLEXITY),
    column("alpha", "float", False, PROBABILITY),
    column("gamma", "int", False, AT_LEAST_ONE),
    column("n_iterations", "int", False, AT_LEAST_ONE),
    column("accepted", "int", False, NON_NEGATIVE),
    column("weight", "float", False, POSITIVE),
    column("temperature", "float", False, NON_NEGATIVE),
    column("source", "str", False),
    column("mean_acceptance_length", "float", False, AT_LEAST_ONE_FLOAT),
    column("accepted_per_position", "str", False),
)


ALPHA_AGREEMENT = 0.01
"""How far two of a row's alpha sources (alpha, mean length, per-position counts) may differ."""


@dataclasses.dataclass(frozen=True)
class AcceptanceMeasurements:
    """Acceptance measurements (schema ``sdsl-acceptance v1``); missing optionals are NaN/None."""

    draft: tuple[str, ...]
    target: tuple[str, ...]
    n_draft: np.ndarray
    n_target: np.ndarray
    d_draft: np.ndarray
    d_target: np.ndarray
    ppl_draft: np.ndarray
    ppl_target: np.ndarray
    alpha: np.ndarray
    gamma: np.ndarray
    n_iterations: np.ndarray
    accepted: np.ndarray
    weight: np.ndarray
    temperature: np.ndarray
    source: tuple[str | None, ...]
    mean_acceptance_length: np.ndarray = None
    accepted_per_position: tuple[str | None, ...] = None
    path: str | None = None
    sha256: str | None = None

    def __post_init__(self):
        n = len(self.alpha)  # optional columns default to "not given" (older callers)
        if self.mean_acceptance_length is None:
            object.__setattr__(self, "mean_acceptance_length", np.full(n, np.nan))
        if self.accepted_per_position is None:
            object.__setattr__(self, "accepted_per_position", (None,) * n)

    def __len__(self) -> int:
        return len(self.alpha)

    def regression_weights(self) -> np.ndarray:
        """``weight`` where given, else ``n_iterations`` where given, else 1 (per row)."""
        w = np.where(np.isfinite(self.weight), self.weight, self.n_iterations)
        return np.where(np.isfinite(w), w, 1.0)

    def model_index(self) -> tuple[np.ndarray, int, np.ndarray, int]:
        """``(draft, drafts, target, targets)``: each pair's draft and target model as integers in
        ``[0, drafts)`` and ``[0, targets)``, numbered by the ``draft`` / ``target`` labels in order
        of first appearance (:func:`sdsl_jax.infer.models.model_effects_plane_model_for`)."""
        out = []
        for labels in (self.draft, self.target):
            order = {label: i for i, label in enumerate(dict.fromkeys(labels))}
            out += [np.array([order[label] for label in labels], np.int32), len(order)]
        return tuple(out)

    def has_repeated_models(self) -> bool:
        """Whether some draft or target model is in two or more pairs (per-model effects are identified)."""
        return len(set(self.draft)) < len(self.draft) or len(set(self.target)) < len(self.target)

    def model_effects_identified(self, *, min_contrasts: int = 5) -> tuple[tuple[str, ...], str]:
        """The kinds of model (``"draft"``, ``"target"``) whose per-model effects the design identifies,
        and why (or why not); an empty tuple (false) keeps pairs independent.

        A model effect's scale is a variance over models, estimated from the models of that kind that
        appear in two or more pairs. Each such model has one perplexity, so the mean of their effects
        and their trend along that perplexity belong to the acceptance model's intercept and slope:
        the scale rests on the other ``repeated - 2`` contrasts. With fewer than ``min_contrasts`` its
        posterior has a long tail of large scales, where the effects are pinned by the data and NUTS
        diverges (the ladder's six targets: divergent transitions or too few effective draws in most
        runs of every acceptance model, ``docs/benchmarks.md``); that kind's effects are then left
        out, and a new pair's scatter is its draft's effect and its own residual.
        """
        sides, counts = [], []
        for kind, labels in (("draft", self.draft), ("target", self.target)):
            repeated = sum(1 for label in set(labels) if labels.count(label) >= 2)
            contrasts = repeated - 2
            if contrasts >= min_contrasts:
                sides.append(kind)
                counts.append(f"{repeated} {kind} models in two or more pairs")
            else:
                counts.append(f"only {repeated} {kind} model(s) appear in two or more pairs, {max(contrasts, 0)} "
                              f"beyond the intercept and slope (per-{kind} effects need {min_contrasts})")
        return tuple(sides), "; ".join(counts)

    def select(self, mask: np.ndarray) -> "AcceptanceMeasurements":
        return select_rows(self, mask)


def load_acceptance(path: str | os.PathLike) -> AcceptanceMeasurements:
    """Load and validate acceptance measurements; raises :class:`DataError`.

    Rows without ``alpha`` get it from ``mean_acceptance_length`` and ``gamma``, or from
    ``accepted_per_position`` and ``n_iterations`` (see the schema).
    """
    path = os.fspath(path)
    columns = to_arrays(read_table(path, ACCEPTANCE_SCHEMA), ACCEPTANCE_SCHEMA)
    columns["alpha"] = _alpha_from_engine_columns(path, columns)
    return AcceptanceMeasurements(**columns, path=path)


def _alpha_from_engine_columns(path: str, c: dict[str, Any]) -> np.ndarray:
    from sdsl_jax.speculative import acceptance_from_mean_length, acceptance_from_position_counts

    alpha = np.array(c["alpha"], np.float64)
    for i in range(len(alpha)):
        line = i + 2  # one physical line per row (multi-line records are refused)
        sources = {"alpha": alpha[i]} if np.isfinite(alpha[i]) else {}
        tau, gamma = c["mean_acceptance_length"][i], c["gamma"][i]
        if np.isfinite(tau):
            if not np.isfinite(gamma):
                raise DataError(path, line, "gamma", "is needed with mean_acceptance_length (the lookahead it was "
                                                     "measured at)")
            if tau > gamma + 1:
                raise DataError(path, line, "mean_acceptance_length", f"{tau:g} exceeds gamma + 1 = {gamma + 1:g}: "
                                "a step yields at most gamma + 1 tokens")
            sources["mean_acceptance_length"] = float(acceptance_from_mean_length(tau, gamma))
        counts_text = c["accepted_per_position"][i]
        if counts_text is not None:
            column = "accepted_per_position"
            try:
                counts = np.array([float(v) for v in counts_text.split(";")])
            except ValueError:
                raise DataError(path, line, column, f"{counts_text!r} is not ';'-separated counts") from None
            steps = c["n_iterations"][i]
            if not np.isfinite(steps):
                raise DataError(path, line, "n_iterations", "is needed with accepted_per_position")
            if np.isfinite(gamma) and len(counts) != gamma:
                raise DataError(path, line, column, f"has {len(counts)} counts, gamma is {gamma:g}")
            if not (np.all(counts >= 0) and np.all(counts == np.round(counts)) and counts[0] <= steps
                    and np.all(np.diff(counts) <= 0)):
                raise DataError(path, line, column, f"{counts_text!r} must be integers >= 0, at most n_iterations, "
                                                    "never rising with the position")
            sources[column] = float(acceptance_from_position_counts(counts, steps))
        if not sources:
            raise DataError(path, line, "alpha", "is empty: give alpha, or mean_acceptance_length with gamma, or "
                                                 "accepted_per_position with n_iterations")
        values = np.array(list(sources.values()))
        if values.max() - values.min() > ALPHA_AGREEMENT:
            raise DataError(path, line, None, "alpha sources disagree by more than "
                            f"{ALPHA_AGREEMENT}: " + ", ".join(f"{k} -> {v:.4f}" for k, v in sources.items()))
        value = sources.get("alpha", values[0])
        if not 0 < value < 1:
            raise DataError(path, line, next(iter(sources)), f"gives alpha = {value:.6g}, outside the open interval "
                                                             "(0, 1) the acceptance model needs")
        alpha[i] = value
    return alpha


def save_acceptance(measurements: AcceptanceMeasurements, path: str | os.PathLike) -> None:
    """Write measurements as ``sdsl-acceptance v1`` CSV, atomically."""
    write_table(measurements, ACCEPTANCE_SCHEMA, path)
