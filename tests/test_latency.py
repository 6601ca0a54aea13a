"""Latency models: the non-negative fit against an independent oracle, held-out error, the
measurement CLI, and the law in seconds through the solvers."""

import itertools

import numpy as np
import pytest
import scipy.optimize

from sdsl_jax import best_lookahead, target_alone_cost, throughput_under
from sdsl_jax.data import load_latency
from sdsl_jax.latency import (FORMS, cost_from_coef, fit_latency_cost, fit_loop_overheads, held_out_error,
                              latency_cost_draws, predict_seconds)

TRUE = dict(t0=2e-5, t1=1e-6, c1=3e-11, c2=4e-12)


def synthetic(noise=0.03, seed=0):
    rng = np.random.default_rng(seed)
    n = np.repeat([2e4, 1e5, 5e5, 1.2e6], 12)
    k = np.tile(np.arange(1, 13), 4).astype(float)
    t = (TRUE["t0"] + TRUE["t1"] * k + TRUE["c1"] * n + TRUE["c2"] * n * k) * np.exp(rng.normal(0, noise, n.size))
    return n, k, t


def test_fit_recovers_the_coefficients_and_matches_scipy_nnls():
    n, k, t = synthetic(noise=0.0)
    fit = fit_latency_cost(n, k, t)
    for name, value in TRUE.items():
        assert fit.coef[name] == pytest.approx(value, rel=1e-8)
    n, k, t = synthetic(noise=0.05, seed=3)
    fit = fit_latency_cost(n, k, t)
    # Oracle: SciPy's NNLS on the same relative-residual problem.
    design = np.stack([np.ones_like(n), k, n, n * k], axis=1) / t[:, None]
    scale = design.max(0)
    oracle, _ = scipy.optimize.nnls(design / scale, np.ones_like(t))
    np.testing.assert_allclose([fit.coef[a] for a in ("t0", "t1", "c1", "c2")], oracle / scale, rtol=1e-6, atol=1e-20)


def test_coefficients_stay_non_negative_where_least_squares_would_go_negative():
    n, k, _ = synthetic()
    # Times that FALL with k (as a noisy measurement can): least squares would give t1, c2 < 0.
    t = (5e-5 + 2e-11 * n) * (1 - 0.02 * k) * np.exp(np.random.default_rng(1).normal(0, 0.02, n.size))
    fit = fit_latency_cost(n, k, t)
    design = np.stack([np.ones_like(n), k, n, n * k], 1) / t[:, None]
    unconstrained, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    assert np.any(unconstrained < 0)  # plain least squares would make times fall with k
    assert all(v >= 0 for v in fit.coef.values()) and min(fit.coef.values()) == 0.0
    scale = design.max(0)
    oracle, _ = scipy.optimize.nnls(design / scale, np.ones_like(t))
    np.testing.assert_allclose([fit.coef[a] for a in ("t0", "t1", "c1", "c2")], oracle / scale, rtol=1e-6, atol=1e-20)


def test_the_fitted_cost_is_the_latency_cost_of_the_library():
    fit = fit_latency_cost(*synthetic())
    for n, k in itertools.product([3e4, 8e5], [1, 2, 7]):
        assert float(fit.cost.verification(n, k)) == pytest.approx(float(predict_seconds(fit, n, k)), rel=1e-12)
    assert float(fit.cost.draft_step(5e5)) == pytest.approx(float(predict_seconds(fit, 5e5, 1)), rel=1e-12)


def test_held_out_token_counts_are_predicted_and_the_simpler_forms_score_worse():
    n, k, t = synthetic(noise=0.02)
    errors = {f: held_out_error(n, k, t, held_out_tokens=[3, 5, 7, 9, 11], form=f)["relative_rmse"] for f in FORMS}
    assert errors["full"] < 0.04 < errors["size-tokens"] < errors["memory-bound"]


def test_cost_draws_spread_like_the_fit():
    fit = fit_latency_cost(*synthetic(noise=0.05))
    draws = latency_cost_draws(fit, count=4000, seed=0)
    assert draws.verify_fixed.shape == (4000,) and np.all(np.asarray(draws.verify_fixed) >= 0)
    i = fit.active.index("c1")
    assert np.std(draws.verify_per_param) == pytest.approx(np.sqrt(fit.covariance[i, i]), rel=0.1)


