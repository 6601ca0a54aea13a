"""Dataset schemas (version 1) and their validated loading and saving.

CSV schemas, one row per observation, a header row naming the columns (any order; extra
columns are ignored). Optional columns may be absent or left blank (read as NaN / None).

Pre-training runs, ``sdsl-pretraining v1``:

  ============  ========  ======================================================
  column        required  meaning
  ============  ========  ======================================================
  n_params      yes       model size N (parameters), > 0
  n_tokens      yes       training tokens D, > 0
  loss          yes       final loss in nats per token, > 0
  name          no        run name
  flops         no        training compute (FLOP), > 0
  source        no        where the row comes from
  run           no        training run the row belongs to (rows of one run share a random
                          effect in the Bayesian fit: checkpoints or budget branches of one
                          schedule); default: the model size, one run per distinct N
  ============  ========  ======================================================

Acceptance measurements, ``sdsl-acceptance v1``:

  ============  ========  ======================================================
  draft         yes       draft model name
  target        yes       target model name
  n_draft       yes       draft parameters N, > 0
  n_target      yes       target parameters M, > 0
  d_draft       yes       draft training tokens D, > 0
  d_target      yes       target training tokens D', > 0
  ppl_draft     yes       draft perplexity x, >= 1
  ppl_target    yes       target perplexity y, >= 1
  alpha         yes (a)   acceptance rate, in (0, 1)
  gamma         no        lookahead used, integer >= 1
  mean_acceptance_length  no   tokens per speculative step at ``gamma``, 1 + mean accepted drafts
                                (what vLLM / SGLang / HF report), in [1, gamma + 1]
  accepted_per_position   no   ';'-separated counts of steps whose k-th draft was accepted,
                                k = 1 .. gamma (vLLM's per-position counters); needs n_iterations
  n_iterations  no        speculative iterations measured, integer >= 1
  accepted      no        accepted draft tokens in total, integer >= 0
  weight        no        regression weight, > 0
  temperature   no        sampling temperature, >= 0
  source        no        where the row comes from
  ============  ========  ======================================================

(a) ``alpha`` may be left blank where a row gives ``mean_acceptance_length`` and ``gamma`` (alpha is
then the root of ``(1 - alpha^(gamma+1)) / (1 - alpha) = mean_acceptance_length``,
:func:`sdsl_jax.acceptance_from_mean_length`) or ``accepted_per_position`` and ``n_iterations``
(the maximum-likelihood alpha, :func:`sdsl_jax.acceptance_from_position_counts`). A row that gives
more than one must agree within 0.01 in alpha.

Speculative-decoding runs, ``sdsl-speculative v1`` (one row per (target, draft, gamma), written by
``experiments.measure``; all counts summed over the prompts):

  ==================================  ========  ===============================================
  target, draft                       yes       model names
  n_target, n_draft                   yes       parameters M and N, > 0
  d_target, d_draft                   yes       training tokens D' and D, > 0
  gamma                               yes       lookahead, integer >= 1
  iterations                          yes       speculative iterations, integer >= 1
  accepted                            yes       accepted draft tokens, integer >= 0
  alpha_mle                           yes       MLE of alpha from the accepted counts, in [0, 1]
  tokens_per_flop_sdsl                yes       measured tokens per FLOP under the SDSL cost, > 0
  prompts, new_tokens                 no        prompts decoded and tokens generated, integers >= 1
  accepted_over_drafted               no        accepted / drafted (NOT alpha), in [0, 1]
  tau                                 no        mean tokens per iteration, >= 1
  histogram                           no        counts of 0..gamma accepted tokens, ';'-separated
  draft_calls, target_calls           no        forward calls of each model, integers >= 0
  predicted_tokens_per_flop_sdsl      no        T(gamma; alpha_mle) under the SDSL cost, > 0
  target_alone_tokens_per_flop_sdsl   no        1 / (2 M), > 0
  tokens_per_flop_xla                 no        tokens per FLOP counted by XLA's cost analysis, > 0
  target_alone_tokens_per_flop_xla    no        the same for the target alone, > 0
  seconds_median, seconds_iqr         no        wall-clock of a decoding run, median and IQR, >= 0
  tokens_per_second                   no        tokens per second (median), > 0
  target_alone_tokens_per_second      no        the target alone, > 0
  wallclock_speedup                   no        tokens_per_second / target_alone_tokens_per_second, > 0
  repeats                             no        timed repeats, integer >= 1
  iterations_per_prompt               no        iterations of each prompt, ';'-separated (the same
                                                  prompts, in one order, for every row of a target:
                                                  a paired bootstrap over prompts needs them)
  accepted_per_prompt                 no        accepted draft tokens of each prompt, ';'-separated
  ==================================  ========  ===============================================

Per-call latencies, ``sdsl-latency v1`` (written by ``experiments.latency``; one row per model,
batch size and number of tokens read in one forward call with a KV cache):

  ==================  ========  =====================================================
  model               yes       model name
  n_params            yes       parameters N, > 0
  batch               yes       sequences per call, integer >= 1
  tokens              yes       positions read per call, integer >= 1 (1: a draft step;
                                k: a verification of k positions)
  seconds_median      yes       median seconds per call, > 0
  seconds_iqr         no        interquartile range over the repeats, >= 0
  repeats             no        timed repeats, integer >= 1
  calls               no        calls per timed repeat (timed in one compiled loop), >= 1
  cache_length        no        positions already in the cache, integer >= 0
  machine             no        where it was measured
  kind                no        ``call`` (blank: one forward call), ``alone`` (seconds per token
                                of the target decoding alone) or ``iteration`` (seconds per
                                iteration of speculative decoding; ``n_params`` is the target's)
  n_draft             no        the draft's parameters, > 0 (``iteration`` rows)
  gamma               no        the lookahead, integer >= 1 (``iteration`` rows; tokens = gamma + 1)
  ==================  ========  =====================================================

Every problem is a :class:`DataError` that names the file, the line and the column and shows the
offending value. Saving is atomic (a temporary file renamed into place).
"""

