"""Dataset schemas: round trips, the shipped Chinchilla data, and an error for every kind of bad row."""

import pathlib
import re

import numpy as np
import pytest

from experiments.convert_chinchilla import convert
from sdsl_jax.data import (
    AcceptanceMeasurements,
    DataError,
    load_acceptance,
    load_pretraining,
    save_acceptance,
    save_pretraining,
)

SHARED_CHINCHILLA = pathlib.Path(__file__).parents[2] / "shared" / "data" / "chinchilla_fig4_epoch.csv"
PRETRAINING_HEADER = "n_params,n_tokens,loss,name\n"
ACCEPTANCE_HEADER = "draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha,gamma,n_iterations\n"
GOOD_ACCEPTANCE_ROW = "d1,t1,1e4,1e6,2e5,2e7,30.5,12.0,0.55,4,200\n"


def write(tmp_path, text, name="data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_chinchilla_matches_its_source():
    runs = load_pretraining("fits/data/chinchilla_fig4.csv")
    assert len(runs) == 245
    np.testing.assert_allclose(runs.n_tokens, runs.flops / (6 * runs.n_params), rtol=1e-15)
    if not SHARED_CHINCHILLA.exists():
        pytest.skip("shared/ is not beside this checkout")
    source = convert(str(SHARED_CHINCHILLA))
    np.testing.assert_array_equal(runs.loss, source.loss)
    np.testing.assert_array_equal(runs.n_params, source.n_params)
    np.testing.assert_array_equal(runs.n_tokens, source.n_tokens)


def test_round_trip(tmp_path):
    runs = load_pretraining("fits/data/chinchilla_fig4.csv")
    out = tmp_path / "sub" / "copy.csv"
    save_pretraining(runs.select(np.arange(10)), out)
    again = load_pretraining(out)
    np.testing.assert_array_equal(again.loss, runs.loss[:10])
    assert again.name == runs.name[:10]

    path = write(tmp_path, ACCEPTANCE_HEADER + GOOD_ACCEPTANCE_ROW * 3)
    acc = load_acceptance(path)
    assert isinstance(acc, AcceptanceMeasurements) and len(acc) == 3
    assert np.all(np.isnan(acc.weight)) and acc.source == (None, None, None)
    np.testing.assert_array_equal(acc.regression_weights(), [200, 200, 200])
    save_acceptance(acc, tmp_path / "acc.csv")
    np.testing.assert_array_equal(load_acceptance(tmp_path / "acc.csv").alpha, acc.alpha)


@pytest.mark.parametrize(
    "text, line, column, fragment",
    [
        ("n_params,loss\n1e6,3.0\n", 1, "n_tokens", "missing from the header"),
        (PRETRAINING_HEADER + "1e6,2e7,3.0,a\n1e6,abc,3.0,b\n", 3, "n_tokens", "'abc' is not a number"),
        (PRETRAINING_HEADER + "1e6,2e7,nan,a\n", 2, "loss", "not a finite number"),
        (PRETRAINING_HEADER + "-5,2e7,3.0,a\n", 2, "n_params", "must be > 0"),
        (PRETRAINING_HEADER + "0,2e7,3.0,a\n", 2, "n_params", "must be > 0"),
        (PRETRAINING_HEADER + "1e6,,3.0,a\n", 2, "n_tokens", "is empty"),
    ],
)
def test_bad_pretraining_rows_name_file_line_column(tmp_path, text, line, column, fragment):
    path = write(tmp_path, text)
    with pytest.raises(DataError) as info:
        load_pretraining(path)
    err = info.value
    assert (err.path, err.line, err.column) == (path, line, column)
    assert fragment in str(err) and f"{path}:{line}:" in str(err) and f"'{column}'" in str(err)


@pytest.mark.parametrize(
    "row, column, fragment",
    [
        ("d1,t1,1e4,1e6,2e5,2e7,0.5,12.0,0.55,4,200\n", "ppl_draft", "must be >= 1"),
        ("d1,t1,1e4,1e6,2e5,2e7,30.5,12.0,1.2,4,200\n", "alpha", "open interval (0, 1)"),
        ("d1,t1,1e4,1e6,2e5,2e7,30.5,12.0,0,4,200\n", "alpha", "open interval (0, 1)"),
        ("d1,t1,1e4,1e6,2e5,2e7,30.5,12.0,0.55,2.5,200\n", "gamma", "not an integer"),
        ("d1,t1,1e4,-1e6,2e5,2e7,30.5,12.0,0.55,4,200\n", "n_target", "must be > 0"),
        (",t1,1e4,1e6,2e5,2e7,30.5,12.0,0.55,4,200\n", "draft", "is empty"),
        ("d1,t1,1e4,1e6,2e5,2e7,30.5,inf,0.55,4,200\n", "ppl_target", "not a finite number"),
    ],
)
def test_bad_acceptance_rows_name_file_line_column(tmp_path, row, column, fragment):
    path = write(tmp_path, ACCEPTANCE_HEADER + GOOD_ACCEPTANCE_ROW + row)
    with pytest.raises(DataError) as info:
        load_acceptance(path)
    assert (info.value.line, info.value.column) == (3, column)
    assert fragment in str(info.value)


def test_structural_problems(tmp_path):
    with pytest.raises(DataError, match="no data rows"):
        load_pretraining(write(tmp_path, PRETRAINING_HEADER))
    with pytest.raises(DataError, match="cannot be read"):
        load_pretraining(str(tmp_path / "absent.csv"))
    with pytest.raises(DataError, match=r":2: has 5 fields, the header 4"):
        load_pretraining(write(tmp_path, PRETRAINING_HEADER + "1e6,2e7,3.0,a,extra\n"))


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfn_params,n_tokens,loss\n1e6,2e7,3.0\n")
    runs = load_pretraining(path)
    assert runs.n_params.tolist() == [1e6]


@pytest.mark.parametrize("content, fragment", [
    (b"n_params,n_tokens,loss\n1e6,2e7,\xe9\n", "is not UTF-8 text"),
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", "is not UTF-8 text"),  # gzip
    (b"n_params,n_tokens,loss,loss\n1e6,2e7,3.0,4.0\n", "column 'loss': appears more than once"),
    (b"n_params,n_tokens,loss\n1_000_000,2e7,3.0\n", "'1_000_000' is not a number"),
    (b"n_params,n_tokens,loss\n1e6,2e7," + b"1" * 140_000 + b"\n", ":2: is not a readable CSV row"),
    (b"n_params,n_tokens,loss," + b"x" * 140_000 + b"\n1e6,2e7,3.0,a\n", ":1: is not a readable CSV header"),
])
def test_unreadable_files_are_data_errors(tmp_path, content, fragment):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=fragment) as info:
        load_pretraining(path)
    assert str(path) in str(info.value)