def test_gamma_star_in_seconds_matches_brute_force():
    fit = fit_latency_cost(*synthetic())
    alpha, n, m = 0.75, 5e4, 1.2e6
    best = best_lookahead(fit.cost, alpha, n, m)
    grid = np.linspace(0.01, 40, 40001)
    brute = np.asarray(throughput_under(fit.cost, alpha, grid, n, m))
    assert float(best.gamma) == pytest.approx(grid[np.nanargmax(brute)], abs=2e-3)
    assert float(best.throughput) == pytest.approx(np.nanmax(brute), rel=1e-7)


def test_bad_latency_fits_name_the_problem():
    n, k, t = synthetic()
    with pytest.raises(ValueError, match="form must be one of"):
        fit_latency_cost(n, k, t, form="cubic")
    with pytest.raises(ValueError, match="seconds must be finite and > 0"):
        fit_latency_cost(n, k, np.where(k == 3, -1.0, t))
    with pytest.raises(ValueError, match="at least 2 distinct model sizes"):
        fit_latency_cost(np.full_like(n, 1e5), k, t)
    with pytest.raises(ValueError, match="at least 2 distinct token counts"):
        fit_latency_cost(n, np.ones_like(k), t)


def test_latency_cli_measures_the_micro_ladder_and_resumes(tmp_path, monkeypatch):
    from experiments import latency

    args = ["--preset", "micro", "--out", str(tmp_path), "--max-tokens", "2", "--repeats", "2", "--batches", "1",
            "--cache-length", "16", "--repeat-seconds", "0.002", "--no-loops", "--quiet"]
    assert latency.main(args) == 0
    table = load_latency(tmp_path / "latency.csv")
    assert len(table) == 3 * 2 and np.all(table.seconds_median > 0) and set(table.tokens) == {1.0, 2.0}
    # A rerun measures nothing: every model is in the stages file.
    monkeypatch.setattr(latency, "time_calls", lambda *a, **k: pytest.fail("re-measured a finished model"))
    assert latency.main(args) == 0
    assert len(load_latency(tmp_path / "latency.csv")) == 6


def _write_latency(path, rows):
    path.write_text("model,n_params,batch,tokens,seconds_median\n" + "".join(
        f"m{i},{float(n)!r},1,{int(k)},{float(t)!r}\n" for i, (n, k, t) in enumerate(rows)))
    return str(path)


def test_fit_cli_gives_n_star_and_speedup_in_tokens_per_second(tmp_path, capsys):
    import json

    from experiments import fit as fit_cli

    n, k, t = synthetic(noise=0.01)
    lat = _write_latency(tmp_path / "latency.csv", zip(n, k, t))
    out = tmp_path / "out"
    args = ["--dataset", "ladder", "--cost", "latency", "--latency", lat, "--starts", "45", "--num-targets", "5",
            "--out", str(out), "--no-figures"]
    assert fit_cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "tokens per second (--cost latency)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["latency"]["form"] in ("full", "size-tokens", "memory-bound")
    for target in summary["targets"]:
        assert "tokens_per_second" in target and "tokens_per_flop" not in target
        if target["status"] == 0:  # speedup = T* x t(M, 1), the target alone's seconds per token
            c = summary["latency"]["coef"]
            alone = c["t0"] + c["t1"] + (c["c1"] + c["c2"]) * target["m_target"]
            assert target["speedup"] == pytest.approx(target["tokens_per_second"] * alone, rel=1e-9)


