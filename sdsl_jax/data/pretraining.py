"""Pre-training runs, ``sdsl-pretraining v1``: one (N, D, loss) per row.

Every column and its rule: ``docs/data.md``.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from sdsl_jax.data.tables import POSITIVE, column, read_table, select_rows, to_arrays, write_table

__all__ = [
    "PRETRAINING_SCHEMA",
    "PretrainingRuns",
    "load_pretraining",
    "save_pretraining",
]


PRETRAINING_SCHEMA = (
    column("n_params", "float", True, POSITIVE),
    column("n_tokens", "float", True, POSITIVE),
    column("loss", "float", True, POSITIVE),
    column("name", "str", False),
    column("flops", "float", False, POSITIVE),
    column("source", "str", False),
    column("run", "str", False),
)


@dataclasses.dataclass(frozen=True)
class PretrainingRuns:
    """Pre-training runs (schema ``sdsl-pretraining v1``); numeric columns are float64 arrays."""

    n_params: np.ndarray
    n_tokens: np.ndarray
    loss: np.ndarray
    name: tuple[str | None, ...]
    flops: np.ndarray
    source: tuple[str | None, ...]
    path: str | None = None
    run: tuple[str | None, ...] = None
    sha256: str | None = None

    def __post_init__(self):
        if self.run is None:  # older callers: no run column
            object.__setattr__(self, "run", (None,) * len(self.loss))

    def __len__(self) -> int:
        return len(self.loss)

    def run_labels(self) -> tuple[str, ...]:
        """Each row's run: the ``run`` column where given, else the model size (one run per N)."""
        return tuple(r if r is not None else f"N={float(n)!r}" for r, n in zip(self.run, self.n_params))

    def run_index(self) -> tuple[np.ndarray, int]:
        """``(index, count)``: each row's run as an integer in ``[0, count)``, in order of first appearance."""
        labels = self.run_labels()
        order = {label: i for i, label in enumerate(dict.fromkeys(labels))}
        return np.array([order[label] for label in labels], np.int32), len(order)

    def select(self, mask: np.ndarray) -> "PretrainingRuns":
        """The runs where ``mask`` is true (a boolean array or integer indices)."""
        return select_rows(self, mask)


def load_pretraining(path: str | os.PathLike) -> PretrainingRuns:
    """Load and validate pre-training runs; raises :class:`DataError` naming file, line, column."""
    return PretrainingRuns(**to_arrays(read_table(path, PRETRAINING_SCHEMA), PRETRAINING_SCHEMA), path=os.fspath(path))


def save_pretraining(runs: PretrainingRuns, path: str | os.PathLike) -> None:
    """Write runs as ``sdsl-pretraining v1`` CSV, atomically."""
    write_table(runs, PRETRAINING_SCHEMA, path)
