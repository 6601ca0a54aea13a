"""Per-call latencies, ``sdsl-latency v1``: timed forward calls (and decoding iterations) per model.

Every column and its rule: ``docs/data.md``.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from sdsl_jax.data.tables import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    DataError,
    column,
    read_table,
    select_rows,
    to_arrays,
    write_table,
)

__all__ = [
    "LATENCY_SCHEMA",
    "LATENCY_KINDS",
    "LatencyMeasurements",
    "load_latency",
    "save_latency",
]


LATENCY_SCHEMA = (
    column("model", "str", True),
    column("n_params", "float", True, POSITIVE),
    column("batch", "int", True, AT_LEAST_ONE),
    column("tokens", "int", True, AT_LEAST_ONE),
    column("seconds_median", "float", True, POSITIVE),
    column("seconds_iqr", "float", False, NON_NEGATIVE),
    column("repeats", "int", False, AT_LEAST_ONE),
    column("calls", "int", False, AT_LEAST_ONE),
    column("cache_length", "int", False, NON_NEGATIVE),
    column("machine", "str", False),
    column("kind", "str", False),
    column("n_draft", "float", False, POSITIVE),
    column("gamma", "int", False, AT_LEAST_ONE),
)


LATENCY_KINDS = ("call", "alone", "iteration")


@dataclasses.dataclass(frozen=True)
class LatencyMeasurements:
    """Per-call latencies (schema ``sdsl-latency v1``)."""

    model: tuple[str, ...]
    n_params: np.ndarray
    batch: np.ndarray
    tokens: np.ndarray
    seconds_median: np.ndarray
    seconds_iqr: np.ndarray
    repeats: np.ndarray
    calls: np.ndarray
    cache_length: np.ndarray
    machine: tuple[str | None, ...]
    kind: tuple[str | None, ...] = None
    n_draft: np.ndarray = None
    gamma: np.ndarray = None
    path: str | None = None
    sha256: str | None = None

    def __post_init__(self):
        n = len(self.tokens)  # a table without loop rows: every row is one call
        if self.kind is None:
            object.__setattr__(self, "kind", ("call",) * n)
        for name in ("n_draft", "gamma"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, np.nan))

    def __len__(self) -> int:
        return len(self.tokens)

    def of_kind(self, kind: str) -> "LatencyMeasurements":
        """The rows of one kind (blank kinds are calls)."""
        return self.select(np.array([(k or "call") == kind for k in self.kind], bool))

    def select(self, mask: np.ndarray) -> "LatencyMeasurements":
        return select_rows(self, mask)


def load_latency(path: str | os.PathLike) -> LatencyMeasurements:
    """Load and validate per-call latencies; raises :class:`DataError`."""
    path = os.fspath(path)
    columns = to_arrays(read_table(path, LATENCY_SCHEMA), LATENCY_SCHEMA)
    for i, kind in enumerate(columns["kind"]):
        kind = kind or "call"
        if kind not in LATENCY_KINDS:
            raise DataError(path, i + 2, "kind", f"{kind!r} is not one of {', '.join(LATENCY_KINDS)}")
        if kind == "iteration":
            for name in ("n_draft", "gamma"):
                if not np.isfinite(columns[name][i]):
                    raise DataError(path, i + 2, name, "is needed in an iteration row")
            if columns["tokens"][i] != columns["gamma"][i] + 1:
                raise DataError(path, i + 2, "tokens", f"must be gamma + 1 = {columns['gamma'][i] + 1:g} in an "
                                                       "iteration row")
    columns["kind"] = tuple(k or "call" for k in columns["kind"])
    return LatencyMeasurements(**columns, path=path)


def save_latency(measurements: LatencyMeasurements, path: str | os.PathLike) -> None:
    """Write latencies as ``sdsl-latency v1`` CSV, atomically."""
    write_table(measurements, LATENCY_SCHEMA, path)