@pytest.mark.parametrize("args, fragment", [
    (["--cost", "latency"], "--cost latency and --latency PATH go together"),
    (["--latency", "x.csv"], "--cost latency and --latency PATH go together"),
    (["--cost", "latency", "--latency", "absent.csv"], "cannot be read"),
    (["--cost", "latency", "--latency", "LAT", "--latency-batch", "8"], "no call rows at batch 8"),
])
def test_fit_cli_latency_arguments_exit_2(tmp_path, capsys, args, fragment):
    from experiments import fit as fit_cli

    lat = _write_latency(tmp_path / "latency.csv", zip(*synthetic()))
    args = [lat if a == "LAT" else a for a in args]
    out = tmp_path / "out"
    assert fit_cli.main(["--dataset", "ladder"] + args + ["--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and not out.exists()


def test_loop_overheads_are_recovered_and_enter_the_cost():
    fit = fit_latency_cost(*synthetic(noise=0.0))
    rng = np.random.default_rng(0)
    n = rng.choice([2e4, 1e5], 12)
    m = rng.choice([5e5, 1.2e6], 12)
    g = rng.choice([1.0, 2.0, 4.0, 6.0], 12)
    true = dict(iteration=40e-6, draft_step=5e-6, alone=25e-6)
    calls = g * predict_seconds(fit, n, 1.0) + predict_seconds(fit, m, g + 1.0)
    iteration = calls + true["iteration"] + true["draft_step"] * g
    alone_m = np.array([5e5, 1.2e6])
    alone = predict_seconds(fit, alone_m, 1.0) + true["alone"]
    with_loops = fit_loop_overheads(fit, alone_m=alone_m, alone_seconds=alone, iteration_n=n, iteration_m=m,
                                    iteration_gamma=g, iteration_seconds=iteration)
    for key, value in true.items():
        assert with_loops.overheads[key] == pytest.approx(value, rel=1e-6)
    cost = with_loops.cost
    for i in range(12):  # the cost model's iteration is the measured loop iteration
        assert float(g[i] * cost.draft_step(n[i]) + cost.verification(m[i], g[i] + 1)) == pytest.approx(iteration[i])
    assert float(target_alone_cost(cost, 1.2e6)) == pytest.approx(alone[1])
    assert cost_from_coef(fit.coef).alone_offset == 0.0


def _per_model_table(tmp_path, lines, loops=None):
    """A latency table whose model j's calls follow the line fixed_j + per_position_j k exactly."""
    rows = ["model,n_params,batch,tokens,seconds_median,kind,n_draft,gamma"]
    for j, (n, a, b) in enumerate(lines):
        rows += [f"s{j},{n!r},1,{k},{a + b * k!r},call,," for k in range(1, 13)]
    for kind, n, m, g, t in loops or ():
        tokens = 1 if g is None else g + 1  # an iteration row verifies gamma + 1 positions
        rows.append(f"{kind},{m!r},1,{tokens},{t!r},{kind},{'' if n is None else repr(n)},{'' if g is None else g}")
    path = tmp_path / "latency.csv"
    path.write_text("\n".join(rows) + "\n")
    return load_latency(path)


LINES = [(2.5e4, 40e-6, 2.6e-6), (1.2e5, 90e-6, 9.8e-6), (4.8e5, 280e-6, 25e-6), (1.2e6, 590e-6, 56e-6)]


def test_per_model_table_follows_each_models_calls_where_a_law_in_n_cannot(tmp_path):
    from sdsl_jax.latency import fit_measured_latency

    table = _per_model_table(tmp_path, LINES)
    cost = fit_measured_latency(table)
    for n, a, b in LINES:
        for k in (1.0, 5.0, 12.0):
            assert float(cost.calls(n, k)) == pytest.approx(a + b * k, rel=1e-9)
    # Between timed sizes: linear in log N, so the geometric mean of two sizes sits half-way.
    mid = np.sqrt(LINES[0][0] * LINES[1][0])
    assert float(cost.calls(mid, 1.0)) == pytest.approx(0.5 * (LINES[0][1] + LINES[0][2] + LINES[1][1] + LINES[1][2]))
    # The law t(N, k) of the same table misses some model by more than 10%: the per-model table is needed.
    calls = table.of_kind("call")
    law = fit_latency_cost(calls.n_params, calls.tokens, calls.seconds_median)
    assert np.max(np.abs(predict_seconds(law, calls.n_params, calls.tokens) / calls.seconds_median - 1)) > 0.1


def test_per_model_table_is_affine_and_its_gamma_star_matches_brute_force(tmp_path):
    from sdsl_jax.latency import fit_measured_latency

    cost = fit_measured_latency(_per_model_table(tmp_path, LINES))
    n, m, alpha = 2.5e4, 1.2e6, 0.75
    slope, intercept = cost.affine(n, m)
    for g in (1.0, 3.0, 7.5):
        direct = g * cost.draft_step(n) + cost.verification(m, g + 1)
        assert float(slope * g + intercept) == pytest.approx(float(direct), rel=1e-12)
    best = best_lookahead(cost, alpha, n, m)
    grid = np.linspace(0.01, 40, 40001)
    brute = np.asarray(throughput_under(cost, alpha, grid, n, m))
    assert float(best.gamma) == pytest.approx(grid[np.nanargmax(brute)], abs=2e-3)


def test_per_model_table_takes_the_loop_overheads(tmp_path):
    from sdsl_jax.latency import fit_measured_latency

    true = dict(iteration=40e-6, draft_step=5e-6, alone=25e-6)
    line = {n: (a, b) for n, a, b in LINES}
    loops = []
    for n, m, g in [(2.5e4, 4.8e5, 1), (2.5e4, 4.8e5, 4), (1.2e5, 1.2e6, 1), (1.2e5, 1.2e6, 4), (2.5e4, 1.2e6, 4)]:
        calls = g * sum(line[n]) + line[m][0] + line[m][1] * (g + 1)
        loops.append(("iteration", n, m, g, calls + true["iteration"] + true["draft_step"] * g))
    for m in (4.8e5, 1.2e6):
        loops.append(("alone", None, m, None, sum(line[m]) + true["alone"]))
    cost = fit_measured_latency(_per_model_table(tmp_path, LINES, loops))
    assert float(cost.iteration) == pytest.approx(true["iteration"], rel=1e-6)
    assert float(cost.draft_step_overhead) == pytest.approx(true["draft_step"], rel=1e-6)
    assert float(target_alone_cost(cost, 1.2e6)) == pytest.approx(sum(line[1.2e6]) + true["alone"], rel=1e-9)


def test_per_model_table_refuses_a_model_timed_at_one_token_count(tmp_path):
    from sdsl_jax.latency import fit_measured_latency

    path = tmp_path / "latency.csv"
    path.write_text("model,n_params,batch,tokens,seconds_median\nbig,1e6,1,1,1e-4\nsmall,1e5,1,1,5e-5\n"
                    "small,1e5,1,2,6e-5\n")
    with pytest.raises(ValueError, match="model 'big': timed at 1 token count"):
        fit_measured_latency(load_latency(path))


def test_the_held_out_token_counts_come_from_the_timings_given():
    from sdsl_jax.latency import HELD_OUT_TOKENS, held_out_tokens_for

    assert held_out_tokens_for(range(1, 13)) == HELD_OUT_TOKENS  # the ladder's timings: gamma 2, 4, 6
    assert held_out_tokens_for([1, 2, 4, 6, 8] * 3) == (2, 6)
    assert held_out_tokens_for([1, 5, 9]) == (5,)
    with pytest.raises(ValueError, match="three or more token counts"):
        held_out_tokens_for([1, 8])


def test_a_latency_table_timed_at_other_token_counts_is_fitted(tmp_path):
    from sdsl_jax.data import load_latency
    from sdsl_jax.latency import fit_latency_table

    rows = ["model,n_params,batch,tokens,seconds_median"]
    for name, n in (("a", 1e5), ("b", 4e5), ("c", 1.6e6)):
        for k in (1, 2, 4, 6, 8):  # no 3, 5 or 7: refused before ("must leave some rows on each side")
            rows.append(f"{name},{n!r},1,{k},{2e-5 + 1e-6 * k + 3e-11 * n + 1e-12 * n * k!r}")
    (tmp_path / "latency.csv").write_text("\n".join(rows) + "\n")
    fit = fit_latency_table(load_latency(tmp_path / "latency.csv"))
    assert fit.relative_rmse < 1e-6