from __future__ import annotations

import csv
import hashlib
import io
import dataclasses
import math
import os
from typing import Any, Callable

import numpy as np

__all__ = [
    "DataError",
    "PretrainingRuns",
    "AcceptanceMeasurements",
    "SpeculativeRuns",
    "LatencyMeasurements",
    "load_pretraining",
    "load_latency",
    "save_latency",
    "LATENCY_SCHEMA",
    "load_acceptance",
    "load_speculative",
    "save_pretraining",
    "save_acceptance",
    "PRETRAINING_SCHEMA",
    "ACCEPTANCE_SCHEMA",
    "SPECULATIVE_SCHEMA",
]

SCHEMA_VERSION = 1


class DataError(ValueError):
    """A dataset that does not follow its schema; the message names file, line and column."""

    def __init__(self, path: str, line: int | None, column: str | None, problem: str):
        self.path, self.line, self.column, self.problem = path, line, column, problem
        where = f"{path}" + (f":{line}" if line is not None else "")
        what = f" column '{column}':" if column else ""
        super().__init__(f"{where}:{what} {problem}")


@dataclasses.dataclass(frozen=True)
class _Column:
    name: str
    kind: str  # "float", "int" or "str"
    required: bool
    valid: Callable[[float], bool] | None = None
    rule: str = ""


_POSITIVE = (lambda v: v > 0, "must be > 0")
_PERPLEXITY = (lambda v: v >= 1, "must be >= 1 (a perplexity)")
_PROBABILITY = (lambda v: 0 < v < 1, "must be in the open interval (0, 1)")
_AT_LEAST_ONE = (lambda v: v >= 1, "must be an integer >= 1")
_NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
_UNIT = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
_AT_LEAST_ONE_FLOAT = (lambda v: v >= 1, "must be >= 1")


def _col(name, kind, required, check=(None, "")):
    return _Column(name, kind, required, check[0], check[1])


PRETRAINING_SCHEMA = (
    _col("n_params", "float", True, _POSITIVE),
    _col("n_tokens", "float", True, _POSITIVE),
    _col("loss", "float", True, _POSITIVE),
    _col("name", "str", False),
    _col("flops", "float", False, _POSITIVE),
    _col("source", "str", False),
    _col("run", "str", False),
)

