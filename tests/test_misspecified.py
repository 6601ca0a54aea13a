"""Calibration under misspecification: the synthetic ladders' truth, the reliability score, the study's command."""

import json
import re

import numpy as np
import pytest

from sdsl_jax import SDSL2026, LossLaw, solve_draft_size
from sdsl_jax.costs import SDSL_FLOPS, throughput_under
from sdsl_jax.data import load_acceptance, load_pretraining, load_speculative
from sdsl_jax.forecast import reliability
from sdsl_jax.validation.misspecified import TrueProcess, summarize_closures, synthetic_closure_data

LADDER = "fits/ladder-v1/"


def design():
    return (load_pretraining(LADDER + "pretraining.csv"), load_acceptance(LADDER + "acceptance.csv"),
            load_speculative(LADDER + "speculative.csv"))


# The committed chinchilla closure's law (its posterior median) and the real ladder's plane.
LAW = LossLaw(E=0.4735, A=2.2424, B=47.94, alpha=0.32, beta=0.2464)
PLANE = SDSL2026._replace(A=-0.039, B=0.0623, C=0.685)


def process(scale: float) -> TrueProcess:
    return TrueProcess("chinchilla + plane", "chinchilla", LAW, "plane", PLANE, loss_sigma=0.05 * scale, loss_nu=20.0,
                       run_sd=0.017 * scale, run_slope_sd=0.047 * scale, draft_sd=0.033 * scale,
                       target_sd=0.005 * scale, pair_sigma=0.008 * scale)


def test_without_noise_the_synthetic_ladder_is_the_process_itself():
    runs, pairs, spec = design()
    data = synthetic_closure_data(process(0.0), runs, pairs, spec, seed=0)
    np.testing.assert_allclose(data.runs.loss, np.asarray(LAW.loss(runs.n_params, runs.n_tokens)), rtol=1e-12)
    ppl = dict(zip(runs.name, np.exp(data.runs.loss)))
    want_alpha = [PLANE.rate(ppl[a], ppl[b]) for a, b in zip(pairs.draft, pairs.target)]
    np.testing.assert_allclose(data.pairs.alpha, want_alpha, rtol=1e-12)
    want_t = throughput_under(SDSL_FLOPS, data.speculative.alpha_mle, spec.gamma.astype(float),
                              spec.n_draft.astype(float), spec.n_target.astype(float))
    np.testing.assert_allclose(data.speculative.tokens_per_flop_sdsl, want_t, rtol=1e-12)
    assert not any(data.speculative.iterations_per_prompt)  # no prompts to resample
    assert set(data.truth) == set(spec.target)
    for target, truth in data.truth.items():
        rows = [i for i, t in enumerate(spec.target) if t == target]
        assert truth["drafts"] == sorted({spec.draft[i] for i in rows}, key=lambda d: runs.n_params[runs.name.index(d)])
        assert truth["best"] == int(np.argmax(truth["tokens_per_flop"]))
        # No effects: a new draft series and target are the process's mean curve.
        want = float(solve_draft_size(truth["m_target"], d_draft=truth["d_reference"], d_target=truth["d_target"],
                                      loss=LAW, plane=PLANE).n_star)
        assert truth["d_target"] == spec.d_target[rows[0]]
        assert truth["n_star_mean"] == pytest.approx(want, rel=1e-12)
        assert truth["n_star_new"] == pytest.approx(want, rel=1e-9)


