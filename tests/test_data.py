"""Dataset schemas: round trips, the shipped Chinchilla data, and an error for every kind of bad row."""

import pathlib

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
    (b"n_params,n_tokens,loss\n1e6,2e7," + b"1" * 140_000 + b"\n", "is not a readable CSV file"),
])
def test_unreadable_files_are_data_errors(tmp_path, content, fragment):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=fragment) as info:
        load_pretraining(path)
    assert str(path) in str(info.value)