def _rows(count):
    return "".join(f"{1e6 * (i + 1)},{2e7 * (i + 1)},{3.0 - 0.01 * i},run{i}\n" for i in range(count))


@pytest.mark.parametrize("text, line, fragment", [
    # A stray quote opening a name swallows the following rows into one field (before: 40 of 50
    # rows vanished into it and the other 10 were fitted).
    (PRETRAINING_HEADER + _rows(3) + '1e9,2e10,2.5,"stray\n' + _rows(40) + 'x",\n' + _rows(6), 5,
     "quoted field runs from line 5 to line 46"),
    (PRETRAINING_HEADER + _rows(3) + '1e9,2e10,2.5,"unterminated\n', 5, "unexpected end of data"),
    (PRETRAINING_HEADER + _rows(3) + '1e9,2e10,2.5,"closed"then text\n', 5, "expected after"),
])
def test_unbalanced_quotes_are_refused_with_the_line(tmp_path, text, line, fragment):
    with pytest.raises(DataError, match=fragment) as info:
        load_pretraining(write(tmp_path, text))
    assert info.value.line == line


def test_a_quoted_comma_in_a_name_is_still_fine(tmp_path):
    runs = load_pretraining(write(tmp_path, PRETRAINING_HEADER + '1e6,2e7,3.0,"run, with comma"\n'))
    assert runs.name == ("run, with comma",)


ENGINE_HEADER = ("draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha,gamma,n_iterations,"
                 "mean_acceptance_length,accepted_per_position\n")


def _engine_row(alpha="", gamma="", steps="", tau="", counts=""):
    return f"d,t,1e6,1e8,2e10,2e11,20,8,{alpha},{gamma},{steps},{tau},{counts}\n"


def test_alpha_from_a_serving_engines_mean_acceptance_length_and_position_counts(tmp_path):
    from sdsl_jax import expected_tokens

    tau = float(expected_tokens(0.7, 4.0))
    text = ENGINE_HEADER + _engine_row(gamma="4", tau=repr(tau)) + _engine_row(
        gamma="3", steps="1000", counts="700;490;343") + _engine_row(alpha="0.7", gamma="4", tau=repr(tau))
    acc = load_acceptance(write(tmp_path, text))
    np.testing.assert_allclose(acc.alpha, [0.7, (700 + 490 + 343) / (1000 + 700 + 490), 0.7], rtol=1e-12)
    # The old schema (no engine columns) still loads, and a save/load round trip keeps the columns.
    save_acceptance(acc, tmp_path / "again.csv")
    np.testing.assert_allclose(load_acceptance(tmp_path / "again.csv").mean_acceptance_length[0], tau)


@pytest.mark.parametrize("row, column, fragment", [
    (_engine_row(), "alpha", "give alpha, or mean_acceptance_length with gamma"),
    (_engine_row(tau="2.5"), "gamma", "is needed with mean_acceptance_length"),
    (_engine_row(gamma="3", tau="4.5"), "mean_acceptance_length", "exceeds gamma + 1 = 4"),
    (_engine_row(gamma="3", tau="0.5"), "mean_acceptance_length", "must be >= 1"),
    (_engine_row(gamma="3", tau="1"), "mean_acceptance_length", "outside the open interval"),
    (_engine_row(gamma="2", counts="5;9", steps="10"), "accepted_per_position", "never rising"),
    (_engine_row(gamma="2", counts="5;x", steps="10"), "accepted_per_position", "';'-separated counts"),
    (_engine_row(gamma="3", counts="5;4", steps="10"), "accepted_per_position", "has 2 counts, gamma is 3"),
    (_engine_row(gamma="2", counts="5;4"), "n_iterations", "needed with accepted_per_position"),
    (_engine_row(alpha="0.5", gamma="4", tau="3.0"), None, "alpha sources disagree"),
])
def test_engine_columns_are_validated_per_row(tmp_path, row, column, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)) as info:
        load_acceptance(write(tmp_path, ENGINE_HEADER + row))
    assert (info.value.line, info.value.column) == (2, column)