def test_a_process_is_recorded_and_a_closure_is_matched_to_the_process_it_was_drawn_from():
    from sdsl_jax.validation.misspecified import drawn_from, mean_curve_truth, process_from_record, process_record

    runs, pairs, spec = design()
    record = json.loads(json.dumps(process_record(process(1.0))))  # through JSON, as a study stores it
    assert process_from_record(record) == process(1.0)
    truth = mean_curve_truth(process(1.0), runs, pairs, spec)
    # The fingerprint is the mean curve's N*: no noise scale or seed enters it.
    assert truth == mean_curve_truth(process(2.0), runs, pairs, spec)
    closure = dict(targets=[dict(target=t, n_star_mean=v) for t, v in
                            synthetic_closure_data(process(1.0), runs, pairs, spec, seed=7).truth.items()
                            for v in [v["n_star_mean"]]])
    assert drawn_from(closure, truth)
    # A refit of the process (here alpha 1% higher) draws closures from another truth.
    other = process(1.0)._replace(law=LAW._replace(alpha=LAW.alpha * 1.01))
    assert not drawn_from(closure, mean_curve_truth(other, runs, pairs, spec))
    assert not drawn_from(dict(targets=closure["targets"][1:]), truth)  # a target missing
    with pytest.raises(ValueError, match="unknown family"):
        process_from_record(dict(record, family="chinchila"))
    with pytest.raises(ValueError, match="lacks or adds a field"):
        process_from_record(dict(record, law=dict(record["law"], gamma=1.0)))


def test_a_study_fits_its_processes_once_and_reads_them_back(tmp_path, monkeypatch):
    """Every run and shard of a study draws from the processes its first run fitted and wrote, not
    from a refit (the one-break law's posterior median differs between machines)."""
    import argparse

    from experiments import calibration
    from experiments.runlog import UsageError
    from sdsl_jax.validation import misspecified

    fits = []
    monkeypatch.setattr(misspecified, "ladder_processes", lambda *a, **k: fits.append(1) or [process(1.0)])
    args = argparse.Namespace(out=str(tmp_path), design="d.csv", acceptance_design="a.csv", processes="chinchilla:plane",
                              seed=0)
    first = calibration._true_processes(args, None, None, [("chinchilla", "plane")], "the command")
    stored = json.loads((tmp_path / "processes.json").read_text())
    assert stored["command"] == "the command" and stored["fitted_for"]["processes"] == "chinchilla:plane"
    assert calibration._true_processes(args, None, None, [("chinchilla", "plane")], "again") == first == [process(1.0)]
    assert len(fits) == 1  # read back, not fitted again
    with pytest.raises(UsageError, match="fitted for .* use another --out"):
        calibration._true_processes(argparse.Namespace(**dict(vars(args), seed=1)), None, None, [], "")
    (tmp_path / "processes.json").write_text("{")
    with pytest.raises(UsageError, match="is not a record of true processes"):
        calibration._true_processes(args, None, None, [], "")


def test_a_design_without_speculative_runs_is_scored_on_its_own_pairs_at_their_best_lookahead():
    """The factorial ladder has no speculative runs: each target's candidates are its top-budget
    drafts, their truth the tokens per FLOP of the synthetic pair's alpha at its best integer gamma."""
    from sdsl_jax.speculative import throughput

    factorial = "fits/ladder/"
    runs, pairs = load_pretraining(factorial + "pretraining.csv"), load_acceptance(factorial + "acceptance.csv")
    data = synthetic_closure_data(process(0.0), runs, pairs, None, seed=0)
    spec = data.speculative
    top = {n: pairs.d_draft[pairs.n_draft == n].max() for n in np.unique(pairs.n_draft)}
    assert len(spec.target) == sum(d == top[n] for n, d in zip(pairs.n_draft, pairs.d_draft))
    alpha = dict(zip(zip(data.pairs.draft, data.pairs.target), data.pairs.alpha))
    np.testing.assert_array_equal(spec.alpha_mle, [alpha[k] for k in zip(spec.draft, spec.target)])
    gammas = np.arange(0.0, 80.0)  # brute force over integer lookaheads, every pair in one call
    t = np.asarray(throughput(spec.alpha_mle[:, None], gammas, spec.n_draft[:, None], spec.n_target[:, None]))
    np.testing.assert_array_equal(spec.gamma, gammas[np.argmax(t, axis=1)])
    np.testing.assert_allclose(spec.tokens_per_flop_sdsl, t.max(axis=1), rtol=1e-12)
    assert set(data.truth) == set(spec.target)
    for target, truth in data.truth.items():
        assert truth["best"] == int(np.argmax(truth["tokens_per_flop"]))
        # The drafts' shared top budget (each size's to within a batch of tokens).
        assert truth["d_reference"] == pytest.approx(pairs.d_draft.max(), rel=1e-3) and truth["n_star_mean"] > 0


