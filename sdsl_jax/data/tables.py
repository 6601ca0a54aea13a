"""Validated CSV tables: a schema of typed, checked columns; reading that names file, line and
column of every problem; atomic writing. The schemas themselves are in :mod:`sdsl_jax.data`."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import os
from typing import Any, Callable

import numpy as np

__all__ = [
    "DataError",
    "Column",
    "column",
    "POSITIVE",
    "PERPLEXITY",
    "PROBABILITY",
    "AT_LEAST_ONE",
    "AT_LEAST_ONE_FLOAT",
    "NON_NEGATIVE",
    "UNIT",
    "read_table",
    "to_arrays",
    "select_rows",
    "write_table",
]


class DataError(ValueError):
    """A dataset that does not follow its schema; the message names file, line and column."""

    def __init__(self, path: str, line: int | None, column: str | None, problem: str):
        self.path, self.line, self.column, self.problem = path, line, column, problem
        where = f"{path}" + (f":{line}" if line is not None else "")
        what = f" column '{column}':" if column else ""
        super().__init__(f"{where}:{what} {problem}")


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "float", "int" or "str"
    required: bool
    valid: Callable[[float], bool] | None = None
    rule: str = ""


POSITIVE = (lambda v: v > 0, "must be > 0")
PERPLEXITY = (lambda v: v >= 1, "must be >= 1 (a perplexity)")
PROBABILITY = (lambda v: 0 < v < 1, "must be in the open interval (0, 1)")
AT_LEAST_ONE = (lambda v: v >= 1, "must be an integer >= 1")
NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
UNIT = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
AT_LEAST_ONE_FLOAT = (lambda v: v >= 1, "must be >= 1")


def column(name: str, kind: str, required: bool, check: tuple = (None, "")) -> Column:
    """A column of a schema: its name, kind ("float", "int" or "str"), whether required, and a check
    ``(predicate, rule)`` whose rule completes the error message."""
    return Column(name, kind, required, check[0], check[1])


def select_rows(table, mask):
    """The rows of a table dataclass where ``mask`` holds (arrays indexed, tuples filtered, scalars kept)."""
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


def parse_value(path: str, line: int, col: Column, raw: str | None) -> Any:
    """One cell parsed and checked against its column (NaN or None where an optional cell is blank)."""
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


def read_table(path: str, schema: tuple[Column, ...]) -> dict[str, list]:
    """The schema's columns of a CSV file as lists, each cell checked, with ``sha256`` of the bytes read."""
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
        columns = read_columns(path, csv.DictReader(text, strict=True), schema)
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


def read_columns(path: str, reader: csv.DictReader, schema: tuple[Column, ...]) -> dict[str, list]:
    """The header checked against the schema, then every row parsed, each error naming its line."""
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
            columns[col.name].append(parse_value(path, reader.line_num, col, row.get(col.name)))
    if not columns[schema[0].name]:
        raise DataError(path, None, None, "has a header but no data rows")
    return columns


def to_arrays(columns: dict[str, list], schema: tuple[Column, ...]) -> dict[str, Any]:
    """The columns as arrays (strings as tuples), with ``sha256``: the digest of the bytes parsed."""
    return {c.name: tuple(columns[c.name]) if c.kind == "str" else np.asarray(columns[c.name], np.float64)
            for c in schema} | {"sha256": columns["sha256"]}



def format_value(value: Any, kind: str) -> str:
    """A cell as written: blank for None or NaN, integers without a decimal point, floats exactly."""
    if value is None:
        return ""
    if kind == "str":
        return str(value)
    if not np.isfinite(value):
        return ""
    return str(int(value)) if kind == "int" else repr(float(value))


def write_table(table, schema: tuple[Column, ...], path: str | os.PathLike) -> None:
    """A table dataclass written as CSV with the schema's columns, atomically."""
    from sdsl_jax.store import atomic_write

    def write(tmp):
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([c.name for c in schema])
            for i in range(len(table)):
                writer.writerow([format_value(getattr(table, c.name)[i], c.kind) for c in schema])

    atomic_write(path, write)
