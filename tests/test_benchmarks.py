"""The benchmarks compare equal things: points inside the domain, starts that reach the optimum."""

import numpy as np
import pytest
import scipy.special

from experiments.benchmarks.inference import reached_share
from experiments.benchmarks.numerics import interleaved_medians, lambertw_points, solve_faults


def test_lambert_w_points_lie_inside_the_real_domain_of_both_branches():
    for k in (0, -1):
        z = lambertw_points(k, 1000)
        assert z.min() >= -1 / np.e and np.isfinite(scipy.special.lambertw(z, k).real).all()


def test_timed_sides_are_called_in_turn_and_reported_by_their_medians(monkeypatch):
    import experiments.benchmarks.numerics as numerics

    calls, clock = [], iter(np.arange(100.0))
    monkeypatch.setattr(numerics.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(numerics.time, "process_time", lambda: 0.0)
    wall, cpu = interleaved_medians([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 3  # never one side's repeats in a row
    assert wall == [1.0, 1.0] and cpu == [0.0, 0.0]


def test_a_solve_is_a_fault_when_below_the_brute_force_best_or_giving_up_on_a_gain():
    from sdsl_jax import SolveStatus

    ok, no_gain, no_draft = SolveStatus.SUCCESS, SolveStatus.NO_SPEEDUP, SolveStatus.NO_ADMISSIBLE_DRAFT
    lost = SolveStatus.NOT_CONVERGED
    status = np.array([ok, ok, ok, no_gain, no_gain, no_draft, lost, SolveStatus.ACCEPTANCE_SATURATES])
    found = np.array([2.0, 2.0 * (1 - 5e-10), 1.9, np.nan, np.nan, np.nan, np.nan, np.nan])
    best = np.array([2.0, 2.0, 2.0, 1.0 * (1 + 5e-10), 1.5, 1.5, 1.5, 1.5])
    saturates = np.array([False] * 6 + [True, True])
    below, missed = solve_faults(status, found, best, 1.0, saturates)
    assert below.tolist() == [False, False, True, False, False, False, False, False]
    # A gain within rounding of the target alone is none; where acceptance reaches 1 there is no maximum.
    assert missed.tolist() == [False, False, False, False, True, True, False, False]


def test_the_share_of_starts_reaching_the_optimum_counts_only_those_within_the_tolerance():
    best = 1.0e-3
    values = np.array([best, best * (1 + 5e-10), best * (1 + 1e-6), np.nan, 2 * best])
    assert reached_share(values, best) == 2 / 5


def test_scaling_runs_only_the_tables_asked_for(monkeypatch, capsys):
    from experiments import bench
    from experiments.benchmarks import scaling

    ran = []
    for part in ("_scaling_point_fit", "_scaling_nuts"):
        monkeypatch.setattr(scaling, part, lambda part=part: ran.append(part) or [])
    monkeypatch.setattr(scaling, "_scaling_n_star", lambda repeats: ran.append("_scaling_n_star") or [])
    assert bench.main(["--only", "scaling", "--scaling-parts", "nuts,n_star"]) == 0
    assert ran == ["_scaling_n_star", "_scaling_nuts"]
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--only", "scaling", "--scaling-parts", "nstar"])
    assert exit_.value.code == 2 and "nstar" in capsys.readouterr().err


def test_every_family_of_the_forms_benchmark_is_fitted_to_runs_that_identify_it():
    from experiments.benchmarks.numerics import forms_pretraining
    from sdsl_jax import FAMILIES, load_pretraining
    from sdsl_jax.infer.point import check_loss_law_data

    for family in FAMILIES.values():
        runs = load_pretraining(forms_pretraining(family.name))
        check_loss_law_data(runs.n_params, runs.n_tokens, runs.loss, family=family)  # raises if not


def test_the_rerun_benchmark_raises_the_alternative_target_acceptance_only_after_divergences(monkeypatch, capsys):
    from experiments.benchmarks.inference import bench_rerun_policy
    from sdsl_jax import infer
    from sdsl_jax.infer import Diagnostics, PosteriorRun

    calls = []
    # The alternative's runs of one data set: R-hat alone, then divergent, then passing.
    outcomes = {500: (0, ("R-hat",)), 1000: (2, ("2 divergent",)), 2000: (0, ())}

    def fake(*_, num_warmup, target_accept=None, retries=0, **kw):
        calls.append((num_warmup, target_accept, retries))
        divergent, problems = (0, ()) if retries else outcomes[num_warmup]
        return PosteriorRun({}, None, Diagnostics(1.0, 500.0, divergent, not problems, problems, median_steps=63.0))

    monkeypatch.setattr(infer, "sample_loss_law", fake)
    rows = bench_rerun_policy(seeds=1)
    assert len(rows) == 3 and calls[0] == (500, None, 2)  # the shipped side: the library's own reruns
    assert calls[1:4] == [(500, 0.9, 0), (1000, 0.9, 0), (2000, pytest.approx(0.95), 0)]
    assert rows[0]["raised only after divergences"]["runs"][0]["attempts"] == 3


def test_the_n_star_benchmark_reports_both_ratios_and_the_accuracy_of_each_side():
    from experiments.benchmarks.numerics import bench_draft_size

    (row,) = bench_draft_size(3, 1)
    assert row["n"] == 3 and row["speedup"] > 0 and row["cpu_speedup"] > 0 and row["recompile_s"] > 0
    # Against 40-digit roots, each side on its own: ours to rounding, SciPy's Brent to its xatol.
    assert row["max_rel_err_jax"] < 1e-13
    assert row["max_rel_err_scipy"] < 1e-5
