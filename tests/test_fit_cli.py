"""`python -m experiments.fit`: outputs, the summary schema, clean errors for bad CSVs, --strict."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import fit as fit_cli
from sdsl_jax import SDSL2026

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def synthetic_acceptance(path, rng):
    """Acceptance CSV in the sdsl-acceptance v1 schema, alpha from a known plane plus noise."""
    rows = ["draft,target,n_draft,n_target,d_draft,d_target,ppl_draft,ppl_target,alpha,gamma,n_iterations"]
    for i in range(30):
        x, y = rng.uniform(8, 40), rng.uniform(4, 12)
        alpha = SDSL2026.A * x + SDSL2026.B * y + SDSL2026.C + rng.normal(0, 0.02)
        rows.append(f"d{i},t{i},{1e7 * (1 + i)},{1e9 * (1 + i)},2e11,2e12,{x},{y},{alpha},5,{rng.integers(100, 1000)}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_point_fit_on_shipped_data_writes_summary_and_figures(tmp_path):
    out = tmp_path / "out"
    code = fit_cli.main(["--starts", "10", "--num-targets", "6", "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {"command", "seed", "versions", "loss_law", "linear_law", "targets"} <= summary.keys()
    assert set(summary["loss_law"]) >= {"E", "A", "B", "alpha", "beta"}
    assert set(summary["linear_law"]) == {"mu", "m0"}
    assert [t["m_target"] for t in summary["targets"]] == [13e9, 30e9, 70e9, 110e9]
    assert all({"m_target", "n_star", "gamma_star"} <= t.keys() for t in summary["targets"])
    assert summary["versions"]["jax"] and summary["command"].startswith("python -m experiments.fit")
    assert summary["plane_sensitivity"]["A"]  # plane fixed: its influence is reported instead
    for name in ("loss_law_fit.png", "n_star_bands.png", "throughput_curves.png"):
        assert (out / name).stat().st_size > 10_000


SHORT_NUTS = ["--posterior", "--chains", "2", "--warmup", "30", "--draws", "20", "--reruns", "0"]


def test_posterior_with_acceptance_data(tmp_path, capsys):
    acc = synthetic_acceptance(tmp_path / "acc.csv", np.random.default_rng(0))
    out = tmp_path / "out"
    # Two named targets: by default a run on user pairs predicts for every measured target (30 here).
    # The NUTS settings of the tests below on the same pre-training rows: one compiled loss-law sampler for all three.
    code = fit_cli.main(["--acceptance", acc, *SHORT_NUTS, "--starts", "10", "--num-targets", "5", "--out", str(out),
                         "--seed", "3", "--targets", "13e9", "7e10"])
    assert code == 0  # diagnostics fail at this size: without --strict that is a warning
    # A run this short (50 iterations per chain) finishes in seconds: NUTS runs in one piece, silently.
    assert "NUTS draws" not in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["plane"]["source"].startswith("fitted")
    for t in summary["targets"]:
        assert t["n_star_lo90"] <= t["n_star_median"] <= t["n_star_hi90"]
    assert {"loss_law", "plane"} <= summary["posterior"]["diagnostics"].keys()
    assert (out / "loss_law_posterior.nc").exists() and (out / "plane_posterior.nc").exists()
    assert (out / "acceptance_plane.png").exists()


def test_strict_fails_loudly_when_diagnostics_fail(tmp_path, capsys):
    # 2 x 20 draws cannot reach the bulk ESS of 200 that two chains need.
    code = fit_cli.main([*SHORT_NUTS, "--starts", "45",
                         "--num-targets", "3", "--out", str(tmp_path), "--strict", "--no-figures"])
    out = capsys.readouterr().out
    assert code == 3 and "WARNING" in out and "failed its diagnostics" in out


@pytest.mark.parametrize(
    "text, fragment, own_process",
    [
        # One case as a user meets it (the process's exit status and stderr); the others in this
        # process, where the command returns the status it would exit with.
        ("n_params,n_tokens,loss\n1e6,2e7,3.0\n1e6,abc,3.0\n", ":3: column 'n_tokens': 'abc' is not a number", True),
        ("n_params,loss\n1e6,3.0\n", ":1: column 'n_tokens': is missing from the header", False),
        ("n_params,n_tokens,loss\n1e6,2e7,-3.0\n", ":2: column 'loss': '-3.0' must be > 0", False),
    ],
)
def test_bad_csv_exits_2_with_a_message_and_no_traceback(tmp_path, capsys, text, fragment, own_process):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    args = ["--pretraining", str(bad), "--out", str(tmp_path)]
    if own_process:
        proc = subprocess.run([sys.executable, "-m", "experiments.fit", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        code, stderr = proc.returncode, proc.stderr
    else:
        code, stderr = fit_cli.main(args), capsys.readouterr().err
    assert code == 2
    assert fragment in stderr and str(bad) in stderr
    assert "Traceback" not in stderr


def test_help_explains_the_options():
    proc = subprocess.run([sys.executable, "-m", "experiments.fit", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    for option in ("--posterior", "--pretraining", "--acceptance", "--chains", "--draws", "--seed", "--out",
                   "--strict", "--d-draft", "--d-target", "--targets"):
        assert option in proc.stdout


def test_resume_reuses_finished_stages_only_when_inputs_match(tmp_path, capsys):
    base = [*SHORT_NUTS, "--starts", "45", "--num-targets", "3",
            "--out", str(tmp_path), "--no-figures"]
    assert fit_cli.main(base) == 0
    first = json.loads((tmp_path / "summary.json").read_text())
    capsys.readouterr()
    assert fit_cli.main(base + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "point fit reused" in out and "loss-law draws reused" in out
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["posterior"]["loss_law"] == first["posterior"]["loss_law"]
    assert fit_cli.main(base + ["--resume", "--seed", "1"]) == 0  # another seed: the posterior is redone
    assert "loss-law draws reused" not in capsys.readouterr().out


def test_ladder_dataset_fits_the_committed_ladder(tmp_path):
    """`--dataset ladder` reads fits/ladder/ (our trained models) and uses the ladder's scale."""
    out = tmp_path / "out"
    code = fit_cli.main(["--dataset", "ladder", "--starts", "20", "--num-targets", "5", "--out", str(out),
                         "--quiet", "--no-figures"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plane"]["source"].startswith("fitted")
    assert [t["m_target"] for t in summary["targets"]] == list(fit_cli.DATASETS["ladder"].targets)
    assert summary["data"]["pretraining"]["path"].endswith(os.path.join("fits", "ladder", "pretraining.csv"))
    assert summary["data"]["acceptance"]["pairs"] > 20


def test_stacked_forms_on_the_ladder_with_run_effects(tmp_path, monkeypatch):
    """`--stack FORMS`: the forms fitted, weighted by stacking, the bands of the mixture;
    the ladder's sizes are runs with four budgets each, so the posterior has per-run effects.
    The weights come from the size folds (`--stack-by sizes`, the default): here a stand-in for
    `compare.size_fold_weights` (its folds are tested in test_compare.py) that records its call."""
    from sdsl_jax import compare

    calls = []

    def folds(runs, families, **kw):
        calls.append(([f.name for f in families], kw))
        density = {"chinchilla": np.zeros(len(runs)), "kaplan": np.full(len(runs), -1.0)}
        return compare.SizeFolds(compare.grouped_stacking_weights(density, groups="model sizes"), density,
                                 {"chinchilla": {}, "kaplan": {}})

    monkeypatch.setattr(compare, "size_fold_weights", folds)
    out = tmp_path / "out"
    code = fit_cli.main(["--dataset", "ladder-v1", "--posterior", "--stack", "chinchilla,kaplan", "--chains", "1", "--reruns", "0", "--warmup", "60",
                         "--draws", "60", "--starts", "20", "--num-targets", "3", "--out", str(out), "--quiet",
                         "--no-figures"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    stacking = summary["stacking"]
    assert stacking["forms"] == ["chinchilla", "kaplan"] and abs(sum(stacking["weights"]) - 1) < 1e-6
    # Weighted by how each form predicts a size it has not seen (--stack-by sizes, the default), with
    # row-wise PSIS-LOO beside it; the folds sampled as the forms were, with the runs' effects.
    [(names, kw)] = calls
    assert names == ["chinchilla", "kaplan"] and kw["run_effects"] is True and kw["num_warmup"] == 60
    assert kw["stages_for"]("kaplan").folder.endswith(os.path.join("forms", "kaplan"))
    assert "model sizes left out one at a time" in stacking["method"]
    assert np.allclose(stacking["weights"], [1.0, 0.0]) and stacking["held_out_log_density"] == [0.0, -28.0]
    assert len(stacking["weights_psis_loo_rows"]) == 2
    # Each form says how far its posterior moved from its prior, parameter by parameter (the N exponent too).
    assert set(stacking["identification"]["kaplan"]) == {"alpha_N", "alpha_D", "l_N", "l_D"}
    assert "alpha" in stacking["identification"]["chinchilla"]
    # ... and how its own posterior sampled: the checks and the geometry, one record per form.
    for name in ("chinchilla", "kaplan"):
        d = stacking["diagnostics"][name]
        assert d["median_steps"] >= 1 and 0.0 <= d["max_tree_depth_share"] <= 1.0 and d["attempts"] == 1
    assert all(c <= 1 for form in stacking["identification"].values() for c in form.values())
    assert summary["settings"]["run_effects"] is True and summary["settings"]["bands"] == "posterior-predictive"
    # The ladder's pairs share draft and target models: the acceptance posterior has the drafts'
    # effects; its six targets are too few to estimate a scale beyond the intercept and slope.
    assert summary["settings"]["model_effects"] == ["draft"]
    residuals = summary["posterior"]["residuals"].keys()
    assert {"sigma", "run_sd", "run_slope_sd", "alpha_sigma", "alpha_draft_sd"} <= residuals
    assert "alpha_target_sd" not in residuals
    for t in summary["targets"]:
        assert t["n_star_lo90"] <= t["n_star_median"] <= t["n_star_hi90"]
    others = [f for f in stacking["forms"] if f != "chinchilla"]
    assert all((out / "forms" / f / "stages").is_dir() for f in others)
    # One acceptance posterior for every form (it does not depend on the loss law): sampled once.
    assert (out / "plane_posterior.nc").exists()
    assert not any((out / "forms" / f / "plane_posterior.nc").exists() for f in others)


SHIPPED = os.path.join(REPO, "fits", "data", "chinchilla_fig4.csv")


@pytest.mark.parametrize("args, fragment", [
    (["--num-targets", "1"], "--num-targets must be at least 2"),
    (["--m-min", "0"], "--m-min must be a positive finite number"),
    (["--m-min", "2e11"], "must be below --m-max"),
    (["--m-max", "inf"], "--m-max must be a positive finite number, got inf"),
    (["--d-draft", "0"], "--d-draft must be a positive finite number"),
    (["--d-target", "nan"], "--d-target must be a positive finite number, got nan"),
    (["--targets", "-5"], "--targets must be a positive finite number, got -5.0"),
    (["--starts", "0"], "--starts K uses every K-th start: K must be at least 1"),
    (["--drop-highest-loss", "-3"], "--drop-highest-loss must be >= 0"),
    (["--drop-highest-loss", "240"], "leaves fewer than 6 of the 245 runs"),
    (["--recipe", "tokens-per-param=-2"], "the value must be a positive finite number"),
    (["--chains", "0"], "--chains must be at least 1"),
    (["--stack"], "--stack weights the forms' posteriors: add --posterior"),
    (["--posterior", "--stack", "chinchilla,cubic"], "unknown form(s) cubic"),
])
def test_bad_arguments_exit_2_before_anything_is_created(tmp_path, capsys, args, fragment):
    out = tmp_path / "out"
    assert fit_cli.main(args + ["--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.startswith("error: ") and "Traceback" not in err
    assert not out.exists()


def test_out_that_is_a_file_or_under_a_file_exits_2(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        assert fit_cli.main(["--out", str(out), "--quiet"]) == 2
        assert "error: --out" in capsys.readouterr().err
    assert afile.read_text() == "x"


def test_bad_csv_creates_nothing_in_out(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"n_params,n_tokens,loss\n1e6,2e7,\xe9\n")  # Latin-1, not UTF-8
    out = tmp_path / "out"
    assert fit_cli.main(["--pretraining", str(bad), "--out", str(out), "--quiet"]) == 2
    assert not out.exists()


def test_interrupt_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    from sdsl_jax import pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "run", interrupted)
    assert fit_cli.main(["--out", str(tmp_path / "out"), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "--resume" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_summary_is_strict_json_and_the_folder_holds_one_run(tmp_path):
    out = tmp_path / "out"
    (out).mkdir()
    (out / "loss_law_posterior.nc").write_text("left by an earlier --posterior run")
    # A target far below the data's range: no admissible draft, a NaN N*, written as null.
    assert fit_cli.main(["--starts", "45", "--num-targets", "3", "--targets", "13e9", "2", "--out", str(out),
                         "--quiet", "--no-figures"]) == 0

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=reject)
    assert summary["targets"][1]["n_star"] is None and summary["targets"][1]["status"] != 0
    assert not (out / "loss_law_posterior.nc").exists()


def _shipped_rows():
    lines = open(SHIPPED).read().splitlines()
    return lines[0], lines[1:]


def _acceptance_rows(tmp_path):
    path = synthetic_acceptance(tmp_path / "good_acceptance.csv", np.random.default_rng(0))
    lines = open(path).read().splitlines()
    return lines[0], lines[1:]


@pytest.mark.parametrize("case, fragment", [
    ("pretraining_1_row", "1 run(s) cannot identify the chinchilla law's 5 coefficients"),
    ("pretraining_2_rows", "2 run(s) cannot identify"),
    ("pretraining_5_rows", "5 run(s) cannot identify"),
    ("pretraining_240_identical", "column 'n_params': has 1 distinct value(s) in 240 rows"),
    ("pretraining_one_budget", "column 'n_tokens': has 1 distinct value(s)"),
    ("acceptance_2_rows", "2 acceptance row(s) cannot identify"),
    ("acceptance_84_identical", "column 'ppl_draft': takes one value"),
    ("acceptance_constant_target", "column 'ppl_target': takes one value"),
    ("acceptance_collinear", "column 'ppl_target': is collinear with ppl_draft"),
])
def test_data_that_cannot_identify_the_model_exit_2_naming_the_file(tmp_path, capsys, case, fragment):
    # Before: these "converged" with status SUCCESS (N* = 1.8 parameters for 13B from 240 identical runs).
    header, rows = _shipped_rows()
    a_header, a_rows = _acceptance_rows(tmp_path)
    pre, acc = tmp_path / "pre.csv", None
    kind, _, what = case.partition("_")
    if kind == "pretraining":
        chosen = {"1_row": rows[:1], "2_rows": rows[:2], "5_rows": rows[:5], "240_identical": [rows[0]] * 240,
                  "one_budget": [f"{1e8 * (i + 1)},1e10,{3 - 0.01 * i}" for i in range(20)]}[what]
        if what == "one_budget":
            header = "n_params,n_tokens,loss"
        pre.write_text("\n".join([header] + chosen) + "\n")
    else:
        pre.write_text("\n".join([header] + rows) + "\n")
        acc = tmp_path / "acc.csv"
        cells = [r.split(",") for r in a_rows]
        if what == "2_rows":
            cells = cells[:2]
        elif what == "84_identical":
            cells = [cells[0]] * 84
        elif what == "constant_target":
            for c in cells:
                c[7] = "9.5"
        elif what == "collinear":
            for c in cells:
                c[7] = repr(2.0 * float(c[6]) + 1.0)
        acc.write_text("\n".join([a_header] + [",".join(c) for c in cells]) + "\n")
    out = tmp_path / "out"
    args = ["--pretraining", str(pre), "--out", str(out), "--quiet", "--no-figures"]
    args += ["--acceptance", str(acc)] if acc else []
    assert fit_cli.main(args) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert str(acc if acc else pre) in err and "Traceback" not in err
    assert not out.exists()
