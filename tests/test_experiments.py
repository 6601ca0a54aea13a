"""The experiments pipeline on the micro ladder: train (ladder), measure, close the loop.

The micro ladder (3 sizes x 2 budgets, seconds) is trained and measured once per session by the
``micro_ladder`` fixture; these tests check what its outputs must satisfy against independent
recomputations: budgets against standalone WSD runs, exact alpha against
``sdsl_jax.lm.measure.exact_acceptance``, run statistics against their histograms.
"""

import csv
import json
import os

import jax
import numpy as np
import pytest

from experiments import closure, ladder, measure
from sdsl_jax.lm import train as train_module
from sdsl_jax.lm.corpus import load_corpus
from sdsl_jax.lm.measure import exact_acceptance
from sdsl_jax.lm.train import train
from sdsl_jax.data import load_acceptance, load_pretraining, load_speculative
from sdsl_jax.lm import ladder as rungs
from sdsl_jax.lm.model import TransformerConfig
from sdsl_jax.validation import closure as closing
from sdsl_jax.validation import closure_fits
from sdsl_jax.validation import forms as form_fits

PRESET = rungs.PRESETS["micro"]


def _registry(ladder_dir):
    return json.loads((ladder_dir / "ladder.json").read_text())


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_ladder_trains_every_size_at_every_budget(micro_ladder):
    ladder_dir, _ = micro_ladder
    reg = _registry(ladder_dir)
    assert len(reg["models"]) == len(PRESET.rungs) * len(PRESET.budget_fractions)
    assert reg["versions"]["flax"] and reg["command"].startswith("python -m experiments.ladder")
    for rung in PRESET.rungs:
        runs = sorted((m for m in reg["models"] if m["rung"] == rung.name), key=lambda m: m["n_tokens"])
        plan = rungs.plan_rung(rung, PRESET, runs[0]["n_params"])
        assert [m["budget_steps"] for m in runs] == list(plan.budgets)
        assert [m["n_tokens"] for m in runs] == [b * rung.batch_size * PRESET.seq_len for b in plan.budgets]
        # More tokens, lower held-out loss: training on real text helps at these budgets.
        assert runs[-1]["loss_heldout"] < runs[0]["loss_heldout"]
        assert all(np.isfinite(m["loss_hellaswag"]) for m in runs)