def test_noise_reaches_the_rows_at_its_scale_and_the_seed_fixes_it():
    runs, pairs, spec = design()
    a, b = (synthetic_closure_data(process(1.0), runs, pairs, spec, seed=s) for s in (1, 1))
    np.testing.assert_array_equal(a.runs.loss, b.runs.loss)
    residual = np.log(a.runs.loss) - np.log(np.asarray(LAW.loss(runs.n_params, runs.n_tokens)))
    # sigma 0.05 (t, 20 dof), run offsets 0.017 and slopes 0.047 per unit ln D: a few hundredths in all.
    assert 0.02 < residual.std() < 0.15
    other = synthetic_closure_data(process(1.0), runs, pairs, spec, seed=2)
    assert not np.allclose(other.pairs.alpha, a.pairs.alpha)
    assert all(np.isfinite(t["n_star_new"]) and t["n_star_new"] != t["n_star_mean"] for t in a.truth.values())


def test_reliability_of_calibrated_and_overconfident_forecasts():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 20000)
    calibrated = reliability(p, rng.uniform(0, 1, p.size) < p, bins=10)
    overconfident = reliability(p, rng.uniform(0, 1, p.size) < 0.5 + 0.5 * (p - 0.5), bins=10)
    assert calibrated.expected_calibration_error < 0.02 and overconfident.expected_calibration_error > 0.1
    assert sum(calibrated.count) == p.size
    # By hand: forecasts 0.1 (came true 1 of 2) and 0.9 (came true 2 of 2): |0.5 - 0.1| * 2/4 + |1 - 0.9| * 2/4.
    small = reliability([0.1, 0.1, 0.9, 0.9], [1, 0, 1, 1], bins=10)
    assert small.expected_calibration_error == pytest.approx(0.25)
    assert small.mean_forecast[3] is None and small.count[1] == 2
    with pytest.raises(ValueError, match="must lie in"):
        reliability([1.2], [1])


def test_summary_counts_coverage_and_left_out_forecasts():
    def target(p, best, band, truth):
        return dict(drafts=["a", "b"][:len(p)] if p else ["a"], p_best=p, true_best=best, n_star_band=band,
                    n_star_new=truth, n_star_mean=truth, bayes_regret=0.0)

    closures = [dict(process="x", targets=[target([0.7, 0.3], 0, [1.0, 2.0, 3.0], 2.5),
                                           target([1.0], 0, [1.0, 2.0, 3.0], 4.0)],
                     forms={"chinchilla + plane": 0.6, "kaplan + plane": 0.4}, failed_checks=["kaplan"]),
                dict(process="y", targets=[target([0.2, 0.8], 0, [1.0, float("nan"), 3.0], 2.0)],
                     forms={"chinchilla + plane": 1.0}, failed_checks=["plane"])]
    out = summarize_closures(closures)
    assert out["closures_where_every_form_failed_its_checks"] == 1  # y: its only form's plane failed
    assert out["overall"]["targets"] == 3 and out["overall"]["n_star_undefined"] == 1
    assert out["overall"]["n_star_coverage"] == pytest.approx(1 / 3)
    assert out["overall"]["p_best_forecasts"] == 4  # the single-candidate target carries no forecast
    assert out["by_process"]["x"]["n_star_coverage"] == 0.5
    assert out["by_checks"]["every form failed (all stacked)"]["targets"] == 1  # y's
    assert out["by_checks"]["some form passed"]["n_star_coverage"] == 0.5  # x's
    # Bias and width of the finite bands (x's two): medians of log(2 / 2.5), log(2 / 4) and of log 3.
    assert out["overall"]["n_star_median_log_ratio"] == pytest.approx(np.median([np.log(0.8), np.log(0.5)]))
    assert out["overall"]["n_star_median_log_width"] == pytest.approx(np.log(3.0))
    # x gave its true family (chinchilla) 0.6 of the weight; y's process names no stacked family.
    assert out["by_true_family_weight"]["true family over half"]["targets"] == 0
    # The band is the highest-weight form's: chinchilla leads in both closures.
    assert out["by_process_and_lead_law"]["x, chinchilla leads"]["n_star_coverage"] == 0.5
    assert out["by_process_and_lead_law"]["y, chinchilla leads"]["targets"] == 1
    # Which loss laws failed: x's kaplan (a law), y's none (its plane is an acceptance model).
    assert set(out["by_failed_laws"]) == {"x, laws failing: kaplan", "y, laws failing: none"}
    assert out["by_failed_laws"]["x, laws failing: kaplan"]["n_star_coverage"] == 0.5
    assert out["by_failed_laws"]["y, laws failing: none"]["targets"] == 1
    closures[0]["process"] = "chinchilla + plane"
    split = summarize_closures(closures)["by_true_family_weight"]
    assert split["true family over half"]["targets"] == 2 and split["true family at most half"]["targets"] == 1