ACCEPTANCE_SCHEMA = (
    _col("draft", "str", True),
    _col("target", "str", True),
    _col("n_draft", "float", True, _POSITIVE),
    _col("n_target", "float", True, _POSITIVE),
    _col("d_draft", "float", True, _POSITIVE),
    _col("d_target", "float", True, _POSITIVE),
    _col("ppl_draft", "float", True, _PERPLEXITY),
    _col("ppl_target", "float", True, _PERPLEXITY),
    _col("alpha", "float", False, _PROBABILITY),
    _col("gamma", "int", False, _AT_LEAST_ONE),
    _col("n_iterations", "int", False, _AT_LEAST_ONE),
    _col("accepted", "int", False, _NON_NEGATIVE),
    _col("weight", "float", False, _POSITIVE),
    _col("temperature", "float", False, _NON_NEGATIVE),
    _col("source", "str", False),
    _col("mean_acceptance_length", "float", False, _AT_LEAST_ONE_FLOAT),
    _col("accepted_per_position", "str", False),
)

ALPHA_AGREEMENT = 0.01
"""How far two of a row's alpha sources (alpha, mean length, per-position counts) may differ."""


SPECULATIVE_SCHEMA = (
    _col("target", "str", True),
    _col("draft", "str", True),
    _col("n_target", "float", True, _POSITIVE),
    _col("n_draft", "float", True, _POSITIVE),
    _col("d_target", "float", True, _POSITIVE),
    _col("d_draft", "float", True, _POSITIVE),
    _col("gamma", "int", True, _AT_LEAST_ONE),
    _col("prompts", "int", False, _AT_LEAST_ONE),
    _col("new_tokens", "int", False, _AT_LEAST_ONE),
    _col("iterations", "int", True, _AT_LEAST_ONE),
    _col("accepted", "int", True, _NON_NEGATIVE),
    _col("alpha_mle", "float", True, _UNIT),
    _col("accepted_over_drafted", "float", False, _UNIT),
    _col("tau", "float", False, _AT_LEAST_ONE_FLOAT),
    _col("histogram", "str", False),
    _col("draft_calls", "int", False, _NON_NEGATIVE),
    _col("target_calls", "int", False, _NON_NEGATIVE),
    _col("tokens_per_flop_sdsl", "float", True, _POSITIVE),
    _col("predicted_tokens_per_flop_sdsl", "float", False, _POSITIVE),
    _col("target_alone_tokens_per_flop_sdsl", "float", False, _POSITIVE),
    _col("tokens_per_flop_xla", "float", False, _POSITIVE),
    _col("target_alone_tokens_per_flop_xla", "float", False, _POSITIVE),
    _col("seconds_median", "float", False, _NON_NEGATIVE),
    _col("seconds_iqr", "float", False, _NON_NEGATIVE),
    _col("tokens_per_second", "float", False, _POSITIVE),
    _col("target_alone_tokens_per_second", "float", False, _POSITIVE),
    _col("wallclock_speedup", "float", False, _POSITIVE),
    _col("repeats", "int", False, _AT_LEAST_ONE),
    _col("iterations_per_prompt", "str", False),
    _col("accepted_per_prompt", "str", False),
)