def test_a_budget_is_the_standalone_wsd_run_of_that_length(micro_ladder):
    """Branch k forks the plateau and decays: it must equal a WSD run of S_k steps from scratch."""
    ladder_dir, _ = micro_ladder
    rung = PRESET.rungs[0]
    config = rungs.rung_config(rung, PRESET.seq_len)
    plan = rungs.plan_rung(rung, PRESET, rungs.rung_n_params(rung, PRESET))
    budget, fork = plan.budgets[0], plan.forks[0]
    branch = rungs.load_model(config, str(ladder_dir / rung.name / f"budget_{budget}" / "params"))
    standalone, _ = train(config, load_corpus().train, steps=budget, batch_size=rung.batch_size,
                          seq_len=PRESET.seq_len, peak_lr=rung.peak_lr, seed=rungs.rung_seed(rung, PRESET),
                          checkpoint_dir=str(ladder_dir.parent / "standalone"), checkpoint_every=10**6,
                          warmup_steps=plan.warmup, decay_fraction=(budget - fork) / budget)
    from flax import nnx

    for a, b in zip(jax.tree.leaves(nnx.state(branch, nnx.Param)), jax.tree.leaves(nnx.state(standalone, nnx.Param))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def m1_on_four_devices(tmp_path_factory):
    """The micro ladder's smallest rung trained uninterrupted, data-parallel on this suite's four devices."""
    out = tmp_path_factory.mktemp("m1_on_four_devices")
    assert ladder.main(["--preset", "micro", "--rungs", "m1", "--quiet", "--out", str(out)]) == 0
    return out


def test_killed_ladder_resumes_to_the_same_models(tmp_path, monkeypatch, m1_on_four_devices):
    """Interrupt training mid-plateau; the rerun resumes from the checkpoint and ends where an
    uninterrupted run ends (same losses), and a finished ladder is not retrained."""
    args = ["--preset", "micro", "--rungs", "m1", "--quiet"]
    calls = {"n": 0}
    original = train_module.shard_batch

    def flaky(batch, mesh):
        calls["n"] += 1
        if calls["n"] == 30:  # past the first checkpoint (every 20 steps), before the end
            raise KeyboardInterrupt
        return original(batch, mesh)

    monkeypatch.setattr(train_module, "shard_batch", flaky)
    assert ladder.main(args + ["--out", str(tmp_path / "killed")]) == 130  # Ctrl-C: one line, status 130
    monkeypatch.setattr(train_module, "shard_batch", original)
    steps = {"n": 0}

    def counting(batch, mesh):
        steps["n"] += 1
        return original(batch, mesh)

    monkeypatch.setattr(train_module, "shard_batch", counting)
    assert ladder.main(args + ["--out", str(tmp_path / "killed")]) == 0
    plan = rungs.plan_rung(PRESET.rungs[0], PRESET, rungs.rung_n_params(PRESET.rungs[0], PRESET))
    assert steps["n"] <= plan.total_steps - 20  # resumed, not restarted
    clean, killed = _registry(m1_on_four_devices), _registry(tmp_path / "killed")
    for a, b in zip(clean["models"], killed["models"]):
        assert a["name"] == b["name"]
        assert a["loss_heldout"] == pytest.approx(b["loss_heldout"], rel=1e-5)
    steps["n"] = 0
    assert ladder.main(args + ["--out", str(tmp_path / "killed")]) == 0
    assert steps["n"] == 0  # everything finished: nothing retrained


# Run with one device: loads models trained data-parallel on this suite's four and evaluates them.
_EVALUATE_ON_ONE_DEVICE = """
import json, sys
import jax
from sdsl_jax.lm.corpus import load_corpus
from sdsl_jax.lm.ladder import PRESETS, EvalText, load_ladder
preset = PRESETS["micro"]
registry, models = load_ladder(sys.argv[1])
evaluation = EvalText(load_corpus().test, length=preset.seq_len, count=preset.eval_windows)
print(json.dumps(dict(devices=len(jax.devices()), trained_on=len(registry["devices"]),
                      losses={name: [record["loss_heldout"], evaluation.losses(model)["loss_heldout"]]
                              for name, (record, model) in models.items()})))
"""


def test_models_trained_on_several_devices_load_and_evaluate_on_one(m1_on_four_devices):
    """A ladder trained data-parallel is measured on a machine with fewer devices, to the same loss."""
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=os.environ["XLA_FLAGS"].replace("--xla_force_host_platform_device_count=4", ""))
    proc = subprocess.run([sys.executable, "-c", _EVALUATE_ON_ONE_DEVICE, str(m1_on_four_devices)], capture_output=True,
                          text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["devices"] == 1 and report["trained_on"] == len(jax.devices()) == 4
    assert len(report["losses"]) == len(PRESET.budget_fractions)
    for saved, evaluated in report["losses"].values():
        assert evaluated == pytest.approx(saved, rel=1e-5)


@pytest.mark.parametrize("args, fragment", [(["--devices", "0"], "--devices must be between 1 and 4"),
                                            (["--devices", "3"], "rung m1's batch of 8 sequences does not split evenly"),
                                            (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1")])
def test_ladder_arguments_that_cannot_train_exit_2(tmp_path, capsys, args, fragment):
    assert ladder.main(["--preset", "micro", *args, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_ladder_rejects_unknown_rungs(tmp_path, capsys):
    assert ladder.main(["--preset", "micro", "--rungs", "m1,zz", "--out", str(tmp_path), "--quiet"]) == 2
    assert "zz" in capsys.readouterr().err


def test_measure_writes_datasets_in_the_fitting_schemas(micro_ladder):
    ladder_dir, measure_dir = micro_ladder
    reg = _registry(ladder_dir)
    for suffix in ("", "_hellaswag"):
        runs = load_pretraining(measure_dir / f"pretraining{suffix}.csv")
        pairs = load_acceptance(measure_dir / f"acceptance{suffix}.csv")
        assert len(runs) == len(reg["models"])
        assert np.all(pairs.n_draft < pairs.n_target)
        # targets: each larger rung's longest budget; drafts: every budget of every smaller rung.
        assert len(pairs) == 2 * (1 + 2)
        assert np.all((pairs.alpha > 0) & (pairs.alpha < 1))
    meta = json.loads((measure_dir / "measure.json").read_text())
    assert meta["ladder"]["registry_sha256"] and meta["versions"]["jax"] and meta["settings"]["seed"] == 0


def test_exact_alpha_matches_an_independent_recomputation(micro_ladder):
    ladder_dir, measure_dir = micro_ladder
    reg = _registry(ladder_dir)
    pair = _rows(measure_dir / "pairs.csv")[-1]
    models = {}
    for name in (pair["draft"], pair["target"]):
        rec = next(m for m in reg["models"] if m["name"] == name)
        models[name] = rungs.load_model(TransformerConfig(**rec["config"]), str(ladder_dir / rec["params_path"]))
    evaluation = rungs.EvalText(load_corpus().test, length=PRESET.seq_len, count=PRESET.eval_windows)
    expected = exact_acceptance(models[pair["draft"]], models[pair["target"]], evaluation.heldout)
    assert float(pair["alpha_heldout"]) == pytest.approx(expected, rel=1e-5)
    greedy = exact_acceptance(models[pair["draft"]], models[pair["target"]], evaluation.hellaswag, temperature=0)
    assert float(pair["alpha_greedy_hellaswag"]) == pytest.approx(greedy, rel=1e-6)


def test_speculative_statistics_are_consistent(micro_ladder):
    _, measure_dir = micro_ladder
    rows = _rows(measure_dir / "speculative.csv")
    gammas = [int(g) for g in measure.SPECULATIVE_DEFAULTS["micro"]["gammas"].split(",")]
    assert len(rows) == 3 * len(gammas)  # longest-budget pairs x lookaheads
    for r in rows:
        gamma, iters = int(r["gamma"]), int(r["iterations"])
        hist = np.array([int(c) for c in r["histogram"].split(";")])
        k = np.arange(gamma + 1)
        assert len(hist) == gamma + 1 and hist.sum() == iters
        assert int(r["accepted"]) == int((k * hist).sum())
        assert int(r["new_tokens"]) == int(((k + 1) * hist).sum())
        assert int(r["new_tokens"]) >= int(r["prompts"]) * measure.SPECULATIVE_DEFAULTS["micro"]["new_tokens"]
        rejections = int(hist[:gamma].sum())
        assert float(r["alpha_mle"]) == pytest.approx(int(r["accepted"]) / (int(r["accepted"]) + rejections))
        n, m = float(r["n_draft"]), float(r["n_target"])
        assert float(r["tokens_per_flop_sdsl"]) == pytest.approx(int(r["new_tokens"]) / (iters * (2 * n * gamma + 2 * m)))
        # XLA counts the real work: the target verifies gamma + 1 positions, so it is below the SDSL model's.
        assert 0 < float(r["tokens_per_flop_xla"]) < float(r["tokens_per_flop_sdsl"])
        assert float(r["tokens_per_second"]) > 0 and float(r["target_alone_tokens_per_second"]) > 0
        assert int(r["repeats"]) == measure.SPECULATIVE_DEFAULTS["micro"]["repeats"]
        # Per-prompt counts (for the bootstrap over prompts) add up to the row's totals.
        its = [int(v) for v in r["iterations_per_prompt"].split(";")]
        acc = [int(v) for v in r["accepted_per_prompt"].split(";")]
        assert len(its) == len(acc) == int(r["prompts"]) and sum(its) == iters and sum(acc) == int(r["accepted"])
    assert all(run is not None for run in map(load_speculative(measure_dir / "speculative.csv").per_prompt,
                                              range(len(rows))))


def test_measure_resumes_without_rerunning_speculative_configurations(micro_ladder, tmp_path, monkeypatch):
    ladder_dir, measure_dir = micro_ladder
    import shutil

    out = tmp_path / "measure"
    shutil.copytree(measure_dir / "stages", out / "stages")

    def forbidden(*a, **k):
        raise AssertionError("a finished configuration was run again")

    monkeypatch.setattr(measure, "speculative_generate", forbidden)
    assert measure.main(["--preset", "micro", "--ladder", str(ladder_dir), "--out", str(out), "--quiet"]) == 0
    assert _rows(out / "speculative.csv") == _rows(measure_dir / "speculative.csv")


def test_measure_reports_a_missing_ladder(tmp_path, capsys):
    assert measure.main(["--preset", "micro", "--ladder", str(tmp_path / "nope"), "--quiet"]) == 2
    assert "experiments.ladder" in capsys.readouterr().err


def test_measure_rejects_prompts_longer_than_the_context(micro_ladder, capsys):
    ladder_dir, _ = micro_ladder
    assert measure.main(["--preset", "micro", "--ladder", str(ladder_dir), "--new-tokens", "60", "--quiet"]) == 2
    assert "context" in capsys.readouterr().err


def test_closure_compares_predicted_and_measured_best_drafts(micro_ladder, tmp_path):
    _, measure_dir = micro_ladder
    assert closure.main(["--data", str(measure_dir), "--starts", "20", "--out", str(tmp_path), "--quiet"]) == 0
    result = json.loads((tmp_path / "closure.json").read_text())
    assert len(result["targets"]) == 2
    for rec in result["targets"]:
        assert rec["measured_best"] in rec["drafts"] and rec["fastest_wallclock"] in rec["drafts"]
        assert rec["predicted_best"] in rec["drafts"]
        measured = np.array(rec["measured_tokens_per_flop"])
        assert measured[rec["drafts"].index(rec["measured_best"])] == measured.max()
    assert (tmp_path / "closure.png").stat().st_size > 0
    assert "| target" in (tmp_path / "closure.md").read_text()


def test_closure_with_posterior_on_the_micro_ladder(micro_ladder, tmp_path, monkeypatch):
    """Predictive P(best), its scores, the bootstrap over prompts; the prospective refits need more
    sizes than the micro ladder's three (without one, 4 runs cannot identify 5 coefficients), and
    the closure says so instead of failing.

    With `--stack` (here over the two acceptance models): every form fitted and weighted, P(best)
    the mixture's. Handing the same forms to the prospective path as every size's fit must give
    the same P(best) and point T: the prospective code mixes exactly as the in-sample code does.
    """
    _, measure_dir = micro_ladder
    fitted = []
    fit_forms = form_fits.fit_forms
    monkeypatch.setattr(closure_fits, "fit_forms", lambda *a, **k: fitted.append(fit_forms(*a, **k)) or fitted[-1])
    assert closure.main(["--data", str(measure_dir), "--starts", "20", "--out", str(tmp_path), "--quiet",
                         "--posterior", "--prospective", "--stack", "plane,log-plane", "--chains", "1", "--reruns", "0",
                         "--warmup", "40", "--draws", "40", "--propagate", "40", "--no-figure", "--forward"]) == 0
    result = json.loads((tmp_path / "closure.json").read_text())
    # Forward chaining: the first target's runs (two sizes) cannot identify the law, the last one's can.
    by_target = {r["target"]: r for r in result["targets"]}
    first, last = (by_target[t] for t in sorted(by_target, key=lambda t: by_target[t]["m_target"])[::len(by_target) - 1])
    assert "cannot identify" in first["forward_skipped"]
    assert np.isclose(sum(last["forward_p_best"]), 1.0) and last["forward_bayes_decision"] in last["drafts"]
    # With --stack the forward fit stacks the forms again from its own data (the pairs of smaller
    # targets are too few here for an acceptance model: the paper's plane, with the laws stacked).
    assert last["forward_lead_form"] == "chinchilla + plane"
    assert result["forward_fits"][last["target"]]["forms"] == {"chinchilla + plane": 1.0}
    assert result["forecast_scores"]["forward"]["targets_scored"] == [last["target"]]
    assert "Forward chaining" in (tmp_path / "closure.md").read_text()
    assert {"predictive", "mean_only"} <= result["forecast_scores"].keys()
    assert "cannot identify" in result["prospective_skipped"]
    assert "log_score_over_measured_uncertainty" in result["forecast_scores"]["predictive"]
    for rec in result["targets"]:
        assert np.isclose(sum(rec["p_best"]), 1.0)
        assert np.isclose(sum(rec["measured_best_bootstrap"]), 1.0)  # the micro ladder records per-prompt counts
        assert not rec["n_star_band"][0] > rec["n_star_band"][2]  # NaN where every draw failed
        # The Bayes decision is the mixture's draft of highest expected T, scored against the measured best.
        measured = np.array(rec["measured_tokens_per_flop"])
        assert rec["bayes_decision"] in rec["drafts"] and 0.0 <= rec["bayes_decision_p_best"] <= 1.0
        assert rec["bayes_decision_regret"] == pytest.approx(
            1 - measured[rec["drafts"].index(rec["bayes_decision"])] / measured.max())
    assert len(result["forecast_scores"]["predictive"]["bayes_decision_regret"]) == len(result["targets"])
    assert "the Bayes decision (the draft with the highest posterior-expected T)" in (tmp_path / "closure.md").read_text()
    baselines = result["forecast_scores"]["predictive"]["baselines"]["all"]
    assert {"method", "uniform", "smallest", "previous-best", "fixed-ratio"} == set(baselines["forecasts"])
    assert "against forecasts made without a fit" in (tmp_path / "closure.md").read_text()
    st = result["stacking"]
    assert list(st["laws"]) == ["chinchilla"] and st["laws"]["chinchilla"]["weight"] == 1.0  # --law's
    assert set(st["acceptance_models"]) == {"plane", "log-plane"}
    assert np.isclose(sum(v["weight"] for v in st["acceptance_models"].values()), 1.0)
    lead = max(st["forms"], key=st["forms"].get)
    assert f"{result['law_family']} + {result['acceptance_model']}" == lead
    assert all(rec["lead_form"] == lead for rec in result["targets"])
    assert "Stacked forms" in (tmp_path / "closure.md").read_text()
    # Every finished fit was kept: rerun with --resume, nothing is fitted or sampled again.
    from sdsl_jax import pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("refitted on --resume")

    for module, name in ((pipeline, "sample_loss_law"), (pipeline, "sample_plane"), (pipeline, "fit_loss_law")):
        monkeypatch.setattr(module, name, refuse)
    assert closure.main(["--data", str(measure_dir), "--starts", "20", "--out", str(tmp_path), "--quiet",
                         "--posterior", "--prospective", "--stack", "plane,log-plane", "--chains", "1", "--reruns", "0",
                         "--warmup", "40", "--draws", "40", "--propagate", "40", "--no-figure", "--resume"]) == 0
    resumed = json.loads((tmp_path / "closure.json").read_text())
    assert [r["p_best"] for r in resumed["targets"]] == [r["p_best"] for r in result["targets"]]
    monkeypatch.undo()

    runs, pairs = load_pretraining(measure_dir / "pretraining.csv"), load_acceptance(measure_dir / "acceptance.csv")
    spec = load_speculative(measure_dir / "speculative.csv")
    forms = fitted[0][0]  # what the CLI fitted
    records = closing.close_loop(spec, forms[0].point, draws=forms[0].draws, scales=forms[0].scales, runs=runs,
                                 pairs=pairs)
    form_fits.stack_records(records, forms)
    closure_fits.add_prospective(records, {float(v): forms for v in spec.n_draft})
    for rec in records:
        assert rec["prospective_bayes_decision"] == rec["bayes_decision"]  # one decision rule on the same draws
        np.testing.assert_allclose(rec["prospective_p_best"], rec["p_best"])
        np.testing.assert_allclose(rec["prospective_tokens_per_flop"], rec["predicted_tokens_per_flop"])


@pytest.mark.parametrize("args, fragment", [(["--stack"], "add --posterior"),
                                            (["--posterior", "--stack", "chinchilla,plane,cubic"], "unknown form(s) cubic"),
                                            (["--prior-sensitivity"], "--prior-sensitivity compares posterior"),
                                            (["--posterior", "--prior-sensitivity", "0"], "must be a positive number")])
def test_closure_stack_arguments_exit_2(args, fragment, tmp_path, capsys):
    data = os.path.join(os.path.dirname(__file__), os.pardir, "fits", "ladder-v1")
    assert closure.main(["--data", data, "--out", str(tmp_path), "--quiet", *args]) == 2
    assert fragment in capsys.readouterr().err


def test_closure_reports_missing_data(tmp_path, capsys):
    assert closure.main(["--data", str(tmp_path), "--quiet"]) == 2
    assert "pretraining" in capsys.readouterr().err


@pytest.mark.parametrize("module, body", [("ladder", "_train_ladder"), ("measure", "_measure"),
                                          ("closure", "_close")])
def test_ctrl_c_in_long_commands_exits_130_with_one_line(module, body, tmp_path, capsys, monkeypatch):
    import importlib

    cli = importlib.import_module(f"experiments.{module}")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, body, interrupted)
    argv = {"ladder": ["--out", str(tmp_path)], "measure": ["--ladder", str(tmp_path)],
            "closure": ["--data", str(tmp_path)]}[module]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted: " in err and "rerun the same command" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, fragment", [(["--points", "1"], "--points must be at least 2"),
                                            (["--tokens", "0"], "--tokens must be a positive finite number"),
                                            (["--tokens", "nan"], "--tokens must be a positive finite number")])
def test_reproduce_paper_refuses_bad_arguments_with_exit_2(args, fragment, capsys):
    from experiments import reproduce_paper

    with pytest.raises(SystemExit) as info:
        reproduce_paper.main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_the_clis_persistent_compilation_cache_is_written_and_can_be_turned_off(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from experiments.runlog import default_compile_cache

    cache = tmp_path / "xla"
    env = dict(os.environ, SDSL_JAX_COMPILE_CACHE=str(cache))
    run = subprocess.run([sys.executable, "-m", "experiments.reproduce_paper", "--points", "3"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert cache.is_dir() and any(cache.iterdir())  # compiled programs were stored
    for off in ("off", "OFF", "0", ""):
        monkeypatch.setenv("SDSL_JAX_COMPILE_CACHE", off)
        assert default_compile_cache() is None
    monkeypatch.delenv("SDSL_JAX_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_compile_cache() == str(tmp_path / "sdsl-jax" / "xla")


# Slow (its own timing runs and latency fit): the seconds law's fit and N* in seconds are tested fast in
# test_latency.py, the wall-clock closure's refusals in test_faults.py.
@pytest.mark.slow
def test_wallclock_closure_on_the_micro_ladder(micro_ladder, tmp_path):
    import shutil

    from experiments import latency, wallclock

    _, measure_dir = micro_ladder
    shutil.copy(measure_dir / "speculative.csv", tmp_path / "speculative.csv")
    assert latency.main(["--preset", "micro", "--out", str(tmp_path), "--max-tokens", "4", "--repeats", "2",
                         "--batches", "1", "--cache-length", "16", "--repeat-seconds", "0.002", "--loop-tokens", "8",
                         "--loop-prompt-len", "16", "--loop-gammas", "1", "2", "--quiet"]) == 0
    assert wallclock.main(["--data", str(tmp_path), "--draws", "200", "--quiet"]) == 0
    record = json.loads((tmp_path / "closure" / "wallclock.json").read_text())
    spec = load_speculative(tmp_path / "speculative.csv")
    assert len(record["runs"]) == len(spec) and len(record["targets"]) == len(set(spec.target))
    for run in record["runs"]:
        lo, hi = run["predicted_band"]
        assert lo <= hi and run["predicted_speedup"] > 0
    for target in record["targets"]:
        mine = [r for r in record["runs"] if r["target"] == target["target"]]
        best = max(r["measured_speedup"] for r in mine)
        assert target["measured_fastest"]["speedup"] == best and 0 <= target["regret"] <= 1
        assert 0 <= target["p_measured_fastest"] <= 1
        # The per-model table's choice is a measured run of this target, scored the same way.
        chosen = target["per_model"]
        assert any(r["draft"] == chosen["draft"] and r["gamma"] == chosen["gamma"] for r in mine)
        assert chosen["picked_measured_fastest"] == (chosen["regret"] == 0.0) and 0 <= chosen["regret"] <= 1
    assert (tmp_path / "closure" / "wallclock.png").exists()
    overheads = record["loop_overheads"]  # the loops were timed: their overheads are in the model
    assert set(overheads) == {"iteration", "draft_step", "alone"} and all(v >= 0 for v in overheads.values())


def test_a_point_outside_its_band_is_flagged_and_nan_is_not():
    assert closing.outside_band(25e3, [14.7, 300.0, 2.85e3])
    assert not closing.outside_band(1e3, [14.7, 300.0, 2.85e3])
    assert not closing.outside_band(float("nan"), [1.0, 2.0, 3.0])
    assert not closing.outside_band(5.0, [float("nan"), 2.0, 3.0]) and not closing.outside_band(5.0, None)


def test_failed_posteriors_are_listed_with_the_weight_of_their_form():
    ok = dict(ok=True, max_rhat=1.001, min_ess_bulk=900, num_divergences=0)
    bad = dict(ok=False, max_rhat=1.114, min_ess_bulk=24, num_divergences=0)
    lines = closing.failed_diagnostics(
        {"broken": ok, "plane": ok}, {"24832": dict(forms={"broken + log-plane": 0.86, "broken + plane": 0.14},
                                                   diagnostics={"broken": bad, "plane": ok})},
        {"forms": {"broken + log-plane": 1.0}})
    assert lines == ["without N = 24832: broken (R-hat 1.114, ESS 24, 0 divergent, weight 1.00)"]
    assert closing.failed_diagnostics({"loss_law": bad}, None, None) == \
        ["all data: loss_law (R-hat 1.114, ESS 24, 0 divergent)"]
    # A posterior failing only by its trajectories' length says so: every other number passes.
    capped = dict(ok, ok=False, max_tree_depth_share=0.45, median_steps=511.0)
    assert closing.failed_diagnostics({"chinchilla": capped}, None, {"forms": {"kaplan + plane": 1.0}}) == \
        ["all data: chinchilla (R-hat 1.001, ESS 900, 0 divergent, 45% at the tree-depth cap, median 511 steps, "
         "weight 0.00)"]


def test_a_recorded_command_reruns_as_it_ran():
    """A result file's command is what a shell reruns: an empty argument or a path with a space
    survives the round trip through the shell's splitting."""
    import shlex

    from experiments.runlog import command_line, run_header

    argv = ["--families", "", "--acceptance-models", "plane", "--out", "my results/sbc"]
    line = command_line("experiments.calibration", argv)
    assert shlex.split(line) == ["python", "-m", "experiments.calibration", *argv]
    assert run_header("experiments.fit", ["--data", "fits/ladder"])["command"] == "python -m experiments.fit --data fits/ladder"