@pytest.mark.slow  # the closing procedure is the closures' (test_experiments), resuming the store's (test_sbc)
def test_the_study_closes_synthetic_ladders_and_resumes(tmp_path, capsys):
    from experiments import calibration

    # Two of the ladder's targets (two and three candidates): each count of candidates compiles its own programs.
    lines = open(LADDER + "speculative.csv").read().splitlines()
    spec = tmp_path / "speculative.csv"
    kept = [ln for ln in lines[1:] if ln.split(",")[0] in ("L3@1450", "L4@605")]
    spec.write_text("\n".join([lines[0], *kept]) + "\n")
    args = ["--only", "misspecified", "--datasets", "2", "--processes", "kaplan:plane", "--stack", "chinchilla,plane",
            "--chains", "1", "--warmup", "30", "--draws", "30", "--speculative-design", str(spec),
            "--out", str(tmp_path / "out")]
    tmp_path = tmp_path / "out"
    # Two shards share the study: the first leaves the summary to the second, which finds both closures.
    assert calibration.main(args + ["--shard", "0/2"]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 closures are still with the other shards" in out
    # Each finished closure's line says how long it took and how much memory the process holds.
    memory = re.search(r"closure 1/2 \(kaplan \+ plane\) \[\d+ s, (\d+\.\d) GB resident\]", out)
    assert memory and 0 < float(memory.group(1)) < 64
    assert not (tmp_path / "misspecified.json").exists()
    assert calibration.main(args + ["--shard", "1/2"]) == 0
    assert "closure 1/2" not in capsys.readouterr().out
    assert (tmp_path / "misspecified_reliability.png").exists() and (tmp_path / "misspecified_n_star_bands.png").exists()
    record = json.loads((tmp_path / "misspecified.json").read_text())
    study = record["studies"]["misspecified"]
    assert [c["seed"] for c in study["closures"]] == [0, 1]
    closure = study["closures"][0]
    assert closure["process"] == "kaplan + plane" and study["processes"][0]["law"]["alpha_N"] > 0
    assert {t["target"] for t in closure["targets"]} == {"L3@1450", "L4@605"}
    # One chain of 30 draws has no R-hat: every posterior fails, and the record says what failed.
    assert closure["failed_checks"] and sorted(closure["check_problems"]) == closure["failed_checks"]
    assert all(any("R-hat" in p for p in problems) for problems in closure["check_problems"].values())
    for t in closure["targets"]:
        assert np.isclose(sum(t["p_best"]), 1.0) and 0 <= t["true_best"] < len(t["drafts"])
    assert study["summary"]["overall"]["targets"] == 2 * len(closure["targets"])
    assert (tmp_path / "misspecified_reliability.png").stat().st_size > 10_000
    assert calibration.main(args) == 0  # resumed from both shards' stage files: nothing fitted again
    assert "closure " not in capsys.readouterr().out
    assert json.loads((tmp_path / "misspecified.json").read_text())["studies"]["misspecified"]["closures"] == \
        study["closures"]
    # A closure fitted under other fitting choices (here another target acceptance) is not resumed.
    stage = tmp_path / "stages" / "misspecified-0of2.jsonl"
    unit = json.loads(stage.read_text().splitlines()[0])
    assert unit["study"]["model_effects"] == ["draft"]
    assert unit["study"]["target_accept"] == {"chinchilla": 0.9, "plane": 0.9}
    unit["study"]["target_accept"] = {"chinchilla": 0.8, "plane": 0.9}
    stage.write_text(json.dumps(unit) + "\n")
    assert calibration.main(args) == 0
    out = capsys.readouterr().out
    assert "closure 1/2" in out and "closure 2/2" not in out
    # The processes were fitted once and written; a closure drawn from another fit of its process
    # (another truth) is fitted again.
    assert json.loads((tmp_path / "processes.json").read_text())["true_processes"][0]["family"] == "kaplan"
    stage = tmp_path / "stages" / "misspecified-1of2.jsonl"
    unit = json.loads(stage.read_text().splitlines()[0])
    unit["closure"]["targets"][0]["n_star_mean"] *= 1.1
    stage.write_text(json.dumps(unit) + "\n")
    assert calibration.main(args) == 0
    out = capsys.readouterr().out
    assert "1 closure(s) of this study were drawn from another fit of their true process" in out
    assert "closure 2/2" in out and "closure 1/2" not in out
    assert calibration.main(args + ["--shard", "2/2"]) == 2
    assert "--shard" in capsys.readouterr().err


def test_a_study_is_keyed_by_the_target_acceptance_its_posteriors_run_at():
    """An acceptance model's posterior runs at its effects' target acceptance only where the design
    identifies per-model effects; the study's key says the one it ran at."""
    from experiments.calibration import stack_target_accept
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.loss_laws import FAMILIES

    logit = ACCEPTANCE_MODELS["logit-plane"].effects_target_accept
    assert logit != 0.9
    forms = (["chinchilla", "broken"], ["plane", "logit-plane"])
    broken = FAMILIES["broken"].target_accept
    assert stack_target_accept(*forms, model_effects=["draft"]) == {
        "chinchilla": 0.9, "broken": broken, "plane": 0.9, "logit-plane": logit}
    assert stack_target_accept(*forms, model_effects=[]) == {
        "chinchilla": 0.9, "broken": broken, "plane": 0.9, "logit-plane": 0.9}


def test_band_figure_draws_every_process_and_skips_undefined_bands(tmp_path):
    from sdsl_jax.figures import n_star_band_figure

    def target(band, truth):
        return dict(n_star_band=band, n_star_new=truth)

    closures = [dict(process="x", targets=[target([1e3, 2e3, 4e3], 3e3), target([1e3, 2e3, 4e3], 9e3)]),
                dict(process="y", targets=[target(None, 1e3), target([1e2, float("nan"), 1e4], 1e3)])]
    path = n_star_band_figure(str(tmp_path / "bands.png"), closures, caption="test")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# Slow (about a minute: four NUTS programs): the sampler's reruns are tested fast in test_bayes.py
# (attempts, longer runs), which failed forms carry weight enough in test_compare.py.
@pytest.mark.slow
def test_a_failed_form_that_would_carry_weight_is_run_again_longer():
    from sdsl_jax.acceptance import ACCEPTANCE_MODELS
    from sdsl_jax.loss_laws import FAMILIES
    from sdsl_jax.validation.forms import fit_forms

    runs, pairs, spec = design()
    data = synthetic_closure_data(process(1.0), runs, pairs, spec, seed=3)
    kw = dict(families=[FAMILIES["chinchilla"]], models=[ACCEPTANCE_MODELS["plane"]],
              starts_every=50, chains=1, warmup=20, draws=20, propagate=20, seed=0, mean_only=True)
    # One chain has no R-hat, so every posterior fails; each form carries weight, so each (a loss law
    # and an acceptance model) is run again once, from new starts with twice the warm-up and the
    # draws. (Which failed forms carry enough weight, among several: tests/test_compare.py.)
    lines = []
    _, summary = fit_forms(data.runs, data.pairs, reruns=1, rerun_weight=0.0, log=lines.append, **kw)
    assert {name: d["attempts"] for name, d in summary["diagnostics"].items()} == {"chinchilla": 2, "plane": 2}
    assert sum("40 warm-up + 40 draws" in line for line in lines) == 2


def test_a_closure_that_fails_is_reported_and_the_study_goes_on(tmp_path, capsys, monkeypatch):
    from experiments import calibration
    from sdsl_jax.validation import misspecified

    def fail(*args, seed, **kwargs):
        raise RuntimeError(f"synthetic failure {seed}")

    monkeypatch.setattr(misspecified, "synthetic_closure", fail)
    args = ["--only", "misspecified", "--datasets", "2", "--processes", "kaplan:plane", "--stack", "chinchilla,plane",
            "--chains", "1", "--warmup", "30", "--draws", "30", "--out", str(tmp_path)]
    calibration.main(args)
    out = capsys.readouterr().out
    # Both closures were tried (the first failure did not end the run), each with its traceback.
    assert "synthetic failure 0" in out and "synthetic failure 1" in out
    assert "2 closure(s) of this run failed (1, 2): rerun the same command" in out
    assert not (tmp_path / "stages" / "misspecified.jsonl").exists()


def test_weights_by_size_folds_are_a_study_of_their_own(tmp_path, capsys, monkeypatch):
    from experiments import calibration
    from sdsl_jax.validation import misspecified

    # A closure the study committed stands in for fitting one: what is checked is which settings reach
    # the fit and which finished closures a study resumes.
    record = json.load(open("fits/calibration/wellspecified_factorial/misspecified.json"))
    committed = record["studies"]["misspecified"]["closures"][0]
    calls = []

    def closure(process, runs, pairs, speculative, settings, *, stack, seed, log=None):
        calls.append(settings.stack_by)
        # Its targets carry this process's truth: a closure drawn from another is not counted.
        truth = misspecified.mean_curve_truth(process, runs, pairs, speculative)
        return dict(committed, seed=seed, targets=[dict(committed["targets"][0], target=name, n_star_mean=value)
                                                   for name, value in truth.items()])

    monkeypatch.setattr(misspecified, "synthetic_closure", closure)
    args = ["--only", "misspecified", "--datasets", "1", "--processes", "kaplan:plane", "--stack", "chinchilla,plane",
            "--out", str(tmp_path)]
    assert calibration.main(args + ["--stack-by", "sizes"]) == 0
    written = json.loads((tmp_path / "misspecified.json").read_text())
    assert calls == ["sizes"] and written["studies"]["misspecified"]["stack_by"] == "sizes"
    assert "--stack-by sizes" in written["command"]
    # Weights by rows are the first studies' choice: their key has no stack_by, and a closure weighed
    # by sizes is not resumed into them, nor one weighed by rows into a study by sizes.
    assert calibration.main(args) == 0
    study = json.loads((tmp_path / "misspecified.json").read_text())["studies"]["misspecified"]
    assert calls == ["sizes", "rows"] and "stack_by" not in study
    assert calibration.main(args + ["--stack-by", "sizes"]) == 0 and calls == ["sizes", "rows"]
    capsys.readouterr()


def test_the_committed_well_specified_control_is_the_shipped_priors_and_its_bands_cover():
    """The control fits synthetic ladders with exactly their true forms: its bands must cover as they
    claim under the prior the library ships. A change of the exponents' prior leaves this failing
    until the control is fitted again under it (its key names the prior)."""
    from sdsl_jax.loss_laws import CHINCHILLA, prior_key

    study = json.load(open("fits/calibration/wellspecified_factorial/misspecified.json"))["studies"]["misspecified"]
    assert {k: study[k] for k in prior_key([CHINCHILLA])} == prior_key([CHINCHILLA])
    overall = study["summary"]["overall"]
    assert overall["targets"] == 320 and 0.85 <= overall["n_star_coverage"] <= 0.95
    assert abs(overall["n_star_median_log_ratio"]) < 0.2 and overall["p_best_expected_calibration_error"] <= 0.10