LATENCY_SCHEMA = (
    _col("model", "str", True),
    _col("n_params", "float", True, _POSITIVE),
    _col("batch", "int", True, _AT_LEAST_ONE),
    _col("tokens", "int", True, _AT_LEAST_ONE),
    _col("seconds_median", "float", True, _POSITIVE),
    _col("seconds_iqr", "float", False, _NON_NEGATIVE),
    _col("repeats", "int", False, _AT_LEAST_ONE),
    _col("calls", "int", False, _AT_LEAST_ONE),
    _col("cache_length", "int", False, _NON_NEGATIVE),
    _col("machine", "str", False),
    _col("kind", "str", False),
    _col("n_draft", "float", False, _POSITIVE),
    _col("gamma", "int", False, _AT_LEAST_ONE),
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
        return _select(self, mask)


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
        return _select(self, mask)


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
        of first appearance (:func:`sdsl_jax.bayes.model_effects_plane_model_for`)."""
        out = []
        for labels in (self.draft, self.target):
            order = {label: i for i, label in enumerate(dict.fromkeys(labels))}
            out += [np.array([order[label] for label in labels], np.int32), len(order)]
        return tuple(out)

    def has_repeated_models(self) -> bool:
        """Whether some draft or target model is in two or more pairs (per-model effects are identified)."""
        return len(set(self.draft)) < len(self.draft) or len(set(self.target)) < len(self.target)

    def model_effects_identified(self, *, min_groups: int = 5) -> tuple[bool, str]:
        """Whether the design identifies per-draft and per-target effects, and why (or why not).

        A model effect's scale is a variance over models: it needs several models of each kind that
        appear in two or more pairs. With fewer (say four targets), its posterior sits on its prior,
        the chains mix slowly, and the coefficients' bands widen for nothing; such data keep pairs
        independent by default.
        """
        counts = []
        for kind, labels in (("draft", self.draft), ("target", self.target)):
            repeated = sum(1 for label in set(labels) if labels.count(label) >= 2)
            counts.append(f"{repeated} {kind} models in two or more pairs")
            if repeated < min_groups:
                return False, (f"only {repeated} {kind} model(s) appear in two or more pairs (per-model effects "
                               f"need {min_groups} of each kind)")
        return True, " and ".join(counts)

    def select(self, mask: np.ndarray) -> "AcceptanceMeasurements":
        return _select(self, mask)


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
        return _select(self, mask)


def _select(table, mask):
    idx = np.arange(len(table))[np.asarray(mask)]
    fields = {}
    for f in dataclasses.fields(table):
        value = getattr(table, f.name)
        if isinstance(value, np.ndarray):
            fields[f.name] = value[idx]
        elif isinstance(value, tuple):
            fields[f.name] = tuple(value[i] for i in idx)
        else:
            fields[f.name] = value
    return type(table)(**fields)


def _parse(path: str, line: int, col: _Column, raw: str | None) -> Any:
    text = (raw or "").strip()
    if text == "":
        if col.required:
            raise DataError(path, line, col.name, "is empty (a value is required)")
        return None if col.kind == "str" else math.nan
    if col.kind == "str":
        return text
    try:
        if "_" in text:  # float() reads 1_000 as 1000; a CSV number never has an underscore
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise DataError(path, line, col.name, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(path, line, col.name, f"{text!r} is not a finite number")
    if col.kind == "int" and value != int(value):
        raise DataError(path, line, col.name, f"{text!r} is not an integer")
    if col.valid is not None and not col.valid(value):
        raise DataError(path, line, col.name, f"{text!r} {col.rule}")
    return value


def _load(path: str, schema: tuple[_Column, ...]) -> dict[str, list]:
    path = os.fspath(path)
    try:
        # Read once: a pipe or /dev/stdin cannot be read again, and the digest must be of these bytes.
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise DataError(path, None, None, f"cannot be read ({err.strerror})") from None
    try:
        # utf-8-sig: a byte-order mark (as spreadsheet programs write) is read as nothing.
        text = io.StringIO(raw.decode("utf-8-sig"), newline="")
        # strict: a quote that is never closed, or text after a closing quote, is an error.
        columns = _read_columns(path, csv.DictReader(text, strict=True), schema)
        columns["sha256"] = hashlib.sha256(raw).hexdigest()
        return columns
    except UnicodeDecodeError as err:
        raise DataError(path, None, None, f"is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                                          f"{err.start}): a CSV file is expected") from None
    except _CsvRowError as err:
        raise DataError(path, err.line, None, f"is not a readable CSV row ({err.reason}): look for an unbalanced "
                                              'double quote (") on or after this line') from None
    except csv.Error as err:  # in the header
        raise DataError(path, 1, None, f"is not a readable CSV header ({err})") from None


class _CsvRowError(Exception):
    def __init__(self, line: int, reason: str):
        self.line, self.reason = line, reason


def _read_columns(path: str, reader: csv.DictReader, schema: tuple[_Column, ...]) -> dict[str, list]:
    header = reader.fieldnames or []
    missing = [c.name for c in schema if c.required and c.name not in header]
    if missing:
        raise DataError(path, 1, missing[0], f"is missing from the header (found: {', '.join(header) or 'nothing'})")
    repeated = sorted({h for h in header if header.count(h) > 1 and h in {c.name for c in schema}})
    if repeated:
        raise DataError(path, 1, repeated[0], "appears more than once in the header: which one to use is ambiguous")
    columns: dict[str, list] = {c.name: [] for c in schema}
    while True:
        start = reader.line_num + 1  # the physical line this record starts on
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise _CsvRowError(start, str(err)) from None
        if reader.line_num != start:
            # A quoted field ran over a line end: a stray quote has swallowed the rows after it.
            raise DataError(path, start, None, f"a quoted field runs from line {start} to line {reader.line_num}: "
                                               'an unbalanced double quote (") joins rows together')
        if None in row:  # more fields than the header has
            raise DataError(path, reader.line_num, None, f"has {len(header) + len(row[None])} fields, the header {len(header)}")
        for col in schema:
            columns[col.name].append(_parse(path, reader.line_num, col, row.get(col.name)))
    if not columns[schema[0].name]:
        raise DataError(path, None, None, "has a header but no data rows")
    return columns


def _to_arrays(columns: dict[str, list], schema: tuple[_Column, ...]) -> dict[str, Any]:
    """The columns as arrays (strings as tuples), with ``sha256``: the digest of the bytes parsed."""
    return {c.name: tuple(columns[c.name]) if c.kind == "str" else np.asarray(columns[c.name], np.float64)
            for c in schema} | {"sha256": columns["sha256"]}


def load_pretraining(path: str | os.PathLike) -> PretrainingRuns:
    """Load and validate pre-training runs; raises :class:`DataError` naming file, line, column."""
    return PretrainingRuns(**_to_arrays(_load(path, PRETRAINING_SCHEMA), PRETRAINING_SCHEMA), path=os.fspath(path))


def load_acceptance(path: str | os.PathLike) -> AcceptanceMeasurements:
    """Load and validate acceptance measurements; raises :class:`DataError`.

    Rows without ``alpha`` get it from ``mean_acceptance_length`` and ``gamma``, or from
    ``accepted_per_position`` and ``n_iterations`` (see the schema).
    """
    path = os.fspath(path)
    columns = _to_arrays(_load(path, ACCEPTANCE_SCHEMA), ACCEPTANCE_SCHEMA)
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


def load_speculative(path: str | os.PathLike) -> SpeculativeRuns:
    """Load and validate speculative-decoding runs; raises :class:`DataError`.

    Per-prompt counts, where given, must be given together, one integer per prompt, and add up to
    the row's ``iterations`` and ``accepted``.
    """
    path = os.fspath(path)
    runs = SpeculativeRuns(**_to_arrays(_load(path, SPECULATIVE_SCHEMA), SPECULATIVE_SCHEMA), path=path)
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


def load_latency(path: str | os.PathLike) -> LatencyMeasurements:
    """Load and validate per-call latencies; raises :class:`DataError`."""
    path = os.fspath(path)
    columns = _to_arrays(_load(path, LATENCY_SCHEMA), LATENCY_SCHEMA)
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
    _save(measurements, LATENCY_SCHEMA, path)


def _format(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "str":
        return str(value)
    if not np.isfinite(value):
        return ""
    return str(int(value)) if kind == "int" else repr(float(value))


def _save(table, schema: tuple[_Column, ...], path: str | os.PathLike) -> None:
    from sdsl_jax.store import atomic_write

    def write(tmp):
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([c.name for c in schema])
            for i in range(len(table)):
                writer.writerow([_format(getattr(table, c.name)[i], c.kind) for c in schema])

    atomic_write(path, write)


def save_pretraining(runs: PretrainingRuns, path: str | os.PathLike) -> None:
    """Write runs as ``sdsl-pretraining v1`` CSV, atomically."""
    _save(runs, PRETRAINING_SCHEMA, path)


def save_acceptance(measurements: AcceptanceMeasurements, path: str | os.PathLike) -> None:
    """Write measurements as ``sdsl-acceptance v1`` CSV, atomically."""
    _save(measurements, ACCEPTANCE_SCHEMA, path)
